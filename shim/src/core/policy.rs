//! Which calls the core takes, and how (`plan`), and which of a group's calls it takes: pure
//! functions of the call (bytes, type, op, root, ranks), of the facts every rank agreed on at
//! set-up and of the settings (settings.rs), so that every rank decides the same. Nothing local
//! (capture status, caches, timing) enters them.

use super::types::{Algorithm, Collective, DataType, Op};
use crate::call::Call;

// The limits compiled into the kernels (MAX_THREADS, MAX_BLOCKS, MAX_RANKS, LL_MAX_BYTES,
// SENTINEL_MAX_BYTES) live in limits.rs, which the build script reads too; the buffers' layout
// in layout.rs; the settings in settings.rs. Named here too, for the rest of the core.
pub use super::layout::*;
pub use super::limits::*;
pub use super::measured::{Buffers, Limit, Limits, Measured};
pub use super::settings::{DEFAULT_WAIT_LIMIT_S, GROUP_CORE_BYTES, Settings, settings, switch};
/// The sentinel kernel's largest grid: a 16-byte pack per thread, 64 threads per block, for the
/// most a launch carries (a fused launch on 2 ranks, `sentinel_capacity`).
const SENTINEL_BLOCKS: u32 = (sentinel_capacity(2) / 16 / 64) as u32;

/// The most calls of a communicator in a group that stay the core's, one after the other, in
/// the band (`GROUP_CORE_BYTES`): nccl-tests `-m 8` on 2 H100, eight calls of 2 MiB took 1.29 –
/// 1.38 x NCCL's time per operation (NCCL's one kernel gains with every call), `-m 4` 0.91 –
/// 0.92, `-m 2` 0.61.
pub const GROUP_BAND_CALLS: usize = 4;

/// The largest all-reduces of a group of two on one communicator that stay the core's, one after
/// the other, where the band (`GROUP_CORE_BYTES`) ends lower: nccl-tests `-m 2` on 2 H100, one
/// process per GPU, per operation: 0.75 - 0.88 of NCCL's time (its one kernel for the two) from
/// 4 to 32 MiB, and since the staged windows go on without the grid's meeting 0.85 - 0.92 from
/// 16 to 128 MiB whether the peers map the buffers or not (0.95 at 256 MiB, one run). Groups of
/// three or four calls lost at 4 MiB (1.05 - 1.10), so they keep the band.
pub const GROUP_PAIR_MAX_BYTES: usize = 128 << 20;

/// The largest chunk of a group's all-gathers, reduce-scatters and all-to-alls that stay the
/// core's, one after the other, on 2 ranks: pairs of them, and up to GROUP_BAND_CALLS
/// all-to-alls. nccl-tests on 2 H200, one process per GPU, per operation of 2 - 8 MiB (chunks of
/// 1 - 4 MiB): pairs 0.57 - 0.80 of NCCL's time (its one kernel for the two), four all-to-alls
/// 0.74 - 0.80; on the core, four all-gathers took 0.86 - 0.97 and four reduce-scatters 0.94 -
/// 1.13, which stay NCCL's. Larger calls and groups were not measured on the core.
pub const GROUP_MOVES_MAX_BYTES: usize = 4 << 20;

/// What a group's calls of one communicator that the core would take have been so far
/// (`group::add` adds them as they come).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSoFar {
    pub calls: usize,
    /// The smallest and the largest, as `plan` counts them (a rank's chunk, for the collectives
    /// that move one per rank).
    pub smallest: usize,
    pub largest: usize,
    /// The collectives among them, a bit each (`Collective as usize`).
    pub collectives: u8,
}

impl GroupSoFar {
    pub const NONE: GroupSoFar = GroupSoFar {
        calls: 0,
        smallest: usize::MAX,
        largest: 0,
        collectives: 0,
    };

    /// With one more call of `collective`, planned as `plan`.
    pub fn and(self, collective: Collective, plan: &Plan) -> GroupSoFar {
        let bytes = plan.count * plan.dtype.size();
        GroupSoFar {
            calls: self.calls + 1,
            smallest: self.smallest.min(bytes),
            largest: self.largest.max(bytes),
            collectives: self.collectives | Self::bit(collective),
        }
    }

    /// Whether every call so far is of one of `collectives`.
    pub fn only(&self, collectives: &[Collective]) -> bool {
        let allowed = collectives.iter().fold(0, |bits, &c| bits | Self::bit(c));
        self.collectives & !allowed == 0
    }

    fn bit(collective: Collective) -> u8 {
        1 << collective as usize
    }
}

/// The most fused launches a group's calls of one communicator may take and stay the core's
/// (`Settings::fused_with`): more small calls than that go to NCCL's one kernel. Floating-point
/// all-reduces on 2 ranks may take MAX_FUSED_ALL_REDUCE_LAUNCHES.
pub const MAX_FUSED_LAUNCHES: usize = 2;

/// The most fused launches of a group's floating-point all-reduces (the sentinel kernel) on 2
/// ranks. On 2 H200 (nccl-tests, one process per GPU), eight all-reduces of 256 KiB in four
/// launches of 512 KiB took 0.47 of NCCL's time per operation eager and 0.50 in CUDA graphs, six
/// 0.84 and 0.91; in NCCL's one kernel, 1.01. (Launches now carry up to 2 MiB there,
/// `Settings::sentinel_fused_max`.) The other collectives' packet kernels lose there: eight
/// reduce-scatters of 1 MiB in four launches took 1.16 of NCCL's time. Not measured on more
/// ranks, nor for the other types' low-latency kernel.
pub const MAX_FUSED_ALL_REDUCE_LAUNCHES: usize = 4;

/// The most fused launches a group's calls led by `first` may take on `nranks` ranks
/// (`MAX_FUSED_LAUNCHES`).
pub fn max_fused_launches(first: &Plan, nranks: usize) -> usize {
    match first.algorithm {
        Algorithm::Sentinel if nranks == 2 => MAX_FUSED_ALL_REDUCE_LAUNCHES,
        _ => MAX_FUSED_LAUNCHES,
    }
}

impl Settings {
    /// Whether a group's `calls` on one communicator that the core would take go to NCCL, all of
    /// them: NCCL runs a group's operations in one kernel with one synchronisation. So does the
    /// core where they fit at most `max_fused_launches` fused launches (`fused`, see
    /// `fused_with`); otherwise it runs them one after the other, each meeting its peers, which
    /// wins where every call is in the band (as measured): all-reduces in `GROUP_CORE_BYTES`
    /// (above its bottom and at most its top), at most GROUP_BAND_CALLS of them, or two on 2
    /// ranks up to GROUP_PAIR_MAX_BYTES; on 2 ranks, pairs of all-gathers, reduce-scatters and
    /// all-to-alls, and up to GROUP_BAND_CALLS all-to-alls, of chunks up to
    /// GROUP_MOVES_MAX_BYTES. Groups of four 2 MiB broadcasts, reduces, reduce-scatters or
    /// scatters one after the other took 1.03 – 1.47 x NCCL's time on 2 H200, so the rest stay
    /// the core's only where they fuse. A lone call stays the core's. The same answer on every
    /// rank: every rank's group holds the same calls.
    pub fn group_goes_to_nccl(&self, group: &GroupSoFar, nranks: usize, fused: bool) -> bool {
        use Collective::{AllGather, AllReduce, AllToAll, ReduceScatter};
        let (above, up_to) = self.group_core_bytes;
        // A band turned off (`group_core:0-0`) keeps no pairs either.
        let top = match (group.calls, nranks, up_to) {
            (2, 2, 1..) => up_to.max(GROUP_PAIR_MAX_BYTES),
            _ => up_to,
        };
        let all_reduces = group.only(&[AllReduce])
            && group.calls <= GROUP_BAND_CALLS
            && group.smallest > above
            && group.largest <= top;
        let moves = nranks == 2
            && up_to > 0
            && group.largest <= GROUP_MOVES_MAX_BYTES
            && match group.calls {
                2 => group.only(&[AllGather, ReduceScatter, AllToAll]),
                calls => calls <= GROUP_BAND_CALLS && group.only(&[AllToAll]),
            };
        group.calls >= 2 && !all_reduces && !moves && !fused && !self.force_core
    }

    /// The group's `calls` calls of a communicator so far as fused launches would hold them
    /// (`so_far`; `None` where they do not fit `max_fused_launches`), with one more, planned as
    /// `next`: in the last launch where it fits there (`fuses_with`), else in a launch of its
    /// own, as `group::batches` cuts them. Inlined: its answer is read at once, and a call's
    /// answer through memory waits for the stores that wrote it.
    #[inline]
    pub fn fused_with(
        &self,
        so_far: Option<Fused>,
        calls: usize,
        next: &Plan,
        nranks: usize,
        max_blocks: u32,
    ) -> Option<Fused> {
        let more = next.fused_bytes().filter(|_| self.batch)?;
        if calls == 0 {
            let first = *next;
            return Some(Fused {
                first,
                launches: 1,
                calls: 1,
                bytes: more,
            });
        }
        let so_far = so_far?;
        if self.fuses_with(
            &so_far.first,
            so_far.calls,
            so_far.bytes,
            next,
            nranks,
            max_blocks,
        ) {
            let (calls, bytes) = (so_far.calls + 1, so_far.bytes + more);
            return Some(Fused {
                calls,
                bytes,
                ..so_far
            });
        }
        let another = so_far.first.same_launch(next)
            && so_far.launches < max_fused_launches(&so_far.first, nranks);
        another.then_some(Fused {
            launches: so_far.launches + 1,
            calls: 1,
            bytes: more,
            ..so_far
        })
    }

    /// Whether a call planned as `next` joins a fused launch (device.cuh, "fused launches") of
    /// `calls` calls so far, led by `first`, whose data takes `bytes` of the inboxes: the same
    /// packet kernel, at most MAX_FUSED calls, and all their data no more than one call of that
    /// kernel may have (`ll_max`, `ll_move_max`: what the inboxes hold, or less; for the sentinel
    /// kernel `sentinel_fused_max`), in a grid of at most `max_blocks` (`CommFacts::max_blocks`).
    /// From the calls' plans, the settings and the communicator's facts alone: every rank fuses
    /// the same calls of its group.
    pub fn fuses_with(
        &self,
        first: &Plan,
        calls: usize,
        bytes: usize,
        next: &Plan,
        nranks: usize,
        max_blocks: u32,
    ) -> bool {
        let most = match first.algorithm {
            Algorithm::Sentinel => self.sentinel_fused_max(nranks),
            Algorithm::LowLatency => self.ll_max(nranks),
            packets if packets.is_packet_kernel() => self.ll_move_max(nranks),
            _ => 0,
        };
        self.batch
            && calls < MAX_FUSED
            && first.same_launch(next)
            && next.fused_bytes().is_some_and(|more| {
                let all = bytes.saturating_add(more);
                all <= most
                    && (max_blocks == u32::MAX
                        || fused_shape(self, first.algorithm, all, nranks).0 <= max_blocks)
            })
    }
}

/// What a plan may depend on besides the call: facts of the communicator that every rank agreed
/// on when it was set up (setup.rs), so that every rank plans alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommFacts {
    pub nranks: usize,
    /// Every rank is in one process: the kernels can reach each other's user buffers.
    pub single_process: bool,
    /// Ranks of several processes, each mapping the others' user buffers (zero_copy/).
    pub zero_copy: bool,
    /// Blocks of MAX_THREADS the two-shot kernels can have resident at once on every rank's GPU:
    /// their blocks wait for each other between windows, so all of them must run at once.
    pub resident_blocks: u32,
    /// The lowest compute capability of the ranks' GPUs, e.g. 90.
    pub compute_capability: u32,
    /// The least of the ranks' measured limits (measured.rs), for collectives no setting limits:
    /// for any buffers, and for buffers in no symmetric window.
    pub measured: Measured,
    /// The most blocks a kernel of the communicator may have: the least bound any rank's user
    /// set on NCCL's CTAs (`maxCTAs`, `NCCL_MAX_CTAS`, `NCCL_MAX_NCHANNELS`); `u32::MAX` where none
    /// did. A call whose grid would be larger goes to NCCL, which keeps to it.
    pub max_blocks: u32,
    /// A rank's user asked NCCL to move what it can with the copy engines, no SM taking part
    /// (`CTAPolicy` ZERO, ctas.rs): calls NCCL may move so go to NCCL.
    pub copy_engines: bool,
}

/// A group's calls of a communicator as fused launches hold them (`Settings::fused_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fused {
    /// The first call's plan: every call's is of the same kernel.
    pub first: Plan,
    pub launches: usize,
    /// The calls of the last launch, and the bytes they take in the inboxes.
    pub calls: usize,
    pub bytes: usize,
}

/// How the core runs one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub algorithm: Algorithm,
    /// The kernel's element type and count: the call's, but bytes for an all-gather.
    pub dtype: DataType,
    pub count: usize,
    pub op: Op,
    /// The root rank of a rooted collective; -1 otherwise.
    pub root: i32,
    pub blocks: u32,
    pub threads: u32,
}

impl Plan {
    /// Whether calls of this plan and `other` may share a launch: the same kernel, and the same
    /// grid unless the kernel fuses its calls (its grid is then the launch's, `fused_shape`).
    /// Their counts and roots may differ, but reduce-scatters (no root) and reduces share no
    /// launch: the kernel tells the two apart by its first call's root.
    pub fn same_launch(&self, other: &Plan) -> bool {
        let fuses = self.fused_bytes().is_some();
        (self.algorithm, self.dtype, self.op) == (other.algorithm, other.dtype, other.op)
            && (self.root < 0) == (other.root < 0)
            && (fuses || (self.blocks, self.threads) == (other.blocks, other.threads))
    }

    /// The bytes the call takes in a fused launch's inboxes (`Algorithm::fused_bytes`).
    pub fn fused_bytes(&self) -> Option<usize> {
        self.algorithm.fused_bytes(self.count * self.dtype.size())
    }
}

/// The blocks and threads per block of a fused launch of `algorithm` whose calls' data takes
/// `bytes` of the inboxes: as for one call of that size (not its first call's block, which
/// `sentinel_block` may make too small for the rest).
pub fn fused_shape(
    settings: &Settings,
    algorithm: Algorithm,
    bytes: usize,
    nranks: usize,
) -> (u32, u32) {
    if algorithm.is_packet_kernel() {
        return packet_shape(settings, bytes, nranks);
    }
    let (threads, max_blocks) = launch_shape(settings, algorithm, bytes, nranks);
    let unit = if algorithm == Algorithm::Sentinel {
        16
    } else {
        8
    };
    (blocks_for(bytes, unit, threads, max_blocks), threads)
}

/// Blocks of `threads` for one `unit` of `bytes` per thread, at least one and at most `max_blocks`.
fn blocks_for(bytes: usize, unit: usize, threads: u32, max_blocks: u32) -> u32 {
    (bytes.div_ceil(unit) as u64)
        .div_ceil(threads as u64)
        .clamp(1, max_blocks as u64) as u32
}

/// Threads per block and the most blocks, measured on H200 (docs/performance.md): latency-bound
/// sizes gain from spreading over more SMs with smaller blocks; bandwidth-bound two-shot from
/// bigger blocks. One-shot stops at 128 blocks, past which it measured slower; two-shot at
/// `Settings::two_shot_blocks`, and never past what the GPU holds at once (plan_all_reduce).
fn launch_shape(
    settings: &Settings,
    algorithm: Algorithm,
    bytes: usize,
    nranks: usize,
) -> (u32, u32) {
    let two_shot_blocks = settings.two_shot_blocks(nranks, bytes);
    let (threads, most) = match algorithm {
        Algorithm::LowLatency => (128, MAX_BLOCKS),
        // No per-block flags: as many blocks as one pack per thread takes; up to
        // `sentinel_block`, one (a lone block's call ends with no count of blocks done).
        Algorithm::Sentinel if bytes <= settings.sentinel_block(nranks) => {
            (bytes.div_ceil(16).next_multiple_of(64).max(64) as u32, 1)
        }
        Algorithm::Sentinel => (64, SENTINEL_BLOCKS),
        Algorithm::OneShot if bytes <= 256 << 10 => (128, MAX_BLOCKS),
        Algorithm::OneShot => (256, 128),
        _ if bytes <= 4 << 20 => (256, two_shot_blocks),
        _ => (MAX_THREADS, two_shot_blocks),
    };
    (threads, settings.grid_within(most))
}

/// The blocks and threads per block of a packet call of a collective other than all-reduce
/// whose chunks take `chunk` bytes: up to `ll_block`, one block of a thread per 8-byte unit;
/// as the low-latency all-reduce's otherwise.
fn packet_shape(settings: &Settings, chunk: usize, nranks: usize) -> (u32, u32) {
    if chunk <= settings.ll_block(nranks) {
        return (1, chunk.div_ceil(8).next_multiple_of(32) as u32);
    }
    let (threads, max_blocks) = launch_shape(settings, Algorithm::LowLatency, chunk, nranks);
    (blocks_for(chunk, 8, threads, max_blocks), threads)
}

/// The blocks and threads per block of a lone packet call whose chunks of `chunk` bytes go as
/// sentinel stores (`moves_by_sentinel`): as the sentinel all-reduce's, a 16-byte pack per
/// thread.
fn sentinel_move_shape(settings: &Settings, chunk: usize, nranks: usize) -> (u32, u32) {
    let (threads, max_blocks) = launch_shape(settings, Algorithm::Sentinel, chunk, nranks);
    (blocks_for(chunk, 16, threads, max_blocks), threads)
}

/// Whether a lone call planned as `plan` sends its chunks as sentinel stores
/// (`Settings::moves_by_sentinel`): a packet call of a collective that moves bytes.
pub fn moves_by_sentinel(settings: &Settings, plan: &Plan, nranks: usize) -> bool {
    let chunk = plan.count * plan.dtype.size();
    sends_by_sentinel(settings, plan.algorithm, chunk, nranks)
}

/// Whether a lone call of `algorithm`, of chunks of `chunk` bytes, sends them as sentinel
/// stores: a packet kernel that moves bytes, where the settings send such chunks so.
fn sends_by_sentinel(
    settings: &Settings,
    algorithm: Algorithm,
    chunk: usize,
    nranks: usize,
) -> bool {
    algorithm.is_packet_kernel()
        && !algorithm.reduces()
        && settings.moves_by_sentinel(chunk, nranks)
}

/// The core's plan for an all-reduce of `count` elements, or `None` to leave it to NCCL.
pub fn plan_all_reduce(
    settings: &Settings,
    count: usize,
    dtype: u32,
    op: u32,
    comm: &CommFacts,
) -> Option<Plan> {
    let (nranks, single_process) = (comm.nranks, comm.single_process);
    let (dtype, op) = (DataType::from_nccl(dtype)?, Op::from_nccl(op)?);
    let bytes = count.checked_mul(dtype.size())?;
    if !settings.enabled || count == 0 || !(2..=MAX_RANKS).contains(&nranks) {
        return None;
    }
    if !runs_type(dtype, comm) {
        return None;
    }
    // Forced, the core takes any size (two-shot goes through the staging in windows).
    if !settings.force_core && bytes > settings.all_reduce_max(nranks, single_process) {
        return None;
    }
    // Each thread moves 8 bytes at a time in the low-latency kernel, 16 in the others.
    let (algorithm, unit) =
        if Algorithm::Sentinel.supports(dtype, op) && bytes <= settings.sentinel_max(nranks) {
            (Algorithm::Sentinel, 16)
        } else if bytes <= settings.ll_max(nranks) {
            (Algorithm::LowLatency, 8)
        } else if bytes <= settings.one_shot_max(nranks) {
            (Algorithm::OneShot, 16)
        } else if settings.uses_direct(single_process || comm.zero_copy) {
            (Algorithm::Direct, 16)
        } else {
            (Algorithm::TwoShot, 16)
        };
    let (threads, mut max_blocks) = launch_shape(settings, algorithm, bytes, nranks);
    if algorithm.needs_resident_grid() {
        max_blocks = max_blocks.min(comm.resident_blocks.max(1));
    }
    let blocks = blocks_for(bytes, unit, threads, max_blocks);
    Some(Plan {
        algorithm,
        dtype,
        count,
        op,
        root: -1,
        blocks,
        threads,
    })
}

/// Whether the core takes calls of `dtype` on `comm`: fp8 only where every rank's GPU is sm_90 or
/// later, as NCCL (which refuses fp8 reductions on older GPUs, and has refused fp8 moves too).
fn runs_type(dtype: DataType, comm: &CommFacts) -> bool {
    let fp8 = matches!(dtype, DataType::Float8e4m3 | DataType::Float8e5m2);
    !fp8 || comm.compute_capability >= 90
}

/// `plan` for a call of these arguments whose buffers lie in no symmetric window (tests).
#[cfg(test)]
pub fn plan_args(
    settings: &Settings,
    collective: Collective,
    count: usize,
    datatype: u32,
    op: u32,
    root: i32,
    comm: &CommFacts,
) -> Option<Plan> {
    plan_args_lying(
        settings,
        collective,
        count,
        datatype,
        op,
        root,
        comm,
        Buffers::Plain,
    )
}

/// `plan_args` for a call whose buffers lie as `buffers` says (tests).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn plan_args_lying(
    settings: &Settings,
    collective: Collective,
    count: usize,
    datatype: u32,
    op: u32,
    root: i32,
    comm: &CommFacts,
    buffers: Buffers,
) -> Option<Plan> {
    let call = Call {
        kind: 0,
        comm: std::ptr::null_mut(),
        send: std::ptr::null(),
        recv: std::ptr::null_mut(),
        count,
        datatype,
        op: Some(op),
        root: Some(root),
        stream: std::ptr::null_mut(),
    };
    plan(settings, collective, &call, comm, || buffers)
}

/// The core's plan for `call` of `collective` (its `op` ignored where the collective does not
/// reduce, its `root` where it has none), or `None` to leave it to NCCL. `buffers` says where
/// the buffers every rank uses lie (which of NCCL's kernels it races: the measured limits of
/// that kind apply; whether NCCL may move it with its copy engines), asked only where that
/// decides: where a measured limit does (not of all-reduce, nor of calls declined before), and
/// of the calls NCCL may move with its copy engines where a user asked for them.
pub fn plan(
    settings: &Settings,
    collective: Collective,
    call: &Call,
    comm: &CommFacts,
    buffers: impl FnOnce() -> Buffers,
) -> Option<Plan> {
    let within = |plan: &Plan| plan.blocks <= comm.max_blocks;
    if comm.copy_engines && collective.nccl_may_use_copy_engines() {
        // NCCL moves it with its copy engines where its buffers lie in symmetric windows.
        let lying = buffers();
        if lying == Buffers::InWindows {
            return None;
        }
        return planned(settings, collective, call, comm, || lying).filter(within);
    }
    planned(settings, collective, call, comm, buffers).filter(within)
}

/// `plan`, whatever its grid.
fn planned(
    settings: &Settings,
    collective: Collective,
    call: &Call,
    comm: &CommFacts,
    buffers: impl FnOnce() -> Buffers,
) -> Option<Plan> {
    let (count, dtype) = (call.count, call.datatype);
    let (op, root) = (call.op.unwrap_or(0), call.root.unwrap_or(-1));
    let Some(algorithm) = Algorithm::of(collective) else {
        return plan_all_reduce(settings, count, dtype, op, comm);
    };
    let nranks = comm.nranks;
    let dtype = DataType::from_nccl(dtype)?;
    if !runs_type(dtype, comm) {
        return None;
    }
    let op = match collective.reduces() {
        true => Op::from_nccl(op)?,
        false => Op::Sum,
    };
    let root = match collective.rooted() {
        // A root out of range is for the real NCCL to report.
        true if (0..nranks as i32).contains(&root) => root,
        true => return None,
        false => -1,
    };
    if !settings.enabled || count == 0 || !(2..=MAX_RANKS).contains(&nranks) {
        return None;
    }
    let chunk = count.checked_mul(dtype.size())?;
    // Any size whose every rank's chunks the kernels' offsets hold: the staged paths go through
    // the staging in windows (device/moves.cu), so only the limits bound a call.
    chunk.checked_mul(nranks)?;
    let size = collective.size(chunk, nranks);
    let limit = settings.limit(collective, comm.measured.of(buffers()));
    if !settings.force_core && !limit.takes(size) {
        return None;
    }
    let (dtype, count) = match collective.reduces() {
        true => (dtype, count),
        false => (DataType::Uint8, chunk),
    };
    // Small chunks go as packets, as the low-latency all-reduce's: 8 bytes per thread; larger
    // ones of a lone call as sentinel stores, where they go so (16 bytes per thread); the rest
    // by the collective's larger kernel.
    let (algorithm, (blocks, threads)) = match Algorithm::low_latency_of(collective) {
        Some(low_latency) if sends_by_sentinel(settings, low_latency, chunk, nranks) => {
            (low_latency, sentinel_move_shape(settings, chunk, nranks))
        }
        Some(low_latency) if chunk <= settings.ll_move_max(nranks) => {
            (low_latency, packet_shape(settings, chunk, nranks))
        }
        _ => (algorithm, move_shape(settings, comm, chunk, size, nranks)),
    };
    Some(Plan {
        algorithm,
        dtype,
        count,
        op,
        root,
        blocks,
        threads,
    })
}

/// The blocks and threads per block of a call of chunks of `chunk` bytes (`size` in all) by the
/// other collectives' larger kernels: as two-shot's, which moves as much, 16 bytes per thread,
/// in grids the GPU holds at once.
fn move_shape(
    settings: &Settings,
    comm: &CommFacts,
    chunk: usize,
    size: usize,
    nranks: usize,
) -> (u32, u32) {
    let threads = if size <= 4 << 20 { 256 } else { MAX_THREADS };
    let max_blocks = settings
        .grid_within(settings.two_shot_blocks(nranks, size))
        .min(comm.resident_blocks.max(1));
    (blocks_for(chunk, 16, threads, max_blocks), threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::plan_args as plan;

    fn with(vars: &[(&str, &str)]) -> Settings {
        Settings::from_vars(vars)
    }

    /// A group of calls of `collective`, of these sizes (as `plan` counts them).
    fn group_of(collective: Collective, sizes: &[usize]) -> GroupSoFar {
        GroupSoFar {
            calls: sizes.len(),
            smallest: sizes.iter().copied().min().unwrap_or(0),
            largest: sizes.iter().copied().max().unwrap_or(0),
            collectives: GroupSoFar::bit(collective),
        }
    }

    /// A plan of `count` bytes (for `GroupSoFar::and`, which reads only its size).
    fn plan_for_group(count: usize) -> Plan {
        Plan {
            algorithm: Algorithm::AllGather,
            dtype: DataType::Uint8,
            count,
            op: Op::Sum,
            root: -1,
            blocks: 1,
            threads: 256,
        }
    }

    #[test]
    fn a_group_goes_to_nccl_whole_unless_every_call_is_in_the_cores_band() {
        let goes = |s: &Settings, sizes: &[usize]| {
            s.group_goes_to_nccl(&group_of(Collective::AllReduce, sizes), 2, false)
        };
        let s = with(&[]);
        let (above, up_to) = GROUP_CORE_BYTES;
        assert!(goes(&s, &[8, 8]), "small calls");
        assert!(goes(&s, &[8, up_to]), "a small one");
        assert!(goes(&s, &[above + 1, up_to, up_to + 1]), "a large one");
        assert!(goes(&s, &[above, up_to]));
        assert!(!goes(&s, &[above + 1, up_to]), "every one in the band");
        let pairs = "two calls stay the core's to larger sizes";
        assert!(!goes(&s, &[above + 1, GROUP_PAIR_MAX_BYTES]), "{pairs}");
        assert!(!goes(&s, &[GROUP_PAIR_MAX_BYTES; 2]), "{pairs}");
        assert!(goes(&s, &[up_to, GROUP_PAIR_MAX_BYTES + 1]), "{pairs}");
        assert!(goes(&s, &[up_to + 1; 3]), "{pairs}");
        let broadcasts = group_of(Collective::Broadcast, &[up_to, up_to + 1]);
        assert!(
            s.group_goes_to_nccl(&broadcasts, 2, false),
            "pairs of all-reduces only"
        );
        let in_band = group_of(Collective::Broadcast, &[up_to, up_to]);
        assert!(
            s.group_goes_to_nccl(&in_band, 2, false),
            "the band holds for all-reduces only"
        );
        assert!(!s.group_goes_to_nccl(&in_band, 2, true), "unless they fuse");
        let pair = group_of(Collective::AllReduce, &[up_to, up_to + 1]);
        assert!(!s.group_goes_to_nccl(&pair, 2, false));
        assert!(
            s.group_goes_to_nccl(&pair, 4, false),
            "pairs on 2 ranks only"
        );
        assert!(goes(
            &with(&[("NCCLSHIM_TUNE", "group_core:0-0")]),
            &[up_to; 2]
        ));
        let band = [up_to; GROUP_BAND_CALLS];
        assert!(!goes(&s, &band));
        assert!(
            goes(&s, &[band.as_slice(), &[up_to]].concat()),
            "more calls than the band's"
        );
        assert!(!goes(&s, &[8]), "a lone call stays");
        let never = with(&[("NCCLSHIM_TUNE", "group_core:0-0")]);
        assert!(goes(&never, &[1, 1 << 30]));
        let always = with(&[("NCCLSHIM_TUNE", "group_core:0-1G")]);
        assert!(!goes(&always, &[1, 1 << 30]));
        assert!(!goes(&with(&[("NCCLSHIM_CORE", "force")]), &[8, 8]));
    }

    /// On 2 ranks, pairs of all-gathers, reduce-scatters and all-to-alls, mixed or not, and up to
    /// GROUP_BAND_CALLS all-to-alls, stay the core's up to GROUP_MOVES_MAX_BYTES a chunk.
    #[test]
    fn pairs_of_larger_moves_stay_the_cores_on_two_ranks() {
        use Collective::{AllGather, AllToAll, Broadcast, ReduceScatter};
        let s = with(&[]);
        let top = GROUP_MOVES_MAX_BYTES;
        let goes = |group: GroupSoFar, nranks| s.group_goes_to_nccl(&group, nranks, false);
        for collective in [AllGather, ReduceScatter, AllToAll] {
            assert!(
                !goes(group_of(collective, &[top, top]), 2),
                "{collective:?}"
            );
            assert!(
                goes(group_of(collective, &[top, top + 1]), 2),
                "{collective:?}"
            );
            assert!(goes(group_of(collective, &[top, top]), 4), "{collective:?}");
        }
        let mixed = group_of(AllGather, &[top, top]).and(ReduceScatter, &plan_for_group(top));
        assert!(goes(mixed, 2), "three calls");
        let pair = group_of(AllGather, &[top]).and(ReduceScatter, &plan_for_group(top));
        assert!(
            !goes(pair, 2),
            "a pair of an all-gather and a reduce-scatter"
        );
        assert!(!goes(group_of(AllToAll, &[top; GROUP_BAND_CALLS]), 2));
        assert!(goes(group_of(AllToAll, &[top; GROUP_BAND_CALLS + 1]), 2));
        assert!(
            goes(group_of(AllGather, &[top; 3]), 2),
            "only all-to-alls past two"
        );
        assert!(goes(group_of(Broadcast, &[top; 2]), 2), "broadcasts lose");
        let off = with(&[("NCCLSHIM_TUNE", "group_core:0-0")]);
        assert!(off.group_goes_to_nccl(&group_of(AllToAll, &[top; 2]), 2, false));
    }

    /// A group's all-reduces (count, NCCL type, NCCL op) on a communicator of `nranks`, as the
    /// group weighs them: whether they all fuse into one launch, and whether the group goes to
    /// NCCL.
    fn fused_group(s: &Settings, nranks: usize, calls: &[(usize, u32, u32)]) -> (bool, bool) {
        let mut fused = None;
        let mut group = GroupSoFar::NONE;
        for &(count, dtype, op) in calls {
            let plan = plan_all_reduce(s, count, dtype, op, &procs(nranks)).unwrap();
            fused = s.fused_with(fused, group.calls, &plan, nranks, u32::MAX);
            group = group.and(Collective::AllReduce, &plan);
        }
        let goes = s.group_goes_to_nccl(&group, nranks, fused.is_some());
        (fused.is_some(), goes)
    }

    /// Small all-reduces of one kernel (type, op) fuse into launches, each of at most MAX_FUSED
    /// calls whose data fits where one call of that kernel may go, and a group of them that
    /// takes at most MAX_FUSED_ALL_REDUCE_LAUNCHES (floats on 2 ranks; else MAX_FUSED_LAUNCHES)
    /// stays the core's.
    #[test]
    fn small_all_reduces_of_one_kernel_fuse_while_they_fit() {
        let s = with(&[]);
        let (f32, i32, sum, max) = (7, 2, 0, 2);
        let kib = |n: usize, size: usize| (n << 10) / size;
        let stays = (true, false);
        let goes = (false, true);
        assert_eq!(fused_group(&s, 2, &[(2, f32, sum); 4]), stays, "sentinel");
        assert_eq!(
            fused_group(&s, 2, &[(2, i32, sum); 4]),
            stays,
            "low latency"
        );
        let eight = [(kib(64, 4), f32, sum); MAX_FUSED];
        assert_eq!(fused_group(&s, 2, &eight), stays, "the inbox, full");
        let launches = |calls: usize, count: usize| vec![(count, f32, sum); calls];
        let most = MAX_FUSED * MAX_FUSED_ALL_REDUCE_LAUNCHES;
        assert_eq!(fused_group(&s, 2, &launches(most, 1)), stays, "calls");
        assert_eq!(
            fused_group(&s, 2, &launches(most + 1, 1)),
            goes,
            "past the calls"
        );
        // On 2 ranks a launch carries four lone calls' most (`sentinel_fused_max`).
        let largest = kib(512, 4);
        assert_eq!(
            fused_group(&s, 2, &launches(16, largest)),
            stays,
            "four full inboxes"
        );
        assert_eq!(
            fused_group(&s, 2, &launches(17, largest)),
            goes,
            "past them"
        );
        // On 4 ranks one lone call's most, in two launches.
        let quarter = kib(256, 4);
        assert_eq!(fused_group(&s, 4, &launches(4, quarter)), stays, "on 4");
        assert_eq!(fused_group(&s, 4, &launches(5, quarter)), goes, "on 4");
        let integers = [(kib(128, 4), i32, sum); MAX_FUSED_LAUNCHES + 1];
        assert_eq!(
            fused_group(&s, 2, &integers[1..]),
            stays,
            "integers: a launch each"
        );
        assert_eq!(
            fused_group(&s, 2, &integers),
            goes,
            "integers: two launches"
        );
        let two = [(kib(64, 4), i32, sum); 2];
        assert_eq!(
            fused_group(&s, 2, &two),
            stays,
            "128 KiB of packets on 2 ranks"
        );
        let two_on_four = [(kib(32, 4), i32, sum); 2];
        assert_eq!(
            fused_group(&s, 4, &two_on_four),
            stays,
            "on 4: 32 KiB, two launches"
        );
        assert_eq!(fused_group(&s, 4, &[(kib(32, 4), i32, sum); 3]), goes);
        assert_eq!(
            fused_group(&s, 2, &[(2, f32, sum), (2, i32, sum)]),
            goes,
            "types"
        );
        assert_eq!(
            fused_group(&s, 2, &[(2, f32, sum), (2, f32, max)]),
            goes,
            "ops"
        );
        // Not a packet kernel: one-shot.
        assert_eq!(
            fused_group(&s, 2, &[(kib(1024, 4), f32, sum); 2]),
            (false, false),
            "band"
        );
        // Six calls of 300 KiB a launch (1,800 of its 2,048 KiB).
        let six = launches(6 * MAX_FUSED_ALL_REDUCE_LAUNCHES, kib(300, 4));
        assert_eq!(fused_group(&s, 2, &six), stays, "six a launch");
        let more = launches(6 * MAX_FUSED_ALL_REDUCE_LAUNCHES + 1, kib(300, 4));
        assert_eq!(fused_group(&s, 2, &more), goes, "past the launches");
        let unbatched = with(&[("NCCLSHIM_TUNE", "batch:0")]);
        assert_eq!(fused_group(&unbatched, 2, &[(2, f32, sum); 4]), goes);
        let small = with(&[("NCCLSHIM_TUNE", "sentinel_max:4096")]);
        let calls = [(kib(2, 4), f32, sum); 2 * MAX_FUSED_ALL_REDUCE_LAUNCHES + 1];
        assert_eq!(
            fused_group(&small, 2, &calls),
            goes,
            "by the setting's limit"
        );
    }

    /// A group's packet calls of the other collectives fuse as all-reduce's do: one kernel (the
    /// collective; its type and op where it reduces; any roots, but reduce-scatters apart from
    /// reduces), at most MAX_FUSED calls a launch, their chunks within what the inboxes hold
    /// (`ll_move_max`), at most MAX_FUSED_LAUNCHES launches a group.
    #[test]
    fn small_calls_of_the_other_collectives_fuse_while_they_fit() {
        let every = "all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M,\
                     gather:32M,scatter:32M";
        let s = with(&[("NCCLSHIM_MAX_BYTES", every)]);
        // (collective, count, dtype, op, root) of each call.
        let group = |nranks: usize, calls: &[(Collective, usize, u32, u32, i32)]| {
            let mut fused = None;
            for (k, &(collective, count, dtype, op, root)) in calls.iter().enumerate() {
                let plan = plan(&s, collective, count, dtype, op, root, &procs(nranks)).unwrap();
                assert!(
                    plan.algorithm.is_packet_kernel(),
                    "{collective:?} of {count}"
                );
                fused = s.fused_with(fused, k, &plan, nranks, u32::MAX);
            }
            fused.map(|f| (f.launches, f.calls))
        };
        let (f32, bf16, i8, sum, max) = (7, 9, 0, 0, 2);
        let gather = |count| (Collective::AllGather, count, f32, sum, -1);
        assert_eq!(
            group(2, &[gather(1), gather(3), gather(1000)]),
            Some((1, 3))
        );
        // Moves share a kernel whatever their type: they move bytes.
        let bytes = (Collective::AllGather, 5, i8, sum, -1);
        assert_eq!(group(2, &[gather(1), bytes]), Some((1, 2)));
        // The inbox of 2 ranks (1 MiB a chunk), full, then past it and past two launches.
        let quarter = gather((256 << 10) / 4);
        assert_eq!(group(2, &[quarter; 4]), Some((1, 4)));
        assert_eq!(group(2, &[quarter; 5]), Some((2, 1)));
        assert_eq!(group(2, &[quarter; 8]), Some((2, 4)));
        assert_eq!(group(2, &[quarter; 9]), None);
        // On 4 ranks packets carry 256 KiB a chunk.
        let eighth = gather((128 << 10) / 4);
        assert_eq!(group(4, &[eighth; 2]), Some((1, 2)));
        assert_eq!(group(4, &[eighth; 3]), Some((2, 1)));
        assert_eq!(group(2, &[gather(1); MAX_FUSED + 1]), Some((2, 1)));
        // Rooted calls fuse whatever their roots.
        let broadcast = |root| (Collective::Broadcast, 100, f32, sum, root);
        assert_eq!(
            group(4, &[broadcast(0), broadcast(3), broadcast(1)]),
            Some((1, 3))
        );
        // Reduce-scatters fuse by type and op; reduces apart from them.
        let scatter = |dtype, op| (Collective::ReduceScatter, 100, dtype, op, -1);
        let reduce = (Collective::Reduce, 100, f32, sum, 1);
        assert_eq!(group(2, &[scatter(f32, sum); 3]), Some((1, 3)));
        assert_eq!(group(2, &[scatter(f32, sum), scatter(bf16, sum)]), None);
        assert_eq!(group(2, &[scatter(f32, sum), scatter(f32, max)]), None);
        assert_eq!(group(2, &[scatter(f32, sum), reduce]), None);
        assert_eq!(group(2, &[reduce, reduce]), Some((1, 2)));
        // Two collectives: two kernels, so no fused launch.
        assert_eq!(group(2, &[gather(1), broadcast(0)]), None);
        let (gathered, goes) = (
            group(2, &[gather(1); 3]),
            s.group_goes_to_nccl(
                &GroupSoFar {
                    calls: 3,
                    ..GroupSoFar::NONE
                },
                2,
                true,
            ),
        );
        assert!(
            gathered.is_some() && !goes,
            "a fused group stays the core's"
        );
    }

    /// `fused_with` (what `group::add` decides on) counts the launches that `fuses_with` (what
    /// `group::joins` cuts by) makes, call by call, for any sequence of small calls of one
    /// packet kernel.
    #[test]
    fn the_weighed_launches_are_the_launches_cut() {
        let s = with(&[("NCCLSHIM_MAX_BYTES", "all_gather:32M,reduce_scatter:32M")]);
        let facts = procs(2);
        // Float all-reduces, all-gathers and reduce-scatters, each as packets.
        let plan_of = |kind: usize, seed: u64| match kind {
            0 => plan_all_reduce(&s, 1 + (seed >> 33) as usize % (48 << 10), 7, 0, &facts),
            1 => plan(
                &s,
                Collective::AllGather,
                1 + (seed >> 33) as usize % (64 << 10),
                7,
                0,
                -1,
                &facts,
            ),
            _ => plan(
                &s,
                Collective::ReduceScatter,
                1 + (seed >> 33) as usize % (64 << 10),
                7,
                0,
                -1,
                &facts,
            ),
        };
        let mut seed = 12345u64;
        for round in 0..300 {
            let (mut fused, mut cut): (Option<Fused>, Vec<(Plan, usize, usize)>) = (None, vec![]);
            for k in 0..20 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let plan = plan_of(round % 3, seed).unwrap();
                fused = s.fused_with(fused, k, &plan, 2, u32::MAX);
                let more = plan.fused_bytes().unwrap();
                match cut.last_mut() {
                    Some((first, calls, bytes))
                        if s.fuses_with(first, *calls, *bytes, &plan, 2, u32::MAX) =>
                    {
                        *calls += 1;
                        *bytes += more;
                    }
                    _ => cut.push((plan, 1, more)),
                }
                match fused {
                    Some(f) => {
                        assert_eq!(f.launches, cut.len());
                        assert_eq!(
                            (f.calls, f.bytes),
                            (cut.last().unwrap().1, cut.last().unwrap().2)
                        );
                    }
                    None => {
                        assert!(cut.len() > max_fused_launches(&cut[0].0, 2));
                        break;
                    }
                }
            }
        }
    }

    /// A fused launch's grid is one call's of all its data; other kernels' calls share a launch
    /// only with calls of the same grid.
    #[test]
    fn a_fused_launch_is_sized_by_all_its_calls() {
        let s = with(&[]);
        let facts = procs(2);
        let small = plan_all_reduce(&s, 16, 7, 0, &facts).unwrap();
        let large = plan_all_reduce(&s, 64 << 10, 7, 0, &facts).unwrap();
        assert!(small.same_launch(&large) && small.blocks < large.blocks);
        let both = small.fused_bytes().unwrap() + large.fused_bytes().unwrap();
        assert!(fused_shape(&s, Algorithm::Sentinel, both, 2).0 >= large.blocks);
        assert_eq!(
            fused_shape(&s, Algorithm::Sentinel, 64, 2),
            (small.blocks, small.threads)
        );
        // Eight calls of 512 bytes on 2 ranks: one block of a thread for each of their 256 packs,
        // not the first call's block of 64.
        assert_eq!(fused_shape(&s, Algorithm::Sentinel, 8 * 512, 2), (1, 256));
        // 256 and 512 KiB of i32: one-shot, with other grids.
        let one_shot = plan_all_reduce(&s, 64 << 10, 2, 0, &facts).unwrap();
        let bigger = plan_all_reduce(&s, 128 << 10, 2, 0, &facts).unwrap();
        assert_eq!(
            (one_shot.algorithm, bigger.algorithm),
            (Algorithm::OneShot, Algorithm::OneShot)
        );
        assert!(one_shot.fused_bytes().is_none());
        assert!(!one_shot.same_launch(&bigger) && one_shot.same_launch(&one_shot));
    }

    /// A communicator of `nranks` processes on GPUs like H200's.
    fn procs(nranks: usize) -> CommFacts {
        CommFacts {
            nranks,
            single_process: false,
            zero_copy: false,
            resident_blocks: 132,
            compute_capability: 90,
            measured: Measured::NONE,
            max_blocks: u32::MAX,
            copy_engines: false,
        }
    }

    /// `max_blocks` bounds every grid the core plans, alone or fused, and changes nothing else
    /// of a plan; the defaults go past it.
    #[test]
    fn max_blocks_bounds_every_grid() {
        let everything = [("NCCLSHIM_CORE", "force")];
        let capped = [
            ("NCCLSHIM_CORE", "force"),
            ("NCCLSHIM_TUNE", "max_blocks:32"),
        ];
        let (free, bounded) = (with(&everything), with(&capped));
        let mut above = 0;
        for nranks in [2, 4] {
            for collective in Collective::ALL {
                for shift in 3..=28 {
                    let count = (1usize << shift) / 4;
                    let plan = |s| plan_args(s, collective, count, 7, 0, 0, &procs(nranks));
                    let (a, b) = (plan(&free).unwrap(), plan(&bounded).unwrap());
                    assert!(b.blocks <= 32, "{collective:?} {count} on {nranks}: {b:?}");
                    assert_eq!(b.blocks, a.blocks.min(32), "{collective:?} {count}");
                    assert_eq!(
                        Plan {
                            blocks: a.blocks,
                            ..b
                        },
                        a
                    );
                    above += usize::from(a.blocks > 32);
                }
            }
            for algorithm in [Algorithm::Sentinel, Algorithm::LowLatency] {
                assert!(fused_shape(&bounded, algorithm, 512 << 10, nranks).0 <= 32);
            }
        }
        assert!(above > 0, "no default grid above 32 blocks");
        assert!(bounded.agreed() != free.agreed(), "ranks compare it");
    }

    /// A communicator whose user bounded NCCL's CTAs leaves to NCCL the calls whose grid would
    /// be larger, and keeps the others as they are.
    #[test]
    fn calls_past_the_users_bound_on_ctas_go_to_nccl() {
        let s = with(&[("NCCLSHIM_CORE", "force")]);
        let bounded = CommFacts {
            max_blocks: 8,
            ..procs(2)
        };
        let (mut kept, mut left) = (0, 0);
        for collective in Collective::ALL {
            for shift in 3..=24 {
                let count = (1usize << shift) / 4;
                let free = plan_args(&s, collective, count, 7, 0, 0, &procs(2)).unwrap();
                let plan = plan_args(&s, collective, count, 7, 0, 0, &bounded);
                match free.blocks <= 8 {
                    true => assert_eq!(plan, Some(free), "{collective:?} {count}"),
                    false => assert_eq!(plan, None, "{collective:?} {count}"),
                }
                (kept, left) = (
                    kept + usize::from(plan.is_some()),
                    left + usize::from(plan.is_none()),
                );
            }
        }
        assert!(kept > 0 && left > 0, "{kept} kept, {left} left");
    }

    /// A communicator whose user asked for NCCL's copy engines leaves to NCCL the calls NCCL
    /// may move with them (of those collectives, with buffers in symmetric windows), forced or
    /// not, and plans every other call as before.
    #[test]
    fn calls_nccl_moves_with_its_copy_engines_go_to_nccl_where_asked() {
        let copy_engines = CommFacts {
            copy_engines: true,
            ..procs(2)
        };
        for s in [with(&[("NCCLSHIM_CORE", "force")]), with(&[])] {
            for collective in Collective::ALL {
                for buffers in [Buffers::Plain, Buffers::InWindows] {
                    let plan = |comm| plan_args_lying(&s, collective, 256, 7, 0, 0, comm, buffers);
                    let (free, asked) = (plan(&procs(2)), plan(&copy_engines));
                    match collective.nccl_may_use_copy_engines() && buffers == Buffers::InWindows {
                        true => assert_eq!(asked, None, "{collective:?}"),
                        false => assert_eq!(asked, free, "{collective:?} {buffers:?}"),
                    }
                }
            }
        }
        // Taken where not asked: the test above tells something apart.
        let s = with(&[("NCCLSHIM_CORE", "force")]);
        let windows = Buffers::InWindows;
        assert!(
            plan_args_lying(&s, Collective::AllGather, 256, 7, 0, 0, &procs(2), windows).is_some()
        );
        // All-reduce and the reductions are never NCCL's copy engines' (ncclCeImplemented).
        for collective in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::Reduce,
        ] {
            assert!(!collective.nccl_may_use_copy_engines());
        }
    }

    /// Calls that would fuse past the bound go in another launch instead, as `joins` launches
    /// them (fuses_with), each keeping to it.
    #[test]
    fn a_bound_on_blocks_starts_another_fused_launch() {
        let s = with(&[]);
        let bounded = CommFacts {
            max_blocks: 16,
            ..procs(2)
        };
        // Two sentinel all-reduces of 10 KiB: 10 blocks each, 20 together.
        let plan = plan_args(&s, Collective::AllReduce, 2560, 7, 0, -1, &bounded).unwrap();
        assert_eq!(plan.algorithm, Algorithm::Sentinel);
        let launches = |max_blocks| {
            let first = s.fused_with(None, 0, &plan, 2, max_blocks);
            let both = s.fused_with(first, 1, &plan, 2, max_blocks).unwrap();
            (
                both.launches,
                s.fuses_with(&plan, 1, 10 << 10, &plan, 2, max_blocks),
            )
        };
        assert_eq!(launches(u32::MAX), (1, true));
        assert_eq!(launches(16), (2, false));
        assert!(plan.blocks <= 16 && fused_shape(&s, plan.algorithm, 20 << 10, 2).0 > 16);
    }

    /// fp8 stays with NCCL where a rank's GPU is older than sm_90, as NCCL refuses it there;
    /// other types, and fp8 from sm_90 on, are the core's.
    #[test]
    fn fp8_is_the_cores_only_from_sm_90_on() {
        let s = with(&[("NCCLSHIM_MAX_BYTES", "all_gather:1048576")]);
        let a100 = CommFacts {
            compute_capability: 80,
            ..procs(2)
        };
        // ncclFloat8e4m3 (10), ncclFloat8e5m2 (11), ncclFloat (7).
        for fp8 in [10, 11] {
            assert!(plan_all_reduce(&s, 1024, fp8, 0, &procs(2)).is_some());
            assert!(plan_all_reduce(&s, 1024, fp8, 0, &a100).is_none());
            assert!(plan(&s, Collective::AllGather, 1024, fp8, 0, -1, &procs(2)).is_some());
            assert!(plan(&s, Collective::AllGather, 1024, fp8, 0, -1, &a100).is_none());
        }
        assert!(plan_all_reduce(&s, 1024, 7, 0, &a100).is_some());
        assert!(plan(&s, Collective::AllGather, 1024, 7, 0, -1, &a100).is_some());
    }

    /// The plan's algorithm for `bytes` of floats.
    fn algorithm(s: &Settings, bytes: usize, nranks: usize) -> Option<Algorithm> {
        plan_all_reduce(s, bytes / 4, 7, 0, &procs(nranks)).map(|p| p.algorithm)
    }

    /// The plan's algorithm for `bytes` of 32-bit integers, which have no sentinel.
    fn int_algorithm(s: &Settings, bytes: usize, nranks: usize) -> Option<Algorithm> {
        plan_all_reduce(s, bytes / 4, 2, 0, &procs(nranks)).map(|p| p.algorithm)
    }

    #[test]
    fn plans_depend_on_size_type_op_and_ranks_only() {
        let s = with(&[]);
        let plan = plan_all_reduce(&s, 1024, 7, 0, &procs(2)).unwrap();
        assert_eq!(
            (plan.algorithm, plan.dtype, plan.op),
            (Algorithm::Sentinel, DataType::Float32, Op::Sum)
        );
        let floats = "floating-point types: the sentinel kernel up to 512 KiB on 2 - 4 ranks";
        for nranks in [2, 4] {
            assert_eq!(
                algorithm(&s, 8, nranks),
                Some(Algorithm::Sentinel),
                "{floats}"
            );
            assert_eq!(algorithm(&s, 512 << 10, nranks), Some(Algorithm::Sentinel));
        }
        assert_eq!(algorithm(&s, (512 << 10) + 4, 2), Some(Algorithm::OneShot));
        assert_eq!(algorithm(&s, (512 << 10) + 4, 4), Some(Algorithm::TwoShot));
        assert_eq!(
            algorithm(&s, 8, 8),
            Some(Algorithm::LowLatency),
            "more ranks: not measured"
        );
        for dtype in DataType::ALL {
            let plan = plan_all_reduce(&s, 64, dtype as u32, 4, &procs(2)).unwrap();
            let expected = match dtype.is_float() {
                true => Algorithm::Sentinel,
                false => Algorithm::LowLatency,
            };
            assert_eq!(plan.algorithm, expected, "{dtype:?}");
        }
        let fewer = "each algorithm stops earlier with more ranks";
        assert_eq!(int_algorithm(&s, 128 << 10, 2), Some(Algorithm::LowLatency));
        assert_eq!(
            int_algorithm(&s, (128 << 10) + 4, 2),
            Some(Algorithm::OneShot)
        );
        assert_eq!(int_algorithm(&s, 32 << 10, 4), Some(Algorithm::LowLatency));
        assert_eq!(
            int_algorithm(&s, (32 << 10) + 4, 4),
            Some(Algorithm::OneShot),
            "{fewer}"
        );
        assert_eq!(algorithm(&s, 2 << 20, 2), Some(Algorithm::OneShot));
        assert_eq!(algorithm(&s, (2 << 20) + 4, 2), Some(Algorithm::TwoShot));
        assert_eq!(int_algorithm(&s, 512 << 10, 4), Some(Algorithm::OneShot));
        assert_eq!(
            int_algorithm(&s, (512 << 10) + 4, 4),
            Some(Algorithm::TwoShot),
            "{fewer}"
        );
        assert_eq!(
            algorithm(&s, 512 << 10, 8),
            Some(Algorithm::TwoShot),
            "{fewer}"
        );
        let nccl = "NCCL takes what it does faster";
        assert_eq!(algorithm(&s, 256 << 20, 2), Some(Algorithm::TwoShot));
        assert_eq!(algorithm(&s, (256 << 20) + 4, 2), None, "{nccl}");
        assert_eq!(algorithm(&s, 16 << 20, 4), Some(Algorithm::TwoShot));
        assert_eq!(algorithm(&s, (16 << 20) + 4, 4), None, "{nccl}");
        assert_eq!(plan_all_reduce(&s, 0, 7, 0, &procs(2)), None);
        assert_eq!(
            plan_all_reduce(&s, 8, 7, 5, &procs(2)),
            None,
            "PreMulSum stays with NCCL"
        );
        assert_eq!(plan_all_reduce(&s, 8, 12, 0, &procs(2)), None);
        assert_eq!(plan_all_reduce(&s, 8, 7, 0, &procs(1)), None);
        assert_eq!(plan_all_reduce(&s, 8, 7, 0, &procs(9)), None);
        assert_eq!(plan_all_reduce(&s, usize::MAX / 2, 7, 0, &procs(2)), None);
        let shape = |bytes: usize, nranks| {
            let plan = plan_all_reduce(&s, bytes, 0, 0, &procs(nranks)).unwrap();
            (plan.algorithm, plan.threads, plan.blocks)
        };
        use Algorithm::*;
        let per_8_bytes = "low latency: a thread per 8 bytes, in blocks of 128";
        assert_eq!(shape(8, 2), (LowLatency, 128, 1), "{per_8_bytes}");
        assert_eq!(shape(4 << 10, 2), (LowLatency, 128, 4), "{per_8_bytes}");
        assert_eq!(shape(128 << 10, 2), (LowLatency, 128, 128), "{per_8_bytes}");
        let per_16_bytes = "one-shot and two-shot: a thread per 16 bytes, up to 128 blocks";
        assert_eq!(shape(256 << 10, 4), (OneShot, 128, 128), "{per_16_bytes}");
        assert_eq!(shape(512 << 10, 4), (OneShot, 256, 128), "{per_16_bytes}");
        assert_eq!(shape(4 << 20, 2), (TwoShot, 256, 128), "{per_16_bytes}");
        let sentinel = |bytes: usize, nranks| {
            let plan = plan_all_reduce(&s, bytes / 4, 7, 0, &procs(nranks)).unwrap();
            (plan.algorithm, plan.threads, plan.blocks)
        };
        let per_pack = "sentinel: a thread per 16 bytes, in blocks of 64, as many as that takes";
        assert_eq!(sentinel(8, 3), (Sentinel, 64, 1), "{per_pack}");
        assert_eq!(sentinel(2 << 10, 3), (Sentinel, 64, 2), "{per_pack}");
        assert_eq!(sentinel(8 << 10, 4), (Sentinel, 64, 8), "{per_pack}");
        assert_eq!(sentinel(64 << 10, 4), (Sentinel, 64, 64), "{per_pack}");
        assert_eq!(sentinel(512 << 10, 2), (Sentinel, 64, 512), "{per_pack}");
        let on_two = "2 ranks: up to 8 KiB, one block of a thread per pack";
        assert_eq!(sentinel(8, 2), (Sentinel, 64, 1), "{on_two}");
        assert_eq!(sentinel(2 << 10, 2), (Sentinel, 128, 1), "{on_two}");
        assert_eq!(sentinel(8 << 10, 2), (Sentinel, MAX_THREADS, 1), "{on_two}");
        assert_eq!(sentinel(16 << 10, 2), (Sentinel, 64, 16), "{on_two}");
        assert_eq!(
            sentinel(2 << 10, 4),
            (Sentinel, 128, 1),
            "4 ranks: up to 2 KiB"
        );
        let one_block = with(&[("NCCLSHIM_TUNE", "sentinel_block:4K")]);
        let blocks = |bytes: usize, nranks| {
            let plan = plan_all_reduce(&one_block, bytes / 4, 7, 0, &procs(nranks)).unwrap();
            (plan.threads, plan.blocks)
        };
        let single = "sentinel_block: up to its size, one block of a thread per pack";
        assert_eq!(blocks(8, 2), (64, 1), "{single}");
        assert_eq!(blocks(2 << 10, 4), (128, 1), "{single}");
        assert_eq!(blocks(4 << 10, 2), (256, 1), "{single}");
        assert_eq!(blocks(8 << 10, 2), (64, 8), "past it, blocks of 64");
        let none = with(&[("NCCLSHIM_TUNE", "sentinel_block:0")]);
        let plan = plan_all_reduce(&none, 512, 7, 0, &procs(2)).unwrap();
        assert_eq!((plan.threads, plan.blocks), (64, 2), "0: blocks of 64");
        let most = with(&[("NCCLSHIM_TUNE", "sentinel_block:1M")]).sentinel_block(2);
        assert_eq!(
            most,
            MAX_THREADS as usize * 16,
            "one block holds 512 threads"
        );
        assert_eq!(shape(4 << 20, 2), (TwoShot, 256, 128), "{per_16_bytes}");
        let beside = "from 8 MiB, 64 blocks: calls that large run beside compute";
        assert_eq!(shape(8 << 20, 2), (TwoShot, MAX_THREADS, 64), "{beside}");
        assert_eq!(shape(16 << 20, 2), (TwoShot, MAX_THREADS, 64), "{beside}");
        let fewer = "two-shot on 4 ranks: up to 64 blocks";
        assert_eq!(shape(1 << 20, 4), (TwoShot, 256, 64), "{fewer}");
        assert_eq!(shape(16 << 20, 4), (TwoShot, MAX_THREADS, 64), "{fewer}");
    }

    /// The README's table is where the settings are said: every one the ranks agree on is there.
    #[test]
    fn settings_come_from_the_environment() {
        assert!(!with(&[("NCCLSHIM_CORE", "0")]).enabled);
        for no in ["0", "false", "No", " off "] {
            assert!(
                !with(&[("NCCLSHIM_TUNE", format!("direct:{no}").as_str())]).direct,
                "{no:?}"
            );
        }
        for yes in ["1", "true", "YES", "on", ""] {
            assert!(
                with(&[("NCCLSHIM_TUNE", format!("direct:{yes}").as_str())]).direct,
                "{yes:?}"
            );
        }
        let defaults = with(&[]);
        assert!(defaults.enabled && defaults.launch_helpers && defaults.early_launch);
        let launches = with(&[("NCCLSHIM_TUNE", "launch_helpers:0,early_launch:0")]);
        assert!(launches.enabled && !launches.launch_helpers && !launches.early_launch);
        assert!(with(&[("NCCLSHIM_TUNE", "early_launch:1")]).early_launch);
        assert!(!with(&[("NCCLSHIM_FORCE", "nccl")]).enabled);
        let forced = with(&[
            ("NCCLSHIM_CORE", "force"),
            ("NCCLSHIM_MAX_BYTES", "all_reduce:1024"),
        ]);
        assert_eq!(algorithm(&forced, 16 << 20, 2), Some(Algorithm::TwoShot));
        assert_eq!(
            algorithm(&forced, 1 << 30, 2),
            Some(Algorithm::TwoShot),
            "forced, past the staging too (in windows)"
        );
        let limits = with(&[
            ("NCCLSHIM_MAX_BYTES", "all_reduce:65536"),
            ("NCCLSHIM_TUNE", "sentinel_max:0,ll_max:0,one_shot_max:4096"),
        ]);
        assert_eq!(algorithm(&limits, 4, 2), Some(Algorithm::OneShot));
        assert_eq!(algorithm(&limits, 4096, 2), Some(Algorithm::OneShot));
        assert_eq!(algorithm(&limits, 4100, 2), Some(Algorithm::TwoShot));
        assert_eq!(algorithm(&limits, 65540, 2), None);
        let sentinel = with(&[("NCCLSHIM_TUNE", "sentinel_max:1024")]);
        assert_eq!(algorithm(&sentinel, 1024, 4), Some(Algorithm::Sentinel));
        assert_eq!(
            algorithm(&sentinel, 1028, 4),
            Some(Algorithm::LowLatency),
            "past the sentinel limit, floats go on as integers do"
        );
        let huge = with(&[
            ("NCCLSHIM_MAX_BYTES", "all_reduce:999999999999"),
            (
                "NCCLSHIM_TUNE",
                "sentinel_max:99999999,ll_max:99999999,one_shot_max:99999999",
            ),
        ]);
        assert_eq!(
            (
                huge.all_reduce_max(2, false),
                huge.sentinel_max(8),
                huge.ll_max(2),
                huge.one_shot_max(2)
            ),
            (
                999999999999,
                SENTINEL_MAX_BYTES,
                LL_MAX_BYTES,
                ONE_SHOT_LIMIT_BYTES
            )
        );
        // The other collectives' packets go as far as the inboxes hold on 2 ranks (1 MiB), as
        // far as measured on 3 - 4, and no further on any (all-reduce's keep their own limit).
        let default = with(&[]);
        assert_eq!(
            (
                default.ll_move_max(2),
                default.ll_move_max(4),
                default.ll_max(2)
            ),
            (ll_capacity(2), 256 << 10, 128 << 10)
        );
        assert_eq!(
            (1..=8).map(|n| huge.ll_move_max(n)).collect::<Vec<_>>(),
            (1..=8).map(ll_capacity).collect::<Vec<_>>()
        );
        let small = with(&[("NCCLSHIM_MAX_BYTES", "all_reduce:4K")]);
        assert_eq!(
            small.sentinel_max(2),
            4096,
            "the core's limit bounds every kernel's"
        );
        assert!(with(&[]).direct && !with(&[("NCCLSHIM_TUNE", "direct:0")]).direct);
        let waits = |v: &'static str| with(&[("NCCLSHIM_TIMEOUT", v)]).wait_limit_s;
        assert_eq!(with(&[]).wait_limit_s, DEFAULT_WAIT_LIMIT_S);
        assert_eq!(
            (waits("5"), waits("0"), waits("x")),
            (5, 0, DEFAULT_WAIT_LIMIT_S)
        );
        assert_eq!(waits("99999999999"), u32::MAX);
    }

    #[test]
    fn two_shot_grids_fit_the_gpu_at_once() {
        let s = with(&[]);
        let small_gpu = CommFacts {
            resident_blocks: 40,
            ..procs(2)
        };
        let blocks = |bytes: usize, comm: &CommFacts| {
            plan_all_reduce(&s, bytes / 4, 7, 0, comm).map(|p| (p.algorithm, p.blocks))
        };
        assert_eq!(blocks(32 << 20, &small_gpu), Some((Algorithm::TwoShot, 40)));
        assert_eq!(blocks(4 << 20, &procs(2)), Some((Algorithm::TwoShot, 128)));
        assert_eq!(blocks(32 << 20, &procs(2)), Some((Algorithm::TwoShot, 64)));
        assert_eq!(
            blocks(512 << 10, &small_gpu),
            Some((Algorithm::Sentinel, 512)),
            "other kernels need no more than their blocks' peers"
        );
        assert_eq!(blocks(16 << 20, &procs(4)), Some((Algorithm::TwoShot, 64)));
        assert_eq!(blocks(4 << 20, &procs(8)), Some((Algorithm::TwoShot, 128)));
        assert_eq!(blocks(16 << 20, &procs(8)), Some((Algorithm::TwoShot, 64)));
        let set = with(&[("NCCLSHIM_TUNE", "two_shot_blocks:32")]);
        let planned = plan_all_reduce(&set, (4 << 20) / 4, 7, 0, &procs(2)).map(|p| p.blocks);
        assert_eq!(
            planned,
            Some(32),
            "the setting overrides the measured shape"
        );
        let beyond = with(&[("NCCLSHIM_TUNE", "two_shot_blocks:100000")]);
        let planned = plan_all_reduce(&beyond, (32 << 20) / 4, 7, 0, &small_gpu).map(|p| p.blocks);
        assert_eq!(planned, Some(40), "but never past what the GPU holds");
        assert_eq!(beyond.two_shot_blocks, Some(MAX_BLOCKS));
    }

    #[test]
    fn direct_two_shot_only_for_ranks_of_one_process() {
        let plan = |s: &Settings, bytes: usize, nranks, single_process| {
            let comm = CommFacts {
                single_process,
                ..procs(nranks)
            };
            plan_all_reduce(s, bytes / 4, 7, 0, &comm).map(|p| p.algorithm)
        };
        let s = with(&[]);
        for (bytes, nranks) in [(4 << 20, 2), (1 << 20, 4), (16 << 20, 4)] {
            assert_eq!(plan(&s, bytes, nranks, true), Some(Algorithm::Direct));
            assert_eq!(plan(&s, bytes, nranks, false), Some(Algorithm::TwoShot));
        }
        assert_eq!(
            plan(&s, 64 << 10, 2, true),
            Some(Algorithm::Sentinel),
            "small messages whatever the processes"
        );
        assert_eq!(plan(&s, 1 << 20, 2, true), Some(Algorithm::OneShot));
        let staged = with(&[("NCCLSHIM_TUNE", "direct:0")]);
        assert_eq!(plan(&staged, 4 << 20, 2, true), Some(Algorithm::TwoShot));
        let farther = "direct beat NCCL to larger sizes than staged";
        assert_eq!(plan(&s, 256 << 20, 2, true), Some(Algorithm::Direct));
        assert_eq!(plan(&s, (256 << 20) + 4, 2, true), None);
        assert_eq!(plan(&s, 32 << 20, 4, true), Some(Algorithm::Direct));
        assert_eq!(plan(&s, 32 << 20, 4, false), None, "{farther}");
        assert_eq!(plan(&staged, 256 << 20, 2, true), Some(Algorithm::TwoShot));
        assert_eq!(plan(&staged, (256 << 20) + 4, 2, true), None);
    }

    /// Unset, a collective's limit is the communicator's measured one, its spans of larger calls
    /// included; set, the setting's, also where it is 0 (off) or beyond the measured one.
    #[test]
    fn measured_limits_apply_where_no_setting_gives_one() {
        let mut measured = [Limit::NONE; Collective::ALL.len()];
        measured[Collective::AllGather as usize] = Limit::up_to(128 << 10);
        measured[Collective::ReduceScatter as usize] =
            Limit::of([(0, 8 << 10), (8 << 20, 32 << 20)]);
        let comm = CommFacts {
            measured: Measured::alike(measured),
            ..procs(2)
        };
        let gathers = |s: &Settings, bytes: usize| {
            plan(s, Collective::AllGather, bytes / 2 / 4, 7, 0, -1, &comm).is_some()
        };
        let scatters = |s: &Settings, bytes: usize| {
            plan(s, Collective::ReduceScatter, bytes / 2 / 4, 7, 0, -1, &comm).is_some()
        };
        let s = with(&[]);
        assert!(s.may_take(Collective::AllGather, true));
        assert!(!s.may_take(Collective::AllGather, false));
        assert!(gathers(&s, 128 << 10) && !gathers(&s, 256 << 10));
        assert!(scatters(&s, 8 << 10) && !scatters(&s, 16 << 10));
        assert!(!scatters(&s, 4 << 20), "between the spans: NCCL's");
        assert!(scatters(&s, 8 << 20) && scatters(&s, 32 << 20));
        assert!(!scatters(&s, 64 << 20));
        assert!(
            plan(&s, Collective::Scatter, 64, 7, 0, 0, &comm).is_none(),
            "none: NCCL's"
        );
        let off = with(&[("NCCLSHIM_MAX_BYTES", "all_gather:0,reduce_scatter:0")]);
        assert!(!off.may_take(Collective::AllGather, true) && !gathers(&off, 1024));
        assert!(!scatters(&off, 8 << 20), "a setting replaces every span");
        let more = with(&[("NCCLSHIM_MAX_BYTES", "all_gather:1048576")]);
        assert!(gathers(&more, 1 << 20) && !gathers(&more, 2 << 20));
        assert_ne!(s.agreed(), off.agreed(), "unset and 0 differ between ranks");
        let core_off = with(&[("NCCLSHIM_CORE", "0")]);
        assert!(!core_off.may_take(Collective::AllGather, true));
    }

    /// A call whose buffers lie in symmetric windows races NCCL's symmetric kernels: it takes
    /// the limits measured against every kind of buffer; one in none, those of plain buffers. A
    /// setting holds for both.
    #[test]
    fn buffers_in_symmetric_windows_take_the_limits_of_any_buffers() {
        let mut any = [Limit::NONE; Collective::ALL.len()];
        any[Collective::AllGather as usize] = Limit::parse("4194304,134217728-268435456");
        let mut plain = any;
        plain[Collective::AllGather as usize] = Limit::up_to(256 << 20);
        let comm = CommFacts {
            measured: Measured { any, plain },
            ..procs(2)
        };
        let gathers = |s: &Settings, bytes: usize, buffers| {
            let (count, float) = (bytes / 2 / 4, 7);
            plan_args_lying(
                s,
                Collective::AllGather,
                count,
                float,
                0,
                -1,
                &comm,
                buffers,
            )
            .is_some()
        };
        let s = with(&[]);
        for bytes in [1 << 20, 16 << 20, 64 << 20, 256 << 20] {
            assert!(gathers(&s, bytes, Buffers::Plain), "{bytes}");
        }
        assert!(gathers(&s, 4 << 20, Buffers::InWindows));
        assert!(
            !gathers(&s, 16 << 20, Buffers::InWindows),
            "NCCL's symmetric kernels win"
        );
        assert!(gathers(&s, 128 << 20, Buffers::InWindows));
        let set = with(&[("NCCLSHIM_MAX_BYTES", "all_gather:8M")]);
        assert!(
            gathers(&set, 8 << 20, Buffers::InWindows) && !gathers(&set, 16 << 20, Buffers::Plain)
        );
    }

    #[test]
    fn small_packet_calls_of_other_collectives_run_in_one_block() {
        let shape = |s: &Settings, collective, count, nranks| {
            let p = plan(s, collective, count, 7, 0, 0, &procs(nranks)).unwrap();
            (p.blocks, p.threads)
        };
        let on = with(&[(
            "NCCLSHIM_MAX_BYTES",
            "all_gather:1M,reduce_scatter:1M,scatter:1M",
        )]);
        let one = "2 ranks, chunks up to 4 KiB: one block of a thread per 8 bytes";
        assert_eq!(shape(&on, Collective::AllGather, 2, 2), (1, 32), "{one}");
        assert_eq!(shape(&on, Collective::AllGather, 256, 2), (1, 128), "{one}");
        assert_eq!(
            shape(&on, Collective::ReduceScatter, 1024, 2),
            (1, 512),
            "{one}"
        );
        assert_eq!(shape(&on, Collective::Scatter, 1000, 2), (1, 512), "{one}");
        let past = "past 4 KiB, blocks of 128 threads as the low-latency all-reduce's";
        assert_eq!(
            shape(&on, Collective::AllGather, 1025, 2),
            (5, 128),
            "{past}"
        );
        assert_eq!(
            shape(&on, Collective::AllGather, 1024, 4),
            (4, 128),
            "4 ranks: none"
        );
        let off = with(&[
            ("NCCLSHIM_MAX_BYTES", "all_gather:1M"),
            ("NCCLSHIM_TUNE", "ll_block:0"),
        ]);
        assert_eq!(
            shape(&off, Collective::AllGather, 1024, 2),
            (4, 128),
            "0: none"
        );
        let most = with(&[("NCCLSHIM_TUNE", "ll_block:1M")]).ll_block(2);
        assert_eq!(
            most,
            MAX_THREADS as usize * 8,
            "a thread per unit, 512 at most"
        );
    }

    #[test]
    fn moves_by_sentinel_on_2_ranks() {
        let on = with(&[(
            "NCCLSHIM_MAX_BYTES",
            "all_gather:64M,broadcast:64M,gather:64M,reduce_scatter:64M",
        )]);
        let facts = procs(2);
        let planned = |collective, bytes: usize, root| {
            plan(&on, collective, bytes, 1, 0, root, &facts).unwrap()
        };
        // Packets up to `sentinel_move_from`, then sentinel stores up to what the sentinel slots
        // hold (2 MiB, past the packets' 1 MiB), in a grid of a pack per thread; then the direct
        // kernel.
        let from = on.sentinel_move_from();
        assert_eq!(from, super::super::settings::SENTINEL_MOVE_FROM_BYTES);
        let packets = planned(Collective::Broadcast, from, 0);
        assert_eq!(packets.algorithm, Algorithm::LlBroadcast);
        assert!(!moves_by_sentinel(&on, &packets, 2));
        for bytes in [ll_capacity(2) + 1, 1536 << 10, sentinel_capacity(2)] {
            let p = planned(Collective::Broadcast, bytes, 0);
            assert_eq!(p.algorithm, Algorithm::LlBroadcast, "{bytes}");
            assert!(moves_by_sentinel(&on, &p, 2), "{bytes}");
            assert_eq!(p.threads, 64);
            assert_eq!(p.blocks as usize, bytes.div_ceil(16 * 64), "{bytes}");
        }
        let past = planned(Collective::Broadcast, sentinel_capacity(2) + 1, 0);
        assert_eq!(past.algorithm, Algorithm::Broadcast);
        assert!(!moves_by_sentinel(&on, &past, 2));
        // Chunks count: a gather of 3 MiB on 2 ranks sends 1.5 MiB a pair.
        let gather = planned(Collective::Gather, 1536 << 10, 1);
        assert_eq!(gather.algorithm, Algorithm::LlGather);
        assert!(moves_by_sentinel(&on, &gather, 2));
        // Never a collective that reduces, nor more ranks than 2 (not measured).
        let scatter = planned(Collective::ReduceScatter, 1536 << 10, -1);
        assert_eq!(scatter.algorithm, Algorithm::ReduceScatter);
        let four = plan(&on, Collective::Broadcast, 512 << 10, 1, 0, 0, &procs(4)).unwrap();
        assert_eq!(four.algorithm, Algorithm::Broadcast);
        assert!(!on.moves_by_sentinel(512 << 10, 4));
        // From a setting's size on, smaller chunks too (in one block where they are small, as
        // the sentinel all-reduce's).
        let early = with(&[
            ("NCCLSHIM_MAX_BYTES", "all_gather:64M"),
            ("NCCLSHIM_TUNE", "sentinel_move_from:0"),
        ]);
        let small = plan(&early, Collective::AllGather, 100, 1, 0, -1, &facts).unwrap();
        assert_eq!(
            (small.algorithm, small.blocks, small.threads),
            (Algorithm::LlAllGather, 1, 64)
        );
        assert!(moves_by_sentinel(&early, &small, 2));
        let at = with(&[("NCCLSHIM_TUNE", "sentinel_move_from:256K")]);
        assert!(!at.moves_by_sentinel(256 << 10, 2) && at.moves_by_sentinel((256 << 10) + 1, 2));
        let (past, never) = (
            from + 1,
            with(&[
                ("NCCLSHIM_MAX_BYTES", "broadcast:64M"),
                ("NCCLSHIM_TUNE", "sentinel_move_from:2M"),
            ]),
        );
        assert!(on.moves_by_sentinel(past, 2) && !never.moves_by_sentinel(past, 2));
        let packets = plan(&never, Collective::Broadcast, past, 1, 0, 0, &facts);
        assert!(!moves_by_sentinel(&never, &packets.unwrap(), 2));
    }

    #[test]
    fn all_gather_and_reduce_scatter_only_where_set_and_within_the_staging() {
        let s = with(&[]);
        assert!(s.may_take(Collective::AllReduce, false));
        assert!(!s.may_take(Collective::AllGather, false));
        assert!(!s.may_take(Collective::ReduceScatter, false));
        assert_eq!(
            plan(&s, Collective::AllGather, 1024, 7, 0, -1, &procs(2)),
            None,
            "not measured on these GPUs: NCCL's"
        );
        let on = with(&[(
            "NCCLSHIM_MAX_BYTES",
            "all_gather:33554432,reduce_scatter:8388608",
        )]);
        assert!(on.may_take(Collective::AllGather, false));
        assert!(on.may_take(Collective::ReduceScatter, false));
        // All-gather moves bytes, whatever the type; the op plays no part.
        let gather = plan(&on, Collective::AllGather, 1000, 9, 77, -1, &procs(4)).unwrap();
        assert_eq!(
            (gather.algorithm, gather.dtype, gather.count, gather.op),
            (Algorithm::LlAllGather, DataType::Uint8, 2000, Op::Sum)
        );
        // Past the packets' limit (what the inboxes hold for that many ranks), the direct
        // kernel; on 2 ranks past the sentinel stores' (moves_by_sentinel_on_2_ranks).
        let gather = |count, nranks| {
            plan(&on, Collective::AllGather, count, 9, 0, -1, &procs(nranks))
                .unwrap()
                .algorithm
        };
        for nranks in [2, 4] {
            let most = on.ll_move_max(nranks) / 2;
            assert_eq!(gather(most, nranks), Algorithm::LlAllGather);
        }
        assert_eq!(gather(on.ll_move_max(4) / 2 + 1, 4), Algorithm::AllGather);
        assert_eq!(
            gather(sentinel_capacity(2) / 2 + 1, 2),
            Algorithm::AllGather
        );
        // Reduce-scatter keeps its type and op, as packets up to the same limit.
        let scatter = plan(&on, Collective::ReduceScatter, 1000, 9, 3, -1, &procs(4)).unwrap();
        assert_eq!(
            (scatter.algorithm, scatter.dtype, scatter.count, scatter.op),
            (Algorithm::LlReduce, DataType::Bfloat16, 1000, Op::Min)
        );
        let scatter = |count| {
            plan(&on, Collective::ReduceScatter, count, 9, 3, -1, &procs(4))
                .unwrap()
                .algorithm
        };
        assert_eq!(scatter(on.ll_move_max(4) / 2), Algorithm::LlReduce);
        assert_eq!(scatter(on.ll_move_max(4) / 2 + 1), Algorithm::ReduceScatter);
        // Reduce too, with its root (the kernel tells the two apart by it).
        let every = with(&[("NCCLSHIM_MAX_BYTES", "reduce:2M")]);
        let reduce = plan(&every, Collective::Reduce, 4096, 7, 0, 1, &procs(2)).unwrap();
        assert_eq!(
            (reduce.algorithm, reduce.dtype, reduce.count, reduce.root),
            (Algorithm::LlReduce, DataType::Float32, 4096, 1)
        );
        let past_packets = ll_capacity(2) / 4 + 1;
        let reduce = plan(&every, Collective::Reduce, past_packets, 7, 0, 1, &procs(2));
        assert_eq!(reduce.unwrap().algorithm, Algorithm::Reduce);
        // The limits count every rank's chunk.
        assert!(
            plan(
                &on,
                Collective::ReduceScatter,
                (1 << 20) / 4,
                7,
                0,
                -1,
                &procs(8)
            )
            .is_some()
        );
        assert!(
            plan(
                &on,
                Collective::ReduceScatter,
                (2 << 20) / 4,
                7,
                0,
                -1,
                &procs(8)
            )
            .is_none()
        );
        assert!(
            plan(
                &on,
                Collective::AllGather,
                (16 << 20) / 4,
                7,
                0,
                -1,
                &procs(2)
            )
            .is_some()
        );
        assert!(
            plan(
                &on,
                Collective::AllGather,
                (16 << 20) / 4 + 1,
                7,
                0,
                -1,
                &procs(2)
            )
            .is_none(),
            "past its limit"
        );
        assert_eq!(
            plan(&on, Collective::ReduceScatter, 100, 7, 9, -1, &procs(2)),
            None,
            "bad op"
        );
        assert_eq!(
            plan(&on, Collective::AllGather, 0, 7, 0, -1, &procs(2)),
            None
        );
        let big = plan(
            &on,
            Collective::AllGather,
            (8 << 20) / 4,
            7,
            0,
            -1,
            &procs(2),
        )
        .unwrap();
        assert!(big.blocks <= 128 && big.threads == MAX_THREADS);
    }

    #[test]
    fn rooted_and_exchanging_collectives_only_where_set_with_a_root_in_range() {
        let s = with(&[]);
        for collective in Collective::ALL.into_iter().skip(1) {
            assert!(
                !s.may_take(collective, false),
                "{collective:?}: none measured in use"
            );
        }
        let forced = with(&[("NCCLSHIM_CORE", "force")]);
        assert!(
            Collective::ALL
                .into_iter()
                .all(|c| forced.may_take(c, false))
        );
        let on = with(&[(
            "NCCLSHIM_MAX_BYTES",
            "broadcast:1M,reduce:1M,all_to_all:1M,gather:1M,scatter:1M",
        )]);
        // Past the packets' limit on 4 ranks (256 KiB), the reduce kernel.
        let past_packets = ll_capacity(4) / 2 + 1;
        let reduce = plan(&on, Collective::Reduce, past_packets, 9, 3, 1, &procs(4)).unwrap();
        assert_eq!(
            (
                reduce.algorithm,
                reduce.dtype,
                reduce.count,
                reduce.op,
                reduce.root
            ),
            (
                Algorithm::Reduce,
                DataType::Bfloat16,
                past_packets,
                Op::Min,
                1
            )
        );
        let broadcast = plan(&on, Collective::Broadcast, 1000, 9, 77, 3, &procs(4)).unwrap();
        assert_eq!(
            (
                broadcast.algorithm,
                broadcast.dtype,
                broadcast.count,
                broadcast.op
            ),
            (Algorithm::LlBroadcast, DataType::Uint8, 2000, Op::Sum),
            "moved as bytes; the op plays no part"
        );
        let all_to_all = plan(&on, Collective::AllToAll, 1000, 7, 0, 5, &procs(4)).unwrap();
        assert_eq!((all_to_all.count, all_to_all.root), (4000, -1), "no root");
        for root in [-1, 4] {
            assert_eq!(
                plan(&on, Collective::Scatter, 1000, 7, 0, root, &procs(4)),
                None,
                "root {root} out of range: NCCL's to report"
            );
        }
        // Sizes as nccl-tests counts them: a broadcast's buffer, every rank's chunks of a gather.
        assert!(plan(&on, Collective::Broadcast, 1 << 20, 1, 0, 0, &procs(4)).is_some());
        assert!(
            plan(
                &on,
                Collective::Broadcast,
                (1 << 20) + 1,
                1,
                0,
                0,
                &procs(4)
            )
            .is_none()
        );
        assert!(plan(&on, Collective::Gather, 1 << 18, 1, 0, 0, &procs(4)).is_some());
        assert!(plan(&on, Collective::Gather, (1 << 18) + 1, 1, 0, 0, &procs(4)).is_none());
        // Forced, past what the staging holds at once (it goes in windows), as far as the
        // kernels' offsets go.
        let big = |collective, count| plan(&forced, collective, count, 1, 0, 0, &procs(4));
        for collective in Collective::ALL.into_iter().skip(1) {
            let planned = big(collective, 1 << 30).map(|p| p.algorithm);
            assert_eq!(planned, Algorithm::of(collective), "{collective:?}");
            assert!(big(collective, usize::MAX / 2).is_none(), "{collective:?}");
        }
    }

    #[test]
    fn ranks_of_several_processes_run_direct_with_zero_copy_within_the_staged_limits() {
        let plan = |s: &Settings, bytes: usize, nranks| {
            let comm = CommFacts {
                zero_copy: true,
                ..procs(nranks)
            };
            plan_all_reduce(s, bytes / 4, 7, 0, &comm).map(|p| p.algorithm)
        };
        let s = with(&[]);
        assert_eq!(plan(&s, 4 << 20, 2), Some(Algorithm::Direct));
        assert_eq!(plan(&s, 256 << 20, 2), Some(Algorithm::Direct));
        assert_eq!(
            plan(&s, (256 << 20) + 4, 2),
            None,
            "past the sizes measured, NCCL's"
        );
        assert_eq!(plan(&s, 16 << 20, 4), Some(Algorithm::Direct));
        assert_eq!(plan(&s, 1 << 20, 2), Some(Algorithm::OneShot));
        let staged = with(&[("NCCLSHIM_TUNE", "direct:0")]);
        assert_eq!(plan(&staged, 4 << 20, 2), Some(Algorithm::TwoShot));
        assert!(!with(&[("NCCLSHIM_TUNE", "zero_copy:0")]).zero_copy);
    }
}
