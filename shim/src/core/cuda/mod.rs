//! The CUDA driver calls the core makes, each wrapped into a `Result` with the call named in the
//! error (`error`), by what they are about: a GPU and its contexts (`device`), memory
//! (`memory`), memory shared between processes (`sharing`), the kernels' host control block
//! (`host_control`), streams and events (`stream`), kernels (`module`), kernels launched through
//! a graph (`graph`), releasing resources away from a thread that must not wait for the GPU
//! (`release`). cudarc's `result` layer where it has the call; raw `sys` calls (IPC, peer
//! access, host-mapped memory, context push/pop) only here.

mod device;
mod error;
mod graph;
mod handles;
mod host_control;
mod memory;
mod module;
mod release;
mod sharing;
mod stream;

pub use device::*;
pub use error::{Cuda, CudaError};
pub use graph::KernelGraph;
pub use handles::*;
pub use host_control::*;
pub use memory::*;
pub use module::*;
pub use release::release_later;
pub use sharing::*;
pub use stream::*;

use std::ffi::c_int;

use cudarc::driver::{result, sys};
use error::{Named, check};

/// Whether libcuda can be loaded at all (cudarc panics on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { sys::is_culib_present() }
}

pub fn init() -> Cuda<()> {
    result::init().named("cuInit")
}

/// The driver's CUDA version, e.g. 13000 for 13.0.
pub fn driver_version() -> Cuda<i32> {
    let mut version: c_int = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    Ok(version)
}
