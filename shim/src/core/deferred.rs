//! Nonblocking communicators waiting for their core. Their creation returns before the real
//! NCCL is ready, and the set-up's exchange is an operation on the communicator, which NCCL
//! refuses until the previous one has settled. So the core is set up right after the first
//! all-reduce each rank issues on it, which goes to NCCL: that point in the sequence of
//! operations on the communicator is the same on every rank, whatever the timing.
//! All-reduces on other communicators check one atomic, and while any waits, its slots (a lock
//! only past 64 waiting at once).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::api::ffi::ncclComm_t;

/// Communicators that can wait in slots, checked without a lock; more wait in `OVERFLOW`.
const SLOTS: usize = 64;

/// Handles of the communicators waiting, 0 in free slots.
static WAITING: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Past the slots: never refused, since a rank that set nothing up would leave its peers
/// waiting in the exchange.
static OVERFLOW: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Communicators waiting, in slots and in `OVERFLOW`.
static COUNT: AtomicUsize = AtomicUsize::new(0);
static OVERFLOWING: AtomicUsize = AtomicUsize::new(0);

/// `comm` gets its core after its first all-reduce.
pub fn insert(comm: ncclComm_t) {
    let handle = comm as usize;
    if handle == 0 || waits(handle) {
        return;
    }
    let claimed = WAITING.iter().any(|slot| {
        slot.compare_exchange(0, handle, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if !claimed {
        OVERFLOW
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
        OVERFLOWING.fetch_add(1, Ordering::Release);
    }
    COUNT.fetch_add(1, Ordering::Release);
}

fn waits(handle: usize) -> bool {
    WAITING
        .iter()
        .any(|slot| slot.load(Ordering::Acquire) == handle)
        || (OVERFLOWING.load(Ordering::Acquire) > 0
            && OVERFLOW
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&handle))
}

/// Whether `comm` was waiting for its first all-reduce; it no longer is.
#[inline]
pub fn take(comm: ncclComm_t) -> bool {
    let handle = comm as usize;
    // 0 marks free slots, and NULL is no communicator.
    if COUNT.load(Ordering::Acquire) == 0 || handle == 0 {
        return false;
    }
    let mut taken = WAITING.iter().any(|slot| {
        slot.compare_exchange(handle, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if !taken && OVERFLOWING.load(Ordering::Acquire) > 0 {
        let mut overflow = OVERFLOW.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = overflow.iter().position(|&h| h == handle) {
            overflow.swap_remove(at);
            OVERFLOWING.fetch_sub(1, Ordering::Release);
            taken = true;
        }
    }
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

    #[test]
    fn more_than_the_slots_all_wait() {
        let comms: Vec<ncclComm_t> = (1..=SLOTS + 3)
            .map(|i| (0x10_0000 + 16 * i) as ncclComm_t)
            .collect();
        comms.iter().for_each(|&c| insert(c));
        // Taken in reverse: the overflow's first, then the slots'.
        assert!(comms.iter().rev().all(|&c| take(c)));
        assert!(comms.iter().all(|&c| !take(c)));
    }
}
