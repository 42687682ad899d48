//! The CUDA driver calls the core makes, each wrapped into a `Result` with the call named in the
//! error. cudarc's `result` layer where it has the call; raw `sys` calls (IPC, peer access,
//! host-mapped memory, context push/pop) only here.

use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::limits::MAX_RANKS;

use cudarc::driver::{result, sys};

/// A failed driver call: which one, and the driver's error.
#[derive(Debug)]
pub struct CudaError {
    pub call: &'static str,
    pub error: String,
}

impl CudaError {
    /// A launch that panicked instead of returning (on a launch helper thread).
    pub fn panicked() -> CudaError {
        CudaError {
            call: "launch",
            error: "panicked".to_string(),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.error)
    }
}

pub type Cuda<T> = Result<T, CudaError>;

fn check(call: &'static str, result: sys::CUresult) -> Cuda<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError {
            call,
            error: format!("{result:?}"),
        })
    }
}

trait Named<T> {
    fn named(self, call: &'static str) -> Cuda<T>;
}

impl<T> Named<T> for Result<T, result::DriverError> {
    fn named(self, call: &'static str) -> Cuda<T> {
        self.map_err(|e| CudaError {
            call,
            error: format!("{:?}", e.0),
        })
    }
}

/// Whether libcuda can be loaded at all (cudarc panics on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { sys::is_culib_present() }
}

pub fn init() -> Cuda<()> {
    result::init().named("cuInit")
}

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
        // SAFETY: a function of a loaded module, no dynamic shared memory.
        let per_multiprocessor = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(function, threads as c_int, 0)
        }
        .named("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok((multiprocessors.max(0) as u32) * (per_multiprocessor.max(0) as u32))
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

    /// Whether this GPU and `peers` (device ordinals) can all read and write `bytes` at
    /// `pointer`: memory of this device's primary context made by cuMemAlloc (cudaMalloc), which
    /// peer access covers (this context enabled it for every peer), or cuMem (VMM) memory, such
    /// as ncclMemAlloc's, mapped for this GPU and every peer (cuMemSetAccess) at both ends, or a
    /// pool's (cudaMallocAsync) that grants them all access. Host memory and anything else
    /// answer no.
    pub fn reachable_from_peers(&self, pointer: DevicePtr, bytes: u64, peers: &[i32]) -> bool {
        use sys::CUpointer_attribute::*;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        let mut memory_type: c_uint = 0;
        let mut ordinal: c_int = -1;
        let mut legacy_ipc: c_int = 0;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut attributes = [
            CU_POINTER_ATTRIBUTE_CONTEXT,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
        ];
        let mut data: [*mut c_void; 5] = [
            (&raw mut context).cast(),
            (&raw mut memory_type).cast(),
            (&raw mut ordinal).cast(),
            (&raw mut legacy_ipc).cast(),
            (&raw mut pool).cast(),
        ];
        // SAFETY: one output of the attribute's type per attribute.
        let asked = unsafe { pointer_attributes(pointer, &mut attributes, &mut data) };
        if !asked || memory_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint {
            return false;
        }
        if legacy_ipc != 0 {
            return context == self.context && ordinal == self.ordinal;
        }
        let mut devices = std::iter::once(self.ordinal).chain(peers.iter().copied());
        if !pool.is_null() {
            return devices.all(|device| pool_grants(pool, device));
        }
        let last = pointer + bytes.max(1) - 1;
        devices.all(|device| mapped_for(device, pointer) && mapped_for(device, last))
    }
}

/// Asks the driver for `attributes` of `pointer` into `data`; false if it refused. Unknown
/// pointers are not refused: their outputs keep the values they had.
///
/// # Safety
/// `data[i]` points to an output of the type of `attributes[i]`.
unsafe fn pointer_attributes(
    pointer: DevicePtr,
    attributes: &mut [sys::CUpointer_attribute],
    data: &mut [*mut c_void],
) -> bool {
    assert_eq!(attributes.len(), data.len());
    // SAFETY: the caller's contract.
    let result = unsafe {
        sys::cuPointerGetAttributes(
            attributes.len() as c_uint,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            pointer,
        )
    };
    result == sys::CUresult::CUDA_SUCCESS
}

/// The location of `device`'s memory, for the cuMem calls.
fn device_location(device: c_int) -> sys::CUmemLocation {
    // SAFETY: plain data; every field the driver reads is set below.
    let mut location: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = device;
    location
}

/// Whether `device` may read and write what `pool` (cudaMallocAsync's) allocates.
fn pool_grants(pool: sys::CUmemoryPool, device: c_int) -> bool {
    let mut location = device_location(device);
    let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
    // SAFETY: a pool the driver named for a live pointer; `flags` is written.
    let result = unsafe { sys::cuMemPoolGetAccess(&mut flags, pool, &mut location) };
    result == sys::CUresult::CUDA_SUCCESS
        && flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
}

/// Whether `device` may read and write the cuMem (VMM) mapping holding `pointer`; no for any
/// other memory.
fn mapped_for(device: c_int, pointer: DevicePtr) -> bool {
    let location = device_location(device);
    let mut flags: std::ffi::c_ulonglong = 0;
    // SAFETY: valid location; `flags` is written; memory that is not a VMM mapping is an error.
    let result = unsafe { sys::cuMemGetAccess(&mut flags, &location, pointer) };
    result == sys::CUresult::CUDA_SUCCESS
        && flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64
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

pub type DevicePtr = sys::CUdeviceptr;

/// Device memory of one GPU, freed (in its context) when dropped; leak it with `mem::forget`
/// where a kernel may still use it.
pub struct DeviceBuffer {
    pub pointer: DevicePtr,
    device: Device,
}

impl DeviceBuffer {
    pub fn alloc(device: Device, bytes: usize) -> Cuda<DeviceBuffer> {
        let _context = device.enter()?;
        // SAFETY: plain allocation in the device's context.
        let pointer = unsafe { result::malloc_sync(bytes) }.named("cuMemAlloc")?;
        LIVE.buffers.fetch_add(1, Ordering::Relaxed);
        Ok(DeviceBuffer { pointer, device })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        LIVE.buffers.fetch_sub(1, Ordering::Relaxed);
        if let Ok(_context) = self.device.enter() {
            // SAFETY: allocated by `alloc`, no longer used by any kernel.
            let _ = unsafe { result::free_sync(self.pointer) };
        }
    }
}

/// How many of the core's device buffers and peer mappings this process holds: what the leak
/// test reads in the log at every release.
struct Live {
    buffers: AtomicUsize,
    mappings: AtomicUsize,
}

static LIVE: Live = Live {
    buffers: AtomicUsize::new(0),
    mappings: AtomicUsize::new(0),
};

/// (device buffers, peer mappings) open in this process now.
pub fn live_resources() -> (usize, usize) {
    (
        LIVE.buffers.load(Ordering::Relaxed),
        LIVE.mappings.load(Ordering::Relaxed),
    )
}

pub fn copy_to_host(dst: &mut [u8], src: DevicePtr) -> Cuda<()> {
    // SAFETY: `src` holds at least `dst.len()` bytes.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.named("cuMemcpyDtoH")
}

pub type IpcHandle = [u8; 64];

pub fn ipc_handle(pointer: DevicePtr) -> Cuda<IpcHandle> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `pointer` is the base of an allocation of ours.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut handle, pointer)
    })?;
    Ok(handle.reserved.map(|b| b as u8))
}

/// What the driver says of the device allocation holding `pointer`: its own range, its unique
/// id, and how another process could map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationFacts {
    pub base: DevicePtr,
    pub size: u64,
    pub id: u64,
    /// cudaMalloc memory: a CUDA IPC handle maps it.
    pub legacy_ipc: bool,
    /// cuMem memory made shareable as a file descriptor.
    pub posix_fd: bool,
}

/// The allocation holding `pointer` on device `ordinal` (`None` for host memory, another
/// device's, or no allocation).
pub fn allocation_facts(pointer: DevicePtr, ordinal: i32) -> Option<AllocationFacts> {
    use sys::CUpointer_attribute::*;
    let mut id: u64 = 0;
    let mut legacy_ipc: c_int = 0;
    let mut device: c_int = -1;
    let mut handle_types: u64 = 0;
    let mut attributes = [
        CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    ];
    let mut data: [*mut c_void; 4] = [
        (&raw mut id).cast(),
        (&raw mut legacy_ipc).cast(),
        (&raw mut device).cast(),
        (&raw mut handle_types).cast(),
    ];
    // SAFETY: one output of the attribute's type per attribute.
    let asked = unsafe { pointer_attributes(pointer, &mut attributes, &mut data) };
    if !asked || device != ordinal {
        return None;
    }
    // The allocation's own range: for cuMem memory, the one allocation mapped there, where the
    // range attributes give the whole reservation, which may hold several (seen on H100).
    let (mut base, mut size): (DevicePtr, usize) = (0, 0);
    // SAFETY: writes two values; an address that is no allocation is an error.
    let ranged = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, pointer) };
    if ranged != sys::CUresult::CUDA_SUCCESS || base == 0 {
        return None;
    }
    let posix_fd =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
    Some(AllocationFacts {
        base,
        size: size as u64,
        id,
        legacy_ipc: legacy_ipc != 0,
        posix_fd: handle_types & posix_fd != 0,
    })
}

/// A file descriptor another process can map the cuMem allocation at `base` from.
pub fn export_fd(base: DevicePtr) -> Cuda<OwnedFd> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `base` is the start of a cuMem mapping; the handle is written.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut handle, base as *mut c_void)
    })?;
    let mut fd: c_int = -1;
    // SAFETY: a retained handle; a POSIX file descriptor is written for that handle type.
    let exported = check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&raw mut fd).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    });
    // SAFETY: releases what cuMemRetainAllocationHandle retained.
    unsafe { sys::cuMemRelease(handle) };
    exported?;
    // SAFETY: a descriptor the driver just opened for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Another process's cuMem allocation mapped into a device's address space from its file
/// descriptor, readable and writable by that device; unmapped when dropped.
pub struct VmmMapping {
    pub pointer: DevicePtr,
    size: usize,
    device: Device,
}

impl VmmMapping {
    pub fn import(device: Device, fd: BorrowedFd<'_>, size: u64) -> Cuda<VmmMapping> {
        let size = size as usize;
        let _context = device.enter()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a descriptor of the POSIX type; the driver reads it as an int-sized value.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        let mapped = Self::map(device, handle, size);
        // SAFETY: the mapping (if made) keeps the memory; our handle is no longer needed.
        unsafe { sys::cuMemRelease(handle) };
        mapped
    }

    fn map(
        device: Device,
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
    ) -> Cuda<VmmMapping> {
        let mut pointer: DevicePtr = 0;
        // SAFETY: reserves a fresh range of `size` bytes; the address is written.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut pointer, size, 0, 0, 0)
        })?;
        // From here the range is freed (and unmapped) by `mapping`'s drop, whatever fails.
        let mapping = VmmMapping {
            pointer,
            size,
            device,
        };
        LIVE.mappings.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our reserved range and an imported handle of `size` bytes.
        check("cuMemMap", unsafe {
            sys::cuMemMap(pointer, size, 0, handle, 0)
        })?;
        let access = sys::CUmemAccessDesc {
            location: device_location(device.ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range just mapped; one descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(pointer, size, &access, 1)
        })?;
        Ok(mapping)
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        LIVE.mappings.fetch_sub(1, Ordering::Relaxed);
        if let Ok(_context) = self.device.enter() {
            // SAFETY: our reserved range (mapped or not), no longer used by any kernel.
            unsafe {
                sys::cuMemUnmap(self.pointer, self.size);
                sys::cuMemAddressFree(self.pointer, self.size);
            }
        }
    }
}

/// Another process's allocation mapped into a device's context through CUDA IPC; unmapped
/// when dropped (leak it with `mem::forget` where a kernel may still use it).
pub struct IpcMapping {
    pub pointer: DevicePtr,
    device: Device,
}

impl IpcMapping {
    pub fn open(device: Device, handle: &IpcHandle) -> Cuda<IpcMapping> {
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as _),
        };
        let _context = device.enter()?;
        let mut pointer: DevicePtr = 0;
        // SAFETY: a handle another process made with cuIpcGetMemHandle.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut pointer,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint,
            )
        })?;
        LIVE.mappings.fetch_add(1, Ordering::Relaxed);
        Ok(IpcMapping { pointer, device })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        LIVE.mappings.fetch_sub(1, Ordering::Relaxed);
        if let Ok(_context) = self.device.enter() {
            // SAFETY: mapped by `open` in this context, and no longer used.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.pointer) };
        }
    }
}

/// Pinned host memory shared with the kernels: their control block (device/device.cuh, "the host's
/// control block"): [0] abort, raised by the host; [1] how long a kernel may wait for a peer, in
/// seconds (0: for ever); [2] written by a kernel that gave up waiting: 1 + the rank it waited
/// for, or `MAX_RANKS + 1` for blocks of its own grid.
pub struct HostControl {
    host: *mut i32,
    pub device: DevicePtr,
}

const CONTROL_WORDS: usize = 4;

// SAFETY: pinned host memory, written and read with volatile accesses only.
unsafe impl Send for HostControl {}
// SAFETY: as above.
unsafe impl Sync for HostControl {}

/// Whom a kernel gave up waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaveUp {
    Rank(usize),
    /// Other blocks of its own grid (which themselves waited for peers).
    OwnBlocks,
}

impl HostControl {
    /// Kernels wait for a peer at most `wait_limit_s` seconds (0: for ever).
    pub fn new(wait_limit_s: u32) -> Cuda<HostControl> {
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a fresh pinned allocation of CONTROL_WORDS ints.
        let host = unsafe { result::malloc_host(CONTROL_WORDS * size_of::<i32>(), flags) }
            .named("cuMemHostAlloc")?;
        let mut control = HostControl {
            host: host.cast::<i32>(),
            device: 0,
        };
        for word in 0..CONTROL_WORDS {
            control.write(word, 0);
        }
        control.write(1, wait_limit_s as i32);
        // SAFETY: mapped pinned memory (freed by `control`'s drop if this fails).
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut control.device, control.host.cast(), 0)
        })?;
        Ok(control)
    }

    fn write(&self, word: usize, value: i32) {
        assert!(word < CONTROL_WORDS);
        // SAFETY: our pinned allocation, alive until drop.
        unsafe { self.host.add(word).write_volatile(value) };
    }

    pub fn raise_abort(&self) {
        self.write(0, 1);
    }

    /// Whom a kernel gave up waiting for, if one did (the word stays set).
    pub fn gave_up(&self) -> Option<GaveUp> {
        // SAFETY: our pinned allocation, alive until drop; written by kernels.
        let word = unsafe { self.host.add(2).read_volatile() };
        match word {
            0 => None,
            w if (1..=MAX_RANKS as i32).contains(&w) => Some(GaveUp::Rank(w as usize - 1)),
            _ => Some(GaveUp::OwnBlocks),
        }
    }
}

impl Drop for HostControl {
    fn drop(&mut self) {
        // SAFETY: our pinned allocation; no kernel uses it any more.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

/// A stream of ours on one GPU (non-blocking), destroyed when dropped.
pub struct OwnedStream {
    pub stream: sys::CUstream,
    device: Device,
}

impl OwnedStream {
    pub fn create(device: Device) -> Cuda<OwnedStream> {
        let _context = device.enter()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .named("cuStreamCreate")?;
        Ok(OwnedStream { stream, device })
    }

    pub fn synchronize(&self) -> Cuda<()> {
        // SAFETY: our stream, alive while `self` is.
        unsafe { result::stream::synchronize(self.stream) }.named("cuStreamSynchronize")
    }

    // Memsets and copies from pageable memory may still be under way when the driver's
    // synchronous calls return, on the legacy stream that no non-blocking stream waits for: ours
    // go on this stream, and are done when these return.

    /// Sets `bytes` bytes at `pointer` to `value`.
    pub fn fill(&self, pointer: DevicePtr, value: u8, bytes: usize) -> Cuda<()> {
        // SAFETY: `bytes` of device memory at `pointer`; our stream.
        unsafe { result::memset_d8_async(pointer, value, bytes, self.stream) }
            .named("cuMemsetD8Async")?;
        self.synchronize()
    }

    /// Copies `src` to `dst` on the device.
    pub fn copy_to_device(&self, dst: DevicePtr, src: &[u8]) -> Cuda<()> {
        // SAFETY: `dst` holds at least `src.len()` bytes; our stream.
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }.named("cuMemcpyHtoDAsync")?;
        self.synchronize()
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        if let Ok(_context) = self.device.enter() {
            // SAFETY: our stream; work left on it completes before its resources go.
            let _ = unsafe { result::stream::destroy(self.stream) };
        }
    }
}

/// Two timing events around work on a stream (`NCCLSHIM_TRACE_TIMING`): the trace's writer
/// reads the time between them once the work is done, then destroys them (`Stopwatch::read`).
/// Plain handles, so that the trace's lock-free queue can carry them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopwatch {
    pub start: u64,
    pub end: u64,
    pub context: u64,
}

/// What a stopwatch says: not done yet, or the microseconds between its events (`None` where
/// the driver could not tell).
pub enum Reading {
    NotYet,
    Done(Option<f64>),
}

impl Stopwatch {
    /// Records the start on `stream` in `device`'s context (current on this thread).
    ///
    /// # Safety
    /// `stream` is a live stream of that context (or the null stream).
    pub unsafe fn start(device: &Device, stream: Stream) -> Cuda<Stopwatch> {
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).named("cuEventCreate")?;
        let end = match result::event::create(flags).named("cuEventCreate") {
            Ok(end) => end,
            Err(e) => {
                // SAFETY: our event, recorded nowhere yet.
                let _ = unsafe { result::event::destroy(start) };
                return Err(e);
            }
        };
        let watch = Stopwatch {
            start: start as u64,
            end: end as u64,
            context: device.context as u64,
        };
        // SAFETY: our event and the caller's stream, in the current context.
        if let Err(e) = unsafe { result::event::record(start, stream) }.named("cuEventRecord") {
            watch.discard();
            return Err(e);
        }
        Ok(watch)
    }

    /// Records the end on `stream`, after the work to time.
    ///
    /// # Safety
    /// As for `start`, with the same stream.
    pub unsafe fn stop(&self, stream: Stream) -> Cuda<()> {
        // SAFETY: our event and the caller's stream, in the current context.
        unsafe { result::event::record(self.end as sys::CUevent, stream) }.named("cuEventRecord")
    }

    /// The time between the events once the end has happened; then the events are destroyed
    /// (a reading other than `NotYet` is the last).
    pub fn read(&self) -> Reading {
        // SAFETY: the context the events were made in, retained for the process's life.
        if unsafe { result::ctx::set_current(self.context as sys::CUcontext) }.is_err() {
            self.discard();
            return Reading::Done(None);
        }
        let end = self.end as sys::CUevent;
        // SAFETY: our event.
        match unsafe { result::event::query(end) } {
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => return Reading::NotYet,
            Err(_) => {
                self.discard();
                return Reading::Done(None);
            }
            Ok(()) => {}
        }
        // SAFETY: both our events, both recorded and done.
        let read = unsafe { result::event::elapsed(self.start as sys::CUevent, end) };
        self.discard();
        Reading::Done(read.ok().map(|ms| ms as f64 * 1e3))
    }

    /// Destroys the events (their work may still be pending: the driver frees them after).
    pub fn discard(&self) {
        for event in [self.start, self.end] {
            // SAFETY: our events, not used after this.
            let _ = unsafe { result::event::destroy(event as sys::CUevent) };
        }
    }
}

/// A point on a stream: done once the work queued before it has completed. Destroyed when
/// dropped (the driver keeps it until then if it is still pending).
pub struct Event {
    event: sys::CUevent,
    device: Device,
}

// SAFETY: a CUDA event may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; queries only read it.
unsafe impl Sync for Event {}

impl Event {
    /// Records a new event on `stream`, in `device`'s context (current on this thread).
    ///
    /// # Safety
    /// `stream` is a live stream of that context (or the null stream).
    pub unsafe fn record(device: Device, stream: Stream) -> Cuda<Event> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .named("cuEventCreate")?;
        let event = Event { event, device };
        // SAFETY: our event and the caller's stream, in the current context.
        unsafe { result::event::record(event.event, stream) }.named("cuEventRecord")?;
        Ok(event)
    }

    /// Whether the work before it has completed (an error counts as done: nothing waits on it).
    pub fn query(&self) -> bool {
        let Ok(_context) = self.device.enter_if_needed() else {
            return true;
        };
        // SAFETY: our event.
        !matches!(unsafe { result::event::query(self.event) },
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_context) = self.device.enter_if_needed() {
            // SAFETY: our event, not used after this.
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

/// Whether `stream` is being captured into a CUDA graph (no for a stream the driver refuses).
pub fn capturing(stream: Stream) -> bool {
    // SAFETY: a stream of the caller's; a bad one answers an error.
    unsafe { result::stream::is_capturing(stream) }
        .is_ok_and(|c| c != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Keeps one communicator's kernels in the order they were called, whatever the streams: NCCL
/// orders a communicator's operations itself, and programs may rely on it (two all-reduces on
/// two streams with no dependency between them), while two of our kernels of one communicator
/// must never run at once (they share its flags and staging). When a call comes on another
/// stream than the last one, its stream waits for what the last one holds so far. Not across a
/// stream capture (an event recorded outside one cannot be waited on inside it, and the other
/// way round): captured calls are ordered by the graph the program builds.
pub struct StreamOrder {
    /// The stream of the last launch, `NO_STREAM` before the first.
    last: AtomicU64,
    event: sys::CUevent,
}

const NO_STREAM: u64 = u64::MAX;

// SAFETY: a CUDA event may be used from any thread.
unsafe impl Send for StreamOrder {}
// SAFETY: as above; `last` is atomic.
unsafe impl Sync for StreamOrder {}

impl StreamOrder {
    /// Needs the communicator's context current.
    pub fn new() -> Cuda<StreamOrder> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .named("cuEventCreate")?;
        Ok(StreamOrder {
            last: AtomicU64::new(NO_STREAM),
            event,
        })
    }

    /// Called before a launch on `stream`, in the communicator's context.
    pub fn before_launch(&self, stream: Stream) -> Cuda<()> {
        let last = self.last.swap(stream as u64, Ordering::Relaxed);
        if last == NO_STREAM || last == stream as u64 {
            return Ok(());
        }
        let last = last as Stream;
        if capturing(last) || capturing(stream) {
            return Ok(());
        }
        // SAFETY: our event, and a stream the program launched on; if the program has destroyed
        // that stream since, the driver refuses it, and there is nothing left to wait for.
        if unsafe { result::event::record(self.event, last) }.is_err() {
            return Ok(());
        }
        // SAFETY: our event; the caller's stream.
        unsafe {
            result::stream::wait_event(
                stream,
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .named("cuStreamWaitEvent")
    }
}

impl StreamOrder {
    /// Makes `waiter` wait for what `on` holds so far, in the communicator's context: both
    /// streams uncaptured, or both captured into one graph, which the wait then joins (a group's
    /// calls of one communicator are all captured or none, group::queue).
    pub fn join(&self, waiter: Stream, on: Stream) -> Cuda<()> {
        // SAFETY: our event; a stream the program gave a call of the group.
        unsafe { result::event::record(self.event, on) }.named("cuEventRecord")?;
        // SAFETY: our event; the program's stream.
        unsafe {
            result::stream::wait_event(
                waiter,
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .named("cuStreamWaitEvent")
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        // SAFETY: our event; a pending wait on it keeps what it needs.
        let _ = unsafe { result::event::destroy(self.event) };
    }
}

/// Waits for all work on the current context's device.
pub fn synchronize() -> Cuda<()> {
    result::ctx::synchronize().named("cuCtxSynchronize")
}

pub type Function = sys::CUfunction;
pub type Stream = sys::CUstream;
pub type Module = sys::CUmodule;

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

/// The driver's CUDA version, e.g. 13000 for 13.0.
pub fn driver_version() -> Cuda<i32> {
    let mut version: c_int = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    Ok(version)
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
