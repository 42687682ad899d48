//! Zero-copy's memory through the driver: which allocation holds a pointer and how a peer can
//! map it, and the peers' allocations mapped here. A peer's cuMem allocations are mapped in a
//! mirror of the range they sit in there, at the same offsets, so that allocations side by
//! side in the peer's process (PyTorch's expandable segments grow a tensor over several) are
//! side by side here too and a buffer across them is one range for the kernels. Mirrors and
//! the allocations mapped in them are the process's, shared by its communicators.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::super::cuda::{self, Device, Event, IpcMapping, Reservation, Stream, VmmMapping};
use super::exports::{Allocation, Done, Sharing};
use super::{Mapped, Marker, Memory, Origin, Shared, lock};
use crate::log::log_info;

/// Memory of one GPU, through the driver.
pub struct DeviceMemory(pub Device);

impl Mapped for IpcMapping {
    fn address(&self) -> u64 {
        self.pointer
    }
}

impl Mapped for VmmMapping {
    fn address(&self) -> u64 {
        self.pointer
    }
}

/// A peer's cuMem allocation mapped here: at its place in a mirror, where communicators of this
/// process over the same peer share it, or apart, its own.
struct SharedMapping {
    /// Taken when dropped.
    mapping: Option<Arc<VmmMapping>>,
    in_mirror: bool,
}

impl Mapped for SharedMapping {
    fn address(&self) -> u64 {
        self.mapping.as_ref().map_or(0, |m| m.pointer)
    }
    fn in_mirror(&self) -> bool {
        self.in_mirror
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // Closed, if this is its last holder, under the lock that places in mirrors are found
        // free under: a place is never mapped again while it is being closed.
        let guard = self.in_mirror.then(|| lock(&MIRRORS));
        drop(self.mapping.take());
        drop(guard);
    }
}

impl Done for Event {
    fn done(&self) -> bool {
        self.query()
    }
}

/// The allocation holding `pointer` where another process can map it: cudaMalloc memory of
/// device `ordinal` (CUDA IPC), or cuMem memory made shareable as a file descriptor (such as
/// ncclMemAlloc's, or a chunk of PyTorch's expandable segments); its range and the driver's
/// unique id for it. `None` for any other memory.
pub(super) fn shareable_allocation(pointer: u64, ordinal: i32) -> Option<Allocation> {
    let facts = cuda::allocation_facts(pointer, ordinal)?;
    let sharing = match (facts.legacy_ipc, facts.posix_fd) {
        (true, _) => Sharing::LegacyIpc,
        (false, true) => Sharing::PosixFd,
        (false, false) => return None,
    };
    Some(Allocation {
        base: facts.base,
        size: facts.size,
        id: facts.id,
        sharing,
        reservation: facts.reservation,
    })
}

/// (peer process, its reservation's start and size, our device) -> the mirror here.
type MirrorKey = (u64, u64, u64, i32);
/// (peer process, the driver's id of its allocation there and its base, our device) -> its
/// mapping here.
type PieceKey = (u64, u64, u64, i32);

/// What this process mapped of its peers' cuMem memory at its place in a mirror; held by the
/// mappings, named here. Mappings in mirrors are made and closed under its lock, so what it
/// says of a mirror's places is exact.
#[derive(Default)]
struct Mirrors {
    reservations: HashMap<MirrorKey, Weak<Reservation>>,
    /// With where: its mirror, offset and size.
    pieces: HashMap<PieceKey, (Weak<VmmMapping>, MirrorKey, u64, u64)>,
}

impl Mirrors {
    /// Whether `size` bytes at `offset` of the mirror `key` are free.
    fn free(&self, key: MirrorKey, offset: u64, size: u64) -> bool {
        !self.pieces.values().any(|(mapping, mirror, at, bytes)| {
            *mirror == key
                && mapping.strong_count() > 0
                && *at < offset.saturating_add(size)
                && offset < at.saturating_add(*bytes)
        })
    }
}

static MIRRORS: Mutex<Option<Mirrors>> = Mutex::new(None);
/// Whether a mapping apart from its neighbours was said (once per process).
static SAID_APART: AtomicBool = AtomicBool::new(false);

impl DeviceMemory {
    /// Maps a peer's cuMem allocation in the mirror of its reservation, or finds it mapped by
    /// another communicator of this process.
    fn import(
        &self,
        shared: &impl AsFd,
        size: u64,
        origin: Origin,
    ) -> Result<SharedMapping, String> {
        let ordinal = self.0.ordinal;
        let piece_key = (origin.process, origin.piece.id, origin.piece.base, ordinal);
        let mut guard = lock(&MIRRORS);
        let mirrors = guard.get_or_insert_with(Mirrors::default);
        if let Some(mapping) = mirrors.pieces.get(&piece_key).and_then(|p| p.0.upgrade()) {
            return Ok(SharedMapping {
                mapping: Some(mapping),
                in_mirror: true,
            });
        }
        let (start, reserved) = origin.piece.reservation;
        let mirror_key = (origin.process, start, reserved, ordinal);
        let mirror = match mirrors
            .reservations
            .get(&mirror_key)
            .and_then(Weak::upgrade)
        {
            Some(mirror) => Some(mirror),
            // Past what can be reserved (a mirror is as large as the peer's reservation, for
            // PyTorch about the GPU's memory), mapped apart.
            None => Reservation::new(self.0, reserved).ok().map(Arc::new),
        };
        let offset = origin
            .piece
            .offset()
            .filter(|&offset| mirrors.free(mirror_key, offset, size));
        let within = mirror.as_ref().zip(offset);
        let mapping = VmmMapping::import(self.0, shared.as_fd(), size, within)
            .map(Arc::new)
            .map_err(|e| e.to_string())?;
        let in_mirror =
            within.map(|(mirror, offset)| mirror.pointer + offset) == Some(mapping.pointer);
        // Forget what no mapping holds any more (mapping is rare; so is this look).
        mirrors.reservations.retain(|_, m| m.strong_count() > 0);
        mirrors.pieces.retain(|_, p| p.0.strong_count() > 0);
        if let Some(mirror) = &mirror {
            mirrors
                .reservations
                .insert(mirror_key, Arc::downgrade(mirror));
        }
        match (in_mirror, offset) {
            (true, Some(offset)) => {
                let place = (Arc::downgrade(&mapping), mirror_key, offset, size);
                mirrors.pieces.insert(piece_key, place);
            }
            // Apart, and its own: another communicator's offer of it tries its place again.
            _ => {
                if !SAID_APART.swap(true, Ordering::Relaxed) {
                    log_info!(
                        "zero-copy: a peer's allocation mapped apart from its neighbours ({})",
                        match (&mirror, origin.piece.offset()) {
                            (None, _) => "no mirror could be reserved",
                            (_, None) => "outside its reservation",
                            _ => "its place taken",
                        }
                    );
                }
            }
        }
        Ok(SharedMapping {
            mapping: Some(mapping),
            in_mirror,
        })
    }
}

impl Memory for DeviceMemory {
    fn allocation_of(&self, pointer: u64) -> Option<Allocation> {
        shareable_allocation(pointer, self.0.ordinal)
    }

    /// By the buffer id alone, in this GPU's context (entered once for all): gone only where
    /// the driver says so.
    fn gone(&self, allocations: &[Allocation]) -> Vec<bool> {
        let Ok(_context) = self.0.enter() else {
            return vec![false; allocations.len()];
        };
        allocations
            .iter()
            .map(|a| cuda::buffer_id(a.base).is_some_and(|id| id != a.id))
            .collect()
    }

    fn share(&self, allocation: &Allocation) -> Result<Shared, String> {
        // A call being captured into a graph may offer its buffers.
        let _relaxed = cuda::RelaxedCapture::new();
        let _context = self.0.enter().map_err(|e| e.to_string())?;
        match allocation.sharing {
            Sharing::LegacyIpc => cuda::ipc_handle(allocation.base).map(Shared::Ipc),
            Sharing::PosixFd => cuda::export_fd(allocation.base).map(Shared::Fd),
        }
        .map_err(|e| e.to_string())
    }

    fn open(
        &self,
        shared: Shared,
        size: u64,
        origin: Option<Origin>,
    ) -> Result<Box<dyn Mapped>, String> {
        match (shared, origin) {
            (Shared::Ipc(handle), _) => IpcMapping::open(self.0, &handle)
                .map(|m| Box::new(m) as Box<dyn Mapped>)
                .map_err(|e| e.to_string()),
            (Shared::Fd(fd), Some(origin)) => self
                .import(&fd, size, origin)
                .map(|m| Box::new(m) as Box<dyn Mapped>),
            (Shared::Fd(fd), None) => VmmMapping::import(self.0, fd.as_fd(), size, None)
                .map(|m| Box::new(m) as Box<dyn Mapped>)
                .map_err(|e| e.to_string()),
        }
    }

    fn marker(&self, stream: Stream) -> Option<Marker> {
        let _context = self.0.enter_if_needed().ok()?;
        // SAFETY: the caller's stream, of this device, where a call was just queued.
        let event = unsafe { Event::record(self.0, stream) }.ok()?;
        Some(Arc::new(event))
    }
}
