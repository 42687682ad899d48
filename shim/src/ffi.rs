//! The NCCL API of the spec chosen at build time: its types and constants, the version whose ABI
//! this library exports, its functions, and `if_exported!`. The bottom layer: names nothing else.

ncclshim_macros::nccl_ffi!(specs_env = "NCCLSHIM_SPECS");
