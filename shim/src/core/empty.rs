//! Calls of no elements. NCCL (from 2.20) checks their arguments and the communicator's state,
//! then drops them (enqueue.cc, `taskAppend`): nothing reaches the stream, the group or the
//! peers. On a communicator the shim saw made and that is not revoked, such a call with arguments
//! NCCL takes is answered here as NCCL answers it, `ncclSuccess`, without NCCL's host work (its
//! argument checks and internal group); anything else goes to NCCL, which reports it (its WARN
//! and result). With the core off (`NCCLSHIM_CORE=0`) every call forwards.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::lifecycle::{self, Lookup};
use super::policy;
use super::types::{Collective, Op};
use crate::call::Call;
use crate::ffi::{ncclComm_t, ncclRemoteError, ncclResult_t, ncclSuccess};

/// The last data type every NCCL the shim forwards to has (bfloat16, 2.10 on); the 8-bit floats
/// (2.24 on) forward.
const LAST_COMMON_TYPE: u32 = 9;

/// The first NCCL that drops a collective of no elements before it joins the group: earlier
/// ones queue it (its stream joins the group and is checked against the others').
const FIRST_DROPPING: i32 = 22000;

/// `call` (of `collective`, `count` 0): answered here where NCCL would drop it, else `forward`.
pub fn answer(
    collective: Collective,
    call: &Call,
    forward: impl FnOnce() -> ncclResult_t,
) -> ncclResult_t {
    let comm = call.comm;
    let core = match lifecycle::lookup(comm) {
        // A core that gave up fails every call, as NCCL fails those of a communicator with an
        // error (ncclCommGetAsyncError reports it).
        Lookup::Core(core) if core.failed(comm) => return ncclRemoteError,
        Lookup::Core(core) => Some(core),
        Lookup::NoCore | Lookup::Waiting if policy::settings().enabled => None,
        _ => return forward(),
    };
    // Settled first: NCCL counts the ranks of a communicator only once it is ready (WARN else).
    let ranks = || match &core {
        Some(core) => Some(core.facts.nranks),
        None => super::ranks_of(comm),
    };
    let answered = answerable() && settled(comm) && arguments_taken(collective, call, ranks);
    if !answered {
        return forward();
    }
    super::call_line::answered(collective, call, core.as_deref(), ranks);
    ncclSuccess
}

/// Whether this process's NCCL drops calls of no elements after the checks `arguments_taken`
/// makes: 2.20 or later, and checking no pointers (`NCCL_CHECK_POINTERS`, `NCCL_CHECK_MODE`,
/// which also check calls of no elements). Read at the first such call on a communicator the
/// shim saw made, and at each communicator's creation (`communicator_made`).
fn answerable() -> bool {
    static ANSWERABLE: OnceLock<bool> = OnceLock::new();
    let answerable = *ANSWERABLE.get_or_init(|| {
        let newer =
            crate::real_nccl::real_nccl().is_some_and(|real| real.version_code >= FIRST_DROPPING);
        newer && !checks_pointers(crate::nccl_env::get)
    });
    answerable && !CHECKS_ASKED.load(Ordering::Relaxed)
}

/// A communicator was made while NCCL's settings asked for pointer checks. NCCL 2.29.7 and later
/// read `NCCL_CHECK_MODE` at each communicator's creation, so a program may set it between two:
/// from then on every call of no elements goes to NCCL (which checks it, or answers as the shim
/// would).
static CHECKS_ASKED: AtomicBool = AtomicBool::new(false);

/// A communicator is being made (or first met): notes whether NCCL's settings now ask for
/// pointer checks (`CHECKS_ASKED`).
pub fn communicator_made() {
    if !CHECKS_ASKED.load(Ordering::Relaxed) && checks_pointers(crate::nccl_env::get) {
        CHECKS_ASKED.store(true, Ordering::Relaxed);
    }
}

/// Whether NCCL's settings (from `get`) have it check a call's pointers.
fn checks_pointers(get: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| get(name).is_some_and(|v| !v.trim().is_empty());
    let pointers = get("NCCL_CHECK_POINTERS").is_some_and(|v| !matches!(v.trim(), "" | "0"));
    pointers || set("NCCL_CHECK_MODE")
}

/// Whether NCCL's argument checks (argcheck.cc) pass `call` on a communicator of `nranks` (asked
/// only of a rooted call; `None`: not known): a data type every version has, a built-in
/// reduction op where the collective reduces (a PreMulSum op is checked against NCCL's table), a
/// root in range where it is rooted.
fn arguments_taken(
    collective: Collective,
    call: &Call,
    nranks: impl FnOnce() -> Option<usize>,
) -> bool {
    let type_taken = call.datatype <= LAST_COMMON_TYPE;
    let op_taken = !collective.reduces() || call.op.and_then(Op::from_nccl).is_some();
    let root_taken = || {
        let (Some(root), Some(nranks)) = (call.root, nranks()) else {
            return false;
        };
        (0..nranks as i64).contains(&i64::from(root))
    };
    type_taken && op_taken && (!collective.rooted() || root_taken())
}

/// Whether NCCL would find `comm` ready (`ncclCommEnsureReady`): no operation in progress on it
/// (a nonblocking communicator's) and no error it holds.
fn settled(comm: ncclComm_t) -> bool {
    let mut state = ncclSuccess;
    // SAFETY: a communicator the shim saw made, not destroyed; NCCL writes one result.
    let asked = unsafe { crate::real::ncclCommGetAsyncError(comm, &mut state) };
    asked == ncclSuccess && state == ncclSuccess
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::OPERATIONS;

    fn call(function: &str, datatype: u32, op: Option<u32>, root: Option<i32>) -> Call {
        let kind = OPERATIONS.iter().position(|f| *f == function).unwrap() as u8;
        Call {
            kind,
            comm: std::ptr::null_mut(),
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count: 0,
            datatype,
            op,
            root,
            stream: std::ptr::null_mut(),
        }
    }

    /// What NCCL takes is answered; what its checks refuse is left to it.
    #[test]
    fn arguments_nccl_takes_are_answered_the_rest_forward() {
        let all_reduce = call("ncclAllReduce", 7, Some(0), None);
        assert!(arguments_taken(Collective::AllReduce, &all_reduce, || None));
        let avg_bf16 = call("ncclAllReduce", 9, Some(4), None);
        assert!(arguments_taken(Collective::AllReduce, &avg_bf16, || None));
        for (datatype, op) in [(10, 0), (12, 0), (u32::MAX, 0), (7, 5), (7, u32::MAX)] {
            let bad = call("ncclAllReduce", datatype, Some(op), None);
            assert!(
                !arguments_taken(Collective::AllReduce, &bad, || Some(2)),
                "type {datatype} op {op}"
            );
        }
        let gather = call("ncclAllGather", 0, None, None);
        assert!(arguments_taken(Collective::AllGather, &gather, || None));
        for (root, taken) in [(0, true), (3, true), (4, false), (-1, false)] {
            let broadcast = call("ncclBroadcast", 7, None, Some(root));
            assert_eq!(
                arguments_taken(Collective::Broadcast, &broadcast, || Some(4)),
                taken,
                "root {root}"
            );
        }
        let reduce = call("ncclReduce", 7, Some(5), Some(0));
        assert!(
            !arguments_taken(Collective::Reduce, &reduce, || Some(2)),
            "PreMulSum"
        );
        let unknown_ranks = call("ncclReduce", 7, Some(0), Some(0));
        assert!(!arguments_taken(Collective::Reduce, &unknown_ranks, || {
            None
        }));
    }

    /// NCCL checks pointers, also of calls of no elements, where either of its variables says.
    #[test]
    fn checking_pointers_follows_nccls_settings() {
        let with = |pairs: &'static [(&str, &str)]| {
            checks_pointers(move |name| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            })
        };
        assert!(!with(&[]));
        assert!(!with(&[("NCCL_CHECK_POINTERS", "0")]));
        assert!(!with(&[("NCCL_CHECK_POINTERS", " ")]));
        assert!(with(&[("NCCL_CHECK_POINTERS", "1")]));
        assert!(with(&[("NCCL_CHECK_MODE", "DEBUG_LOCAL")]));
        assert!(!with(&[("NCCL_CHECK_MODE", "")]));
    }
}
