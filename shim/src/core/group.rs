//! NCCL's groups as the core sees them, per thread: communicators created inside a group (split
//! and shrunk children included, whose handles NCCL writes only there), and nonblocking ones
//! whose first all-reduce is in it (table.rs), are set up at the outermost ncclGroupEnd
//! (once the real NCCL has initialised them), and core calls issued inside a
//! group are launched there, on every rank on the same side of the real NCCL's own operations
//! (NCCL promises no order inside a group; see `core::group_end`), unless NCCL runs the group's
//! calls of a communicator faster: then they join NCCL's group (`add`).
//!
//! NCCL's own group opens only when a call of the group goes to it (`open_real`): one whose
//! calls all go to the core never reaches NCCL, whose ncclGroupEnd keeps about 176 bytes of
//! every group that held nothing (NCCL 2.28.9; 7.1 GiB over 43 million groups, NCCL alone).

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::comm::{CoreComm, Launched};
use super::cuda::{Cuda, CudaError, PER_THREAD_STREAM, Stream, capturing};
use super::launcher::DeviceOp;
use super::policy::{self, Fused, MAX_BATCH, MAX_FUSED, Plan};
use super::types::Collective;
use super::{launcher, lifecycle, setup};
use crate::call::Call;
use crate::ffi::{
    ncclComm_t, ncclInProgress, ncclInternalError, ncclInvalidUsage, ncclResult_t, ncclSuccess,
    ncclUnhandledCudaError,
};
use crate::log::log_warn;

/// A call queued for the core in a group, with its plan.
pub struct Queued {
    pub call: Call,
    pub core: GroupCore,
    pub plan: Plan,
    /// The call as the real NCCL's, should its group's calls go there (`add`): `None` where
    /// `call` holds every argument of it (`real::forward_described`), so that a queued call
    /// allocates nothing.
    pub forward: Option<Box<dyn FnOnce() -> ncclResult_t>>,
    /// Whether `stream` was being captured into a CUDA graph when the call was made: asked only
    /// where another call of the communicator in the group comes on another stream (`queue_in`).
    pub captured: Option<bool>,
}

impl Queued {
    fn stream(&self) -> Stream {
        self.call.stream as Stream
    }
}

/// A communicator's core as a call has it: looked up by the call (`Owned`: outside a group, or
/// the group's first of the communicator), or held by the thread's group (`Held`: its later
/// ones); the group holds the core of every call it weighs (`add`).
pub enum CoreOf {
    Owned(Arc<CoreComm>),
    Held(GroupCore),
}

impl std::ops::Deref for CoreOf {
    type Target = CoreComm;

    fn deref(&self) -> &CoreComm {
        match self {
            CoreOf::Owned(core) => core,
            CoreOf::Held(core) => core,
        }
    }
}

/// A core that the thread's group holds (`ThreadGroup::cores`) from its communicator's first call
/// in the group the core would take until the group has ended and its queue is empty: its calls
/// take no reference of their own (an atomic increment and decrement a call, each of which waits
/// for the thread's earlier stores: 2.8 % of the host's time in eager groups of eight).
#[derive(Clone, Copy)]
pub struct GroupCore(std::ptr::NonNull<CoreComm>);

impl GroupCore {
    /// `core`, which the group holds (`ThreadGroup::hold`).
    fn of(core: &Arc<CoreComm>) -> GroupCore {
        GroupCore(std::ptr::NonNull::from(&**core))
    }
}

impl std::ops::Deref for GroupCore {
    type Target = CoreComm;

    fn deref(&self) -> &CoreComm {
        // SAFETY: made only of a core the group holds (`of`), and handed only to the calls of
        // the group and its queue, none of which outlives that hold (`ThreadGroup::cores`).
        unsafe { self.0.as_ref() }
    }
}

/// Queued calls launched together (`CoreComm::launch_batch`): consecutive calls of one device
/// in the group, on one communicator, of one kernel: on one stream and of one grid, or fused
/// (`joins`).
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    calls: &'a [Queued],
}

impl<'a> DeviceOp for Batch<'a> {
    fn ordinal(&self) -> i32 {
        self.calls[0].device()
    }

    fn comm(&self) -> usize {
        OnDevice::comm(&self.calls[0])
    }

    fn launch(&self) -> Cuda<()> {
        let launched_of = |queued: &'a Queued| Launched {
            plan: &queued.plan,
            send: queued.call.send,
            recv: queued.call.recv,
            stream: queued.stream(),
        };
        let first = &self.calls[0];
        // On the stack: `joins` lets a batch hold at most MAX_FUSED calls, and no launch takes
        // more (`CoreComm::launch_fused`).
        let mut on_stack = [launched_of(first); MAX_FUSED];
        let n = self.calls.len();
        let Some(launched) = on_stack.get_mut(..n) else {
            return Err(CudaError {
                call: "launch",
                error: format!("{n} calls do not fit one launch"),
            });
        };
        for (slot, queued) in launched.iter_mut().zip(self.calls) {
            *slot = launched_of(queued);
        }
        first.core.launch_batch(launched, first.stream())?;
        if self.calls.len() > 1 {
            super::observer::observer().shared_launch(first.call.comm, self.calls.len());
        }
        Ok(())
    }

    fn callers_thread_only(&self) -> bool {
        (self.calls.iter()).any(|queued| queued.stream() == PER_THREAD_STREAM)
    }

    fn prepare_thread(&self) -> impl FnOnce() + Send + 'static {
        let device = self.calls[0].core.device;
        // The helper's own context is the device's: its launches need no switch.
        move || {
            let _ = device.make_current();
        }
    }
}

/// Whether `call` may join `batch`, the last batch of its device so far. Calls of a kernel that
/// fuses them (device.cuh, "fused launches") join while `Settings::fuses_with` allows, from
/// their plans alone, whatever their streams (`CoreComm::launch_fused` joins those), as
/// `Settings::fused_with` counted them in `add`; the others only on one stream and grid.
fn joins(batch: &[Queued], call: &Queued) -> bool {
    let first = &batch[0];
    if first.comm() != call.comm() {
        return false;
    }
    if first.plan.fused_bytes().is_some() {
        let bytes = batch.iter().filter_map(|q| q.plan.fused_bytes()).sum();
        let facts = &first.core.facts;
        return policy::settings().fuses_with(
            &first.plan,
            batch.len(),
            bytes,
            &call.plan,
            facts.nranks,
            facts.max_blocks,
        );
    }
    batch.len() < MAX_BATCH
        && first.stream() == call.stream()
        && first.plan.same_launch(&call.plan)
        && call.core.may_batch(&call.plan)
}

/// Launches the batches of `queued` (each device's calls together, each communicator's together,
/// as `drain_queued` hands them): consecutive calls that `joins` allows in one launch (each alone
/// with NCCLSHIM_TUNE=batch:0). Batching calls that run one after the other is a local choice: such a
/// launch runs them as launches of one each would. Fusing is not (every rank fuses the same
/// calls: the layout of the inboxes depends on it), and comes from each communicator's calls in
/// their order and the settings alone.
fn launch_batches(queued: &[Queued]) -> Result<(), launcher::LaunchError> {
    let batching = policy::settings().batch;
    let joined = |run: &[Queued], call: &Queued| batching && joins(run, call);
    with_runs(
        queued,
        joined,
        |calls| Batch { calls },
        launcher::launch_group,
    )
}

/// Hands `f` the runs of `items` (`each_run`), each as `make` makes it of its items: listed on
/// the stack where they are few, as most groups' launches are.
fn with_runs<'a, T: OnDevice, R: Copy, O>(
    items: &'a [T],
    joins: impl Fn(&[T], &T) -> bool,
    make: impl Fn(&'a [T]) -> R,
    f: impl FnOnce(&[R]) -> O,
) -> O {
    const ON_STACK: usize = 16;
    let mut on_stack = [make(&items[..0]); ON_STACK];
    let (mut listed, mut spilled) = (0, Vec::new());
    each_run(items, joins, |range| {
        let run = make(&items[range]);
        match on_stack.get_mut(listed) {
            Some(slot) if spilled.is_empty() => {
                *slot = run;
                listed += 1;
            }
            _ => {
                if spilled.is_empty() {
                    spilled.extend_from_slice(&on_stack);
                }
                spilled.push(run);
            }
        }
    });
    match spilled.is_empty() {
        true => f(&on_stack[..listed]),
        false => f(&spilled),
    }
}

/// Splits `items` into runs of consecutive items of one device, each item joining the run before
/// it where `joins(run, item)` allows; hands each run to `run_of` in their order.
fn each_run<T: OnDevice>(
    items: &[T],
    joins: impl Fn(&[T], &T) -> bool,
    mut run_of: impl FnMut(Range<usize>),
) {
    let mut start = 0;
    for (i, item) in items.iter().enumerate().skip(1) {
        let run = &items[start..i];
        if run[0].device() != item.device() || !joins(run, item) {
            run_of(start..i);
            start = i;
        }
    }
    if !items.is_empty() {
        run_of(start..items.len());
    }
}

/// Puts each device's items together, and within a device each communicator's: devices and
/// communicators in the order they first come, each one's items in their order. A communicator's
/// calls thus come together however the program interleaved them with another's on the same
/// device, so that which of them share a launch depends on its own calls alone; what each
/// communicator's kernels see is unchanged. Communicators' launches still follow the order of
/// their first calls in the group.
fn by_device<T: OnDevice>(items: &mut [T]) {
    // Most groups hold one communicator's calls: nothing to move, nor to allocate.
    if let Some(first) = items.first()
        && (items.iter()).all(|item| (item.device(), item.comm()) == (first.device(), first.comm()))
    {
        return;
    }
    let mut firsts: Vec<(i32, usize)> = Vec::new();
    for item in items.iter() {
        if !firsts.contains(&(item.device(), item.comm())) {
            firsts.push((item.device(), item.comm()));
        }
    }
    let rank = |key: (i32, usize)| {
        let device = firsts.iter().position(|f| f.0 == key.0);
        (device, firsts.iter().position(|&f| f == key))
    };
    // Stable: each communicator's items keep their order.
    items.sort_by_key(|item| rank((item.device(), item.comm())));
}

/// What `runs` needs of an item: its device and communicator.
trait OnDevice {
    fn device(&self) -> i32;
    fn comm(&self) -> usize;
}

impl OnDevice for Queued {
    fn device(&self) -> i32 {
        self.core.device.ordinal
    }

    fn comm(&self) -> usize {
        &*self.core as *const CoreComm as usize
    }
}

/// A communicator to set up at the end of the group.
#[derive(Clone, Copy)]
pub struct Deferred {
    pub comm: ncclComm_t,
    pub blocking: bool,
}

/// A child communicator (ncclCommSplit, ncclCommShrink) made inside the group: NCCL writes its
/// handle into `slot` when it runs the group's jobs, at the group's end.
#[derive(Clone, Copy)]
pub struct Child {
    pub parent: ncclComm_t,
    pub slot: *mut ncclComm_t,
    pub blocking: bool,
    /// The split's color (ncclCommShrink: `None`).
    pub color: Option<i32>,
    /// What its config says of NCCL's CTAs (`None`: no config, its parent's).
    pub config: Option<super::CtaConfig>,
}

/// A symmetric window registered on a blocking communicator inside a group: NCCL writes its
/// handle into `slot` at the group's end (windows.rs).
pub struct PendingWindow {
    pub comm: ncclComm_t,
    pub slot: *const *mut std::ffi::c_void,
    pub begin: usize,
    pub size: usize,
    pub flags: i32,
}

impl PendingWindow {
    /// Notes the window under the handle NCCL wrote (none where it wrote NULL).
    ///
    /// # Safety
    /// NCCL has written `slot`, which the caller still keeps.
    pub unsafe fn register(&self) {
        // SAFETY: the caller's.
        let handle = unsafe { *self.slot } as usize;
        super::windows::registered(self.comm, handle, self.begin, self.size, self.flags);
    }
}

/// What the outermost group's end hands back: communicators to set up, and children and windows
/// whose handles are to be read once the real ncclGroupEnd has returned.
#[derive(Default)]
pub struct Ended {
    pub new_comms: Vec<Deferred>,
    pub children: Vec<Child>,
    pub windows: Vec<PendingWindow>,
    /// Communicators whose memory NCCL suspends in the group, none of whose calls of the group
    /// the core would take (where the group has such calls, queued or sent to NCCL with it, the
    /// core stays).
    pub suspended: Vec<ncclComm_t>,
}

/// This thread's group, all of it in one thread-local: in a shared library each lookup of
/// thread-local storage is a call into the dynamic loader, and a group's calls ask often.
struct ThreadGroup {
    level: Cell<Level>,
    new_comms: RefCell<Vec<Deferred>>,
    children: RefCell<Vec<Child>>,
    windows: RefCell<Vec<PendingWindow>>,
    suspended: RefCell<Vec<ncclComm_t>>,
    queued: RefCell<Vec<Queued>>,
    /// A call of the group was refused (see `queue_in`): nothing of it is launched.
    failed: Cell<bool>,
    /// The group's communicators with calls the core would take, and how they weigh (`add`).
    seen: RefCell<Vec<Seen>>,
    /// The first error of a queued call sent to NCCL (`send_queued_to_nccl`).
    sent_error: Cell<ncclResult_t>,
    /// The cores of `seen` and of the queued calls (`GroupCore`), each once: kept until the
    /// outermost group has ended and its queue is empty (`release_cores`). Last, so that a
    /// thread that ends inside a group drops its queue and what it saw first.
    cores: RefCell<Vec<Arc<CoreComm>>>,
}

impl ThreadGroup {
    /// The group holds something of the core's: its end has work to do.
    fn touch(&self) {
        self.level.set(Level {
            touched: true,
            ..self.level.get()
        });
    }

    /// `core` as the group holds it, taken into its hold where it is not there yet.
    fn hold(&self, core: CoreOf) -> GroupCore {
        match core {
            CoreOf::Held(held) => held,
            CoreOf::Owned(owned) => {
                let held = GroupCore::of(&owned);
                let mut cores = self.cores.borrow_mut();
                if !cores.iter().any(|c| Arc::ptr_eq(c, &owned)) {
                    cores.push(owned);
                }
                held
            }
        }
    }

    /// Lets go of the group's cores where nothing of the group can hold one any more: the
    /// outermost group has ended, and its queue is empty.
    fn release_cores(&self) {
        if self.level.get().depth == 0 && self.queued.borrow().is_empty() {
            debug_assert!(self.seen.borrow().is_empty());
            self.cores.borrow_mut().clear();
        }
    }
}

thread_local! {
    static GROUP: ThreadGroup = const {
        ThreadGroup {
            level: Cell::new(Level { depth: 0, opened: 0, touched: false }),
            new_comms: RefCell::new(Vec::new()),
            children: RefCell::new(Vec::new()),
            windows: RefCell::new(Vec::new()),
            suspended: RefCell::new(Vec::new()),
            queued: RefCell::new(Vec::new()),
            failed: Cell::new(false),
            seen: RefCell::new(Vec::new()),
            sent_error: Cell::new(ncclSuccess),
            cores: RefCell::new(Vec::new()),
        }
    };
}

/// This thread's level of groups.
fn level() -> Level {
    GROUP.with(|g| g.level.get())
}

fn set_level(level: Level) {
    GROUP.with(|g| g.level.set(level));
}

/// What the group has seen of one communicator's calls that the core would take.
struct Seen {
    comm: usize,
    /// Its core, as looked up at its first such call: the group's later calls need no look-up.
    core: GroupCore,
    so_far: policy::GroupSoFar,
    /// While every one so far fits at most `policy::max_fused_launches` fused launches
    /// (`Settings::fused_with`): how.
    fused: Option<Fused>,
    /// They go to NCCL (`Settings::group_goes_to_nccl` of the calls so far): the ones queued
    /// before the deciding call, it, and every later one.
    to_nccl: bool,
}

/// How deep in groups this thread is, how many of those levels it has opened in the real NCCL
/// (`open_real`; the outermost ones), and whether the outermost group holds anything of the
/// core's (a call it weighed or queued, a communicator to set up): one word, so that a group
/// whose calls all went to NCCL ends at NCCL's cost (`end_group`).
#[derive(Clone, Copy)]
struct Level {
    depth: u32,
    opened: u32,
    touched: bool,
}

/// Threads in a group now: while there are none, a call asks nothing of its thread's group
/// (`inside`, `open_real`), which costs a lookup of thread-local storage in a shared library.
/// A thread in a group has counted itself, and sees its own count.
static THREADS_IN_GROUPS: AtomicUsize = AtomicUsize::new(0);

pub fn inside() -> bool {
    THREADS_IN_GROUPS.load(Ordering::Relaxed) > 0 && level().depth > 0
}

/// Whether the next `end` leaves the outermost group.
pub fn ending_outermost() -> bool {
    level().depth == 1
}

pub fn start() {
    let level = level();
    if level.depth == 0 {
        THREADS_IN_GROUPS.fetch_add(1, Ordering::Relaxed);
    }
    set_level(Level {
        depth: level.depth + 1,
        ..level
    });
}

/// Opens the real NCCL's group to this thread's depth, where it is not yet: before a call goes
/// to NCCL (`Route::before_forward`). Nothing where the thread is in no group, or in one already
/// open there.
#[inline]
pub fn open_real() {
    if THREADS_IN_GROUPS.load(Ordering::Relaxed) == 0 {
        return;
    }
    let level = level();
    if level.opened < level.depth {
        open_real_levels(level);
    }
}

#[cold]
fn open_real_levels(level: Level) {
    let mut opened = level.opened;
    while opened < level.depth {
        // SAFETY: no arguments. A level NCCL did not open stays closed there: its end skips NCCL.
        if unsafe { crate::real::ncclGroupStart() } != ncclSuccess {
            break;
        }
        opened += 1;
    }
    set_level(Level { opened, ..level });
}

/// As `open_real` leaves a group where a call of it went to NCCL, without calling NCCL: for
/// tests that stand in for the real NCCL.
#[cfg(test)]
pub fn opened_in_nccl() {
    let level = level();
    set_level(Level {
        opened: level.depth,
        ..level
    });
}

/// Ends the innermost group level in the real NCCL through `real_end` where `open_real` opened
/// it there; a level that never reached NCCL ends without it. Outside every group, NCCL's own
/// answer (it refuses an end without a start).
fn end_real(real_end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    let level = level();
    if level.depth > 0 && level.opened < level.depth {
        return ncclSuccess;
    }
    if level.opened > 0 {
        set_level(Level {
            opened: level.opened - 1,
            ..level
        });
    }
    real_end()
}

/// Leaves one group level; at the outermost, hands back the communicators to set up (their
/// queued operations wait for `drain_queued`).
pub fn end() -> Option<Ended> {
    GROUP.with(|g| {
        let level = g.level.get();
        let depth = level.depth.saturating_sub(1);
        if level.depth == 1 {
            THREADS_IN_GROUPS.fetch_sub(1, Ordering::Relaxed);
        }
        g.level.set(Level {
            depth,
            opened: level.opened.min(depth),
            touched: level.touched && depth > 0,
        });
        if depth > 0 {
            return None;
        }
        // An untouched group left nothing behind to hand back or clear.
        if !level.touched {
            return Some(Ended::default());
        }
        // A communicator the group has calls of that the core would take keeps its core: they
        // may be queued for it (each rank's group holds the same calls, and decides alike).
        let mut suspended = g.suspended.take();
        let mut seen = g.seen.borrow_mut();
        suspended.retain(|&comm| !seen.iter().any(|s| s.comm == comm as usize));
        seen.clear();
        drop(seen);
        g.release_cores();
        Some(Ended {
            new_comms: g.new_comms.take(),
            children: g.children.take(),
            windows: g.windows.take(),
            suspended,
        })
    })
}

/// Hands the operations queued in the group to `f`, each device's together (`by_device`), and
/// empties the queue (keeping its memory for the next group).
pub fn drain_queued<T>(f: impl FnOnce(&[Queued]) -> T) -> T {
    GROUP.with(|g| {
        let mut queued = g.queued.borrow_mut();
        by_device(&mut queued);
        // Emptied even where `f` panics, or the next group would launch these calls again.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(&queued)));
        queued.clear();
        drop(queued);
        g.release_cores();
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Launches the operations queued in the group (logged first, as the calls the core took:
/// those sent to NCCL with their group left the queue, and NCCL logs them).
fn launch_queued() -> Result<(), launcher::LaunchError> {
    drain_queued(|queued| {
        queued.iter().for_each(log_taken);
        launch_batches(queued)
    })
}

/// Logs a queued operation as a call the core took (call_line.rs).
fn log_taken(op: &Queued) {
    if let Some(collective) = super::operations::collective_of(op.call.kind) {
        super::call_line::took(collective, &op.call, &op.core);
    }
}

/// What this thread's group knows of `comm` from its earlier calls (`add`).
pub enum Known {
    /// The thread is in no group.
    Outside,
    /// Nothing: none of its calls so far was one the core would take.
    New,
    /// Its calls go to NCCL (`add` decided so on an earlier one).
    ToNccl,
    /// Its core, as looked up at its first call, and where the group keeps what it saw of the
    /// communicator's calls (`add`'s `at`).
    Core(CoreOf, usize),
}

/// Whether this thread is in a group, and what that group knows of `comm`: one look at the
/// thread's group for both.
pub fn known(comm: ncclComm_t) -> Known {
    if THREADS_IN_GROUPS.load(Ordering::Relaxed) == 0 {
        return Known::Outside;
    }
    GROUP.with(|g| {
        if g.level.get().depth == 0 {
            return Known::Outside;
        }
        let seen = g.seen.borrow();
        match seen.iter().position(|s| s.comm == comm as usize) {
            None => Known::New,
            Some(at) if seen[at].to_nccl => Known::ToNccl,
            // Destroyed or revoked since (by another thread): look again.
            Some(at) if seen[at].core.released() => Known::New,
            Some(at) => Known::Core(CoreOf::Held(seen[at].core), at),
        }
    })
}

/// Weighs the call `queued` makes of the group's hold of `core` (its communicator's), a call of
/// `collective` that the core would take, with the group's calls of its communicator before it
/// (`Settings::group_goes_to_nccl`), and queues it for the group's end where the core keeps them
/// (`queue_in`'s rule allowing): one look at the thread's group. `at` is where `known` found the
/// communicator's entry, if it did (looked for again where it is not). `None` where it queued
/// the call, else the call's answer from the real NCCL, where it went instead.
/// Where this call decides that they go to NCCL, the calls of the communicator queued before it
/// go there now, in their order, and this one follows them; so do the group's later calls of
/// it (`known`), without being weighed. Each rank's group holds the same calls, and each call's
/// plan is the same on every rank: every rank decides alike, at the same call. A call the
/// capture rule refuses goes as `send_refused_to_nccl` sends it.
pub fn add(
    core: CoreOf,
    collective: Collective,
    at: Option<usize>,
    queued: impl FnOnce(GroupCore) -> Queued,
) -> Option<ncclResult_t> {
    let settings = policy::settings();
    // The call stays here unless queued (then `kept` is empty), and the look at the group hands
    // back a few bytes: whether the call goes to NCCL with the group's. A call handed back
    // through it was copied right after being written, in stores narrower than the copy's loads
    // (1.9 % of the host's time in eager groups of eight).
    let mut kept: Option<Queued> = None;
    let (to_nccl, comm) = GROUP.with(|g| {
        g.touch();
        let core = g.hold(core);
        let op = kept.insert(queued(core));
        let comm = op.call.comm;
        let mut seen = g.seen.borrow_mut();
        let mine = |s: &Seen| s.comm == comm as usize;
        let found = (at.filter(|&at| seen.get(at).is_some_and(mine)))
            .or_else(|| seen.iter().position(mine));
        let at = found.unwrap_or_else(|| {
            seen.push(Seen {
                comm: comm as usize,
                core,
                so_far: policy::GroupSoFar::NONE,
                fused: None,
                to_nccl: false,
            });
            seen.len() - 1
        });
        let s = &mut seen[at];
        let facts = &op.core.facts;
        s.fused = settings.fused_with(
            s.fused,
            s.so_far.calls,
            &op.plan,
            facts.nranks,
            facts.max_blocks,
        );
        s.so_far = s.so_far.and(collective, &op.plan);
        s.to_nccl = settings.group_goes_to_nccl(&s.so_far, facts.nranks, s.fused.is_some());
        if s.to_nccl {
            return (true, comm);
        }
        drop(seen);
        if let Some(op) = kept.take() {
            // Refused: kept, for `send_refused_to_nccl`.
            kept = queue_in(&mut g.queued.borrow_mut(), op).err();
        }
        (false, comm)
    });
    let op = kept?;
    Some(match to_nccl {
        true => {
            let _ = send_queued_to_nccl(comm);
            forward(op)
        }
        false => send_refused_to_nccl(op),
    })
}

/// Sends `op`, which the core does not take, to the real NCCL, as its export received it.
fn forward(op: Queued) -> ncclResult_t {
    match op.forward {
        Some(forward) => forward(),
        None => {
            open_real();
            // SAFETY: `call` describes the call as its export received it.
            unsafe { crate::real::forward_described(&op.call) }.unwrap_or(ncclInternalError)
        }
    }
}

/// Sends the queued calls of `comm` to the real NCCL, whose group is still open, in their order;
/// a call that fails there fails the group (`take_sent_error`). The last one's answer.
fn send_queued_to_nccl(comm: ncclComm_t) -> ncclResult_t {
    send_queued_where(|op| op.call.comm == comm)
}

/// Sends the queued calls `which` picks to the real NCCL, as `send_queued_to_nccl`; the last
/// one's answer.
fn send_queued_where(mut which: impl FnMut(&Queued) -> bool) -> ncclResult_t {
    let mut last = ncclSuccess;
    // Out of the queue while the real NCCL runs: nothing of ours is borrowed if it calls back.
    let mut queued = GROUP.with(|g| g.queued.take());
    for op in queued.extract_if(.., |op| which(op)) {
        super::observer::observer().sent_with_group(op.call.comm);
        let sent = forward(op);
        if sent != ncclSuccess && sent != ncclInProgress {
            GROUP.with(|g| {
                if g.sent_error.get() == ncclSuccess {
                    g.sent_error.set(sent);
                }
            });
        }
        last = sent;
    }
    // The others stay queued, in their order, with the queue's memory.
    GROUP.with(|g| {
        let mut q = g.queued.borrow_mut();
        let newer = std::mem::replace(&mut *q, queued);
        q.extend(newer);
    });
    last
}

/// Forgets the operations queued in the group (it failed: none of them is launched). Logged
/// all the same: NCCL logs each call as it is made, before its group fails. Where the group
/// failed on this rank only, the peers launched theirs: each communicator's later calls keep
/// their buffers from them.
pub fn discard_queued() {
    drain_queued(|queued| {
        for op in queued {
            log_taken(op);
            op.core.withhold_buffers(
                "a group's calls of the core were dropped, the group having failed",
            );
        }
    })
}

/// Whether an operation queued in the group is on a nonblocking communicator (NCCL allows no
/// group of both kinds).
pub fn queued_nonblocking() -> bool {
    GROUP.with(|g| g.queued.borrow().iter().any(|op| !op.core.blocking))
}

/// Whether `call` (communicator, captured) joins calls of its communicator, among `earlier`,
/// whose streams were captured where its own is not, or the other way round.
fn mixes_capture(mut earlier: impl Iterator<Item = (usize, bool)>, call: (usize, bool)) -> bool {
    earlier.any(|(comm, captured)| comm == call.0 && captured != call.1)
}

pub fn defer_setup(comm: ncclComm_t, blocking: bool) {
    GROUP.with(|g| {
        g.touch();
        g.new_comms.borrow_mut().push(Deferred { comm, blocking });
    });
}

pub fn defer_child(child: Child) {
    GROUP.with(|g| {
        g.touch();
        g.children.borrow_mut().push(child);
    });
}

/// `comm`'s memory is suspended at the group's end (core::suspending).
pub fn defer_suspension(comm: ncclComm_t) {
    GROUP.with(|g| {
        g.touch();
        let mut suspended = g.suspended.borrow_mut();
        // Suspended twice: NCCL refuses the second, and there is one core to let go.
        if !suspended.contains(&comm) {
            suspended.push(comm);
        }
    });
}

pub fn defer_window(window: PendingWindow) {
    GROUP.with(|g| {
        g.touch();
        g.windows.borrow_mut().push(window);
    });
}

/// Queues `op` in `queued`, the group's, unless its communicator's operations queued before are on
/// streams captured where its stream is not, or the other way round (then handed back, for
/// `send_refused_to_nccl`): NCCL refuses that (all uncaptured or all captured).
/// As NCCL, it asks the driver only where a call comes on a stream its communicator has not
/// used in the group: calls on one stream are captured alike.
fn queue_in(queued: &mut Vec<Queued>, mut op: Queued) -> Result<(), Queued> {
    let comm = op.comm();
    let stream = op.stream();
    let mut other_streams = queued
        .iter_mut()
        .filter(|o| o.comm() == comm && o.stream() != stream)
        .peekable();
    if other_streams.peek().is_some() {
        let mine = *op.captured.get_or_insert_with(|| capturing(stream));
        let earlier: Vec<(usize, bool)> = other_streams
            .map(|o| {
                let stream = o.stream();
                (comm, *o.captured.get_or_insert_with(|| capturing(stream)))
            })
            .collect();
        if mixes_capture(earlier.into_iter(), (comm, mine)) {
            return Err(op);
        }
    }
    queued.push(op);
    Ok(())
}

/// Sends a call `queue_in` refused to the real NCCL, after its communicator's calls queued before
/// it, in their order, and answers as NCCL does: NCCL sees the streams of both kinds, refuses
/// the call (ncclInvalidUsage, with its WARN) and fails its whole group, which then launches
/// nothing, as without the shim. Nothing of the core's is launched either.
fn send_refused_to_nccl(op: Queued) -> ncclResult_t {
    let comm = op.call.comm;
    GROUP.with(|g| g.queued.borrow_mut().push(op));
    let answer = send_queued_to_nccl(comm);
    if answer != ncclSuccess && answer != ncclInProgress {
        GROUP.with(|g| g.failed.set(true));
    }
    answer
}

/// Ends a group through `real_end` (the real ncclGroupSimulateEnd), which launches none of the
/// group's operations and tells how long they would take. At the outermost level the calls the
/// core queued go to NCCL's group first, opened there if no call had opened it, so that NCCL
/// sees the whole group, as without the shim, and nothing of it is launched; what the group made
/// (communicators, children, windows) is set up as after any end. An inner level ends as
/// ncclGroupEnd's does (NCCL ignores the estimate there).
pub fn simulate_end_group(real_end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    if ending_outermost() {
        open_real();
        send_queued_where(|_| true);
    }
    end_group(real_end)
}

/// Ends a group through `real_end` (the real ncclGroupEnd); at the outermost level, sets up the
/// communicators that wait for the group's end and launches the core operations queued in it.
pub fn end_group(real_end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    let real_end = || end_real(real_end);
    let level = level();
    // A group none of whose calls the core took (all went to NCCL): NCCL's end alone.
    if level.depth == 1 && !level.touched {
        let result = real_end();
        end();
        return result;
    }
    let outermost = level.depth == 1;
    // A nonblocking group's operations are launched by a thread of the real NCCL's after
    // ncclGroupEnd returns, so ours go first: the same order on every rank's streams. A blocking
    // group's are launched before it returns, so ours go after them.
    // A group one of whose calls was refused launches nothing of ours, and fails (as NCCL's);
    // `sent`: a call the core had queued that went to NCCL with its group and failed there.
    let (failed, sent) = match outermost {
        true => GROUP.with(|g| (g.failed.replace(false), g.sent_error.replace(ncclSuccess))),
        false => (false, ncclSuccess),
    };
    if failed {
        discard_queued();
    }
    let first = (outermost && queued_nonblocking()).then(launch_queued);
    let real = real_end();
    let result = match real {
        result if result == ncclSuccess && failed => ncclInvalidUsage,
        result if result == ncclSuccess => sent,
        result => result,
    };
    let Some(ended) = end() else {
        return result;
    };
    let launched = match first {
        Some(launched) => launched,
        None if result == ncclSuccess => Ok(()),
        // Nothing of a failed group is launched.
        None => {
            discard_queued();
            Ok(())
        }
    };
    let suspended = set_up_made(ended, real);
    // What is still queued (a blocking group's) goes after the set-ups.
    let launched = launched.and_then(|()| launch_queued());
    if !suspended.is_empty() {
        super::suspension::suspend(&suspended);
    }
    match launched {
        Ok(()) => result,
        Err((ordinal, e)) => {
            log_warn!("a core call on GPU {ordinal} could not be launched: {e}");
            ncclUnhandledCudaError
        }
    }
}

/// Sets up what the outermost group made (`ended`), NCCL's end having answered `real`: its
/// communicators, children and windows. Hands back the communicators whose memory the group
/// suspends, for after its launches.
fn set_up_made(ended: Ended, real: ncclResult_t) -> Vec<ncclComm_t> {
    let Ended {
        new_comms: mut deferred,
        children,
        windows,
        suspended,
    } = ended;
    // Most groups make nothing.
    if deferred.is_empty() && children.is_empty() && windows.is_empty() {
        return suspended;
    }
    // A blocking group's end has made its children. A nonblocking group's (ncclInProgress) are
    // made later by a thread of NCCL's: ranks could see their handles written or not yet, so
    // they are not read here (all_reduce meets them at their first all-reduce).
    // Children of blocking parents' splits meet on their parents, after the rest. What NCCL made
    // is set up wherever NCCL's own end succeeded, even if the group fails for a call of ours:
    // the peers' set-ups wait for this rank's.
    let mut splits = Vec::new();
    if real == ncclInProgress {
        // NCCL took the group as a nonblocking one's: it writes the handles later (windows.rs).
        for w in &windows {
            super::windows::registering(w.comm, w.begin, w.size, w.flags);
        }
    }
    if real == ncclSuccess {
        for window in &windows {
            // SAFETY: kept by the caller until its group's end, where NCCL wrote it.
            unsafe { window.register() };
        }
        for child in children {
            // SAFETY: kept by the caller until its group's end, where NCCL wrote it.
            let comm = unsafe { *child.slot };
            super::configured(comm, child.config, Some(child.parent));
            if let Some(split) =
                super::meets_on_parent(child.parent, comm, child.blocking, child.color)
            {
                splits.push(split);
                continue;
            }
            // NULL: NCCL_SPLIT_NOCOLOR, no child. A slot given twice holds one child.
            if comm.is_null() || deferred.iter().any(|d| d.comm == comm) {
                continue;
            }
            if child.blocking {
                lifecycle::made(comm, true);
                deferred.push(Deferred {
                    comm,
                    blocking: true,
                });
            } else {
                lifecycle::made_nonblocking(comm);
            }
        }
    }
    let (blocking, nonblocking): (Vec<_>, Vec<_>) = deferred.into_iter().partition(|d| d.blocking);
    let comms_of = |d: Vec<Deferred>| d.into_iter().map(|d| d.comm).collect::<Vec<_>>();
    // Whatever is not set up says why.
    let left = |comm: ncclComm_t, why: String| {
        setup::abandon(comm);
        lifecycle::declined(comm, None, &why)
    };
    if real == ncclSuccess && !blocking.is_empty() {
        setup::set_up(&comms_of(blocking), true);
    } else {
        for comm in comms_of(blocking) {
            left(
                comm,
                format!("the group that made it ended with result {real}"),
            );
        }
    }
    setup::set_up_children(&splits);
    if (real == ncclSuccess || real == ncclInProgress) && !nonblocking.is_empty() {
        // Their first all-reduces must have settled before the exchange goes on them.
        let mut ready = comms_of(nonblocking);
        ready.retain(|&comm| {
            let state = setup::settle(comm);
            if state != ncclSuccess {
                left(
                    comm,
                    format!("its first all-reduce ended with result {state}"),
                );
            }
            state == ncclSuccess
        });
        setup::set_up(&ready, false);
    } else {
        for comm in comms_of(nonblocking) {
            left(
                comm,
                format!("the group of its first all-reduce ended with result {real}"),
            );
        }
    }
    suspended
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (device, kernel, communicator): calls of one kernel may join.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Item(i32, char, usize);

    impl OnDevice for Item {
        fn device(&self) -> i32 {
            self.0
        }

        fn comm(&self) -> usize {
            self.2
        }
    }

    /// Two communicators on one GPU, their calls interleaved differently: each one's calls come
    /// together, in their order, so that what joins a launch of one communicator does not
    /// depend on the other's calls between them.
    #[test]
    fn each_communicators_calls_come_together_however_interleaved() {
        let mut one = [Item(0, 'a', 1), Item(0, 'b', 2), Item(0, 'c', 1)];
        let mut other = [Item(0, 'a', 1), Item(0, 'c', 1), Item(0, 'b', 2)];
        by_device(&mut one);
        by_device(&mut other);
        assert_eq!(one, other);
        assert_eq!(one, [Item(0, 'a', 1), Item(0, 'c', 1), Item(0, 'b', 2)]);
    }

    /// nccl-tests `-g 2 -m 3` queues each GPU's call in turn; each device's calls come together,
    /// in their order, and batch by kernel up to the limit.
    #[test]
    fn each_devices_calls_batch_in_order() {
        let mut items = [
            Item(1, 'a', 7),
            Item(0, 'a', 7),
            Item(1, 'a', 7),
            Item(0, 'a', 7),
            Item(1, 'b', 7),
            Item(0, 'a', 7),
            Item(1, 'a', 7),
        ];
        by_device(&mut items);
        assert_eq!(
            items,
            [
                Item(1, 'a', 7),
                Item(1, 'a', 7),
                Item(1, 'b', 7),
                Item(1, 'a', 7),
                Item(0, 'a', 7),
                Item(0, 'a', 7),
                Item(0, 'a', 7),
            ]
        );
        let runs = |items: &[Item], joins: &dyn Fn(&[Item], &Item) -> bool| {
            let mut runs = Vec::new();
            each_run(items, joins, |run| runs.push(run));
            runs
        };
        let at_most_two = |run: &[Item], item: &Item| run.len() < 2 && run[0].1 == item.1;
        assert_eq!(runs(&items, &at_most_two), [0..2, 2..3, 3..4, 4..6, 6..7]);
        assert_eq!(runs(&items, &|_, _| false).len(), items.len(), "each alone");
        assert_eq!(
            runs(&items, &|_, _| true),
            [0..4, 4..7],
            "never across devices"
        );
    }

    /// Every run reaches `f` whole and in order, as few as fit the stack and more than that.
    #[test]
    fn every_run_is_listed_in_order_past_the_stack_too() {
        for count in [0usize, 1, 15, 16, 17, 40] {
            // Pairs of one kernel: `count` items, in runs of two.
            let items: Vec<Item> = (0..count)
                .map(|i| Item(0, (b'a' + (i / 2 % 26) as u8) as char, 7))
                .collect();
            let same_kernel = |run: &[Item], item: &Item| run[0].1 == item.1;
            let listed = with_runs(&items, same_kernel, |run| run, |runs| runs.to_vec());
            assert_eq!(listed.len(), count.div_ceil(2), "{count} items");
            assert_eq!(listed.concat(), items, "{count} items");
            assert!(listed.iter().all(|run| run.iter().all(|i| i.1 == run[0].1)));
        }
    }

    /// ncclGroupSimulateEnd leaves a group level as ncclGroupEnd does, and ends NCCL's level
    /// where it was opened there: after the outermost one the thread is in no group, so that
    /// its later calls are launched as they come rather than queued for an end that never comes.
    #[test]
    fn a_simulated_end_leaves_its_group_level_as_an_end_does() {
        start();
        start();
        opened_in_nccl();
        let mut asked = 0;
        let mut simulate = || {
            asked += 1;
            ncclSuccess
        };
        assert_eq!(simulate_end_group(&mut simulate), ncclSuccess);
        assert!(inside() && ending_outermost(), "one level left");
        assert_eq!(simulate_end_group(&mut simulate), ncclSuccess);
        assert!(!inside(), "no group left");
        assert_eq!(asked, 2, "NCCL's end asked at each level NCCL had opened");
    }

    #[test]
    fn a_communicators_calls_in_a_group_are_all_captured_or_none() {
        let earlier = [(1, false), (1, false), (2, true)];
        assert!(!mixes_capture(earlier.into_iter(), (1, false)));
        assert!(!mixes_capture(earlier.into_iter(), (2, true)));
        assert!(mixes_capture(earlier.into_iter(), (1, true)));
        assert!(mixes_capture(earlier.into_iter(), (2, false)));
        assert!(
            !mixes_capture(earlier.into_iter(), (3, true)),
            "another communicator"
        );
    }
}
