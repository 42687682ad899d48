//! Nonblocking communicators waiting for their core. Their creation returns before the real
//! NCCL is ready, and the set-up's exchange is an operation on the communicator, which NCCL
//! refuses until the previous one has settled. So the core is set up right after the first
//! all-reduce each rank issues on it, which goes to NCCL: that point in the sequence of
//! operations on the communicator is the same on every rank, whatever the timing.
//! All-reduces on other communicators check one atomic, and while any waits, its slots.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::api::ffi::ncclComm_t;
use crate::log::log_info;

/// Communicators that can wait at once; past that, new ones stay with NCCL.
const SLOTS: usize = 64;

/// Handles of the communicators waiting, 0 in free slots: checked without a lock by every
/// all-reduce while any waits.
static WAITING: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// `comm` gets its core after its first all-reduce.
pub fn insert(comm: ncclComm_t) {
    let handle = comm as usize;
    if handle == 0
        || WAITING
            .iter()
            .any(|slot| slot.load(Ordering::Acquire) == handle)
    {
        return;
    }
    let claimed = WAITING.iter().any(|slot| {
        slot.compare_exchange(0, handle, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if claimed {
        COUNT.fetch_add(1, Ordering::Release);
    } else {
        log_info!("core off for comm {comm:p}: {SLOTS} nonblocking communicators wait already");
    }
}

/// Whether `comm` was waiting for its first all-reduce; it no longer is.
#[inline]
pub fn take(comm: ncclComm_t) -> bool {
    let handle = comm as usize;
    // 0 marks free slots, and NULL is no communicator.
    if COUNT.load(Ordering::Acquire) == 0 || handle == 0 {
        return false;
    }
    let taken = WAITING.iter().any(|slot| {
        slot.compare_exchange(handle, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if taken {
        COUNT.fetch_sub(1, Ordering::Release);
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_communicator_is_taken_once() {
        let (a, b) = (0x1000 as ncclComm_t, 0x2000 as ncclComm_t);
        insert(a);
        insert(a);
        insert(std::ptr::null_mut());
        assert!(!take(b), "never inserted");
        assert!(!take(std::ptr::null_mut()), "NULL is no communicator");
        assert!(take(a));
        assert!(!take(a), "taken already");
    }
}
