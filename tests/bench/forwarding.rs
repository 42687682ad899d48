//! Microbenchmark: the cost of one forwarded call. Calls `ncclGetErrorString` and
//! `ncclGetVersion` through ncclshim and directly into the real NCCL 2.27.7, in one process,
//! interleaved, and prints the time per call of each and the difference (the shim's overhead).
//! Then the same for operations (`ncclAllGather`, `ncclAllReduce` on a made-up communicator),
//! which the shim also records (counts and flight recorder), with a stand-in for the real NCCL
//! whose operations return at once (tests/c/fake_operations_nccl.c): once without and once with
//! the trace (`NCCLSHIM_TRACE`), each in a process of its own; and a group of a send and a
//! receive (`ncclGroupStart`, `ncclSend`, `ncclRecv`, `ncclGroupEnd`), as PyTorch issues its
//! point-to-point calls; and, untraced, groups of eight all-gathers and of eight all-reduces of
//! no element on a made-up communicator (forwarded), and of eight all-gathers of no element on
//! one made through the shim (which answers them); and nccl-tests' gather of no element with two
//! GPUs a process (groups of four groups of communicator queries).
//!   make microbench

use std::ffi::{c_char, c_int, c_void};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use ncclshim_tests::{calls_client_and_fake_nccl, real_library, scratch, shim_library};

const ROUNDS: usize = 9;

/// Calls per round: 20 million under `cargo bench` (`make microbench`, which passes `--bench`);
/// under `cargo test` (`make test`) 100,000, which checks that the benchmark runs in a fraction
/// of the time and disk (the full run's trace is about 3 GB).
static CALLS: AtomicU32 = AtomicU32::new(100_000);

/// `CALLS` now.
fn calls_per_round() -> u32 {
    CALLS.load(Ordering::Relaxed)
}

type GetErrorString = unsafe extern "C" fn(u32) -> *const c_char;
type Group = unsafe extern "C" fn() -> u32;
type Send = unsafe extern "C" fn(*const c_void, usize, u32, c_int, *mut c_void, *mut c_void) -> u32;
type Recv = unsafe extern "C" fn(*mut c_void, usize, u32, c_int, *mut c_void, *mut c_void) -> u32;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> u32;
/// `ncclCommCount` and `ncclCommUserRank`.
type CommQuery = unsafe extern "C" fn(*mut c_void, *mut c_int) -> u32;
type InitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> u32;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, u32, *mut c_void, *mut c_void) -> u32;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    u32,
    u32,
    *mut c_void,
    *mut c_void,
) -> u32;

/// NCCL's `ncclUniqueId`, passed by value as C passes the struct.
#[repr(C)]
struct UniqueId {
    internal: [u8; 128],
}

fn open(path: &std::path::Path) -> Library {
    // SAFETY: NCCL and ncclshim are ordinary shared libraries without load-time requirements.
    unsafe { Library::open(Some(path.to_str().unwrap()), RTLD_NOW | RTLD_LOCAL) }.unwrap()
}

/// Median nanoseconds per call of `call` over the rounds.
fn per_call(mut call: impl FnMut(u32)) -> f64 {
    let mut times: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for i in 0..calls_per_round() {
                call(black_box(i & 7));
            }
            start.elapsed().as_nanos() as f64 / calls_per_round() as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[ROUNDS / 2]
}

/// Times `direct` and `through_shim` and prints both and their difference.
fn compare(name: &str, mut direct: impl FnMut(u32), mut through_shim: impl FnMut(u32)) {
    through_shim(0); // loads the real NCCL behind the shim
    let d = per_call(&mut direct);
    let s = per_call(&mut through_shim);
    println!("{name:<38} {d:>12.2} {s:>12.2} {:>12.2}", s - d);
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if full {
        CALLS.store(20_000_000, Ordering::Relaxed);
    }
    if let Some(fake) = std::env::args().nth(1).filter(|a| a != "--bench") {
        return operations(std::path::Path::new(&fake));
    }
    calls();
    // Operations, each setting in a process of its own (the shim reads them once).
    let dir = scratch("microbench-operations");
    let (_, fake) = calls_client_and_fake_nccl(&dir);
    let trace = dir.join("trace.%p.jsonl");
    for (setting, env) in [
        ("trace off", vec![]),
        (
            "NCCLSHIM_TRACE",
            vec![("NCCLSHIM_TRACE", trace.to_str().unwrap())],
        ),
    ] {
        println!("\noperations, {setting}:");
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .arg(&fake)
            .args(full.then_some("--bench"))
            .env("NCCLSHIM_REAL_NCCL", &fake)
            .envs(env)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Operations through the shim against the stand-in called directly.
fn operations(fake_path: &std::path::Path) {
    let fake = open(fake_path);
    let shim = open(&shim_library("2.27.7"));
    // SAFETY: both libraries export these with NCCL's signatures.
    let (fake_gather, shim_gather, fake_reduce, shim_reduce) = unsafe {
        (
            *fake.get::<AllGather>("ncclAllGather").unwrap(),
            *shim.get::<AllGather>("ncclAllGather").unwrap(),
            *fake.get::<AllReduce>("ncclAllReduce").unwrap(),
            *shim.get::<AllReduce>("ncclAllReduce").unwrap(),
        )
    };
    let (comm, buffer) = (0x1000 as *mut c_void, 0x40 as *mut c_void);
    // SAFETY (every call below): the stand-in reads none of its arguments.
    compare(
        "ncclAllGather",
        |n| {
            black_box(unsafe { fake_gather(buffer, buffer, n as usize, 7, comm, buffer) });
        },
        |n| {
            black_box(unsafe { shim_gather(buffer, buffer, n as usize, 7, comm, buffer) });
        },
    );
    compare(
        "ncclAllReduce",
        |n| {
            black_box(unsafe { fake_reduce(buffer, buffer, n as usize, 7, 0, comm, buffer) });
        },
        |n| {
            black_box(unsafe { shim_reduce(buffer, buffer, n as usize, 7, 0, comm, buffer) });
        },
    );
    let send_and_receive = |library: &Library| {
        // SAFETY: both libraries export these with NCCL's signatures.
        let (start, send, recv, end) = unsafe {
            (
                *library.get::<Group>("ncclGroupStart").unwrap(),
                *library.get::<Send>("ncclSend").unwrap(),
                *library.get::<Recv>("ncclRecv").unwrap(),
                *library.get::<Group>("ncclGroupEnd").unwrap(),
            )
        };
        move |n: u32| unsafe {
            start();
            send(buffer, n as usize, 7, 1, comm, buffer);
            recv(buffer, n as usize, 7, 1, comm, buffer);
            black_box(end());
        }
    };
    compare(
        "group: send, recv",
        send_and_receive(&fake),
        send_and_receive(&shim),
    );
    // Not traced: eight calls a round would write eight times the trace (the full run's is
    // about 3 GB already).
    if std::env::var_os("NCCLSHIM_TRACE").is_some() {
        return;
    }
    // A handle the shim never saw made, nor met at an all-reduce with elements (as 0x1000 was
    // above): its calls of no element forward, after one look-up, and set no core up.
    let unseen = 0x3000 as *mut c_void;
    let empty_gathers = |library: &Library, comm: *mut c_void| {
        // SAFETY: both libraries export these with NCCL's signatures.
        let (start, gather, end) = unsafe {
            (
                *library.get::<Group>("ncclGroupStart").unwrap(),
                *library.get::<AllGather>("ncclAllGather").unwrap(),
                *library.get::<Group>("ncclGroupEnd").unwrap(),
            )
        };
        move |_: u32| unsafe {
            start();
            for _ in 0..8 {
                gather(buffer, buffer, 0, 7, comm, buffer);
            }
            black_box(end());
        }
    };
    compare(
        "group: 8 all-gathers of 0, forwarded",
        empty_gathers(&fake, unseen),
        empty_gathers(&shim, unseen),
    );
    let empty_reduces = |library: &Library| {
        // SAFETY: both libraries export these with NCCL's signatures.
        let (start, reduce, end) = unsafe {
            (
                *library.get::<Group>("ncclGroupStart").unwrap(),
                *library.get::<AllReduce>("ncclAllReduce").unwrap(),
                *library.get::<Group>("ncclGroupEnd").unwrap(),
            )
        };
        move |_: u32| unsafe {
            start();
            for _ in 0..8 {
                reduce(buffer, buffer, 0, 7, 0, unseen, buffer);
            }
            black_box(end());
        }
    };
    compare(
        "group: 8 all-reduces of 0, forwarded",
        empty_reduces(&fake),
        empty_reduces(&shim),
    );
    // On a communicator made through the shim (rank 1's, 0x2000; its core declined here, without
    // a GPU) the shim answers them itself: the group never reaches the stand-in, whose calls
    // cost next to nothing, so the difference is the shim's whole cost of the group.
    let mut made: *mut c_void = std::ptr::null_mut();
    // SAFETY: NCCL's signature; the stand-in writes the handle and reads nothing else.
    let init = unsafe { *shim.get::<InitRank>("ncclCommInitRank").unwrap() };
    let id = UniqueId { internal: [0; 128] };
    assert_eq!(unsafe { init(&mut made, 2, id, 1) }, 0);
    compare(
        "group: 8 all-gathers of 0, answered",
        empty_gathers(&fake, made),
        empty_gathers(&shim, made),
    );
    // What nccl-tests' gather and scatter do at 0 bytes with one process driving two GPUs, four
    // calls aggregated (`-g 2 -m 4`): each asks both communicators their size and rank inside
    // a group of its own, and calls nothing else.
    let queries = |library: &Library| {
        // SAFETY: both libraries export these with NCCL's signatures.
        let (start, count, rank, end) = unsafe {
            (
                *library.get::<Group>("ncclGroupStart").unwrap(),
                *library.get::<CommQuery>("ncclCommCount").unwrap(),
                *library.get::<CommQuery>("ncclCommUserRank").unwrap(),
                *library.get::<Group>("ncclGroupEnd").unwrap(),
            )
        };
        let mut value: c_int = 0;
        move |_: u32| unsafe {
            start();
            for _ in 0..4 {
                start();
                for comm in [made, unseen] {
                    count(comm, &mut value);
                    rank(comm, &mut value);
                }
                end();
            }
            black_box(end());
        }
    };
    compare(
        "group: 4 x (group: 2 x (count, rank))",
        queries(&fake),
        queries(&shim),
    );
}

/// Plain forwarded calls against the real NCCL.
fn calls() {
    let real_path = real_library("2.27.7");
    // SAFETY: set before any other thread exists; the shim reads it when it first loads.
    unsafe { std::env::set_var("NCCLSHIM_REAL_NCCL", &real_path) };
    let real = open(&real_path);
    let shim = open(&shim_library("2.27.7"));
    // SAFETY: both libraries export these with NCCL's signatures.
    let (real_error_string, shim_error_string, real_version, shim_version) = unsafe {
        (
            *real.get::<GetErrorString>("ncclGetErrorString").unwrap(),
            *shim.get::<GetErrorString>("ncclGetErrorString").unwrap(),
            *real.get::<GetVersion>("ncclGetVersion").unwrap(),
            *shim.get::<GetVersion>("ncclGetVersion").unwrap(),
        )
    };
    println!(
        "{:<38} {:>12} {:>12} {:>12}",
        "function", "real ns/call", "shim ns/call", "overhead ns"
    );
    // SAFETY (every call below): valid arguments for NCCL's signatures; results go to black_box.
    compare(
        "ncclGetErrorString",
        |r| {
            black_box(unsafe { real_error_string(r) });
        },
        |r| {
            black_box(unsafe { shim_error_string(r) });
        },
    );
    let (mut real_out, mut shim_out): (c_int, c_int) = (0, 0);
    compare(
        "ncclGetVersion",
        |_| {
            black_box(unsafe { real_version(black_box(&mut real_out)) });
        },
        |_| {
            black_box(unsafe { shim_version(black_box(&mut shim_out)) });
        },
    );
    println!(
        "({ROUNDS} rounds of {} calls each, medians; real NCCL {})",
        calls_per_round(),
        real_path.display()
    );
}
