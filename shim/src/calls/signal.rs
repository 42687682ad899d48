//! `NCCLSHIM_DUMP_ON_SIGNAL=1`: SIGUSR1 writes the flight recorder of every communicator to the
//! log. The handler only writes a byte to a pipe (what a signal handler may do); a thread of
//! ours reads it and writes the log.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

unsafe extern "C" {
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn write(fd: c_int, buf: *const u8, count: usize) -> isize;
    fn read(fd: c_int, buf: *mut u8, count: usize) -> isize;
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
}
const SIGUSR1: c_int = 10;
const O_CLOEXEC: c_int = 0o2000000;
const O_NONBLOCK: c_int = 0o4000;
const SIG_ERR: usize = usize::MAX;

/// The pipe's write end (-1 before it exists).
static WAKE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigusr1(_: c_int) {
    let fd = WAKE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; a full pipe (dumps pending) drops the byte.
        unsafe { write(fd, b"!".as_ptr(), 1) };
    }
}

/// Installs the handler and starts the thread that dumps (once per process).
pub fn dump_on_sigusr1() {
    let mut fds = [0 as c_int; 2];
    // SAFETY: two ints for the pipe's ends.
    if unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) } != 0 {
        return;
    }
    let [read_end, write_end] = fds;
    // Only the write end never blocks: the handler must not.
    // SAFETY: F_SETFL on our own descriptor.
    unsafe { super::super::log::set_flags(write_end, O_NONBLOCK) };
    WAKE.store(write_end, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("ncclshim-dump".into())
        .spawn(move || {
            let mut byte = 0u8;
            // SAFETY: our pipe's read end, one byte into `byte`.
            while unsafe { read(read_end, &mut byte, 1) } == 1 {
                super::dump_all("SIGUSR1");
            }
        });
    if spawned.is_ok() {
        // SAFETY: a handler that only writes to a pipe.
        if unsafe { signal(SIGUSR1, on_sigusr1) } == SIG_ERR {
            crate::log::log_warn!("NCCLSHIM_DUMP_ON_SIGNAL: SIGUSR1's handler could not be set");
        } else {
            crate::log::log_info!(
                "NCCLSHIM_DUMP_ON_SIGNAL: SIGUSR1 writes every communicator's last calls to the log"
            );
        }
    }
}
