//! What every rank tells the others when a communicator is set up (`Record`), and what they
//! must have alike for the core to come on: layout, settings, buffers (`agree`).

use crate::core::measured::SPANS;
use crate::core::policy::{self, Staging};
use crate::core::types::Collective;

pub(super) const MAGIC: u64 = 0x6e63_636c_7368_696d; // "ncclshim"
// The record's and the buffer's layout (3: sentinel inboxes; 4: zero-copy; 5: every setting on
// its own; 6: compute capability; 7: a group's small all-reduces fused, which peers must do
// alike; 8: measured limits, and one size for every later layout; 9: reduce-scatter and reduce
// as packets, which peers must plan alike; 10: which communicator a record is of, for children
// that meet on their parent; 11: measured limits as spans of sizes; 12: measured limits for
// buffers in no symmetric window; 13: whether the rank's communicator is blocking; 14: the
// bound its user set on NCCL's CTAs; 15: whether its user asked for NCCL's copy engines; 16: a
// direct call's end met by one block of each rank, in slots of their own; 17: sentinel inboxes
// shared out by the kernels' rank bound, and fused sentinel launches of up to 2 MiB on 2
// ranks): other versions never pair up.
pub(super) const LAYOUT: u32 = 17;
/// Room for the settings every rank must have alike (`Settings::agreed`), one word each.
pub(super) const AGREED_SLOTS: usize = 32;

/// What one rank tells the others, as plain bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Record {
    pub(super) magic: u64,
    pub(super) layout: u32,
    /// 1 if this rank could set up its side.
    pub(super) ready: u32,
    pub(super) host: u64,
    pub(super) process: u64,
    /// Rank 0's nonce names the communicator in zero-copy messages (zero_copy/).
    pub(super) nonce: u64,
    /// `Settings::agreed`'s values, in its order (the rest zero): the same on every rank, or the
    /// core stays off.
    pub(super) settings: [u64; AGREED_SLOTS],
    /// The buffers' sizes, as this build lays them out.
    pub(super) buffers: u64,
    pub(super) buffer: u64,
    pub(super) device: i32,
    /// Blocks the two-shot kernels can have resident at once on this rank's GPU.
    pub(super) resident_blocks: u32,
    /// Its GPU's compute capability, e.g. 90.
    pub(super) compute_capability: u32,
    /// Zero: keeps the next field at the alignment it has.
    pub(super) padding: u32,
    pub(super) pci_bus_id: [u8; 16],
    pub(super) ipc: [u8; 64],
    /// The measured limits of this rank's GPU for this many ranks (measured.rs), as
    /// `Limit::to_words` writes them.
    pub(super) measured: [[u64; 2 * SPANS]; Collective::ALL.len()],
    /// Which communicator this record sets up, where several meet in one exchange (children of
    /// ncclCommSplit on their parent): the split's color. 0 in a communicator's own exchange.
    pub(super) color: i32,
    /// This rank's rank in that communicator, and its number of ranks (0: no communicator, such
    /// as a rank whose split gave it none).
    pub(super) rank: u32,
    pub(super) nranks: u32,
    /// 1 where the shim saw this rank's communicator made blocking, and so follows its windows
    /// by their handles (by their bytes otherwise, core/windows.rs): ranks that differ would
    /// follow them differently, so such a communicator takes the limits of any buffers.
    pub(super) blocking: u32,
    /// The measured limits for calls whose buffers lie in no symmetric window (measured.rs,
    /// `Measured::plain`), as `Limit::to_words32` writes them.
    pub(super) measured_plain: [[u32; 2 * SPANS]; Collective::ALL.len()],
    /// The most CTAs this rank's user let NCCL give a kernel of the communicator (0: no bound):
    /// the communicator's kernels keep to the least of them (`CommFacts::max_blocks`).
    pub(super) cta_bound: u32,
    /// 1 where this rank's user asked NCCL for its copy engines (`CTAPolicy` ZERO): the
    /// communicator leaves NCCL every call NCCL may move with them, where any rank asked
    /// (`CommFacts::copy_engines`).
    pub(super) copy_engines: u32,
    /// Zeros: room for what later layouts add, so that every layout's record has one size and
    /// builds of other layouts meet in the exchange and say so (`agree`) instead of passing
    /// NCCL all-gathers of other sizes (where they exchange on the same communicator: builds
    /// before layout 10 exchange a split child's records on the child).
    pub(super) reserved: [u8; RECORD_BYTES - USED_BYTES],
}

/// What a record takes on the wire, whatever its layout.
pub(super) const RECORD_BYTES: usize = 1024;
/// The bytes before `reserved`.
pub(super) const USED_BYTES: usize = 1008;
// No padding the compiler would leave uninitialised: every field ends where the next begins.
const _: () = assert!(size_of::<Record>() == RECORD_BYTES);
const _: () = assert!(std::mem::offset_of!(Record, reserved) == USED_BYTES);
const _: () = assert!(std::mem::offset_of!(Record, measured) % 8 == 0);

impl Record {
    /// A "no" from a rank that could not set up its side (its settings still said, so that its
    /// peers can name one that differs).
    pub(super) fn not_ready() -> Record {
        Record {
            magic: MAGIC,
            layout: LAYOUT,
            ready: 0,
            host: 0,
            process: 0,
            nonce: 0,
            settings: agreed_settings(),
            buffers: Staging::standard().key(),
            buffer: 0,
            device: -1,
            resident_blocks: 0,
            compute_capability: 0,
            padding: 0,
            pci_bus_id: [0; 16],
            ipc: [0; 64],
            measured: [[0; 2 * SPANS]; Collective::ALL.len()],
            color: 0,
            rank: 0,
            nranks: 0,
            blocking: 0,
            measured_plain: [[0; 2 * SPANS]; Collective::ALL.len()],
            cta_bound: 0,
            copy_engines: 0,
            reserved: [0; RECORD_BYTES - USED_BYTES],
        }
    }

    pub(super) fn to_bytes(self) -> Vec<u8> {
        // SAFETY: a repr(C) struct of integers, fully initialised (padding fields included).
        unsafe { std::slice::from_raw_parts((&raw const self).cast::<u8>(), RECORD_BYTES) }.to_vec()
    }

    pub(super) fn from_bytes(bytes: &[u8]) -> Record {
        assert_eq!(bytes.len(), RECORD_BYTES);
        // SAFETY: any bytes make a valid Record of integers.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Record>()) }
    }
}

/// This rank's settings as the record carries them.
pub(super) fn agreed_settings() -> [u64; AGREED_SLOTS] {
    let mut slots = [0; AGREED_SLOTS];
    for (slot, (_, value)) in slots.iter_mut().zip(policy::settings().agreed()) {
        *slot = value;
    }
    slots
}

/// Whether every rank can join: with our settings, ready, on this host, each on its own GPU.
/// Settings first: a rank that differs says no for that reason, whatever else it says.
pub(super) fn agree(records: &[Record], rank: usize) -> Result<(), String> {
    let me = &records[rank];
    for (r, record) in records.iter().enumerate() {
        if record.magic != MAGIC || record.layout != LAYOUT {
            return Err(format!("rank {r} runs another version of ncclshim"));
        }
        if let Some(setting) = differing_setting(&record.settings, &me.settings) {
            return Err(format!(
                "rank {r} has another {setting} than rank {rank} (every rank needs the same NCCLSHIM_* settings)"
            ));
        }
        if record.buffers != me.buffers {
            return Err(format!("rank {r} lays the core's buffers out otherwise"));
        }
        // Ranks of both kinds would order the core's kernels and NCCL's otherwise in a group.
        if record.blocking != me.blocking {
            return Err(super::MIXED.into());
        }
        if record.ready != 1 {
            return Err(format!("rank {r} cannot use the core"));
        }
        if record.host != me.host {
            return Err(format!("rank {r} is on another host"));
        }
        if records[..r]
            .iter()
            .any(|other| other.pci_bus_id == record.pci_bus_id)
        {
            return Err(format!("rank {r} shares its GPU with another rank"));
        }
    }
    Ok(())
}

/// The variable of the first setting two records differ in.
pub(super) fn differing_setting(
    theirs: &[u64; AGREED_SLOTS],
    mine: &[u64; AGREED_SLOTS],
) -> Option<String> {
    let slot = (0..AGREED_SLOTS).find(|&i| theirs[i] != mine[i])?;
    let names = policy::settings().agreed();
    Some(
        names
            .get(slot)
            .map_or_else(|| "NCCLSHIM_* setting".into(), |(name, _)| name.clone()),
    )
}
