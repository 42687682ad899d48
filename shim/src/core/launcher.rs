//! Launching a group's core operations on several GPUs at once. One thread that drives N GPUs
//! (nccl-tests, single-process multi-GPU programs) pays one kernel launch per GPU per call, and a
//! launch costs the host about 2.4 us on H200 whatever the kernel: in turn, N GPUs cost N
//! launches. Launches on different devices run in parallel from different threads (measured by
//! tests/gpu/launch_cost.cu on 4 H200: 9.2 - 9.6 us in turn, 3.6 - 3.9 us with helpers), so each
//! device gets a helper thread that launches its operations while the caller launches its own.
//!
//! A helper spins for a while after its last job, then sleeps. A job it has not picked up by the
//! time the caller is done with its own operations is taken back and launched by the caller: a
//! sleeping or busy helper never makes a group slower than launching in turn, nor hangs it. The
//! caller returns only once every launch is issued, so stream order is the caller's.
//!
//! `NCCLSHIM_TUNE=launch_helpers:0` launches in turn, on the calling thread (policy.rs reads it).

use std::cell::UnsafeCell;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::cuda::CudaError;
use super::policy;

/// Devices with a helper; operations on higher ordinals are launched in turn.
const MAX_DEVICES: usize = 64;
/// How long a helper spins for its next job before it sleeps: longer than the gaps between the
/// groups of a training or inference step, short enough not to hold a core through idle time.
const SPIN: Duration = Duration::from_micros(200);

/// A failed launch: on which device, and why.
pub type LaunchError = (i32, CudaError);

/// What the launcher launches: an operation bound to one device.
pub trait DeviceOp {
    /// The device's ordinal.
    fn ordinal(&self) -> i32;
    /// Which communicator's calls it holds (a key of its own for each communicator).
    fn comm(&self) -> usize;
    /// Issues the operation (on the caller's thread, or on its device's helper).
    fn launch(&self) -> Result<(), CudaError>;
    /// What a new helper thread runs first, to launch on this operation's device.
    fn prepare_thread(&self) -> impl FnOnce() + Send + 'static;
    /// Whether only the calling thread may launch it: a stream of it is the thread's own
    /// (`cudaStreamPerThread`, which names another stream on every thread).
    fn callers_thread_only(&self) -> bool;
}

/// One device's helper: a job slot, handed over by generation numbers. Aligned so that two
/// helpers never share a cache line (the caller spins on each in turn).
#[repr(align(128))]
struct Helper {
    /// Held by the one caller that posts to this helper, until its job is done.
    posting: AtomicBool,
    /// The generation of the last job posted.
    posted: AtomicU64,
    /// The generation of the last job taken, by the helper or back by the caller.
    claimed: AtomicU64,
    /// The generation of the last job the helper finished.
    finished: AtomicU64,
    sleeping: AtomicBool,
    job: UnsafeCell<Job>,
    result: UnsafeCell<Result<(), LaunchError>>,
    thread: Thread,
}

// SAFETY: `job` and `result` are touched only by whoever claimed the current generation, and
// read by the poster after `finished` (release/acquire) says the helper is done with them.
unsafe impl Sync for Helper {}

/// The operations of one group (the caller's queue, of any `DeviceOp` type) and the device whose
/// ones to launch.
#[derive(Clone, Copy)]
struct Job {
    ops: *const (),
    len: usize,
    ordinal: i32,
    /// `launch_here` of the job's device, for the queue's element type.
    launch: unsafe fn(*const (), usize, i32) -> Result<(), LaunchError>,
}

impl Job {
    fn new<Op: DeviceOp>(ops: &[Op], ordinal: i32) -> Job {
        /// # Safety
        /// `ops` and `len` describe a live `[Op]`.
        unsafe fn erased<Op: DeviceOp>(
            ops: *const (),
            len: usize,
            ordinal: i32,
        ) -> Result<(), LaunchError> {
            // SAFETY: the caller's contract.
            let ops = unsafe { std::slice::from_raw_parts(ops.cast::<Op>(), len) };
            launch_here(ops, |o| o == ordinal)
        }
        Job {
            ops: ops.as_ptr().cast(),
            len: ops.len(),
            ordinal,
            launch: erased::<Op>,
        }
    }

    /// Launches this job's device's operations, in queue order.
    ///
    /// # Safety
    /// The queue must still be alive (its poster waits for the job to finish).
    unsafe fn run(&self) -> Result<(), LaunchError> {
        // SAFETY: the caller's contract; `launch` was made for the queue's type.
        unsafe { (self.launch)(self.ops, self.len, self.ordinal) }
    }
}

/// Launches the operations of `ops` on the devices `which` picks, in queue order, on this thread;
/// the first error met. One that fails (or panics) holds back the later ones of its communicator
/// (launched, they would meet their peers' calls before them), not the other communicators',
/// whose peers would wait for them.
fn launch_here<Op: DeviceOp>(ops: &[Op], which: impl Fn(i32) -> bool) -> Result<(), LaunchError> {
    let mut first_error = None;
    // Allocates only once a launch failed.
    let mut failed: Vec<usize> = Vec::new();
    for op in ops.iter().filter(|op| which(op.ordinal())) {
        if failed.contains(&op.comm()) {
            continue;
        }
        let launched = std::panic::catch_unwind(AssertUnwindSafe(|| op.launch()))
            .unwrap_or_else(|_| Err(CudaError::panicked()));
        if let Err(e) = launched {
            failed.push(op.comm());
            first_error.get_or_insert((op.ordinal(), e));
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The helper of `op`'s device, started on first use; `None` if its thread could not be started.
fn helper(op: &impl DeviceOp) -> Option<&'static Helper> {
    static HELPERS: [OnceLock<Option<&'static Helper>>; MAX_DEVICES] =
        [const { OnceLock::new() }; MAX_DEVICES];
    let slot = HELPERS.get(usize::try_from(op.ordinal()).ok()?)?;
    *slot.get_or_init(|| spawn(op))
}

fn spawn(op: &impl DeviceOp) -> Option<&'static Helper> {
    let (sender, receiver) = std::sync::mpsc::channel::<&'static Helper>();
    let prepare = op.prepare_thread();
    let thread = std::thread::Builder::new()
        .name(format!("ncclshim-launch-{}", op.ordinal()))
        .spawn(move || {
            prepare();
            if let Ok(helper) = receiver.recv() {
                serve(helper);
            }
        })
        .ok()?;
    let helper: &'static Helper = Box::leak(Box::new(Helper {
        posting: AtomicBool::new(false),
        posted: AtomicU64::new(0),
        claimed: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        sleeping: AtomicBool::new(false),
        // A placeholder: a job is run only once posted.
        job: UnsafeCell::new(Job::new::<NoOp>(&[], op.ordinal())),
        result: UnsafeCell::new(Ok(())),
        thread: thread.thread().clone(),
    }));
    sender.send(helper).ok()?;
    Some(helper)
}

/// A helper's life: take each posted job that the caller has not taken back.
fn serve(helper: &'static Helper) {
    let mut seen = 0;
    let mut idle_since = Instant::now();
    loop {
        let generation = helper.posted.load(Ordering::Acquire);
        if generation != seen {
            seen = generation;
            if helper.claim(generation) {
                // SAFETY: claimed, so ours until `finished`; the poster keeps the queue alive.
                let job = unsafe { *helper.job.get() };
                // A panic must still finish the job, or its poster would wait for ever.
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    // SAFETY: as above.
                    unsafe { job.run() }
                }))
                .unwrap_or_else(|_| Err((job.ordinal, CudaError::panicked())));
                // SAFETY: as above.
                unsafe { *helper.result.get() = result };
                helper.finished.store(generation, Ordering::Release);
            }
            idle_since = Instant::now();
        } else if idle_since.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            // Sleep unless a job came in meanwhile; `post` sees `sleeping` or we see its job.
            helper.sleeping.store(true, Ordering::SeqCst);
            if helper.posted.load(Ordering::SeqCst) == seen {
                std::thread::park();
            }
            helper.sleeping.store(false, Ordering::SeqCst);
            idle_since = Instant::now();
        }
    }
}

impl Helper {
    /// Takes job `generation`: true for exactly one of the helper and the poster.
    fn claim(&self, generation: u64) -> bool {
        self.claimed
            .compare_exchange(
                generation - 1,
                generation,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Posts `job`; `None` if another caller is posting to this helper.
    fn post(&self, job: Job) -> Option<u64> {
        if self.posting.swap(true, Ordering::Acquire) {
            return None;
        }
        let generation = self.posted.load(Ordering::Relaxed) + 1;
        // SAFETY: the previous job is finished or was taken back (its poster waited), and
        // `posting` makes us the only poster.
        unsafe { *self.job.get() = job };
        self.posted.store(generation, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Some(generation)
    }

    /// Job `generation` launched: by the caller if the helper has not taken it, else waited for.
    fn complete(&self, generation: u64) -> Result<(), LaunchError> {
        let result = if self.claim(generation) {
            // SAFETY: taken back, so ours; the queue is the caller's, alive.
            unsafe { (*self.job.get()).run() }
        } else {
            while self.finished.load(Ordering::Acquire) != generation {
                std::hint::spin_loop();
            }
            // SAFETY: the helper is done with it (`finished`, acquire).
            std::mem::replace(unsafe { &mut *self.result.get() }, Ok(()))
        };
        self.posting.store(false, Ordering::Release);
        result
    }
}

/// The type of a helper's placeholder job (never run).
struct NoOp;

impl DeviceOp for NoOp {
    fn ordinal(&self) -> i32 {
        -1
    }
    fn comm(&self) -> usize {
        0
    }
    fn launch(&self) -> Result<(), CudaError> {
        Ok(())
    }
    fn prepare_thread(&self) -> impl FnOnce() + Send + 'static {
        || {}
    }
    fn callers_thread_only(&self) -> bool {
        false
    }
}

/// Launches a group's queued operations: those on the first operation's device by the calling
/// thread, the others by their devices' helpers at the same time (all by the calling thread
/// where one is on its own stream); in queue order per device (`launch_here`).
/// Returns once all are issued, with the first error met.
pub fn launch_group<Op: DeviceOp>(ops: &[Op]) -> Result<(), LaunchError> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    let own = first.ordinal();
    if !policy::settings().launch_helpers
        || ops.iter().all(|op| op.ordinal() == own)
        || ops.iter().any(DeviceOp::callers_thread_only)
    {
        return launch_here(ops, |_| true);
    }
    // The helper each device's job was posted to, and its generation.
    let mut posted: [Option<(&Helper, u64)>; MAX_DEVICES] = [None; MAX_DEVICES];
    for (i, op) in ops.iter().enumerate() {
        let ordinal = op.ordinal();
        let first_of_device = !ops[..i].iter().any(|o| o.ordinal() == ordinal);
        if ordinal == own || !first_of_device {
            continue;
        }
        if let Some(helper) = helper(op)
            && let Some(generation) = helper.post(Job::new(ops, ordinal))
        {
            // `helper` exists only for ordinals below MAX_DEVICES.
            posted[ordinal as usize] = Some((helper, generation));
        }
    }
    let is_posted = |ordinal: i32| {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| posted.get(o))
            .is_some_and(Option::is_some)
    };
    // Ours, and those of devices without a helper, in turn. Not even a panic may skip waiting for
    // the posted jobs below.
    let mut result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        launch_here(ops, |ordinal| !is_posted(ordinal))
    }))
    .unwrap_or_else(|_| Err((own, CudaError::panicked())));
    // Every posted job completes before we return, error or not: the helpers read our queue.
    for &(helper, generation) in posted.iter().flatten() {
        let done = helper.complete(generation);
        if result.is_ok() {
            result = done;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    /// A launch of the fake operation: its device, its number in the group, the thread.
    type Record = (i32, usize, ThreadId);

    /// An operation that takes a while to "launch" and records who launched it.
    struct FakeOp {
        ordinal: i32,
        id: usize,
        comm: usize,
        fails: bool,
        panics: bool,
        callers: bool,
        log: Arc<Mutex<Vec<Record>>>,
    }

    impl DeviceOp for FakeOp {
        fn ordinal(&self) -> i32 {
            self.ordinal
        }
        fn comm(&self) -> usize {
            self.comm
        }
        fn launch(&self) -> Result<(), CudaError> {
            let until = Instant::now() + Duration::from_micros(5);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            self.log
                .lock()
                .unwrap()
                .push((self.ordinal, self.id, std::thread::current().id()));
            if self.fails {
                return Err(CudaError::panicked());
            }
            assert!(!self.panics, "a launch panicked");
            Ok(())
        }
        fn prepare_thread(&self) -> impl FnOnce() + Send + 'static {
            || {}
        }
        fn callers_thread_only(&self) -> bool {
            self.callers
        }
    }

    fn group(ordinals: &[i32], log: &Arc<Mutex<Vec<Record>>>) -> Vec<FakeOp> {
        ordinals
            .iter()
            .enumerate()
            .map(|(id, &ordinal)| FakeOp {
                ordinal,
                id,
                comm: id,
                fails: false,
                panics: false,
                callers: false,
                log: log.clone(),
            })
            .collect()
    }

    /// Every operation launched once before `launch_group` returned, each device's in queue
    /// order; returns how many were launched by another thread than the caller.
    fn check_group(ops: &[FakeOp], log: &Arc<Mutex<Vec<Record>>>) -> usize {
        let launched = std::mem::take(&mut *log.lock().unwrap());
        let mut ids: Vec<usize> = launched.iter().map(|r| r.1).collect();
        ids.sort();
        assert_eq!(ids, (0..ops.len()).collect::<Vec<_>>(), "each op once");
        for ordinal in 0..8 {
            let order: Vec<usize> = launched
                .iter()
                .filter(|r| r.0 == ordinal)
                .map(|r| r.1)
                .collect();
            assert!(
                order.is_sorted(),
                "device {ordinal} out of order: {order:?}"
            );
        }
        let me = std::thread::current().id();
        launched.iter().filter(|r| r.2 != me).count()
    }

    #[test]
    fn every_operation_is_launched_once_in_order_before_the_group_returns() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut by_helpers = 0;
        for round in 0..2000 {
            let ops = group(&[0, 1, 2, 3, 1, 0, 3, 3, 2][..5 + round % 5], &log);
            launch_group(&ops).unwrap();
            by_helpers += check_group(&ops, &log);
        }
        assert!(by_helpers > 0, "the helpers never launched anything");
    }

    /// A group one of whose streams is the calling thread's own (`cudaStreamPerThread`) is
    /// launched by the calling thread alone.
    #[test]
    fn a_group_on_the_callers_own_stream_is_launched_by_the_caller() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut by_helpers = 0;
        for _ in 0..200 {
            let mut ops = group(&[0, 1, 2, 3], &log);
            ops[2].callers = true;
            launch_group(&ops).unwrap();
            by_helpers += check_group(&ops, &log);
        }
        assert_eq!(
            by_helpers, 0,
            "a helper launched on another thread's stream"
        );
    }

    #[test]
    fn a_failed_launch_holds_back_only_its_own_communicators_later_calls() {
        let log = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..200 {
            let mut ops = group(&[4, 5, 6, 5, 5], &log);
            ops[1].fails = true;
            ops[3].comm = ops[1].comm;
            let error = launch_group(&ops).unwrap_err();
            assert_eq!(error.0, 5);
            let launched = std::mem::take(&mut *log.lock().unwrap());
            let ids: Vec<usize> = launched.iter().map(|r| r.1).collect();
            // Device 5 skips the later op of the failed one's communicator, not another's;
            // devices 4 and 6 launch theirs.
            assert!(ids.contains(&0) && ids.contains(&1) && ids.contains(&2));
            assert!(
                !ids.contains(&3),
                "its communicator went on after its failure"
            );
            assert!(
                ids.contains(&4),
                "another communicator's call was held back"
            );
        }
        let ops = group(&[4, 5, 6], &log);
        launch_group(&ops).unwrap();
        check_group(&ops, &log);
    }

    #[test]
    fn a_launch_that_panics_holds_back_only_its_own_communicators_later_calls() {
        let log = Arc::new(Mutex::new(Vec::new()));
        // All on the caller's device, then on a helper's after the caller's own.
        for devices in [[5, 5, 5, 5], [4, 5, 5, 5]] {
            let mut ops = group(&devices, &log);
            ops[1].panics = true;
            ops[3].comm = ops[1].comm;
            let error = launch_group(&ops).unwrap_err();
            assert_eq!((error.0, error.1.error.as_str()), (5, "panicked"));
            let launched = std::mem::take(&mut *log.lock().unwrap());
            let ids: Vec<usize> = launched.iter().map(|r| r.1).collect();
            // The call after the panicking one, of another communicator, is launched.
            assert!(ids.contains(&0) && ids.contains(&2), "{ids:?}");
            assert!(
                !ids.contains(&3),
                "its communicator went on after its panic"
            );
        }
    }

    #[test]
    fn callers_sharing_devices_never_lose_an_operation() {
        let callers: Vec<_> = (0..4)
            .map(|caller| {
                std::thread::spawn(move || {
                    let log = Arc::new(Mutex::new(Vec::new()));
                    for _ in 0..500 {
                        // Different first devices: each caller's own device is another's helper.
                        let ordinals: Vec<i32> = (0..4).map(|d| (d + caller) % 4).collect();
                        let ops = group(&ordinals, &log);
                        launch_group(&ops).unwrap();
                        check_group(&ops, &log);
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
    }
}
