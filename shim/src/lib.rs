//! ncclshim: a drop-in `libnccl.so.2`. Every NCCL function is exported with NVIDIA's exact C
//! signature (generated from `spec/`); each call is routed to our own code where `route` claims
//! it, and forwarded to the real NCCL, loaded at first use, everywhere else.

mod call;
mod calls;
pub mod core;
mod error_strings;
mod exports;
pub mod ffi;
pub mod identity;
pub mod locate;
mod log;
pub mod nccl_env;
mod real;
mod real_nccl;
mod route;
pub mod runtime;
pub mod variables;

/// NCCL's version code as "major.minor.patch" (for the `ncclshim` command as for our log).
pub use real_nccl::version_text;
