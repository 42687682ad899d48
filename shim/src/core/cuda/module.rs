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

/// How the core's kernels are launched, decided once per communicator (setup.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchMode {
    /// With programmatic stream serialization, so that a kernel may be scheduled before the
    /// kernel ahead of it on the stream completes (it waits for it with `griddepcontrol.wait`).
    pub early: bool,
    /// In the remote memory synchronization domain, as NCCL launches its own kernels
    /// (`NCCL_MEM_SYNC_DOMAIN`): their fences need not wait for the memory traffic of the
    /// program's kernels in the default domain (a matrix product running beside a collective),
    /// nor the program's for theirs. Ordering with those kernels is the stream's, and the
    /// kernels' signals between GPUs are at system scope, which crosses domains.
    pub remote_domain: bool,
}

impl LaunchMode {
    /// A plain launch.
    pub const PLAIN: LaunchMode = LaunchMode {
        early: false,
        remote_domain: false,
    };
}

/// Launches `function` on the caller's `stream` (in the current context), as `mode` says.
///
/// # Safety
/// `params` must match the kernel's parameters and point to live values.
pub unsafe fn launch(
    function: Function,
    blocks: u32,
    threads: u32,
    stream: Stream,
    params: &mut [*mut c_void],
    mode: LaunchMode,
) -> Cuda<()> {
    if mode == LaunchMode::PLAIN {
        // SAFETY: the caller's contract.
        return unsafe {
            result::launch_kernel(function, (blocks, 1, 1), (threads, 1, 1), 0, stream, params)
        }
        .named("cuLaunchKernel");
    }
    let early = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    };
    let remote = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            memSyncDomain: sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE,
        },
    };
    // The attributes asked for, first in the array (no allocation on a call's path).
    let mut attributes = [early, remote];
    let count = if mode.early {
        1 + mode.remote_domain as usize
    } else {
        attributes[0] = remote;
        1
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
        attrs: attributes.as_mut_ptr(),
        numAttrs: count as u32,
    };
    // SAFETY: the caller's contract; `config` and its attributes outlive the call.
    check("cuLaunchKernelEx", unsafe {
        sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut())
    })
}
