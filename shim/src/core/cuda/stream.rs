//! Streams and events: streams of ours, the order of a communicator's streams, timing with
//! events, capture state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::device::Device;
use super::error::{Cuda, Named};
use super::handles::{DevicePtr, Stream};
use cudarc::driver::{result, sys};

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

    /// Copies `src.len()` bytes from `src` on the device into `dst`, after what the stream holds.
    pub fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Cuda<()> {
        // SAFETY: `src` holds at least `dst.len()` bytes; our stream, waited for before `dst`
        // is read or goes.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }.named("cuMemcpyDtoHAsync")?;
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

/// Whether `stream` is being captured into a CUDA graph (no for a stream the driver refuses, and,
/// as NCCL has it, for a capture already invalidated, into which nothing can be launched).
pub fn capturing(stream: Stream) -> bool {
    // SAFETY: a stream of the caller's; a bad one answers an error.
    unsafe { result::stream::is_capturing(stream) }
        .is_ok_and(|c| c == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
}

/// The id of the capture `stream` is in, `None` outside one. Needs a driver of CUDA 12.3 or
/// later (where green contexts are, the only callers).
pub fn capture_id(stream: Stream) -> Option<u64> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let (graph, nodes, edges, count) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: a stream alive for its call; writes the status and id, asks nothing else.
    let asked = unsafe {
        sys::cuStreamGetCaptureInfo_v3(stream, &mut status, &mut id, graph, nodes, edges, count)
    };
    let active = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    (asked == sys::CUresult::CUDA_SUCCESS && status == active).then_some(id)
}

/// Keeps one communicator's kernels in the order they were called, whatever the streams: NCCL
/// orders a communicator's operations itself, and programs may rely on it (two all-reduces on
/// two streams with no dependency between them), while two of our kernels of one communicator
/// must never run at once (they share its flags and staging). Each launch is marked by an event
/// recorded right after it; a launch on another stream than the last one waits for that mark.
/// The last stream itself is never asked anything again: the program may have destroyed it
/// since, and the driver faults on a destroyed stream's handle. Not across a stream capture (an
/// event recorded outside one cannot be waited on inside it, and the other way round): captured
/// calls are ordered by the graph the program builds.
pub struct StreamOrder {
    /// The stream of the last launch outside a capture, `NO_STREAM` before the first.
    last: AtomicU64,
    /// `ended` marks the end of the last launch outside a capture.
    marked: AtomicBool,
    /// Recorded right after each launch outside a capture.
    ended: sys::CUevent,
    /// Joins a group's streams (`join`).
    joining: sys::CUevent,
}

const NO_STREAM: u64 = u64::MAX;

// SAFETY: a CUDA event may be used from any thread.
unsafe impl Send for StreamOrder {}
// SAFETY: as above; the rest is atomic.
unsafe impl Sync for StreamOrder {}

impl StreamOrder {
    /// Needs the communicator's context current.
    pub fn new() -> Cuda<StreamOrder> {
        let event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .named("cuEventCreate")
        };
        let ended = event()?;
        let joining = event().inspect_err(|_| {
            // SAFETY: ours, just made, used by nothing.
            let _ = unsafe { result::event::destroy(ended) };
        })?;
        Ok(StreamOrder {
            last: AtomicU64::new(NO_STREAM),
            marked: AtomicBool::new(false),
            ended,
            joining,
        })
    }

    /// Called before a launch on `stream` (`capturing`: in a stream capture), in the
    /// communicator's context. A captured launch changes nothing: uncaptured launches are
    /// ordered among themselves, whatever was captured between them.
    pub fn before_launch(&self, stream: Stream, capturing: bool) -> Cuda<()> {
        if capturing {
            return Ok(());
        }
        let last = self.last.load(Ordering::Relaxed);
        // cudaStreamPerThread names another stream on each thread: never the same as the last.
        let other = last != stream as u64 || stream == super::PER_THREAD_STREAM;
        if last != NO_STREAM && other && self.marked.load(Ordering::Relaxed) {
            self.wait(stream, self.ended)?;
        }
        // Only once it waits: a launch that could not wait leaves the next to wait instead.
        self.last.store(stream as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Called after a launch on `stream` (`capturing` as given to `before_launch`).
    pub fn after_launch(&self, stream: Stream, capturing: bool) {
        if capturing {
            return;
        }
        // SAFETY: our event; the caller's stream, just launched on.
        let marked = unsafe { result::event::record(self.ended, stream) }.is_ok();
        self.marked.store(marked, Ordering::Relaxed);
    }

    /// Makes `waiter` wait for what `on` holds so far, in the communicator's context: both
    /// streams uncaptured, or both captured into one graph, which the wait then joins (a group's
    /// calls of one communicator are all captured or none, group::queue), or `on` captured and
    /// `waiter` not yet in any capture, which the wait brings into `on`'s (a fork).
    pub fn join(&self, waiter: Stream, on: Stream) -> Cuda<()> {
        // SAFETY: our event; a stream the program gave a call of the group.
        unsafe { result::event::record(self.joining, on) }.named("cuEventRecord")?;
        self.wait(waiter, self.joining)
    }

    /// Makes `stream` wait for what `event` last recorded.
    fn wait(&self, stream: Stream, event: sys::CUevent) -> Cuda<()> {
        // SAFETY: our event; a stream of the program's.
        unsafe {
            result::stream::wait_event(
                stream,
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .named("cuStreamWaitEvent")
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        for event in [self.ended, self.joining] {
            // SAFETY: our event; a pending wait on it keeps what it needs.
            let _ = unsafe { result::event::destroy(event) };
        }
    }
}

/// Waits for all work on the current context's device.
pub fn synchronize() -> Cuda<()> {
    result::ctx::synchronize().named("cuCtxSynchronize")
}
