//! One call of an operation on a communicator's stream (a collective, a send, a receive), as its
//! export describes it from the spec's parameters: the one description the router, the core (its
//! plan, a group's queue) and the record of calls all read.

use std::ffi::c_void;

use crate::ffi::{cudaStream_t, ncclComm_t};

#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The function called: its index in `ffi::OPERATIONS`.
    pub kind: u8,
    pub comm: ncclComm_t,
    /// The buffer read; NULL where the operation has none (a receive).
    pub send: *const c_void,
    /// The buffer written; NULL where the operation has none (a send). An in-place broadcast's
    /// one buffer is both.
    pub recv: *mut c_void,
    /// Elements, as the API takes them: each rank's chunk where there is one.
    pub count: usize,
    /// NCCL's `ncclDataType_t`.
    pub datatype: u32,
    /// NCCL's `ncclRedOp_t`, for operations that reduce.
    pub op: Option<u32>,
    /// The root of a rooted collective, or the peer of a send or receive.
    pub root: Option<i32>,
    pub stream: cudaStream_t,
}
