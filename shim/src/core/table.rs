//! The side table: the core of each communicator it serves, keyed by the real NCCL's handle.
//! Calls on communicators without a core check one atomic and go on to NCCL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::comm::CoreComm;
use crate::api::ffi::ncclComm_t;

static TABLE: RwLock<Option<HashMap<usize, Arc<CoreComm>>>> = RwLock::new(None);
static ENTRIES: AtomicUsize = AtomicUsize::new(0);

pub fn insert(comm: ncclComm_t, core: Arc<CoreComm>) {
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    if table
        .get_or_insert_with(HashMap::new)
        .insert(comm as usize, core)
        .is_none()
    {
        ENTRIES.fetch_add(1, Ordering::Release);
    }
}

#[inline]
pub fn get(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    if ENTRIES.load(Ordering::Acquire) == 0 {
        return None;
    }
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table.as_ref()?.get(&(comm as usize)).cloned()
}

pub fn remove(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let removed = table.as_mut()?.remove(&(comm as usize));
    if removed.is_some() {
        ENTRIES.fetch_sub(1, Ordering::Release);
    }
    removed
}
