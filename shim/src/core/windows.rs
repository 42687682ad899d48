//! The symmetric windows registered on each communicator (ncclCommWindowRegister with
//! NCCL_WIN_COLL_SYMMETRIC). Where a call's buffers lie in one, NCCL runs its symmetric kernels,
//! faster than its plain ones at some sizes, so the core takes such a call only within the
//! limits measured against them (`Buffers::InWindows`, measured.rs). NCCL asks so per call,
//! from the rank's own windows (the one holding a buffer's first byte), and requires a call's
//! buffers to be in windows on every rank or on none (its argument check compares them across
//! ranks): so the answer is the same on every rank, as the routing needs.
//!
//! A window is known by its handle, which NCCL writes where the registration is done: before the
//! call returns outside a group on a blocking communicator; at the group's end inside one
//! (group.rs reads it there). A nonblocking communicator's registrations end later, on a thread
//! of NCCL's, where the program's slot for the handle may no longer be: such a window (and one
//! of a communicator the shim never saw made) is known by its bytes alone, from its
//! registration on (a program waits for it to end before its next call of the communicator).
//! A deregistration of a handle the shim never read may be of any of them: from then on every
//! call of that communicator takes the limits of any buffers (`EVERYWHERE`), at the same call
//! on every rank, as deregistrations of windows are collective. NULL names no window (NCCL
//! does nothing for it, on any rank it likes): its deregistration changes nothing. (A
//! communicator blocking on some ranks and not on others takes them for every call: set-up.)
//!
//! A call reads its thread's copy of the windows, taken again only after a window came or went
//! (`CHANGES`): no lock on the per-call path, forwarded calls included.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::measured::Buffers;
use crate::ffi::ncclComm_t;

/// One registered window: its communicator, handle (None: written by NCCL after the shim
/// looked, a nonblocking communicator's) and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    comm: usize,
    handle: Option<usize>,
    begin: usize,
    end: usize,
}

/// The bytes of a window that holds every buffer.
const EVERYWHERE: (usize, usize) = (1, usize::MAX);

static WINDOWS: RwLock<Vec<Window>> = RwLock::new(Vec::new());
/// How many windows WINDOWS holds: while none, a call asks nothing of it (no lock).
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Changes of WINDOWS so far, counted under its lock: a thread's copy holds while this count is
/// the one it was taken at.
static CHANGES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's copy of WINDOWS and `CHANGES` when it was taken (`u64::MAX`: none yet).
    static COPY: RefCell<(u64, Vec<Window>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

/// `NCCL_WIN_COLL_SYMMETRIC`, the flag of windows NCCL's symmetric kernels run on (nccl.h; the
/// same value in every version that has windows).
pub const SYMMETRIC: i32 = 1;

fn with_windows<T>(f: impl FnOnce(&mut Vec<Window>) -> T) -> T {
    let mut windows = WINDOWS.write().unwrap_or_else(|e| e.into_inner());
    let result = f(&mut windows);
    COUNT.store(windows.len(), Ordering::Relaxed);
    // Counted while the lock is held: whoever reads the new count finds the change made.
    CHANGES.fetch_add(1, Ordering::Release);
    result
}

/// NCCL registered `size` bytes from `begin` on `comm` as a window of `flags`, with `handle`
/// (NULL: not registered, as where the communicator has no symmetric support).
pub fn registered(comm: ncclComm_t, handle: usize, begin: usize, size: usize, flags: i32) {
    if handle == 0 || flags & SYMMETRIC == 0 || size == 0 {
        return;
    }
    let window = Window {
        comm: comm as usize,
        handle: Some(handle),
        begin,
        end: begin.saturating_add(size),
    };
    with_windows(|windows| {
        windows.retain(|w| !(w.comm == window.comm && w.handle == Some(handle)));
        windows.push(window);
    });
}

/// NCCL took a registration of `size` bytes from `begin` on `comm` as a window of `flags`,
/// and writes its handle later (a nonblocking communicator's, or one the shim never saw made):
/// the window is known by its bytes.
pub fn registering(comm: ncclComm_t, begin: usize, size: usize, flags: i32) {
    if flags & SYMMETRIC == 0 || size == 0 {
        return;
    }
    let window = Window {
        comm: comm as usize,
        handle: None,
        begin,
        end: begin.saturating_add(size),
    };
    with_windows(|windows| {
        // Every buffer of the communicator counts as in a window already.
        if !windows
            .iter()
            .any(|w| w.comm == window.comm && is_everywhere(w))
        {
            windows.push(window);
        }
    });
}

fn is_everywhere(w: &Window) -> bool {
    (w.begin, w.end) == EVERYWHERE
}

/// NCCL deregistered the window `handle` of `comm`. Where no window of `comm` has that handle
/// and one's is unknown (`registering`), it may be that one: every buffer of `comm` counts as
/// in a window from then on. NULL (no window) changes nothing.
pub fn deregistered(comm: ncclComm_t, handle: usize) {
    if handle == 0 || COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let comm = comm as usize;
    with_windows(|windows| {
        let known = |w: &Window| w.comm == comm && w.handle == Some(handle);
        if windows.iter().any(known) {
            windows.retain(|w| !known(w));
        } else if windows.iter().any(|w| w.comm == comm && w.handle.is_none()) {
            windows.retain(|w| w.comm != comm);
            windows.push(Window {
                comm,
                handle: None,
                begin: EVERYWHERE.0,
                end: EVERYWHERE.1,
            });
        }
    });
}

/// `comm` is gone (destroyed, aborted, revoked): its windows with it.
pub fn forget(comm: ncclComm_t) {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    with_windows(|windows| windows.retain(|w| w.comm != comm as usize));
}

/// Where a call of `comm` with these buffers lies: in windows where either buffer starts in a
/// symmetric window of `comm` (NCCL's symmetric kernels take calls of one buffer in a window too).
pub fn buffers_of(comm: ncclComm_t, send: *const c_void, recv: *const c_void) -> Buffers {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return Buffers::Plain;
    }
    let changes = CHANGES.load(Ordering::Acquire);
    // `try_with`: a call from a thread whose thread-locals are gone (its exit) reads WINDOWS.
    let copied = COPY.try_with(|copy| {
        let mut copy = copy.borrow_mut();
        if copy.0 != changes {
            let windows = WINDOWS.read().unwrap_or_else(|e| e.into_inner());
            copy.1.clone_from(&windows);
            // Read under the lock, which no change holds now: the count of what was copied.
            copy.0 = CHANGES.load(Ordering::Acquire);
        }
        lies_in(&copy.1, comm, send, recv)
    });
    copied.unwrap_or_else(|_| {
        lies_in(
            &WINDOWS.read().unwrap_or_else(|e| e.into_inner()),
            comm,
            send,
            recv,
        )
    })
}

/// Where a call of `comm` with these buffers lies among `windows`.
fn lies_in(
    windows: &[Window],
    comm: ncclComm_t,
    send: *const c_void,
    recv: *const c_void,
) -> Buffers {
    let inside = |p: *const c_void| {
        let p = p as usize;
        p != 0
            && windows
                .iter()
                .any(|w| w.comm == comm as usize && (w.begin..w.end).contains(&p))
    };
    match inside(send) || inside(recv) {
        true => Buffers::InWindows,
        false => Buffers::Plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(n: usize) -> ncclComm_t {
        n as ncclComm_t
    }

    #[test]
    fn a_call_lies_in_windows_while_its_buffers_are_in_a_symmetric_one_of_its_communicator() {
        let (a, b) = (comm(0x1000_0010), comm(0x1000_0020));
        let p = |n: usize| n as *const c_void;
        assert_eq!(buffers_of(a, p(0x5000), p(0x9000)), Buffers::Plain);
        registered(a, 0xaa, 0x5000, 0x1000, SYMMETRIC);
        registered(a, 0xbb, 0x20000, 0x1000, 0);
        registered(a, 0, 0x30000, 0x1000, SYMMETRIC);
        let cases = [
            (a, 0x5000, 0x9000, Buffers::InWindows, "send in a window"),
            (a, 0x100, 0x5fff, Buffers::InWindows, "recv only"),
            (a, 0x6000, 0x4fff, Buffers::Plain, "past the end"),
            (a, 0x20000, 0x20000, Buffers::Plain, "not symmetric"),
            (a, 0x30000, 0, Buffers::Plain, "NCCL gave no handle"),
            (b, 0x5000, 0x5000, Buffers::Plain, "another comm's"),
        ];
        for (comm, send, recv, lies, why) in cases {
            assert_eq!(buffers_of(comm, p(send), p(recv)), lies, "{why}");
        }
        registered(b, 0xaa, 0x7000, 0x100, SYMMETRIC);
        deregistered(a, 0xaa);
        assert_eq!(buffers_of(a, p(0x5000), p(0x5000)), Buffers::Plain);
        assert_eq!(buffers_of(b, p(0x7000), p(0)), Buffers::InWindows);
        forget(b);
        assert_eq!(buffers_of(b, p(0x7000), p(0)), Buffers::Plain);
    }

    #[test]
    fn a_nonblocking_communicators_window_counts_by_its_bytes_until_a_handle_is_unknown() {
        let (a, b) = (comm(0x1000_0040), comm(0x1000_0050));
        let p = |n: usize| n as *const c_void;
        registering(a, 0x6000, 0x1000, SYMMETRIC);
        registering(a, 0x8000, 0x1000, 0);
        registering(b, 0x6000, 0x1000, SYMMETRIC);
        assert_eq!(buffers_of(a, p(0x6800), p(0)), Buffers::InWindows);
        assert_eq!(
            buffers_of(a, p(0x7000), p(0x8000)),
            Buffers::Plain,
            "not symmetric"
        );
        // NULL names no window (a rank may deregister it alone): nothing changes.
        deregistered(a, 0);
        assert_eq!(buffers_of(a, p(0x7000), p(0x8000)), Buffers::Plain, "NULL");
        // A window whose handle was read (a blocking registration's): it goes alone.
        registered(a, 0xee, 0xa000, 0x1000, SYMMETRIC);
        deregistered(a, 0xee);
        assert_eq!(buffers_of(a, p(0xa000), p(0)), Buffers::Plain);
        assert_eq!(buffers_of(a, p(0x6000), p(0)), Buffers::InWindows);
        // A handle the shim never read: any of a's windows may be gone, so all of a's buffers
        // count as in one; b's are untouched.
        deregistered(a, 0xff);
        assert_eq!(buffers_of(a, p(0x7000), p(0x9000)), Buffers::InWindows);
        assert_eq!(buffers_of(a, p(0x1), p(0)), Buffers::InWindows);
        // Later registrations add nothing to a communicator all in windows.
        registering(a, 0xc000, 0x1000, SYMMETRIC);
        assert_eq!(
            WINDOWS
                .read()
                .unwrap()
                .iter()
                .filter(|w| w.comm == a as usize)
                .count(),
            1
        );
        assert_eq!(buffers_of(b, p(0x7000), p(0)), Buffers::Plain);
        assert_eq!(buffers_of(b, p(0x6000), p(0)), Buffers::InWindows);
        forget(a);
        forget(b);
        assert_eq!(buffers_of(a, p(0x7000), p(0)), Buffers::Plain);
        assert_eq!(buffers_of(b, p(0x6000), p(0)), Buffers::Plain);
    }

    #[test]
    fn a_thread_sees_windows_another_thread_registered_or_deregistered_since_its_last_call() {
        let a = comm(0x1000_0030);
        let p = |n: usize| n as *const c_void;
        let on_another_thread = |f: fn()| std::thread::spawn(f).join().unwrap();
        registered(a, 0xcc, 0x40000, 0x1000, SYMMETRIC);
        // This thread's copy is taken here, with the window of 0x40000 only.
        assert_eq!(buffers_of(a, p(0x40000), p(0)), Buffers::InWindows);
        assert_eq!(buffers_of(a, p(0x50000), p(0)), Buffers::Plain);
        on_another_thread(|| registered(comm(0x1000_0030), 0xdd, 0x50000, 0x1000, SYMMETRIC));
        assert_eq!(
            buffers_of(a, p(0x50000), p(0)),
            Buffers::InWindows,
            "registered since"
        );
        on_another_thread(|| deregistered(comm(0x1000_0030), 0xcc));
        assert_eq!(
            buffers_of(a, p(0x40000), p(0)),
            Buffers::Plain,
            "deregistered since"
        );
        on_another_thread(|| forget(comm(0x1000_0030)));
        assert_eq!(
            buffers_of(a, p(0x50000), p(0)),
            Buffers::Plain,
            "its communicator gone"
        );
    }
}
