//! Device memory: buffers of ours, what the driver says of a pointer and its allocation, and
//! whether peers can reach it.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::device::Device;
use super::error::{Cuda, Named};
use super::handles::DevicePtr;
use cudarc::driver::{result, sys};

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
pub(super) struct Live {
    pub(super) buffers: AtomicUsize,
    pub(super) mappings: AtomicUsize,
}

pub(super) static LIVE: Live = Live {
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
    /// The address range reserved around it (start, size): for cuMem memory, one that may
    /// hold several allocations side by side (PyTorch's expandable segments); for cudaMalloc
    /// memory, its own range.
    pub reservation: (DevicePtr, u64),
}

/// The driver's unique id of the allocation holding `pointer` (0 where none does: freed
/// memory); `None` where the driver could not say.
pub fn buffer_id(pointer: DevicePtr) -> Option<u64> {
    let mut id: u64 = 0;
    let mut attributes = [sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID];
    let mut data: [*mut c_void; 1] = [(&raw mut id).cast()];
    // SAFETY: one output of the attribute's type.
    unsafe { pointer_attributes(pointer, &mut attributes, &mut data) }.then_some(id)
}

/// The allocation holding `pointer` on device `ordinal` (`None` for host memory, another
/// device's, or no allocation).
pub fn allocation_facts(pointer: DevicePtr, ordinal: i32) -> Option<AllocationFacts> {
    use sys::CUpointer_attribute::*;
    let mut id: u64 = 0;
    let mut legacy_ipc: c_int = 0;
    let mut device: c_int = -1;
    let mut handle_types: u64 = 0;
    let mut reservation_start: DevicePtr = 0;
    let mut reservation_size: usize = 0;
    let mut attributes = [
        CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 6] = [
        (&raw mut id).cast(),
        (&raw mut legacy_ipc).cast(),
        (&raw mut device).cast(),
        (&raw mut handle_types).cast(),
        (&raw mut reservation_start).cast(),
        (&raw mut reservation_size).cast(),
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
        reservation: (reservation_start, reservation_size as u64),
    })
}

impl Device {
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
pub(super) fn device_location(device: c_int) -> sys::CUmemLocation {
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
