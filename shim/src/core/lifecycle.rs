//! A communicator's life as the core sees it, in a side table keyed by the real NCCL's handle:
//! every state it can be in, and the named transitions between them, each the one place where
//! that change happens.
//!
//! ```text
//!   unknown --made--------------------> Made ------\
//!   Made --deferred--> AwaitsFirstAllReduce
//!   unknown --awaits_first_all_reduce--> AwaitsFirstAllReduce --first_all_reduce--> SettingUp
//!   unknown --met_at_first_all_reduce------------------------------------------> SettingUp
//!   Made, SettingUp --came_on--> Core --revoked--> Revoked (revoked: from any state)
//!   Core --suspended--> AwaitsFirstAllReduce
//!   Made, SettingUp, AwaitsFirstAllReduce --declined--> Declined
//!   any --forget (destroyed, aborted)--> unknown
//! ```
//!
//! A communicator is known from the moment the shim sees it made (or, made where the shim could
//! not see its handle, from its first all-reduce), so that each gets one set-up only.
//! Nonblocking ones wait for their first all-reduce (and so do blocking ones whose ranks did not
//! all meet in shared memory, `deferred`): their creation returns before the real NCCL
//! is ready, and the set-up needs every rank's init complete (to count who met in shared memory)
//! or, through NCCL, makes an operation on the communicator, which NCCL refuses until the
//! previous one has settled; that first all-reduce is the same point in every rank's sequence of
//! operations, whatever the timing. Every communicator that does not get the core
//! says why, once (`declined`). Calls on unknown handles while none is known check one atomic;
//! a thread's calls on the communicators it last looked up (up to `KEPT`) read no lock (`LAST`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};

use super::comm::CoreComm;
use crate::ffi::ncclComm_t;
use crate::log::log_info;

/// Where a known communicator's core stands.
enum State {
    /// Seen made: its set-up is due, now or at the end of the group it was made in.
    Made,
    /// Nonblocking, made where the shim could not see its handle, or blocking with ranks that
    /// meet through NCCL: set up after its first all-reduce (which goes to NCCL).
    AwaitsFirstAllReduce,
    /// Its first all-reduce was taken: set up once that has settled.
    SettingUp,
    Core(Arc<CoreComm>),
    /// Left to NCCL (the reason was said).
    Declined,
    /// Revoked (ncclCommRevoke): left to NCCL for good, which refuses its operations.
    Revoked,
}

struct Entry {
    state: State,
    /// Made blocking, as far as the shim knows (a communicator it never saw made: no).
    blocking: bool,
    /// Every rank's communicator is known to be made in one mode (`alike`).
    alike: bool,
}

static TABLE: RwLock<Option<HashMap<usize, Entry>>> = RwLock::new(None);
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Changes of the table so far, counted under its lock: an answer a thread kept holds while
/// this count is the one it was read at.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// A `Lookup` as a thread keeps it. The core is held weakly: a communicator destroyed meanwhile
/// is released at once (`Arc::try_unwrap`), never kept alive by a thread's last answer.
enum Kept {
    Core(Weak<CoreComm>),
    NoCore,
    Waiting,
    Revoked,
    Unknown,
}

impl Kept {
    fn of(answer: &Lookup) -> Kept {
        match answer {
            Lookup::Core(core) => Kept::Core(Arc::downgrade(core)),
            Lookup::NoCore => Kept::NoCore,
            Lookup::Waiting => Kept::Waiting,
            Lookup::Revoked => Kept::Revoked,
            Lookup::Unknown => Kept::Unknown,
        }
    }

    /// The answer again; `None` where its core has gone since.
    fn answer(&self) -> Option<Lookup> {
        Some(match self {
            Kept::Core(core) => Lookup::Core(core.upgrade()?),
            Kept::NoCore => Lookup::NoCore,
            Kept::Waiting => Lookup::Waiting,
            Kept::Revoked => Lookup::Revoked,
            Kept::Unknown => Lookup::Unknown,
        })
    }
}

/// How many answers a thread keeps: one for each GPU a thread may drive (a process driving
/// every GPU of a node from one thread calls on each communicator in turn, as nccl-tests `-g`).
const KEPT: usize = 8;

/// A thread's last answers, each with its handle and `CHANGES` when it was read.
struct LastAnswers {
    answers: [Option<(usize, u64, Kept)>; KEPT],
    /// Where the next handle not kept goes (the oldest kept first).
    next: usize,
}

impl LastAnswers {
    const fn new() -> LastAnswers {
        LastAnswers {
            answers: [const { None }; KEPT],
            next: 0,
        }
    }

    /// The answer kept for `key`, where the table has not changed since (`changes`).
    fn find(&self, key: usize, changes: u64) -> Option<Lookup> {
        let (_, _, kept) = self
            .answers
            .iter()
            .flatten()
            .find(|(kept_key, at, _)| *kept_key == key && *at == changes)?;
        kept.answer()
    }

    /// Keeps `answer` for `key`: in its handle's place, else in the oldest.
    fn keep(&mut self, key: usize, changes: u64, answer: &Lookup) {
        let kept = |a: &Option<(usize, u64, Kept)>| a.as_ref().is_some_and(|(k, _, _)| *k == key);
        let place = self.answers.iter().position(kept).unwrap_or_else(|| {
            let oldest = self.next;
            self.next = (oldest + 1) % KEPT;
            oldest
        });
        self.answers[place] = Some((key, changes, Kept::of(answer)));
    }
}

thread_local! {
    /// This thread's last answers. A program calls on one communicator (or, driving several
    /// GPUs from one thread, on a few in turn) many times, so most calls find theirs here.
    static LAST: RefCell<LastAnswers> = const { RefCell::new(LastAnswers::new()) };
}

/// What a call needs to know of a handle.
pub enum Lookup {
    Core(Arc<CoreComm>),
    /// Known, without a core (yet, or for good): its calls go to NCCL.
    NoCore,
    /// Waiting for its first all-reduce.
    Waiting,
    /// Revoked: its calls go to NCCL, which refuses them.
    Revoked,
    /// Never seen made.
    Unknown,
}

fn with_table<T>(f: impl FnOnce(&mut HashMap<usize, Entry>) -> T) -> T {
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let result = f(table.get_or_insert_with(HashMap::new));
    // Counted while the lock is held: whoever reads the new count finds the change made.
    CHANGES.fetch_add(1, Ordering::Release);
    result
}

/// Records `comm`, if unknown, in `state`; whether it was unknown.
fn add(comm: ncclComm_t, state: State, blocking: bool) -> bool {
    // NCCL read its settings for this communicator as it made it: so do the answers of calls of
    // no elements.
    super::empty::communicator_made();
    with_table(|table| {
        let unknown = !table.contains_key(&(comm as usize));
        if unknown {
            table.insert(
                comm as usize,
                Entry {
                    state,
                    blocking,
                    alike: false,
                },
            );
            ENTRIES.fetch_add(1, Ordering::Release);
        }
        unknown
    })
}

/// unknown -> Made: `comm` was seen made; whether it was unknown (a handle seen twice is set up
/// once).
pub fn made(comm: ncclComm_t, blocking: bool) -> bool {
    add(comm, State::Made, blocking)
}

/// unknown -> AwaitsFirstAllReduce, for the nonblocking `comm` (NULL is no communicator).
pub fn awaits_first_all_reduce(comm: ncclComm_t) {
    if !comm.is_null() {
        add(comm, State::AwaitsFirstAllReduce, false);
    }
}

/// unknown -> SettingUp: `comm` was never seen made (such as a nonblocking parent's split), and
/// this is its first all-reduce; whether it was unknown.
pub fn met_at_first_all_reduce(comm: ncclComm_t) -> bool {
    add(comm, State::SettingUp, false)
}

/// AwaitsFirstAllReduce -> SettingUp: whether `comm` was waiting (only one call takes it).
pub fn first_all_reduce(comm: ncclComm_t) -> bool {
    with_table(|table| match table.get_mut(&(comm as usize)) {
        Some(entry) if matches!(entry.state, State::AwaitsFirstAllReduce) => {
            entry.state = State::SettingUp;
            true
        }
        _ => false,
    })
}

/// Made or SettingUp -> Core; the core handed back (not taken) where `comm` was destroyed,
/// aborted or revoked meanwhile, from another thread.
pub fn came_on(comm: ncclComm_t, core: Arc<CoreComm>) -> Result<(), Arc<CoreComm>> {
    with_table(|table| match table.get_mut(&(comm as usize)) {
        Some(entry) if matches!(entry.state, State::Made | State::SettingUp) => {
            entry.state = State::Core(core);
            Ok(())
        }
        _ => Err(core),
    })?;
    // Each second, every core whose kernel gave up waiting says so (`CoreComm::failed`).
    super::watch::start(|| {
        for (comm, core) in cores() {
            core.failed(comm);
        }
    });
    Ok(())
}

/// A nonblocking communicator was created (the real NCCL may still be initialising it): its
/// core is set up after its first all-reduce.
pub fn made_nonblocking(comm: ncclComm_t) {
    if !comm.is_null() {
        log_info!("comm {comm:p} is nonblocking: its core is set up after its first all-reduce");
        awaits_first_all_reduce(comm);
    }
}

/// Made, SettingUp or AwaitsFirstAllReduce -> Declined, saying why, with this rank where known
/// (a communicator that has a core keeps it).
pub fn declined(comm: ncclComm_t, rank: Option<usize>, why: &str) {
    let changed = with_table(|table| match table.get_mut(&(comm as usize)) {
        Some(entry)
            if !matches!(
                entry.state,
                State::Core(_) | State::Declined | State::Revoked
            ) =>
        {
            entry.state = State::Declined;
            true
        }
        _ => false,
    });
    if changed {
        let rank = rank.map_or(String::new(), |r| format!(" rank {r}"));
        log_info!("core off for comm {comm:p}{rank}: {why}; its calls forward");
    }
}

#[inline]
pub fn lookup(comm: ncclComm_t) -> Lookup {
    if ENTRIES.load(Ordering::Acquire) == 0 {
        return Lookup::Unknown;
    }
    let (key, changes) = (comm as usize, CHANGES.load(Ordering::Acquire));
    // `try_with`: a call from a thread whose thread-locals are gone (its exit) reads the table.
    let kept = LAST.try_with(|last| last.borrow().find(key, changes));
    if let Ok(Some(answer)) = kept {
        return answer;
    }
    // Read after `changes`: a change made meanwhile is found, and counted, so kept no longer.
    let answer = read(key);
    let _ = LAST.try_with(|last| last.borrow_mut().keep(key, changes, &answer));
    answer
}

/// What the table says of `key` now.
fn read(key: usize) -> Lookup {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    match table.as_ref().and_then(|t| t.get(&key)) {
        Some(entry) => match &entry.state {
            State::Core(core) => Lookup::Core(core.clone()),
            State::Made | State::SettingUp | State::Declined => Lookup::NoCore,
            State::AwaitsFirstAllReduce => Lookup::Waiting,
            State::Revoked => Lookup::Revoked,
        },
        None => Lookup::Unknown,
    }
}

/// Made -> AwaitsFirstAllReduce: the blocking `comm`'s ranks meet through NCCL, so they set up
/// at its first all-reduce, as a nonblocking one's do (setup/mod.rs, `set_up`).
pub fn deferred(comm: ncclComm_t) {
    with_table(|table| {
        if let Some(entry) = table.get_mut(&(comm as usize))
            && matches!(entry.state, State::Made)
        {
            entry.state = State::AwaitsFirstAllReduce;
        }
    });
}

/// Every rank's `comm` is known to be made in one mode: its ranks met in shared memory, where
/// each signed in with its mode, or a split's records on its parent said so (setup/mod.rs). Only
/// then do its blocking ranks meet children on it: every rank of it decides alike.
pub fn alike(comm: ncclComm_t) {
    with_table(|table| {
        if let Some(entry) = table.get_mut(&(comm as usize)) {
            entry.alike = true;
        }
    });
}

/// Whether `comm` is blocking and known to be so on every rank (`alike`).
pub fn blocking_everywhere(comm: ncclComm_t) -> bool {
    entry_is(comm, |entry| entry.blocking && entry.alike)
}

/// Whether `comm` is known and its entry is as `test` wants.
fn entry_is(comm: ncclComm_t, test: impl FnOnce(&Entry) -> bool) -> bool {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table
        .as_ref()
        .and_then(|t| t.get(&(comm as usize)))
        .is_some_and(test)
}

/// Whether `comm` is known to have been made blocking.
pub fn blocking(comm: ncclComm_t) -> bool {
    entry_is(comm, |entry| entry.blocking)
}

/// any -> Revoked (ncclCommRevoke): takes `comm`'s core away, if it has one, and never sets one
/// up after; its calls go to NCCL from then on.
pub fn revoked(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let entry = table.get_mut(&(comm as usize))?;
        match std::mem::replace(&mut entry.state, State::Revoked) {
            State::Core(core) => Some(core),
            _ => None,
        }
    })
}

/// Core -> AwaitsFirstAllReduce (ncclCommSuspend freeing its memory, every rank at the same
/// point of its calls): takes `comm`'s core away, to be set up anew at its first all-reduce
/// after, through NCCL, as a communicator whose ranks met there is. In any other state it stays.
pub fn suspended(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let entry = table.get_mut(&(comm as usize))?;
        match &entry.state {
            State::Core(_) => {
                match std::mem::replace(&mut entry.state, State::AwaitsFirstAllReduce) {
                    State::Core(core) => Some(core),
                    _ => None,
                }
            }
            _ => None,
        }
    })
}

/// Every communicator with a core, for the watcher (watch.rs).
pub fn cores() -> Vec<(ncclComm_t, Arc<CoreComm>)> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let entries = table.iter().flat_map(|t| t.iter());
    entries
        .filter_map(|(&comm, entry)| match &entry.state {
            State::Core(core) => Some((comm as ncclComm_t, core.clone())),
            _ => None,
        })
        .collect()
}

/// any -> unknown (ncclCommDestroy, ncclCommAbort): forgets `comm`, whose handle may come back
/// for another communicator; its core, if it had one.
pub fn forget(comm: ncclComm_t) -> Option<Arc<CoreComm>> {
    with_table(|table| {
        let removed = table.remove(&(comm as usize))?;
        ENTRIES.fetch_sub(1, Ordering::Release);
        match removed.state {
            State::Core(core) => Some(core),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A communicator is blocking on every rank only once known alike: made blocking is not
    /// enough (its peers may be nonblocking).
    #[test]
    fn blocking_everywhere_only_once_alike() {
        let (blocking, nonblocking) = (0x7500_2000 as ncclComm_t, 0x7500_2010 as ncclComm_t);
        made(blocking, true);
        awaits_first_all_reduce(nonblocking);
        assert!(!blocking_everywhere(blocking));
        alike(blocking);
        alike(nonblocking);
        assert!(blocking_everywhere(blocking) && !blocking_everywhere(nonblocking));
        for comm in [blocking, nonblocking] {
            forget(comm);
        }
    }

    #[test]
    fn a_communicator_is_known_once_until_removed() {
        let comm = 0x6000_0040 as ncclComm_t;
        assert!(matches!(lookup(comm), Lookup::Unknown));
        assert!(made(comm, true), "first seen");
        assert!(!made(comm, false), "seen already");
        assert!(matches!(lookup(comm), Lookup::NoCore));
        assert!(blocking(comm), "as first seen");
        assert!(forget(comm).is_none(), "it had no core");
        assert!(matches!(lookup(comm), Lookup::Unknown));
        assert!(!blocking(comm), "not known");
        assert!(made(comm, false), "a new communicator at the same address");
        assert!(!blocking(comm));
        forget(comm);
    }

    #[test]
    fn a_communicator_is_taken_once() {
        let (a, b) = (0x1000 as ncclComm_t, 0x2000 as ncclComm_t);
        awaits_first_all_reduce(a);
        awaits_first_all_reduce(a);
        awaits_first_all_reduce(std::ptr::null_mut());
        assert!(!first_all_reduce(b), "never inserted");
        assert!(
            !first_all_reduce(std::ptr::null_mut()),
            "NULL is no communicator"
        );
        assert!(matches!(lookup(a), Lookup::Waiting));
        assert!(first_all_reduce(a));
        assert!(!first_all_reduce(a), "taken already");
        assert!(matches!(lookup(a), Lookup::NoCore), "known, without a core");
        forget(a);
    }

    #[test]
    fn a_declined_communicator_forwards_for_good() {
        let (made_one, waiting, unseen) = (
            0x6100_0040 as ncclComm_t,
            0x6100_0080 as ncclComm_t,
            0x6100_00c0 as ncclComm_t,
        );
        made(made_one, true);
        awaits_first_all_reduce(waiting);
        for comm in [made_one, waiting] {
            declined(comm, Some(1), "a test says so");
            assert!(matches!(lookup(comm), Lookup::NoCore));
        }
        assert!(
            !first_all_reduce(waiting),
            "declined: no set-up after its first all-reduce"
        );
        assert!(met_at_first_all_reduce(unseen));
        assert!(!met_at_first_all_reduce(unseen), "met once");
        assert!(matches!(lookup(unseen), Lookup::NoCore), "being set up");
        declined(unseen, None, "a test says so");
        assert!(revoked(unseen).is_none(), "it had no core");
        assert!(matches!(lookup(unseen), Lookup::Revoked));
        declined(unseen, None, "a test says so");
        assert!(
            matches!(lookup(unseen), Lookup::Revoked),
            "revoked for good"
        );
        assert!(!met_at_first_all_reduce(unseen), "never set up");
        for comm in [made_one, waiting, unseen] {
            assert!(forget(comm).is_none());
            assert!(matches!(lookup(comm), Lookup::Unknown));
        }
    }

    /// Suspending a communicator without a core changes nothing: one made stays due for its
    /// set-up, one waiting still waits, one declined still forwards. (With a core: the GPU
    /// suite's zero-copy test.)
    #[test]
    fn a_communicator_without_a_core_stays_as_it_was_when_suspended() {
        let (made_one, waiting, declined_one) = (
            0x6100_0100 as ncclComm_t,
            0x6100_0140 as ncclComm_t,
            0x6100_0180 as ncclComm_t,
        );
        made(made_one, true);
        awaits_first_all_reduce(waiting);
        made(declined_one, true);
        declined(declined_one, None, "a test says so");
        for comm in [made_one, waiting, declined_one] {
            assert!(suspended(comm).is_none(), "it had no core");
        }
        assert!(matches!(lookup(made_one), Lookup::NoCore));
        assert!(matches!(lookup(waiting), Lookup::Waiting));
        assert!(!first_all_reduce(declined_one), "declined for good");
        assert!(first_all_reduce(waiting), "still waiting");
        for comm in [made_one, waiting, declined_one] {
            forget(comm);
        }
        assert!(suspended(made_one).is_none(), "unknown");
    }

    #[test]
    fn a_kept_answer_holds_until_another_thread_changes_the_table() {
        let comm = 0x6200_0040 as ncclComm_t;
        made(comm, true);
        assert!(matches!(lookup(comm), Lookup::NoCore));
        assert!(matches!(lookup(comm), Lookup::NoCore), "kept");
        let handle = comm as usize;
        std::thread::spawn(move || {
            forget(handle as ncclComm_t);
            awaits_first_all_reduce(handle as ncclComm_t);
        })
        .join()
        .unwrap();
        assert!(matches!(lookup(comm), Lookup::Waiting), "changed elsewhere");
        std::thread::spawn(move || forget(handle as ncclComm_t))
            .join()
            .unwrap();
        assert!(matches!(lookup(comm), Lookup::Unknown));
    }

    #[test]
    fn a_thread_calling_on_several_communicators_in_turn_gets_each_ones_answer() {
        // More than a thread keeps: every answer is kept, found, and pushed out in turn.
        let comms: Vec<usize> = (0..KEPT + 3).map(|i| 0x6400_0000 + i * 0x40).collect();
        for (i, &c) in comms.iter().enumerate() {
            if i.is_multiple_of(2) {
                made(c as ncclComm_t, true);
            } else {
                awaits_first_all_reduce(c as ncclComm_t);
            }
        }
        let expected = |i: usize| {
            if i.is_multiple_of(2) {
                "NoCore"
            } else {
                "Waiting"
            }
        };
        let name = |l: Lookup| match l {
            Lookup::Core(_) => "Core",
            Lookup::NoCore => "NoCore",
            Lookup::Waiting => "Waiting",
            Lookup::Revoked => "Revoked",
            Lookup::Unknown => "Unknown",
        };
        for round in 0..3 {
            for width in [2, 4, KEPT, comms.len()] {
                for (i, &c) in comms.iter().enumerate().take(width) {
                    assert_eq!(
                        name(lookup(c as ncclComm_t)),
                        expected(i),
                        "round {round}, {width} in turn, comm {i}"
                    );
                }
            }
        }
        let first = comms[0];
        std::thread::spawn(move || forget(first as ncclComm_t))
            .join()
            .unwrap();
        assert_eq!(
            name(lookup(first as ncclComm_t)),
            "Unknown",
            "changed elsewhere"
        );
        assert_eq!(name(lookup(comms[1] as ncclComm_t)), "Waiting");
        for &c in &comms {
            forget(c as ncclComm_t);
        }
    }

    #[test]
    fn a_thread_looks_up_while_its_thread_locals_go() {
        use std::sync::atomic::AtomicU8;
        const COMM: usize = 0x6300_0040;
        // Each guard looks COMM up as its thread ends, one before the kept answer goes and one
        // after, whichever order the thread-locals go in: 1 where it read NoCore.
        static SEEN: [AtomicU8; 2] = [AtomicU8::new(0), AtomicU8::new(0)];
        struct LooksUpAtExit(usize);
        impl Drop for LooksUpAtExit {
            fn drop(&mut self) {
                let no_core = matches!(lookup(COMM as ncclComm_t), Lookup::NoCore);
                SEEN[self.0].store(1 + no_core as u8, Ordering::Relaxed);
            }
        }
        thread_local! {
            static FIRST: LooksUpAtExit = const { LooksUpAtExit(0) };
            static LAST_ONE: LooksUpAtExit = const { LooksUpAtExit(1) };
        }
        made(COMM as ncclComm_t, true);
        std::thread::spawn(|| {
            FIRST.with(|_| ());
            assert!(matches!(lookup(COMM as ncclComm_t), Lookup::NoCore));
            LAST_ONE.with(|_| ());
        })
        .join()
        .unwrap();
        forget(COMM as ncclComm_t);
        assert_eq!(SEEN.each_ref().map(|s| s.load(Ordering::Relaxed)), [2, 2]);
    }

    #[test]
    fn many_wait_at_once() {
        let comms: Vec<ncclComm_t> = (1..=67)
            .map(|i| (0x10_0000 + 16 * i) as ncclComm_t)
            .collect();
        comms.iter().for_each(|&c| awaits_first_all_reduce(c));
        assert!(comms.iter().rev().all(|&c| first_all_reduce(c)));
        assert!(comms.iter().all(|&c| !first_all_reduce(c)));
        comms.iter().for_each(|&c| {
            forget(c);
        });
    }
}
