//! The real NCCL's functions, each looked up once: a typed forwarder per function (the stub
//! answering where the real library lacks it) and the `Route` trait, whose every method forwards
//! unless the router claims it. Generated from the spec.

ncclshim_macros::nccl_real!(
    specs_env = "NCCLSHIM_SPECS",
    ffi = crate::ffi,
    call = crate::call::Call,
    runtime = crate::runtime,
);
