//! Zero-copy for communicators whose ranks are in several processes (one process per GPU, as
//! under torchrun or mpirun): the direct all-reduce reads and writes the peers' user buffers,
//! which each rank must first map. Each rank offers its peers every allocation its calls use,
//! once (`exports`): a CUDA IPC handle for cudaMalloc memory, a file descriptor for shareable
//! cuMem memory (`fd_passing`); the peers map it on their service thread (`service`) and answer
//! where (`wire`). A buffer across cuMem allocations side by side in one reservation (PyTorch's
//! expandable segments) is offered allocation by allocation; the peers map each at its offset in
//! a mirror of that reservation (`device_memory`), so that it is one range there too. A call
//! whose allocations every peer has mapped gives the kernel every rank's address of its
//! buffers; the others (first meetings not answered in time, memory that cannot be shared) let
//! the kernel take the staged path, which every rank then takes alike (device/all_reduce.cu,
//! "Direct").
//!
//! The first call on an allocation waits for its peers' answers (one round trip through the
//! service threads, and the time to map it); later calls find it in the table. An allocation
//! freed and made again at the same address is another allocation (the driver's buffer id),
//! offered anew: no call ever reads through a stale mapping. A peer's mapping keeps the memory
//! of an allocation its program freed from being used again, so each rank's service looks at
//! what it offered every SWEEP_EVERY and retires what is gone; the peers close their mappings
//! of cuMem memory at once, and keep those of cudaMalloc memory a while (PARKED_LIMIT).

mod device_memory;
mod exports;
mod fd_passing;
#[cfg(test)]
mod gpu_test;
mod service;
mod wire;

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::cuda::{IpcHandle, Stream, release_later};
use super::policy::MAX_RANKS;
use crate::log::{log_info, log_warn};
pub use device_memory::DeviceMemory;
pub use exports::{Allocation, Done, Sharing};
use exports::{CAPACITY, Exports, Placement, Retired};
use service::Outgoing;
pub use service::Service;
use wire::{Kind, Message, Piece};

/// How long calls wait, in all, for the peers to map a new allocation: answers take a
/// millisecond or so, but a peer's CUDA calls can be held up (by its own program's, such as a
/// cudaFree waiting for its GPU, whose kernel may wait for us). Past it, calls take the staged
/// path without waiting, until the answers come.
const ANSWER_LIMIT: Duration = Duration::from_secs(2);
/// How often each process's service looks for allocations it offered that its program freed
/// (a few hundred nanoseconds of the driver's each): cuMem memory is the program's again this
/// long after, and the time to close the peers' mappings.
pub const SWEEP_EVERY: Duration = Duration::from_millis(20);
/// Mappings of peers' cudaMalloc allocations that are gone, kept open until the communicator
/// goes: closing one waits until this GPU has nothing queued, and holds this process's other
/// CUDA calls meanwhile (seen on H100 and H200), which must not happen while a kernel waits
/// for something this process has yet to do. Past this many, the oldest are closed anyway (on
/// a thread of their own).
const PARKED_LIMIT: usize = 64;
/// Most allocations one side of a call may span (a tensor of PyTorch's expandable segments
/// spans one per 20 MiB); past it, the call is staged.
const MAX_PIECES: usize = 64;

/// What a peer needs to map an allocation.
pub enum Shared {
    Ipc(IpcHandle),
    Fd(OwnedFd),
}

/// What zero-copy needs of CUDA, apart so that the protocol can be tested without a GPU.
pub trait Memory: Send + Sync {
    /// The allocation holding `pointer`, if it is one that peers can map (of this rank's GPU).
    fn allocation_of(&self, pointer: u64) -> Option<Allocation>;
    /// Which of `allocations` are surely gone (freed, or another made at their place), asked on
    /// the service's thread, which has no context of its own: one answer each, in order.
    fn gone(&self, allocations: &[Allocation]) -> Vec<bool>;
    fn share(&self, allocation: &Allocation) -> Result<Shared, String>;
    /// Maps a peer's allocation of `size` bytes; a cuMem one where it sits in its process
    /// (`origin`), so that allocations side by side there are side by side here where they can
    /// be.
    fn open(
        &self,
        shared: Shared,
        size: u64,
        origin: Option<Origin>,
    ) -> Result<Box<dyn Mapped>, String>;
    /// A marker on `stream` behind the work queued there so far.
    fn marker(&self, stream: Stream) -> Option<Marker>;
}

/// Where a peer's cuMem allocation sits: its process (identity) and its place there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub process: u64,
    pub piece: Piece,
}

/// A point on a stream, shared by the positions one call used.
pub type Marker = Arc<dyn Done + Send + Sync>;

/// A peer's allocation mapped here; unmapped when dropped.
pub trait Mapped: Send {
    fn address(&self) -> u64;
    /// Whether it holds a place in a mirror of a peer's reservation (device_memory.rs), which
    /// the allocation made next there wants: closed as soon as it is gone, never parked.
    fn in_mirror(&self) -> bool {
        false
    }
}

/// Why a buffer cannot go zero-copy; each said once per communicator (NCCL_DEBUG=INFO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staged {
    Unaligned,
    /// Host memory, or device memory no other process can map.
    NotShareable,
    /// Across allocations that are not cuMem ones side by side in one reservation, or too many.
    AcrossAllocations,
    TableFull,
    PeerCouldNotMap,
    /// A peer mapped the allocations it spans apart (a place in its mirror was taken).
    NotSideBySide,
    NoAnswerInTime,
}

impl Staged {
    fn says(self) -> &'static str {
        match self {
            Staged::Unaligned => "not 16-aligned",
            Staged::NotShareable => "memory no other process can map",
            Staged::AcrossAllocations => {
                "across allocations that are not cuMem ones side by side in one reservation (or over 64 of them)"
            }
            Staged::TableFull => "every place of the table of offered allocations in use",
            Staged::PeerCouldNotMap => "a peer could not map it",
            Staged::NotSideBySide => "a peer mapped the allocations it spans apart",
            Staged::NoAnswerInTime => "a peer did not answer in time",
        }
    }
}

/// Every rank's address of one call's buffers, as the direct kernel takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    pub input: [u64; MAX_RANKS],
    pub output: [u64; MAX_RANKS],
}

/// The positions a call used, to be marked once its kernel is queued (one bit each).
#[derive(Clone, Copy, Debug, Default)]
pub struct Uses([u64; CAPACITY / 64]);

impl Uses {
    fn add(&mut self, position: usize) {
        self.0[position / 64] |= 1 << (position % 64);
    }

    fn positions(self) -> impl Iterator<Item = usize> {
        (0..CAPACITY).filter(move |&p| self.0[p / 64] & (1 << (p % 64)) != 0)
    }
}

/// (rank, position) -> (generation, mapping) of what a rank mapped of its peers' offers.
type Imports = HashMap<(usize, usize), (u64, Box<dyn Mapped>)>;

/// One rank's zero-copy side of one communicator.
pub struct ZeroCopy {
    /// Itself, for the messages it posts.
    me: Weak<ZeroCopy>,
    /// The key every rank agreed on at set-up.
    comm: u64,
    rank: usize,
    /// Every rank's process identity (the address of its service).
    processes: Vec<u64>,
    service: Arc<Service>,
    memory: Box<dyn Memory>,
    exports: Mutex<Exports<Marker>>,
    answered: Condvar,
    /// What this rank mapped of its peers' offers.
    imports: Mutex<Imports>,
    /// Mappings of allocations that are gone, oldest first (see PARKED_LIMIT).
    parked: Mutex<VecDeque<Box<dyn Mapped>>>,
    /// A peer could not be reached: no zero-copy here any more.
    broken: AtomicBool,
    /// Its core is left to kernels that may still run (`stop_serving`): no mapping is closed or
    /// replaced. Set and read under `imports`' lock.
    stopped: AtomicBool,
    /// Calls that went zero-copy, calls that could not, allocations offered: said at the end.
    served: AtomicU64,
    staged: AtomicU64,
    offered: AtomicU64,
    /// The reasons (`Staged`, one bit each) already said.
    said: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ZeroCopy {
    /// Joins `service` as rank `rank` of the communicator `comm`, whose ranks' process
    /// identities are `processes`.
    pub fn join(
        service: Arc<Service>,
        comm: u64,
        rank: usize,
        processes: Vec<u64>,
        memory: Box<dyn Memory>,
    ) -> Arc<ZeroCopy> {
        let nranks = processes.len();
        let member = Arc::new_cyclic(|me| ZeroCopy {
            me: me.clone(),
            comm,
            rank,
            processes,
            service: service.clone(),
            memory,
            exports: Mutex::new(Exports::new(rank, nranks)),
            answered: Condvar::new(),
            imports: Mutex::new(HashMap::new()),
            parked: Mutex::new(VecDeque::new()),
            broken: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            served: AtomicU64::new(0),
            staged: AtomicU64::new(0),
            offered: AtomicU64::new(0),
            said: AtomicU64::new(0),
        });
        service.join(comm, &member);
        member
    }

    /// Every rank's address of `send` and `recv` (of `send_bytes` and `recv_bytes`, 16-aligned),
    /// offering their allocations to the peers first where needed; `None` where the call
    /// cannot go zero-copy. A side of no bytes is one the peers do not touch: not offered, its
    /// addresses zeros.
    pub fn addresses(
        &self,
        send: u64,
        send_bytes: u64,
        recv: u64,
        recv_bytes: u64,
    ) -> Option<(Addresses, Uses)> {
        let found = self.find(send, send_bytes, recv, recv_bytes);
        let count = if found.is_some() {
            &self.served
        } else {
            &self.staged
        };
        count.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn find(
        &self,
        send: u64,
        send_bytes: u64,
        recv: u64,
        recv_bytes: u64,
    ) -> Option<(Addresses, Uses)> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        let mut uses = Uses::default();
        // In place (as PyTorch's all-reduces are): one look-up serves both sides.
        let in_place = recv == send && recv_bytes == send_bytes;
        let sides = self.side(send, send_bytes, &mut uses).and_then(|input| {
            let output = if in_place {
                input
            } else {
                self.side(recv, recv_bytes, &mut uses)?
            };
            Ok((input, output))
        });
        let (input, output) = match sides {
            Ok(sides) => sides,
            Err(why) => {
                if self.said.fetch_or(1 << why as u64, Ordering::Relaxed) & (1 << why as u64) == 0 {
                    log_info!(
                        "zero-copy: rank {} takes the staged path for a buffer: {}",
                        self.rank,
                        why.says()
                    );
                }
                return None;
            }
        };
        let addresses = Addresses {
            input: input.unwrap_or([0; MAX_RANKS]),
            output: output.unwrap_or([0; MAX_RANKS]),
        };
        Some((addresses, uses))
    }

    /// Every rank's address of `bytes` at `pointer`, its positions added to `uses`; `None` for
    /// a side the peers do not touch (no bytes); why not where they cannot.
    fn side(
        &self,
        pointer: u64,
        bytes: u64,
        uses: &mut Uses,
    ) -> Result<Option<[u64; MAX_RANKS]>, Staged> {
        if bytes == 0 {
            return Ok(None);
        }
        // 16-aligned, as the direct kernels need.
        if !pointer.is_multiple_of(16) {
            return Err(Staged::Unaligned);
        }
        let (pieces, count) = self.pieces_of(pointer, bytes)?;
        let pieces = &pieces[..count];
        let mut placed = [(0, 0); MAX_PIECES];
        let bases = self.offsets_of(pieces, &mut placed[..count])?;
        placed[..count]
            .iter()
            .for_each(|&(position, _)| uses.add(position));
        // Past the ranks: zeros, never read.
        Ok(Some(
            bases.map(|b| b.wrapping_add(pointer - pieces[0].base)),
        ))
    }

    /// The allocations `bytes` at `pointer` lie in, and how many of them (the first ones of the
    /// array): one, or several side by side in one reservation (PyTorch's expandable segments),
    /// up to MAX_PIECES.
    fn pieces_of(
        &self,
        pointer: u64,
        bytes: u64,
    ) -> Result<([Allocation; MAX_PIECES], usize), Staged> {
        let end = pointer.checked_add(bytes).ok_or(Staged::NotShareable)?;
        let first = self
            .memory
            .allocation_of(pointer)
            .ok_or(Staged::NotShareable)?;
        // Past the count: copies of the first, never read.
        let mut pieces = [first; MAX_PIECES];
        let mut count = 1;
        loop {
            let piece_end = pieces[count - 1].base + pieces[count - 1].size;
            if end <= piece_end {
                return Ok((pieces, count));
            }
            if count == MAX_PIECES {
                return Err(Staged::AcrossAllocations);
            }
            // Only cuMem allocations can be mapped side by side in a peer (a mirror of their
            // reservation, device_memory.rs).
            let next = self
                .memory
                .allocation_of(piece_end)
                .ok_or(Staged::AcrossAllocations)?;
            let side_by_side = next.base == piece_end
                && next.reservation == first.reservation
                && first.sharing == Sharing::PosixFd
                && next.sharing == Sharing::PosixFd;
            if !side_by_side {
                return Err(Staged::AcrossAllocations);
            }
            pieces[count] = next;
            count += 1;
        }
    }

    /// Every rank's address of the first of `pieces` (allocations side by side, their
    /// positions written to `placed`), offering them to the peers first where needed; why not
    /// unless every peer mapped them all, side by side as here.
    fn offsets_of(
        &self,
        pieces: &[Allocation],
        placed: &mut [(usize, u64)],
    ) -> Result<[u64; MAX_RANKS], Staged> {
        let mut exports = lock(&self.exports);
        for (&allocation, place) in pieces.iter().zip(placed.iter_mut()) {
            *place = self
                .place(&mut exports, allocation)
                .ok_or(Staged::TableFull)?;
        }
        let offered_last = placed
            .iter()
            .map(|&(position, _)| exports.offered_at(position))
            .max()
            .unwrap_or_else(Instant::now);
        let deadline = offered_last + ANSWER_LIMIT;
        loop {
            match side_by_side(&exports, placed, pieces, self.processes.len()) {
                Some(result) => return result,
                None if self.broken.load(Ordering::Relaxed) => {
                    return Err(Staged::NoAnswerInTime);
                }
                None => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Staged::NoAnswerInTime);
            }
            exports = self
                .answered
                .wait_timeout(exports, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The position and generation of `allocation` in the table, offering it to the peers
    /// where it is new; `None` where the table has no room.
    fn place(&self, exports: &mut Exports<Marker>, allocation: Allocation) -> Option<(usize, u64)> {
        let mut retired: Vec<Retired> = Vec::new();
        let alive = |a: &Allocation| self.memory.allocation_of(a.base) == Some(*a);
        let placement = exports.place(allocation, alive, &mut retired);
        for gone in retired {
            self.tell_peers(
                Kind::Retire,
                gone.position,
                gone.generation,
                0,
                [0; 64],
                None,
            );
        }
        match placement {
            Placement::Full => None,
            Placement::Known {
                position,
                generation,
            } => Some((position, generation)),
            Placement::New {
                position,
                generation,
            } => {
                self.offered.fetch_add(1, Ordering::Relaxed);
                let size = allocation.size;
                match self.memory.share(&allocation) {
                    Ok(Shared::Ipc(handle)) => {
                        self.tell_peers(Kind::Export, position, generation, size, handle, None)
                    }
                    Ok(Shared::Fd(fd)) => {
                        let piece = Piece {
                            reservation: allocation.reservation,
                            base: allocation.base,
                            id: allocation.id,
                        };
                        self.tell_peers(
                            Kind::ExportFd,
                            position,
                            generation,
                            size,
                            piece.to_handle(),
                            Some(fd),
                        )
                    }
                    // Never shareable: answered "no" for every peer, so that no call waits.
                    Err(_) => (0..self.processes.len())
                        .filter(|&r| r != self.rank)
                        .for_each(|r| exports.answer(position, generation, r, 0)),
                }
                Some((position, generation))
            }
        }
    }

    /// The call that used `uses` is queued: behind a marker on `stream`, or (`None`) in a CUDA
    /// graph, which keeps its allocations offered for good.
    pub fn used(&self, uses: Uses, stream: Option<Stream>) {
        // Without a marker (none could be made) the positions are kept, as for a graph.
        let marker = stream.and_then(|stream| self.memory.marker(stream));
        let mut exports = lock(&self.exports);
        for position in uses.positions() {
            exports.used(position, marker.clone());
        }
    }

    /// Retires the offers whose allocation is gone (the program freed it), so that the peers
    /// close their mappings and the memory is the program's again; on the service's thread,
    /// every SWEEP_EVERY. The driver is asked without the table's lock, which callers take.
    pub(super) fn retire_freed(&self) {
        let offers = lock(&self.exports).offers();
        let allocations: Vec<Allocation> = offers.iter().map(|&(_, _, a)| a).collect();
        let answers = self.memory.gone(&allocations);
        debug_assert_eq!(answers.len(), allocations.len());
        let gone: Vec<(usize, u64)> = offers
            .into_iter()
            .zip(answers)
            .filter(|&(_, gone)| gone)
            .map(|((position, generation, _), _)| (position, generation))
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut exports = lock(&self.exports);
        for (position, generation) in gone {
            if let Some(retired) = exports.retire(position, generation) {
                self.tell_peers(
                    Kind::Retire,
                    retired.position,
                    retired.generation,
                    0,
                    [0; 64],
                    None,
                );
            }
        }
    }

    /// A launch's calls are queued and their uses marked (`used`), or it failed: what they
    /// offered may be replaced as any other offer from now on. Until then, never (exports.rs).
    pub fn launched(&self) {
        lock(&self.exports).queued();
    }

    /// Takes no more messages (its communicator's core is left to kernels that may still run):
    /// its mappings stay as they are.
    pub fn stop_serving(&self) {
        self.service.leave(self.comm);
        self.broken.store(true, Ordering::Relaxed);
        // A message being handled now closes nothing either.
        let _imports = lock(&self.imports);
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn give_up(&self, why: &str) {
        if !self.broken.swap(true, Ordering::Relaxed) {
            log_warn!(
                "zero-copy off for rank {} of a communicator: {why}; its large all-reduces go through the core's staging",
                self.rank
            );
        }
        // Callers waiting for answers go on at once.
        self.answered.notify_all();
    }

    /// A message to the process `process` could not be sent.
    fn unreachable(&self, process: u64, error: &std::io::Error) {
        let rank = self.processes.iter().position(|&p| p == process);
        let rank = rank.map_or_else(|| "?".to_string(), |r| r.to_string());
        self.give_up(&format!("rank {rank} cannot be reached ({error})"));
    }

    /// Posts a message to every peer (the same descriptor with each, if any).
    fn tell_peers(
        &self,
        kind: Kind,
        position: usize,
        generation: u64,
        value: u64,
        handle: IpcHandle,
        fd: Option<OwnedFd>,
    ) {
        let message = Message {
            kind,
            from: self.rank as u32,
            comm: self.comm,
            position: position as u32,
            generation,
            value,
            handle,
        };
        let fd = fd.map(Arc::new);
        for (r, &process) in self.processes.iter().enumerate() {
            if r != self.rank {
                self.service.post(Outgoing {
                    process,
                    message,
                    fd: fd.clone(),
                    sender: self.me.clone(),
                });
            }
        }
    }

    /// A message for this communicator (on the service's thread), with the descriptor that came
    /// with it.
    fn receive(&self, service: &Service, message: Message, fd: Option<OwnedFd>) {
        let from = message.from as usize;
        let position = message.position as usize;
        if from >= self.processes.len() || from == self.rank {
            return;
        }
        match message.kind {
            Kind::Export | Kind::ExportFd => {
                let (shared, origin) = match (message.kind, fd) {
                    (Kind::Export, _) => (Some(Shared::Ipc(message.handle)), None),
                    (_, fd) => {
                        let origin = Origin {
                            process: self.processes[from],
                            piece: Piece::from_handle(&message.handle),
                        };
                        (fd.map(Shared::Fd), Some(origin))
                    }
                };
                let (address, replaced) = self.map(
                    from,
                    position,
                    message.generation,
                    shared,
                    message.value,
                    origin,
                );
                let answer = Message {
                    kind: Kind::Ack,
                    from: self.rank as u32,
                    value: address,
                    handle: [0; 64],
                    ..message
                };
                service.post(Outgoing {
                    process: self.processes[from],
                    message: answer,
                    fd: None,
                    sender: self.me.clone(),
                });
                if let Some(replaced) = replaced {
                    self.park(replaced);
                }
            }
            Kind::Ack => {
                lock(&self.exports).answer(position, message.generation, from, message.value);
                self.answered.notify_all();
            }
            Kind::Retire => {
                let mut imports = lock(&self.imports);
                if !self.stopped.load(Ordering::Relaxed)
                    && imports
                        .get(&(from, position))
                        .is_some_and(|(generation, _)| *generation == message.generation)
                    && let Some((_, retired)) = imports.remove(&(from, position))
                {
                    drop(imports);
                    self.park(retired);
                }
            }
        }
    }

    /// Lets go of the mapping of a peer's allocation that is gone, or that the peer offers no
    /// more (no kernel uses it: exports.rs). One in a mirror is closed at once (which does not
    /// wait for the GPU, seen on H100 and H200), so that its memory is free again and the
    /// allocation made next at its place lands there; any other is kept until the communicator
    /// goes, or, past PARKED_LIMIT, the oldest is closed on the releasing thread.
    fn park(&self, mapping: Box<dyn Mapped>) {
        if mapping.in_mirror() {
            return;
        }
        let mut parked = lock(&self.parked);
        parked.push_back(mapping);
        if parked.len() > PARKED_LIMIT
            && let Some(oldest) = parked.pop_front()
        {
            // Closing waits for the GPU: on the releasing thread, or kept rather than closed
            // here.
            if let Err(kept) = release_later(oldest) {
                std::mem::forget(kept);
            }
        }
    }

    /// Maps rank `from`'s allocation offered at `position`: its address here (0 if it could not
    /// be mapped), and the mapping it replaces there, to be closed once the answer is sent.
    fn map(
        &self,
        from: usize,
        position: usize,
        generation: u64,
        shared: Option<Shared>,
        size: u64,
        origin: Option<Origin>,
    ) -> (u64, Option<Box<dyn Mapped>>) {
        let mut imports = lock(&self.imports);
        if self.stopped.load(Ordering::Relaxed) {
            return (0, None);
        }
        if let Some((known, mapped)) = imports.get(&(from, position)) {
            if *known == generation {
                return (mapped.address(), None);
            }
            if *known > generation {
                return (0, None);
            }
        }
        // The allocation this replaces is no longer used by any kernel (exports.rs). One in a
        // mirror is closed before its successor, most likely made at its place, is mapped.
        let mut replaced = imports.remove(&(from, position)).map(|(_, mapped)| mapped);
        if replaced.as_ref().is_some_and(|m| m.in_mirror()) {
            replaced = None;
        }
        let opened = shared
            .ok_or_else(|| "no file descriptor came".to_string())
            .and_then(|shared| self.memory.open(shared, size, origin));
        let address = match opened {
            Ok(mapped) => {
                let address = mapped.address();
                imports.insert((from, position), (generation, mapped));
                address
            }
            Err(e) => {
                log_info!(
                    "zero-copy: rank {} could not map a buffer of rank {from}: {e}",
                    self.rank
                );
                0
            }
        };
        (address, replaced)
    }
}

impl Drop for ZeroCopy {
    fn drop(&mut self) {
        self.service.leave(self.comm);
        log_info!(
            "zero-copy of rank {}: {} calls direct on the peers' buffers, {} through the staging; {} allocations offered",
            self.rank,
            self.served.load(Ordering::Relaxed),
            self.staged.load(Ordering::Relaxed),
            self.offered.load(Ordering::Relaxed)
        );
    }
}

/// Every rank's address of the first of `pieces`, placed at `placed`, once every peer has
/// answered for all: why not unless each peer mapped them all side by side as here, `None` while
/// answers are missing.
fn side_by_side(
    exports: &Exports<Marker>,
    placed: &[(usize, u64)],
    pieces: &[Allocation],
    nranks: usize,
) -> Option<Result<[u64; MAX_RANKS], Staged>> {
    let mut first = [0; MAX_RANKS];
    for (k, (&(position, generation), piece)) in placed.iter().zip(pieces).enumerate() {
        let Ok(addresses) = exports.addresses(position, generation)? else {
            return Some(Err(Staged::PeerCouldNotMap));
        };
        let apart = piece.base - pieces[0].base;
        if k == 0 {
            first = addresses;
        } else if (0..nranks).any(|r| addresses[r] != first[r].wrapping_add(apart)) {
            return Some(Err(Staged::NotSideBySide));
        }
    }
    Some(Ok(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// One rank's GPU memory, made up: allocations are numbers; a peer's allocation "maps" at an
    /// address made of its base and id, so that a stale mapping shows, or, one with an origin,
    /// at its offset in a mirror of its reservation where that place is free.
    #[derive(Default)]
    struct FakeMemory {
        allocations: Mutex<Vec<Allocation>>,
        /// Mappings of this rank's making still open.
        open: Arc<AtomicUsize>,
        refuse: bool,
        /// How long mapping takes.
        delay: Duration,
        /// (peer process, reservation start) -> the mirror's address here.
        mirrors: Mutex<HashMap<(u64, u64), u64>>,
        /// Places in mirrors mapped now.
        taken: Arc<Mutex<Vec<u64>>>,
        /// Look-ups of the allocation holding a pointer.
        lookups: AtomicUsize,
    }

    struct FakeMapping {
        address: u64,
        open: Arc<AtomicUsize>,
        taken: Arc<Mutex<Vec<u64>>>,
    }

    impl Mapped for FakeMapping {
        fn address(&self) -> u64 {
            self.address
        }
        fn in_mirror(&self) -> bool {
            self.address < 0x7000_0000_0000
        }
    }

    impl Drop for FakeMapping {
        fn drop(&mut self) {
            self.open.fetch_sub(1, Ordering::SeqCst);
            let mut taken = lock(&self.taken);
            if let Some(place) = taken.iter().position(|&a| a == self.address) {
                taken.swap_remove(place);
            }
        }
    }

    impl Memory for Arc<FakeMemory> {
        fn allocation_of(&self, pointer: u64) -> Option<Allocation> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            lock(&self.allocations)
                .iter()
                .find(|a| a.holds(pointer, 1))
                .copied()
        }
        fn gone(&self, allocations: &[Allocation]) -> Vec<bool> {
            let now = lock(&self.allocations);
            let holding = |a: &Allocation| now.iter().find(|b| b.holds(a.base, 1)).copied();
            allocations.iter().map(|a| holding(a) != Some(*a)).collect()
        }
        fn share(&self, a: &Allocation) -> Result<Shared, String> {
            let mut identity = [0u8; 64];
            identity[..8].copy_from_slice(&a.base.to_le_bytes());
            identity[8..16].copy_from_slice(&a.id.to_le_bytes());
            match a.sharing {
                Sharing::LegacyIpc => Ok(Shared::Ipc(identity)),
                // The identity in a file, passed as its descriptor.
                Sharing::PosixFd => {
                    let path = std::env::temp_dir().join(format!(
                        "ncclshim-fake-fd-{}-{:x}-{}",
                        std::process::id(),
                        a.base,
                        a.id
                    ));
                    std::fs::write(&path, &identity[..16]).map_err(|e| e.to_string())?;
                    let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
                    let _ = std::fs::remove_file(&path);
                    Ok(Shared::Fd(file.into()))
                }
            }
        }
        fn open(
            &self,
            shared: Shared,
            _size: u64,
            origin: Option<Origin>,
        ) -> Result<Box<dyn Mapped>, String> {
            if self.refuse {
                return Err("refused".into());
            }
            std::thread::sleep(self.delay);
            let identity = match shared {
                Shared::Ipc(handle) => handle[..16].to_vec(),
                Shared::Fd(fd) => {
                    // At offset 0: every peer's descriptor shares one file offset.
                    use std::os::unix::fs::FileExt;
                    let mut bytes = vec![0u8; 16];
                    std::fs::File::from(fd)
                        .read_exact_at(&mut bytes, 0)
                        .map_err(|e| e.to_string())?;
                    bytes
                }
            };
            let base = u64::from_le_bytes(identity[..8].try_into().unwrap());
            let id = u64::from_le_bytes(identity[8..16].try_into().unwrap());
            let mut taken = lock(&self.taken);
            let in_mirror = origin.and_then(|o| {
                let mut mirrors = lock(&self.mirrors);
                let next = 0x5000_0000_0000 + ((mirrors.len() as u64) << 36);
                let mirror = *mirrors
                    .entry((o.process, o.piece.reservation.0))
                    .or_insert(next);
                Some(mirror + o.piece.offset()?).filter(|a| !taken.contains(a))
            });
            let address = in_mirror.unwrap_or(0x7000_0000_0000 + (id << 32) + (base & 0xffff_ffff));
            taken.push(address);
            self.open.fetch_add(1, Ordering::SeqCst);
            Ok(Box::new(FakeMapping {
                address,
                open: self.open.clone(),
                taken: self.taken.clone(),
            }))
        }
        fn marker(&self, _stream: Stream) -> Option<Marker> {
            None
        }
    }

    /// Identities no other test (or process) uses.
    fn identities(n: usize) -> Vec<u64> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let first = NEXT.fetch_add(n, Ordering::SeqCst) as u64;
        (0..n as u64)
            .map(|i| (std::process::id() as u64) << 32 | (first + i) << 8 | 0xa5)
            .collect()
    }

    /// `n` ranks, each a service of its own (as separate processes would have), with their
    /// memories.
    fn ranks(n: usize, refuse: bool) -> Vec<(Arc<ZeroCopy>, Arc<FakeMemory>)> {
        slow_ranks(n, refuse, Duration::ZERO)
    }

    fn slow_ranks(
        n: usize,
        refuse: bool,
        delay: Duration,
    ) -> Vec<(Arc<ZeroCopy>, Arc<FakeMemory>)> {
        let processes = identities(n);
        let comm = processes[0] ^ 0x5eed;
        (0..n)
            .map(|rank| {
                let service = Service::start(processes[rank]).unwrap();
                let memory = Arc::new(FakeMemory {
                    refuse,
                    delay,
                    ..FakeMemory::default()
                });
                let member = ZeroCopy::join(
                    service,
                    comm,
                    rank,
                    processes.clone(),
                    Box::new(memory.clone()),
                );
                (member, memory)
            })
            .collect()
    }

    fn allocate(memory: &FakeMemory, base: u64, id: u64) {
        allocate_shared(memory, base, id, Sharing::LegacyIpc);
    }

    fn allocate_shared(memory: &FakeMemory, base: u64, id: u64, sharing: Sharing) {
        allocate_in(memory, base, id, sharing, (base, 1 << 20));
    }

    /// An allocation of 1 MiB at `base` in the range `reservation` (start, size).
    fn allocate_in(
        memory: &FakeMemory,
        base: u64,
        id: u64,
        sharing: Sharing,
        reservation: (u64, u64),
    ) {
        let mut allocations = lock(&memory.allocations);
        allocations.retain(|a| a.base != base);
        allocations.push(Allocation {
            base,
            size: 1 << 20,
            id,
            sharing,
            reservation,
        });
    }

    #[test]
    fn peers_map_a_new_allocation_once_and_every_rank_gets_their_addresses() {
        let ranks = ranks(3, false);
        let (member, memory) = &ranks[1];
        allocate(memory, 0x10_0000, 1);
        allocate(memory, 0x40_0000, 2);
        let (addresses, uses) = member
            .addresses(0x10_0010, 4096, 0x40_0000, 4096)
            .expect("every peer maps it");
        assert_eq!(addresses.input[1], 0x10_0010);
        assert_eq!(addresses.output[1], 0x40_0000);
        for peer in [0, 2] {
            assert_eq!(addresses.input[peer], 0x7001_0010_0010);
            assert_eq!(addresses.output[peer], 0x7002_0040_0000);
            assert_eq!(ranks[peer].1.open.load(Ordering::SeqCst), 2);
        }
        member.used(uses, None);
        // Found in the table from now on: nothing is mapped again.
        let again = member
            .addresses(0x10_0000, 4096, 0x40_0010, 4096)
            .unwrap()
            .0;
        assert_eq!(again.input[0], 0x7001_0010_0000);
        assert_eq!(again.output[2], 0x7002_0040_0010);
        assert_eq!(ranks[0].1.open.load(Ordering::SeqCst), 2);
        assert!(
            member
                .addresses(0x10_0000, 2 << 20, 0x40_0000, 2 << 20)
                .is_none(),
            "past the end of the allocation"
        );
        assert!(
            member.addresses(0x90_0000, 16, 0x40_0000, 16).is_none(),
            "not shareable"
        );
    }

    /// A call in place looks its buffer up once; one out of place, once a side.
    #[test]
    fn a_call_in_place_looks_its_buffer_up_once() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        allocate(memory, 0x10_0000, 1);
        allocate(memory, 0x40_0000, 2);
        assert!(member.addresses(0x10_0000, 4096, 0x40_0000, 4096).is_some());
        let lookups = || memory.lookups.load(Ordering::SeqCst);
        let before = lookups();
        let (in_place, _) = member.addresses(0x10_0000, 4096, 0x10_0000, 4096).unwrap();
        assert_eq!(lookups() - before, 1);
        assert_eq!(in_place.input, in_place.output);
        let before = lookups();
        assert!(member.addresses(0x10_0000, 4096, 0x40_0000, 4096).is_some());
        assert_eq!(lookups() - before, 2);
    }

    /// Launches whose calls all go staged after offering (here, an unaligned output) leave
    /// nothing held: once launched, their offers are replaced as the table fills, and a later
    /// call on a new allocation still goes zero-copy.
    #[test]
    fn offers_of_staged_launches_do_not_fill_the_table_for_good() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        for i in 0..exports::CAPACITY as u64 + 8 {
            let base = 0x1_0000_0000 + (i << 21);
            allocate(memory, base, i + 1);
            assert!(member.addresses(base, 64, base + 8, 64).is_none());
            member.launched();
        }
        let base = 0x9_0000_0000;
        allocate(memory, base, 999);
        assert!(member.addresses(base, 64, base, 64).is_some());
    }

    /// cuMem allocations travel as file descriptors (SCM_RIGHTS), mixed with IPC ones.
    #[test]
    fn allocations_shared_as_file_descriptors_are_mapped_too() {
        let ranks = ranks(3, false);
        let (member, memory) = &ranks[2];
        allocate_shared(memory, 0x80_0000, 3, Sharing::PosixFd);
        allocate(memory, 0x90_0000, 4);
        let (addresses, _) = member
            .addresses(0x80_0040, 4096, 0x90_0000, 4096)
            .expect("every peer maps it");
        for peer in [0, 1] {
            // The first mirror of the peer's: the allocation's own reservation.
            assert_eq!(addresses.input[peer], 0x5000_0000_0040);
            assert_eq!(addresses.output[peer], 0x7004_0090_0000);
        }
    }

    /// A buffer across cuMem allocations side by side in one reservation (PyTorch's expandable
    /// segments): every peer maps them side by side in a mirror, and the call goes zero-copy.
    #[test]
    fn a_buffer_across_allocations_side_by_side_is_one_range_at_every_peer() {
        const MIB: u64 = 1 << 20;
        let ranks = ranks(3, false);
        let (member, memory) = &ranks[1];
        let start = 0x4000_0000;
        for k in 0..3 {
            let base = start + 4 * MIB + k * MIB;
            allocate_in(memory, base, 10 + k, Sharing::PosixFd, (start, 64 * MIB));
        }
        let pointer = start + 4 * MIB + MIB / 2;
        let (addresses, uses) = member
            .addresses(pointer, 2 * MIB, pointer, 2 * MIB)
            .expect("every peer maps the three side by side");
        assert_eq!(uses.positions().count(), 3);
        assert_eq!(addresses.input[1], pointer);
        for peer in [0, 2] {
            let mirror = addresses.input[peer] - 4 * MIB - MIB / 2;
            assert!(
                (0x5000_0000_0000..0x7000_0000_0000).contains(&mirror),
                "mapped apart: {mirror:#x}"
            );
            assert_eq!(addresses.output[peer], addresses.input[peer]);
        }
        // Past the last allocation of the reservation, or into one of another reservation or
        // a cudaMalloc one: staged.
        assert!(member.addresses(pointer, 3 * MIB, 0, 0).is_none());
        allocate_in(
            memory,
            start + 7 * MIB,
            20,
            Sharing::PosixFd,
            (start + 7 * MIB, MIB),
        );
        assert!(member.addresses(pointer, 3 * MIB, 0, 0).is_none());
        allocate(memory, start + 7 * MIB, 21);
        assert!(member.addresses(pointer, 3 * MIB, 0, 0).is_none());
        assert!(member.addresses(start + 7 * MIB, 64, 0, 0).is_some());
    }

    /// Every rank offers many allocations at once (a large tensor of expandable segments on each
    /// side): more messages than a peer's queue holds. No rank's service may wait on a peer
    /// whose service waits on it: every call gets its answers.
    #[test]
    fn ranks_offering_many_allocations_at_once_all_get_their_answers() {
        const MIB: u64 = 1 << 20;
        let ranks = ranks(2, false);
        let start = 0x1_0000_0000;
        let pieces = MAX_PIECES as u64;
        for (rank, (_, memory)) in ranks.iter().enumerate() {
            // Ids of each rank's own (as each process's driver gives them).
            let id = 1000 * (rank as u64 + 1);
            for k in 0..2 * pieces {
                let reservation = (start, 2 * pieces * MIB);
                allocate_in(
                    memory,
                    start + k * MIB,
                    id + k,
                    Sharing::PosixFd,
                    reservation,
                );
            }
        }
        let started = Instant::now();
        let (done, finished) = std::sync::mpsc::channel();
        for (member, _) in &ranks {
            let (member, done) = (member.clone(), done.clone());
            // Not joined: a thread that hangs fails the test by the timeout below.
            std::thread::spawn(move || {
                let bytes = pieces * MIB;
                let _ = done.send(
                    member
                        .addresses(start, bytes, start + bytes, bytes)
                        .is_some(),
                );
            });
        }
        for _ in &ranks {
            let answered = finished.recv_timeout(Duration::from_secs(10));
            assert_eq!(answered, Ok(true), "a call hung or went staged");
        }
        assert!(started.elapsed() < ANSWER_LIMIT);
    }

    /// An allocation made again in a reservation (as PyTorch's expandable segments do after
    /// `empty_cache`, which every CUDA graph capture calls) takes its place in the peer's mirror:
    /// the mapping of the one before is closed first, and a buffer across it stays zero-copy.
    /// Where the place is taken all the same, it is mapped apart and such a buffer is staged.
    #[test]
    fn an_allocation_made_again_takes_its_place_in_the_mirror_or_is_staged() {
        const MIB: u64 = 1 << 20;
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        let start = 0x8000_0000;
        let reservation = (start, 16 * MIB);
        allocate_in(memory, start, 1, Sharing::PosixFd, reservation);
        allocate_in(memory, start + MIB, 2, Sharing::PosixFd, reservation);
        let across = start + MIB / 2;
        let before = member.addresses(across, MIB, 0, 0).expect("side by side").0;
        allocate_in(memory, start + MIB, 3, Sharing::PosixFd, reservation);
        let after = member.addresses(across, MIB, 0, 0).expect("at its place").0;
        assert_eq!(after.input[1], before.input[1]);
        assert_eq!(
            ranks[1].1.open.load(Ordering::SeqCst),
            2,
            "the old one closed"
        );
        // The place of the next one is held by something else at the peer.
        let mirror = before.input[1] - MIB / 2;
        lock(&ranks[1].1.taken).push(mirror + MIB);
        allocate_in(memory, start + MIB, 4, Sharing::PosixFd, reservation);
        assert!(member.addresses(across, MIB, 0, 0).is_none());
        let within = member
            .addresses(start + MIB, 64, 0, 0)
            .expect("mapped apart")
            .0;
        assert!(within.input[1] >= 0x7000_0000_0000);
    }

    /// Freed and made again at the same address, an allocation is mapped anew: a call never
    /// reads through the mapping of the one before (the test the buffer id is for).
    #[test]
    fn an_allocation_made_again_at_the_same_address_is_mapped_anew() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        allocate(memory, 0x20_0000, 7);
        let first = member.addresses(0x20_0000, 64, 0x20_0000, 64).unwrap().0;
        assert_eq!(first.input[1], 0x7007_0020_0000);
        allocate(memory, 0x20_0000, 8);
        let second = member.addresses(0x20_0000, 64, 0x20_0000, 64).unwrap().0;
        assert_eq!(
            second.input[1], 0x7008_0020_0000,
            "read through a stale mapping"
        );
        // Parked once the answer is sent.
        wait_until(in_5_s(), || !lock(&ranks[1].0.parked).is_empty());
        assert_eq!(lock(&ranks[1].0.parked).len(), 1);
        assert_eq!(
            ranks[1].1.open.load(Ordering::SeqCst),
            2,
            "the peer keeps the old mapping until the communicator goes"
        );
    }

    #[test]
    fn mappings_of_allocations_that_are_gone_are_kept_up_to_a_limit() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        for id in 1..=PARKED_LIMIT as u64 + 6 {
            allocate(memory, 0x70_0000, id);
            assert!(member.addresses(0x70_0000, 64, 0x70_0000, 64).is_some());
        }
        let deadline = in_5_s();
        wait_until(deadline, || lock(&ranks[1].0.parked).len() == PARKED_LIMIT);
        assert_eq!(lock(&ranks[1].0.parked).len(), PARKED_LIMIT);
        let open = || ranks[1].1.open.load(Ordering::SeqCst);
        wait_until(deadline, || open() == PARKED_LIMIT + 1);
        assert_eq!(open(), PARKED_LIMIT + 1, "the oldest were closed");
    }

    fn in_5_s() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// Waits until `done` says so, or `deadline` passes (the caller then asserts).
    fn wait_until(deadline: Instant, done: impl Fn() -> bool) {
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits (up to 5 s) until `count` of `memory`'s mappings are open, and says so.
    fn wait_for_open(memory: &FakeMemory, count: usize) {
        wait_until(in_5_s(), || memory.open.load(Ordering::SeqCst) == count);
        assert_eq!(memory.open.load(Ordering::SeqCst), count);
    }

    /// The risk the sweep is for: a peer's mapping keeps freed memory from being used again, and
    /// a program may free memory and never call again. A cuMem allocation's mappings (in
    /// mirrors) are closed at once; a cudaMalloc one's are parked.
    #[test]
    fn a_freed_allocation_is_retired_without_another_call() {
        let ranks = ranks(3, false);
        let (member, memory) = &ranks[0];
        let cumem = (0x80_0000, 2 << 20);
        allocate_in(memory, 0x80_0000, 1, Sharing::PosixFd, cumem);
        allocate_in(memory, 0x90_0000, 1, Sharing::PosixFd, cumem);
        allocate(memory, 0x100_0000, 1);
        for base in [0x80_0000, 0x90_0000, 0x100_0000] {
            assert!(member.addresses(base, 64, base, 64).is_some());
        }
        wait_for_open(&ranks[1].1, 3);
        wait_for_open(&ranks[2].1, 3);
        // Live allocations are never retired.
        std::thread::sleep(SWEEP_EVERY * 5);
        assert_eq!(lock(&member.exports).len(), 3);
        assert_eq!(ranks[1].1.open.load(Ordering::SeqCst), 3);
        // Freed: no call of this rank comes after; its service's sweep finds them gone.
        lock(&memory.allocations).retain(|a| a.base != 0x80_0000 && a.base != 0x100_0000);
        wait_for_open(&ranks[1].1, 2);
        wait_for_open(&ranks[2].1, 2);
        wait_until(in_5_s(), || !lock(&ranks[2].0.parked).is_empty());
        assert_eq!(lock(&ranks[2].0.parked).len(), 1, "the cudaMalloc one");
        assert_eq!(lock(&member.exports).len(), 1);
        // The other stays offered and mapped.
        let known = member.addresses(0x90_0000, 64, 0x90_0000, 64).unwrap().0;
        assert_eq!(known.input[1], 0x5000_0010_0000);
        assert_eq!(lock(&member.exports).len(), 1);
        // Made again at the same place: offered anew, the peers map it there.
        allocate_in(memory, 0x80_0000, 2, Sharing::PosixFd, cumem);
        let again = member.addresses(0x80_0000, 64, 0x80_0000, 64).unwrap().0;
        assert_eq!(again.input[1], 0x5000_0000_0000);
    }

    /// A core left to kernels that may still run keeps its mappings, whatever its peers retire.
    #[test]
    fn a_member_that_stopped_serving_closes_nothing() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        let cumem = (0xa0_0000, 1 << 20);
        allocate_in(memory, 0xa0_0000, 1, Sharing::PosixFd, cumem);
        assert!(member.addresses(0xa0_0000, 64, 0xa0_0000, 64).is_some());
        wait_for_open(&ranks[1].1, 1);
        ranks[1].0.stop_serving();
        lock(&memory.allocations).clear();
        let in_1_s = Instant::now() + Duration::from_secs(1);
        wait_until(in_1_s, || lock(&member.exports).offers().is_empty());
        assert!(lock(&member.exports).offers().is_empty(), "not retired");
        std::thread::sleep(SWEEP_EVERY * 5);
        assert_eq!(
            ranks[1].1.open.load(Ordering::SeqCst),
            1,
            "a mapping was closed"
        );
    }

    #[test]
    fn a_peer_that_cannot_map_answers_at_once_and_the_call_goes_staged() {
        let ranks = ranks(2, true);
        let (member, memory) = &ranks[0];
        allocate(memory, 0x30_0000, 1);
        let started = Instant::now();
        assert!(member.addresses(0x30_0000, 64, 0x30_0000, 64).is_none());
        assert!(member.addresses(0x30_0000, 64, 0x30_0000, 64).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            !member.broken.load(Ordering::Relaxed),
            "only that allocation"
        );
    }

    /// A peer slow to answer holds up the first call only, up to the limit; later calls go
    /// staged without waiting until the answer is in, then zero-copy.
    #[test]
    fn a_late_answer_is_waited_for_once() {
        let ranks = slow_ranks(2, false, ANSWER_LIMIT + Duration::from_millis(500));
        let (member, memory) = &ranks[0];
        allocate(memory, 0x58_0000, 1);
        let started = Instant::now();
        assert!(member.addresses(0x58_0000, 64, 0x58_0000, 64).is_none());
        assert!(started.elapsed() >= ANSWER_LIMIT);
        let started = Instant::now();
        assert!(member.addresses(0x58_0000, 64, 0x58_0000, 64).is_none());
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "waited again"
        );
        std::thread::sleep(Duration::from_secs(1));
        assert!(member.addresses(0x58_0000, 64, 0x58_0000, 64).is_some());
        assert!(!member.broken.load(Ordering::Relaxed));
    }

    #[test]
    fn a_peer_that_cannot_be_reached_turns_zero_copy_off() {
        let service = Service::start(identities(1)[0]).unwrap();
        let memory = Arc::new(FakeMemory::default());
        allocate(&memory, 0x50_0000, 1);
        // Rank 1's process has no service.
        let member = ZeroCopy::join(service, 77, 0, identities(2), Box::new(memory.clone()));
        assert!(member.addresses(0x50_0000, 64, 0x50_0000, 64).is_none());
        assert!(member.broken.load(Ordering::Relaxed));
    }

    #[test]
    fn a_member_that_left_gets_no_more_messages() {
        let ranks = ranks(2, false);
        let (member, memory) = &ranks[0];
        allocate(memory, 0x60_0000, 1);
        assert!(member.addresses(0x60_0000, 64, 0x60_0000, 64).is_some());
        let peer_open = ranks[1].1.open.clone();
        assert_eq!(peer_open.load(Ordering::SeqCst), 1);
        drop(ranks);
        // The service thread may still hold the member for a moment.
        wait_until(in_5_s(), || peer_open.load(Ordering::SeqCst) == 0);
        assert_eq!(
            peer_open.load(Ordering::SeqCst),
            0,
            "its mappings are closed"
        );
    }
}
