//! The core through `ncclCommSuspend` with `NCCL_SUSPEND_MEM`: freed with NCCL's memory where no
//! CUDA graph of any rank may hold its kernels, on every rank alike (docs/design.md, "Suspended
//! memory").

use super::{group, lifecycle, release};
use crate::ffi::ncclComm_t;
use crate::log::{log_info, log_warn};

/// The communicator's memory is being suspended (ncclCommSuspend with NCCL_SUSPEND_MEM, which
/// every rank calls at the same point of its calls, blocking communicators' ranks within groups
/// or not alike, as NCCL's own suspension meets them): now, or at the end of the group it is
/// made in (`suspend`).
pub fn suspending(comm: ncclComm_t) {
    match group::inside() {
        true => group::defer_suspension(comm),
        false => suspend(&[comm]),
    }
}

/// Releases the cores of `comms`, whose memory NCCL suspends, on every rank alike, unless a CUDA
/// graph may hold their kernels on any rank (replayed after `ncclCommResume`, they would use
/// their memory: NCCL keeps its own at the same addresses for that), which their ranks find out
/// together (`CoreComm::ask_about_graphs`, started for all of them before any is waited for: one
/// thread may drive several ranks). A released core is set up again at its communicator's first
/// all-reduce after, through NCCL. Only blocking communicators' (their ranks meet where NCCL's
/// do; a nonblocking suspension returns before it is done, and a thread may go on to its other
/// ranks' before any meets). A rank whose agreement gives up waiting keeps its core while a peer
/// that finished it may let its own go: the communicator is failed on that rank already
/// (`CoreComm::failed`, its calls ncclRemoteError), as NCCL's suspension met every rank before.
pub(super) fn suspend(comms: &[ncclComm_t]) {
    let asked: Vec<_> = (comms.iter())
        .filter_map(|&comm| match lifecycle::lookup(comm) {
            lifecycle::Lookup::Core(core) if core.blocking => {
                let asked = core.ask_about_graphs();
                Some((comm, core, asked))
            }
            _ => None,
        })
        .collect();
    for (comm, core, asked) in asked {
        let answer = asked.and_then(|asked| core.graphs_answer(asked));
        drop(core);
        match answer {
            Some(false) => {
                if let Some(core) = lifecycle::suspended(comm) {
                    log_info!(
                        "comm {comm:p} suspends its memory: its core goes, set up again at its first all-reduce after"
                    );
                    release(comm, core, false);
                }
            }
            Some(true) => log_info!(
                "comm {comm:p} suspends its memory, but a CUDA graph may hold kernels of its core: the core and its memory stay"
            ),
            None => log_warn!(
                "comm {comm:p} suspends its memory, but its ranks could not agree whether CUDA graphs hold kernels of its core: the core and its memory stay"
            ),
        }
    }
}
