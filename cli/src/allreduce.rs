//! `ncclshim doctor`'s last check on a machine with GPUs: a short float all-reduce on every local
//! GPU (one process driving them all, ncclCommInitAll) through the real NCCL, then through the
//! shim, each in a child process of its own (`ncclshim all-reduce-check LIB`, hidden), with the
//! results checked and the median times side by side.

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cudarc::driver::result;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// Element counts of the sizes tried: 4 KiB, 1 MiB, 32 MiB of floats.
const COUNTS: [usize; 3] = [1 << 10, 1 << 18, 1 << 23];
const WARMUP: usize = 5;
const ITERATIONS: usize = 20;

type InitAll = unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type NoArgs = unsafe extern "C" fn() -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The child: all-reduces through the NCCL at `library` and prints "size_bytes median_us ok|wrong"
/// per size.
pub fn child(library: &Path, gpus: usize) -> Result<(), String> {
    let text = library.to_str().ok_or("not a UTF-8 path")?;
    // SAFETY: an NCCL library (the real one or the shim), opened by absolute path.
    let nccl =
        unsafe { Library::open(Some(text), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    // SAFETY: NCCL's functions with their C signatures.
    let (init_all, all_reduce, group_start, group_end, destroy) = unsafe {
        (
            *nccl
                .get::<InitAll>(b"ncclCommInitAll")
                .map_err(|e| e.to_string())?,
            *nccl
                .get::<AllReduce>(b"ncclAllReduce")
                .map_err(|e| e.to_string())?,
            *nccl
                .get::<NoArgs>(b"ncclGroupStart")
                .map_err(|e| e.to_string())?,
            *nccl
                .get::<NoArgs>(b"ncclGroupEnd")
                .map_err(|e| e.to_string())?,
            *nccl
                .get::<Destroy>(b"ncclCommDestroy")
                .map_err(|e| e.to_string())?,
        )
    };
    result::init().map_err(|e| format!("cuInit: {e:?}"))?;
    fn named(call: &'static str) -> impl Fn(result::DriverError) -> String {
        move |e| format!("{call}: {e:?}")
    }
    let mut contexts = Vec::new();
    for ordinal in 0..gpus as c_int {
        let device = result::device::get(ordinal).map_err(named("cuDeviceGet"))?;
        // SAFETY: a valid device; the primary context (the CUDA runtime's, which NCCL uses).
        contexts.push(
            unsafe { result::primary_ctx::retain(device) }
                .map_err(named("cuDevicePrimaryCtxRetain"))?,
        );
    }
    let mut comms = vec![std::ptr::null_mut(); gpus];
    let devices: Vec<c_int> = (0..gpus as c_int).collect();
    // SAFETY: room for one handle per GPU, and their ordinals.
    let rc = unsafe { init_all(comms.as_mut_ptr(), gpus as c_int, devices.as_ptr()) };
    if rc != 0 {
        return Err(format!("ncclCommInitAll returned {rc}"));
    }
    let largest = COUNTS[COUNTS.len() - 1] * 4;
    let mut buffers = Vec::new();
    let mut streams = Vec::new();
    for &context in &contexts {
        // SAFETY: a retained primary context, current on this thread from here on.
        unsafe { result::ctx::set_current(context) }.map_err(named("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation in the current context.
        buffers.push(unsafe { result::malloc_sync(largest) }.map_err(named("cuMemAlloc"))?);
        streams.push(
            result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(named("cuStreamCreate"))?,
        );
    }
    let expected = (gpus * (gpus + 1) / 2) as f32;
    for count in COUNTS {
        let run = |check: bool| -> Result<Duration, String> {
            if check {
                for (rank, (&context, &buffer)) in contexts.iter().zip(&buffers).enumerate() {
                    let values = vec![(rank + 1) as f32; count];
                    // SAFETY: our context and buffer of at least `count` floats.
                    unsafe {
                        result::ctx::set_current(context).map_err(named("cuCtxSetCurrent"))?;
                        result::memcpy_htod_sync(buffer, &values).map_err(named("cuMemcpyHtoD"))?;
                    }
                }
            }
            let start = Instant::now();
            // SAFETY: NCCL's group calls and one all-reduce per GPU on its own buffer and stream.
            unsafe {
                group_start();
                for rank in 0..gpus {
                    let buffer = buffers[rank] as *mut c_void;
                    let rc = all_reduce(
                        buffer,
                        buffer,
                        count,
                        7,
                        0,
                        comms[rank],
                        streams[rank] as *mut c_void,
                    );
                    if rc != 0 {
                        return Err(format!("ncclAllReduce returned {rc}"));
                    }
                }
                let rc = group_end();
                if rc != 0 {
                    return Err(format!("ncclGroupEnd returned {rc}"));
                }
                for (&context, &stream) in contexts.iter().zip(&streams) {
                    result::ctx::set_current(context).map_err(named("cuCtxSetCurrent"))?;
                    result::stream::synchronize(stream).map_err(named("cuStreamSynchronize"))?;
                }
            }
            Ok(start.elapsed())
        };
        run(true)?;
        let mut right = true;
        for (&context, &buffer) in contexts.iter().zip(&buffers) {
            let mut values = vec![0f32; count];
            // SAFETY: our context and buffer of at least `count` floats.
            unsafe {
                result::ctx::set_current(context).map_err(named("cuCtxSetCurrent"))?;
                result::memcpy_dtoh_sync(&mut values, buffer).map_err(named("cuMemcpyDtoH"))?;
            }
            right &= values.iter().all(|&v| v == expected);
        }
        for _ in 0..WARMUP {
            run(false)?;
        }
        let mut times: Vec<Duration> = (0..ITERATIONS)
            .map(|_| run(false))
            .collect::<Result<_, _>>()?;
        times.sort();
        let median = times[ITERATIONS / 2].as_secs_f64() * 1e6;
        println!(
            "{} {median:.1} {}",
            count * 4,
            if right { "ok" } else { "wrong" }
        );
    }
    for comm in comms {
        // SAFETY: a communicator of ours, no longer used.
        unsafe { destroy(comm) };
    }
    Ok(())
}

/// One child's lines: (bytes, median µs, right).
fn measure(
    library: &Path,
    gpus: usize,
    env: &[(&str, &Path)],
) -> Result<Vec<(usize, f64, bool)>, String> {
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("all-reduce-check")
        .arg(library)
        .arg(gpus.to_string())
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            return Err("no answer in 120 s (killed)".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{}{}",
            stdout.trim(),
            stderr.lines().last().unwrap_or("")
        ));
    }
    Ok(stdout
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((
                parts.next()?.parse().ok()?,
                parts.next()?.parse().ok()?,
                parts.next()? == "ok",
            ))
        })
        .collect())
}

/// Both runs, side by side: (bytes, real µs, shim µs, both right), or why not.
pub fn compare(
    shim: &Path,
    real: &Path,
    gpus: usize,
) -> Result<Vec<(usize, f64, f64, bool)>, String> {
    let with_real = measure(real, gpus, &[]).map_err(|e| format!("through the real NCCL: {e}"))?;
    let with_shim = measure(shim, gpus, &[("NCCLSHIM_REAL_NCCL", real)])
        .map_err(|e| format!("through the shim: {e}"))?;
    if with_real.len() != COUNTS.len() || with_shim.len() != COUNTS.len() {
        return Err("a run printed fewer sizes than it was given".into());
    }
    Ok(with_real
        .iter()
        .zip(&with_shim)
        .map(|(r, s)| (r.0, r.1, s.1, r.2 && s.2))
        .collect())
}
