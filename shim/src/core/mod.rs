//! The core: ncclshim's own collectives over NVLink (all-reduce; the others up to the limits
//! measured for the ranks' GPUs, `measured`, or set, `settings`), for communicators whose ranks
//! are all on this host with peer access between every pair of GPUs. Set up when a communicator
//! is created (`setup`), its life kept in a side table keyed by the handle (`lifecycle`), each
//! operation mapped to its collective (`operations`, from the table in `types`), chosen per call
//! by a policy that every rank computes alike (`policy`), launched on the caller's stream
//! (`comm`), with kernels built into the library for common GPUs and compiled by NVRTC for
//! others (`kernels`, `program`, `device/`). What it did, it tells the record of calls through
//! `observer`.
mod call_line;
mod comm;
mod ctas;
mod cuda;
mod empty;
mod fnv;
mod group;
pub mod kernels;
mod launcher;
mod layout;
mod lifecycle;
mod limits;
pub mod measured;
mod nvrtc;
mod observer;
mod operations;
pub mod policy;
pub mod program;
pub mod settings;
mod setup;
mod suspension;
pub mod types;
mod zero_copy;

pub use ctas::CtaConfig;
pub use cuda::{Reading, Stopwatch};
use observer::observer;
pub use observer::{Observer, set_observer};
pub use setup::Arrival;
pub use suspension::suspending;
pub use types::Collective;
mod watch;
mod windows;

use crate::call::Call;
use crate::ffi::{
    ncclComm_t, ncclInProgress, ncclRemoteError, ncclResult_t, ncclSuccess, ncclUnhandledCudaError,
};
use crate::log::{log_info, log_warn};

/// Makes NVRTC loadable (for the core, and for tests that compile its kernels).
pub fn nvrtc_load() -> Result<(), String> {
    nvrtc::load()
}

/// A blocking communicator (or several, from one call such as ncclCommInitAll) was created: set
/// up its core now, or at the end of the group it was created in. With the core off on this
/// rank too: the set-up is where ranks agree, and this rank's "no" must reach its peers, which
/// would otherwise wait for it in their exchange.
pub fn created(comms: &[ncclComm_t]) {
    let comms: Vec<ncclComm_t> = comms.iter().copied().filter(|c| !c.is_null()).collect();
    comms.iter().for_each(|&c| {
        lifecycle::made(c, true);
    });
    if group::inside() {
        comms.into_iter().for_each(|c| group::defer_setup(c, true));
    } else {
        setup::set_up(&comms, true);
    }
}

/// Signs this rank in where its peers on this host can meet it in shared memory, before the
/// real NCCL's init of a communicator made with the unique id(s) `id`; handed back with the
/// communicator (`arrived`), or dropped if the init failed (setup/rendezvous.rs).
pub fn sign_in(id: &[u8], nranks: i32, rank: i32, blocking: bool) -> Option<Arrival> {
    setup::sign_in(id, nranks, rank, blocking)
}

/// A name to sign in under for the ranks of a communicator that are all this process's.
pub fn new_id() -> [u8; 8] {
    setup::new_id()
}

/// The communicator `comm` was made (or, nonblocking, is being made) after this rank signed in
/// with `arrival`: its set-up meets there. Before `created` or `created_nonblocking`.
pub fn arrived(comm: ncclComm_t, arrival: Option<Arrival>) {
    if let Some(arrival) = arrival
        && !comm.is_null()
    {
        setup::hold(comm, arrival);
    }
}

/// `comm` was made with a config that says `config` of NCCL's CTAs (`None`: no config; a child
/// made without one takes its `parent`'s): its core keeps to it (ctas.rs). Before `created`.
pub fn configured(comm: ncclComm_t, config: Option<CtaConfig>, parent: Option<ncclComm_t>) {
    if !comm.is_null() {
        ctas::made(comm, config, parent);
    }
}

/// A nonblocking communicator was created (the real NCCL may still be initialising it): its
/// core is set up after its first all-reduce (lifecycle.rs).
pub fn created_nonblocking(comm: ncclComm_t) {
    lifecycle::made_nonblocking(comm);
}

/// A child communicator of `parent` (ncclCommSplit, with its `color`; ncclCommShrink, `None`)
/// was asked for and the call returned ncclSuccess, NCCL writing the child's handle into `slot`
/// once the child is made. Inside a group that is at the group's end, where it is handed over if
/// that end makes it (group_end). Outside one, a blocking parent's child is made before the call
/// returns and is handed over now; a nonblocking parent's is made by a thread of NCCL's, which
/// may or may not have written it yet (the call returns ncclSuccess either way), so it is not
/// read: ranks could disagree. `all_reduce` meets such a child at its first all-reduce.
///
/// # Safety
/// `slot` is the caller's: kept until the group's end inside a group (NCCL writes it there).
pub unsafe fn child_created(
    parent: ncclComm_t,
    slot: *mut ncclComm_t,
    blocking: bool,
    color: Option<i32>,
    config: Option<CtaConfig>,
) {
    if group::inside() {
        group::defer_child(group::Child {
            parent,
            slot,
            blocking,
            color,
            config,
        });
        return;
    }
    if !lifecycle::blocking(parent) {
        return;
    }
    // SAFETY: the caller's; a blocking parent's call wrote it before returning.
    let comm = unsafe { *slot };
    configured(comm, config, Some(parent));
    if let Some(split) = meets_on_parent(parent, comm, blocking, color) {
        setup::set_up_children(&[split]);
    } else if blocking {
        created(&[comm]);
    } else {
        created_nonblocking(comm);
    }
}

/// The most ranks a parent may have for its children to meet on it: the exchange gathers a
/// record (1 KiB) of every parent rank.
const MAX_MEETING_RANKS: usize = 4096;

/// The ranks of `comm`, a communicator the shim saw made and not destroyed, as the real NCCL
/// counts them; `None` where it would not say (one not ready yet: NCCL WARNs then).
fn ranks_of(comm: ncclComm_t) -> Option<usize> {
    let mut nranks = 0;
    // SAFETY: a communicator the real NCCL made; the int is written.
    let counted = unsafe { crate::real::ncclCommCount(comm, &mut nranks) } == ncclSuccess;
    counted.then_some(nranks as usize)
}

/// How a split's child meets its ranks: on its parent where the parent blocks on every rank
/// (`lifecycle::blocking_everywhere`) and is not too large, decided from the parent alone, which
/// every parent rank shares (not from the config, which NCCL reads only where the split makes a
/// child). Then every parent rank takes part; a rank whose child is nonblocking takes part with a
/// record saying so (the child waits for its first all-reduce, as any nonblocking communicator,
/// `created_nonblocking`, unless a peer's is blocking), and so does a rank given no child or a
/// handle seen before (set up once). `None`: the child meets on itself (`created`).
fn meets_on_parent(
    parent: ncclComm_t,
    child: ncclComm_t,
    blocking: bool,
    color: Option<i32>,
) -> Option<setup::Split> {
    let color = color.filter(|_| lifecycle::blocking_everywhere(parent))?;
    if ranks_of(parent)? > MAX_MEETING_RANKS {
        return None;
    }
    if !blocking {
        created_nonblocking(child);
    }
    let nonblocking = match blocking {
        true => std::ptr::null_mut(),
        false => child,
    };
    let child = match blocking && !child.is_null() && lifecycle::made(child, true) {
        true => child,
        false => std::ptr::null_mut(),
    };
    Some(setup::Split {
        parent,
        child,
        color,
        nonblocking,
    })
}

/// NCCL took a registration of `size` bytes from `begin` on `comm` as a window of `flags`
/// (ncclCommWindowRegister returned ncclSuccess, or ncclInProgress: `done` false) and writes
/// its handle into `slot`: before returning outside a group, at the group's end inside one (read
/// there), later on a nonblocking communicator (never read: the window is known by its bytes,
/// windows.rs).
///
/// # Safety
/// `slot` is the caller's: written by NCCL, kept until the group's end inside a group.
pub unsafe fn window_registered(
    comm: ncclComm_t,
    slot: *const *mut std::ffi::c_void,
    begin: usize,
    size: usize,
    flags: i32,
    done: bool,
) {
    if slot.is_null() || flags & windows::SYMMETRIC == 0 {
        return;
    }
    if !done || !lifecycle::blocking(comm) {
        windows::registering(comm, begin, size, flags);
        return;
    }
    let window = group::PendingWindow {
        comm,
        slot,
        begin,
        size,
        flags,
    };
    if group::inside() {
        group::defer_window(window);
    } else {
        // SAFETY: the caller's; NCCL wrote it before returning.
        unsafe { window.register() };
    }
}

/// NCCL deregistered the window `handle` of `comm`.
pub fn window_deregistered(comm: ncclComm_t, handle: usize) {
    windows::deregistered(comm, handle);
}

/// Why NCCL's settings (environment or configuration files) keep the core off, if they do: they
/// forbid peer-to-peer between GPUs.
pub fn p2p_forbidden() -> Option<String> {
    setup::p2p_forbidden(crate::nccl_env::get)
}

/// The bound NCCL's settings (`NCCL_MAX_CTAS`, `NCCL_MAX_NCHANNELS`) put on every
/// communicator's kernels, whatever its config (ctas.rs).
pub fn cta_bound() -> Option<u32> {
    ctas::settings_bound()
}

/// Whether NCCL's settings (`NCCL_CTA_POLICY`) ask NCCL of every communicator to move what it
/// can with its copy engines, whatever its config (ctas.rs).
pub fn copy_engines_asked() -> bool {
    ctas::settings_copy_engines()
}

pub fn group_start() {
    group::start();
}

/// Opens this thread's group in the real NCCL, where it is in one not yet open there.
#[inline]
pub fn open_group() {
    group::open_real();
}

/// Ends a group through `real_end` (the real ncclGroupEnd): group.rs.
pub fn group_end(real_end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    group::end_group(real_end)
}

/// Ends a group through `real_end` (the real ncclGroupSimulateEnd), launching nothing: group.rs.
pub fn group_simulate_end(real_end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    group::simulate_end_group(real_end)
}

/// The buffers of `call` that every rank uses, NULL for the others: a non-root's unused buffer
/// may lie anywhere (NCCL ignores it), so what ranks decide from where buffers lie must not
/// look at it.
fn used_by_every_rank(
    collective: Collective,
    call: &Call,
) -> (*const std::ffi::c_void, *mut std::ffi::c_void) {
    let send = match collective.reads_input(false) {
        true => call.send,
        false => std::ptr::null(),
    };
    let recv = match collective.writes_output(false) {
        true => call.recv,
        false => std::ptr::null_mut(),
    };
    (send, recv)
}

/// Whether a buffer this rank's part of a call of `collective` uses is NULL: the real NCCL's to
/// report. A non-root's send buffer of a broadcast or scatter, and its receive buffer of a
/// reduce or gather, are not used (NCCL allows anything there).
fn lacks_buffer(collective: Collective, call: &Call, rank: usize) -> bool {
    let root = call.root == Some(rank as i32);
    (collective.reads_input(root) && call.send.is_null())
        || (collective.writes_output(root) && call.recv.is_null())
}

/// A call of an operation: the core's where it has the collective (`operations.rs`) and takes
/// the call, else `forward` (the real NCCL's). Where a communicator's core waits for its first
/// all-reduce (nonblocking ones, and those the shim never saw made: a nonblocking parent's
/// children, see route.rs), that one goes to NCCL and the set-up follows: the same point in
/// every rank's sequence of calls. Calls of other collectives on such a communicator forward.
pub fn operation(call: &Call, forward: impl FnOnce() -> ncclResult_t + 'static) -> ncclResult_t {
    let Some(collective) = operations::collective_of(call.kind) else {
        return forward();
    };
    // No element to move: NCCL drops the call, which moves nothing on any rank (empty.rs). Nor
    // does an all-reduce of none set a waiting communicator's core up: its first with data
    // does, the same call on every rank, as the count is.
    if call.count == 0 {
        return empty::answer(collective, call, forward);
    }
    let settings = policy::settings();
    if !settings.may_take(collective, measured::in_use(collective)) {
        return forward();
    }
    // Between here and `policy::plan` nothing any rank shares may change for a call the plan
    // then leaves to NCCL (`known`, `lookup`, `failed`, `lacks_buffer` change nothing): a rank
    // whose flags (`measured::in_use`) let it look may then forward alike with its peers.
    let comm = call.comm;
    // In a group, its calls on this communicator go to NCCL (group::add decided on an earlier
    // one), or its core is known from an earlier one.
    let known = group::known(comm);
    let in_group = match known {
        group::Known::Outside => None,
        group::Known::Core(_, at) => Some(Some(at)),
        _ => Some(None),
    };
    let all_reduce = collective == Collective::AllReduce;
    let (core, forward) = match known {
        group::Known::ToNccl => return forward(),
        group::Known::Core(core, _) => (core, forward),
        group::Known::New | group::Known::Outside => match lookup(comm, all_reduce, forward) {
            Ok((core, forward)) => (group::CoreOf::Owned(core), forward),
            Err(result) => return result,
        },
    };
    collective_of_core(collective, call, core, settings, in_group, forward)
}

/// `comm`'s core (and `forward`, unused), or the result of its call where there is none to take
/// it: forwarded, or the communicator's first all-reduce (whose set-up follows).
fn lookup<F: FnOnce() -> ncclResult_t>(
    comm: ncclComm_t,
    all_reduce: bool,
    forward: F,
) -> Result<(std::sync::Arc<comm::CoreComm>, F), ncclResult_t> {
    Ok(match lifecycle::lookup(comm) {
        lifecycle::Lookup::Core(core) => (core, forward),
        lifecycle::Lookup::NoCore | lifecycle::Lookup::Revoked => return Err(forward()),
        lifecycle::Lookup::Waiting if all_reduce && lifecycle::first_all_reduce(comm) => {
            return Err(first_all_reduce(comm, forward));
        }
        // Taken by another thread's call meanwhile, or not an all-reduce.
        lifecycle::Lookup::Waiting => return Err(forward()),
        // NULL (or a stray handle whose call fails) is for the real NCCL to report.
        lifecycle::Lookup::Unknown
            if !all_reduce || comm.is_null() || !lifecycle::met_at_first_all_reduce(comm) =>
        {
            return Err(forward());
        }
        lifecycle::Lookup::Unknown => {
            log_info!(
                "comm {comm:p} was made where the shim could not see its handle (such as a nonblocking parent's split or shrink): its core is set up after this all-reduce"
            );
            return Err(first_all_reduce(comm, forward));
        }
    })
}

/// A call on `comm`, whose core is `core`: the core's where it takes it, else `forward`; queued
/// for the end of the thread's group where it is in one (`in_group`: `Some`, with where the group
/// keeps the communicator's entry if `group::known` found it).
fn collective_of_core(
    collective: Collective,
    call: &Call,
    core: group::CoreOf,
    settings: &policy::Settings,
    in_group: Option<Option<usize>>,
    forward: impl FnOnce() -> ncclResult_t + 'static,
) -> ncclResult_t {
    let comm = call.comm;
    // A kernel of this communicator gave up waiting for a peer: the ranks are out of step.
    if core.failed(comm) {
        return ncclRemoteError;
    }
    // Bad pointers are for the real NCCL to report, as it reports them. Peers with their
    // buffers may take the call on the core.
    if lacks_buffer(collective, call, core.rank) {
        core.withhold_buffers("a call without a buffer went to NCCL, not to the core");
        return forward();
    }
    let (send, recv) = used_by_every_rank(collective, call);
    let buffers = || windows::buffers_of(comm, send, recv);
    let Some(plan) = policy::plan(settings, collective, call, &core.facts, buffers) else {
        return forward();
    };
    let stream = call.stream as cuda::Stream;
    if let Some(at) = in_group {
        // Asked of the driver only where the trace wants it, or `group::add` needs it.
        let captured = observer()
            .wants_capture_state()
            .then(|| cuda::capturing(stream));
        let algorithm = plan.algorithm;
        let queued = |core| group::Queued {
            call: *call,
            core,
            plan,
            forward: (!crate::real::forwards_described(call.kind))
                .then(|| Box::new(forward) as Box<dyn FnOnce() -> ncclResult_t>),
            captured,
        };
        return match group::add(core, collective, at, queued) {
            None => {
                observer().ran_on_core(algorithm, captured);
                ncclSuccess
            }
            Some(sent) => sent,
        };
    }
    let captured = observer()
        .wants_capture_state()
        .then(|| cuda::capturing(stream));
    // NCCLSHIM_TRACE_TIMING: events around the kernel (not in a graph: a replay is not this call).
    let watch = (observer().wants_timing() && captured == Some(false))
        .then(|| {
            let _context = core.device.enter_if_needed().ok()?;
            // SAFETY: the caller's stream, of this communicator's device.
            unsafe { cuda::Stopwatch::start(&core.device, stream) }.ok()
        })
        .flatten();
    call_line::took(collective, call, &core);
    match core.launch(&plan, call.send, call.recv, stream) {
        Ok(()) => {
            observer().ran_on_core(plan.algorithm, captured);
            if let Some(watch) = watch {
                let stopped = core
                    .device
                    .enter_if_needed()
                    // SAFETY: as at the start, after the launch on the same stream.
                    .and_then(|_context| unsafe { watch.stop(stream) });
                match stopped {
                    Ok(()) => observer().timed(watch),
                    Err(_) => watch.discard(),
                }
            }
            ncclSuccess
        }
        Err(e) => {
            if let Some(watch) = watch {
                watch.discard();
            }
            log_warn!(
                "{} on GPU {} could not be launched: {e}",
                plan.algorithm.name(),
                core.device.ordinal
            );
            ncclUnhandledCudaError
        }
    }
}

/// The first all-reduce of a communicator whose core waits for it: the real NCCL's
/// (`forward`), then the set-up, now or at the end of the group. A rank whose call fails sets
/// nothing up and withdraws (its peers' calls fail alike, or their set-up meets without it and
/// declines; through NCCL they wait for it there, as for any call it skipped).
fn first_all_reduce(comm: ncclComm_t, forward: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    let result = forward();
    if result != ncclSuccess && result != ncclInProgress {
        setup::abandon(comm);
        let why = format!("its first all-reduce failed with result {result}");
        lifecycle::declined(comm, None, &why);
        return result;
    }
    if group::inside() {
        group::defer_setup(comm, false);
        return result;
    }
    // Settled, as NCCL wants before the next operation on the communicator (the exchange's).
    let state = setup::settle(comm);
    if state == ncclSuccess {
        setup::set_up(&[comm], false);
    } else {
        // Its peers, meeting in shared memory, stop waiting for it.
        setup::abandon(comm);
        let why = format!("its first all-reduce ended with result {state}");
        lifecycle::declined(comm, None, &why);
    }
    state
}

/// The communicator's asynchronous error as the real NCCL gives it (`real`), or ncclRemoteError
/// where a kernel of its core gave up waiting for a peer and NCCL saw nothing wrong.
pub fn async_error(comm: ncclComm_t, real: ncclResult_t) -> ncclResult_t {
    if real != ncclSuccess {
        return real;
    }
    match lifecycle::lookup(comm) {
        lifecycle::Lookup::Core(core) if core.failed(comm) => ncclRemoteError,
        _ => real,
    }
}

/// The communicator is going away (ncclCommDestroy, or ncclCommAbort with `abort`): release its
/// core, never hanging.
pub fn destroyed(comm: ncclComm_t, abort: bool) {
    setup::abandon(comm);
    windows::forget(comm);
    ctas::forget(comm);
    if let Some(core) = lifecycle::forget(comm) {
        release(comm, core, abort);
    }
}

/// The communicator was revoked (ncclCommRevoke): its core goes, as at an abort, and its later
/// calls go to NCCL, which refuses them. Not set up yet, it withdraws from its set-up.
pub fn revoked(comm: ncclComm_t) {
    setup::abandon(comm);
    windows::forget(comm);
    if let Some(core) = lifecycle::revoked(comm) {
        release(comm, core, true);
    }
}

fn release(comm: ncclComm_t, mut core: std::sync::Arc<comm::CoreComm>, abort: bool) {
    core.mark_released();
    // The watcher holds a communicator for a moment each second: wait for it, not for a call.
    for _ in 0..100 {
        match std::sync::Arc::try_unwrap(core) {
            Ok(core) => {
                let freed = core.release(abort);
                let (buffers, mappings) = cuda::live_resources();
                if freed {
                    log_info!(
                        "core of comm {comm:p} released; the core holds {buffers} device buffers and {mappings} peer mappings in this process"
                    );
                } else {
                    log_warn!(
                        "comm {comm:p}: the GPU did not finish within 20 s of its release: its core buffers are kept"
                    );
                }
                return;
            }
            Err(shared) => core = shared,
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Still used by another thread's call: leave its memory rather than pull it away.
    log_warn!("comm {comm:p} released while in use: its core buffers are kept");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::ncclInvalidUsage;
    use measured::Buffers;
    use std::ffi::c_void;

    // Made-up handles, apart from the other tests' (the table is shared).
    const CHILD: usize = 0x7000_0010;
    const PARENT: ncclComm_t = 0x7100_0000 as ncclComm_t;

    const OPERATIONS_COMM: ncclComm_t = 0x7500_0000 as ncclComm_t;

    /// A registration NCCL has not finished (ncclInProgress, here on a communicator known
    /// blocking), or done on a communicator not known blocking, is known by its bytes: NCCL
    /// writes its handle later, and the slot is never read (a dangling one here, whose read
    /// would fault).
    #[test]
    fn a_window_whose_handle_comes_later_is_known_by_its_bytes() {
        let (in_progress, unknown) = (0x7600_0000 as ncclComm_t, 0x7600_0010 as ncclComm_t);
        assert!(lifecycle::made(in_progress, true));
        let slot: *const *mut c_void = std::ptr::NonNull::dangling().as_ptr();
        let at = |p: usize| p as *const c_void;
        for (comm, done) in [(in_progress, false), (unknown, true)] {
            // SAFETY: the slot is not read where the handle comes later.
            unsafe { window_registered(comm, slot, 0x7_0000, 0x1000, windows::SYMMETRIC, done) };
            assert_eq!(
                windows::buffers_of(comm, at(0x7_0800), at(0)),
                Buffers::InWindows
            );
            assert_eq!(
                windows::buffers_of(comm, at(0x7_1000), at(0)),
                Buffers::Plain
            );
            // SAFETY: as above; not symmetric: not a window the core follows.
            unsafe { window_registered(comm, slot, 0x8_0000, 0x1000, 0, done) };
            assert_eq!(
                windows::buffers_of(comm, at(0x8_0000), at(0)),
                Buffers::Plain
            );
            windows::forget(comm);
        }
        lifecycle::forget(in_progress);
    }

    /// A blocking communicator's registration inside a group is read at the group's end; where
    /// NCCL ends the group in progress (it took the communicator as nonblocking), its handle
    /// comes later: the window is known by its bytes, and the slot is not read.
    #[test]
    fn a_window_of_a_group_that_ends_in_progress_is_known_by_its_bytes() {
        let comm = 0x7600_0020 as ncclComm_t;
        assert!(lifecycle::made(comm, true));
        let slot: *const *mut c_void = std::ptr::NonNull::dangling().as_ptr();
        let at = |p: usize| p as *const c_void;
        group_start();
        // The registration went to NCCL, which opened its group.
        group::opened_in_nccl();
        // SAFETY: the slot is read at the group's end only where NCCL ended it done.
        unsafe { window_registered(comm, slot, 0x9_0000, 0x1000, windows::SYMMETRIC, true) };
        assert_eq!(group_end(|| ncclInProgress), ncclInProgress);
        assert_eq!(
            windows::buffers_of(comm, at(0x9_0000), at(0)),
            Buffers::InWindows
        );
        windows::forget(comm);
        lifecycle::forget(comm);
    }

    /// Where buffers lie is asked of those every rank uses: a scatter's or broadcast's input
    /// (the root's only) and a gather's or reduce's output are passed over.
    #[test]
    fn only_the_buffers_every_rank_uses_are_asked_where_they_lie() {
        let mut call = call_of("ncclAllReduce", 8);
        (call.send, call.recv) = (0x1000 as *const c_void, 0x2000 as *mut c_void);
        let asked = |collective| {
            let (send, recv) = used_by_every_rank(collective, &call);
            (!send.is_null(), !recv.is_null())
        };
        for collective in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
        ] {
            assert_eq!(asked(collective), (true, true), "{collective:?}");
        }
        for collective in [Collective::Broadcast, Collective::Scatter] {
            assert_eq!(asked(collective), (false, true), "{collective:?}");
        }
        for collective in [Collective::Reduce, Collective::Gather] {
            assert_eq!(asked(collective), (true, false), "{collective:?}");
        }
    }

    /// A call of `function` (one of this build's operations) on a made-up communicator.
    fn call_of(function: &str, count: usize) -> Call {
        let kind = crate::ffi::OPERATIONS
            .iter()
            .position(|f| *f == function)
            .unwrap();
        Call {
            kind: kind as u8,
            comm: OPERATIONS_COMM,
            send: 0x1000 as *const std::ffi::c_void,
            recv: 0x2000 as *mut std::ffi::c_void,
            count,
            datatype: 7,
            op: Some(0),
            root: Some(0),
            stream: std::ptr::null_mut(),
        }
    }

    /// Calls the core does not take reach NCCL through their forwarder, with its result: an
    /// operation no collective names, a collective no communicator of the process takes, a call
    /// of no element, and any call on a communicator the core does not know.
    #[test]
    fn calls_the_core_leaves_are_forwarded_with_nccls_result() {
        let forwarded = |call: &Call| {
            let reached = std::rc::Rc::new(std::cell::Cell::new(false));
            let seen = reached.clone();
            let result = operation(call, move || {
                seen.set(true);
                ncclRemoteError
            });
            (reached.get(), result)
        };
        let all = (true, ncclRemoteError);
        assert_eq!(forwarded(&call_of("ncclSend", 16)), all);
        assert_eq!(forwarded(&call_of("ncclAllGather", 16)), all);
        assert_eq!(forwarded(&call_of("ncclAllGather", 0)), all);
        assert_eq!(forwarded(&call_of("ncclReduce", 0)), all);
        assert_eq!(
            forwarded(&call_of("ncclAllReduce", 16)),
            all,
            "unknown comm"
        );
        lifecycle::forget(OPERATIONS_COMM);
    }

    /// An all-reduce of no element sets no core up: a communicator waiting for its first
    /// all-reduce still waits (its first with data sets it up), and one never seen made stays
    /// unknown. (Both forward here: no real NCCL says the waiting one is ready.)
    #[test]
    fn an_all_reduce_of_nothing_sets_no_core_up() {
        let (waiting, unseen) = (0xa110 as ncclComm_t, 0xa120 as ncclComm_t);
        lifecycle::awaits_first_all_reduce(waiting);
        let mut call = call_of("ncclAllReduce", 0);
        for comm in [waiting, unseen] {
            call.comm = comm;
            let reached = std::rc::Rc::new(std::cell::Cell::new(false));
            let seen = reached.clone();
            let result = operation(&call, move || {
                seen.set(true);
                ncclSuccess
            });
            assert_eq!((reached.get(), result), (true, ncclSuccess));
        }
        assert!(matches!(
            lifecycle::lookup(waiting),
            lifecycle::Lookup::Waiting
        ));
        assert!(matches!(
            lifecycle::lookup(unseen),
            lifecycle::Lookup::Unknown
        ));
        lifecycle::forget(waiting);
    }

    /// Children of a blocking group, read at its end: one made nonblocking by its config waits
    /// for its first all-reduce; a blocking one is known (and set up where CUDA is); a slot
    /// left NULL (NCCL_SPLIT_NOCOLOR) is skipped.
    #[test]
    fn a_blocking_groups_children_are_read_at_its_end() {
        let (mut child, mut blocking_child, mut no_color): (ncclComm_t, ncclComm_t, ncclComm_t) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let (slot, blocking_slot) = (&raw mut child, &raw mut blocking_child);
        group_start();
        // The splits went to NCCL, which opened its group.
        group::opened_in_nccl();
        // SAFETY: the slots outlive the group.
        unsafe {
            child_created(PARENT, slot, false, None, None);
            child_created(PARENT, blocking_slot, true, None, None);
            child_created(PARENT, &raw mut no_color, false, None, None);
        }
        assert!(
            !lifecycle::first_all_reduce(CHILD as ncclComm_t),
            "not before the group's end"
        );
        let result = group_end(|| {
            // SAFETY: as the real NCCL does at a blocking group's end.
            unsafe {
                *slot = CHILD as ncclComm_t;
                *blocking_slot = (CHILD + 48) as ncclComm_t;
            }
            ncclSuccess
        });
        assert_eq!(result, ncclSuccess);
        assert!(
            lifecycle::first_all_reduce(CHILD as ncclComm_t),
            "read at the group's end"
        );
        let blocking_child = (CHILD + 48) as ncclComm_t;
        assert!(!matches!(
            lifecycle::lookup(blocking_child),
            lifecycle::Lookup::Unknown
        ));
        lifecycle::forget(blocking_child);
    }

    /// A group asking for a child (its config nonblocking) of PARENT, whose end returns `ended`
    /// with `child` written into the child's slot, as NCCL writes it there.
    fn group_making_child(child: usize, ended: ncclResult_t) -> ncclResult_t {
        let mut handle: ncclComm_t = std::ptr::null_mut();
        let slot = &raw mut handle;
        group_start();
        group::opened_in_nccl();
        // SAFETY: the slot outlives the group, which ends here.
        unsafe { child_created(PARENT, slot, false, None, None) };
        group_end(|| {
            // SAFETY: the slot above, still in scope.
            unsafe { *slot = child as ncclComm_t };
            ended
        })
    }

    /// A group whose calls all went to NCCL ends with NCCL's end alone, whatever it returns, and
    /// leaves no group open; the next group with something of the core's still has its end.
    #[test]
    fn a_group_of_forwarded_calls_ends_as_nccls() {
        group_start();
        group_start();
        group::opened_in_nccl();
        assert_eq!(group_end(|| ncclSuccess), ncclSuccess);
        assert!(group::inside());
        assert_eq!(group_end(|| ncclUnhandledCudaError), ncclUnhandledCudaError);
        assert!(!group::inside());
        assert_eq!(group_making_child(CHILD + 80, ncclSuccess), ncclSuccess);
        assert!(lifecycle::first_all_reduce((CHILD + 80) as ncclComm_t));
        lifecycle::forget((CHILD + 80) as ncclComm_t);
    }

    /// A group none of whose calls went to NCCL ends without it, at every level: NCCL keeps
    /// memory of every empty group. A level opened in NCCL ends there; an end outside every
    /// group is NCCL's to refuse.
    #[test]
    fn a_group_ends_in_nccl_only_where_it_was_opened_there() {
        let ended = std::cell::Cell::new(0);
        let real_end = || {
            ended.set(ended.get() + 1);
            ncclSuccess
        };
        group_start();
        group_start();
        assert_eq!(group_end(real_end), ncclSuccess);
        assert_eq!(group_end(real_end), ncclSuccess);
        assert_eq!(ended.get(), 0, "never opened in NCCL");
        group_start();
        group_start();
        assert_eq!(group_end(real_end), ncclSuccess);
        group::opened_in_nccl();
        assert_eq!(group_end(real_end), ncclSuccess);
        assert_eq!(ended.get(), 1, "the outer level only");
        assert!(!group::inside());
        assert_eq!(group_end(|| ncclInvalidUsage), ncclInvalidUsage);
    }

    /// A nonblocking group's children are made later, by NCCL's own thread: never read, even
    /// where the handle happens to be written when the group's end returns.
    #[test]
    fn a_nonblocking_groups_children_are_not_read() {
        // Written as NCCL's thread might, before the group's end returns.
        assert_eq!(
            group_making_child(CHILD + 16, ncclInProgress),
            ncclInProgress
        );
        assert!(!lifecycle::first_all_reduce((CHILD + 16) as ncclComm_t));
        assert!(matches!(
            lifecycle::lookup((CHILD + 16) as ncclComm_t),
            lifecycle::Lookup::Unknown
        ));
    }

    /// Outside a group a blocking parent's child is read at once; a nonblocking parent's (or
    /// an unknown one's) never, even where its handle happens to be written already.
    #[test]
    fn outside_a_group_only_a_blocking_parents_child_is_read() {
        let (blocking_parent, nonblocking_parent) =
            (0x7200_0000 as ncclComm_t, 0x7300_0000 as ncclComm_t);
        lifecycle::made(blocking_parent, true);
        lifecycle::made(nonblocking_parent, false);
        let mut child = (CHILD + 32) as ncclComm_t;
        // SAFETY: written, as NCCL does before a blocking parent's split returns.
        unsafe { child_created(blocking_parent, &raw mut child, false, None, None) };
        assert!(lifecycle::first_all_reduce(child));
        for parent in [nonblocking_parent, 0x7400_0000 as ncclComm_t] {
            let mut child = (CHILD + 64) as ncclComm_t;
            // SAFETY: written, as NCCL's thread may have done by the time the split returns.
            unsafe { child_created(parent, &raw mut child, true, Some(0), None) };
            assert!(!lifecycle::first_all_reduce(child));
            assert!(matches!(
                lifecycle::lookup(child),
                lifecycle::Lookup::Unknown
            ));
        }
        lifecycle::forget(blocking_parent);
        lifecycle::forget(nonblocking_parent);
    }
}
