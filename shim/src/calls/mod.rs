//! What the shim did with each call of an operation (collective, send, receive): counted per
//! communicator for the exit summary, kept in the flight recorder (the last calls of every
//! communicator, written to the log when a wait of the core gives up or on SIGUSR1), and
//! written to the trace (`NCCLSHIM_TRACE`). The generated exports describe every outermost
//! call once it returns (`operation_done`); the core marks the calls it ran (`ran_on_core`).

mod book;
mod signal;
mod summary;
mod trace;

use std::cell::Cell;
use std::sync::OnceLock;

use crate::call::Call;
use crate::core::policy::switch;
use crate::core::types::{Algorithm, DataType, Op};
use crate::core::{Observer, Stopwatch};
use crate::ffi::OPERATIONS;
use crate::ffi::{ncclComm_t, ncclInProgress, ncclResult_t, ncclSuccess};
use crate::log::{Level, log_warn};
use crate::real;

pub use book::Recorded;

/// What the settings ask for, read once.
struct Settings {
    summary: bool,
    trace: Option<String>,
    /// `NCCLSHIM_TRACE_TIMING=1` with the trace: the GPU time of routed calls.
    timing: bool,
}

fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        // Given, and not a no (policy::switch): a switch that is on, or the trace's file.
        let set = |name: &str| crate::nccl_env::get(name).filter(|v| switch(v) == Some(true));
        if set("NCCLSHIM_DUMP_ON_SIGNAL").is_some() {
            signal::dump_on_sigusr1();
        }
        let trace = set("NCCLSHIM_TRACE");
        Settings {
            summary: set("NCCLSHIM_SUMMARY").is_some() || crate::log::enabled(Level::Info),
            timing: trace.is_some() && set("NCCLSHIM_TRACE_TIMING").is_some(),
            trace,
        }
    })
}

/// The record of calls as the core sees it (core/observer.rs).
struct CallBook;

impl Observer for CallBook {
    fn wants_capture_state(&self) -> bool {
        wants_capture_state()
    }
    fn wants_timing(&self) -> bool {
        settings().timing
    }
    fn ran_on_core(&self, algorithm: Algorithm, captured: Option<bool>) {
        let captured = captured.map_or(0, |c| 1 + c as u16);
        let on_core = (1 + algorithm as u16) | (captured << 8);
        OUTCOME.with(|o| o.set(Outcome { on_core, ..o.get() }));
    }
    fn timed(&self, watch: Stopwatch) {
        OUTCOME.with(|o| {
            o.set(Outcome {
                watch: Some(watch),
                ..o.get()
            })
        });
    }
    fn shared_launch(&self, comm: ncclComm_t, calls: usize) {
        if let Some(page) = book::find(comm as usize) {
            page.shared_launch(calls as u64);
        }
    }
    fn sent_with_group(&self, comm: ncclComm_t) {
        if let Some(page) = book::find(comm as usize) {
            page.sent_with_group();
        }
    }
    fn core_decided(&self, comm: ncclComm_t, on: bool, rank: i32, nranks: i32, device: i32) {
        if let Some(page) = book::find_or_claim(comm as usize, |page| {
            page.set_identity(rank, nranks, device)
        }) {
            book::set_core(page, on);
        }
    }
    fn dump(&self, comm: ncclComm_t, why: &str) {
        dump(comm, why);
    }
}

/// Hands the core the call book when the library loads: a pointer stored, nothing loaded.
#[ctor::ctor]
fn observe_the_core() {
    crate::core::set_observer(&CallBook);
}

/// How this thread's current call went, as the core marks it.
#[derive(Clone, Copy, Default)]
struct Outcome {
    /// 0 not on the core (forwarded), else 1 + algorithm | captured << 8 (1 not captured, 2
    /// captured).
    on_core: u16,
    /// The events around its kernel (NCCLSHIM_TRACE_TIMING).
    watch: Option<Stopwatch>,
}

thread_local! {
    /// One thread-local, read once a call: each costs a look-up in a shared library.
    static OUTCOME: Cell<Outcome> = const {
        Cell::new(Outcome {
            on_core: 0,
            watch: None,
        })
    };
}

/// Whether calls should say if they are captured: only where the trace is written.
fn wants_capture_state() -> bool {
    settings().trace.is_some()
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, time: *mut [i64; 2]) -> i32;
}
const CLOCK_REALTIME: i32 = 0;
/// The time of the last timer tick (a few milliseconds' resolution, a fraction of the cost).
const CLOCK_REALTIME_COARSE: i32 = 5;

/// Microseconds since the epoch: precise where the trace is written, coarse otherwise (the
/// flight recorder's order comes from its sequence numbers).
fn now_us() -> u64 {
    let clock = if settings().trace.is_some() {
        CLOCK_REALTIME
    } else {
        CLOCK_REALTIME_COARSE
    };
    let mut time = [0i64; 2];
    // SAFETY: a clock Linux has; two longs for the answer.
    if unsafe { clock_gettime(clock, &mut time) } != 0 {
        return 0;
    }
    time[0] as u64 * 1_000_000 + time[1] as u64 / 1000
}

/// Element size of NCCL's `datatype` (0 for one it does not have).
fn element_bytes(datatype: i64) -> u64 {
    u32::try_from(datatype)
        .ok()
        .and_then(DataType::from_nccl)
        .map_or(0, |t| t.size() as u64)
}

/// Records an outermost call of an operation once it has returned `result`.
pub fn operation_done(call: &Call, result: ncclResult_t) {
    let Outcome { on_core, watch } = OUTCOME.with(Cell::take);
    let traced = record(call, result, on_core, watch);
    if let (Some(watch), false) = (watch, traced) {
        watch.discard();
    }
}

/// Records the call; whether the trace took it (and `watch`, whose events are then its own).
fn record(call: &Call, result: ncclResult_t, on_core: u16, watch: Option<Stopwatch>) -> bool {
    let comm = call.comm as usize;
    if comm == 0 {
        return false;
    }
    // A communicator new to the book joins it only with a call NCCL took: a handle it refused
    // may be no communicator at all, not to be asked about.
    let taken = result == ncclSuccess || result == ncclInProgress;
    let page = if taken {
        book::find_or_claim(comm, |page| ask_identity(page, comm))
    } else {
        book::find(comm)
    };
    let Some(page) = page else {
        return false;
    };
    let recorded = Recorded {
        kind: call.kind,
        way: on_core as u8,
        result,
        captured: (on_core >> 8) as u8,
        count: call.count as u64,
        bytes: (call.count as u64).saturating_mul(element_bytes(call.datatype.into())),
        datatype: call.datatype.into(),
        op: call.op.map_or(-1, i64::from),
        root: call.root.map_or(-1, i64::from),
        at_us: now_us(),
    };
    let seq = page.record(&recorded);
    settings().trace.is_some() && trace::push(page, seq, &recorded, watch)
}

/// Rank, ranks and GPU of a communicator new to the book, as the real NCCL tells them.
fn ask_identity(page: &book::Page, comm: usize) {
    let comm = comm as ncclComm_t;
    let (mut rank, mut nranks, mut device) = (-1, -1, -1);
    // SAFETY: a handle the program just used in a call the real NCCL took; the ints are written
    // only where it answers.
    unsafe {
        let ok = |r: ncclResult_t| r == ncclSuccess;
        if !(ok(real::ncclCommUserRank(comm, &mut rank))
            && ok(real::ncclCommCount(comm, &mut nranks))
            && ok(real::ncclCommCuDevice(comm, &mut device)))
        {
            (rank, nranks, device) = (-1, -1, -1);
        }
    }
    page.set_identity(rank, nranks, device);
}

/// `comm` was destroyed or aborted: its page stays for the summary.
pub fn comm_destroyed(comm: ncclComm_t) {
    book::destroyed(comm as usize);
}

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> i32;
}

/// Runs `handler` in every child this process forks from now on, in the child's one thread,
/// before fork returns there: it may only store to atomics.
fn in_forked_children(handler: extern "C" fn()) {
    // SAFETY: registers a handler that stores to atomics, nothing else.
    unsafe { pthread_atfork(None, None, Some(handler)) };
}

/// The name of an operation kind.
fn kind_name(kind: u8) -> &'static str {
    OPERATIONS
        .get(kind as usize)
        .map_or("?", |name| name.strip_prefix("nccl").unwrap_or(name))
}

/// How a call went, in words: "forwarded" or "core <algorithm>".
fn way_name(way: u8) -> String {
    match Algorithm::ALL.get((way as usize).wrapping_sub(1)) {
        Some(algorithm) => format!("core {}", algorithm.name()),
        None => "forwarded".into(),
    }
}

fn type_name(datatype: i64) -> String {
    const NAMES: [&str; 12] = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16", "fp8e4m3", "fp8e5m2",
    ];
    usize::try_from(datatype)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("type {datatype}"), |n| n.to_string())
}

fn op_name(op: i64) -> String {
    match u32::try_from(op).ok().and_then(Op::from_nccl) {
        Some(op) => op.name().to_string(),
        None if op < 0 => "-".into(),
        None => format!("op {op}"),
    }
}

/// Bytes, readably: "512 B", "64 KiB", "1.5 MiB".
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The flight recorder's calls of `comm`, to the log at WARN: what a user needs to see which
/// rank stopped where.
pub fn dump(comm: ncclComm_t, why: &str) {
    if let Some(page) = book::find(comm as usize) {
        dump_page(page, why);
    }
}

/// Every communicator's last calls, to the log at WARN.
pub fn dump_all(why: &str) {
    for page in book::pages() {
        dump_page(page, why);
    }
}

fn dump_page(page: &book::Page, why: &str) {
    let (rank, nranks, device) = page.identity();
    let calls = page.last_calls();
    log_warn!(
        "flight recorder ({why}): comm {:#x} rank {rank}/{nranks} on GPU {device}{}: {} calls made, the last {} follow",
        page.comm(),
        if page.destroyed() { " (destroyed)" } else { "" },
        page.calls_recorded(),
        calls.len()
    );
    for (seq, call) in calls {
        log_warn!(
            "flight recorder: comm {:#x} rank {rank} #{seq} {} {} ({} x {}) op {} root {} {} result {} at {}.{:06}",
            page.comm(),
            kind_name(call.kind),
            bytes_text(call.bytes),
            call.count,
            type_name(call.datatype),
            op_name(call.op),
            call.root,
            way_name(call.way),
            call.result,
            call.at_us / 1_000_000,
            call.at_us % 1_000_000
        );
    }
}

/// At exit: the summary (`NCCLSHIM_SUMMARY=1` or `NCCL_DEBUG=INFO`) and the rest of the trace.
/// Registered with `ctor`: runs in every process that loaded us, so it does nothing where no
/// call was recorded, and nothing that could block for long.
#[ctor::dtor]
fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if book::pages().next().is_none() {
            return;
        }
        trace::finish();
        if settings().summary {
            summary::write();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_read_as_people_write_them() {
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(64 << 10), "64 KiB");
        assert_eq!(bytes_text(3 << 19), "1.5 MiB");
        assert_eq!(type_name(9), "bfloat16");
        assert_eq!(type_name(42), "type 42");
        assert_eq!(op_name(-1), "-");
        assert_eq!(op_name(4), "avg");
        assert_eq!(op_name(1234), "op 1234");
        assert_eq!(way_name(0), "forwarded");
        assert_eq!(way_name(1 + Algorithm::Sentinel as u8), "core sentinel");
        let all_reduce = OPERATIONS
            .iter()
            .position(|n| *n == "ncclAllReduce")
            .unwrap();
        assert_eq!(kind_name(all_reduce as u8), "AllReduce");
    }

    #[test]
    fn the_core_marks_only_the_call_it_ran() {
        let comm = 0x5300_0000;
        // Known already, so that nothing asks the real NCCL about this made-up handle.
        book::find_or_claim(comm, |_| ());
        let call = |kind| Call {
            kind,
            comm: comm as crate::ffi::ncclComm_t,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count: 1 << 10,
            datatype: 7,
            op: Some(0),
            root: None,
            stream: std::ptr::null_mut(),
        };
        CallBook.ran_on_core(Algorithm::OneShot, Some(true));
        operation_done(&call(0), 0);
        operation_done(&call(1), 0);
        let page = book::find(comm).unwrap();
        let last = page.last_calls();
        assert_eq!(last.len(), 2);
        assert_eq!(
            (last[0].1.way, last[0].1.captured),
            (1 + Algorithm::OneShot as u8, 2)
        );
        assert_eq!((last[1].1.way, last[1].1.captured), (0, 0));
        assert_eq!(last[0].1.bytes, 4 << 10, "float: 4 bytes an element");
    }
}
