//! The communicators being set up by this thread (`Candidate`), and the exchange of their ranks'
//! records: in shared memory where every rank is on this host (`Place`), else through the real
//! NCCL's all-gather where their ranks meet: on each communicator itself, or, for a child of
//! ncclCommSplit, on its parent (`Meeting`).

use std::ffi::c_void;

use super::agreement::RECORD_BYTES;
use super::rendezvous::Place;
use crate::core::comm::Parts;
use crate::core::ctas::Asked;
use crate::core::cuda::{self, Cuda, Device, DeviceBuffer, OwnedStream};
use crate::ffi::{cudaStream_t, ncclComm_t, ncclInProgress, ncclResult_t, ncclSuccess, ncclUint8};
use crate::real;

/// One communicator being set up by this thread (NULL: none, for a rank that takes part in its
/// parent's exchange without a child of its own).
pub(super) struct Candidate {
    pub(super) comm: ncclComm_t,
    pub(super) blocking: bool,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    /// Where its ranks exchange their records.
    pub(super) meeting: Meeting,
    /// Which of the meeting's communicators it is (the split's color; 0 on its own).
    pub(super) color: i32,
    /// This rank's GPU, once opened.
    pub(super) device: Option<Device>,
    /// Where the exchanges happen through NCCL (none where they happen in shared memory, or
    /// where even that could not be had).
    pub(super) exchange: Option<Exchange>,
    /// Where they happen instead, in shared memory, if every rank signed in there.
    pub(super) place: Option<Place>,
    pub(super) parts: Option<Parts>,
    pub(super) why_not: Option<String>,
    /// What its user asked of NCCL's CTAs (ctas.rs).
    pub(super) ctas: Asked,
    /// A rank's nonblocking child of a split, set up later (`childless`); NULL for the others.
    pub(super) waiting: ncclComm_t,
}

impl Candidate {
    /// Its GPU and its room there for the exchanges through NCCL, where it has both.
    fn through_nccl(&self) -> Option<(Device, &Exchange)> {
        self.device.zip(self.exchange.as_ref())
    }
}

/// The communicator whose all-gathers carry a set-up's records, and this rank's place in it.
#[derive(Clone, Copy)]
pub(super) struct Meeting {
    pub(super) comm: ncclComm_t,
    pub(super) rank: usize,
    pub(super) nranks: usize,
}

/// Where a rank's records pass through the real NCCL's all-gather, on its GPU; freed when
/// dropped.
pub(super) struct Exchange {
    pub(super) buffer: DeviceBuffer,
    pub(super) stream: OwnedStream,
}

pub(super) fn exchange_space(device: Device, nranks: usize) -> Cuda<Exchange> {
    let bytes = nranks.max(1) * RECORD_BYTES;
    let buffer = DeviceBuffer::alloc(device, bytes)?;
    let stream = OwnedStream::create(device)?;
    // Zeroed, so that every byte read back is one written (compute-sanitizer's initcheck does
    // not see NCCL's kernels write it).
    {
        let _context = device.enter()?;
        stream.fill(buffer.pointer, 0, bytes)?;
    }
    Ok(Exchange { buffer, stream })
}

/// One all-gather of `payloads[i]` (equal lengths) per candidate on its meeting: in shared
/// memory where it has a place there, else grouped through the real NCCL; the gathered bytes (a
/// payload per rank of the meeting), or `None` where it failed.
pub(super) fn all_gather(candidates: &[Candidate], payloads: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let len = payloads.first().map_or(0, Vec::len);
    assert!(len <= RECORD_BYTES && payloads.iter().all(|p| p.len() == len));
    // Published before NCCL's all-gathers, which wait for peers that may be waiting here next.
    let published: Vec<bool> = candidates
        .iter()
        .zip(payloads)
        .map(|(c, payload)| c.place.as_ref().is_some_and(|p| p.publish(payload)))
        .collect();
    let staged: Vec<bool> = candidates
        .iter()
        .zip(payloads)
        .map(|(c, payload)| {
            c.place.is_none()
                && c.through_nccl().is_some_and(|(device, x)| {
                    let _context = device.enter();
                    let at = x.buffer.pointer + (c.meeting.rank * len) as u64;
                    x.stream.copy_to_device(at, payload).is_ok()
                })
        })
        .collect();
    let issued = || {
        candidates
            .iter()
            .zip(&staged)
            .filter(|(_, staged)| **staged)
            .map(|(c, _)| c)
    };
    // SAFETY: communicators the real NCCL initialised; buffers of nranks * len bytes.
    let end = unsafe {
        real::ncclGroupStart();
        for c in issued() {
            let (device, x) = c.through_nccl().unwrap();
            let _context = device.enter();
            let recv = x.buffer.pointer as *mut c_void;
            let send = (x.buffer.pointer + (c.meeting.rank * len) as u64) as *const c_void;
            let stream = x.stream.stream as cudaStream_t;
            real::ncclAllGather(send, recv, len, ncclUint8, c.meeting.comm, stream);
        }
        real::ncclGroupEnd()
    };
    // A nonblocking group is issued by a thread of the real NCCL's: wait for it on every
    // communicator, each then free for the program's next operation.
    let launched = if end == ncclInProgress {
        // Every one settled, even past a failure.
        let states: Vec<ncclResult_t> = issued().map(|c| settle(c.meeting.comm)).collect();
        states.iter().all(|&state| state == ncclSuccess)
    } else {
        end == ncclSuccess
    };
    candidates
        .iter()
        .zip(staged)
        .zip(published)
        .map(|((c, staged), published)| {
            if let Some(place) = &c.place {
                return published.then(|| place.collect(len)).flatten();
            }
            let (device, x) = c.through_nccl()?;
            if !(staged && launched) {
                return None;
            }
            let _context = device.enter().ok()?;
            x.stream.synchronize().ok()?;
            let mut all = vec![0u8; c.meeting.nranks * len];
            cuda::copy_to_host(&mut all, x.buffer.pointer).ok()?;
            Some(all)
        })
        .collect()
}

/// Waits until the real NCCL has finished the last operation on `comm` (always at once on a
/// blocking communicator) and returns its state.
pub fn settle(comm: ncclComm_t) -> ncclResult_t {
    loop {
        let mut state = ncclInProgress;
        // SAFETY: a communicator of the caller's; the state is written.
        let result = unsafe { real::ncclCommGetAsyncError(comm, &mut state) };
        if result != ncclSuccess {
            return result;
        }
        if state != ncclInProgress {
            return state;
        }
        std::thread::yield_now();
    }
}
