//! The book of every communicator's operations: per operation and size band, the calls and bytes
//! routed (by algorithm) and forwarded, and the last `RING` calls (the flight recorder). A fixed
//! table of atomics: recording takes no lock and allocates nothing. A destroyed communicator's
//! page stays for the exit summary until its slot is needed again.

use std::sync::Once;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering,
};

use crate::core::types::Algorithm;
use crate::ffi::OPERATIONS;

/// Communicators kept at once (alive, or destroyed and not yet overwritten).
const SLOTS: usize = 256;
/// Slots looked at from a communicator's hash before giving up.
const PROBES: usize = 16;
/// Calls kept per communicator by the flight recorder.
pub const RING: usize = 64;
/// Operations a spec may have (2.31 has 20, with its ncclXConfig variants).
pub const MAX_KINDS: usize = 24;
const _: () = assert!(OPERATIONS.len() <= MAX_KINDS);
/// How a call went: 0 forwarded to NCCL, 1 + the algorithm where the core ran it.
pub const WAYS: usize = 1 + Algorithm::ALL.len();

/// Size bands of the summary: a call's bytes below each bound, the last open-ended.
pub const BAND_BOUNDS: [u64; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];
pub const BANDS: usize = BAND_BOUNDS.len() + 1;

pub fn band(bytes: u64) -> usize {
    BAND_BOUNDS
        .iter()
        .position(|&bound| bytes < bound)
        .unwrap_or(BAND_BOUNDS.len())
}

const EMPTY: u8 = 0;
const CLAIMING: u8 = 1;
const LIVE: u8 = 2;
const DESTROYED: u8 = 3;

/// A `Recorded` in atomics, for readers on other threads: the flight recorder's ring here, the
/// trace's queue (trace.rs).
pub struct StoredCall {
    /// kind | way << 8 | captured << 16 | result << 32.
    what: AtomicU64,
    count: AtomicU64,
    bytes: AtomicU64,
    datatype: AtomicI64,
    op: AtomicI64,
    root: AtomicI64,
    at_us: AtomicU64,
}

impl StoredCall {
    pub const fn new() -> StoredCall {
        StoredCall {
            what: AtomicU64::new(0),
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            datatype: AtomicI64::new(0),
            op: AtomicI64::new(0),
            root: AtomicI64::new(0),
            at_us: AtomicU64::new(0),
        }
    }

    /// Relaxed stores: the holder publishes them with a release of its own stamp.
    pub fn store(&self, call: &Recorded) {
        let what = call.kind as u64
            | (call.way as u64) << 8
            | (call.captured as u64) << 16
            | (call.result as u64) << 32;
        self.what.store(what, Ordering::Relaxed);
        self.count.store(call.count, Ordering::Relaxed);
        self.bytes.store(call.bytes, Ordering::Relaxed);
        self.datatype.store(call.datatype, Ordering::Relaxed);
        self.op.store(call.op, Ordering::Relaxed);
        self.root.store(call.root, Ordering::Relaxed);
        self.at_us.store(call.at_us, Ordering::Relaxed);
    }

    /// Relaxed loads, after the holder's acquire of its stamp.
    pub fn load(&self) -> Recorded {
        let what = self.what.load(Ordering::Relaxed);
        Recorded {
            kind: what as u8,
            way: (what >> 8) as u8,
            captured: (what >> 16) as u8,
            result: (what >> 32) as u32,
            count: self.count.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            datatype: self.datatype.load(Ordering::Relaxed),
            op: self.op.load(Ordering::Relaxed),
            root: self.root.load(Ordering::Relaxed),
            at_us: self.at_us.load(Ordering::Relaxed),
        }
    }
}

/// One call, as the flight recorder keeps it. `stamp` is 1 + its sequence number once the call
/// is written (0: never written), so that a reader sees whole entries only. One cache line: a
/// call's record writes one.
#[repr(align(64))]
struct Entry {
    stamp: AtomicU64,
    call: StoredCall,
}

/// The calls and bytes of one operation, size band and way, side by side: a call's count
/// writes one cache line, not two.
#[repr(align(16))]
struct Tally {
    calls: AtomicU64,
    bytes: AtomicU64,
}

type Counters = [[[Tally; WAYS]; BANDS]; MAX_KINDS];

/// One communicator's page, every field an atomic integer. A fresh page is zero bytes: `EMPTY`,
/// nothing recorded, nothing said of its communicator (so that the pages, about 12 MB, lie in
/// `.bss` rather than in the library's file).
pub struct Page {
    comm: AtomicUsize,
    state: AtomicU8,
    /// Rank, ranks and GPU as NCCL says them, each + 1 (0: not said).
    rank: AtomicI32,
    nranks: AtomicI32,
    device: AtomicI32,
    /// 0 not known, 1 the core serves it, 2 it does not.
    core: AtomicU8,
    /// The next call's sequence number (the calls recorded so far).
    next_seq: AtomicU64,
    /// Calls the core launched with others of a group, in one launch.
    in_shared_launches: AtomicU64,
    /// Calls queued for the core that went to NCCL with the rest of their group.
    sent_with_group: AtomicU64,
    tallies: Counters,
    ring: [Entry; RING],
}

impl Page {
    /// Empties a page for another communicator (its claimer alone writes it).
    fn reset(&self) {
        for tally in self.tallies.iter().flatten().flatten() {
            tally.calls.store(0, Ordering::Relaxed);
            tally.bytes.store(0, Ordering::Relaxed);
        }
        for entry in &self.ring {
            entry.stamp.store(0, Ordering::Relaxed);
        }
        self.next_seq.store(0, Ordering::Relaxed);
        self.in_shared_launches.store(0, Ordering::Relaxed);
        self.sent_with_group.store(0, Ordering::Relaxed);
        self.core.store(0, Ordering::Relaxed);
        for field in [&self.rank, &self.nranks, &self.device] {
            field.store(0, Ordering::Relaxed);
        }
    }

    pub fn comm(&self) -> usize {
        self.comm.load(Ordering::Relaxed)
    }

    pub fn destroyed(&self) -> bool {
        self.state.load(Ordering::Acquire) == DESTROYED
    }

    /// (rank, ranks, GPU), -1 where NCCL did not say.
    pub fn identity(&self) -> (i32, i32, i32) {
        let said = |field: &AtomicI32| field.load(Ordering::Relaxed).wrapping_sub(1);
        (said(&self.rank), said(&self.nranks), said(&self.device))
    }

    pub fn set_identity(&self, rank: i32, nranks: i32, device: i32) {
        self.rank.store(rank.wrapping_add(1), Ordering::Relaxed);
        self.nranks.store(nranks.wrapping_add(1), Ordering::Relaxed);
        self.device.store(device.wrapping_add(1), Ordering::Relaxed);
    }

    /// Whether the core serves this communicator: `None` where it was never decided.
    pub fn core(&self) -> Option<bool> {
        match self.core.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    pub fn calls_recorded(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Counts `calls` that went out in one launch (from a launcher's thread: hence the add).
    pub fn shared_launch(&self, calls: u64) {
        self.in_shared_launches.fetch_add(calls, Ordering::Relaxed);
    }

    pub fn calls_in_shared_launches(&self) -> u64 {
        self.in_shared_launches.load(Ordering::Relaxed)
    }

    /// Counts a call queued for the core that went to NCCL with its group.
    pub fn sent_with_group(&self) {
        self.sent_with_group.fetch_add(1, Ordering::Relaxed);
    }

    pub fn calls_sent_with_group(&self) -> u64 {
        self.sent_with_group.load(Ordering::Relaxed)
    }

    /// (calls, bytes) of operation `kind`, size band `band`, gone `way`.
    pub fn tally(&self, kind: usize, band: usize, way: usize) -> (u64, u64) {
        let tally = &self.tallies[kind][band][way];
        (
            tally.calls.load(Ordering::Relaxed),
            tally.bytes.load(Ordering::Relaxed),
        )
    }

    /// Counts one call and keeps it in the ring; returns its sequence number. One thread at a
    /// time uses a communicator (NCCL's rule), so plain loads and stores count: a program that
    /// breaks the rule loses counts, nothing else.
    pub fn record(&self, call: &Recorded) -> u64 {
        let add = |counter: &AtomicU64, n: u64| {
            counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed)
        };
        let seq = self.next_seq.load(Ordering::Relaxed);
        add(&self.next_seq, 1);
        let kind = (call.kind as usize).min(MAX_KINDS - 1);
        let (band, way) = (band(call.bytes), (call.way as usize).min(WAYS - 1));
        let tally = &self.tallies[kind][band][way];
        add(&tally.calls, 1);
        add(&tally.bytes, call.bytes);
        let entry = &self.ring[seq as usize % RING];
        entry.stamp.store(0, Ordering::Relaxed);
        entry.call.store(call);
        entry.stamp.store(seq + 1, Ordering::Release);
        seq
    }

    /// The calls the ring holds, oldest first, with their sequence numbers.
    pub fn last_calls(&self) -> Vec<(u64, Recorded)> {
        let mut calls: Vec<(u64, Recorded)> = self
            .ring
            .iter()
            .filter_map(|entry| {
                let stamp = entry.stamp.load(Ordering::Acquire);
                let call = entry.call.load();
                // Rewritten while read: left out.
                (stamp != 0 && entry.stamp.load(Ordering::Acquire) == stamp)
                    .then(|| (stamp - 1, call))
            })
            .collect();
        calls.sort_by_key(|(seq, _)| *seq);
        calls
    }
}

/// One call as recorded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recorded {
    /// Its index in `OPERATIONS`.
    pub kind: u8,
    /// 0 forwarded, 1 + the core's algorithm.
    pub way: u8,
    pub result: u32,
    /// 0 not known, 1 not captured, 2 captured into a CUDA graph.
    pub captured: u8,
    pub count: u64,
    pub bytes: u64,
    pub datatype: i64,
    pub op: i64,
    pub root: i64,
    pub at_us: u64,
}

// SAFETY: zero bytes are a valid atomic integer, and a fresh page (see `Page`).
static PAGES: [Page; SLOTS] = unsafe { std::mem::zeroed() };

fn home(comm: usize) -> usize {
    // Handles are heap pointers: their low bits say little.
    ((comm >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % SLOTS
}

fn probe(comm: usize) -> impl Iterator<Item = &'static Page> {
    let start = home(comm);
    (0..PROBES).map(move |i| &PAGES[(start + i) % SLOTS])
}

/// The page of a live communicator, if it has one.
pub fn find(comm: usize) -> Option<&'static Page> {
    probe(comm).find(|page| page.comm() == comm && page.state.load(Ordering::Acquire) == LIVE)
}

/// The page of `comm`, claimed now if it has none (an empty slot, else the destroyed
/// communicator's page nearest its home); `None` where every slot near it is a live
/// communicator's. `fresh` runs once on a page just claimed. Claims (once per communicator) are
/// made one at a time, so that two threads' first calls on one communicator share one page.
pub fn find_or_claim(comm: usize, fresh: impl FnOnce(&Page)) -> Option<&'static Page> {
    if let Some(page) = find(comm) {
        return Some(page);
    }
    FORGET_IN_CHILDREN.call_once(|| super::in_forked_children(forget_in_child));
    while CLAIMING_ONE.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    let page = find(comm).or_else(|| {
        let page = [EMPTY, DESTROYED]
            .into_iter()
            .find_map(|wanted| probe(comm).find(|p| p.state.load(Ordering::Acquire) == wanted))?;
        page.state.store(CLAIMING, Ordering::Release);
        page.reset();
        page.comm.store(comm, Ordering::Relaxed);
        fresh(page);
        page.state.store(LIVE, Ordering::Release);
        Some(page)
    });
    CLAIMING_ONE.store(false, Ordering::Release);
    page
}

/// Held while a page is claimed (a flag, not a mutex, so that a forked child can let it go).
static CLAIMING_ONE: AtomicBool = AtomicBool::new(false);
static FORGET_IN_CHILDREN: Once = Once::new();

/// In a forked child: the parent's communicators are not the child's (NCCL's are not usable
/// across a fork); its book starts empty, so that its summary is its own.
extern "C" fn forget_in_child() {
    for page in &PAGES {
        page.state.store(EMPTY, Ordering::Relaxed);
    }
    CLAIMING_ONE.store(false, Ordering::Relaxed);
}

/// The communicator is gone: its page stays, for the summary, until its slot is needed.
pub fn destroyed(comm: usize) {
    if let Some(page) = find(comm) {
        page.state.store(DESTROYED, Ordering::Release);
    }
}

/// Whether the core serves `comm`, as its set-up decided.
pub fn set_core(page: &Page, on: bool) {
    page.core.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Every page with something to say (a live or destroyed communicator), in slot order.
pub fn pages() -> impl Iterator<Item = &'static Page> {
    PAGES.iter().filter(|page| {
        let state = page.state.load(Ordering::Acquire);
        state == LIVE || state == DESTROYED
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A float sum of `bytes` gone `way`, for the tests of the book and the summary.
    pub(in crate::calls) fn call(kind: u8, way: u8, bytes: u64) -> Recorded {
        Recorded {
            kind,
            way,
            result: 0,
            captured: 0,
            count: bytes / 4,
            bytes,
            datatype: 7,
            op: 0,
            root: -1,
            at_us: 1,
        }
    }

    #[test]
    fn bands_split_at_their_bounds() {
        assert_eq!(band(0), 0);
        assert_eq!(band((4 << 10) - 1), 0);
        assert_eq!(band(4 << 10), 1);
        assert_eq!(band(1 << 20), 3);
        assert_eq!(band(1 << 30), BANDS - 1);
    }

    #[test]
    fn a_page_counts_its_calls_and_keeps_the_last_ones() {
        let comm = 0x5100_0000;
        let page = find_or_claim(comm, |p| p.set_identity(1, 2, 1)).unwrap();
        for i in 0..(RING as u64 + 10) {
            assert_eq!(page.record(&call(0, (i % 2) as u8, 1 << 20)), i);
        }
        assert_eq!(page.tally(0, band(1 << 20), 0), (37, 37 << 20));
        assert_eq!(page.tally(0, band(1 << 20), 1), (37, 37 << 20));
        let last = page.last_calls();
        assert_eq!(last.len(), RING);
        assert_eq!(last.first().unwrap().0, 10, "the oldest kept");
        assert_eq!(last.last().unwrap().0, RING as u64 + 9);
        assert_eq!(page.identity(), (1, 2, 1));

        // Destroyed, the page stays for the summary; the same handle made again starts anew.
        destroyed(comm);
        assert!(find(comm).is_none());
        assert!(pages().any(|p| p.comm() == comm && p.destroyed()));
        let again = find_or_claim(comm, |_| ()).unwrap();
        assert_eq!(again.calls_recorded(), 0);
        assert_eq!(again.identity(), (-1, -1, -1), "not said");
        assert_eq!(again.tally(0, band(1 << 20), 0), (0, 0));
    }

    /// A call's record writes one line of the ring and one of the counters; a page of zero
    /// bytes (as the table starts) knows nothing.
    #[test]
    fn a_record_touches_few_cache_lines_and_a_zeroed_page_is_fresh() {
        assert_eq!(std::mem::size_of::<Entry>(), 64);
        assert_eq!(std::mem::align_of::<Entry>(), 64);
        assert_eq!(std::mem::size_of::<Tally>(), 16);
        assert_eq!(64 % std::mem::align_of::<Tally>(), 0);
        // SAFETY: as `PAGES`.
        let fresh: Box<Page> = Box::new(unsafe { std::mem::zeroed() });
        assert_eq!(fresh.state.load(Ordering::Relaxed), EMPTY);
        assert_eq!(fresh.identity(), (-1, -1, -1));
        assert_eq!(fresh.core(), None);
        assert_eq!(fresh.calls_recorded(), 0);
        assert_eq!(fresh.tally(0, 0, 0), (0, 0));
        assert!(fresh.last_calls().is_empty());
    }

    #[test]
    fn destroyed_pages_are_taken_again_when_the_table_is_full() {
        // Many communicators hashed anywhere: each destroyed after use, none lost for want of
        // a slot.
        for i in 0..(4 * SLOTS) {
            let comm = 0x6000_0000 + (i << 12);
            let page = find_or_claim(comm, |_| ()).expect("a slot");
            page.record(&call(1, 0, 64));
            destroyed(comm);
        }
    }
}
