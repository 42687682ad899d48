//! The settings: `NCCLSHIM_*` variables read once, from the environment or NCCL's configuration
//! files (nccl_env.rs; `Settings::from_lookup`; what each means: variables.rs, the one place that
//! says them), and the thresholds each stands for where it is not given. Every rank of a
//! communicator must have every one of them alike (`Settings::agreed`): where one differs, the
//! core stays off for that communicator on every rank, and each says which.

use std::sync::OnceLock;

use super::fnv::Fnv;
use super::layout::{ONE_SHOT_LIMIT_BYTES, STAGING_HALF_BYTES, ll_capacity, sentinel_capacity};
use super::limits::{LL_MAX_BYTES, MAX_BLOCKS, SENTINEL_MAX_BYTES};
use super::measured::{Limit, Limits, Measured};
use super::types::Collective;
use crate::log::log_warn;

/// The sizes of a group's calls (several on one communicator) that keep the group on the core
/// where they do not fuse (`Settings::group_goes_to_nccl`), as (smallest excluded, largest
/// included). Measured before small calls fused: nccl-tests `-m 4` (four all-reduces in a
/// group) on 2 H100, per operation, the core (its calls one after the other) against NCCL (one
/// kernel for the group), eager and in CUDA graphs: 1.3 – 2.6 x NCCL's time up to 256 KiB (NCCL
/// 3.0 – 4.4 us, 1.5 – 4.2 in graphs), 0.56 – 0.66 at 512 KiB (NCCL 11 us, where it leaves its
/// low-latency protocol), 0.82 – 0.92 from 1 to 2 MiB, 1.06 – 1.17 from 4 to 16 MiB (two-shot;
/// NCCL runs the four at once).
pub const GROUP_CORE_BYTES: (usize, usize) = (384 << 10, 2 << 20);

/// How long a core kernel waits for a peer by default before it gives up: a rank that never
/// comes (it skipped a call, or died) is found, yet far longer than any peer is slow for good
/// reason (PyTorch's own collective timeout is 10 minutes).
pub const DEFAULT_WAIT_LIMIT_S: u32 = 1800;

/// Chunks past which a lone call of a collective that moves bytes goes as sentinel stores on 2
/// ranks (`Settings::sentinel_move_from`).
pub const SENTINEL_MOVE_FROM_BYTES: usize = 32 << 10;

/// Launches of a group's small calls run as one, of up to this many bytes together, go through
/// the communicator's graphs (`Settings::graph_launch_max`).
pub const GRAPH_LAUNCH_MAX_BYTES: usize = 128 << 10;

/// Calls from this size on take at most 64 blocks (`two_shot_blocks`): a collective that large
/// is the kind a program runs beside its compute.
pub const BESIDE_COMPUTE_BYTES: usize = 8 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    pub force_core: bool,
    /// `None`: by the number of ranks (see `sentinel_max`).
    pub sentinel_max_bytes: Option<usize>,
    /// Sentinel calls of up to this many bytes run in one block (`None`: see `sentinel_block`).
    pub sentinel_block_bytes: Option<usize>,
    /// `None`: by the number of ranks (see `ll_max`).
    pub ll_max_bytes: Option<usize>,
    /// The other collectives' packet calls of chunks up to this many bytes run in one block
    /// (`None`: see `ll_block`).
    pub ll_block_bytes: Option<usize>,
    /// Lone packet calls of the collectives that move bytes go as sentinel stores past chunks of
    /// this many bytes (`None`: see `sentinel_move_from`).
    pub sentinel_move_from_bytes: Option<usize>,
    /// Launches of a group's packet calls run as one, of up to this many bytes, go through a
    /// graph (`None`: see `graph_launch_max`).
    pub graph_launch_max_bytes: Option<usize>,
    /// `None`: by the number of ranks (see `one_shot_max`).
    pub one_shot_max_bytes: Option<usize>,
    /// `None`: by the number of ranks and processes (see `all_reduce_max`).
    pub all_reduce_max_bytes: Option<usize>,
    /// Two-shot straight between the users' buffers where the ranks can reach them.
    pub direct: bool,
    /// Ranks of several processes map each other's user buffers (zero_copy/).
    pub zero_copy: bool,
    /// `None`: by the number of ranks (see `two_shot_blocks`).
    pub two_shot_blocks: Option<u32>,
    /// The most blocks of any grid (`None`: each kernel's own most).
    pub max_blocks: Option<u32>,
    /// Helper threads launch a group's all-reduces on other GPUs (launcher.rs).
    pub launch_helpers: bool,
    /// A group's calls of one communicator, stream and kernel share launches, and its small
    /// all-reduces of one kernel are fused (group.rs).
    pub batch: bool,
    /// Kernels launched with programmatic stream serialization (device/device.cuh).
    pub early_launch: bool,
    /// How long a kernel waits for a peer before it gives up, in seconds (0: for ever).
    pub wait_limit_s: u32,
    /// A group's several all-reduces on one communicator that do not fuse stay the core's only
    /// where each is larger than `.0` and at most `.1` bytes (`group_goes_to_nccl`).
    pub group_core_bytes: (usize, usize),
    /// The largest call of each collective but all-reduce the core takes (`Collective::size`),
    /// by `Collective as usize`; `None`: as measured on the communicator's GPUs (measured.rs).
    pub max_bytes: [Option<usize>; Collective::ALL.len()],
}

impl Settings {
    /// Thresholds from measurements on H200 (NVLink, 18 links per GPU): docs/performance.md.
    pub fn defaults() -> Settings {
        Settings {
            enabled: true,
            force_core: false,
            sentinel_max_bytes: None,
            sentinel_block_bytes: None,
            ll_max_bytes: None,
            ll_block_bytes: None,
            sentinel_move_from_bytes: None,
            graph_launch_max_bytes: None,
            one_shot_max_bytes: None,
            all_reduce_max_bytes: None,
            direct: true,
            zero_copy: true,
            two_shot_blocks: None,
            max_blocks: None,
            launch_helpers: true,
            batch: true,
            early_launch: true,
            wait_limit_s: DEFAULT_WAIT_LIMIT_S,
            group_core_bytes: GROUP_CORE_BYTES,
            max_bytes: [None; Collective::ALL.len()],
        }
    }

    /// Whether any call of `collective` may go to the core: the one question a call asks before
    /// it looks its communicator up (every other collective's calls forward at once). An
    /// all-reduce always looks: with the core off here, this rank still meets its peers where they
    /// set up theirs (at a nonblocking communicator's first all-reduce), and says no there.
    /// `measured_in_use`: whether a communicator of this process has a measured limit for the
    /// collective (`measured::in_use`), where no setting gives one.
    pub fn may_take(&self, collective: Collective, measured_in_use: bool) -> bool {
        collective == Collective::AllReduce
            || (self.enabled
                && (self.force_core
                    || self.max_bytes[collective as usize].map_or(measured_in_use, |n| n > 0)))
    }

    /// The sizes of `collective` (not all-reduce) the core takes: up to the setting's, or else
    /// the communicator's `measured` limit.
    pub fn limit(&self, collective: Collective, measured: &Limits) -> Limit {
        self.max_bytes[collective as usize].map_or(measured[collective as usize], Limit::up_to)
    }

    /// The limits of the collectives but all-reduce for the "core on" line: "all-gather up to
    /// 131072 B, ..." where the core takes some, else that NCCL has them all; where calls whose
    /// buffers lie in symmetric windows take other limits, those too.
    pub fn limits_text(&self, measured: &Measured) -> String {
        let taken = |limits: &Limits| -> Vec<String> {
            Collective::ALL
                .into_iter()
                .skip(1)
                .filter_map(|c| match self.limit(c, limits) {
                    _ if self.force_core => Some(format!("{} (forced)", c.name())),
                    limit if limit.is_none() => None,
                    limit => Some(format!(
                        "{} {}",
                        c.name(),
                        limit.describe(|b| format!("{b} B"))
                    )),
                })
                .collect()
        };
        let (plain, windows) = (taken(&measured.plain), taken(&measured.any));
        let text = match plain.is_empty() {
            true => "other collectives: NCCL's".to_string(),
            false => format!("also {}", plain.join(", ")),
        };
        match (plain == windows, windows.is_empty()) {
            (true, _) => text,
            (false, true) => format!("{text} (in symmetric windows: NCCL's)"),
            (false, false) => format!("{text} (in symmetric windows: {})", windows.join(", ")),
        }
    }

    /// Every setting as the ranks compare them when they set a communicator up (setup.rs): the
    /// variable that sets it, and its value as a number. Destructured whole, so that a setting
    /// added to `Settings` cannot be left out: ranks that differ in any of them could route one
    /// call differently (one runs a kernel, the other calls NCCL) and wait for each other for
    /// ever, so the core stays off for a communicator whose ranks differ in any.
    pub fn agreed(&self) -> Vec<(String, u64)> {
        let Settings {
            enabled,
            force_core,
            sentinel_max_bytes,
            sentinel_block_bytes,
            ll_max_bytes,
            ll_block_bytes,
            sentinel_move_from_bytes,
            graph_launch_max_bytes,
            one_shot_max_bytes,
            all_reduce_max_bytes,
            direct,
            zero_copy,
            two_shot_blocks,
            max_blocks,
            launch_helpers,
            batch,
            early_launch,
            wait_limit_s,
            group_core_bytes,
            max_bytes,
        } = *self;
        // 0 is "not given"; any given value (the largest too) is another word.
        let given = |v: Option<usize>| v.map_or(0, |n| (n as u64).saturating_add(1));
        let mut all: Vec<(String, u64)> = [
            ("NCCLSHIM_CORE", enabled as u64),
            ("NCCLSHIM_CORE=force", force_core as u64),
            ("NCCLSHIM_TUNE (sentinel_max)", given(sentinel_max_bytes)),
            ("NCCLSHIM_TUNE (ll_max)", given(ll_max_bytes)),
            ("NCCLSHIM_TUNE (one_shot_max)", given(one_shot_max_bytes)),
            (
                "NCCLSHIM_MAX_BYTES (all_reduce)",
                given(all_reduce_max_bytes),
            ),
            ("NCCLSHIM_TUNE (direct)", direct as u64),
            ("NCCLSHIM_TUNE (zero_copy)", zero_copy as u64),
            (
                "NCCLSHIM_TUNE (two_shot_blocks)",
                given(two_shot_blocks.map(|n| n as usize)),
            ),
            ("NCCLSHIM_TUNE (launch_helpers)", launch_helpers as u64),
            ("NCCLSHIM_TUNE (batch)", batch as u64),
            ("NCCLSHIM_TUNE (early_launch)", early_launch as u64),
            ("NCCLSHIM_TIMEOUT", wait_limit_s as u64),
            (
                "NCCLSHIM_TUNE (group_core)",
                Fnv::new()
                    .word(group_core_bytes.0 as u64)
                    .word(group_core_bytes.1 as u64)
                    .finish(),
            ),
            (
                "NCCLSHIM_TUNE (sentinel_block)",
                given(sentinel_block_bytes),
            ),
            ("NCCLSHIM_TUNE (ll_block)", given(ll_block_bytes)),
            (
                "NCCLSHIM_TUNE (sentinel_move_from)",
                given(sentinel_move_from_bytes),
            ),
            (
                "NCCLSHIM_TUNE (max_blocks)",
                given(max_blocks.map(|n| n as usize)),
            ),
            (
                "NCCLSHIM_TUNE (graph_launch_max)",
                given(graph_launch_max_bytes),
            ),
        ]
        .map(|(name, value)| (name.to_string(), value))
        .into();
        for collective in Collective::ALL.into_iter().skip(1) {
            let name = format!(
                "NCCLSHIM_MAX_BYTES ({})",
                collective.variable_name().to_lowercase()
            );
            all.push((name, given(max_bytes[collective as usize])));
        }
        all
    }

    /// The largest sentinel call (or fused group of them) that runs in one block of one thread
    /// per 16 bytes, at most MAX_THREADS; larger ones run in blocks of 64 threads. On H100
    /// (nccl-tests in CUDA graphs) one block took a 2 KiB call in 2.10 us against 2.40 in two
    /// blocks on 2 ranks, 8 KiB in 2.35 against 2.43; on 4 ranks 2 KiB in 2.85 against 3.10,
    /// but 8 KiB in 3.40 against 3.23. Other numbers of ranks: not measured, so none.
    pub fn sentinel_block(&self, nranks: usize) -> usize {
        let most = super::limits::MAX_THREADS as usize * 16;
        let by_ranks = match nranks {
            2 => most,
            4 => 2 << 10,
            _ => 0,
        };
        self.sentinel_block_bytes.unwrap_or(by_ranks).min(most)
    }

    /// The sentinel kernel sends nothing but data and meets no one: on 2 and 4 H200 it was as
    /// fast as the low-latency kernel or faster at every size (0.06 - 1.1 us faster from 4 KiB),
    /// and beat one-shot up to 512 KiB, its largest (2 ranks in 0.83 of one-shot's time, 4 in
    /// 0.95). More ranks: not measured, so none.
    pub fn sentinel_max(&self, nranks: usize) -> usize {
        let by_ranks = if nranks <= 4 { SENTINEL_MAX_BYTES } else { 0 };
        let given = self.sentinel_max_bytes.unwrap_or(by_ranks);
        self.within_all_reduce_max(given.min(SENTINEL_MAX_BYTES))
    }

    /// The most bytes of a group's sentinel calls one fused launch carries: on 2 ranks what a
    /// sender's share of the sentinel inboxes holds (`sentinel_capacity`, four lone calls'). On
    /// 2 H200 (nccl-tests `-m 4`, eager) four all-reduces of 256 KiB took 0.40 of NCCL's time
    /// per operation in one launch, 0.62 in two; eight of 512 KiB 0.39 in two launches, where
    /// eight launches had sent them to NCCL. On more ranks (not measured), or where a setting
    /// gives `sentinel_max`, a lone call's most.
    pub fn sentinel_fused_max(&self, nranks: usize) -> usize {
        match (nranks, self.sentinel_max_bytes) {
            (2, None) => self.within_all_reduce_max(sentinel_capacity(2)),
            _ => self.sentinel_max(nranks),
        }
    }

    /// `bytes`, but no more than the core's largest all-reduce where a setting gives one: it
    /// bounds every all-reduce kernel's limit.
    fn within_all_reduce_max(&self, bytes: usize) -> usize {
        bytes.min(self.all_reduce_max_bytes.unwrap_or(usize::MAX))
    }

    /// Low-latency packets carry as many flag bytes as data, to every rank: worth it longer
    /// with fewer ranks (on 2 H200 it beat one-shot up to 128 KiB, on 4 only up to 32 KiB).
    pub fn ll_max(&self, nranks: usize) -> usize {
        let by_ranks = if nranks <= 2 { 128 << 10 } else { 32 << 10 };
        let given = self.ll_max_bytes.unwrap_or(by_ranks);
        self.within_all_reduce_max(given.min(LL_MAX_BYTES))
    }

    /// The largest chunk (the bytes one rank sends another) of a collective other than
    /// all-reduce sent as packets, at most what the inboxes hold for that many ranks
    /// (`ll_capacity`). The other kernels of those collectives meet their peers twice and flush
    /// their stores to them: on 2 H100 in CUDA graphs (nccl-tests, every collective) they took
    /// 7.8 - 10.1 us a call for chunks of 256 - 512 KiB, where packets took 3.0 - 4.1 us for
    /// 256 KiB and 4.3 - 6.1 us for 512 KiB (0.42 - 0.65 of NCCL at its best, against 0.93 -
    /// 1.56); on 2 H200 (nccl-tests, one process per GPU) they took 10.9 - 12.0 us for chunks of
    /// 1 MiB (broadcast and reduce of 1 MiB, gather and scatter of 2 MiB), where packets took
    /// 8.3 (the worst of every mode 0.67 - 0.83 of NCCL at its best, against 0.83 - 1.13). So
    /// on 2 ranks, all the inboxes hold (1 MiB). On 4 H200 (`-R 2 -G 20`), chunks of 64 -
    /// 256 KiB as packets took 0.42 - 0.75 of NCCL's time where the other kernels took 0.83 -
    /// 1.36, so on 3 - 4 ranks up to 256 KiB, as measured; on more, unmeasured, all-reduce's
    /// limit. The collectives' own limits (`measured`) are measured with it.
    pub fn ll_move_max(&self, nranks: usize) -> usize {
        let by_ranks = match nranks {
            ..=2 => ll_capacity(nranks),
            3..=4 => 256 << 10,
            _ => 32 << 10,
        };
        self.ll_max_bytes
            .unwrap_or(by_ranks)
            .min(ll_capacity(nranks))
    }

    /// The largest chunk of a packet call of a collective other than all-reduce that runs in
    /// one block of a thread per 8-byte unit, at most MAX_THREADS; larger ones run in blocks of
    /// 128 threads, as the low-latency all-reduce. A lone block ends its call with no count of
    /// blocks done, as the sentinel kernel's does. On 2 H100 (nccl-tests, symmetric windows, CUDA
    /// graphs) one block took chunks of 1 - 2 KiB in 0.1 - 0.25 us less than blocks of 128 in
    /// every collective, 4 KiB in the same time; a block whose threads took two units each (8 KiB)
    /// took 0.3 - 0.5 us more. Other numbers of ranks: not measured, so none.
    pub fn ll_block(&self, nranks: usize) -> usize {
        let most = super::limits::MAX_THREADS as usize * 8;
        let by_ranks = if nranks == 2 { most } else { 0 };
        self.ll_block_bytes.unwrap_or(by_ranks).min(most)
    }

    /// Whether a lone packet call of a collective that moves bytes (not reduce-scatter's or
    /// reduce's), of chunks of `chunk` bytes, goes as sentinel stores (device/packets.cu,
    /// "sentinel moves"): past `sentinel_move_from` and up to what the sentinel slots hold, on 2
    /// ranks (others not measured).
    pub fn moves_by_sentinel(&self, chunk: usize, nranks: usize) -> bool {
        nranks == 2 && chunk > self.sentinel_move_from() && chunk <= sentinel_capacity(nranks)
    }

    /// The chunks past which lone packet calls of the collectives that move bytes go as sentinel
    /// stores (`moves_by_sentinel`). On 2 H200 (nccl-tests, one process per GPU) they took
    /// chunks of 1 MiB in 5.1 – 6.2 us where packets took 7.9 – 9.5 (broadcast of 1 MiB;
    /// gather, scatter, all-gather and all-to-all of 2 MiB), chunks of 64 – 256 KiB in CUDA
    /// graphs 2.4 – 3.2 us against 2.4 – 3.8 as packets (broadcast, gather and all-gather), and
    /// chunks of 2 MiB, past the packets' inboxes, in 7.9 – 9.1 us where the kernels that meet
    /// their peers took 13.2 – 13.5.
    pub fn sentinel_move_from(&self) -> usize {
        self.sentinel_move_from_bytes
            .unwrap_or(SENTINEL_MOVE_FROM_BYTES)
    }

    /// The most bytes of a launch of two or more of a group's packet calls (a fused launch) that
    /// goes through one of the communicator's graphs rather than as a kernel launch (comm.rs,
    /// `launch_by_graph`). A graph's launch, its parameters set, takes the host about 1.2 us less
    /// (1.6 - 2.6 us against 2.5 - 3.6 on H200, tests/gpu/launch_cost.cu; launched as it is,
    /// where a group runs on the buffers it last ran on, 1.3 - 2.0) but the GPU 0.8 us more
    /// (1.37 us a launch back to back against 0.57: its kernel starts once the stream's work
    /// before it is done, where programmatic stream serialization starts the next kernel while
    /// one ends). A group's host time (each call's step, the end, the launch) is more than its
    /// kernel's on the GPU, so the saving is the group's: on 2 H200, groups of four all-reduces
    /// of 8 B and 2 KiB took 0.39 - 0.44 of NCCL's time per operation against 0.48 - 0.53 as
    /// kernel launches (`group_cost`, runs taking turns), and in nccl-tests (one process per GPU,
    /// three rounds) groups of four of 16 KiB 1.04 - 1.24 us an operation against 1.35 - 1.39,
    /// other sizes and groups of two to eight up to 64 KiB no slower. Launches of 128 KiB too:
    /// in nccl-tests (three rounds taking turns) groups of eight of 16 KiB took 0.58 - 0.60 us an
    /// operation through graphs against 0.65 - 0.69 as kernel launches, groups of two of 64 KiB
    /// 2.26 - 2.30 against 2.49 - 2.58 (two rounds), groups of four of 32 KiB 1.11 - 1.15
    /// against 1.03 - 1.38 (NCCL 2.54 - 2.66). A lone call's launch keeps the kernel launch:
    /// back-to-back lone calls are the GPU's to wait for.
    pub fn graph_launch_max(&self) -> usize {
        self.graph_launch_max_bytes
            .unwrap_or(GRAPH_LAUNCH_MAX_BYTES)
    }

    /// One-shot sends every rank's whole message to every rank: worth it longer with fewer
    /// ranks (on 2 H200 it beat two-shot up to 2 MiB, on 4 up to 512 KiB).
    pub fn one_shot_max(&self, nranks: usize) -> usize {
        let by_ranks = match nranks {
            ..=2 => 2 << 20,
            3..=4 => 512 << 10,
            _ => 256 << 10,
        };
        let given = self.one_shot_max_bytes.unwrap_or(by_ranks);
        self.within_all_reduce_max(given.min(ONE_SHOT_LIMIT_BYTES))
    }

    /// Whether two-shot runs direct, on a communicator whose ranks can (or not) reach each
    /// other's user buffers: in one process, or through zero-copy mappings.
    pub fn uses_direct(&self, buffers_reachable: bool) -> bool {
        buffers_reachable && self.direct
    }

    /// The most blocks of a two-shot grid, and of the other collectives' kernels past their
    /// packets, for a call of `bytes` (as nccl-tests counts them), measured on H200: on 4 GPUs 64
    /// blocks took 1 – 2 % less time than 128 from 1 MiB to 16 MiB (and than 48 or 96). On 2,
    /// 128 stayed faster than 96 and 64 alone; but from 8 MiB, calls of 128 blocks beside matrix
    /// products on another stream (PyTorch overlapping its collectives with compute, as DDP and
    /// FSDP do) made the steps up to 1.16 of NCCL's time, since the products waited for those
    /// SMs; with 64 blocks, 0.76 – 1.05 of NCCL's (1.05 where 128 blocks took as long), for 0.90
    /// – 1.02 of its time alone from 64 MiB (all-reduce, against 0.86 – 0.93 with 128;
    /// all-gather and reduce-scatter kept their time). More ranks: not measured, so as before,
    /// and 64 from 8 MiB.
    pub fn two_shot_blocks(&self, nranks: usize, bytes: usize) -> u32 {
        let by_size = match nranks {
            3..=4 => 64,
            _ if bytes >= BESIDE_COMPUTE_BYTES => 64,
            _ => 128,
        };
        self.two_shot_blocks.unwrap_or(by_size)
    }

    /// `most` blocks, or fewer where `max_blocks` says: every kernel takes any grid (its loops
    /// step by the grid's threads), so this leaves SMs to the work beside it.
    pub fn grid_within(&self, most: u32) -> u32 {
        self.max_blocks.map_or(most, |cap| most.min(cap))
    }

    /// The largest all-reduce the core takes: where its two-shot still beat NCCL (docs/
    /// performance.md). On 2 ranks, direct and staged alike took 0.87 - 0.92 of NCCL's time at
    /// 128 - 256 MiB, one process per GPU, on H100 and H200 (the staged one's windows no longer
    /// wait for the whole grid); 256 MiB is the largest size measured. 4 ranks: direct (ranks of
    /// one process) to 0.97 - 1.00 at 32 MiB, staged to 0.96 at 16 MiB. More ranks: as far as the
    /// staging goes in one window, as before. Ranks of several processes keep the staged limits
    /// even with zero-copy: a call whose buffers a peer has not mapped falls back to the staged
    /// path.
    pub fn all_reduce_max(&self, nranks: usize, single_process: bool) -> usize {
        let by_ranks = match (nranks, self.uses_direct(single_process)) {
            (..=2, _) => 256 << 20,
            (3..=4, true) => 32 << 20,
            _ => STAGING_HALF_BYTES,
        };
        self.all_reduce_max_bytes.unwrap_or(by_ranks)
    }

    pub(super) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Settings {
        let mut s = Settings::defaults();
        match get("NCCLSHIM_CORE").map(|v| v.trim().to_ascii_lowercase()) {
            Some(v) if v == "force" => s.force_core = true,
            Some(v) => s.enabled = switch(&v) != Some(false),
            None => {}
        }
        // NCCLSHIM_FORCE=nccl, the old name of NCCLSHIM_CORE=0, is still read: ignoring it would
        // turn on a core its user turned off.
        if get("NCCLSHIM_FORCE").is_some_and(|v| v.trim().eq_ignore_ascii_case("nccl")) {
            s.enabled = false;
        }
        if let Some(seconds) = get("NCCLSHIM_TIMEOUT").and_then(|v| v.trim().parse::<u64>().ok()) {
            s.wait_limit_s = seconds.min(u32::MAX as u64) as u32;
        }
        s.tune_all(get("NCCLSHIM_TUNE").as_deref().unwrap_or(""));
        let (limits, _) = max_bytes(get("NCCLSHIM_MAX_BYTES").as_deref().unwrap_or(""));
        for (collective, limit) in limits {
            match collective {
                Collective::AllReduce => s.all_reduce_max_bytes = Some(limit),
                other => s.max_bytes[other as usize] = Some(limit),
            }
        }
        s
    }

    /// Puts `NCCLSHIM_TUNE`'s entries (`key:value`, separated by commas) into the settings;
    /// returns those that are not a key with a value it reads, as given.
    fn tune_all(&mut self, list: &str) -> Vec<String> {
        entries(list)
            .filter(|entry| {
                let read = entry
                    .split_once(':')
                    .is_some_and(|(key, value)| self.tune(&key.trim().to_ascii_lowercase(), value));
                !read
            })
            .map(str::to_string)
            .collect()
    }

    /// Sets what `key` of `NCCLSHIM_TUNE` (variables::TUNE) stands for to `value`; false where
    /// `key` is none of its keys or `value` does not read.
    fn tune(&mut self, key: &str, value: &str) -> bool {
        fn put<T>(slot: &mut T, value: Option<T>) -> bool {
            value.map(|v| *slot = v).is_some()
        }
        let bytes = || size(value).map(Some);
        let blocks = || {
            (value.trim().parse::<usize>().ok())
                .map(|n| Some(n.clamp(1, MAX_BLOCKS as usize) as u32))
        };
        match key {
            "sentinel_max" => put(&mut self.sentinel_max_bytes, bytes()),
            "sentinel_block" => put(&mut self.sentinel_block_bytes, bytes()),
            "ll_max" => put(&mut self.ll_max_bytes, bytes()),
            "ll_block" => put(&mut self.ll_block_bytes, bytes()),
            "sentinel_move_from" => put(&mut self.sentinel_move_from_bytes, bytes()),
            "graph_launch_max" => put(&mut self.graph_launch_max_bytes, bytes()),
            "one_shot_max" => put(&mut self.one_shot_max_bytes, bytes()),
            "two_shot_blocks" => put(&mut self.two_shot_blocks, blocks()),
            "max_blocks" => put(&mut self.max_blocks, blocks()),
            "direct" => put(&mut self.direct, switch(value)),
            "zero_copy" => put(&mut self.zero_copy, switch(value)),
            "group_core" => put(
                &mut self.group_core_bytes,
                (value.split_once('-')).and_then(|(lo, hi)| Some((size(lo)?, size(hi)?))),
            ),
            "batch" => put(&mut self.batch, switch(value)),
            "launch_helpers" => put(&mut self.launch_helpers, switch(value)),
            "early_launch" => put(&mut self.early_launch, switch(value)),
            _ => false,
        }
    }
}

#[cfg(test)]
impl Settings {
    /// The settings of an environment holding just `vars` (tests).
    pub fn from_vars(vars: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }
}

/// A size in bytes: a number, with `K`, `M` or `G` (or `KiB`, `MiB`, `GiB`; any case) for
/// 2^10, 2^20, 2^30 bytes; at most 2^62.
pub fn size(value: &str) -> Option<usize> {
    let value = value.trim().to_ascii_lowercase();
    let value = match value.strip_suffix("ib") {
        Some(unit) if unit.ends_with(['k', 'm', 'g']) => unit,
        _ => &value,
    };
    let (digits, shift) = match value.as_bytes().last()? {
        b'k' => (&value[..value.len() - 1], 10),
        b'm' => (&value[..value.len() - 1], 20),
        b'g' => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    digits
        .trim()
        .parse::<usize>()
        .ok()?
        .checked_mul(1 << shift)
        .filter(|&bytes| bytes <= 1 << 62)
}

/// The entries of a list variable (`NCCLSHIM_MAX_BYTES`, `NCCLSHIM_TUNE`): separated by commas,
/// trimmed, none empty.
fn entries(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty())
}

/// `NCCLSHIM_MAX_BYTES`: `collective:size` entries separated by commas (`all_gather:128K,
/// reduce:0`), a collective named as in its table (`all_reduce`, `all_gather`, `reduce_scatter`,
/// `broadcast`, `reduce`, `all_to_all`, `gather`, `scatter`). The limits read, and the entries
/// that are not one.
pub fn max_bytes(list: &str) -> (Vec<(Collective, usize)>, Vec<String>) {
    let mut limits = Vec::new();
    let mut unread = Vec::new();
    for entry in entries(list) {
        let read = entry.split_once(':').and_then(|(name, limit)| {
            let collective = Collective::ALL
                .into_iter()
                .find(|c| c.variable_name().eq_ignore_ascii_case(name.trim()))?;
            Some((collective, size(limit)?))
        });
        match read {
            Some(limit) => limits.push(limit),
            None => unread.push(entry.to_string()),
        }
    }
    (limits, unread)
}

/// The variables of earlier releases that became `NCCLSHIM_TUNE`'s keys.
const NOW_TUNE_KEYS: [(&str, &str); 10] = [
    ("NCCLSHIM_SENTINEL_MAX_BYTES", "sentinel_max"),
    ("NCCLSHIM_LL_MAX_BYTES", "ll_max"),
    ("NCCLSHIM_ONE_SHOT_MAX_BYTES", "one_shot_max"),
    ("NCCLSHIM_TWO_SHOT_BLOCKS", "two_shot_blocks"),
    ("NCCLSHIM_DIRECT", "direct"),
    ("NCCLSHIM_ZERO_COPY", "zero_copy"),
    ("NCCLSHIM_GROUP_CORE_BYTES", "group_core"),
    ("NCCLSHIM_BATCH", "batch"),
    ("NCCLSHIM_LAUNCH_HELPERS", "launch_helpers"),
    ("NCCLSHIM_EARLY_LAUNCH", "early_launch"),
];

/// The setting that replaced `name`, a variable of an earlier release, given as `value`: e.g.
/// `NCCLSHIM_TUNE=direct:0` for `NCCLSHIM_DIRECT` given as `0`. `None`: a variable of now.
pub fn replaced(name: &str, value: &str) -> Option<String> {
    let value = value.trim();
    if let Some((_, key)) = NOW_TUNE_KEYS.iter().find(|(old, _)| *old == name) {
        return Some(format!("NCCLSHIM_TUNE={key}:{value}"));
    }
    if name == "NCCLSHIM_FORCE" {
        return Some(match value.eq_ignore_ascii_case("nccl") {
            true => "NCCLSHIM_CORE=0".into(),
            false => "NCCLSHIM_CORE=force".into(),
        });
    }
    // Each collective's limit had a variable of its own before NCCLSHIM_MAX_BYTES.
    let collective = name.strip_prefix("NCCLSHIM_")?.strip_suffix("_MAX_BYTES")?;
    Collective::ALL
        .into_iter()
        .find(|c| c.variable_name() == collective)
        .map(|_| format!("NCCLSHIM_MAX_BYTES={}:{value}", collective.to_lowercase()))
}

/// What the settings' variables say that is not read as given: each a WARN line's text.
pub fn problems(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let old_names = (NOW_TUNE_KEYS.iter().map(|(old, _)| old.to_string()))
        .chain(["NCCLSHIM_FORCE".to_string()])
        .chain(
            (Collective::ALL.iter()).map(|c| format!("NCCLSHIM_{}_MAX_BYTES", c.variable_name())),
        );
    let mut found: Vec<String> = old_names
        .filter_map(|name| {
            let value = get(&name)?;
            let instead = replaced(&name, &value)?;
            // Still read, as it asks for less of the core than ignoring it would: NCCL's alone.
            Some(match instead == "NCCLSHIM_CORE=0" {
                true => format!(
                    "{name}={} is the old name of {instead}: set that instead",
                    value.trim()
                ),
                false => format!("{name} is no longer read: set {instead} instead"),
            })
        })
        .collect();
    let (_, unread) = max_bytes(get("NCCLSHIM_MAX_BYTES").as_deref().unwrap_or(""));
    found.extend(unread.into_iter().map(|entry| {
        format!("NCCLSHIM_MAX_BYTES: \"{entry}\" is not COLLECTIVE:SIZE (such as all_gather:128K); ignored")
    }));
    let unread = Settings::defaults().tune_all(get("NCCLSHIM_TUNE").as_deref().unwrap_or(""));
    found.extend(unread.into_iter().map(|entry| {
        format!("NCCLSHIM_TUNE: \"{entry}\" is not KEY:VALUE of a key it has (such as direct:0); ignored")
    }));
    found
}

/// A yes-or-no setting's value, read alike for every variable: `0`, `false`, `no` and `off` (in
/// any case) say no, any other value yes; an empty one is not given.
pub fn switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" => None,
        "0" | "false" | "no" | "off" => Some(false),
        _ => Some(true),
    }
}

pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        let get = crate::nccl_env::get;
        for problem in problems(get) {
            log_warn!("{problem}");
        }
        Settings::from_lookup(get)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Settings {
        Settings::from_vars(vars)
    }

    /// Each agreed setting changes with its variable, and no other does; every variable the
    /// settings read is one of them: a setting added later is agreed on or fails here.
    #[test]
    fn every_setting_is_agreed_on_and_named() {
        let defaults = Settings::defaults().agreed();
        let read = std::cell::RefCell::new(Vec::<String>::new());
        Settings::from_lookup(|name| {
            read.borrow_mut().push(name.to_string());
            None
        });
        let variable = |entry: &str| entry.split(' ').next().unwrap().to_string();
        // "NCCLSHIM_TUNE (direct)": that key's entry of the list.
        let key_of = |entry: &str| {
            let inner = entry.split_once(" (")?.1;
            inner.strip_suffix(')').map(str::to_string)
        };
        for name in read.borrow().iter() {
            assert!(
                defaults
                    .iter()
                    .any(|(entry, _)| variable(entry).starts_with(name.as_str()))
                    || replaced(name, "").is_some(),
                "{name} is read but not agreed on"
            );
        }
        let anything = ["0", "1", "3", "12345", "1-2"].map(String::from).to_vec();
        for (i, (entry, value)) in defaults.iter().enumerate() {
            let given = variable(entry);
            let (var, values) = match (given.split_once('='), key_of(entry)) {
                (Some((var, value)), _) => (var.to_string(), vec![value.to_string()]),
                (None, Some(key)) => (
                    given,
                    anything.iter().map(|v| format!("{key}:{v}")).collect(),
                ),
                (None, None) => (given, anything.clone()),
            };
            let changed = values.iter().find_map(|v| {
                let other = with(&[(var.as_str(), v.as_str())]).agreed();
                (other[i].1 != *value).then_some(other)
            });
            let other = changed.unwrap_or_else(|| panic!("no value of {var} changes {entry}"));
            for (j, ((e, a), (_, b))) in defaults.iter().zip(&other).enumerate() {
                assert!(j == i || a == b, "{var} also changed {e}");
            }
        }
    }

    /// Every setting has its row in variables.rs (which the README's tables are written from),
    /// a key of NCCLSHIM_TUNE its own row, and every such row is a key the settings read.
    #[test]
    fn every_setting_has_its_row() {
        use crate::variables::{CORE, TUNE};
        for (name, _) in Settings::defaults().agreed() {
            let variable = name.split([' ', '=']).next().unwrap();
            let row = (CORE.iter().find(|row| row.name == variable))
                .unwrap_or_else(|| panic!("no row for {variable}"));
            let Some(key) = name.split_once(" (").map(|(_, k)| k.trim_end_matches(')')) else {
                continue;
            };
            match variable {
                // A collective's entry of NCCLSHIM_MAX_BYTES: its row names the collective.
                "NCCLSHIM_MAX_BYTES" => {
                    assert!(row.meaning.contains(&format!("`{key}`")), "{name}")
                }
                _ => assert!(TUNE.iter().any(|row| row.name == key), "no row for {name}"),
            }
        }
        for row in TUNE {
            let read = ["0", "1", "1-2"]
                .iter()
                .any(|v| Settings::defaults().tune(row.name, v));
            assert!(read, "NCCLSHIM_TUNE's {} is not read", row.name);
        }
    }

    /// A limit given, however large, never reads as one not given: ranks that differ so must
    /// not pass as alike.
    #[test]
    fn the_largest_limit_is_not_no_limit() {
        let unset = Settings::defaults().agreed();
        let mut huge = Settings::defaults();
        huge.max_bytes[Collective::AllGather as usize] = Some(usize::MAX);
        huge.all_reduce_max_bytes = Some(usize::MAX);
        let huge = huge.agreed();
        let differ = unset.iter().zip(&huge).filter(|(a, b)| a.1 != b.1).count();
        assert_eq!(differ, 2);
    }

    #[test]
    fn sizes_read_with_or_without_a_unit() {
        assert_eq!(size("4096"), Some(4096));
        assert_eq!(size(" 128K "), Some(128 << 10));
        assert_eq!(size("8m"), Some(8 << 20));
        assert_eq!(size("2GiB"), Some(2 << 30));
        assert_eq!(size("1 MiB"), Some(1 << 20));
        assert_eq!(size("0"), Some(0));
        for bad in ["", "K", "-1", "1.5M", "12T", "lots"] {
            assert_eq!(size(bad), None, "{bad:?}");
        }
        assert_eq!(size("99999999999G"), None, "overflows");
        assert_eq!(size("5ib"), None, "a unit's tail alone");
        assert_eq!(size(&(1usize << 62).to_string()), Some(1 << 62));
        assert_eq!(size(&((1usize << 62) + 1).to_string()), None);
    }

    #[test]
    fn one_variable_holds_every_collectives_limit() {
        let s = with(&[(
            "NCCLSHIM_MAX_BYTES",
            "all_gather:128K, REDUCE:0,all_reduce:64M,,scatter:1M",
        )]);
        assert_eq!(s.max_bytes[Collective::AllGather as usize], Some(128 << 10));
        assert_eq!(s.max_bytes[Collective::Reduce as usize], Some(0));
        assert_eq!(s.max_bytes[Collective::Scatter as usize], Some(1 << 20));
        assert_eq!(s.max_bytes[Collective::Gather as usize], None, "not given");
        assert_eq!(s.all_reduce_max_bytes, Some(64 << 20));
        let (read, unread) = max_bytes("gather:1K,bogus:4,gather,all_gather:many");
        assert_eq!(read, vec![(Collective::Gather, 1024)]);
        assert_eq!(unread, ["bogus:4", "gather", "all_gather:many"]);
    }

    #[test]
    fn variables_no_longer_read_and_entries_not_read_are_named() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(problems(env(&[])).is_empty());
        let old_off = problems(env(&[("NCCLSHIM_FORCE", " NCCL ")]));
        assert!(
            old_off[0].contains("old name of NCCLSHIM_CORE=0"),
            "{old_off:?}"
        );
        let old_force = problems(env(&[("NCCLSHIM_FORCE", "core")]));
        assert!(
            old_force[0].contains("set NCCLSHIM_CORE=force"),
            "{old_force:?}"
        );
        let old_tune = problems(env(&[("NCCLSHIM_DIRECT", " 0")]));
        assert!(
            old_tune[0].contains("set NCCLSHIM_TUNE=direct:0 instead"),
            "{old_tune:?}"
        );
        let tune = problems(env(&[(
            "NCCLSHIM_TUNE",
            "direct:0,direct,shiny:1,ll_max:lots",
        )]));
        assert_eq!(tune.len(), 3, "{tune:?}");
        assert!(tune[0].contains("\"direct\"") && tune[2].contains("\"ll_max:lots\""));
        let found = problems(env(&[
            ("NCCLSHIM_ALL_GATHER_MAX_BYTES", "1024"),
            ("NCCLSHIM_MAX_BYTES", "all_gather:1K,allgather:2K"),
        ]));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("set NCCLSHIM_MAX_BYTES=all_gather:1024 instead"));
        assert!(found[1].contains("\"allgather:2K\""));
        let old = with(&[
            ("NCCLSHIM_ALL_GATHER_MAX_BYTES", "1024"),
            ("NCCLSHIM_DIRECT", "0"),
            ("NCCLSHIM_FORCE", "core"),
        ]);
        assert_eq!(old, Settings::defaults(), "an old variable changes nothing");
        assert!(
            !with(&[("NCCLSHIM_FORCE", "nccl")]).enabled,
            "but the old off"
        );
    }

    #[test]
    fn one_variable_holds_every_tuning_switch() {
        let s = with(&[(
            "NCCLSHIM_TUNE",
            " direct:0 , ZERO_COPY:off,sentinel_max:0,ll_max:64K,one_shot_max:1M,two_shot_blocks:999,\
             group_core:0-0,batch:no,launch_helpers:false,early_launch:0,graph_launch_max:0",
        )]);
        assert!(!s.direct && !s.zero_copy && !s.batch && !s.launch_helpers && !s.early_launch);
        assert_eq!(s.graph_launch_max(), 0);
        assert_eq!(
            with(&[]).graph_launch_max(),
            128 << 10,
            "128 KiB by default"
        );
        let on = with(&[("NCCLSHIM_TUNE", "graph_launch_max:1M")]);
        assert_eq!(on.graph_launch_max(), 1 << 20);
        assert_eq!(s.sentinel_max_bytes, Some(0));
        assert_eq!(s.ll_max_bytes, Some(64 << 10));
        assert_eq!(s.one_shot_max_bytes, Some(1 << 20));
        assert_eq!(s.two_shot_blocks, Some(MAX_BLOCKS), "clamped");
        assert_eq!(s.group_core_bytes, (0, 0));
        assert!(s.enabled && !s.force_core);
        assert!(with(&[("NCCLSHIM_CORE", " Force")]).force_core);
        assert!(!with(&[("NCCLSHIM_CORE", "off")]).enabled);
        assert!(with(&[("NCCLSHIM_CORE", "")]).enabled, "empty: not given");
    }

    /// The "core on" line names the limits of plain buffers, and those of symmetric windows
    /// where they differ.
    #[test]
    fn the_limits_line_names_the_windows_limits_where_they_differ() {
        let mut any = [Limit::NONE; Collective::ALL.len()];
        any[Collective::Gather as usize] = Limit::up_to(1024);
        let mut plain = any;
        let s = with(&[]);
        assert_eq!(
            s.limits_text(&Measured { any, plain }),
            "also gather up to 1024 B"
        );
        plain[Collective::AllGather as usize] = Limit::up_to(2048);
        assert_eq!(
            s.limits_text(&Measured { any, plain }),
            "also all-gather up to 2048 B, gather up to 1024 B (in symmetric windows: gather up to 1024 B)"
        );
        assert_eq!(
            s.limits_text(&Measured {
                any: [Limit::NONE; Collective::ALL.len()],
                plain
            }),
            "also all-gather up to 2048 B, gather up to 1024 B (in symmetric windows: NCCL's)"
        );
        assert_eq!(s.limits_text(&Measured::NONE), "other collectives: NCCL's");
    }
}
