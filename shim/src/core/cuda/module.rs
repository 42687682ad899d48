//! Kernels: modules loaded from cubins or PTX, their functions, and launches.

use std::ffi::c_void;

use super::error::{Cuda, Named, check};
use super::handles::{Function, Module, Stream};
use cudarc::driver::{result, sys};

/// Loads a cubin, or NUL-terminated PTX (which the driver compiles for the device).
pub fn load_module(image: &[u8]) -> Cuda<Module> {
    // SAFETY: an image NVRTC made (a cubin for this device's architecture, or its PTX, which
    // ends in NUL); cuModuleLoadData copies it.
    unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }.named("cuModuleLoadData")
}

pub fn get_function(module: Module, name: &str) -> Cuda<Function> {
    let name = std::ffi::CString::new(name).expect("kernel names have no NUL");
    // SAFETY: a loaded module.
    unsafe { result::module::get_function(module, name) }.named("cuModuleGetFunction")
}

/// Launches `function` on the caller's `stream` (in the current context). `early`: with
/// programmatic stream serialization, so that it may be scheduled before the kernel ahead of it
/// on the stream completes (the kernel must wait for it with `griddepcontrol.wait`).
///
/// # Safety
/// `params` must match the kernel's parameters and point to live values.
pub unsafe fn launch(
    function: Function,
    blocks: u32,
    threads: u32,
    stream: Stream,
    params: &mut [*mut c_void],
    early: bool,
) -> Cuda<()> {
    if !early {
        // SAFETY: the caller's contract.
        return unsafe {
            result::launch_kernel(function, (blocks, 1, 1), (threads, 1, 1), 0, stream, params)
        }
        .named("cuLaunchKernel");
    }
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    };
    let config = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: the caller's contract; `config` and its attribute outlive the call.
    check("cuLaunchKernelEx", unsafe {
        sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut())
    })
}
