//! The limits compiled into the kernels (`device/` takes them as `-D` options, see
//! program.rs): kept apart from the policy so that the build script, which compiles the kernels
//! ahead of time, reads the very same numbers.

/// The kernels' `__launch_bounds__`.
pub const MAX_THREADS: u32 = 512;
/// Blocks per launch of the kernels with per-block flags: sizes their flag arrays (the sentinel
/// kernel has none, see policy::SENTINEL_BLOCKS).
pub const MAX_BLOCKS: u32 = 256;
pub const MAX_RANKS: usize = 8;
/// Meetings of one block with the peers' same block that a call may have (a staged two-shot's
/// start and middle): with MAX_BLOCKS and MAX_RANKS, sizes the flags' slots, which the epoch
/// state follows (layout::EPOCH_STATE_OFFSET).
pub const BARRIERS: usize = 2;
/// Largest low-latency all-reduce a setting may ask for: sizes the inboxes, which the packets of
/// the other collectives share out among fewer senders in larger slots (`ll_capacity`: 1 MiB a
/// pair on 2 ranks).
pub const LL_MAX_BYTES: usize = 256 << 10;
/// Largest sentinel all-reduce: sizes the sentinel inboxes.
pub const SENTINEL_MAX_BYTES: usize = 512 << 10;
/// Calls one launch may carry (a group's calls of one communicator, kernel and shape, run one
/// after the other): sizes the kernels' argument struct.
pub const MAX_BATCH: usize = 4;
/// Calls one launch of a packet kernel may carry, run as one (device.cuh, "fused launches"):
/// sizes those kernels' argument struct.
pub const MAX_FUSED: usize = 8;
