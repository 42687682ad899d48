//! One communicator's core: its buffer (flags, staging, low-latency and sentinel inboxes), the peers'
//! buffers as this rank maps them, the kernels of its device; launching an all-reduce on the
//! caller's stream; releasing everything without hanging.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use super::cuda::{
    self, Cuda, CudaError, Device, DeviceBuffer, DevicePtr, GaveUp, HostControl, IpcMapping,
    OwnedStream, StreamOrder,
};
use super::fnv::Fnv;
use super::kernels::Kernels;
use super::policy::{
    self, CommFacts, FLAGS_BYTES, LL_MAX_BYTES, MAX_BATCH, MAX_FUSED, MAX_RANKS, Plan, Staging,
    ll_capacity, sentinel_capacity,
};
use super::types::{Algorithm, Collective};
use super::zero_copy::{Uses, ZeroCopy};
use crate::ffi::{ncclComm_t, ncclMax, ncclUint32};
use crate::log::{log_info, log_warn};

/// The kernels' view of every rank's buffer: `struct Peers` in device/device.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Peers {
    pub staging: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
}

impl Peers {
    /// Every rank's buffer base (as this rank maps it) to the kernels' view.
    pub fn from_bases(bases: &[DevicePtr]) -> Peers {
        let mut peers = Peers::default();
        for (r, &base) in bases.iter().enumerate() {
            peers.flags[r] = base;
            peers.staging[r] = base + FLAGS_BYTES as u64;
        }
        peers
    }
}

/// One call's buffers as every rank addresses them: `struct Views` in device/device.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Views {
    pub input: [u64; MAX_RANKS],
    pub output: [u64; MAX_RANKS],
    pub usable: i32,
    /// What the call is (`call_tag`): a peer's kernel goes direct only where every rank's call
    /// has the same, so that none writes into another rank's buffers by a count that rank did
    /// not give (ranks out of step, or calls that differ between ranks).
    pub tag: u32,
}

impl Views {
    /// The same pointers for every rank (every rank in one process).
    fn shared(input: u64, output: u64, usable: bool) -> Views {
        Views {
            input: [input; MAX_RANKS],
            output: [output; MAX_RANKS],
            usable: usable as i32,
            tag: 0,
        }
    }
}

/// What every rank's call must share for the direct path (`Views::tag`): its algorithm, type,
/// operation, count, root and grid.
fn call_tag(plan: &Plan) -> u32 {
    let hash = Fnv::new()
        .word(plan.algorithm as u64)
        .word(plan.dtype as u64)
        .word(plan.op as u64)
        .word(plan.count as u64)
        .word(plan.root as u64)
        .word(u64::from(plan.blocks) << 32 | u64::from(plan.threads))
        .finish();
    (hash ^ hash >> 32) as u32
}

/// One call as the kernels take it: `struct Call` in device/device.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct KernelCall {
    input: u64,
    output: u64,
    count: u64,
    views: Views,
    root: i32,
}

/// What a kernel takes: the communicator's side, and `ncalls` of up to N calls of kind C.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct LaunchArgs<C, const N: usize> {
    peers: Peers,
    staging: Staging,
    abort: u64,
    rank: i32,
    nranks: i32,
    ncalls: i32,
    calls: [C; N],
}

/// What every kernel but the packet kernels takes: `struct Args` in device/device.cuh.
type KernelArgs = LaunchArgs<KernelCall, MAX_BATCH>;

/// One call of a fused launch: `struct FusedCall` in device/device.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct FusedKernelCall {
    input: u64,
    output: u64,
    count: u64,
}

/// What all-reduce's packet kernels take: `struct FusedArgs` in device/device.cuh.
type FusedKernelArgs = LaunchArgs<FusedKernelCall, MAX_FUSED>;

/// One call of a packet kernel of a collective other than all-reduce: `struct PacketCall` in
/// device/device.cuh (a `KernelCall` without the views those kernels never read).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PacketKernelCall {
    input: u64,
    output: u64,
    count: u64,
    root: i32,
    /// A lone call's chunks go as sentinel stores (`policy::moves_by_sentinel`).
    sentinel: i32,
}

/// What the packet kernels of the other collectives take: `struct PacketArgs` in
/// device/device.cuh, about half of `KernelArgs` with twice its calls (a launch's cost grows with
/// its arguments).
type PacketKernelArgs = LaunchArgs<PacketKernelCall, MAX_FUSED>;

/// The calls of a fused launch through a graph of the communicator's, as its kernel takes them:
/// with the kernel and grid, all that differs between two such launches (the rest of the
/// arguments is the communicator's own).
#[derive(Clone, Copy, PartialEq)]
enum GraphCalls {
    AllReduce(i32, [FusedKernelCall; MAX_FUSED]),
    Packets(i32, [PacketKernelCall; MAX_FUSED]),
}

/// What the node of a graph of the communicator's launches, as last set.
#[derive(Clone, Copy, PartialEq)]
struct GraphNode {
    function: usize,
    blocks: u32,
    threads: u32,
    calls: GraphCalls,
}

impl GraphNode {
    fn new(function: cuda::Function, blocks: u32, threads: u32, calls: GraphCalls) -> GraphNode {
        GraphNode {
            function: function as usize,
            blocks,
            threads,
            calls,
        }
    }

    /// What `GroupsSeen` remembers a group by: its first call's buffers and count, mixed
    /// (another size or another buffer for the output is another group).
    fn key(&self) -> u64 {
        let (input, output, count) = match &self.calls {
            GraphCalls::AllReduce(_, calls) => (calls[0].input, calls[0].output, calls[0].count),
            GraphCalls::Packets(_, calls) => (calls[0].input, calls[0].output, calls[0].count),
        };
        input ^ output.rotate_left(21) ^ count.rotate_left(42)
    }
}

/// A graph of the communicator's (`CoreComm::launch_by_graph`), what its node was last set to,
/// when it was last launched (`Graphs::launches`) and whether it holds a group passing through
/// (`GroupsSeen::passing`): a launch of the same calls (a program calling a group on the same
/// buffers again) launches the graph as it is, without setting the node.
struct ByGraph {
    graph: cuda::KernelGraph,
    node: GraphNode,
    used: u64,
    passing: bool,
}

/// The communicator's graphs, at most `GRAPHS` (a training step's groups, each on its own
/// buffers, find theirs), the count of their launches, and the groups seen lately.
#[derive(Default)]
struct Graphs {
    made: Vec<ByGraph>,
    launches: u64,
    seen: GroupsSeen,
}

/// Graphs a communicator keeps (each about 112 KiB of the GPU's memory and 27 KiB of the host's
/// on H200): one made at set-up (`CoreComm::ready_graphs`), the others as groups come back.
const GRAPHS: usize = 32;

/// Of the new groups, one in `SAMPLED` is remembered longer (`GroupsSeen`).
const SAMPLED: u64 = 32;

/// Launches after which a graph not launched again may be set to another group that came
/// again (`pick_graph`).
const STALE: u64 = 8 * GRAPHS as u64;

/// Which of a communicator's graphs a launch takes (`Graphs::pick`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum GraphPick {
    /// The graph whose node holds the launch's calls: launched as it is.
    Same(usize),
    /// None holds them and fewer than `GRAPHS` are made: a new one.
    Make,
    /// None holds them: one made, its node set to them.
    Reset(usize),
}

/// The launch of a group found in no graph from which it takes a graph of its own, the ones
/// before passing through (`GroupsSeen::passing`): a graph made (6 – 27 us of the host's on
/// H200, and the GPU's time at its first launch) pays only over many launches, as a program's
/// steps repeat them, not where a group comes back a few times (nccl-tests' 20 iterations: its
/// groups of two of 32 KiB took 2.5 – 3.3 us an operation so, 2.9 – 4.3 with graphs from the
/// third).
const COME_BACK: u32 = 8;

/// The keys (`GraphNode::key`) of the last `GRAPHS` new groups, but for one in `SAMPLED` of
/// them, kept apart with the last `GRAPHS` such, each with the count of its launches; the count
/// of new groups.
#[derive(Default)]
struct GroupsSeen {
    recent: [(u64, u32); GRAPHS],
    sampled: [(u64, u32); GRAPHS],
    new: u64,
}

impl GroupsSeen {
    /// Whether the group of `node`, found in no graph, passes through: it is not among the
    /// groups remembered (and is remembered now), or this is one of its first `COME_BACK` - 1
    /// launches. Such groups (nccl-tests moving its buffers at each group) take one graph
    /// between them, set again at each, which costs the host less than setting graphs in turn
    /// (2.0 – 2.2 us a launch against 2.0 – 2.5 over eight, on H200), and make no other (112
    /// KiB of the GPU's memory each). Groups that come again take graphs of their own; the
    /// sampled ones where more groups than the graphs come between.
    fn passing(&mut self, node: &GraphNode) -> bool {
        let key = node.key();
        let mut remembered = self.recent.iter_mut().chain(self.sampled.iter_mut());
        if let Some((_, times)) = remembered.find(|(k, _)| *k == key) {
            *times = times.saturating_add(1);
            return *times < COME_BACK;
        }
        let (ring, k) = match self.new.is_multiple_of(SAMPLED) {
            true => (&mut self.sampled, self.new / SAMPLED),
            false => (&mut self.recent, self.new),
        };
        ring[(k % GRAPHS as u64) as usize] = (key, 1);
        self.new += 1;
        true
    }
}

impl Graphs {
    /// The graph launch of `node` takes, and whether it then holds a group passing through.
    fn pick(&mut self, node: &GraphNode) -> (GraphPick, bool) {
        let made = self.made.iter().map(|g| (&g.node, g.used, g.passing));
        pick_graph(made, node, self.launches, || self.seen.passing(node))
    }
}

/// `Graphs::pick` over each graph's node, last launch and whether it holds a group passing
/// through, for launch `now`, where `passing` says whether the launch's group, found in no
/// graph, is one. Such a group sets the graph holding such groups (where there is none, a new
/// one, or once `GRAPHS` are made the one launched the longest ago). Another takes a new graph
/// while fewer than `GRAPHS` are made, else the one of another group launched the longest ago
/// where that one was not launched in the last `STALE` launches. Else it passes through as
/// well: where a program's groups come back after more others than the graphs, the graphs keep
/// those they hold, instead of each being set to another group just before its own comes back.
fn pick_graph<'a>(
    made: impl ExactSizeIterator<Item = (&'a GraphNode, u64, bool)> + Clone,
    node: &GraphNode,
    now: u64,
    passing: impl FnOnce() -> bool,
) -> (GraphPick, bool) {
    if let Some(same) = made.clone().position(|(set, _, _)| set == node) {
        return (GraphPick::Same(same), false);
    }
    let passing = passing();
    let full = made.len() == GRAPHS;
    let oldest = |holding_passing: bool| {
        let chosen = made.clone().enumerate();
        let chosen = chosen.filter(|(_, (_, _, p))| *p == holding_passing);
        chosen
            .min_by_key(|(_, (_, used, _))| *used)
            .map(|(k, (_, used, _))| (k, used))
    };
    if !passing && !full {
        return (GraphPick::Make, false);
    }
    // The oldest graph of another group, looked for once: both rules below may take it.
    let kept = oldest(false);
    if let Some((k, used)) = kept.filter(|_| !passing)
        && now.saturating_sub(used) > STALE
    {
        return (GraphPick::Reset(k), false);
    }
    match oldest(true).or(kept.filter(|_| full)) {
        Some((k, _)) => (GraphPick::Reset(k), true),
        None => (GraphPick::Make, true),
    }
}

/// One call of a launch: its plan, buffers and the stream the program gave it.
#[derive(Clone, Copy)]
pub struct Launched<'a> {
    pub plan: &'a Plan,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub stream: cuda::Stream,
}

/// What the peers of a rank touch of its buffers in a direct (zero-copy) call: the bytes of its
/// input and of its output they read or write (0: none; the kernel uses that buffer only
/// locally, or not at all), and whether the direct path is allowed at all: the places where
/// ranks' chunks start in a buffer must be 16-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Touched {
    input: u64,
    output: u64,
    allowed: bool,
}

impl Touched {
    fn of(plan: &Plan, rank: usize, nranks: usize, in_place: bool) -> Touched {
        let chunk = (plan.count * plan.dtype.size()) as u64;
        // All-reduce's kernels, and the packet kernels: the peers touch a chunk of each.
        let Some(collective) = Collective::with_kernel(plan.algorithm) else {
            return Touched {
                input: chunk,
                output: chunk,
                allowed: true,
            };
        };
        let root = plan.root == rank as i32;
        let (input, output) = collective.peers_touch();
        let (mut input, mut output) = (
            input.bytes(chunk, nranks, root),
            output.bytes(chunk, nranks, root),
        );
        // In place the two are one buffer, which the peers touch as either (all-to-all in place
        // swaps chunks: a peer reads what it writes), and the kernel sees every rank in place.
        if in_place {
            input = input.max(output);
            output = input;
        }
        let places_aligned = !collective.needs_aligned_places() || chunk.is_multiple_of(16);
        Touched {
            input,
            output,
            allowed: places_aligned,
        }
    }
}

/// How a rank reaches its peers, as set-up found it.
pub struct Reach {
    /// Every rank's buffer as this rank maps it.
    pub bases: Vec<DevicePtr>,
    /// Peers' buffers mapped through CUDA IPC (ranks of other processes).
    pub opened: Vec<IpcMapping>,
    /// The other ranks' GPUs where every rank is in this process; empty otherwise.
    pub peer_devices: Vec<i32>,
    /// Where the ranks are in several processes: how they map each other's user buffers.
    pub zero_copy: Option<Arc<ZeroCopy>>,
}

/// An all-reduce under way on a core's own stream (`CoreComm::ask_about_graphs`).
pub struct GraphsAsked(());

/// What the all-reduce of `ask_about_graphs` runs on, made at its first use and kept with the
/// core: no allocation or free (which may wait for the whole GPU) between asking and answering.
struct GraphsScratch {
    stream: OwnedStream,
    mine: DeviceBuffer,
    all: DeviceBuffer,
}

pub struct CoreComm {
    pub rank: usize,
    /// A blocking communicator (see `core::group_end` for what differs).
    pub blocking: bool,
    /// What every rank agreed on at set-up, for planning calls.
    pub facts: CommFacts,
    pub device: Device,
    /// A group's small calls launched as one go through them (`launch_by_graph`), made at the
    /// first such launches; before `kernels`, so that they go before the kernels they launch
    /// may. `graph_failed`: one could not be made or launched, and none is tried again.
    graphs: Mutex<Graphs>,
    graph_failed: AtomicBool,
    kernels: Arc<Kernels>,
    peers: Peers,
    staging: Staging,
    /// This rank's own allocation: held to be freed when dropped (the kernels reach it
    /// through `peers`).
    _buffer: DeviceBuffer,
    /// Peers' allocations mapped through CUDA IPC: held only to be unmapped when dropped.
    _opened: Vec<IpcMapping>,
    /// The other ranks' GPUs where every rank is in this process (the direct kernel reads and
    /// writes their user buffers); empty otherwise.
    peer_devices: Vec<i32>,
    /// Where the ranks are in several processes: how they map each other's user buffers.
    zero_copy: Option<Arc<ZeroCopy>>,
    control: HostControl,
    /// A kernel's giving up (see `failed`) has been said.
    failure_said: AtomicBool,
    /// Calls of it did not run that peers may have launched (`withhold_buffers`): its later
    /// calls never tell peers their buffers.
    buffers_withheld: AtomicBool,
    /// Its communicator was destroyed, aborted or revoked: a group that kept this core from an
    /// earlier call looks again (group::known).
    released: AtomicBool,
    /// A kernel of it was launched into a stream capture: a CUDA graph may hold it, and with it
    /// this core's buffers, for as long as the program keeps the graph.
    captured: AtomicBool,
    graphs_scratch: OnceLock<GraphsScratch>,
    /// Streams with every SM of the GPU, for grids a green context's stream cannot hold
    /// (`launch_resident`; one for each capture open at once, and one outside them), made at
    /// their first use; and whether that was said.
    wide_streams: Mutex<Vec<OwnedStream>>,
    wide_said: AtomicBool,
    /// The calls the core took, counted where they are logged (call_line.rs).
    calls_logged: AtomicU64,
    launch_mode: cuda::LaunchMode,
    order: StreamOrder,
}

// SAFETY: the CUDA handles inside may be used from any thread; launches only read the struct.
unsafe impl Send for CoreComm {}
// SAFETY: as above.
unsafe impl Sync for CoreComm {}

/// What a rank sets up before the exchange, and what `CoreComm` is made of.
pub struct Parts {
    pub device: Device,
    pub kernels: Arc<Kernels>,
    pub buffer: DeviceBuffer,
    pub staging: Staging,
    pub control: HostControl,
    /// How its kernels are launched (setup.rs).
    pub launch_mode: cuda::LaunchMode,
    pub order: StreamOrder,
}

impl CoreComm {
    pub fn new(
        rank: usize,
        blocking: bool,
        facts: CommFacts,
        parts: Parts,
        reach: Reach,
    ) -> CoreComm {
        CoreComm {
            rank,
            blocking,
            facts,
            device: parts.device,
            graphs: Mutex::new(Graphs::default()),
            graph_failed: AtomicBool::new(false),
            kernels: parts.kernels,
            peers: Peers::from_bases(&reach.bases),
            staging: parts.staging,
            _buffer: parts.buffer,
            _opened: reach.opened,
            peer_devices: reach.peer_devices,
            zero_copy: reach.zero_copy,
            control: parts.control,
            failure_said: AtomicBool::new(false),
            buffers_withheld: AtomicBool::new(false),
            released: AtomicBool::new(false),
            captured: AtomicBool::new(false),
            graphs_scratch: OnceLock::new(),
            wide_streams: Mutex::new(Vec::new()),
            wide_said: AtomicBool::new(false),
            calls_logged: AtomicU64::new(0),
            launch_mode: parts.launch_mode,
            order: parts.order,
        }
    }

    /// The communicator is going away: no call may take this core any more.
    pub fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    pub fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Counts one more call logged as taken; the calls counted before it.
    pub fn count_call(&self) -> u64 {
        self.calls_logged.fetch_add(1, Ordering::Relaxed)
    }

    /// The calls counted so far (`count_call`).
    pub fn calls_counted(&self) -> u64 {
        self.calls_logged.load(Ordering::Relaxed)
    }

    /// Launches the call `plan` describes (of `send`, into `recv`) on the caller's stream, in
    /// this communicator's device context.
    pub fn launch(
        &self,
        plan: &Plan,
        send: *const c_void,
        recv: *mut c_void,
        stream: cuda::Stream,
    ) -> Cuda<()> {
        self.launch_batch(
            &[Launched {
                plan,
                send,
                recv,
                stream,
            }],
            stream,
        )
    }

    /// Whether calls of `plan` may share a launch (`launch_batch`): its blocks wait for each
    /// other between calls, so all of them must be on the GPU at once.
    pub fn may_batch(&self, plan: &Plan) -> bool {
        plan.blocks <= self.kernels.batch_resident_blocks
    }

    /// Launches `calls` (1 to MAX_BATCH, every plan of the same kernel and grid, each allowed by
    /// `may_batch` where there are several) as one kernel on `stream`, which runs them one after
    /// the other: a group's calls at the cost of one launch. Calls of the packet kernels (as many
    /// as `Settings::fuses_with` allows, on any streams) go to `launch_fused`.
    ///
    /// A launch that fails leaves the communicator usable, as NCCL's: where every rank's failed
    /// (the same bad stream on each), their later calls still meet. Where only some did, the
    /// others' kernels of that call meet this rank's next one, as NCCL's would: so that none of
    /// them then writes into this rank's buffers by its own count, this rank's later calls keep
    /// their buffers from the peers (`views`), which takes every rank of a call to the staged
    /// path; the wait limit ends what is left waiting.
    pub fn launch_batch(&self, calls: &[Launched], stream: cuda::Stream) -> Cuda<()> {
        let launched = self.try_launch_batch(calls, stream);
        if launched.is_err() {
            self.withhold_buffers("a call of the core could not be launched");
        }
        launched
    }

    /// Calls of this rank that its peers may have launched did not run here (`why`): from now
    /// on its calls keep their buffers from the peers (`views`), so that a peer's kernel of such
    /// a call, meeting this rank's next one, takes the staged path and never writes into this
    /// rank's buffers by its own count. Said once.
    pub fn withhold_buffers(&self, why: &str) {
        if !self.buffers_withheld.swap(true, Ordering::Relaxed) {
            log_warn!(
                "rank {}/{} on GPU {}: {why}; its later calls take the staged path, so that a peer whose kernel of that call still waits cannot write into this rank's buffers",
                self.rank,
                self.facts.nranks,
                self.device.ordinal
            );
        }
    }

    fn try_launch_batch(&self, calls: &[Launched], stream: cuda::Stream) -> Cuda<()> {
        let first = calls[0].plan;
        debug_assert!(calls.iter().all(|c| c.plan.same_launch(first)));
        let _context = self.device.enter_if_needed()?;
        // The policy plans no algorithm for a type it lacks (policy::plan).
        let function = self
            .kernels
            .get(first.algorithm, first.dtype, first.op)
            .ok_or_else(|| CudaError {
                call: "launch",
                error: format!("no {} kernel for {:?}", first.algorithm.name(), first.dtype),
            })?;
        if first.fused_bytes().is_some() {
            return self.launch_fused(function, calls, stream);
        }
        debug_assert!(calls.len() <= MAX_BATCH && calls.iter().all(|c| c.stream == stream));
        let mut args: KernelArgs = self.launch_args(calls.len());
        let mut uses: [Option<Uses>; MAX_BATCH] = [None; MAX_BATCH];
        for (k, call) in calls.iter().enumerate() {
            let (input, output) = (call.send as u64, call.recv as u64);
            let views = if call.plan.algorithm.reads_views() {
                let (views, used) = self.views(call.plan, input, output);
                uses[k] = used;
                Views {
                    tag: call_tag(call.plan),
                    ..views
                }
            } else {
                Views::default()
            };
            args.calls[k] = KernelCall {
                input,
                output,
                count: call.plan.count as u64,
                views,
                root: call.plan.root,
            };
        }
        // Its blocks wait for each other (between calls, between windows).
        let whole_grid = first.algorithm.needs_resident_grid() || calls.len() > 1;
        let (blocks, threads) = (first.blocks, first.threads);
        // SAFETY: `Args`, the kernel's one parameter.
        let launched = unsafe {
            self.launch_resident(function, blocks, threads, stream, &mut args, whole_grid)
        };
        if let Some(zero_copy) = &self.zero_copy {
            if let Ok((ended, captured)) = launched {
                let marked = (!captured).then_some(ended);
                uses.into_iter()
                    .flatten()
                    .for_each(|used| zero_copy.used(used, marked));
            }
            // What the launch's calls offered is marked, or no kernel uses it.
            zero_copy.launched();
        }
        launched.map(|_| ())
    }

    /// The communicator's side of a kernel's arguments, for `ncalls` calls (all N left empty).
    fn launch_args<C: Copy + Default, const N: usize>(&self, ncalls: usize) -> LaunchArgs<C, N> {
        LaunchArgs {
            peers: self.peers,
            staging: self.staging,
            abort: self.control.device,
            rank: self.rank as i32,
            nranks: self.facts.nranks as i32,
            ncalls: ncalls as i32,
            calls: [C::default(); N],
        }
    }

    /// The arguments of a fused launch of `calls` (at most MAX_FUSED), each call's as `call_of`
    /// makes it.
    fn fused_args<C: Copy + Default>(
        &self,
        calls: &[Launched],
        call_of: impl Fn(&Launched) -> C,
    ) -> LaunchArgs<C, MAX_FUSED> {
        let mut args = self.launch_args(calls.len());
        for (slot, call) in args.calls.iter_mut().zip(calls) {
            *slot = call_of(call);
        }
        args
    }

    /// Launches `function` on `stream` with `args` as its one parameter, in the communicator's
    /// context, after the communicator's last kernel (`StreamOrder`), noting a launch into a
    /// capture (`captured`); whether it was one. Outside a capture, through one of the
    /// communicator's graphs where `by_graph` holds the launch's calls (`launch_by_graph`).
    ///
    /// # Safety
    /// `args` is laid out as `function`'s parameter.
    unsafe fn launch_with<C, const N: usize>(
        &self,
        function: cuda::Function,
        blocks: u32,
        threads: u32,
        stream: cuda::Stream,
        args: &mut LaunchArgs<C, N>,
        by_graph: Option<GraphCalls>,
    ) -> Cuda<bool> {
        let capturing = cuda::capturing(stream);
        if capturing {
            // A graph may hold the core from now on.
            self.captured.store(true, Ordering::Relaxed);
        }
        self.order.before_launch(stream, capturing)?;
        let mut params: [*mut c_void; 1] = [(args as *mut LaunchArgs<C, N>).cast()];
        let graphed = !capturing
            && by_graph.is_some_and(|calls| {
                // SAFETY: the caller's; both launches copy the parameter.
                unsafe {
                    self.launch_by_graph(function, blocks, threads, stream, &mut params, calls)
                }
            });
        if !graphed {
            // SAFETY: as above.
            unsafe {
                cuda::launch(
                    function,
                    blocks,
                    threads,
                    stream,
                    &mut params,
                    self.launch_mode,
                )
            }?;
        }
        self.order.after_launch(stream, capturing);
        Ok(capturing)
    }

    /// Launches `function` on `stream` (not being captured) through one of the communicator's
    /// graphs (`cuda::KernelGraph`, `Graphs`; `Settings::graph_launch_max` says when); whether it
    /// did. `calls` are those `params` hold: a graph whose node was set to them, the kernel and
    /// the grid is launched as it is. `StreamOrder` orders the graphs' launches with the
    /// communicator's other launches as any. One that cannot be made or launched is said once,
    /// and the communicator's kernels are launched as others from then on; so are those of two
    /// threads launching on one communicator at once (NCCL forbids it).
    ///
    /// # Safety
    /// As for `launch_with`, with `params` its parameter.
    unsafe fn launch_by_graph(
        &self,
        function: cuda::Function,
        blocks: u32,
        threads: u32,
        stream: cuda::Stream,
        params: &mut [*mut c_void; 1],
        calls: GraphCalls,
    ) -> bool {
        if self.graph_failed.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut graphs) = self.graphs.try_lock() else {
            return false;
        };
        graphs.launches += 1;
        let now = graphs.launches;
        let node = GraphNode::new(function, blocks, threads, calls);
        let (pick, passing) = graphs.pick(&node);
        let made = &mut graphs.made;
        let launched = match pick {
            GraphPick::Same(same) => {
                made[same].used = now;
                made[same].passing = passing;
                // SAFETY: the caller's stream, not being captured (`launch_with`).
                unsafe { made[same].graph.launch(stream) }
            }
            // SAFETY: the caller's; the context is the device's (`try_launch_batch`).
            GraphPick::Make => unsafe {
                cuda::KernelGraph::new(
                    self.device,
                    function,
                    blocks,
                    threads,
                    params,
                    self.launch_mode,
                )
            }
            .and_then(|mut graph| {
                // SAFETY: as above.
                unsafe { graph.launch(stream) }?;
                made.push(ByGraph {
                    graph,
                    node,
                    used: now,
                    passing,
                });
                Ok(())
            }),
            GraphPick::Reset(taken) => {
                let taken = &mut made[taken];
                // SAFETY: the caller's.
                unsafe { taken.graph.set(function, blocks, threads, params) }.and_then(|()| {
                    taken.node = node;
                    taken.used = now;
                    taken.passing = passing;
                    // SAFETY: as above.
                    unsafe { taken.graph.launch(stream) }
                })
            }
        };
        if let Err(e) = &launched {
            self.graph_failed.store(true, Ordering::Relaxed);
            graphs.made.clear();
            log_info!(
                "core of rank {} on GPU {}: a group's small calls are launched as kernels, not through a graph ({e})",
                self.rank,
                self.device.ordinal
            );
        }
        launched.is_ok()
    }

    /// `launch_with`, for a grid that must be on the GPU at once where `whole_grid`: on a stream
    /// of a green context whose SMs cannot hold it, the kernel goes on a stream of the core's
    /// own, which has every SM of the GPU, joined with the program's (it waits for what `stream`
    /// holds, and `stream` for it; in a capture too). Its blocks would otherwise wait for blocks
    /// that never start. Where each rank launches changes nothing of the call. Returns the
    /// stream whose later work comes after the kernel, and whether it was captured.
    ///
    /// # Safety
    /// As `launch_with`.
    unsafe fn launch_resident<C, const N: usize>(
        &self,
        function: cuda::Function,
        blocks: u32,
        threads: u32,
        stream: cuda::Stream,
        args: &mut LaunchArgs<C, N>,
        whole_grid: bool,
    ) -> Cuda<(cuda::Stream, bool)> {
        let wide = match whole_grid {
            true => self.wide_stream_for(function, blocks, threads, stream)?,
            false => None,
        };
        let Some(wide) = wide else {
            // SAFETY: the caller's.
            let captured =
                unsafe { self.launch_with(function, blocks, threads, stream, args, None) }?;
            return Ok((stream, captured));
        };
        self.order.join(wide, stream)?;
        // SAFETY: the caller's.
        let launched = unsafe { self.launch_with(function, blocks, threads, wide, args, None) };
        // Joined back whatever happened: a capture that `wide` joined must end joined.
        let joined = self.wait_for_kernel(stream, wide);
        let captured = launched?;
        Ok((if joined { stream } else { wide }, captured))
    }

    /// Makes `waiter` wait for the kernel just queued on `kernel`'s stream; whether it does. The
    /// kernel is queued (the peers count on it): a stream that cannot wait for it is said, not
    /// an error of the launch.
    fn wait_for_kernel(&self, waiter: cuda::Stream, kernel: cuda::Stream) -> bool {
        let joined = self.order.join(waiter, kernel);
        if let Err(e) = &joined {
            log_warn!("a stream could not wait for the core's kernel: {e}");
        }
        joined.is_ok()
    }

    /// The core's own stream, where `stream` belongs to a green context whose SMs cannot hold
    /// `blocks` blocks of `threads` threads of `function` at once (said once).
    fn wide_stream_for(
        &self,
        function: cuda::Function,
        blocks: u32,
        threads: u32,
        stream: cuda::Stream,
    ) -> Cuda<Option<cuda::Stream>> {
        let Some(sms) = cuda::green_context_sms(stream) else {
            return Ok(None);
        };
        let holds = sms.saturating_mul(cuda::blocks_per_multiprocessor(function, threads)?);
        if blocks <= holds {
            return Ok(None);
        }
        if !self.wide_said.swap(true, Ordering::Relaxed) {
            log_info!(
                "core of rank {} on GPU {}: a call on a stream of a green context of {sms} SMs runs on all the GPU's SMs: its {blocks} blocks must run at once, and the context holds {holds}",
                self.rank,
                self.device.ordinal
            );
        }
        // One in no capture, or in this call's: a stream that joined a capture stays in it
        // until the capture ends, and can wait for nothing outside it.
        let capture = cuda::capture_id(stream);
        let mut streams = self.wide_streams.lock().unwrap_or_else(|e| e.into_inner());
        let free = (streams.iter()).find(|wide| {
            let in_capture = cuda::capture_id(wide.stream);
            in_capture.is_none() || in_capture == capture
        });
        if let Some(wide) = free {
            return Ok(Some(wide.stream));
        }
        let made = OwnedStream::create(self.device)?;
        let wide = made.stream;
        streams.push(made);
        Ok(Some(wide))
    }

    /// Launches `calls` of a packet kernel (1 to MAX_FUSED, their data within its inboxes) as one
    /// call (device.cuh, "fused launches") on `stream`, in the communicator's context. Calls on
    /// other streams are joined: the kernel waits for what their streams hold, and they for it.
    fn launch_fused(
        &self,
        function: cuda::Function,
        calls: &[Launched],
        stream: cuda::Stream,
    ) -> Cuda<()> {
        let first = calls[0].plan;
        let bytes: usize = calls.iter().filter_map(|c| c.plan.fused_bytes()).sum();
        let nranks = self.facts.nranks;
        let by_sentinel =
            calls.len() == 1 && policy::moves_by_sentinel(policy::settings(), first, nranks);
        let inbox = match first.algorithm {
            Algorithm::Sentinel => sentinel_capacity(nranks),
            Algorithm::LowLatency => LL_MAX_BYTES,
            _ if by_sentinel => sentinel_capacity(nranks),
            _ => ll_capacity(nranks),
        };
        // Past the inbox, the kernel would write into the next sender's: never launched.
        if calls.len() > MAX_FUSED || bytes > inbox {
            return Err(CudaError {
                call: "launch",
                error: format!(
                    "{} calls of {bytes} bytes do not fit one fused launch",
                    calls.len()
                ),
            });
        }
        // A group's small calls through the communicator's graphs: their host time is the
        // group's, past the kernel's (`Settings::graph_launch_max`).
        let by_graph = calls.len() > 1 && bytes <= policy::settings().graph_launch_max();
        let (blocks, threads) = match calls.len() {
            1 => (first.blocks, first.threads),
            _ => policy::fused_shape(
                policy::settings(),
                first.algorithm,
                bytes,
                self.facts.nranks,
            ),
        };
        let mut others: [Option<cuda::Stream>; MAX_FUSED] = [None; MAX_FUSED];
        for (k, call) in calls.iter().enumerate() {
            if call.stream != stream && !others[..k].contains(&Some(call.stream)) {
                others[k] = Some(call.stream);
            }
        }
        for &other in others.iter().flatten() {
            self.order.join(stream, other)?;
        }
        if first.algorithm.is_packet_kernel() {
            let mut args: PacketKernelArgs = self.fused_args(calls, |call| PacketKernelCall {
                input: call.send as u64,
                output: call.recv as u64,
                count: call.plan.count as u64,
                root: call.plan.root,
                sentinel: by_sentinel as i32,
            });
            let by_graph = by_graph.then_some(GraphCalls::Packets(args.ncalls, args.calls));
            // SAFETY: `PacketArgs`, the kernel's one parameter.
            unsafe { self.launch_with(function, blocks, threads, stream, &mut args, by_graph) }?;
        } else {
            let mut args: FusedKernelArgs = self.fused_args(calls, |call| FusedKernelCall {
                input: call.send as u64,
                output: call.recv as u64,
                count: call.plan.count as u64,
            });
            let by_graph = by_graph.then_some(GraphCalls::AllReduce(args.ncalls, args.calls));
            // SAFETY: `FusedArgs`, the kernel's one parameter.
            unsafe { self.launch_with(function, blocks, threads, stream, &mut args, by_graph) }?;
        }
        for &other in others.iter().flatten() {
            self.wait_for_kernel(other, stream);
        }
        Ok(())
    }

    /// Every rank's buffers of a call, for a kernel that reads them straight where it can: the
    /// caller's pointers for every rank where all are in this process, the peers' mappings of
    /// them otherwise (`uses`: what to mark once the kernel is queued); not usable where a peer
    /// cannot reach what it touches, or where that is not 16-aligned, or once calls of it did
    /// not run (`withhold_buffers`).
    fn views(&self, plan: &Plan, input: u64, output: u64) -> (Views, Option<Uses>) {
        if self.buffers_withheld.load(Ordering::Relaxed) {
            return (Views::shared(input, output, false), None);
        }
        let touched = Touched::of(plan, self.rank, self.facts.nranks, input == output);
        let Some(zero_copy) = &self.zero_copy else {
            // Without zero-copy, only ranks of this process can reach this rank's buffers: with
            // a rank in another process, nothing it touches is usable.
            let reachable = |pointer: u64, bytes: u64| {
                bytes == 0
                    || (self.facts.single_process
                        && pointer.is_multiple_of(16)
                        && self.reachable_by_peers(pointer, bytes))
            };
            let usable = touched.allowed
                && reachable(input, touched.input)
                && reachable(output, touched.output);
            return (Views::shared(input, output, usable), None);
        };
        let found = touched
            .allowed
            .then(|| zero_copy.addresses(input, touched.input, output, touched.output))
            .flatten();
        match found {
            Some((addresses, uses)) => (
                Views {
                    input: addresses.input,
                    output: addresses.output,
                    usable: 1,
                    tag: 0,
                },
                Some(uses),
            ),
            None => (Views::shared(input, output, false), None),
        }
    }

    /// Makes the graph groups passing through take (`GroupsSeen::passing`) and loads it on the
    /// GPU, at set-up: a communicator's first graph takes about 0.1 ms to make and launch the
    /// first time (nccl-tests' first size in groups of two: 4.6 – 5.0 us an operation, against
    /// 2.0 – 3.2 as kernel launches, on H200), which its first group would wait for. Where
    /// that fails, or the settings launch no group through a graph, the first group makes it.
    pub fn ready_graphs(&self) {
        if policy::settings().graph_launch_max() == 0 {
            return;
        }
        let Some(plan) = self.one_word_plan() else {
            return;
        };
        let function = self.kernels.get(plan.algorithm, plan.dtype, plan.op);
        // The node takes all-reduce's packet kernels' arguments (`launch_fused`).
        let Some(function) =
            function.filter(|_| plan.fused_bytes().is_some() && !plan.algorithm.is_packet_kernel())
        else {
            return;
        };
        let ready = || -> Cuda<ByGraph> {
            let _context = self.device.enter()?;
            let mut args: FusedKernelArgs = self.launch_args(0);
            let mut params: [*mut c_void; 1] = [(&mut args as *mut FusedKernelArgs).cast()];
            // SAFETY: `FusedArgs`, the kernel's one parameter, copied; the device's context
            // is current. The node is set to a group's calls before any launch.
            let graph = unsafe {
                cuda::KernelGraph::new(self.device, function, 1, 1, &mut params, self.launch_mode)
            }?;
            let stream = OwnedStream::create(self.device)?;
            // SAFETY: our stream, of the graph's context.
            unsafe { graph.upload(stream.stream) }?;
            stream.synchronize()?;
            // No calls, no grid: no group's node.
            let node = GraphNode::new(function, 0, 0, GraphCalls::AllReduce(0, args.calls));
            Ok(ByGraph {
                graph,
                node,
                used: 0,
                passing: true,
            })
        };
        if let (Ok(graph), Ok(mut graphs)) = (ready(), self.graphs.lock()) {
            graphs.made.push(graph);
        }
    }

    /// The plan of an all-reduce of one word by the defaults, not the settings (which may leave
    /// all-reduces to NCCL): the same on every rank, a low-latency kernel of one block.
    fn one_word_plan(&self) -> Option<Plan> {
        let settings = policy::Settings::defaults();
        policy::plan_all_reduce(&settings, 1, ncclUint32, ncclMax, &self.facts)
    }

    /// The graphs the communicator holds (the GPU tests).
    #[cfg(test)]
    pub fn graphs_made(&self) -> usize {
        self.graphs.lock().map_or(0, |graphs| graphs.made.len())
    }

    /// Starts finding out whether a CUDA graph may hold a kernel of this core on any rank: an
    /// all-reduce of each rank's answer (`captured`) on the core itself, on a stream of its own,
    /// after the communicator's last kernel. Every rank starts it at the same point of its calls
    /// (`core::suspend`), and may start it for several communicators before waiting for any
    /// (`graphs_answer`): nothing here waits for other work on the GPU. `None` where it could
    /// not start, or the core already gave up waiting for a peer.
    pub fn ask_about_graphs(&self) -> Option<GraphsAsked> {
        let plan = self.one_word_plan()?;
        if self.control.gave_up().is_some() {
            return None;
        }
        let ask = || -> Cuda<()> {
            let _context = self.device.enter()?;
            let scratch = self.graphs_scratch()?;
            let captured = u32::from(self.captured.load(Ordering::Relaxed));
            (scratch.stream).copy_to_device(scratch.mine.pointer, &captured.to_ne_bytes())?;
            let (send, recv) = (scratch.mine.pointer as *const c_void, scratch.all.pointer);
            self.launch(&plan, send, recv as *mut c_void, scratch.stream.stream)
        };
        match ask() {
            Ok(()) => Some(GraphsAsked(())),
            Err(_) => {
                // Every rank launches it at this point: one that did not is out of step.
                self.control.launch_failed();
                None
            }
        }
    }

    /// What `ask_about_graphs` runs on, made at its first use (in the device's context).
    fn graphs_scratch(&self) -> Cuda<&GraphsScratch> {
        if let Some(scratch) = self.graphs_scratch.get() {
            return Ok(scratch);
        }
        let made = GraphsScratch {
            stream: OwnedStream::create(self.device)?,
            mine: DeviceBuffer::alloc(self.device, 4)?,
            all: DeviceBuffer::alloc(self.device, 4)?,
        };
        Ok(self.graphs_scratch.get_or_init(|| made))
    }

    /// What `ask_about_graphs` found: whether a graph may hold a kernel of this core on any
    /// rank (`None`: the all-reduce did not run to its end, as where a peer never came).
    pub fn graphs_answer(&self, _asked: GraphsAsked) -> Option<bool> {
        let scratch = self.graphs_scratch.get()?;
        let answer = || -> Cuda<u32> {
            let _context = self.device.enter()?;
            let mut answer = [0u8; 4];
            (scratch.stream).copy_to_host(&mut answer, scratch.all.pointer)?;
            Ok(u32::from_ne_bytes(answer))
        };
        let answer = answer().ok()?;
        // A wait that gave up leaves the answer unwritten.
        (self.control.gave_up().is_none()).then_some(answer != 0)
    }

    /// As if no graph held this core's kernels (the GPU suite's test of `ask_about_graphs`).
    #[cfg(test)]
    pub fn forget_graphs(&self) {
        self.captured.store(false, Ordering::Relaxed);
    }

    /// Whether a kernel of this communicator gave up waiting for a peer (NCCLSHIM_TIMEOUT), or the
    /// all-reduce every rank runs at one point could not be launched: the ranks are out of step.
    /// Said once, in a WARN naming the communicator, this rank and the one it waited for.
    pub fn failed(&self, comm: ncclComm_t) -> bool {
        let Some(whom) = self.control.gave_up() else {
            return false;
        };
        if !self.failure_said.swap(true, Ordering::Relaxed) {
            let waited = |whom: &str| {
                format!(
                    "a call of the core waited {} s for {whom} and gave up (NCCLSHIM_TIMEOUT)",
                    policy::settings().wait_limit_s
                )
            };
            let what = match whom {
                GaveUp::Rank(peer) => waited(&format!("rank {peer}")),
                GaveUp::OwnBlocks => waited("its other blocks"),
                GaveUp::OutOfStep(peer) => format!(
                    "a call of the core found rank {peer} on a later call, a wait of its own having given up, and gave up"
                ),
                GaveUp::NotLaunched => {
                    "the core could not launch the all-reduce that asks every rank, as the core is suspended, whether CUDA graphs hold its kernels".to_string()
                }
            };
            let (why, dumped) = match whom {
                GaveUp::NotLaunched => (
                    "its peers' kernels of that all-reduce wait for it, and this rank's later calls would meet them",
                    "the core's all-reduce asking about graphs could not be launched",
                ),
                _ => (
                    "the ranks' calls on this communicator do not match (a rank skipped a call, passed other arguments, or died). Its results are wrong",
                    "a wait of the core gave up",
                ),
            };
            log_warn!(
                "comm {comm:p} rank {}/{} on GPU {}: {what}: {why}; ncclCommGetAsyncError reports ncclRemoteError and the calls its core takes fail with it: abort it",
                self.rank,
                self.facts.nranks,
                self.device.ordinal,
            );
            super::observer::observer().dump(comm, dumped);
        }
        true
    }

    /// Whether the direct kernel may read or write `bytes` at `pointer` from every GPU of this
    /// process.
    fn reachable_by_peers(&self, pointer: u64, bytes: u64) -> bool {
        self.device
            .reachable_from_peers(pointer, bytes, &self.peer_devices)
    }

    /// Frees everything once our kernels are done (the device is synchronised, on a thread of
    /// its own so that we can stop waiting). `abort` first tells waiting kernels to give up
    /// (ncclCommAbort); a plain destroy raises it only after waiting a while, and if the device
    /// still does not finish, the buffers are left allocated rather than pulled from under it
    /// (false).
    pub fn release(self, abort: bool) -> bool {
        if abort {
            self.control.raise_abort();
        }
        let device = self.device;
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let synced = device.enter().and_then(|_context| cuda::synchronize());
            let _ = done.send(synced.is_ok());
        });
        let finished = finished.recv_timeout(Duration::from_secs(10)).or_else(|_| {
            self.control.raise_abort();
            finished.recv_timeout(Duration::from_secs(10))
        });
        if finished.is_err() {
            // Kernels may still use them: the buffers, mappings and control block stay, and no
            // peer's message (a retired allocation) closes a mapping from now on.
            if let Some(zero_copy) = &self.zero_copy {
                zero_copy.stop_serving();
            }
            std::mem::forget(self);
            return false;
        }
        // Our buffer, the peers' mappings and the control block are freed as `self` drops.
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::types::{DataType, Op};

    fn node(input: u64) -> GraphNode {
        let mut calls = [FusedKernelCall::default(); MAX_FUSED];
        calls[0].input = input;
        calls[1].input = input + 64;
        GraphNode::new(
            std::ptr::without_provenance_mut(1),
            1,
            256,
            GraphCalls::AllReduce(2, calls),
        )
    }

    /// A group passes through COME_BACK - 1 times, known again by its first call's buffers and
    /// count: another size or output at the same input is another group.
    #[test]
    fn a_group_is_known_by_its_first_calls_buffers_and_count() {
        let mut seen = GroupsSeen::default();
        let with = |count: u64, output: u64| {
            let mut group = node(1 << 12);
            if let GraphCalls::AllReduce(_, calls) = &mut group.calls {
                (calls[0].count, calls[0].output) = (count, output);
            }
            group
        };
        for _ in 1..COME_BACK {
            assert!(seen.passing(&with(8, 2 << 12)));
            assert!(seen.passing(&with(64, 2 << 12)));
            assert!(seen.passing(&with(8, 1 << 12)));
        }
        assert!(!seen.passing(&with(8, 2 << 12)));
        assert!(!seen.passing(&with(64, 2 << 12)));
        assert!(!seen.passing(&with(8, 1 << 12)));
        assert!(seen.passing(&with(8, 3 << 12)));
    }

    /// A launch takes the graph set to its calls; else, for a group passing through, the graph
    /// holding such groups; else a new one while fewer than GRAPHS are made; else the one
    /// launched the longest ago if not within STALE launches, or the graph holding groups
    /// passing through.
    #[test]
    fn a_launch_takes_its_graph_else_a_new_one_else_the_oldest() {
        let now = 1000;
        let pick = |made: &[(GraphNode, u64, bool)], wanted: GraphNode, passing: bool| {
            let made = made.iter().map(|(n, used, p)| (n, *used, *p));
            pick_graph(made, &wanted, now, || passing)
        };
        let mut few: Vec<_> = (0..3).map(|k| (node(k << 12), 990 + k, false)).collect();
        assert_eq!(pick(&few, node(1 << 12), true), (GraphPick::Same(1), false));
        assert_eq!(pick(&few, node(7 << 12), true), (GraphPick::Make, true));
        assert_eq!(pick(&few, node(7 << 12), false), (GraphPick::Make, false));
        few[2].2 = true;
        assert_eq!(pick(&few, node(7 << 12), true), (GraphPick::Reset(2), true));
        assert_eq!(pick(&few, node(7 << 12), false), (GraphPick::Make, false));
        let mut full: Vec<_> = (0..GRAPHS as u64)
            .map(|k| (node(k << 12), 999 - k, false))
            .collect();
        let passes = |k| (GraphPick::Reset(k), true);
        // None holds groups passing through: the oldest, to hold them.
        assert_eq!(pick(&full, node(99 << 12), true), passes(GRAPHS - 1));
        assert_eq!(pick(&full, node(99 << 12), false), passes(GRAPHS - 1));
        full[2].1 = 950;
        assert_eq!(pick(&full, node(99 << 12), false), passes(2));
        assert_eq!(
            pick(&full, node(5 << 12), false),
            (GraphPick::Same(5), false)
        );
        // The graph holding groups passing through, unless another was not launched lately.
        full[10].2 = true;
        assert_eq!(pick(&full, node(99 << 12), true), passes(10));
        assert_eq!(pick(&full, node(99 << 12), false), passes(10));
        full[2].1 = now - STALE - 1;
        assert_eq!(pick(&full, node(99 << 12), true), passes(10));
        let reset = |k| (GraphPick::Reset(k), false);
        assert_eq!(pick(&full, node(99 << 12), false), reset(2));
        // Other calls, another count of calls, kernel or grid: not the same node.
        let mut other = node(5 << 12);
        if let GraphCalls::AllReduce(_, calls) = other.calls {
            other.calls = GraphCalls::AllReduce(1, calls);
        }
        assert_eq!(pick(&full, other, false), reset(2));
        let threads = GraphNode {
            threads: 128,
            ..node(5 << 12)
        };
        assert_eq!(pick(&full, threads, false), reset(2));
        let function = GraphNode {
            function: 2,
            ..node(5 << 12)
        };
        assert_eq!(pick(&full, function, false), reset(2));
    }

    /// A model of a communicator's graphs: each graph's node, last launch and whether it holds
    /// a group passing through.
    type ModelGraphs = Vec<(GraphNode, u64, bool)>;

    /// Launches `groups` in turn `rounds` times through a model of a communicator's graphs
    /// (what `launch_by_graph` does with `pick_graph` and `GroupsSeen`); the launches of each
    /// round that found their graph as it was.
    fn rounds_of(
        graphs: &mut Graphs,
        made: &mut ModelGraphs,
        groups: &[u64],
        rounds: usize,
    ) -> Vec<usize> {
        (0..rounds)
            .map(|_| {
                let mut found = 0;
                for &group in groups {
                    graphs.launches += 1;
                    let now = graphs.launches;
                    let wanted = node(group << 12);
                    let (pick, passing) = pick_graph(
                        made.iter().map(|(n, used, p)| (n, *used, *p)),
                        &wanted,
                        now,
                        || graphs.seen.passing(&wanted),
                    );
                    match pick {
                        GraphPick::Same(k) => {
                            made[k] = (wanted, now, passing);
                            found += 1;
                        }
                        GraphPick::Make => made.push((wanted, now, passing)),
                        GraphPick::Reset(k) => made[k] = (wanted, now, passing),
                    }
                }
                found
            })
            .collect()
    }

    /// Groups seen once take one graph between them (here made by the first, as set-up makes
    /// it) and make no other; groups that come again take graphs of their own from their
    /// COME_BACK-th round on, and keep them while groups seen once pass; groups that outnumber
    /// the graphs keep all but one, where setting the one launched the longest ago would find
    /// none; a new set of groups, no more than the graphs, takes them over once the old ones
    /// are stale.
    #[test]
    fn graphs_keep_groups_that_come_again() {
        let (mut graphs, mut made) = (Graphs::default(), Vec::new());
        let once: Vec<u64> = (1000..1000 + 8 * GRAPHS as u64).collect();
        assert_eq!(rounds_of(&mut graphs, &mut made, &once, 1), [0]);
        assert_eq!(made.len(), 1);
        // (From 1: the memory of groups seen starts as zeros, no group's key.)
        let few: Vec<u64> = (1..=GRAPHS as u64 / 2).collect();
        // Passing through until their COME_BACK-th round, when the last one finds its graph.
        let mut rounds = vec![0; COME_BACK as usize - 1];
        rounds.extend([1, few.len()]);
        assert_eq!(
            rounds_of(&mut graphs, &mut made, &few, rounds.len()),
            rounds
        );
        assert_eq!(made.len(), few.len());
        // Groups seen once in between leave them theirs.
        let others: Vec<u64> = (2000..2000 + 8 * GRAPHS as u64).collect();
        assert_eq!(rounds_of(&mut graphs, &mut made, &others, 1), [0]);
        assert_eq!(rounds_of(&mut graphs, &mut made, &few, 1), [few.len()]);
        assert_eq!(made.len(), few.len() + 1);
        let many: Vec<u64> = (100..100 + 2 * GRAPHS as u64).collect();
        let found = rounds_of(&mut graphs, &mut made, &many, 60);
        assert_eq!(found[0], 0);
        // All but the graph they pass through, once taken.
        assert!(found[30..].iter().all(|&f| f == GRAPHS - 1), "{found:?}");
        let next: Vec<u64> = (500..500 + GRAPHS as u64).collect();
        let found = rounds_of(&mut graphs, &mut made, &next, 12);
        assert_eq!((found[0], found[11]), (0, GRAPHS), "{found:?}");
    }

    fn plan(algorithm: Algorithm, count: usize, root: i32) -> Plan {
        Plan {
            algorithm,
            dtype: DataType::Uint8,
            count,
            op: Op::Sum,
            root,
            blocks: 1,
            threads: 256,
        }
    }

    /// Calls that differ in anything a peer's direct kernel goes by have different tags, so that
    /// their ranks take the staged path.
    #[test]
    fn calls_that_differ_have_different_tags() {
        let call = plan(Algorithm::Direct, 1 << 20, -1);
        let others = [
            Plan {
                count: (1 << 20) + 1,
                ..call
            },
            Plan {
                count: 1 << 18,
                ..call
            },
            Plan {
                count: (1 << 20) + (1 << 32),
                ..call
            },
            Plan { root: 0, ..call },
            Plan {
                algorithm: Algorithm::AllGather,
                ..call
            },
            Plan {
                dtype: DataType::Float32,
                ..call
            },
            Plan {
                op: Op::Max,
                ..call
            },
            Plan { blocks: 2, ..call },
            Plan {
                threads: 512,
                ..call
            },
        ];
        let mut tags: Vec<u32> = others.iter().map(call_tag).collect();
        tags.push(call_tag(&call));
        let all = tags.len();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), all, "two different calls share a tag");
    }

    /// Peers touch only what their kernels read or write: a non-root's buffers the collective
    /// ignores are never offered (NCCL lets them be anything, NULL included).
    #[test]
    fn peers_touch_only_what_the_collective_moves_through_them() {
        let touched = |algorithm, count, root, rank, in_place| {
            let t = Touched::of(&plan(algorithm, count, root), rank, 4, in_place);
            (t.input, t.output, t.allowed)
        };
        assert_eq!(touched(Algorithm::Direct, 64, -1, 0, false), (64, 64, true));
        assert_eq!(
            touched(Algorithm::AllGather, 64, -1, 0, false),
            (0, 256, true)
        );
        assert_eq!(
            touched(Algorithm::ReduceScatter, 64, -1, 0, false),
            (256, 0, true)
        );
        assert_eq!(
            touched(Algorithm::Broadcast, 64, 1, 1, false),
            (0, 64, true)
        );
        assert_eq!(
            touched(Algorithm::Broadcast, 64, 1, 0, false),
            (0, 64, true)
        );
        assert_eq!(touched(Algorithm::Reduce, 64, 2, 2, false), (64, 64, true));
        assert_eq!(touched(Algorithm::Reduce, 64, 2, 0, false), (64, 0, true));
        assert_eq!(touched(Algorithm::Gather, 64, 3, 3, false), (0, 256, true));
        assert_eq!(touched(Algorithm::Gather, 64, 3, 0, false), (0, 0, true));
        assert_eq!(touched(Algorithm::Scatter, 64, 0, 1, false), (0, 64, true));
        assert_eq!(
            touched(Algorithm::AllToAll, 64, -1, 0, false),
            (0, 256, true)
        );
        // Chunks whose places in a shared buffer are not 16-aligned.
        assert!(!touched(Algorithm::AllGather, 60, -1, 0, false).2);
        assert!(!touched(Algorithm::Gather, 60, 0, 0, false).2);
        assert!(touched(Algorithm::Broadcast, 60, 0, 0, false).2);
        assert!(touched(Algorithm::Reduce, 60, 0, 0, false).2);
        // In place, one buffer the peers touch as input and output: an all-to-all's swapped
        // chunks are read and written, a reduce-scatter's rank 0 output is its input.
        let in_place = [
            (Algorithm::AllToAll, -1, 0, 256),
            (Algorithm::ReduceScatter, -1, 0, 256),
            (Algorithm::Broadcast, 1, 1, 64),
        ];
        for (algorithm, root, rank, bytes) in in_place {
            let t = touched(algorithm, 64, root, rank, true);
            assert_eq!(t, (bytes, bytes, true), "{algorithm:?} in place");
        }
    }

    /// The struct every kernel takes, as device/device.cuh lays it out.
    #[test]
    fn kernel_args_match_the_kernels_layout() {
        assert_eq!(size_of::<Peers>(), 128);
        assert_eq!(size_of::<Views>(), 136);
        assert_eq!(size_of::<Staging>(), 48);
        assert_eq!(size_of::<KernelCall>(), 168);
        assert_eq!(std::mem::offset_of!(KernelArgs, calls), 200);
        assert_eq!(size_of::<KernelArgs>(), 200 + 168 * MAX_BATCH);
        assert_eq!(size_of::<FusedKernelCall>(), 24);
        assert_eq!(std::mem::offset_of!(FusedKernelArgs, calls), 200);
        assert_eq!(size_of::<FusedKernelArgs>(), 200 + 24 * MAX_FUSED);
        assert_eq!(size_of::<PacketKernelCall>(), 32);
        assert_eq!(std::mem::offset_of!(PacketKernelArgs, calls), 200);
        assert_eq!(size_of::<PacketKernelArgs>(), 200 + 32 * MAX_FUSED);
    }
}
