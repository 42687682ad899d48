//! `NCCLSHIM_TRACE=path` (`%h` host, `%p` process id, as in `NCCL_DEBUG_FILE`): one JSON line
//! per call of an operation, with the fields of NCCL Inspector's records where they mean the
//! same (`id`, `rank`, `n_ranks`, `coll`, `coll_sn`, `coll_msg_size_bytes`) and ours (`count`,
//! `dtype`, `red_op`, `root`, `path`, `algo`, `captured`, `result`, `ts_us`). A call only puts
//! its record into a fixed queue (no lock, no allocation); a thread of ours writes the file.
//! Where calls outrun the writer, the queue's overflow is dropped and counted in the last line.
//! With `NCCLSHIM_TRACE_TIMING=1`, a routed call outside a CUDA graph also carries the events
//! around its kernel: the writer waits for them and writes Inspector's `coll_exec_time_us`,
//! `coll_algobw_gbs` and `coll_busbw_gbs` (null for every other call).

use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::book::{Page, Recorded, StoredCall};
use super::{kind_name, op_name, settings, type_name};
use crate::core::types::Algorithm;
use crate::core::{Reading, Stopwatch};

/// Records the queue holds (a power of two).
const QUEUE: usize = 1 << 15;

/// One queued record; `stamp` is 1 + its position once written.
struct Slot {
    stamp: AtomicUsize,
    comm: AtomicUsize,
    identity: AtomicI64,
    seq: AtomicU64,
    call: StoredCall,
    /// Whether a stopwatch came with the call: its events and context in `watch`.
    timed: AtomicBool,
    watch: [AtomicU64; 3],
}

static SLOTS: [Slot; QUEUE] = [const {
    Slot {
        stamp: AtomicUsize::new(0),
        comm: AtomicUsize::new(0),
        identity: AtomicI64::new(0),
        seq: AtomicU64::new(0),
        call: StoredCall::new(),
        timed: AtomicBool::new(false),
        watch: [const { AtomicU64::new(0) }; 3],
    }
}; QUEUE];

/// Positions handed out to calls, and written out by the writer.
static HEAD: AtomicUsize = AtomicUsize::new(0);
static TAIL: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The writer thread runs (in this process).
static STARTED: AtomicBool = AtomicBool::new(false);
/// Asked to write what is left and stop; it says it did.
static FINISHING: AtomicBool = AtomicBool::new(false);
static FINISHED: AtomicBool = AtomicBool::new(false);
/// The process the writer was started in.
static WRITER_PID: AtomicI32 = AtomicI32::new(0);

/// Queues one call's record, with its stopwatch if it was timed (the events are then the
/// trace's to destroy); starts the writer at the first. False where the queue was full.
pub fn push(page: &Page, seq: u64, call: &Recorded, watch: Option<Stopwatch>) -> bool {
    if !STARTED.load(Ordering::Acquire) && !STARTED.swap(true, Ordering::AcqRel) {
        start_writer();
    }
    let mut head = HEAD.load(Ordering::Relaxed);
    loop {
        if head.wrapping_sub(TAIL.load(Ordering::Acquire)) >= QUEUE {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match HEAD.compare_exchange_weak(head, head + 1, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => head = now,
        }
    }
    let slot = &SLOTS[head % QUEUE];
    let (rank, nranks, _) = page.identity();
    slot.comm.store(page.comm(), Ordering::Relaxed);
    slot.identity.store(
        (rank as i64) << 32 | (nranks as u32 as i64),
        Ordering::Relaxed,
    );
    slot.seq.store(seq, Ordering::Relaxed);
    if let Some(watch) = watch {
        let fields = slot.watch.iter();
        for (field, value) in fields.zip([watch.start, watch.end, watch.context]) {
            field.store(value, Ordering::Relaxed);
        }
    }
    slot.timed.store(watch.is_some(), Ordering::Relaxed);
    slot.call.store(call);
    slot.stamp.store(head + 1, Ordering::Release);
    true
}

/// In a forked child: no writer runs there; its calls start one of its own (its own file, by
/// `%p`), and what its parent had queued is the parent's to write.
extern "C" fn after_fork_in_child() {
    TAIL.store(HEAD.load(Ordering::Relaxed), Ordering::Relaxed);
    for flag in [&STARTED, &FINISHING, &FINISHED] {
        flag.store(false, Ordering::Relaxed);
    }
    WRITER_PID.store(0, Ordering::Relaxed);
}

fn start_writer() {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| super::in_forked_children(after_fork_in_child));
    let Some(pattern) = settings().trace.as_deref() else {
        return;
    };
    let pid = std::process::id();
    let path = crate::log::debug_file_name(pattern, &crate::log::host_name(), pid);
    let file = match std::fs::File::create(&path) {
        Ok(file) => file,
        Err(e) => {
            crate::log::log_warn!("NCCLSHIM_TRACE: cannot write {path}: {e}; no trace");
            return;
        }
    };
    crate::log::log_info!("NCCLSHIM_TRACE: writing every operation's calls to {path}");
    let spawned = std::thread::Builder::new()
        .name("ncclshim-trace".into())
        .spawn(move || write_until_finished(std::io::BufWriter::new(file)));
    match spawned {
        Ok(_) => {
            WRITER_PID.store(pid as i32, Ordering::Release);
            finish_before_cuda_goes();
        }
        Err(_) => crate::log::log_warn!("NCCLSHIM_TRACE: no thread to write {path}; no trace"),
    }
}

unsafe extern "C" {
    fn __cxa_atexit(
        hook: extern "C" fn(*mut std::ffi::c_void),
        argument: *mut std::ffi::c_void,
        library: *mut std::ffi::c_void,
    ) -> i32;
    /// This library's handle for `__cxa_atexit` (from the C runtime's start files).
    static __dso_handle: u8;
}

/// Has `finish` run at exit before CUDA tears itself down. The exit hook of `calls` is registered
/// when the library loads, so it runs after the driver's own teardown (exit runs hooks last
/// registered first, and library destructors after them): the events of the last timed calls
/// could no longer be read there. Registered now, after CUDA started, this one runs before.
fn finish_before_cuda_goes() {
    extern "C" fn at_exit(_: *mut std::ffi::c_void) {
        let _ = std::panic::catch_unwind(finish);
    }
    // SAFETY: a hook of this library, scoped to it (dropped if the library is unloaded).
    unsafe {
        __cxa_atexit(
            at_exit,
            std::ptr::null_mut(),
            (&raw const __dso_handle).cast_mut().cast(),
        )
    };
}

fn write_until_finished(mut out: std::io::BufWriter<std::fs::File>) {
    let mut line = String::new();
    loop {
        let finishing = FINISHING.load(Ordering::Acquire);
        let mut wrote = false;
        while let Some(record) = next_record() {
            line.clear();
            json_line(&mut line, &record);
            let _ = out.write_all(line.as_bytes());
            wrote = true;
        }
        if wrote {
            let _ = out.flush();
        }
        if finishing {
            let dropped = DROPPED.load(Ordering::Relaxed);
            if dropped > 0 {
                let _ = writeln!(out, "{{\"dropped\":{dropped}}}");
            }
            let _ = out.flush();
            FINISHED.store(true, Ordering::Release);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The record at the tail, once its call has written it all.
fn next_record() -> Option<Queued> {
    let tail = TAIL.load(Ordering::Relaxed);
    if tail == HEAD.load(Ordering::Acquire) {
        return None;
    }
    let slot = &SLOTS[tail % QUEUE];
    if slot.stamp.load(Ordering::Acquire) != tail + 1 {
        return None; // handed out, still being written
    }
    // A timed call waits for its kernel: it and every later record (in order) are written then.
    let exec_us = if slot.timed.load(Ordering::Relaxed) {
        let [start, end, context] = slot.watch.each_ref().map(|f| f.load(Ordering::Relaxed));
        match (Stopwatch {
            start,
            end,
            context,
        })
        .read()
        {
            Reading::NotYet => return None,
            Reading::Done(us) => us,
        }
    } else {
        None
    };
    let identity = slot.identity.load(Ordering::Relaxed);
    let record = Queued {
        comm: slot.comm.load(Ordering::Relaxed),
        rank: (identity >> 32) as i32,
        nranks: identity as i32,
        seq: slot.seq.load(Ordering::Relaxed),
        call: slot.call.load(),
        exec_us,
    };
    TAIL.store(tail + 1, Ordering::Release);
    Some(record)
}

struct Queued {
    comm: usize,
    rank: i32,
    nranks: i32,
    seq: u64,
    call: Recorded,
    /// The GPU time of a timed call's kernel.
    exec_us: Option<f64>,
}

/// NCCL's bus bandwidth factor for an operation on `nranks` ranks (nccl-tests' PERFORMANCE.md):
/// what each rank's links carry per byte of the operation.
fn bus_factor(kind: &str, nranks: i32) -> f64 {
    let n = nranks.max(1) as f64;
    match kind {
        "AllReduce" => 2.0 * (n - 1.0) / n,
        "AllGather" | "ReduceScatter" | "AlltoAll" => (n - 1.0) / n,
        _ => 1.0,
    }
}

fn json_line(line: &mut String, r: &Queued) {
    let c = &r.call;
    let algorithm = Algorithm::ALL.get((c.way as usize).wrapping_sub(1));
    // Bytes per microsecond are thousands of bytes per second: GB/s is that over 1000.
    let timing = match r.exec_us {
        Some(us) if us > 0.0 => {
            let algbw = c.bytes as f64 / us / 1e3;
            let busbw = algbw * bus_factor(kind_name(c.kind), r.nranks);
            format!("{us:.2},\"coll_algobw_gbs\":{algbw:.3},\"coll_busbw_gbs\":{busbw:.3}")
        }
        _ => "null,\"coll_algobw_gbs\":null,\"coll_busbw_gbs\":null".into(),
    };
    let _ = writeln!(
        line,
        "{{\"id\":\"{:#x}\",\"rank\":{},\"n_ranks\":{},\"coll\":\"{}\",\"coll_sn\":{},\"coll_msg_size_bytes\":{},\"count\":{},\"dtype\":\"{}\",\"red_op\":\"{}\",\"root\":{},\"path\":\"{}\",\"algo\":{},\"captured\":{},\"result\":{},\"ts_us\":{},\"coll_exec_time_us\":{}}}",
        r.comm,
        r.rank,
        r.nranks,
        kind_name(c.kind),
        r.seq,
        c.bytes,
        c.count,
        type_name(c.datatype),
        op_name(c.op),
        c.root,
        if algorithm.is_some() {
            "routed"
        } else {
            "forwarded"
        },
        algorithm.map_or("null".into(), |a| format!("\"{}\"", a.name())),
        match c.captured {
            1 => "false",
            2 => "true",
            _ => "null",
        },
        c.result,
        c.at_us,
        timing
    );
}

/// At exit: the writer writes what is queued and stops (a second at most).
pub fn finish() {
    if WRITER_PID.load(Ordering::Acquire) as u32 != std::process::id() {
        return;
    }
    FINISHING.store(true, Ordering::Release);
    let start = Instant::now();
    while !FINISHED.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_line_is_one_json_object() {
        let mut line = String::new();
        let record = Queued {
            comm: 0xabc0,
            rank: 1,
            nranks: 2,
            seq: 7,
            call: Recorded {
                kind: 0,
                way: 1 + Algorithm::Direct as u8,
                result: 0,
                captured: 2,
                count: 256,
                bytes: 1024,
                datatype: 7,
                op: 0,
                root: -1,
                at_us: 1_700_000_000_000_000,
            },
            exec_us: None,
        };
        json_line(&mut line, &record);
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
        for field in [
            "\"id\":\"0xabc0\"",
            "\"rank\":1,\"n_ranks\":2",
            "\"coll_sn\":7",
            "\"coll_msg_size_bytes\":1024",
            "\"dtype\":\"float\"",
            "\"red_op\":\"sum\"",
            "\"path\":\"routed\",\"algo\":\"direct\",\"captured\":true",
            "\"coll_exec_time_us\":null,\"coll_algobw_gbs\":null,\"coll_busbw_gbs\":null}",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
        // Timed: 1024 bytes in 2 us are 0.512 GB/s; on 2 ranks an all-reduce's bus carries as much.
        let timed = Queued {
            exec_us: Some(2.0),
            ..record
        };
        line.clear();
        json_line(&mut line, &timed);
        let gbs = "\"coll_exec_time_us\":2.00,\"coll_algobw_gbs\":0.512,\"coll_busbw_gbs\"";
        assert!(line.contains(gbs), "{line}");
        assert_eq!(bus_factor("AllReduce", 4), 1.5);
        assert_eq!(bus_factor("AllGather", 4), 0.75);
    }
}
