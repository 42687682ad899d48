//! One communicator's core: its buffer (flags, staging, low-latency and sentinel inboxes), the peers'
//! buffers as this rank maps them, the kernels of its device; launching an all-reduce on the
//! caller's stream; releasing everything without hanging.

use std::ffi::c_void;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::cuda::{self, Cuda, CudaError, Device, DevicePtr, HostFlag};
use super::kernels::Kernels;
use super::policy::{CommFacts, MAX_RANKS, Plan};
use super::types::Algorithm;

/// Bytes at the start of each rank's buffer for the flags (see all_reduce.cu), rounded up.
pub const FLAGS_BYTES: usize = 64 << 10;

/// The kernels' view of every rank's buffer: `struct Peers` in all_reduce.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Peers {
    pub staging: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
}

impl Peers {
    /// Every rank's buffer base (as this rank maps it) to the kernels' view.
    pub fn from_bases(bases: &[DevicePtr]) -> Peers {
        let mut peers = Peers::default();
        for (r, &base) in bases.iter().enumerate() {
            peers.flags[r] = base;
            peers.staging[r] = base + FLAGS_BYTES as u64;
        }
        peers
    }
}

pub struct CoreComm {
    pub rank: usize,
    /// A blocking communicator (see `core::group_end` for what differs).
    pub blocking: bool,
    /// What every rank agreed on at set-up, for planning calls.
    pub facts: CommFacts,
    pub device: Device,
    kernels: Arc<Kernels>,
    peers: Peers,
    half_bytes: u64,
    /// This rank's own allocation.
    buffer: DevicePtr,
    /// Peers' allocations mapped through CUDA IPC, to close.
    opened: Vec<DevicePtr>,
    abort: HostFlag,
    early_launch: bool,
}

// SAFETY: the CUDA handles inside may be used from any thread; launches only read the struct.
unsafe impl Send for CoreComm {}
// SAFETY: as above.
unsafe impl Sync for CoreComm {}

/// What a rank sets up before the exchange, and what `CoreComm` is made of.
pub struct Parts {
    pub device: Device,
    pub kernels: Arc<Kernels>,
    pub buffer: DevicePtr,
    pub half_bytes: u64,
    pub abort: HostFlag,
    /// Launch with programmatic stream serialization (see all_reduce.cu).
    pub early_launch: bool,
}

impl CoreComm {
    pub fn new(
        rank: usize,
        blocking: bool,
        facts: CommFacts,
        parts: Parts,
        bases: &[DevicePtr],
        opened: Vec<DevicePtr>,
    ) -> CoreComm {
        CoreComm {
            rank,
            blocking,
            facts,
            device: parts.device,
            kernels: parts.kernels,
            peers: Peers::from_bases(bases),
            half_bytes: parts.half_bytes,
            buffer: parts.buffer,
            opened,
            abort: parts.abort,
            early_launch: parts.early_launch,
        }
    }

    /// Launches the all-reduce on the caller's stream, in this communicator's device context.
    pub fn launch_all_reduce(
        &self,
        plan: &Plan,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        stream: cuda::Stream,
    ) -> Cuda<()> {
        let _context = self.device.enter_if_needed()?;
        // The policy plans no algorithm for a type it lacks (policy::plan_all_reduce).
        let function = self
            .kernels
            .get(plan.algorithm, plan.dtype, plan.op)
            .ok_or_else(|| CudaError {
                call: "launch",
                error: format!("no {} kernel for {:?}", plan.algorithm.name(), plan.dtype),
            })?;
        let mut peers = self.peers;
        let mut rank = self.rank as i32;
        let mut nranks = self.facts.nranks as i32;
        let mut input = send as u64;
        let mut output = recv as u64;
        let mut count = count as u64;
        let mut half_bytes = self.half_bytes;
        let mut abort = self.abort.device;
        let mut usable = (plan.algorithm == Algorithm::Direct
            && self.reachable_by_peers(input)
            && (output == input || self.reachable_by_peers(output)))
            as i32;
        let mut params: [*mut c_void; 9] = [
            (&raw mut peers).cast(),
            (&raw mut rank).cast(),
            (&raw mut nranks).cast(),
            (&raw mut input).cast(),
            (&raw mut output).cast(),
            (&raw mut count).cast(),
            (&raw mut half_bytes).cast(),
            (&raw mut abort).cast(),
            (&raw mut usable).cast(),
        ];
        // SAFETY: the parameters are the kernel's, in order; cuLaunchKernel copies them.
        unsafe {
            cuda::launch(
                function,
                plan.blocks,
                plan.threads,
                stream,
                &mut params,
                self.early_launch,
            )
        }
    }

    /// Whether the direct kernel may read or write `pointer` from every GPU: 16-aligned, and
    /// memory the peers can reach.
    fn reachable_by_peers(&self, pointer: u64) -> bool {
        pointer.is_multiple_of(16) && self.device.reachable_from_peers(pointer)
    }

    /// Frees everything once our kernels are done (the device is synchronised, on a thread of
    /// its own so that we can stop waiting). `abort` first tells waiting kernels to give up
    /// (ncclCommAbort); a plain destroy raises it only after waiting a while, and if the device
    /// still does not finish, the buffers are left allocated rather than pulled from under it.
    pub fn release(self, abort: bool) {
        if abort {
            self.abort.raise();
        }
        let device = self.device;
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let synced = device.enter().and_then(|_context| cuda::synchronize());
            let _ = done.send(synced.is_ok());
        });
        let finished = finished.recv_timeout(Duration::from_secs(10)).or_else(|_| {
            self.abort.raise();
            finished.recv_timeout(Duration::from_secs(10))
        });
        if finished.is_err() {
            std::mem::forget(self);
            return;
        }
        let Ok(_context) = self.device.enter() else {
            return;
        };
        for &pointer in &self.opened {
            cuda::ipc_close(pointer);
        }
        cuda::free(self.buffer);
    }
}
