//! The side table, keyed by the real NCCL's handle: every communicator the core knows of, and
//! where its core stands. A communicator is known from the moment the shim sees it made (or,
//! made where the shim could not see its handle, from its first all-reduce), so that each gets
//! one set-up only. Nonblocking ones wait for their first all-reduce: their creation returns
//! before the real NCCL is ready, and the set-up's exchange is an operation on the
//! communicator, which NCCL refuses until the previous one has settled; that first all-reduce
//! is the same point in every rank's sequence of operations, whatever the timing. Calls on
//! unknown handles while none is known check one atomic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::comm::CoreComm;
use crate::api::ffi::ncclComm_t;

/// Where a known communicator's core stands.
enum State {
    /// Set up after its first all-reduce (nonblocking).
    Waiting,
    /// Not set up yet, or left to NCCL.
    NoCore,
    Core(Arc<CoreComm>),
}

struct Entry {
    state: State,
    /// Made blocking, as far as the shim knows (a communicator it never saw made: no).
    blocking: bool,
}

static TABLE: RwLock<Option<HashMap<usize, Entry>>> = RwLock::new(None);
static ENTRIES: AtomicUsize = AtomicUsize::new(0);

/// What the table says of a handle.
pub enum Lookup {
    Core(Arc<CoreComm>),
    /// Known, without a core: its calls go to NCCL.
    NoCore,
    /// Waiting for its first all-reduce.
    Waiting,
    /// Never seen made.
    Unknown,
}

fn with_table<T>(f: impl FnOnce(&mut HashMap<usize, Entry>) -> T) -> T {
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    f(table.get_or_insert_with(HashMap::new))
}

/// Records `comm`, if unknown, in `state`; whether it was unknown.
fn add(comm: ncclComm_t, state: State, blocking: bool) -> bool {
    with_table(|table| {
        let unknown = !table.contains_key(&(comm as usize));
        if unknown {
            table.insert(comm as usize, Entry { state, blocking });
            ENTRIES.fetch_add(1, Ordering::Release);
        }
        unknown
    })
}

/// Records `comm` as known, without a core unless it has one already; whether it was unknown.
pub fn know(comm: ncclComm_t, blocking: bool) -> bool {
    add(comm, State::NoCore, blocking)
}

/// Records the nonblocking `comm` as waiting for its first all-reduce (NULL is no
/// communicator).
pub fn wait(comm: ncclComm_t) {
    if !comm.is_null() {
        add(comm, State::Waiting, false);
    }
}

/// Whether `comm` was waiting for its first all-reduce; it no longer is.
pub fn stop_waiting(comm: ncclComm_t) -> bool {
    with_table(|table| match table.get_mut(&(comm as usize)) {
        Some(entry) if matches!(entry.state, State::Waiting) => {
            entry.state = State::NoCore;
            true
        }
        _ => false,
    })
}

pub fn insert(comm: ncclComm_t, core: Arc<CoreComm>) {
    with_table(|table| {
        let blocking = core.blocking;
        let entry = table.entry(comm as usize).or_insert_with(|| {
            ENTRIES.fetch_add(1, Ordering::Release);
            Entry {
                state: State::NoCore,
                blocking,
            }
        });
        entry.state = State::Core(core);
    });
    super::watch::start();
}

#[inline]
pub fn lookup(comm: ncclComm_t) -> Lookup {
    if ENTRIES.load(Ordering::Acquire) == 0 {
        return Lookup::Unknown;
    }
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    match table.as_ref().and_then(|t| t.get(&(comm as usize))) {
        Some(entry) => match &entry.state {
            State::Core(core) => Lookup::Core(core.clone()),
            State::NoCore => Lookup::NoCore,
            State::Waiting => Lookup::Waiting,
        },
        None => Lookup::Unknown,
    }
}

/// Whether `comm` is known to have been made blocking.
pub fn blocking(comm: ncclComm_t) -> bool {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table
        .as_ref()
        .and_then(|t| t.get(&(comm as usize)))
        .is_some_and(|entry| entry.blocking)
}

/// Forgets `comm` (its handle may come back for another communicator); its core, if it had one.
/// Takes `comm`'s core away, if it has one, and keeps it known without one (its calls go to
/// NCCL).
pub fn drop_core(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let entry = table.get_mut(&(comm as usize))?;
        match std::mem::replace(&mut entry.state, State::NoCore) {
            State::Core(core) => Some(core),
            other => {
                entry.state = other;
                None
            }
        }
    })
}

/// Every communicator with a core, for the watcher (watch.rs).
pub fn cores() -> Vec<(ncclComm_t, Arc<CoreComm>)> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let entries = table.iter().flat_map(|t| t.iter());
    entries
        .filter_map(|(&comm, entry)| match &entry.state {
            State::Core(core) => Some((comm as ncclComm_t, core.clone())),
            _ => None,
        })
        .collect()
}

pub fn remove(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let removed = table.remove(&(comm as usize))?;
        ENTRIES.fetch_sub(1, Ordering::Release);
        match removed.state {
            State::Core(core) => Some(core),
            State::Waiting | State::NoCore => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_communicator_is_known_once_until_removed() {
        let comm = 0x6000_0040 as ncclComm_t;
        assert!(matches!(lookup(comm), Lookup::Unknown));
        assert!(know(comm, true), "first seen");
        assert!(!know(comm, false), "seen already");
        assert!(matches!(lookup(comm), Lookup::NoCore));
        assert!(blocking(comm), "as first seen");
        assert!(remove(comm).is_none(), "it had no core");
        assert!(matches!(lookup(comm), Lookup::Unknown));
        assert!(!blocking(comm), "not known");
        assert!(know(comm, false), "a new communicator at the same address");
        assert!(!blocking(comm));
        remove(comm);
    }

    #[test]
    fn a_communicator_is_taken_once() {
        let (a, b) = (0x1000 as ncclComm_t, 0x2000 as ncclComm_t);
        wait(a);
        wait(a);
        wait(std::ptr::null_mut());
        assert!(!stop_waiting(b), "never inserted");
        assert!(
            !stop_waiting(std::ptr::null_mut()),
            "NULL is no communicator"
        );
        assert!(matches!(lookup(a), Lookup::Waiting));
        assert!(stop_waiting(a));
        assert!(!stop_waiting(a), "taken already");
        assert!(matches!(lookup(a), Lookup::NoCore), "known, without a core");
        remove(a);
    }

    #[test]
    fn many_wait_at_once() {
        let comms: Vec<ncclComm_t> = (1..=67)
            .map(|i| (0x10_0000 + 16 * i) as ncclComm_t)
            .collect();
        comms.iter().for_each(|&c| wait(c));
        assert!(comms.iter().rev().all(|&c| stop_waiting(c)));
        assert!(comms.iter().all(|&c| !stop_waiting(c)));
        comms.iter().for_each(|&c| {
            remove(c);
        });
    }
}
