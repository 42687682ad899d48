//! Setting up the core of new communicators. What ranks need of each other (host, process,
//! device, buffer and its CUDA IPC handle) goes through shared memory where every rank of a new
//! communicator is on this host (`rendezvous`), else through the real NCCL as an all-gather, on
//! the communicator itself or, for a blocking parent's split children, on the parent: no
//! bootstrap of our own. Every rank takes part in both exchanges
//! whatever happened locally (a local failure is a "no"), and the core is enabled only if every
//! rank's verdict, gathered in the second exchange, is yes: the same decision on every rank.
//! What a rank says and what the ranks must have alike: `agreement`; the exchange through NCCL:
//! `exchange`; opening the peers' buffers: `peers`; who a host and a process are: `identity`.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::comm::{CoreComm, Parts};
use super::ctas::Asked;
use super::cuda::{
    self, Cuda, Device, DeviceBuffer, DevicePtr, HostControl, OwnedStream, StreamOrder,
};
use super::measured::{self, Limit};
use super::policy::{self, FLAGS_BYTES, INBOX_BYTES, MAX_RANKS, SENTINEL_INBOX_BYTES, Staging};
use super::{kernels, lifecycle};
use crate::ffi::{ncclComm_t, ncclSuccess};
use crate::log::log_info;
use crate::real;

mod agreement;
mod exchange;
mod identity;
mod peers;
mod rendezvous;

use agreement::*;
pub use exchange::settle;
use exchange::*;
use peers::*;
pub use rendezvous::{Arrival, hold, sign_in};
use rendezvous::{Met, Place};

/// A name for a communicator whose ranks are all this process's (ncclCommInitAll), unlike any
/// other's.
pub fn new_id() -> [u8; 8] {
    identity::nonce().to_le_bytes()
}

/// `comm` will not be set up, or stops being set up (destroyed, aborted or revoked meanwhile):
/// its rank withdraws from its meeting in shared memory, and its peers stop waiting for it.
pub fn abandon(comm: ncclComm_t) {
    rendezvous::withdraw(comm);
}

/// Sets up the core for `comms` (all driven by this thread, e.g. those of one group), after the
/// real NCCL has initialised them and settled their last operation, outside any group; or leaves
/// them to NCCL. Blocking ones as they are made (`as_made`); nonblocking ones, and those made
/// where the shim could not see them, at their first all-reduce. Each communicator's ranks
/// exchange their records in shared memory, or on it through NCCL: a blocking one's ranks then
/// set up at its first all-reduce too (`deferred`), the same point on every rank, so that ranks
/// that differ in blocking (NCCL allows it) never set up at different points: they meet through
/// NCCL on every rank or on none, and decline where their records differ in blocking.
pub fn set_up(comms: &[ncclComm_t], as_made: bool) {
    let met: Vec<(ncclComm_t, Option<Place>)> = comms
        .iter()
        .filter_map(|&comm| match rendezvous::meet(comm) {
            Met::Here(place) => {
                lifecycle::alike(comm);
                Some((comm, Some(place)))
            }
            Met::Elsewhere if as_made => {
                log_info!(
                    "comm {comm:p}: not all its ranks met in this host's shared memory: its core is set up after its first all-reduce, through NCCL"
                );
                lifecycle::deferred(comm);
                None
            }
            Met::Elsewhere => Some((comm, None)),
            // No exchange at all: every rank declines.
            Met::Mixed => {
                lifecycle::declined(comm, None, MIXED);
                None
            }
        })
        .collect();
    if met.is_empty() {
        return;
    }
    let taken: Vec<ncclComm_t> = met.iter().map(|(comm, _)| *comm).collect();
    with_candidates(taken.into_iter(), || {
        met.into_iter()
            .map(|(comm, place)| prepare(comm, lifecycle::blocking(comm), None, place))
            .collect()
    });
}

/// A child of ncclCommSplit on a blocking parent, as this rank sees it: `child` NULL where this
/// rank has no child to set up here (NCCL_SPLIT_NOCOLOR, or a nonblocking child).
#[derive(Clone, Copy, Debug)]
pub struct Split {
    pub parent: ncclComm_t,
    pub child: ncclComm_t,
    pub color: i32,
    /// This rank's child where it is nonblocking (else NULL): set up at its first all-reduce,
    /// unless a peer's child of the split is blocking (`agree_and_finish`).
    pub nonblocking: ncclComm_t,
}

/// Sets up the blocking children of blocking parents' splits (this thread's, in the order it
/// made them; or leaves them to NCCL), their ranks exchanging their records on the parent, which
/// its own set-up has connected: the child's NCCL need not connect for the core (a tenth of a
/// second between processes), and does so only if a call of the child goes to NCCL. Every rank
/// of the parent takes part, those without a blocking child too (`Split::child` NULL): each
/// record names its child by the split's color.
pub fn set_up_children(splits: &[Split]) {
    if splits.is_empty() {
        return;
    }
    let children = splits.iter().map(|s| s.child).filter(|c| !c.is_null());
    with_candidates(children, || {
        splits
            .iter()
            .map(|split| match split.child.is_null() {
                true => childless(split.parent, split.nonblocking, split.color),
                false => {
                    // Never met in shared memory: no rank of a child signs in.
                    drop(rendezvous::meet(split.child));
                    let mut candidate = prepare(split.child, true, Some(split.parent), None);
                    candidate.color = split.color;
                    candidate
                }
            })
            .collect()
    });
}

/// Where this process can use CUDA, this thread's `candidates` (made once the set-up's clock
/// runs) through both exchanges; else `comms` left to NCCL.
fn with_candidates(
    comms: impl Iterator<Item = ncclComm_t>,
    candidates: impl FnOnce() -> Vec<Candidate>,
) {
    if !cuda_ready() {
        for comm in comms {
            abandon(comm);
            lifecycle::declined(comm, None, "CUDA cannot be used in this process");
        }
        return;
    }
    let _keep = cuda::KeepCurrent::new();
    // Stream captures on this thread (a nonblocking communicator's first all-reduce may be
    // captured) must not forbid our allocations and copies: none of it goes on their streams.
    let _relaxed = cuda::RelaxedCapture::new();
    let phases = Phases::start();
    agree_and_finish(candidates(), phases);
}

/// Both exchanges, and each candidate's core on or declined.
fn agree_and_finish(mut candidates: Vec<Candidate>, mut phases: Phases) {
    let records: Vec<Vec<u8>> = candidates
        .iter()
        .map(|c| own_record(c).to_bytes())
        .collect();
    phases.own = phases.lap();
    let gathered = all_gather(&candidates, &records);
    phases.exchange = phases.lap();
    let members: Vec<Result<Members, String>> = candidates
        .iter()
        .zip(&gathered)
        .map(|(candidate, all)| match all {
            Some(all) => members(candidate, all),
            None => Err("the exchange through NCCL failed".into()),
        })
        .collect();
    let mapped: Vec<Result<Mapped, String>> = candidates
        .iter()
        .zip(&members)
        .map(|(candidate, members)| {
            let members = members.as_ref().map_err(Clone::clone)?;
            map_peers(candidate, &members.records)
        })
        .collect();
    phases.peers = phases.lap();

    // Each rank's verdict, and whether it joined zero-copy (it waits for messages from here on).
    let verdicts: Vec<Vec<u8>> = mapped
        .iter()
        .map(|m| {
            let zero_copy = m.as_ref().is_ok_and(|m| m.reach.zero_copy.is_some());
            vec![m.is_ok() as u8, zero_copy as u8, 0, 0]
        })
        .collect();
    let gathered = all_gather(&candidates, &verdicts);
    phases.verdicts = phases.lap();

    for (((candidate, mut mapped), verdicts), members) in
        candidates.iter_mut().zip(mapped).zip(gathered).zip(members)
    {
        if candidate.comm.is_null() {
            decline_if_mixed(candidate, &members);
            continue;
        }
        // A child whose every rank's is blocking may be a parent its children meet on.
        if candidate.comm != candidate.meeting.comm
            && let Ok(members) = &members
            && (members.records.chunks(RECORD_BYTES)).all(|r| Record::from_bytes(r).blocking != 0)
        {
            lifecycle::alike(candidate.comm);
        }
        // Every member's verdict has `byte` set.
        let everyone = |byte: usize| {
            let (Some(verdicts), Ok(members)) = (&verdicts, &members) else {
                return false;
            };
            members
                .positions
                .iter()
                .all(|&at| verdicts.get(at * 4 + byte) == Some(&1))
        };
        if let Ok(mapped) = &mut mapped {
            if !everyone(1) {
                mapped.reach.zero_copy = None;
            }
            mapped.facts.zero_copy = mapped.reach.zero_copy.is_some();
        }
        finish(candidate, mapped, everyone(0), &phases);
    }
    // The exchange buffers and streams are freed as `candidates` drops.
}

/// Why a communicator whose ranks differ in blocking gets no core.
pub(super) const MIXED: &str = "its ranks' communicators are not all blocking nor all nonblocking (their configs or NCCL_COMM_BLOCKING differ)";

/// A nonblocking child this rank waits to set up at its first all-reduce (`Candidate::waiting`),
/// declined where a peer's child of the split is blocking: that peer declines its own (this
/// rank's record says it cannot use the core) and would never join the set-up.
fn decline_if_mixed(candidate: &Candidate, members: &Result<Members, String>) {
    if candidate.waiting.is_null() {
        return;
    }
    let records = members.as_ref().map(|m| m.records.chunks(RECORD_BYTES));
    let blocking_peer = records.is_ok_and(|mut r| r.any(|r| Record::from_bytes(r).blocking != 0));
    if blocking_peer {
        abandon(candidate.waiting);
        lifecycle::declined(candidate.waiting, Some(candidate.rank), MIXED);
    }
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

/// This rank's rank, the number of ranks and the GPU of a communicator the real NCCL has
/// initialised; `None` if NCCL would not say.
fn describe(comm: ncclComm_t) -> Option<(usize, usize, i32)> {
    let (mut rank, mut nranks, mut ordinal) = (0, 0, 0);
    // SAFETY: a communicator the real NCCL has initialised; the ints are written.
    let asked = unsafe {
        real::ncclCommUserRank(comm, &mut rank) == ncclSuccess
            && real::ncclCommCount(comm, &mut nranks) == ncclSuccess
            && real::ncclCommCuDevice(comm, &mut ordinal) == ncclSuccess
    };
    asked.then_some((rank as usize, nranks as usize, ordinal))
}

/// Asks the real NCCL about the communicator (and about `parent`, where its ranks meet there)
/// and sets up this rank's side.
fn prepare(
    comm: ncclComm_t,
    blocking: bool,
    parent: Option<ncclComm_t>,
    place: Option<Place>,
) -> Candidate {
    let described = describe(comm);
    let (rank, nranks, ordinal) = described.unwrap_or_default();
    let meeting = match parent {
        None => Some(Meeting { comm, rank, nranks }),
        Some(parent) => describe(parent).map(|(rank, nranks, _)| Meeting {
            comm: parent,
            rank,
            nranks,
        }),
    };
    let mut candidate = Candidate {
        comm,
        blocking,
        rank,
        nranks,
        meeting: meeting.unwrap_or(Meeting { comm, rank, nranks }),
        color: 0,
        device: None,
        exchange: None,
        place,
        parts: None,
        why_not: None,
        ctas: crate::core::ctas::asked(comm),
        waiting: std::ptr::null_mut(),
    };
    if let Some(place) = &candidate.place
        && (place.rank(), place.nranks()) != (rank, nranks)
    {
        candidate.why_not = Some(format!(
            "NCCL made it rank {rank} of {nranks}, not rank {} of {} as asked",
            place.rank(),
            place.nranks()
        ));
        return candidate;
    }
    if described.is_none() || meeting.is_none() {
        candidate.why_not = Some("the real NCCL could not describe the communicator".into());
        return candidate;
    }
    let device = match Device::open(ordinal) {
        Ok(device) => candidate.device.insert(device),
        Err(e) => {
            candidate.why_not = Some(e.to_string());
            return candidate;
        }
    };
    // Ranks that meet in shared memory need no room on the GPU for the exchange.
    if candidate.place.is_none() {
        match exchange_space(*device, candidate.meeting.nranks) {
            Ok(exchange) => candidate.exchange = Some(exchange),
            Err(e) => {
                candidate.why_not = Some(e.to_string());
                return candidate;
            }
        }
    }
    if !policy::settings().enabled {
        candidate.why_not = Some("the core is off on this rank (NCCLSHIM_CORE=0)".into());
        return candidate;
    }
    if !(2..=MAX_RANKS).contains(&candidate.nranks) {
        candidate.why_not = Some(format!(
            "{} ranks (the core takes 2 to {MAX_RANKS})",
            candidate.nranks
        ));
        return candidate;
    }
    match own_parts(*device) {
        Ok(parts) => candidate.parts = Some(parts),
        Err(e) => candidate.why_not = Some(e),
    }
    candidate
}

/// This rank's side of its parent's exchange where the split gave it no child to set up now: a
/// "no" verdict, nothing to set up. Where it gave it a nonblocking child (`nonblocking`, of
/// `color`), its record names it as one, so that its peers with blocking children of the split
/// decline theirs, as it declines its own then (NCCL lets ranks differ in blocking); else no
/// record of a communicator.
fn childless(parent: ncclComm_t, nonblocking: ncclComm_t, color: i32) -> Candidate {
    let described = describe(parent);
    let (rank, nranks, ordinal) = described.unwrap_or_default();
    let (child_rank, child_ranks) = match nonblocking.is_null() {
        true => (0, 0),
        false => describe(nonblocking).map_or((0, 0), |(rank, nranks, _)| (rank, nranks)),
    };
    let mut candidate = Candidate {
        comm: std::ptr::null_mut(),
        blocking: nonblocking.is_null(),
        rank: child_rank,
        nranks: child_ranks,
        meeting: Meeting {
            comm: parent,
            rank,
            nranks,
        },
        color,
        device: None,
        exchange: None,
        place: None,
        parts: None,
        why_not: Some("no child of this rank's".into()),
        ctas: Asked::default(),
        waiting: nonblocking,
    };
    if described.is_some() {
        candidate.device = Device::open(ordinal).ok();
        candidate.exchange = candidate
            .device
            .and_then(|device| exchange_space(device, nranks).ok());
    }
    candidate
}

/// Kernels, buffer and control block of this rank.
pub(super) fn own_parts(device: Device) -> Result<Parts, String> {
    if let Some(why) = p2p_forbidden(crate::nccl_env::get) {
        return Err(why);
    }
    let _context = device.enter().map_err(|e| e.to_string())?;
    let (major, minor) = device.compute_capability().map_err(|e| e.to_string())?;
    if major < 8 {
        return Err(format!("sm_{major}{minor}: the core needs sm_80 or newer"));
    }
    let kernels = kernels::for_device(&device)?;
    let staging = Staging::standard();
    let inbox = FLAGS_BYTES as u64 + staging.ll_inbox;
    let sentinel_inbox = FLAGS_BYTES as u64 + staging.sentinel_inbox;
    let buffer =
        DeviceBuffer::alloc(device, FLAGS_BYTES + staging.bytes()).map_err(|e| e.to_string())?;
    let rest = |buffer: DevicePtr| -> Cuda<(HostControl, StreamOrder)> {
        let stream = OwnedStream::create(device)?;
        // Flags, epochs and the low-latency inboxes start at zero: no call's epoch is zero
        // (begin_call in device/device.cuh).
        stream.fill(buffer, 0, FLAGS_BYTES)?;
        stream.fill(buffer + inbox, 0, INBOX_BYTES)?;
        // The sentinel inboxes start empty: every byte 0xff (device/all_reduce.cu, "Sentinel").
        stream.fill(buffer + sentinel_inbox, 0xff, SENTINEL_INBOX_BYTES)?;
        let control = HostControl::new(policy::settings().wait_limit_s)?;
        Ok((control, StreamOrder::new()?))
    };
    let (control, order) = rest(buffer.pointer).map_err(|e| e.to_string())?;
    Ok(Parts {
        device,
        kernels,
        buffer,
        staging,
        control,
        launch_mode: launch_mode(
            major,
            cuda::driver_version().unwrap_or(0),
            policy::settings().early_launch,
            nccl_mem_sync_domain(),
        ),
        order,
    })
}

/// Why the core must stay off where the user told NCCL not to use peer-to-peer between GPUs
/// (`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL=LOC` or `0`): the core is nothing but peer-to-peer.
pub(super) fn p2p_forbidden(get: impl Fn(&str) -> Option<String>) -> Option<String> {
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

/// How the kernels are launched on a GPU of compute capability `major` under CUDA `driver`
/// (cuda::LaunchMode): early (programmatic stream serialization, see device/device.cuh) on sm_90
/// and later, whose kernels wait for it, from CUDA 12.3 on, which also keeps it in CUDA graphs,
/// unless the settings turn it off (`early`); in the remote memory synchronization domain on
/// sm_90 and later from CUDA 12.0 on, as NCCL launches its own, unless `NCCL_MEM_SYNC_DOMAIN`
/// puts NCCL's in the default one (0).
fn launch_mode(major: i32, driver: i32, early: bool, nccl_domain: Option<i64>) -> cuda::LaunchMode {
    cuda::LaunchMode {
        early: major >= 9 && early && driver >= 12030,
        remote_domain: major >= 9 && driver >= 12000 && nccl_domain != Some(0),
    }
}

/// `NCCL_MEM_SYNC_DOMAIN`, cached as NCCL caches it.
fn nccl_mem_sync_domain() -> Option<i64> {
    const NAME: &str = "NCCL_MEM_SYNC_DOMAIN";
    static READ: OnceLock<Option<i64>> = OnceLock::new();
    crate::nccl_env::as_nccl_caches(&READ, &[NAME], || crate::nccl_env::integer(NAME))
}

/// What this rank tells the others of the candidate, with which communicator it is of.
fn own_record(candidate: &Candidate) -> Record {
    Record {
        color: candidate.color,
        rank: candidate.rank as u32,
        nranks: candidate.nranks as u32,
        blocking: candidate.blocking as u32,
        cta_bound: candidate.ctas.bound.unwrap_or(0),
        copy_engines: candidate.ctas.copy_engines as u32,
        ..side_record(candidate)
    }
}

/// This rank's side, or a "no".
fn side_record(candidate: &Candidate) -> Record {
    let (Some(parts), Some(device)) = (&candidate.parts, candidate.device) else {
        return Record::not_ready();
    };
    let pci_bus_id = device.pci_bus_id();
    let ipc = {
        let _context = device.enter();
        cuda::ipc_handle(parts.buffer.pointer)
    };
    let (Ok(pci_bus_id), Ok(ipc)) = (pci_bus_id, ipc) else {
        return Record::not_ready();
    };
    let limits = measured::limits(&parts.device.name(), candidate.nranks);
    Record {
        magic: MAGIC,
        layout: LAYOUT,
        ready: 1,
        host: identity::host(),
        process: identity::process(),
        nonce: identity::nonce(),
        settings: agreed_settings(),
        buffers: parts.staging.key(),
        buffer: parts.buffer.pointer,
        device: device.ordinal,
        resident_blocks: parts.kernels.two_shot_resident_blocks,
        compute_capability: parts.kernels.compute_capability(),
        padding: 0,
        pci_bus_id,
        ipc,
        measured: limits.any.map(Limit::to_words),
        color: 0,
        rank: 0,
        nranks: 0,
        blocking: 0,
        measured_plain: limits.plain.map(Limit::to_words32),
        cta_bound: 0,
        copy_engines: 0,
        reserved: [0; RECORD_BYTES - USED_BYTES],
    }
}

/// A communicator's records in its rank order, and each one's place in the meeting's.
struct Members {
    records: Vec<u8>,
    positions: Vec<usize>,
}

/// The records of `candidate`'s communicator among those its meeting gathered: all of them on
/// its own; on a parent, those of its color, which must be one per rank of the child.
fn members(candidate: &Candidate, gathered: &[u8]) -> Result<Members, String> {
    if candidate.comm == candidate.meeting.comm {
        return Ok(Members {
            records: gathered.to_vec(),
            positions: (0..candidate.nranks).collect(),
        });
    }
    // (rank, ranks, place) of each record of this color.
    let mut ranks: Vec<(u32, u32, usize)> = gathered
        .chunks(RECORD_BYTES)
        .map(Record::from_bytes)
        .enumerate()
        .filter(|(_, r)| r.nranks != 0 && r.color == candidate.color)
        .map(|(at, r)| (r.rank, r.nranks, at))
        .collect();
    ranks.sort_unstable();
    let whole = ranks.len() == candidate.nranks
        && ranks.iter().enumerate().all(|(i, &(rank, nranks, _))| {
            rank as usize == i && nranks as usize == candidate.nranks
        });
    if !whole {
        return Err(format!(
            "the parent's ranks of color {} do not make its {} ranks",
            candidate.color, candidate.nranks
        ));
    }
    let positions: Vec<usize> = ranks.into_iter().map(|(_, _, at)| at).collect();
    let records = positions
        .iter()
        .flat_map(|&at| &gathered[at * RECORD_BYTES..][..RECORD_BYTES])
        .copied()
        .collect();
    Ok(Members { records, positions })
}

/// Where a set-up's time goes, in seconds: this rank's own parts (kernels, buffers), the
/// exchange of records, opening the peers' buffers, the exchange of verdicts.
struct Phases {
    started: Instant,
    last: Instant,
    own: f64,
    exchange: f64,
    peers: f64,
    verdicts: f64,
}

impl Phases {
    fn start() -> Phases {
        let now = Instant::now();
        Phases {
            started: now,
            last: now,
            own: 0.0,
            exchange: 0.0,
            peers: 0.0,
            verdicts: 0.0,
        }
    }

    /// Seconds since the last lap.
    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let seconds = (now - self.last).as_secs_f64();
        self.last = now;
        seconds
    }
}

fn finish(
    candidate: &mut Candidate,
    mapped: Result<Mapped, String>,
    everyone: bool,
    phases: &Phases,
) {
    let parts = candidate.parts.take();
    let device = candidate.device.map_or(-1, |d| d.ordinal);
    let on = parts.is_some() && mapped.is_ok() && everyone;
    let (rank, nranks) = (candidate.rank as i32, candidate.nranks as i32);
    super::observer::observer().core_decided(candidate.comm, on, rank, nranks, device);
    match (parts, mapped, everyone) {
        (Some(parts), Ok(mapped), true) => {
            let core = CoreComm::new(
                candidate.rank,
                candidate.blocking,
                mapped.facts,
                parts,
                mapped.reach,
            );
            // Before the line: its set-up time counts it.
            core.ready_graphs();
            let settings = policy::settings();
            log_info!(
                "core on for comm {:p} rank {}/{} on GPU {}, set up in {:.3} s (own parts {:.3}, records {:.3}{}, peers {:.3}, verdicts {:.3}) (all-reduce: sentinel for floating-point types up to {} B, low-latency up to {} B, one-shot up to {} B, {} two-shot up to {} B; {})",
                candidate.comm,
                candidate.rank,
                candidate.nranks,
                core.device.ordinal,
                phases.started.elapsed().as_secs_f64(),
                phases.own,
                phases.exchange,
                match (
                    candidate.place.is_some(),
                    candidate.meeting.comm == candidate.comm
                ) {
                    (true, _) => " in shared memory",
                    (false, true) => " through NCCL",
                    (false, false) => " on its parent",
                },
                phases.peers,
                phases.verdicts,
                settings.sentinel_max(candidate.nranks),
                settings.ll_max(candidate.nranks),
                settings.one_shot_max(candidate.nranks),
                match (
                    core.facts.single_process,
                    settings.uses_direct(core.facts.single_process || core.facts.zero_copy),
                ) {
                    (true, true) => "direct",
                    (false, true) => "zero-copy direct",
                    _ => "staged",
                },
                settings.all_reduce_max(candidate.nranks, core.facts.single_process),
                settings.limits_text(&core.facts.measured)
            );
            measured::note_in_use(&core.facts.measured);
            if let Err(core) = lifecycle::came_on(candidate.comm, Arc::new(core)) {
                log_info!(
                    "core off for comm {:p}: destroyed, aborted or revoked during its set-up",
                    candidate.comm
                );
                // Its buffers and the peers' mappings are freed (no kernel of it ever ran).
                drop(core);
            }
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

#[cfg(test)]
mod tests {

    #[test]
    fn kernels_launch_early_and_in_the_remote_domain_from_sm_90_unless_told_otherwise() {
        use super::cuda::LaunchMode;
        let mode = |early, remote_domain| LaunchMode {
            early,
            remote_domain,
        };
        assert_eq!(launch_mode(9, 13000, true, None), mode(true, true));
        assert_eq!(launch_mode(10, 12030, true, Some(1)), mode(true, true));
        assert_eq!(launch_mode(9, 13000, true, Some(0)), mode(true, false));
        assert_eq!(launch_mode(9, 13000, false, None), mode(false, true));
        assert_eq!(launch_mode(9, 12020, true, None), mode(false, true));
        assert_eq!(launch_mode(9, 11080, true, None), LaunchMode::PLAIN);
        assert_eq!(launch_mode(8, 13000, true, None), LaunchMode::PLAIN);
    }
    use super::*;
    use crate::core::types::Collective;

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
        record.cta_bound = 24;
        record.copy_engines = 1;
        record.ipc[63] = 0xab;
        record.buffer = 0x7f00_0000_1000;
        record.measured[Collective::Scatter as usize] =
            Limit::parse("131072,8388608-33554432").to_words();
        record.measured_plain[Collective::AllGather as usize] =
            Limit::parse("268435456").to_words32();
        let bytes = record.to_bytes();
        assert_eq!(bytes.len(), RECORD_BYTES);
        let back = Record::from_bytes(&bytes);
        assert_eq!(
            (back.device, back.ipc[63], back.buffer, back.pci_bus_id),
            (3, 0xab, 0x7f00_0000_1000, record.pci_bus_id)
        );
        assert_eq!(back.measured, record.measured);
        assert_eq!(back.measured_plain, record.measured_plain);
        assert_eq!((back.cta_bound, back.copy_engines), (24, 1));
    }

    /// A split's child, as candidate: its rank and ranks, meeting on a parent of `parent_ranks`.
    fn child(color: i32, rank: usize, nranks: usize, parent_ranks: usize) -> Candidate {
        Candidate {
            comm: 0x10 as ncclComm_t,
            blocking: true,
            rank,
            nranks,
            meeting: Meeting {
                comm: 0x20 as ncclComm_t,
                rank: 0,
                nranks: parent_ranks,
            },
            color,
            device: None,
            exchange: None,
            place: None,
            parts: None,
            why_not: None,
            ctas: Asked::default(),
            waiting: std::ptr::null_mut(),
        }
    }

    /// The records a parent's ranks gathered: (color, rank, nranks) each, device = parent rank.
    fn gathered(ranks: &[(i32, u32, u32)]) -> Vec<u8> {
        ranks
            .iter()
            .enumerate()
            .flat_map(|(at, &(color, rank, nranks))| {
                Record {
                    color,
                    rank,
                    nranks,
                    ..ready(at as i32)
                }
                .to_bytes()
            })
            .collect()
    }

    /// A rank's record says whether the shim saw its communicator made blocking, ready or not.
    #[test]
    fn a_record_says_whether_its_communicator_is_blocking() {
        for blocking in [true, false] {
            let candidate = Candidate {
                blocking,
                ..child(1, 0, 2, 2)
            };
            let record = Record::from_bytes(&own_record(&candidate).to_bytes());
            assert_eq!(record.blocking, blocking as u32);
            assert_eq!((record.color, record.rank, record.nranks), (1, 0, 2));
        }
    }

    /// A rank whose child of a split is nonblocking declines it where a peer's is blocking (whose
    /// rank declines its own on this rank's record), and keeps it for its first all-reduce where
    /// every peer's is nonblocking too.
    #[test]
    fn a_nonblocking_child_is_declined_where_a_peers_is_blocking() {
        let records = |blocking: [u32; 2]| -> Vec<u8> {
            (0..2)
                .flat_map(|rank| {
                    Record {
                        color: 3,
                        rank,
                        nranks: 2,
                        blocking: blocking[rank as usize],
                        ..Record::not_ready()
                    }
                    .to_bytes()
                })
                .collect()
        };
        for (peers, declined) in [([0, 1], true), ([0, 0], false)] {
            let waiting = (0x7b00_0000 + 16 * peers[1] as usize) as ncclComm_t;
            lifecycle::awaits_first_all_reduce(waiting);
            let candidate = Candidate {
                comm: std::ptr::null_mut(),
                waiting,
                blocking: false,
                ..child(3, 0, 2, 2)
            };
            let found = members(&candidate, &records(peers));
            assert!(found.is_ok(), "both ranks' records of color 3");
            decline_if_mixed(&candidate, &found);
            let waits = matches!(lifecycle::lookup(waiting), lifecycle::Lookup::Waiting);
            assert_eq!(waits, !declined, "peers {peers:?}");
            lifecycle::forget(waiting);
        }
    }

    /// On a parent of four ranks (one given no child, one alone in its color), a child of two
    /// finds its ranks' records in its own rank order, wherever they stood in the parent's.
    #[test]
    fn children_find_their_records_among_the_parents() {
        let all = gathered(&[(5, 1, 2), (-1, 0, 0), (5, 0, 2), (7, 0, 1)]);
        let found = members(&child(5, 1, 2, 4), &all).expect("two of color 5");
        assert_eq!(found.positions, [2, 0]);
        let devices: Vec<i32> = found
            .records
            .chunks(RECORD_BYTES)
            .map(|r| Record::from_bytes(r).device)
            .collect();
        assert_eq!(devices, [2, 0]);
        assert_eq!(members(&child(7, 0, 1, 4), &all).unwrap().positions, [3]);
        // On its own communicator, every record is a member, in place.
        let mut own = child(0, 1, 4, 4);
        own.meeting.comm = own.comm;
        assert_eq!(members(&own, &all).unwrap().positions, [0, 1, 2, 3]);
    }

    /// Records that do not make the child (a rank missing, twice, or of another size): no.
    #[test]
    fn a_child_whose_records_do_not_add_up_is_refused() {
        let cases: [&[(i32, u32, u32)]; 4] = [
            &[(5, 1, 2), (-1, 0, 0)],
            &[(5, 1, 2), (5, 1, 2)],
            &[(5, 1, 2), (5, 0, 3)],
            &[(5, 1, 2), (5, 0, 2), (5, 2, 2)],
        ];
        for ranks in cases {
            let verdict = members(&child(5, 1, 2, ranks.len()), &gathered(ranks));
            assert!(
                verdict
                    .as_ref()
                    .is_err_and(|e| e.contains("do not make its 2 ranks")),
                "{ranks:?}: {:?}",
                verdict.map(|m| m.positions)
            );
        }
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
                "rank 0 has another NCCLSHIM_TUNE (ll_max)",
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
