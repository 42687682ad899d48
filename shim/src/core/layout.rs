//! The layout of the core's buffers, as the kernels divide them (device/device.cuh): staging,
//! low-latency and sentinel inboxes, and the largest calls each holds.

use super::limits::{LL_MAX_BYTES, MAX_RANKS, SENTINEL_MAX_BYTES};

/// Largest all-reduce the staging buffers take in one go (two-shot goes through them in windows
/// of this size).
pub const STAGING_HALF_BYTES: usize = 16 << 20;
/// Largest one-shot: its slot per sender, a staging area (more than `2 * STAGING_HALF_BYTES`)
/// shared by MAX_RANKS senders (see device/all_reduce.cu).
pub const ONE_SHOT_LIMIT_BYTES: usize = 2 * STAGING_HALF_BYTES / MAX_RANKS;
/// The most bytes of slots the staged path of a collective other than all-reduce puts in one
/// staging area: one slot (each rounded up to 16 bytes) per sender, or one in all for a broadcast
/// and a scatter.
pub const GATHER_SCATTER_LIMIT_BYTES: usize = 2 * STAGING_HALF_BYTES;
/// The low-latency inboxes: 2 parities x MAX_RANKS senders x packets of twice the payload.
pub const INBOX_BYTES: usize = 2 * MAX_RANKS * 2 * LL_MAX_BYTES;
/// The sentinel inboxes: 2 parities x MAX_RANKS senders x the payload.
pub const SENTINEL_INBOX_BYTES: usize = 2 * MAX_RANKS * SENTINEL_MAX_BYTES;

/// The staging before the inboxes, for all-reduces of up to `half_bytes`: two areas (by epoch
/// parity) of `2 * half_bytes + 256` bytes, as device/device.cuh divides them.
pub const fn staging_bytes(half_bytes: usize) -> usize {
    2 * (2 * half_bytes + 256)
}
