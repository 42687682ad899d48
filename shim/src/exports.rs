//! The C exports `ncclX` and `pncclX` of every function of the spec: the top layer. Each enters
//! the reentrancy guard, calls the router's method (or, nested inside the shim, the real NCCL's
//! function), describes every operation on a stream to the recorder and stops any panic.

ncclshim_macros::nccl_exports!(
    specs_env = "NCCLSHIM_SPECS",
    ffi = crate::ffi,
    call = crate::call::Call,
    real = crate::real,
    router = crate::route::Router,
    runtime = crate::runtime,
    recorder = crate::calls,
);
