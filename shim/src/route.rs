//! Which NCCL functions ncclshim serves itself. Every function not claimed here forwards to the
//! real NCCL (the `Route` trait's defaults, generated from the spec).

use std::ffi::c_char;

use crate::api::ffi::*;
use crate::api::{Route, real, real_functions};
use crate::{error_strings, runtime};

pub struct Router;

impl Route for Router {
    /// Answers even with no real NCCL.
    unsafe fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
        match real_functions().and_then(|table| table.ncclGetErrorString) {
            // SAFETY: the real NCCL's own function; any result code is a valid argument.
            Some(function) => unsafe { function(result) },
            None => error_strings::describe(result),
        }
    }

    /// Our own errors (a function the real NCCL lacks, no real NCCL) come first while they are
    /// the newest; otherwise the real NCCL's.
    unsafe fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
        if let Some(message) = runtime::shim_last_error() {
            return message;
        }
        match real_functions().and_then(|table| table.ncclGetLastError) {
            // SAFETY: the caller's handle goes unchanged to the real NCCL, which owns it.
            Some(_) => unsafe { real::ncclGetLastError(comm) },
            None => c"".as_ptr(),
        }
    }
}
