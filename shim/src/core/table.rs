//! The side table, keyed by the real NCCL's handle: every communicator the core knows of, with
//! its core where it has one. A communicator is known from the moment the shim sees it made
//! (or, made where the shim could not see its handle, from its first all-reduce), so that each
//! gets one set-up only. Calls on unknown handles while none is known check one atomic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::comm::CoreComm;
use crate::api::ffi::ncclComm_t;

/// A communicator's entry: its core, if it has one (none: not set up yet, or left to NCCL).
struct Entry {
    core: Option<Arc<CoreComm>>,
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
    /// Never seen made.
    Unknown,
}

fn with_table<T>(f: impl FnOnce(&mut HashMap<usize, Entry>) -> T) -> T {
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    f(table.get_or_insert_with(HashMap::new))
}

/// Records `comm` as known, without a core unless it has one already; whether it was unknown.
pub fn know(comm: ncclComm_t, blocking: bool) -> bool {
    with_table(|table| {
        let unknown = !table.contains_key(&(comm as usize));
        if unknown {
            table.insert(
                comm as usize,
                Entry {
                    core: None,
                    blocking,
                },
            );
            ENTRIES.fetch_add(1, Ordering::Release);
        }
        unknown
    })
}

pub fn insert(comm: ncclComm_t, core: Arc<CoreComm>) {
    with_table(|table| {
        let blocking = core.blocking;
        let entry = table.entry(comm as usize).or_insert_with(|| {
            ENTRIES.fetch_add(1, Ordering::Release);
            Entry {
                core: None,
                blocking,
            }
        });
        entry.core = Some(core);
    })
}

#[inline]
pub fn lookup(comm: ncclComm_t) -> Lookup {
    if ENTRIES.load(Ordering::Acquire) == 0 {
        return Lookup::Unknown;
    }
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    match table.as_ref().and_then(|t| t.get(&(comm as usize))) {
        Some(Entry {
            core: Some(core), ..
        }) => Lookup::Core(core.clone()),
        Some(Entry { core: None, .. }) => Lookup::NoCore,
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

/// Forgets `comm`; its core, if it had one.
pub fn remove(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let removed = table.remove(&(comm as usize))?;
        ENTRIES.fetch_sub(1, Ordering::Release);
        removed.core
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
}
