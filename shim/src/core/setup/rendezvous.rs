//! Where every rank of a new communicator runs on this host (and shares its `/dev/shm`), the
//! ranks exchange their set-up through a small shared-memory segment named after the
//! communicator's unique id, not through an all-gather of the real NCCL's: that all-gather is
//! where NCCL connects its ranks (a tenth of a second between processes), which it then does only
//! if a call of the communicator goes to it, as it would without the shim.
//!
//! Each rank signs in (`sign_in`) before the real NCCL's init, and NCCL's init completes on no
//! rank before every rank has entered it: after it (a nonblocking communicator's at its first
//! all-reduce, which NCCL takes only once the init is complete), every rank of this host counts
//! the same signatures (`meet`): all of them where every rank signed in here, fewer where any
//! is elsewhere (another host, another `/dev/shm`, or a rank that could not sign in), and then
//! every rank exchanges through NCCL as before. Each rank signs in with its communicator's
//! mode, blocking or not: where they differ, every rank meets nowhere (`Met::Mixed`) and
//! declines. The same choice on every rank, from what every rank sees. A rank withdraws where
//! its init or first all-reduce failed, where it finds a peer's process gone, or where its
//! communicator is destroyed, aborted or revoked before or during its set-up (`withdraw`): its
//! peers stop waiting for it and decline the core. A rank that finds its place already taken
//! when it comes to sign in (a segment left from an id used before) voids the segment, before
//! its init, and every rank exchanges through NCCL.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::core::fnv::Fnv;
use crate::core::limits::MAX_RANKS;
use crate::ffi::ncclComm_t;
use crate::log::log_info;

/// The most bytes a rank publishes in one exchange.
pub const PAYLOAD_BYTES: usize = super::agreement::RECORD_BYTES;
/// How many exchanges a set-up makes: the records, then the verdicts.
const EXCHANGES: usize = 2;

/// Where a rank's slot stands: signed in, then one more for each exchange published.
const SIGNED: u32 = 1;
/// The rank gave up: its peers decline.
const WITHDRAWN: u32 = u32::MAX;
/// A rank is signing in (its pid not written yet).
const CLAIMING: u32 = u32::MAX - 2;
/// A rank found its slot taken when it came to sign in (a stale segment of an id used again):
/// written before its init, so that every rank sees it and exchanges through NCCL.
const VOID: u32 = u32::MAX - 1;
/// How many (ids, rank) uses a process remembers (`segment_name`).
const REMEMBERED_USES: usize = 4096;

/// One rank's place in the segment.
#[repr(C)]
struct Slot {
    state: AtomicU32,
    pid: u32,
    /// The inode of the rank's pid namespace: a pid means something only in the same one.
    pid_namespace: u64,
    /// 1 where the rank's communicator is made blocking (set up at its making, a nonblocking
    /// one at its first all-reduce).
    blocking: u32,
    /// Zero: keeps the payloads at 8-byte alignment.
    padding: u32,
    payloads: [[u8; PAYLOAD_BYTES]; EXCHANGES],
}

const SEGMENT_BYTES: usize = MAX_RANKS * size_of::<Slot>();
/// In the segment's name: builds that lay it out otherwise never open each other's.
const SEGMENT_LAYOUT: u32 = 2;

/// This process's shared mapping of a segment; unmapped when dropped.
struct Segment {
    base: *mut Slot,
}

// SAFETY: the mapping is shared memory; slots are written by their own rank only and published
// through `state`'s atomics.
unsafe impl Send for Segment {}

impl Segment {
    /// Opens (or creates) the segment `name`, its memory allocated (a full `/dev/shm` is an error
    /// here, not a SIGBUS at the first touch). A name it made is unlinked again where it fails.
    fn open(name: &CString) -> Result<Segment, String> {
        // SAFETY: a NUL-terminated name; the descriptor is closed below.
        let fd = unsafe {
            libc::shm_open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(format!("shm_open: {}", std::io::Error::last_os_error()));
        }
        let mapped = Self::map(fd);
        // SAFETY: our descriptor; a mapping outlives it.
        unsafe { libc::close(fd) };
        if mapped.is_err() {
            // SAFETY: a NUL-terminated name. Ranks that have it open keep it; later ones make
            // another, and no segment then holds every rank.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
        mapped
    }

    fn map(fd: libc::c_int) -> Result<Segment, String> {
        // SAFETY: a plain C struct, all zeros a valid value.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our descriptor; `stat` is written.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(format!("fstat: {}", std::io::Error::last_os_error()));
        }
        // Another build's segment (another size) is never resized under its ranks.
        if stat.st_size != 0 && stat.st_size != SEGMENT_BYTES as libc::off_t {
            return Err(format!("a segment of {} bytes", stat.st_size));
        }
        // Sizes it (a size already set keeps what was written) and allocates every page now.
        // SAFETY: our descriptor.
        let error = unsafe { libc::posix_fallocate(fd, 0, SEGMENT_BYTES as libc::off_t) };
        if error != 0 {
            return Err(format!(
                "allocating the segment: {}",
                std::io::Error::from_raw_os_error(error)
            ));
        }
        // SAFETY: a shared mapping of the segment's bytes, or MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SEGMENT_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mapping the segment: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Segment { base: base.cast() })
    }

    /// `rank`'s slot. Only its own rank writes it, and only through this pointer's places (never
    /// a reference to the whole slot, which its peers read meanwhile).
    fn slot(&self, rank: usize) -> *mut Slot {
        assert!(rank < MAX_RANKS);
        // SAFETY: within the mapping, which lives as long as `self`.
        unsafe { self.base.add(rank) }
    }

    fn state(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: a slot of the mapping; the state is only ever used atomically.
        unsafe { &(*self.slot(rank)).state }
    }

    /// The pid and pid namespace `rank` signed in with (read once its state says so).
    fn process(&self, rank: usize) -> (u32, u64) {
        let slot = self.slot(rank);
        // SAFETY: written before the state that published them.
        unsafe { ((*slot).pid, (*slot).pid_namespace) }
    }

    /// Appends `len` bytes of `rank`'s payload of exchange `exchange` (once published) to `to`.
    fn copy_payload(&self, rank: usize, exchange: usize, len: usize, to: &mut Vec<u8>) {
        let len = len.min(PAYLOAD_BYTES);
        to.reserve(len);
        // SAFETY: within the slot, written before the state that published it and not after;
        // copied (never referenced), so that even a slot written twice is only wrong bytes, which
        // `agree` refuses.
        unsafe {
            let at = (&raw const (*self.slot(rank)).payloads[exchange]).cast::<u8>();
            std::ptr::copy_nonoverlapping(at, to.as_mut_ptr().add(to.len()), len);
            to.set_len(to.len() + len);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping `open` made.
        unsafe { libc::munmap(self.base.cast(), SEGMENT_BYTES) };
    }
}

/// A rank signed in to its communicator's segment, before the real NCCL's init. Dropped before
/// `meet`, it withdraws.
pub struct Arrival {
    segment: Segment,
    name: CString,
    rank: usize,
    nranks: usize,
    blocking: bool,
    met: bool,
}

/// Where a rank meets its peers for its set-up (`meet`).
pub enum Met {
    /// In shared memory: every rank signed in here.
    Here(Place),
    /// Through NCCL: some rank did not sign in here.
    Elsewhere,
    /// Nowhere: the ranks' communicators are not all blocking or all nonblocking (NCCL allows
    /// it), so they would set up at different points of their calls, a blocking one waiting in
    /// its init for peers that come only at their first all-reduce. Every rank sees it from the
    /// signatures alone and declines the core without a word to the others.
    Mixed,
}

/// Signs rank `rank` of `nranks` in to the segment of the communicator made with `id` (its
/// unique ids' bytes), `blocking` or not, before the real NCCL's init; `None` where it could not
/// (it then counts as elsewhere, and its peers exchange through NCCL) or where the core could not
/// take so many ranks (then every rank's choice is NCCL's).
pub fn sign_in(id: &[u8], nranks: i32, rank: i32, blocking: bool) -> Option<Arrival> {
    let nranks = usize::try_from(nranks)
        .ok()
        .filter(|n| (2..=MAX_RANKS).contains(n))?;
    let rank = usize::try_from(rank).ok().filter(|&r| r < nranks)?;
    if id.is_empty() {
        return None;
    }
    sign_in_as(segment_name(id, nranks, rank), nranks, rank, blocking)
}

/// Signs rank `rank` of `nranks` in to the segment `name`.
fn sign_in_as(name: CString, nranks: usize, rank: usize, blocking: bool) -> Option<Arrival> {
    let segment = Segment::open(&name)
        .map_err(|e| log_info!("set-up through NCCL: {e}"))
        .ok()?;
    let claimed =
        segment
            .state(rank)
            .compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Acquire);
    if claimed.is_err() {
        segment.state(rank).store(VOID, Ordering::Release);
        // SAFETY: a NUL-terminated name: a stale segment goes (ranks that have it see VOID).
        unsafe { libc::shm_unlink(name.as_ptr()) };
        log_info!("set-up through NCCL: rank {rank}'s place in {name:?} was taken");
        return None;
    }
    let slot = segment.slot(rank);
    // SAFETY: this rank's own slot, published by the state below.
    unsafe {
        (*slot).pid = std::process::id();
        (*slot).pid_namespace = pid_namespace();
        (*slot).blocking = u32::from(blocking);
    }
    segment.state(rank).store(SIGNED, Ordering::Release);
    Some(Arrival {
        segment,
        name,
        rank,
        nranks,
        blocking,
        met: false,
    })
}

/// The segment's name: the ids and the number of ranks, and how many communicators this rank of
/// this process made before with the same ones (`Uses`).
fn segment_name(id: &[u8], nranks: usize, rank: usize) -> CString {
    static USES: Mutex<Option<Uses>> = Mutex::new(None);
    let mut uses = USES.lock().unwrap_or_else(|e| e.into_inner());
    uses.get_or_insert_with(Uses::default)
        .name(id, nranks, rank)
}

/// How many times each rank of this process used each ids (a unique id used again, once the
/// last communicator made with it is done: `NCCL_COMM_ID` gives every communicator the same), for
/// the last few thousand ids only: where ranks then count differently they meet in different
/// segments, each sees fewer than all, and all exchange through NCCL.
#[derive(Default)]
struct Uses(HashMap<(u64, usize), u64>);

impl Uses {
    fn name(&mut self, id: &[u8], nranks: usize, rank: usize) -> CString {
        let key = Fnv::new().bytes(id).word(nranks as u64).finish();
        if self.0.len() >= REMEMBERED_USES && !self.0.contains_key(&(key, rank)) {
            self.0.clear();
        }
        let count = self.0.entry((key, rank)).or_insert(0);
        let name = format!("/ncclshim-{SEGMENT_LAYOUT}-{key:016x}-{count}");
        *count += 1;
        CString::new(name).unwrap_or_default()
    }
}

fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

impl Arrival {
    /// After the real NCCL's init completed: where every rank signed in here, the place where
    /// they exchange, or nowhere where their communicators differ in blocking; else elsewhere
    /// (they exchange through NCCL). The segment's name is freed: every rank of this host has it
    /// open by now.
    fn meet(mut self) -> Met {
        self.met = true;
        // SAFETY: a NUL-terminated name; gone already is fine.
        unsafe { libc::shm_unlink(self.name.as_ptr()) };
        let states: Vec<u32> = (0..self.nranks)
            .map(|r| self.segment.state(r).load(Ordering::Acquire))
            .collect();
        // A rank withdrawn since it signed in counts: its peers meet here and decline.
        let signed = states.iter().filter(|&&s| s != 0).count();
        if signed != self.nranks || states.contains(&VOID) {
            return Met::Elsewhere;
        }
        // SAFETY: written before the state that published it (every rank signed, or withdrew
        // after signing); read by value.
        let blocking = |r| unsafe { (*self.segment.slot(r)).blocking } != 0;
        if (0..self.nranks).any(|r| blocking(r) != self.blocking) {
            return Met::Mixed;
        }
        Met::Here(Place {
            arrival: self,
            exchanges: Cell::new(0),
            stop: Arc::new(AtomicBool::new(false)),
            listed: false,
        })
    }

    fn withdraw(&self) {
        self.segment
            .state(self.rank)
            .store(WITHDRAWN, Ordering::Release);
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        if !self.met {
            self.withdraw();
            // SAFETY: as in `meet`.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }
}

/// Where every rank of a communicator exchanges its set-up in shared memory.
pub struct Place {
    arrival: Arrival,
    /// How many exchanges this rank has published.
    exchanges: Cell<usize>,
    /// Raised by `withdraw` (another thread): this rank's waits end.
    stop: Arc<AtomicBool>,
    /// Whether `MEETINGS` lists it.
    listed: bool,
}

impl Place {
    pub fn rank(&self) -> usize {
        self.arrival.rank
    }

    pub fn nranks(&self) -> usize {
        self.arrival.nranks
    }

    /// Publishes this rank's `payload` for the next exchange (at most `PAYLOAD_BYTES`); false if
    /// the set-up makes no more, or this rank has withdrawn.
    pub fn publish(&self, payload: &[u8]) -> bool {
        let exchange = self.exchanges.get();
        if exchange >= EXCHANGES || payload.len() > PAYLOAD_BYTES {
            return false;
        }
        let (segment, rank) = (&self.arrival.segment, self.arrival.rank);
        let before = SIGNED + exchange as u32;
        if self.stop.load(Ordering::Acquire)
            || segment.state(rank).load(Ordering::Acquire) != before
        {
            return false;
        }
        // SAFETY: this rank's own slot; no peer reads this exchange's payload before the state
        // below publishes it.
        unsafe {
            let at = (&raw mut (*segment.slot(rank)).payloads[exchange]).cast::<u8>();
            std::ptr::copy_nonoverlapping(payload.as_ptr(), at, payload.len());
        }
        // From the state read above only: a withdrawal meanwhile (`withdraw`, another thread)
        // stands.
        let published = before + 1;
        let stored = segment.state(rank).compare_exchange(
            before,
            published,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if stored.is_err() {
            return false;
        }
        self.exchanges.set(exchange + 1);
        true
    }

    /// Every rank's payload of the exchange this rank last published (`len` bytes each, in rank
    /// order), once all have published it; `None` (this rank withdrawn) where a rank withdrew or
    /// its process is gone, or where this rank was withdrawn from another thread (`withdraw`).
    /// Waits as long as the ranks are there: as long as NCCL's all-gather would.
    pub fn collect(&self, len: usize) -> Option<Vec<u8>> {
        let exchange = self.exchanges.get().checked_sub(1)?;
        if len > PAYLOAD_BYTES {
            return None;
        }
        let wanted = SIGNED + (exchange + 1) as u32;
        let segment = &self.arrival.segment;
        let started = Instant::now();
        let mut said = false;
        let mut all = Vec::with_capacity(self.nranks() * len);
        for rank in 0..self.nranks() {
            let mut checked = Instant::now();
            loop {
                // Withdrawn by another thread (its communicator destroyed, aborted or revoked).
                if self.stop.load(Ordering::Acquire) {
                    return None;
                }
                let state = segment.state(rank).load(Ordering::Acquire);
                if state == WITHDRAWN || state == VOID {
                    self.arrival.withdraw();
                    return None;
                }
                if (wanted..CLAIMING).contains(&state) {
                    break;
                }
                if checked.elapsed() > Duration::from_millis(100) {
                    checked = Instant::now();
                    let (pid, namespace) = segment.process(rank);
                    // Gone after it published (and so finished) is not gone: the loop reads it.
                    if gone(pid, namespace)
                        && !(wanted..CLAIMING)
                            .contains(&segment.state(rank).load(Ordering::Acquire))
                    {
                        log_info!(
                            "set-up: rank {rank}'s process (pid {pid}) is gone; the core stays off"
                        );
                        self.arrival.withdraw();
                        return None;
                    }
                    if !said && started.elapsed() > Duration::from_secs(10) {
                        said = true;
                        log_info!("set-up: still waiting for rank {rank} of {}", self.nranks());
                    }
                }
                pause(started.elapsed());
            }
            segment.copy_payload(rank, exchange, len, &mut all);
        }
        Some(all)
    }
}

/// Whether process `pid` of pid namespace `namespace` has ended, where this process can tell (in
/// the same namespace).
fn gone(pid: u32, namespace: u64) -> bool {
    if namespace == 0 || namespace != pid_namespace() {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let result = unsafe { libc::kill(pid as libc::pid_t, 0) };
    result != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// A short wait: yielding for the first milliseconds (a set-up's peers are at most that far
/// behind), then sleeping.
fn pause(waited: Duration) {
    if waited < Duration::from_millis(20) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.listed {
            let mut meetings = MEETINGS.lock().unwrap_or_else(|e| e.into_inner());
            meetings.retain(|m| !Arc::ptr_eq(&m.stop, &self.stop));
        }
    }
}

/// The arrivals of communicators made but not yet set up, by handle.
static ARRIVALS: Mutex<Vec<(usize, Arrival)>> = Mutex::new(Vec::new());

/// A set-up meeting now: the communicator, its rank's state in the segment, and what ends the
/// rank's waits.
struct Meeting {
    comm: usize,
    state: *const AtomicU32,
    stop: Arc<AtomicBool>,
}

// SAFETY: the state is shared memory used only atomically; the entry goes (under the lock)
// before the mapping does (`Place`'s drop).
unsafe impl Send for Meeting {}

/// The set-ups meeting in shared memory now, so that `withdraw` reaches a rank whose set-up
/// waits for its peers on another thread.
static MEETINGS: Mutex<Vec<Meeting>> = Mutex::new(Vec::new());

/// Where `comm`'s rank meets its peers for its set-up (`Met`; elsewhere where it holds no
/// arrival). After the real NCCL's init completed.
pub fn meet(comm: ncclComm_t) -> Met {
    // Held from taking the arrival to listing the meeting: a `withdraw` meanwhile finds one or
    // the other. (No `Place` of a listed meeting drops while it is held.)
    let mut meetings = MEETINGS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(arrival) = take(comm) else {
        return Met::Elsewhere;
    };
    let mut place = match arrival.meet() {
        Met::Here(place) => place,
        other => return other,
    };
    place.listed = true;
    meetings.push(Meeting {
        comm: comm as usize,
        state: place.arrival.segment.state(place.rank()),
        stop: place.stop.clone(),
    });
    Met::Here(place)
}

/// `comm`'s rank withdraws, where its communicator will not be set up or stops being set up:
/// its arrival is let go, and a set-up meeting for it gives up. Its peers stop waiting for it.
pub fn withdraw(comm: ncclComm_t) {
    // In `meet`'s order: the meetings, then the arrivals.
    let meetings = MEETINGS.lock().unwrap_or_else(|e| e.into_inner());
    drop(take(comm));
    for meeting in meetings.iter().filter(|m| m.comm == comm as usize) {
        meeting.stop.store(true, Ordering::Release);
        // Peers see it withdrawn only before it published its last exchange: after, some may
        // already have decided with its verdict, and the others must decide alike.
        // SAFETY: listed, so still mapped (see `Meeting`).
        let state = unsafe { &*meeting.state };
        let last = SIGNED + EXCHANGES as u32;
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (s < last).then_some(WITHDRAWN)
        });
    }
}

/// Keeps `arrival` until `comm`'s set-up takes it.
pub fn hold(comm: ncclComm_t, arrival: Arrival) {
    let mut held = ARRIVALS.lock().unwrap_or_else(|e| e.into_inner());
    held.retain(|(c, _)| *c != comm as usize);
    held.push((comm as usize, arrival));
}

/// `comm`'s arrival, if it has one held.
fn take(comm: ncclComm_t) -> Option<Arrival> {
    let mut held = ARRIVALS.lock().unwrap_or_else(|e| e.into_inner());
    let at = held.iter().position(|(c, _)| *c == comm as usize)?;
    Some(held.swap_remove(at).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Met {
        fn here(self) -> Place {
            match self {
                Met::Here(place) => place,
                _ => panic!("not met here"),
            }
        }
    }

    /// Ranks whose communicators differ in blocking meet nowhere, each seeing it alone; ranks
    /// alike in it, nonblocking too, meet here.
    #[test]
    fn ranks_that_differ_in_blocking_meet_nowhere() {
        let id = unique_id("mixed");
        let arrivals =
            [true, false].map(|blocking| sign_in(&id, 2, i32::from(!blocking), blocking).unwrap());
        assert!(arrivals.into_iter().all(|a| matches!(a.meet(), Met::Mixed)));
        let id = unique_id("nonblocking");
        let arrivals = [0, 1].map(|r| sign_in(&id, 2, r, false).unwrap());
        assert!(
            arrivals
                .into_iter()
                .all(|a| matches!(a.meet(), Met::Here(_)))
        );
    }

    fn unique_id(tag: &str) -> Vec<u8> {
        let mut id = format!("{tag}-{}-", std::process::id()).into_bytes();
        id.extend_from_slice(&crate::core::setup::identity::nonce().to_le_bytes());
        id
    }

    /// A meeting of `nranks` ranks, all signed in: rank 0's through `meet` as a set-up's (its
    /// arrival held for `comm`, so that `withdraw(comm)` reaches it), the others' directly.
    fn meeting_of(tag: &str, comm: ncclComm_t, nranks: i32) -> (Place, Vec<Place>) {
        let id = unique_id(tag);
        hold(comm, sign_in(&id, nranks, 0, true).unwrap());
        let arrivals: Vec<Arrival> = (1..nranks)
            .map(|r| sign_in(&id, nranks, r, true).unwrap())
            .collect();
        let peers = arrivals.into_iter().map(|a| a.meet().here()).collect();
        (meet(comm).here(), peers)
    }

    /// Ranks that all signed in meet, exchange both payloads in rank order, and leave no name
    /// behind in /dev/shm.
    #[test]
    fn ranks_that_all_signed_in_exchange_in_shared_memory() {
        let id = unique_id("all");
        let arrivals: Vec<Arrival> = (0..3).map(|r| sign_in(&id, 3, r, true).unwrap()).collect();
        let name = arrivals[0].name.clone();
        let mut places: Vec<Place> = arrivals.into_iter().map(|a| a.meet().here()).collect();
        let file = std::path::Path::new("/dev/shm").join(&name.to_str().unwrap()[1..]);
        assert!(!file.exists(), "the name is freed once met");
        let threads: Vec<_> = places
            .drain(..)
            .map(|place| {
                std::thread::spawn(move || {
                    let r = place.rank() as u8;
                    assert!(place.publish(&[r, r + 10]));
                    let records = place.collect(2).unwrap();
                    assert!(place.publish(&[r * 2]));
                    let verdicts = place.collect(1).unwrap();
                    assert!(!place.publish(&[0]), "two exchanges only");
                    (records, verdicts)
                })
            })
            .collect();
        for thread in threads {
            let (records, verdicts) = thread.join().unwrap();
            assert_eq!(records, [0, 10, 1, 11, 2, 12]);
            assert_eq!(verdicts, [0, 2, 4]);
        }
    }

    /// A rank that never signed in (elsewhere) leaves every rank here to NCCL's exchange.
    #[test]
    fn a_rank_elsewhere_leaves_everyone_to_nccl() {
        let id = unique_id("elsewhere");
        let here: Vec<Arrival> = [0, 2]
            .iter()
            .map(|&r| sign_in(&id, 3, r, true).unwrap())
            .collect();
        assert!(here.into_iter().all(|a| matches!(a.meet(), Met::Elsewhere)));
    }

    /// A rank whose init failed (dropped unmet) withdraws: its peers stop waiting and fail.
    #[test]
    fn a_withdrawn_rank_ends_its_peers_wait() {
        let id = unique_id("withdrawn");
        let mut arrivals: Vec<Arrival> =
            (0..2).map(|r| sign_in(&id, 2, r, true).unwrap()).collect();
        let failed = arrivals.pop().unwrap();
        let place = arrivals.pop().unwrap().meet().here();
        drop(failed);
        assert!(place.publish(&[1]));
        assert!(place.collect(1).is_none());
    }

    /// A rank whose process ended is given up on, not waited for.
    #[test]
    fn a_peer_whose_process_ended_is_not_waited_for() {
        let id = unique_id("gone");
        let arrivals: Vec<Arrival> = (0..2).map(|r| sign_in(&id, 2, r, true).unwrap()).collect();
        let mut places: Vec<Place> = arrivals.into_iter().map(|a| a.meet().here()).collect();
        let peer = places.pop().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        // SAFETY: rank 1's slot, as its own rank would write it.
        unsafe { (*peer.arrival.segment.slot(1)).pid = child.id() };
        let started = Instant::now();
        assert!(places[0].publish(&[1]));
        assert!(places[0].collect(1).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// The same ids give each rank a new segment each time it makes a communicator with them,
    /// alike on every rank; other ids or sizes, other segments; too many ranks, none.
    #[test]
    fn names_follow_the_ids_and_their_uses() {
        let id = unique_id("names");
        let first = segment_name(&id, 2, 0);
        assert_eq!(segment_name(&id, 2, 1), first, "rank 1's first use");
        let second = segment_name(&id, 2, 0);
        assert_ne!(second, first);
        assert_eq!(segment_name(&id, 2, 1), second);
        assert_ne!(segment_name(&id, 3, 0), segment_name(&id, 2, 0));
        assert!(sign_in(&id, MAX_RANKS as i32 + 1, 0, true).is_none());
        assert!(sign_in(&id, 2, 2, true).is_none());
        assert!(sign_in(&id, 1, 0, true).is_none());
    }

    /// A rank that finds its place taken (a stale segment) voids the segment before its init:
    /// every rank, those already signed in too, then exchanges through NCCL.
    #[test]
    fn a_place_taken_sends_every_rank_to_nccl() {
        let id = unique_id("taken");
        let first = sign_in(&id, 2, 0, true).unwrap();
        let peer = sign_in(&id, 2, 1, true).unwrap();
        assert!(
            sign_in_as(first.name.clone(), 2, 0, true).is_none(),
            "rank 0's place is taken"
        );
        assert!(matches!(first.meet(), Met::Elsewhere));
        assert!(matches!(peer.meet(), Met::Elsewhere));
    }

    /// A killed job's rank left its slot signed: the next job's rank that comes to it finds its
    /// place taken, and both ranks of the new job exchange through NCCL, whichever signs in
    /// first.
    #[test]
    fn a_stale_slot_sends_the_next_job_to_nccl() {
        let id = unique_id("stale");
        let killed = sign_in(&id, 2, 0, true).unwrap();
        let name = killed.name.clone();
        // Its process is gone without withdrawing (its mapping stays: nothing else frees it).
        std::mem::forget(killed);
        let peer = sign_in_as(name.clone(), 2, 1, true).unwrap();
        assert!(
            sign_in_as(name, 2, 0, true).is_none(),
            "rank 0's place is taken"
        );
        assert!(matches!(peer.meet(), Met::Elsewhere));
    }

    /// A rank whose set-up waits for a peer in shared memory gives up once its communicator is
    /// withdrawn from another thread (destroyed, aborted, revoked), and its peers see it gone.
    #[test]
    fn withdrawing_ends_a_meeting_in_progress() {
        let comm = 0x5200_0000 as ncclComm_t;
        let (place, mut peers) = meeting_of("meeting", comm, 2);
        let silent_peer = peers.remove(0);
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            assert!(place.publish(&[1]));
            let collected = place.collect(1);
            drop(place);
            done.send(collected).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        withdraw(comm);
        let collected = result.recv_timeout(Duration::from_secs(10));
        assert!(collected.expect("the wait ended").is_none());
        assert!(silent_peer.publish(&[2]));
        assert!(
            silent_peer.collect(1).is_none(),
            "the peer sees it withdrawn"
        );
        let meetings = MEETINGS.lock().unwrap();
        assert!(meetings.iter().all(|m| m.comm != comm as usize), "unlisted");
    }

    /// A rank withdrawn before it publishes publishes nothing, and its peer sees it withdrawn.
    #[test]
    fn a_withdrawn_rank_publishes_nothing() {
        let comm = 0x5300_0000 as ncclComm_t;
        let (place, peers) = meeting_of("no-publish", comm, 2);
        let peer = &peers[0];
        withdraw(comm);
        assert!(!place.publish(&[1]));
        assert!(peer.publish(&[2]));
        assert!(peer.collect(1).is_none());
    }

    /// A rank withdrawn once it has published its last exchange stops waiting, but its peers,
    /// some of which may have decided with its verdict already, all decide with it.
    #[test]
    fn a_late_withdrawal_leaves_the_peers_decision_alone() {
        let comm = 0x5400_0000 as ncclComm_t;
        let (place, peers) = meeting_of("late", comm, 3);
        for exchange in 0..EXCHANGES {
            assert!(place.publish(&[exchange as u8]));
            peers
                .iter()
                .for_each(|p| assert!(p.publish(&[exchange as u8])));
            if exchange + 1 < EXCHANGES {
                assert!(place.collect(1).is_some());
                peers.iter().for_each(|p| assert!(p.collect(1).is_some()));
            }
        }
        assert!(
            peers[0].collect(1).is_some(),
            "decided before the withdrawal"
        );
        withdraw(comm);
        assert!(peers[1].collect(1).is_some(), "decided after it, alike");
    }

    /// A segment of another size (another build's) is refused, not resized under its ranks.
    #[test]
    fn a_segment_of_another_size_is_refused() {
        let name = CString::new(format!("/ncclshim-test-size-{}", std::process::id())).unwrap();
        // SAFETY: a NUL-terminated name; the descriptor is closed below.
        let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
        assert!(fd >= 0);
        // SAFETY: our descriptor.
        unsafe {
            assert_eq!(libc::ftruncate(fd, 4096), 0);
            libc::close(fd);
        }
        assert!(Segment::open(&name).is_err());
        let file = std::path::Path::new("/dev/shm").join(&name.to_str().unwrap()[1..]);
        assert!(!file.exists(), "a name it could not use is unlinked");
    }

    /// The uses remembered are bounded, and a forgotten id starts again from its first name.
    #[test]
    fn uses_are_forgotten_after_a_few_thousand_ids() {
        let mut uses = Uses::default();
        let first = uses.name(b"id", 2, 0);
        assert_ne!(uses.name(b"id", 2, 0), first);
        for n in 0..REMEMBERED_USES {
            uses.name(&n.to_le_bytes(), 2, 0);
        }
        assert!(uses.0.len() <= REMEMBERED_USES);
        assert_eq!(uses.name(b"id", 2, 0), first);
    }

    /// The hand-over table gives each communicator's arrival back once.
    #[test]
    fn held_arrivals_are_taken_once() {
        let id = unique_id("held");
        let comm = 0x5100_0000 as ncclComm_t;
        hold(comm, sign_in(&id, 2, 0, true).unwrap());
        assert!(take(comm).is_some());
        assert!(take(comm).is_none());
    }
}
