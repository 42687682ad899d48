//! The driver's handles, as the core names them.

use cudarc::driver::sys;

/// An address in a GPU's memory.
pub type DevicePtr = sys::CUdeviceptr;
/// A kernel of a loaded module.
pub type Function = sys::CUfunction;
pub type Module = sys::CUmodule;
pub type Stream = sys::CUstream;
/// `CU_STREAM_PER_THREAD` (`cudaStreamPerThread`): the calling thread's own default stream.
pub const PER_THREAD_STREAM: Stream = 0x2 as Stream;
