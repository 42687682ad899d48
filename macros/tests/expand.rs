//! `nccl_ffi!`, `nccl_real!` and `nccl_exports!` expanded over the committed 2.27.7 spec, with a
//! runtime, a recorder and a router of the test's own: claimed functions route, others forward, missing ones get the stub, nested calls go
//! straight to the real function, and panics stop at the C boundary.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Mutex;

/// A stand-in for the shim's runtime module, recording what the exports asked of it.
mod runtime {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static DEPTH: Cell<u32> = const { Cell::new(0) };
    }

    pub struct Reentry(bool);
    impl Reentry {
        pub fn enter() -> Reentry {
            let depth = DEPTH.with(|d| {
                d.set(d.get() + 1);
                d.get()
            });
            Reentry(depth == 1)
        }
        pub fn outermost(&self) -> bool {
            self.0
        }
        pub fn depth() -> u32 {
            DEPTH.with(Cell::get)
        }
    }
    impl Drop for Reentry {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }

    pub struct Failure {
        pub code: u32,
        pub message: *const c_char,
    }

    pub static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub fn record(event: String) {
        EVENTS.lock().unwrap().push(event);
    }

    pub fn real_symbol(name: &CStr) -> *mut c_void {
        match name.to_str().unwrap() {
            "ncclGetVersion" => super::real_get_version as *mut c_void,
            "ncclCommCount" => super::real_comm_count as *mut c_void,
            "ncclBroadcast" => super::real_broadcast as *mut c_void,
            "ncclAllGather" => super::real_all_gather as *mut c_void,
            _ => std::ptr::null_mut(),
        }
    }

    pub fn missing_function(name: &'static str) -> Failure {
        record(format!("missing {name}"));
        Failure {
            code: 5,
            message: c"missing".as_ptr(),
        }
    }

    pub fn panicked(name: &'static str) -> Failure {
        record(format!("panicked {name}"));
        Failure {
            code: 3,
            message: c"panicked".as_ptr(),
        }
    }

    pub fn real_call_failed() {
        record("real failed".into());
    }
}

/// A stand-in for the shim's recorder: what the exports describe of each operation.
mod recorder {
    use super::runtime::record;

    pub fn operation_done(call: &super::Call, result: u32) {
        let name = super::ffi::OPERATIONS[call.kind as usize];
        record(format!(
            "{name} comm {:p} send {:p} recv {:p} count {} type {} op {:?} root {:?} stream {:p} -> {result}",
            call.comm,
            call.send,
            call.recv,
            call.count,
            call.datatype,
            call.op,
            call.root,
            call.stream
        ));
    }
}

/// The description the exports give of an operation's call.
pub struct Call {
    pub kind: u8,
    pub comm: ffi::ncclComm_t,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub datatype: u32,
    pub op: Option<u32>,
    pub root: Option<i32>,
    pub stream: ffi::cudaStream_t,
}

/// The router of this test: claims ncclCommCount, and the broadcasts among the operations;
/// records each call it lets go to the real NCCL.
struct Router;

impl real::Route for Router {
    unsafe fn ncclCommCount(_comm: ffi::ncclComm_t, count: *mut c_int) -> ffi::ncclResult_t {
        assert!(!count.is_null(), "the router was given a NULL count");
        // SAFETY: checked non-null; the caller's int.
        unsafe { *count = 42 };
        0
    }

    fn before_forward() {
        runtime::record("before forward".into());
    }

    fn operation<F: FnOnce() -> ffi::ncclResult_t + 'static>(
        call: &Call,
        forward: F,
    ) -> ffi::ncclResult_t {
        let name = ffi::OPERATIONS[call.kind as usize];
        if name.starts_with("ncclB") {
            runtime::record(format!("routed {name}"));
            return 0;
        }
        forward()
    }
}

mod ffi {
    ncclshim_macros::nccl_ffi!(specs_env = "NCCLSHIM_TEST_SPECS");
}

mod real {
    ncclshim_macros::nccl_real!(
        specs_env = "NCCLSHIM_TEST_SPECS",
        ffi = crate::ffi,
        call = crate::Call,
        runtime = crate::runtime
    );
}

mod exports {
    ncclshim_macros::nccl_exports!(
        specs_env = "NCCLSHIM_TEST_SPECS",
        ffi = crate::ffi,
        call = crate::Call,
        real = crate::real,
        router = crate::Router,
        runtime = crate::runtime,
        recorder = crate::recorder
    );
}

/// The "real NCCL": its ncclGetVersion calls the export ncclCommCount, as the real NCCL calls
/// its own exports through the PLT.
unsafe extern "C" fn real_get_version(version: *mut c_int) -> u32 {
    let mut count: c_int = -1;
    // SAFETY: a valid int to write; the comm is never dereferenced.
    let nested = unsafe { api_exports::ncclCommCount(std::ptr::null_mut(), &mut count) };
    // SAFETY: the caller's int.
    unsafe { *version = 22707 + count };
    nested
}

unsafe extern "C" fn real_comm_count(_comm: *mut c_void, count: *mut c_int) -> u32 {
    // SAFETY: the caller's int.
    unsafe { *count = 7 };
    4 // ncclInvalidArgument: a failure of the real NCCL
}

/// The "real NCCL"'s broadcast and all-gather: what they were given.
unsafe extern "C" fn real_broadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: u32,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    runtime::record(format!(
        "real ncclBroadcast {send:p} {recv:p} {count} {datatype} {root} {comm:p} {stream:p}"
    ));
    0
}

unsafe extern "C" fn real_all_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: u32,
    comm: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    runtime::record(format!(
        "real ncclAllGather {send:p} {recv:p} {count} {datatype} {comm:p} {stream:p}"
    ));
    0
}

/// The exports, as C callers see them.
mod api_exports {
    use std::ffi::{c_char, c_int};
    unsafe extern "C" {
        pub fn ncclGetVersion(version: *mut c_int) -> u32;
        pub fn pncclGetVersion(version: *mut c_int) -> u32;
        pub fn ncclCommCount(comm: *mut std::ffi::c_void, count: *mut c_int) -> u32;
        pub fn pncclCommCount(comm: *mut std::ffi::c_void, count: *mut c_int) -> u32;
        pub fn ncclCommShrink(
            comm: *mut std::ffi::c_void,
            exclude: *mut c_int,
            n: c_int,
            out: *mut *mut std::ffi::c_void,
            config: *mut std::ffi::c_void,
            flags: c_int,
        ) -> u32;
        pub fn ncclGetLastError(comm: *mut std::ffi::c_void) -> *const c_char;
        pub fn ncclResetDebugInit();
        pub fn ncclReduce(
            send: *const std::ffi::c_void,
            recv: *mut std::ffi::c_void,
            count: usize,
            datatype: u32,
            op: u32,
            root: c_int,
            comm: *mut std::ffi::c_void,
            stream: *mut std::ffi::c_void,
        ) -> u32;
        pub fn ncclRecv(
            recv: *mut std::ffi::c_void,
            count: usize,
            datatype: u32,
            peer: c_int,
            comm: *mut std::ffi::c_void,
            stream: *mut std::ffi::c_void,
        ) -> u32;
        pub fn ncclBcast(
            buff: *mut std::ffi::c_void,
            count: usize,
            datatype: u32,
            root: c_int,
            comm: *mut std::ffi::c_void,
            stream: *mut std::ffi::c_void,
        ) -> u32;
        pub fn pncclSend(
            send: *const std::ffi::c_void,
            count: usize,
            datatype: u32,
            peer: c_int,
            comm: *mut std::ffi::c_void,
            stream: *mut std::ffi::c_void,
        ) -> u32;
    }
}

fn events() -> Vec<String> {
    std::mem::take(&mut *runtime::EVENTS.lock().unwrap())
}

// One test, so that the recorded events are this test's alone.
#[test]
fn exports_route_forward_stub_and_contain_panics() {
    assert_eq!(ffi::ABI_VERSION, "2.27.7");
    assert_eq!(ffi::ABI_VERSION_CODE, 22707);
    assert_eq!(ffi::ABI_FUNCTIONS.len(), 37);
    assert!(ffi::ABI_FUNCTIONS.contains(&"ncclCommInitRankScalable"));

    // SAFETY (every call below): arguments as NCCL's C API takes them.
    unsafe {
        // Claimed: the router answers, through both exports.
        let mut count = 0;
        assert_eq!(
            api_exports::ncclCommCount(std::ptr::null_mut(), &mut count),
            0
        );
        assert_eq!(count, 42);
        count = 0;
        assert_eq!(
            api_exports::pncclCommCount(std::ptr::null_mut(), &mut count),
            0
        );
        assert_eq!(count, 42);
        assert_eq!(events(), Vec::<String>::new());

        // Forwarded; the nested call made by the "real" library skips the router and reaches
        // the real ncclCommCount (7), whose failure is reported. A question (the version) goes
        // to NCCL without the router's preparation (`before_forward`: a group opened there).
        let mut version = 0;
        assert_eq!(api_exports::ncclGetVersion(&mut version), 4);
        assert_eq!(version, 22707 + 7);
        assert_eq!(api_exports::pncclGetVersion(&mut version), 4);
        // Each call: the nested ncclCommCount failed, then ncclGetVersion passed that on.
        assert_eq!(events(), ["real failed"; 4]);

        // Missing from the real library: the stub, by return type.
        let mut child = std::ptr::null_mut();
        let rc = api_exports::ncclCommShrink(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            &mut child,
            std::ptr::null_mut(),
            0,
        );
        assert_eq!(rc, 5);
        assert_eq!(
            CStr::from_ptr(api_exports::ncclGetLastError(std::ptr::null_mut())),
            c"missing"
        );
        api_exports::ncclResetDebugInit();
        assert_eq!(
            events(),
            [
                "before forward",
                "missing ncclCommShrink",
                "missing ncclGetLastError",
                "before forward",
                "missing ncclResetDebugInit"
            ]
        );

        // Operations on a communicator's stream, read from the spec by their parameters, are
        // described once each returns (here: missing from the "real" library, the stub's 5).
        // (2.27.7's; all-to-all, gather and scatter come with 2.28.)
        assert_eq!(
            ffi::OPERATIONS,
            [
                "ncclReduce",
                "ncclBcast",
                "ncclBroadcast",
                "ncclAllReduce",
                "ncclReduceScatter",
                "ncclAllGather",
                "ncclSend",
                "ncclRecv",
            ]
        );
        let comm = 0x1230 as *mut c_void;
        let (buffer, stream) = (0x40 as *mut c_void, std::ptr::null_mut());
        assert_eq!(
            api_exports::ncclReduce(buffer, buffer, 12, 7, 2, 1, comm, stream),
            5
        );
        assert_eq!(api_exports::pncclSend(buffer, 3, 9, 1, comm, stream), 5);
        assert_eq!(api_exports::ncclRecv(buffer, 2, 7, 0, comm, stream), 5);
        let other = 0x80 as *mut c_void;
        assert_eq!(api_exports::ncclBcast(other, 4, 2, 0, comm, stream), 0);
        assert_eq!(
            events(),
            [
                "before forward",
                "missing ncclReduce",
                "ncclReduce comm 0x1230 send 0x40 recv 0x40 count 12 type 7 op Some(2) root Some(1) stream 0x0 -> 5",
                "before forward",
                "missing ncclSend",
                "ncclSend comm 0x1230 send 0x40 recv 0x0 count 3 type 9 op None root Some(1) stream 0x0 -> 5",
                "before forward",
                "missing ncclRecv",
                "ncclRecv comm 0x1230 send 0x0 recv 0x40 count 2 type 7 op None root Some(0) stream 0x0 -> 5",
                // Claimed by the router: not forwarded; one buffer is both of an in-place broadcast.
                "routed ncclBcast",
                "ncclBcast comm 0x1230 send 0x80 recv 0x80 count 4 type 2 op None root Some(0) stream 0x0 -> 0",
            ]
        );

        // A call forwarded from its description alone (as a call the core queued in a group,
        // sent to NCCL after all): every argument from the description, in the function's order.
        let kind = |name: &str| ffi::OPERATIONS.iter().position(|o| *o == name).unwrap() as u8;
        let described = |name: &str, op: Option<u32>, root: Option<i32>| Call {
            kind: kind(name),
            comm: comm.cast(),
            send: 0x50 as *const c_void,
            recv: 0x60 as *mut c_void,
            count: 5,
            datatype: 3,
            op,
            root,
            stream: 0x70 as ffi::cudaStream_t,
        };
        assert_eq!(
            real::forward_described(&described("ncclBroadcast", None, Some(1))),
            Some(0)
        );
        assert_eq!(
            real::forward_described(&described("ncclAllGather", None, None)),
            Some(0)
        );
        // A reduce described without its op, or a root, cannot be called.
        assert_eq!(
            real::forward_described(&described("ncclReduce", None, Some(0))),
            None
        );
        assert!(
            ffi::OPERATIONS
                .iter()
                .all(|o| real::forwards_described(kind(o)))
        );
        assert!(!real::forwards_described(u8::MAX));
        // The operations the real NCCL has: those the stand-in resolves.
        let had: Vec<&str> = ffi::OPERATIONS
            .iter()
            .copied()
            .filter(|o| real::has_operation(kind(o)))
            .collect();
        assert_eq!(had, ["ncclBroadcast", "ncclAllGather"]);
        assert!(!real::has_operation(u8::MAX));
        assert_eq!(
            events(),
            [
                "real ncclBroadcast 0x50 0x60 5 3 1 0x1230 0x70",
                "real ncclAllGather 0x50 0x60 5 3 0x1230 0x70",
            ]
        );

        // A panic in the router stops at the C boundary as ncclInternalError.
        let rc = api_exports::ncclCommCount(std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(rc, 3);
        assert_eq!(events(), ["panicked ncclCommCount"]);
        assert_eq!(
            runtime::Reentry::depth(),
            0,
            "the guard is released after a panic"
        );
    }
}
