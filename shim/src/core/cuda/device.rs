//! A GPU and its primary context: opening it, entering it, what it is, peer access.

use std::ffi::c_int;

use super::error::{Cuda, Named, check};
use super::handles::Function;
use cudarc::driver::{result, sys};

/// A device's primary context: the one the CUDA runtime (and so NCCL and the application) uses.
#[derive(Clone, Copy, Debug)]
pub struct Device {
    pub ordinal: i32,
    pub handle: sys::CUdevice,
    pub context: sys::CUcontext,
}

// SAFETY: CUDA contexts and device handles may be used from any thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    pub fn open(ordinal: i32) -> Cuda<Device> {
        let handle = result::device::get(ordinal).named("cuDeviceGet")?;
        // SAFETY: a valid device; the retained context is never released (it outlives us).
        let context =
            unsafe { result::primary_ctx::retain(handle) }.named("cuDevicePrimaryCtxRetain")?;
        Ok(Device {
            ordinal,
            handle,
            context,
        })
    }

    /// Makes this device's context current until the guard is dropped (restoring the caller's).
    pub fn enter(&self) -> Cuda<ContextGuard> {
        // SAFETY: a retained primary context.
        check("cuCtxPushCurrent", unsafe {
            sys::cuCtxPushCurrent_v2(self.context)
        })?;
        Ok(ContextGuard)
    }

    /// Makes this device's context the calling thread's current one, for good (a thread of ours).
    pub fn make_current(&self) -> Cuda<()> {
        // SAFETY: a retained primary context.
        unsafe { result::ctx::set_current(self.context) }.named("cuCtxSetCurrent")
    }

    /// As `enter`, but only if another context is current (the common case needs no switch).
    pub fn enter_if_needed(&self) -> Cuda<Option<ContextGuard>> {
        if result::ctx::get_current().ok().flatten() == Some(self.context) {
            return Ok(None);
        }
        self.enter().map(Some)
    }

    /// The GPU's name as the driver gives it (e.g. "NVIDIA H200"); empty if it cannot.
    pub fn name(&self) -> String {
        result::device::get_name(self.handle).unwrap_or_default()
    }

    pub fn compute_capability(&self) -> Cuda<(i32, i32)> {
        use sys::CUdevice_attribute::*;
        // SAFETY: valid device and attributes.
        unsafe {
            Ok((
                result::device::get_attribute(
                    self.handle,
                    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )
                .named("cuDeviceGetAttribute")?,
                result::device::get_attribute(
                    self.handle,
                    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )
                .named("cuDeviceGetAttribute")?,
            ))
        }
    }

    /// How many blocks of `threads` threads of `function` this device runs at once.
    pub fn resident_blocks(&self, function: Function, threads: u32) -> Cuda<u32> {
        use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        // SAFETY: a valid device and attribute.
        let multiprocessors = unsafe {
            result::device::get_attribute(self.handle, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        }
        .named("cuDeviceGetAttribute")?;
        Ok((multiprocessors.max(0) as u32) * blocks_per_multiprocessor(function, threads)?)
    }

    /// The PCI bus id, e.g. "0000:1B:00.0": identifies a GPU across processes.
    pub fn pci_bus_id(&self) -> Cuda<[u8; 16]> {
        let mut id = [0u8; 16];
        // SAFETY: the buffer holds 16 bytes, NUL-terminated by the driver.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(id.as_mut_ptr().cast(), id.len() as c_int, self.handle)
        })?;
        Ok(id)
    }

    pub fn can_access_peer(&self, peer: &Device) -> Cuda<bool> {
        let mut can: c_int = 0;
        // SAFETY: valid devices; `can` is written.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.handle, peer.handle)
        })?;
        Ok(can != 0)
    }

    /// Lets this context map `peer`'s memory (needs this context current). Already enabled is fine.
    pub fn enable_peer_access(&self, peer: &Device) -> Cuda<()> {
        // SAFETY: valid contexts.
        let result = unsafe { sys::cuCtxEnablePeerAccess(peer.context, 0) };
        if result == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", result)
    }
}

/// The calling thread's current context, restored when dropped: the core's set-up makes NCCL
/// calls that may change it, and the application must not notice.
pub struct KeepCurrent(Option<sys::CUcontext>);

impl KeepCurrent {
    pub fn new() -> KeepCurrent {
        KeepCurrent(result::ctx::get_current().ok().flatten())
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        if let Some(context) = self.0 {
            // SAFETY: a context that was current on this thread, still alive (primary contexts
            // are never released by us).
            let _ = unsafe { result::ctx::set_current(context) };
        }
    }
}

/// The calling thread in relaxed stream-capture mode until dropped (then back in its own): a
/// capture in progress does not forbid it allocations, copies and synchronisation, on streams
/// that are not captured.
pub struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl RelaxedCapture {
    pub fn new() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps this thread's mode with `mode`, which then holds the previous one.
        let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture((swapped == sys::CUresult::CUDA_SUCCESS).then_some(mode))
    }

    /// As `new`, on a thread of the core's own, which may run where there is no driver (tests):
    /// nothing then.
    pub fn where_driver() -> Option<RelaxedCapture> {
        super::driver_present().then(RelaxedCapture::new)
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0 {
            // SAFETY: puts back the mode `new` took away.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// Restores the caller's context when dropped.
pub struct ContextGuard;

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `Device::enter` pushed.
        unsafe { sys::cuCtxPopCurrent_v2(&mut previous) };
    }
}

/// How many blocks of `threads` threads of `function` one SM runs at once.
pub fn blocks_per_multiprocessor(function: Function, threads: u32) -> Cuda<u32> {
    // SAFETY: a function of a loaded module, no dynamic shared memory.
    let blocks = unsafe {
        result::occupancy::max_active_block_per_multiprocessor(function, threads as c_int, 0)
    }
    .named("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
    Ok(blocks.max(0) as u32)
}

/// The SMs of the green context `stream` belongs to (CUDA 12.4 on), `None` for a stream of a
/// context that has every SM of its device.
pub fn green_context_sms(stream: super::Stream) -> Option<u32> {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let supported = || {
        // SAFETY: the driver library, loaded already; only looked up, as a missing symbol
        // would panic at its first call.
        let has = |name: &str| unsafe { sys::culib().get::<*const ()>(name.as_bytes()).is_ok() };
        super::driver_version().is_ok_and(|v| v >= 12040)
            && has("cuStreamGetGreenCtx")
            && has("cuGreenCtxGetDevResource")
            // What the launches on a green context's stream ask too (stream.rs, `capture_id`).
            && has("cuStreamGetCaptureInfo_v3")
    };
    if !*SUPPORTED.get_or_init(supported) {
        return None;
    }
    let mut green: sys::CUgreenCtx = std::ptr::null_mut();
    // SAFETY: a stream of the program's, alive for its call; writes one handle.
    let found = unsafe { sys::cuStreamGetGreenCtx(stream, &mut green) };
    if found != sys::CUresult::CUDA_SUCCESS || green.is_null() {
        return None;
    }
    // SAFETY: plain data, written by the driver below.
    let mut resource: sys::CUdevResource = unsafe { std::mem::zeroed() };
    let sm = sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
    // SAFETY: the green context the driver named; writes one resource.
    let got = unsafe { sys::cuGreenCtxGetDevResource(green, &mut resource, sm) };
    // SAFETY: an SM resource, as asked (zeros where the driver wrote nothing).
    let sms = unsafe { resource.__bindgen_anon_1.sm.smCount };
    (got == sys::CUresult::CUDA_SUCCESS).then_some(sms)
}
