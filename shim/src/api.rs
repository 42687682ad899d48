//! The NCCL API of the spec chosen at build time: its types (`ffi`), the forwarders to the real
//! NCCL (`real`), the `Route` trait and the C exports, all generated from the spec.

ncclshim_macros::nccl_api!(
    specs_env = "NCCLSHIM_SPECS",
    router = crate::route::Router,
    runtime = crate::runtime,
);
