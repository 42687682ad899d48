//! The line NCCL logs for each collective call under `NCCL_DEBUG=INFO` with COLL in
//! `NCCL_DEBUG_SUBSYS` (enqueue.cc), for the calls the core takes or answers, which never reach
//! NCCL: the same fields in the same words, with `[ncclshim]` where NCCL puts the device, so
//! that a log names every call whichever library served it. Its `opCount` counts the calls the
//! core took on the communicator (NCCL's counts NCCL's launches): the same on every rank.

use super::comm::CoreComm;
use super::types::Collective;
use crate::call::Call;
use crate::log::{collectives_logged, log_info};

/// Logs `call` (of `collective`), which the core takes on `core`, and counts it.
pub fn took(collective: Collective, call: &Call, core: &CoreComm) {
    if collectives_logged() {
        let number = core.count_call();
        log_info!(
            "{}",
            line(collective, call, number, core.facts.nranks as i64)
        );
    }
}

/// Logs `call` (of `collective`, no elements), which the core answers without a launch, on a
/// communicator of `nranks` ranks (`None`: not known) whose core, where it has one, is `core`.
pub fn answered(
    collective: Collective,
    call: &Call,
    core: Option<&CoreComm>,
    nranks: impl FnOnce() -> Option<usize>,
) {
    if collectives_logged() {
        let number = core.map_or(0, CoreComm::calls_counted);
        let nranks = nranks().map_or(-1, |n| n as i64);
        log_info!("{}", line(collective, call, number, nranks));
    }
}

/// NCCL's words: `AllReduce: opCount 1f sendbuff 0x7f.. recvbuff 0x7f.. count 4 datatype 7 op 0
/// root 0 comm 0x55.. [nranks=2] stream 0x55..`. A collective that does not reduce says op 0
/// (ncclSum), and one not rooted root 0, as NCCL's do.
fn line(collective: Collective, call: &Call, op_count: u64, nranks: i64) -> String {
    let name = collective.functions()[0]
        .strip_prefix("nccl")
        .unwrap_or_default();
    format!(
        "{name}: opCount {op_count:x} sendbuff {} recvbuff {} count {} datatype {} op {} root {} comm {} [nranks={}] stream {}",
        pointer(call.send),
        pointer(call.recv),
        call.count,
        call.datatype as i32,
        call.op.unwrap_or(0) as i32,
        call.root.unwrap_or(0),
        pointer(call.comm),
        nranks,
        pointer(call.stream),
    )
}

/// A pointer as glibc's `%p` writes it: `(nil)` for NULL.
fn pointer<T>(p: *const T) -> String {
    match p.is_null() {
        true => "(nil)".to_string(),
        false => format!("{p:p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::OPERATIONS;

    fn call(function: &str, op: Option<u32>, root: Option<i32>) -> Call {
        Call {
            kind: OPERATIONS.iter().position(|f| *f == function).unwrap() as u8,
            comm: 0x5555_0000_1000usize as _,
            send: 0x7f00_0000_0200usize as _,
            recv: std::ptr::null_mut(),
            count: 4096,
            datatype: 9,
            op,
            root,
            stream: std::ptr::null_mut(),
        }
    }

    #[test]
    fn lines_read_as_nccls() {
        let all_reduce = call("ncclAllReduce", Some(4), None);
        assert_eq!(
            line(Collective::AllReduce, &all_reduce, 0x1f, 2),
            "AllReduce: opCount 1f sendbuff 0x7f0000000200 recvbuff (nil) count 4096 datatype 9 \
             op 4 root 0 comm 0x555500001000 [nranks=2] stream (nil)"
        );
        let broadcast = call("ncclBcast", None, Some(1));
        assert_eq!(
            line(Collective::Broadcast, &broadcast, 0, 8),
            "Broadcast: opCount 0 sendbuff 0x7f0000000200 recvbuff (nil) count 4096 datatype 9 \
             op 0 root 1 comm 0x555500001000 [nranks=8] stream (nil)"
        );
        let names: Vec<_> = Collective::ALL
            .into_iter()
            .map(|c| line(c, &all_reduce, 0, 2))
            .map(|l| l.split(':').next().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "AllReduce",
                "AllGather",
                "ReduceScatter",
                "Broadcast",
                "Reduce",
                "AlltoAll",
                "Gather",
                "Scatter"
            ]
        );
    }
}
