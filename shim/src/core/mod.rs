//! The core: ncclshim's own all-reduce over NVLink, for communicators whose ranks are all on
//! this host with peer access between every pair of GPUs. Set up when a communicator is created
//! (`setup`), kept in a side table keyed by the handle (`table`), chosen per call by a policy
//! that every rank computes alike (`policy`), launched on the caller's stream (`comm`), with
//! kernels compiled at run time by NVRTC (`kernels`, `all_reduce.cu`).

mod comm;
mod cuda;
mod group;
pub mod kernels;
mod launcher;
mod nvrtc;
pub mod policy;
mod setup;
mod table;
pub mod types;

use std::ffi::c_void;

use crate::api::ffi::{
    cudaStream_t, ncclComm_t, ncclResult_t, ncclSuccess, ncclUnhandledCudaError,
};
use crate::log::log_warn;

/// Makes NVRTC loadable (for the core, and for tests that compile its kernels).
pub fn nvrtc_load() -> Result<(), String> {
    nvrtc::load()
}

/// A communicator (or several, from one call such as ncclCommInitAll) was created: set up its
/// core now, or at the end of the group it was created in.
pub fn created(comms: &[ncclComm_t]) {
    let comms: Vec<ncclComm_t> = comms.iter().copied().filter(|c| !c.is_null()).collect();
    if group::inside() {
        comms.into_iter().for_each(group::defer_setup);
    } else {
        setup::set_up(&comms);
    }
}

pub fn group_start() {
    group::start();
}

/// After the real ncclGroupEnd returned `result`: at the outermost level, set up the
/// communicators created in the group and launch the core operations queued in it.
pub fn group_end(result: ncclResult_t) -> ncclResult_t {
    let Some(new_comms) = group::end() else {
        return result;
    };
    if result != ncclSuccess {
        group::discard_queued();
        return result;
    }
    if !new_comms.is_empty() {
        setup::set_up(&new_comms);
    }
    match group::drain_queued(launcher::launch_group) {
        Ok(()) => result,
        Err((ordinal, e)) => {
            log_warn!("all-reduce on GPU {ordinal} could not be launched: {e}");
            ncclUnhandledCudaError
        }
    }
}

/// The core's all-reduce, if it takes this one; `None` leaves it to the real NCCL.
pub fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    op: u32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Option<ncclResult_t> {
    let core = table::get(comm)?;
    // Bad pointers are for the real NCCL to report, as it reports them.
    if send.is_null() || recv.is_null() {
        return None;
    }
    let plan = policy::plan_all_reduce(policy::settings(), count, dtype, op, &core.facts)?;
    let stream = stream as cuda::Stream;
    if group::inside() {
        group::queue(group::Queued {
            core,
            plan,
            send,
            recv,
            count,
            stream,
        });
        return Some(ncclSuccess);
    }
    Some(
        match core.launch_all_reduce(&plan, send, recv, count, stream) {
            Ok(()) => ncclSuccess,
            Err(e) => {
                log_warn!(
                    "all-reduce on GPU {} could not be launched: {e}",
                    core.device.ordinal
                );
                ncclUnhandledCudaError
            }
        },
    )
}

/// The communicator is going away (ncclCommDestroy, or ncclCommAbort with `abort`): release its
/// core, never hanging.
pub fn destroyed(comm: ncclComm_t, abort: bool) {
    if let Some(core) = table::remove(comm) {
        match std::sync::Arc::into_inner(core) {
            Some(core) => core.release(abort),
            // Still used by another thread's call: leave its memory rather than pull it away.
            None => log_warn!("comm {comm:p} destroyed while in use: its core buffers are kept"),
        }
    }
}
