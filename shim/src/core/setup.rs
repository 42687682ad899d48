//! Setting up the core of new communicators. What ranks need of each other (host, process,
//! device, buffer and its CUDA IPC handle) goes through the real NCCL on the communicator
//! itself, as an all-gather: no bootstrap of our own. Every rank takes part in both exchanges
//! whatever happened locally (a local failure is a "no"), and the core is enabled only if every
//! rank's verdict, gathered in the second exchange, is yes: the same decision on every rank.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::comm::{CoreComm, FLAGS_BYTES, Parts, Reach};
use super::cuda::{
    self, Cuda, Device, DeviceBuffer, DevicePtr, HostControl, IpcMapping, OwnedStream, StreamOrder,
};
use super::policy::{
    self, CommFacts, INBOX_BYTES, MAX_RANKS, SENTINEL_INBOX_BYTES, STAGING_HALF_BYTES,
};
use super::types::Collective;
use super::zero_copy::{DeviceMemory, Service, ZeroCopy};
use super::{kernels, lifecycle, measured};
use crate::ffi::{cudaStream_t, ncclComm_t, ncclInProgress, ncclResult_t, ncclSuccess, ncclUint8};
use crate::log::log_info;
use crate::real;

const MAGIC: u64 = 0x6e63_636c_7368_696d; // "ncclshim"
// The record's and the buffer's layout (3: sentinel inboxes; 4: zero-copy; 5: every setting on
// its own; 6: compute capability; 7: a group's small all-reduces fused, which peers must do
// alike; 8: measured limits, and one size for every later layout): other versions never pair
// up.
const LAYOUT: u32 = 8;
/// Room for the settings every rank must have alike (`Settings::agreed`), one word each.
const AGREED_SLOTS: usize = 32;

/// What one rank tells the others, as plain bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Record {
    magic: u64,
    layout: u32,
    /// 1 if this rank could set up its side.
    ready: u32,
    host: u64,
    process: u64,
    /// Rank 0's nonce names the communicator in zero-copy messages (zero_copy/).
    nonce: u64,
    /// `Settings::agreed`'s values, in its order (the rest zero): the same on every rank, or the
    /// core stays off.
    settings: [u64; AGREED_SLOTS],
    /// The buffers' sizes, as this build lays them out.
    buffers: u64,
    buffer: u64,
    device: i32,
    /// Blocks the two-shot kernels can have resident at once on this rank's GPU.
    resident_blocks: u32,
    /// Its GPU's compute capability, e.g. 90.
    compute_capability: u32,
    /// Zero: keeps the next field at the alignment it has.
    padding: u32,
    pci_bus_id: [u8; 16],
    ipc: [u8; 64],
    /// The measured limits of this rank's GPU for this many ranks (measured.rs).
    measured: [u64; Collective::ALL.len()],
    /// Zeros: room for what later layouts add, so that every layout's record has one size and
    /// builds of other layouts meet in the exchange and say so (`agree`) instead of passing
    /// NCCL all-gathers of other sizes.
    reserved: [u8; RECORD_BYTES - USED_BYTES],
}

/// What a record takes on the wire, whatever its layout.
const RECORD_BYTES: usize = 1024;
/// The bytes before `reserved`.
const USED_BYTES: usize = 472;
// No padding the compiler would leave uninitialised: every field ends where the next begins.
const _: () = assert!(size_of::<Record>() == RECORD_BYTES);
const _: () = assert!(std::mem::offset_of!(Record, reserved) == USED_BYTES);
const _: () = assert!(std::mem::offset_of!(Record, measured) % 8 == 0);

impl Record {
    /// A "no" from a rank that could not set up its side (its settings still said, so that its
    /// peers can name one that differs).
    fn not_ready() -> Record {
        Record {
            magic: MAGIC,
            layout: LAYOUT,
            ready: 0,
            host: 0,
            process: 0,
            nonce: 0,
            settings: agreed_settings(),
            buffers: buffers_key(STAGING_HALF_BYTES as u64),
            buffer: 0,
            device: -1,
            resident_blocks: 0,
            compute_capability: 0,
            padding: 0,
            pci_bus_id: [0; 16],
            ipc: [0; 64],
            measured: [0; Collective::ALL.len()],
            reserved: [0; RECORD_BYTES - USED_BYTES],
        }
    }

    fn to_bytes(self) -> Vec<u8> {
        // SAFETY: a repr(C) struct of integers, fully initialised (padding fields included).
        unsafe { std::slice::from_raw_parts((&raw const self).cast::<u8>(), RECORD_BYTES) }.to_vec()
    }

    fn from_bytes(bytes: &[u8]) -> Record {
        assert_eq!(bytes.len(), RECORD_BYTES);
        // SAFETY: any bytes make a valid Record of integers.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Record>()) }
    }
}

/// One communicator being set up by this thread.
struct Candidate {
    comm: ncclComm_t,
    blocking: bool,
    rank: usize,
    nranks: usize,
    /// Where the exchanges happen; `None` if even that could not be had.
    exchange: Option<Exchange>,
    parts: Option<Parts>,
    why_not: Option<String>,
}

/// Where a rank's records pass through the real NCCL's all-gather; freed when dropped.
struct Exchange {
    device: Device,
    buffer: DeviceBuffer,
    stream: OwnedStream,
}

/// What a rank opened of its peers' buffers, for a yes verdict. Unmapped when dropped: on every
/// path where the core does not come on. Where ranks are in several processes, `reach` holds
/// this rank's side of their zero-copy if it could join (used only if every rank could).
struct Mapped {
    reach: Reach,
    /// What every rank computes alike from the gathered records.
    facts: CommFacts,
}

/// Sets up the core for `comms` (all driven by this thread, e.g. those of one group; blocking or
/// nonblocking ones, as NCCL allows no group of both), after the real NCCL has initialised them
/// and settled their last operation, outside any group; or leaves them to NCCL.
pub fn set_up(comms: &[ncclComm_t], blocking: bool) {
    if comms.is_empty() {
        return;
    }
    if !cuda_ready() {
        for &comm in comms {
            lifecycle::declined(comm, None, "CUDA cannot be used in this process");
        }
        return;
    }
    let started = Instant::now();
    let _keep = cuda::KeepCurrent::new();
    // Stream captures on this thread (a nonblocking communicator's first all-reduce may be
    // captured) must not forbid our allocations and copies: none of it goes on their streams.
    let _relaxed = cuda::RelaxedCapture::new();
    let mut candidates: Vec<Candidate> =
        comms.iter().map(|&comm| prepare(comm, blocking)).collect();

    let records: Vec<Vec<u8>> = candidates
        .iter()
        .map(|c| own_record(c).to_bytes())
        .collect();
    let gathered = all_gather(&candidates, &records);
    let mapped: Vec<Result<Mapped, String>> = candidates
        .iter()
        .zip(&gathered)
        .map(|(candidate, all)| match all {
            Some(all) => map_peers(candidate, all),
            None => Err("the exchange through NCCL failed".into()),
        })
        .collect();

    // Each rank's verdict, and whether it joined zero-copy (it waits for messages from here on).
    let verdicts: Vec<Vec<u8>> = mapped
        .iter()
        .map(|m| {
            let zero_copy = m.as_ref().is_ok_and(|m| m.reach.zero_copy.is_some());
            vec![m.is_ok() as u8, zero_copy as u8, 0, 0]
        })
        .collect();
    let gathered = all_gather(&candidates, &verdicts);

    for ((candidate, mut mapped), verdicts) in candidates.iter_mut().zip(mapped).zip(gathered) {
        let everyone = |byte: usize| {
            verdicts
                .as_ref()
                .is_some_and(|v| v.chunks(4).all(|c| c[byte] == 1))
        };
        if let Ok(mapped) = &mut mapped {
            if !everyone(1) {
                mapped.reach.zero_copy = None;
            }
            mapped.facts.zero_copy = mapped.reach.zero_copy.is_some();
        }
        finish(candidate, mapped, everyone(0), started);
    }
    // The exchange buffers and streams are freed as `candidates` drops.
}

/// Whether this process can use CUDA at all. The real NCCL needs libcuda, so this comes out the
/// same on every rank; anything that could differ between ranks (NVRTC, memory) is a local "no"
/// in the exchange instead, so that no rank skips an exchange its peers wait in.
fn cuda_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if !cuda::driver_present() {
            log_info!("core off: libcuda cannot be loaded; every call forwards");
            return false;
        }
        if let Err(e) = cuda::init() {
            log_info!("core off: {e}; every call forwards");
            return false;
        }
        true
    })
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

/// Asks the real NCCL about the communicator and sets up this rank's side.
fn prepare(comm: ncclComm_t, blocking: bool) -> Candidate {
    let (mut rank, mut nranks, mut ordinal) = (0, 0, 0);
    // SAFETY: a communicator the real NCCL has just initialised; the ints are written.
    let asked = unsafe {
        real::ncclCommUserRank(comm, &mut rank) == ncclSuccess
            && real::ncclCommCount(comm, &mut nranks) == ncclSuccess
            && real::ncclCommCuDevice(comm, &mut ordinal) == ncclSuccess
    };
    let mut candidate = Candidate {
        comm,
        blocking,
        rank: rank as usize,
        nranks: nranks as usize,
        exchange: None,
        parts: None,
        why_not: None,
    };
    if !asked {
        candidate.why_not = Some("the real NCCL could not describe the communicator".into());
        return candidate;
    }
    match exchange_space(ordinal, candidate.nranks) {
        Ok(exchange) => candidate.exchange = Some(exchange),
        Err(e) => {
            candidate.why_not = Some(e.to_string());
            return candidate;
        }
    }
    if !policy::settings().enabled {
        candidate.why_not =
            Some("the core is off on this rank (NCCLSHIM_CORE=0 or NCCLSHIM_FORCE=nccl)".into());
        return candidate;
    }
    if !(2..=MAX_RANKS).contains(&candidate.nranks) {
        candidate.why_not = Some(format!(
            "{} ranks (the core takes 2 to {MAX_RANKS})",
            candidate.nranks
        ));
        return candidate;
    }
    match own_parts(candidate.exchange.as_ref().unwrap().device) {
        Ok(parts) => candidate.parts = Some(parts),
        Err(e) => candidate.why_not = Some(e),
    }
    candidate
}

fn exchange_space(ordinal: i32, nranks: usize) -> Cuda<Exchange> {
    let device = Device::open(ordinal)?;
    let bytes = nranks.max(1) * RECORD_BYTES;
    let buffer = DeviceBuffer::alloc(device, bytes)?;
    let stream = OwnedStream::create(device)?;
    // Zeroed, so that every byte read back is one written (compute-sanitizer's initcheck does
    // not see NCCL's kernels write it).
    {
        let _context = device.enter()?;
        stream.fill(buffer.pointer, 0, bytes)?;
    }
    Ok(Exchange {
        device,
        buffer,
        stream,
    })
}

/// Kernels, buffer and control block of this rank.
pub(super) fn own_parts(device: Device) -> Result<Parts, String> {
    if let Some(why) = p2p_forbidden(|name| std::env::var(name).ok()) {
        return Err(why);
    }
    let _context = device.enter().map_err(|e| e.to_string())?;
    let (major, minor) = device.compute_capability().map_err(|e| e.to_string())?;
    if major < 8 {
        return Err(format!("sm_{major}{minor}: the core needs sm_80 or newer"));
    }
    let kernels = kernels::for_device(&device)?;
    let half_bytes = STAGING_HALF_BYTES as u64;
    let inbox = FLAGS_BYTES + policy::staging_bytes(STAGING_HALF_BYTES);
    let sentinel_inbox = inbox + INBOX_BYTES;
    let buffer = DeviceBuffer::alloc(device, sentinel_inbox + SENTINEL_INBOX_BYTES)
        .map_err(|e| e.to_string())?;
    let rest = |buffer: DevicePtr| -> Cuda<(HostControl, StreamOrder)> {
        let stream = OwnedStream::create(device)?;
        // Flags, epochs and the low-latency inboxes start at zero: no epoch is zero.
        stream.fill(buffer, 0, FLAGS_BYTES)?;
        stream.fill(buffer + inbox as u64, 0, INBOX_BYTES)?;
        // The sentinel inboxes start empty: every byte 0xff (device/all_reduce.cu, "Sentinel").
        stream.fill(buffer + sentinel_inbox as u64, 0xff, SENTINEL_INBOX_BYTES)?;
        let control = HostControl::new(policy::settings().wait_limit_s)?;
        Ok((control, StreamOrder::new()?))
    };
    let (control, order) = rest(buffer.pointer).map_err(|e| e.to_string())?;
    Ok(Parts {
        device,
        kernels,
        buffer,
        half_bytes,
        control,
        early_launch: early_launch(major),
        order,
    })
}

/// Why the core must stay off where the user told NCCL not to use peer-to-peer between GPUs
/// (`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL=LOC` or `0`): the core is nothing but peer-to-peer.
fn p2p_forbidden(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let value = |name: &str| get(name).map(|v| v.trim().to_ascii_uppercase());
    if value("NCCL_P2P_DISABLE").is_some_and(|v| v != "0" && !v.is_empty()) {
        return Some("NCCL_P2P_DISABLE is set: no peer-to-peer between GPUs".into());
    }
    if let Some(level) = value("NCCL_P2P_LEVEL").filter(|v| v == "LOC" || v == "0") {
        return Some(format!(
            "NCCL_P2P_LEVEL={level}: no peer-to-peer between GPUs"
        ));
    }
    None
}

/// Whether kernels are launched early (programmatic stream serialization, see device/device.cuh):
/// on sm_90 and later (whose kernels wait for it), from CUDA 12.3 on, which also keeps it in CUDA
/// graphs, unless the settings turn it off.
fn early_launch(major: i32) -> bool {
    major >= 9
        && policy::settings().early_launch
        && cuda::driver_version().is_ok_and(|v| v >= 12030)
}

fn own_record(candidate: &Candidate) -> Record {
    let (Some(parts), Some(exchange)) = (&candidate.parts, &candidate.exchange) else {
        return Record::not_ready();
    };
    let pci_bus_id = exchange.device.pci_bus_id();
    let ipc = {
        let _context = exchange.device.enter();
        cuda::ipc_handle(parts.buffer.pointer)
    };
    let (Ok(pci_bus_id), Ok(ipc)) = (pci_bus_id, ipc) else {
        return Record::not_ready();
    };
    Record {
        magic: MAGIC,
        layout: LAYOUT,
        ready: 1,
        host: identity::host(),
        process: identity::process(),
        nonce: identity::nonce(),
        settings: agreed_settings(),
        buffers: buffers_key(parts.half_bytes),
        buffer: parts.buffer.pointer,
        device: exchange.device.ordinal,
        resident_blocks: parts.kernels.two_shot_resident_blocks,
        compute_capability: parts.kernels.compute_capability(),
        padding: 0,
        pci_bus_id,
        ipc,
        measured: measured::limits(&parts.device.name(), candidate.nranks).map(|n| n as u64),
        reserved: [0; RECORD_BYTES - USED_BYTES],
    }
}

/// This rank's settings as the record carries them.
fn agreed_settings() -> [u64; AGREED_SLOTS] {
    let mut slots = [0; AGREED_SLOTS];
    for (slot, (_, value)) in slots.iter_mut().zip(policy::settings().agreed()) {
        *slot = value;
    }
    slots
}

/// The sizes the kernels divide every rank's buffer by: equal on every rank of one build.
fn buffers_key(half_bytes: u64) -> u64 {
    [FLAGS_BYTES, INBOX_BYTES, SENTINEL_INBOX_BYTES]
        .into_iter()
        .fold(half_bytes, |key, v| {
            (key ^ v as u64).wrapping_mul(0x100000001b3)
        })
}

/// One all-gather of `payloads[i]` (equal lengths) per candidate, grouped, through the real
/// NCCL; the gathered bytes, or `None` where it failed.
fn all_gather(candidates: &[Candidate], payloads: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let len = payloads.first().map_or(0, Vec::len);
    assert!(len <= RECORD_BYTES && payloads.iter().all(|p| p.len() == len));
    let staged: Vec<bool> = candidates
        .iter()
        .zip(payloads)
        .map(|(c, payload)| {
            c.exchange.as_ref().is_some_and(|x| {
                let _context = x.device.enter();
                let at = x.buffer.pointer + (c.rank * len) as u64;
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
            let x = c.exchange.as_ref().unwrap();
            let _context = x.device.enter();
            let recv = x.buffer.pointer as *mut c_void;
            let send = (x.buffer.pointer + (c.rank * len) as u64) as *const c_void;
            let stream = x.stream.stream as cudaStream_t;
            real::ncclAllGather(send, recv, len, ncclUint8, c.comm, stream);
        }
        real::ncclGroupEnd()
    };
    // A nonblocking group is issued by a thread of the real NCCL's: wait for it on every
    // communicator, each then free for the program's next operation.
    let launched = if end == ncclInProgress {
        // Every one settled, even past a failure.
        let states: Vec<ncclResult_t> = issued().map(|c| settle(c.comm)).collect();
        states.iter().all(|&state| state == ncclSuccess)
    } else {
        end == ncclSuccess
    };
    candidates
        .iter()
        .zip(staged)
        .map(|(c, staged)| {
            let x = c.exchange.as_ref()?;
            if !(staged && launched) {
                return None;
            }
            let _context = x.device.enter().ok()?;
            x.stream.synchronize().ok()?;
            let mut all = vec![0u8; c.nranks * len];
            cuda::copy_to_host(&mut all, x.buffer.pointer).ok()?;
            Some(all)
        })
        .collect()
}

/// This rank's verdict: can it reach every peer's buffer? Peers in this process by their device
/// pointers (with peer access), others through CUDA IPC.
fn map_peers(candidate: &Candidate, gathered: &[u8]) -> Result<Mapped, String> {
    if let Some(why) = &candidate.why_not {
        return Err(why.clone());
    }
    let parts = candidate.parts.as_ref().ok_or("no local set-up")?;
    let records: Vec<Record> = gathered
        .chunks(RECORD_BYTES)
        .map(Record::from_bytes)
        .collect();
    agree(&records, candidate.rank)?;
    let me = &records[candidate.rank];
    let _context = parts.device.enter().map_err(|e| e.to_string())?;
    let mut mapped = Mapped {
        reach: Reach {
            bases: Vec::new(),
            opened: Vec::new(),
            peer_devices: Vec::new(),
            zero_copy: None,
        },
        facts: CommFacts {
            nranks: records.len(),
            single_process: records.iter().all(|r| r.process == me.process),
            zero_copy: false,
            resident_blocks: records.iter().map(|r| r.resident_blocks).min().unwrap_or(0),
            compute_capability: records
                .iter()
                .map(|r| r.compute_capability)
                .min()
                .unwrap_or(0),
            measured: measured::least(records.iter().map(|r| r.measured.map(|n| n as usize))),
        },
    };
    for (r, record) in records.iter().enumerate() {
        let base = if r == candidate.rank {
            parts.buffer.pointer
        } else if record.process == me.process {
            let peer = Device::open(record.device).map_err(|e| e.to_string())?;
            if !parts
                .device
                .can_access_peer(&peer)
                .map_err(|e| e.to_string())?
            {
                return Err(format!(
                    "no peer access from GPU {} to GPU {}",
                    parts.device.ordinal, peer.ordinal
                ));
            }
            parts
                .device
                .enable_peer_access(&peer)
                .map_err(|e| e.to_string())?;
            mapped.reach.peer_devices.push(peer.ordinal);
            record.buffer
        } else {
            let mapping = IpcMapping::open(parts.device, &record.ipc)
                .map_err(|e| format!("rank {r}'s buffer: {e}"))?;
            let pointer = mapping.pointer;
            mapped.reach.opened.push(mapping);
            pointer
        };
        mapped.reach.bases.push(base);
    }
    if !mapped.facts.single_process && policy::settings().zero_copy {
        mapped.reach.zero_copy = join_zero_copy(candidate, parts, &records);
    }
    Ok(mapped)
}

/// This rank's side of zero-copy for a communicator of several processes, named after rank 0's
/// nonce; `None` where this process cannot serve it (said in the log).
fn join_zero_copy(
    candidate: &Candidate,
    parts: &Parts,
    records: &[Record],
) -> Option<Arc<ZeroCopy>> {
    match Service::of_process(identity::process()) {
        Ok(service) => Some(ZeroCopy::join(
            service,
            records[0].nonce,
            candidate.rank,
            records.iter().map(|r| r.process).collect(),
            Box::new(DeviceMemory(parts.device)),
        )),
        Err(why) => {
            log_info!(
                "comm {:p} rank {}: no zero-copy ({why}): its large all-reduces go through the core's staging",
                candidate.comm,
                candidate.rank
            );
            None
        }
    }
}

/// Whether every rank can join: with our settings, ready, on this host, each on its own GPU.
/// Settings first: a rank that differs says no for that reason, whatever else it says.
fn agree(records: &[Record], rank: usize) -> Result<(), String> {
    let me = &records[rank];
    for (r, record) in records.iter().enumerate() {
        if record.magic != MAGIC || record.layout != LAYOUT {
            return Err(format!("rank {r} runs another version of ncclshim"));
        }
        if let Some(setting) = differing_setting(&record.settings, &me.settings) {
            return Err(format!(
                "rank {r} has another {setting} than rank {rank} (every rank needs the same NCCLSHIM_* settings)"
            ));
        }
        if record.buffers != me.buffers {
            return Err(format!("rank {r} lays the core's buffers out otherwise"));
        }
        if record.ready != 1 {
            return Err(format!("rank {r} cannot use the core"));
        }
        if record.host != me.host {
            return Err(format!("rank {r} is on another host"));
        }
        if records[..r]
            .iter()
            .any(|other| other.pci_bus_id == record.pci_bus_id)
        {
            return Err(format!("rank {r} shares its GPU with another rank"));
        }
    }
    Ok(())
}

/// The variable of the first setting two records differ in.
fn differing_setting(theirs: &[u64; AGREED_SLOTS], mine: &[u64; AGREED_SLOTS]) -> Option<String> {
    let slot = (0..AGREED_SLOTS).find(|&i| theirs[i] != mine[i])?;
    let names = policy::settings().agreed();
    Some(
        names
            .get(slot)
            .map_or_else(|| "NCCLSHIM_* setting".into(), |(name, _)| name.clone()),
    )
}

fn finish(
    candidate: &mut Candidate,
    mapped: Result<Mapped, String>,
    everyone: bool,
    started: Instant,
) {
    let parts = candidate.parts.take();
    let device = candidate.exchange.as_ref().map_or(-1, |x| x.device.ordinal);
    let on = parts.is_some() && mapped.is_ok() && everyone;
    let (rank, nranks) = (candidate.rank as i32, candidate.nranks as i32);
    super::observer::observer().core_decided(candidate.comm, on, rank, nranks, device);
    match (parts, mapped, everyone) {
        (Some(parts), Ok(mapped), true) => {
            let settings = policy::settings();
            log_info!(
                "core on for comm {:p} rank {}/{} on GPU {}, set up in {:.3} s (all-reduce: sentinel for floating-point types up to {} B, low-latency up to {} B, one-shot up to {} B, {} two-shot up to {} B; {})",
                candidate.comm,
                candidate.rank,
                candidate.nranks,
                parts.device.ordinal,
                started.elapsed().as_secs_f64(),
                settings.sentinel_max(candidate.nranks),
                settings.ll_max(candidate.nranks),
                settings.one_shot_max(candidate.nranks),
                match (
                    mapped.facts.single_process,
                    settings.uses_direct(mapped.facts.single_process || mapped.facts.zero_copy),
                ) {
                    (true, true) => "direct",
                    (false, true) => "zero-copy direct",
                    _ => "staged",
                },
                settings.all_reduce_max(candidate.nranks, mapped.facts.single_process),
                settings.limits_text(&mapped.facts.measured)
            );
            measured::note_in_use(&mapped.facts.measured);
            let core = CoreComm::new(
                candidate.rank,
                candidate.blocking,
                mapped.facts,
                parts,
                mapped.reach,
            );
            lifecycle::came_on(candidate.comm, Arc::new(core));
        }
        (parts, mapped, _) => {
            let why = match (&mapped, &candidate.why_not) {
                (_, Some(why)) => why.clone(),
                (Err(why), _) => why.clone(),
                (Ok(_), None) => "another rank cannot use it".into(),
            };
            lifecycle::declined(candidate.comm, Some(candidate.rank), &why);
            // The peers' buffers this rank mapped, and its own, are freed as they drop.
            drop((mapped, parts));
        }
    }
}

/// Who we are: a host (name and boot) and a process (a random number, not the pid, which
/// containers can share).
mod identity {
    use std::io::Read;
    use std::sync::OnceLock;

    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        })
    }

    pub fn host() -> u64 {
        let name = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        fnv(&[name, boot].concat())
    }

    /// A number for one set-up, unlike any other of any process.
    pub fn nonce() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SET_UPS: AtomicU64 = AtomicU64::new(0);
        let nth = SET_UPS.fetch_add(1, Ordering::Relaxed);
        fnv(&[process().to_le_bytes(), nth.to_le_bytes()].concat())
    }

    pub fn process() -> u64 {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        *PROCESS.get_or_init(|| {
            let mut bytes = [0u8; 8];
            let random =
                std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            u64::from_le_bytes(bytes)
                ^ if random.is_ok() {
                    0
                } else {
                    nanos as u64 ^ std::process::id() as u64
                }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(device: i32) -> Record {
        let mut record = Record::not_ready();
        record.ready = 1;
        record.host = 7;
        record.device = device;
        record.pci_bus_id[..12].copy_from_slice(format!("0000:{device:02}:00.0").as_bytes());
        record
    }

    #[test]
    fn records_cross_the_wire_unchanged() {
        let mut record = ready(3);
        record.ipc[63] = 0xab;
        record.buffer = 0x7f00_0000_1000;
        record.measured[Collective::Scatter as usize] = 128 << 10;
        let bytes = record.to_bytes();
        assert_eq!(bytes.len(), RECORD_BYTES);
        let back = Record::from_bytes(&bytes);
        assert_eq!(
            (back.device, back.ipc[63], back.buffer, back.pci_bus_id),
            (3, 0xab, 0x7f00_0000_1000, record.pci_bus_id)
        );
        assert_eq!(back.measured, record.measured);
    }

    #[test]
    fn every_rank_must_agree() {
        let good = [ready(0), ready(1), ready(2)];
        assert_eq!(agree(&good, 1), Ok(()));
        type Spoil = fn(&mut Record);
        let cases: [(usize, Spoil, &str); 4] = [
            (2, |r| r.ready = 0, "rank 2 cannot use the core"),
            (1, |r| r.host = 8, "rank 1 is on another host"),
            (
                0,
                |r| r.settings[3] ^= 1,
                "rank 0 has another NCCLSHIM_LL_MAX_BYTES",
            ),
            (
                2,
                |r| r.pci_bus_id = ready(0).pci_bus_id,
                "rank 2 shares its GPU",
            ),
        ];
        for (rank, spoil, why) in cases {
            let mut records = good;
            spoil(&mut records[rank]);
            let verdict = agree(&records, (rank + 1) % 3);
            assert!(
                verdict.as_ref().is_err_and(|e| e.contains(why)),
                "{verdict:?} should say {why}"
            );
        }
    }

    /// A rank started with any one setting of another value (a rank with the core off too, which
    /// says no): every rank's verdict is no, naming that setting.
    #[test]
    fn a_rank_with_another_setting_is_named() {
        let names = policy::settings().agreed();
        assert!(names.len() <= AGREED_SLOTS, "{} settings", names.len());
        for (slot, (name, _)) in names.iter().enumerate() {
            let mut records = [ready(0), ready(1)];
            records[1].settings[slot] ^= 1;
            records[1].ready = (slot % 2) as u32;
            for rank in 0..2 {
                let verdict = agree(&records, rank);
                let other = 1 - rank;
                let want = format!("rank {other} has another {name} than rank {rank}");
                assert!(
                    verdict.as_ref().is_err_and(|e| e.starts_with(&want)),
                    "{verdict:?} should say {want}"
                );
            }
        }
    }

    #[test]
    fn the_core_stays_off_where_nccl_is_told_not_to_use_peer_to_peer() {
        let with = |vars: &'static [(&str, &str)]| {
            p2p_forbidden(move |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            })
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[("NCCL_P2P_DISABLE", "0")]), None);
        assert_eq!(with(&[("NCCL_P2P_LEVEL", "NVL")]), None);
        assert!(with(&[("NCCL_P2P_DISABLE", "1")]).is_some_and(|w| w.contains("DISABLE")));
        assert!(with(&[("NCCL_P2P_LEVEL", "loc")]).is_some_and(|w| w.contains("LOC")));
        assert!(with(&[("NCCL_P2P_LEVEL", "0")]).is_some());
    }
}
