//! NCCL's groups as the core sees them, per thread: communicators created inside a group (split
//! and shrunk children included, whose handles NCCL writes only there), and nonblocking ones
//! whose first all-reduce is in it (table.rs), are set up at the outermost ncclGroupEnd
//! (once the real NCCL has initialised them), and core calls issued inside a
//! group are launched there, on every rank on the same side of the real NCCL's own operations
//! (NCCL promises no order inside a group; see `core::group_end`).

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::Arc;

use super::comm::CoreComm;
use super::cuda::{Cuda, Stream};
use super::launcher::DeviceOp;
use super::policy::Plan;
use crate::api::ffi::ncclComm_t;

pub struct Queued {
    pub core: Arc<CoreComm>,
    pub plan: Plan,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub stream: Stream,
    /// Whether `stream` was being captured into a CUDA graph when the call was made.
    pub captured: bool,
}

impl DeviceOp for Queued {
    fn ordinal(&self) -> i32 {
        self.core.device.ordinal
    }

    fn launch(&self) -> Cuda<()> {
        self.core
            .launch(&self.plan, self.send, self.recv, self.stream)
    }

    fn prepare_thread(&self) -> impl FnOnce() + Send + 'static {
        let device = self.core.device;
        // The helper's own context is the device's: its launches need no switch.
        move || {
            let _ = device.make_current();
        }
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
    pub slot: *mut ncclComm_t,
    pub blocking: bool,
}

/// What the outermost group's end hands back: communicators to set up, and children whose
/// handles are to be read once the real ncclGroupEnd has returned.
pub struct Ended {
    pub new_comms: Vec<Deferred>,
    pub children: Vec<Child>,
}

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static NEW_COMMS: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
    static CHILDREN: RefCell<Vec<Child>> = const { RefCell::new(Vec::new()) };
    static QUEUED: RefCell<Vec<Queued>> = const { RefCell::new(Vec::new()) };
    /// A call of the group was refused (see `queue`): nothing of it is launched.
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

pub fn inside() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// Whether the next `end` leaves the outermost group.
pub fn ending_outermost() -> bool {
    DEPTH.with(Cell::get) == 1
}

pub fn start() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// Leaves one group level; at the outermost, hands back the communicators to set up (their
/// queued operations wait for `drain_queued`).
pub fn end() -> Option<Ended> {
    let depth = DEPTH.with(|d| {
        let depth = d.get().saturating_sub(1);
        d.set(depth);
        depth
    });
    (depth == 0).then(|| Ended {
        new_comms: NEW_COMMS.with(|c| c.take()),
        children: CHILDREN.with(|c| c.take()),
    })
}

/// Hands the operations queued in the group to `f` and empties the queue (keeping its memory
/// for the next group).
pub fn drain_queued<T>(f: impl FnOnce(&[Queued]) -> T) -> T {
    QUEUED.with(|q| {
        let mut queued = q.borrow_mut();
        let result = f(&queued);
        queued.clear();
        result
    })
}

/// Forgets the operations queued in the group (it failed: none of them is launched).
pub fn discard_queued() {
    QUEUED.with(|q| q.borrow_mut().clear());
}

/// Whether a call of the outermost group was refused; the group is clean again after.
pub fn take_failed() -> bool {
    FAILED.with(|f| f.replace(false))
}

/// Whether an operation queued in the group is on a nonblocking communicator (NCCL allows no
/// group of both kinds).
pub fn queued_nonblocking() -> bool {
    QUEUED.with(|q| q.borrow().iter().any(|op| !op.core.blocking))
}

/// Whether `call` (communicator, captured) joins calls of its communicator, among `earlier`,
/// whose streams were captured where its own is not, or the other way round.
fn mixes_capture(mut earlier: impl Iterator<Item = (usize, bool)>, call: (usize, bool)) -> bool {
    earlier.any(|(comm, captured)| comm == call.0 && captured != call.1)
}

pub fn defer_setup(comm: ncclComm_t, blocking: bool) {
    NEW_COMMS.with(|c| c.borrow_mut().push(Deferred { comm, blocking }));
}

pub fn defer_child(slot: *mut ncclComm_t, blocking: bool) {
    CHILDREN.with(|c| c.borrow_mut().push(Child { slot, blocking }));
}

/// Queues `op` for the group's end, unless its communicator's operations queued before are on
/// streams captured where its stream is not, or the other way round: NCCL refuses that (all
/// uncaptured or all captured, ncclInvalidUsage, and the whole group fails), and so do we.
/// (NCCL also tells two capturing graphs apart; the core sees only whether a stream captures.)
pub fn queue(op: Queued) -> Result<(), ()> {
    QUEUED.with(|q| {
        let mut queued = q.borrow_mut();
        let earlier = queued
            .iter()
            .map(|o| (Arc::as_ptr(&o.core) as usize, o.captured));
        if mixes_capture(earlier, (Arc::as_ptr(&op.core) as usize, op.captured)) {
            FAILED.with(|f| f.set(true));
            return Err(());
        }
        queued.push(op);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
