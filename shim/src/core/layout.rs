//! The layout of each rank's buffer: the flags, then the staging (two areas, the low-latency
//! inboxes, the sentinel inboxes), and the largest calls each part holds. The host lays it out
//! here and hands it to every kernel (`Staging`, `struct Staging` in device/device.cuh), which
//! divides nothing itself.

use super::fnv::Fnv;
use super::limits::{BARRIERS, LL_MAX_BYTES, MAX_BLOCKS, MAX_RANKS, SENTINEL_MAX_BYTES};

/// Bytes at the start of each rank's buffer for the flags (see device/device.cuh), rounded up.
pub const FLAGS_BYTES: usize = 64 << 10;
/// Where the epoch state starts in a rank's buffer, after the meetings' slots (`epoch_state` in
/// device/device.cuh): its first word is the count of the rank's calls.
pub const EPOCH_STATE_OFFSET: usize = BARRIERS * MAX_BLOCKS as usize * MAX_RANKS * 4;
// The epoch state (8 words, then the direct calls' end slots, one per rank) and each rank's
// Published (48 bytes) fit in the flags.
const _: () = assert!(EPOCH_STATE_OFFSET + (8 + MAX_RANKS) * 4 + MAX_RANKS * 48 <= FLAGS_BYTES);
/// Largest all-reduce the staging buffers take in one go (two-shot goes through them in windows
/// of this size).
pub const STAGING_HALF_BYTES: usize = 16 << 20;
/// Largest one-shot: its slot per sender, in an area (more than `2 * STAGING_HALF_BYTES`)
/// shared by MAX_RANKS senders (see device/all_reduce.cu).
pub const ONE_SHOT_LIMIT_BYTES: usize = 2 * STAGING_HALF_BYTES / MAX_RANKS;
/// The most bytes of slots one window of the staged path of a collective other than all-reduce
/// puts in a staging area: one slot per sender, or one in all for a broadcast and a scatter, each
/// a share of this in whole packs (`staged_window` in device/device.cuh, from `window`); larger
/// chunks go in several windows.
pub const GATHER_SCATTER_LIMIT_BYTES: usize = 2 * STAGING_HALF_BYTES;
/// The low-latency inboxes: 2 parities x MAX_RANKS senders x packets of twice the payload.
pub const INBOX_BYTES: usize = 2 * MAX_RANKS * 2 * LL_MAX_BYTES;
/// The sentinel inboxes: 2 parities x MAX_RANKS senders x the payload.
pub const SENTINEL_INBOX_BYTES: usize = 2 * MAX_RANKS * SENTINEL_MAX_BYTES;

/// The kernels' rank bound for `nranks` ranks: 2, 4 or 8, the fewest that hold them (`NR` in
/// device/device.cuh).
const fn rank_bound(nranks: usize) -> usize {
    match nranks {
        ..=2 => 2,
        3..=4 => 4,
        _ => MAX_RANKS,
    }
}

/// The most bytes one sender's packets carry to one receiver in a call on `nranks` ranks: the
/// inboxes shared out among the senders of the kernels' rank bound, as `ll_capacity` in
/// device/device.cuh does.
pub const fn ll_capacity(nranks: usize) -> usize {
    LL_MAX_BYTES * (MAX_RANKS / rank_bound(nranks))
}

/// The most bytes one sender's sentinel stores carry to one receiver in a launch on `nranks`
/// ranks: the sentinel inboxes shared out alike (`sentinel_capacity` in device/device.cuh). A
/// lone call is at most SENTINEL_MAX_BYTES; a fused launch's calls together may fill this.
pub const fn sentinel_capacity(nranks: usize) -> usize {
    SENTINEL_MAX_BYTES * (MAX_RANKS / rank_bound(nranks))
}

/// Where things lie in a rank's staging, in bytes from its start (`FLAGS_BYTES` into the
/// buffer): `struct Staging` in device/device.cuh, part of every kernel's arguments.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staging {
    /// Two-shot's window: the most bytes of a message staged at once.
    pub window: u64,
    /// One area; two of them from offset 0, by epoch parity.
    pub area: u64,
    /// One-shot's slot per sender in an area.
    pub one_shot_slot: u64,
    /// Two-shot's result area (`window` bytes), within an area, past its slots.
    pub results: u64,
    pub ll_inbox: u64,
    pub sentinel_inbox: u64,
}

impl Staging {
    /// The layout every rank uses.
    pub const fn standard() -> Staging {
        Staging::for_window(STAGING_HALF_BYTES as u64)
    }

    /// Areas of two-shot's slots (a window and 32 bytes per rank at most) and result area.
    const fn for_window(window: u64) -> Staging {
        let area = 2 * window + 256;
        Staging {
            window,
            area,
            one_shot_slot: area / MAX_RANKS as u64 / 16 * 16,
            results: window + 256,
            ll_inbox: 2 * area,
            sentinel_inbox: 2 * area + INBOX_BYTES as u64,
        }
    }

    /// Bytes of the staging, inboxes included.
    pub const fn bytes(&self) -> usize {
        self.sentinel_inbox as usize + SENTINEL_INBOX_BYTES
    }

    /// Equal on every rank whose kernels divide the buffer alike (the set-up compares it).
    pub fn key(&self) -> u64 {
        [
            self.window,
            self.area,
            self.one_shot_slot,
            self.results,
            self.ll_inbox,
            self.sentinel_inbox,
            FLAGS_BYTES as u64,
            INBOX_BYTES as u64,
            SENTINEL_INBOX_BYTES as u64,
        ]
        .into_iter()
        .fold(Fnv::new(), |key, v| key.word(v))
        .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part holds what the planner sends it, and none overlaps the next.
    #[test]
    fn each_part_holds_its_largest_call() {
        let s = Staging::standard();
        assert!(s.one_shot_slot as usize >= ONE_SHOT_LIMIT_BYTES);
        assert_eq!(s.one_shot_slot % 16, 0);
        let two_shot_slots = s.window + 32 * MAX_RANKS as u64;
        assert!(
            two_shot_slots <= s.results,
            "two-shot's slots end before its results"
        );
        assert!(s.results + s.window <= s.area);
        assert_eq!(
            GATHER_SCATTER_LIMIT_BYTES as u64,
            2 * s.window,
            "staged_window's"
        );
        assert!(GATHER_SCATTER_LIMIT_BYTES as u64 <= s.area);
        assert_eq!(s.ll_inbox, 2 * s.area);
        assert_eq!(s.sentinel_inbox - s.ll_inbox, INBOX_BYTES as u64);
        assert_eq!(
            s.bytes() as u64,
            s.sentinel_inbox + SENTINEL_INBOX_BYTES as u64
        );
        assert_ne!(s.key(), Staging::for_window(1 << 20).key());
    }

    /// The senders of every number of ranks fit the low-latency inboxes, two parities of them.
    #[test]
    fn the_packet_slots_of_any_number_of_ranks_fit_the_inboxes() {
        for nranks in 2..=MAX_RANKS {
            let bound = nranks.next_power_of_two();
            assert!(
                2 * bound * 2 * ll_capacity(nranks) <= INBOX_BYTES,
                "{nranks} ranks"
            );
            assert!(ll_capacity(nranks) >= LL_MAX_BYTES);
        }
        assert_eq!(ll_capacity(2), 4 * LL_MAX_BYTES);
        assert_eq!(ll_capacity(3), 2 * LL_MAX_BYTES);
        assert_eq!(ll_capacity(8), LL_MAX_BYTES);
    }

    /// Likewise the senders' slots in the sentinel inboxes.
    #[test]
    fn the_sentinel_slots_of_any_number_of_ranks_fit_the_inboxes() {
        for nranks in 2..=MAX_RANKS {
            let bound = nranks.next_power_of_two();
            assert!(
                2 * bound * sentinel_capacity(nranks) <= SENTINEL_INBOX_BYTES,
                "{nranks} ranks"
            );
            assert!(sentinel_capacity(nranks) >= SENTINEL_MAX_BYTES);
        }
        assert_eq!(sentinel_capacity(2), 4 * SENTINEL_MAX_BYTES);
        assert_eq!(sentinel_capacity(4), 2 * SENTINEL_MAX_BYTES);
        assert_eq!(sentinel_capacity(5), SENTINEL_MAX_BYTES);
    }
}
