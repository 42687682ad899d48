//! Memory shared between processes: CUDA IPC handles and mappings, and cuMem allocations
//! exported as file descriptors and mapped from them.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::device::Device;
use super::error::{Cuda, check};
use super::handles::DevicePtr;
use super::memory::{LIVE, device_location};
use super::release::release_later;
use cudarc::driver::sys;

pub type IpcHandle = [u8; 64];

pub fn ipc_handle(pointer: DevicePtr) -> Cuda<IpcHandle> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `pointer` is the base of an allocation of ours.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut handle, pointer)
    })?;
    Ok(handle.reserved.map(|b| b as u8))
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

/// A range of a device's address space reserved for mappings of other processes' cuMem
/// allocations; given back when dropped, once nothing is mapped there (every mapping in it
/// holds it).
pub struct Reservation {
    pub pointer: DevicePtr,
    pub size: u64,
    /// Taken when dropped.
    range: Option<AddressRange>,
}

impl Reservation {
    pub fn new(device: Device, size: u64) -> Cuda<Reservation> {
        let _context = device.enter()?;
        let mut pointer: DevicePtr = 0;
        // SAFETY: reserves a fresh range of `size` bytes; the address is written.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut pointer, size as usize, 0, 0, 0)
        })?;
        Ok(Reservation {
            pointer,
            size,
            range: Some(AddressRange {
                device,
                pointer,
                size: size as usize,
            }),
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Given back on the releasing thread, not on zero-copy's that drops it (whether the
        // driver waits for the GPU here is not known); here where that thread is missing.
        if let Some(range) = self.range.take()
            && let Err(range) = release_later(range)
        {
            drop(range);
        }
    }
}

/// A reserved range of a device's address space, given back when dropped.
struct AddressRange {
    device: Device,
    pointer: DevicePtr,
    size: usize,
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        if let Ok(_context) = self.device.enter() {
            // SAFETY: our reserved range, where nothing is mapped any more.
            unsafe { sys::cuMemAddressFree(self.pointer, self.size) };
        }
    }
}

/// Another process's cuMem allocation mapped into a device's address space from its file
/// descriptor, readable and writable by that device; unmapped when dropped.
pub struct VmmMapping {
    pub pointer: DevicePtr,
    size: usize,
    device: Device,
    /// The range it is mapped in: its own, or one shared with its neighbours (`import`).
    _within: Arc<Reservation>,
}

impl VmmMapping {
    /// Maps the allocation of `size` bytes behind `fd`: at `offset` in `within` where given
    /// and free (so that allocations side by side in their own process are side by side here
    /// too), in a range of its own otherwise.
    pub fn import(
        device: Device,
        fd: BorrowedFd<'_>,
        size: u64,
        within: Option<(&Arc<Reservation>, u64)>,
    ) -> Cuda<VmmMapping> {
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
        let fits = |(reservation, offset): &(&Arc<Reservation>, u64)| {
            offset
                .checked_add(size)
                .is_some_and(|end| end <= reservation.size)
        };
        // Where the place is taken (a mapping of an allocation that was there before), apart.
        let mapped = within
            .filter(fits)
            .and_then(|(reservation, offset)| {
                Self::map(device, handle, size, reservation.clone(), offset).ok()
            })
            .map_or_else(
                || {
                    let own = Arc::new(Reservation::new(device, size)?);
                    Self::map(device, handle, size, own, 0)
                },
                Ok,
            );
        // SAFETY: the mapping (if made) keeps the memory; our handle is no longer needed.
        unsafe { sys::cuMemRelease(handle) };
        mapped
    }

    fn map(
        device: Device,
        handle: sys::CUmemGenericAllocationHandle,
        size: u64,
        within: Arc<Reservation>,
        offset: u64,
    ) -> Cuda<VmmMapping> {
        let pointer = within.pointer + offset;
        let size = size as usize;
        // SAFETY: a place of our reserved range that the caller knows free (and the driver
        // refuses one that is mapped), and an imported handle of `size` bytes.
        check("cuMemMap", unsafe {
            sys::cuMemMap(pointer, size, 0, handle, 0)
        })?;
        // From here the place is unmapped by `mapping`'s drop, whatever fails.
        let mapping = VmmMapping {
            pointer,
            size,
            device,
            _within: within,
        };
        LIVE.mappings.fetch_add(1, Ordering::Relaxed);
        let access = sys::CUmemAccessDesc {
            location: device_location(device.ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the place just mapped; one descriptor.
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
            // SAFETY: our mapping, no longer used by any kernel; the range goes with the last
            // mapping holding it.
            unsafe { sys::cuMemUnmap(self.pointer, self.size) };
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
