//! What the core tells whoever keeps the record of calls (the shim's `calls`): the core names no
//! layer above it, so that layer hands it an `Observer` once, at load.

use std::sync::OnceLock;

use super::cuda::Stopwatch;
use super::types::Algorithm;
use crate::ffi::ncclComm_t;

/// The events of the core a record of calls wants; each a cheap note on the caller's thread.
pub trait Observer: Sync {
    /// Whether calls should say if they are captured in a CUDA graph (asked of the driver).
    fn wants_capture_state(&self) -> bool;
    /// Whether the core should time its kernels with events.
    fn wants_timing(&self) -> bool;
    /// The core ran (or queued) this thread's current call with `algorithm`.
    fn ran_on_core(&self, algorithm: Algorithm, captured: Option<bool>);
    /// The core timed this thread's current call with `watch` (its events now the observer's).
    fn timed(&self, watch: Stopwatch);
    /// `calls` queued calls of `comm` went out in one launch.
    fn shared_launch(&self, comm: ncclComm_t, calls: usize);
    /// A call of `comm` queued for the core went to NCCL with the rest of its group.
    fn sent_with_group(&self, comm: ncclComm_t);
    /// The set-up decided whether the core serves `comm` (rank `rank` of `nranks` on `device`).
    fn core_decided(&self, comm: ncclComm_t, on: bool, rank: i32, nranks: i32, device: i32);
    /// A wait of the core on `comm` gave up: the last calls are wanted in the log.
    fn dump(&self, comm: ncclComm_t, why: &str);
}

static OBSERVER: OnceLock<&'static dyn Observer> = OnceLock::new();

/// Hands the core its observer; the first one given stays.
pub fn set_observer(observer: &'static dyn Observer) {
    let _ = OBSERVER.set(observer);
}

/// The observer, or one that wants nothing where none was given (the core's own tests).
pub(super) fn observer() -> &'static dyn Observer {
    OBSERVER.get().copied().unwrap_or(&Unobserved)
}

struct Unobserved;

impl Observer for Unobserved {
    fn wants_capture_state(&self) -> bool {
        false
    }
    fn wants_timing(&self) -> bool {
        false
    }
    fn ran_on_core(&self, _: Algorithm, _: Option<bool>) {}
    fn timed(&self, watch: Stopwatch) {
        watch.discard();
    }
    fn shared_launch(&self, _: ncclComm_t, _: usize) {}
    fn sent_with_group(&self, _: ncclComm_t) {}
    fn core_decided(&self, _: ncclComm_t, _: bool, _: i32, _: i32, _: i32) {}
    fn dump(&self, _: ncclComm_t, _: &str) {}
}
