//! Which NCCL functions ncclshim serves itself. Every operation on a stream, described by its
//! export, goes to the core (`core::operation`), which takes the calls of its collectives and
//! forwards the rest; of the other functions, every one not claimed here forwards to the real
//! NCCL (the `Route` trait's defaults, generated from the spec). Functions that only some NCCL
//! versions have are claimed inside `if_exported!`.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use crate::call::Call;
use crate::core::CtaConfig;
use crate::ffi::if_exported;
use crate::ffi::*;
use crate::real::{self, Route, real_functions};
use crate::{calls, core, error_strings, nccl_env, runtime};

pub struct Router;

/// Whether NCCL makes a communicator with `config` blocking: as `NCCL_COMM_BLOCKING` says where
/// it is 0 or 1, whatever the config (init.cc, `envConfigOverride`), else as the config says
/// (NULL: the default, blocking).
///
/// # Safety
/// `config` is NULL or points to an `ncclConfig_t` the real NCCL accepted.
unsafe fn blocking(config: *const ncclConfig_t) -> bool {
    if let Some(set) = blocking_setting() {
        return set;
    }
    // SAFETY: the caller's; `blocking` sits at the same offset in every NCCL version's config.
    config.is_null() || unsafe { (*config).blocking } != 0
}

/// The `maxCTAs` and `CTAPolicy` of `config` (`None`: no config), each NCCL's unset value where
/// the headers it was written with have none (before 2.17 and 2.27): NCCL reads a config no
/// further than its version goes.
///
/// # Safety
/// `config` is NULL or points to an `ncclConfig_t` the real NCCL accepted.
unsafe fn cta_config(config: *const ncclConfig_t) -> Option<CtaConfig> {
    if config.is_null() {
        return None;
    }
    // SAFETY: the caller's; `version` sits at the same offset in every NCCL version's config.
    let version = unsafe { (*config).version };
    Some(CtaConfig {
        max_ctas: match version >= 21700 {
            // SAFETY: the caller's; `maxCTAs` sits at the same offset in every config with it.
            true => unsafe { (*config).maxCTAs },
            false => CtaConfig::UNSET,
        },
        policy: match version >= 22700 {
            // SAFETY: the caller's, of 2.27 or later: `CTAPolicy` is there, at the same offset
            // in every version's headers (this build's may be older and lack it).
            true => unsafe {
                config
                    .cast::<u8>()
                    .add(CTA_POLICY_AT)
                    .cast::<c_int>()
                    .read()
            },
            false => CtaConfig::UNSET,
        },
    })
}

/// Where `CTAPolicy` lies in a config (nccl.h, 2.27 on).
const CTA_POLICY_AT: usize = 60;

/// `NCCL_COMM_BLOCKING` where it is 0 or 1, read once, as NCCL caches it at its first
/// communicator (at each, where `NCCL_NO_CACHE` names it).
fn blocking_setting() -> Option<bool> {
    static SETTING: OnceLock<Option<bool>> = OnceLock::new();
    // NCCL keeps it in an int.
    let read = || match nccl_env::integer("NCCL_COMM_BLOCKING").map(|n| n as i32) {
        Some(0) => Some(false),
        Some(1) => Some(true),
        _ => None,
    };
    nccl_env::as_nccl_caches(&SETTING, &["NCCL_COMM_BLOCKING"], read)
}

/// The most unique ids whose bytes name a communicator (ncclCommInitRankScalable); more, and the
/// ranks meet through NCCL.
const MAX_UNIQUE_IDS: usize = 1 << 16;

/// The bytes of `ids`, which name a communicator alike on every rank (none: not named).
///
/// # Safety
/// `ids` points to `count` unique ids (or is NULL).
unsafe fn id_bytes(ids: *const ncclUniqueId, count: c_int) -> Vec<u8> {
    // No more ids than NCCL takes ranks: NCCL checks the count only after this reads them.
    match usize::try_from(count) {
        Ok(count) if !ids.is_null() && count <= MAX_UNIQUE_IDS => {
            let len = count * size_of::<ncclUniqueId>();
            // SAFETY: the caller's `count` ids, plain bytes.
            unsafe { std::slice::from_raw_parts(ids.cast::<u8>(), len) }.to_vec()
        }
        _ => Vec::new(),
    }
}

/// Hands a communicator that the real NCCL just created (or, nonblocking, is creating) with
/// `config` to the core, with where this rank signed in before NCCL's init (`core::sign_in`;
/// dropped, it withdraws).
///
/// # Safety
/// `comm` is NULL or points to the handle the real NCCL wrote; `config` is NULL or the config
/// the real NCCL accepted.
unsafe fn created(
    result: ncclResult_t,
    comm: *mut ncclComm_t,
    config: *const ncclConfig_t,
    blocking: bool,
    arrival: Option<core::Arrival>,
) -> ncclResult_t {
    // A nonblocking init goes on in the background once it returns ncclInProgress.
    let made = result == ncclSuccess || (!blocking && result == ncclInProgress);
    if comm.is_null() || !made {
        return result;
    }
    // SAFETY: the real NCCL wrote it (a nonblocking communicator's before its init goes on).
    let comm = unsafe { *comm };
    core::arrived(comm, arrival);
    // SAFETY: the caller's config.
    core::configured(comm, unsafe { cta_config(config) }, None);
    if blocking {
        core::created(&[comm]);
    } else {
        core::created_nonblocking(comm);
    }
    result
}

/// Hands a child communicator of `parent` (ncclCommSplit, ncclCommShrink) to the core. NCCL
/// writes a child's handle once the child is made: before the call returns where the parent
/// blocks, at the group's end inside a group, and, where the parent does not block, later, from
/// a thread of its own (the call returns all the same). The core reads it only where NCCL has
/// written it (core::child_created).
///
/// # Safety
/// `newcomm` is NULL or the caller's handle slot, as the real NCCL took it.
unsafe fn child_created(
    result: ncclResult_t,
    parent: ncclComm_t,
    newcomm: *mut ncclComm_t,
    config: *const ncclConfig_t,
    color: Option<c_int>,
) -> ncclResult_t {
    if result == ncclSuccess && !newcomm.is_null() {
        // SAFETY: the caller's slot and config, both accepted by the real NCCL.
        unsafe {
            core::child_created(parent, newcomm, blocking(config), color, cta_config(config))
        };
    }
    result
}

impl Route for Router {
    /// Answers even with no real NCCL.
    unsafe fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
        match real_functions().and_then(|table| table.ncclGetErrorString) {
            // SAFETY: the real NCCL's own function; any result code is a valid argument.
            Some(function) => unsafe { function(result) },
            None => error_strings::describe(result),
        }
    }

    /// Our own errors (a function the real NCCL lacks, no real NCCL) come first while they are
    /// the newest; otherwise the real NCCL's.
    unsafe fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
        if let Some(message) = runtime::shim_last_error() {
            return message;
        }
        match real_functions().and_then(|table| table.ncclGetLastError) {
            // SAFETY: the caller's handle goes unchanged to the real NCCL, which owns it.
            Some(_) => unsafe { real::ncclGetLastError(comm) },
            None => c"".as_ptr(),
        }
    }

    /// Every operation on a stream goes to the core, which takes the calls of the collectives it
    /// has (types.rs) where its policy says so; the rest forward. An operation the real NCCL lacks
    /// (a newer spec's, as 2.28's all-to-all on NCCL 2.27) gets the stub's answer, as it would
    /// with the core off.
    #[inline]
    fn operation<F: FnOnce() -> ncclResult_t + 'static>(call: &Call, forward: F) -> ncclResult_t {
        if !real::has_operation(call.kind) {
            return forward();
        }
        core::operation(call, forward)
    }

    /// A group opens in the real NCCL with its first call that goes there (core::open_group).
    #[inline]
    fn before_forward() {
        core::open_group();
    }

    /// Opens the group in the core; in the real NCCL only once a call of it goes there
    /// (`before_forward`), so that a group whose calls all go to the core never reaches NCCL.
    /// Without a real NCCL to serve it, the real NCCL's answer (the stub's).
    unsafe fn ncclGroupStart() -> ncclResult_t {
        if real_functions()
            .and_then(|table| table.ncclGroupStart)
            .is_none()
        {
            // SAFETY: no arguments.
            return unsafe { real::ncclGroupStart() };
        }
        core::group_start();
        ncclSuccess
    }

    unsafe fn ncclGroupEnd() -> ncclResult_t {
        // SAFETY: no arguments.
        core::group_end(|| unsafe { real::ncclGroupEnd() })
    }

    if_exported!(ncclGroupSimulateEnd {
        /// Ends the group without launching any of it, the core's calls included: they go to
        /// NCCL's group, which estimates them with the rest (core::group_simulate_end). Where the
        /// real NCCL lacks the function, the stub's answer, and the group stays open, as there.
        unsafe fn ncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
            if real_functions().is_none_or(|t| t.ncclGroupSimulateEnd.is_none()) {
                // SAFETY: the caller's argument, unchanged.
                return unsafe { real::ncclGroupSimulateEnd(sim_info) };
            }
            // SAFETY: as above.
            core::group_simulate_end(|| unsafe { real::ncclGroupSimulateEnd(sim_info) })
        }
    });

    unsafe fn ncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        comm_id: ncclUniqueId,
        rank: c_int,
    ) -> ncclResult_t {
        // SAFETY: the caller's arguments, unchanged; then the handle NCCL wrote.
        unsafe {
            let blocking = blocking(std::ptr::null());
            let arrival = core::sign_in(&id_bytes(&comm_id, 1), nranks, rank, blocking);
            Self::before_forward();
            let result = real::ncclCommInitRank(comm, nranks, comm_id, rank);
            created(result, comm, std::ptr::null(), blocking, arrival)
        }
    }

    unsafe fn ncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        comm_id: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: as above; the config NCCL accepted.
        unsafe {
            let blocking = blocking(config);
            let arrival = core::sign_in(&id_bytes(&comm_id, 1), nranks, rank, blocking);
            Self::before_forward();
            let result = real::ncclCommInitRankConfig(comm, nranks, comm_id, rank, config);
            created(result, comm, config, blocking, arrival)
        }
    }

    unsafe fn ncclCommInitAll(
        comms: *mut ncclComm_t,
        ndev: c_int,
        devlist: *const c_int,
    ) -> ncclResult_t {
        // SAFETY: the caller's arguments; on success NCCL wrote `ndev` handles, rank i's at i.
        unsafe {
            // Its ranks are this process's: they meet in shared memory under a name of their own.
            let id = core::new_id();
            let blocking = blocking(std::ptr::null());
            let arrivals: Vec<_> = (0..ndev)
                .map(|rank| core::sign_in(&id, ndev, rank, blocking))
                .collect();
            Self::before_forward();
            let result = real::ncclCommInitAll(comms, ndev, devlist);
            let made = result == ncclSuccess || (!blocking && result == ncclInProgress);
            if made && !comms.is_null() && ndev > 0 {
                let made = std::slice::from_raw_parts(comms, ndev as usize);
                made.iter().zip(arrivals).for_each(|(&c, a)| {
                    core::arrived(c, a);
                    core::configured(c, None, None);
                });
                match blocking {
                    true => core::created(made),
                    false => made.iter().for_each(|&c| core::created_nonblocking(c)),
                }
            }
            result
        }
    }

    unsafe fn ncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        Self::before_forward();
        // SAFETY: as above. A child without config inherits its parent's blocking mode: blocking
        // wherever the core reads its handle (see child_created).
        unsafe {
            child_created(
                real::ncclCommSplit(comm, color, key, newcomm, config),
                comm,
                newcomm,
                config,
                Some(color),
            )
        }
    }

    if_exported!(ncclCommInitRankScalable {
        unsafe fn ncclCommInitRankScalable(
            newcomm: *mut ncclComm_t,
            nranks: c_int,
            myrank: c_int,
            n_id: c_int,
            comm_ids: *mut ncclUniqueId,
            config: *mut ncclConfig_t,
        ) -> ncclResult_t {
            // SAFETY: as above.
            unsafe {
                let blocking = blocking(config);
                let arrival = core::sign_in(&id_bytes(comm_ids, n_id), nranks, myrank, blocking);
                Self::before_forward();
                let result = real::ncclCommInitRankScalable(newcomm, nranks, myrank, n_id, comm_ids, config);
                created(result, newcomm, config, blocking, arrival)
            }
        }
    });

    if_exported!(ncclCommShrink {
        unsafe fn ncclCommShrink(
            comm: ncclComm_t,
            exclude_ranks_list: *mut c_int,
            exclude_ranks_count: c_int,
            newcomm: *mut ncclComm_t,
            config: *mut ncclConfig_t,
            shrink_flags: c_int,
        ) -> ncclResult_t {
            Self::before_forward();
            // SAFETY: as above.
            unsafe {
                let result =
                    real::ncclCommShrink(comm, exclude_ranks_list, exclude_ranks_count, newcomm, config, shrink_flags);
                child_created(result, comm, newcomm, config, None)
            }
        }
    });

    if_exported!(ncclCommRevoke {
        /// A revoked communicator takes no more operations (NCCL refuses them with
        /// ncclInvalidUsage): its core's waiting kernels are told to give up, it is released, and
        /// the communicator's calls go to NCCL from then on. Read from the arguments, not the
        /// result: NCCL may mark the communicator revoked and still fail (allocating its job,
        /// starting its thread, in a group). With its one flag the core goes, also where NCCL
        /// refuses the call as the communicator is being finalized or destroyed (it takes no more
        /// calls) or was revoked before (its core went then); with other flags, or a real NCCL
        /// without the function (the stub's answer), it stays.
        unsafe fn ncclCommRevoke(comm: ncclComm_t, revoke_flags: c_int) -> ncclResult_t {
            Self::before_forward();
            // SAFETY: the caller's arguments, unchanged.
            let result = unsafe { real::ncclCommRevoke(comm, revoke_flags) };
            let has_revoke = real_functions().is_some_and(|t| t.ncclCommRevoke.is_some());
            if has_revoke && revoke_flags == NCCL_REVOKE_DEFAULT as c_int {
                core::revoked(comm);
            }
            result
        }
    });

    if_exported!(ncclCommSuspend {
        /// With `NCCL_SUSPEND_MEM`, NCCL (2.29 on) frees the communicator's memory until
        /// `ncclCommResume`; the core frees its own too (its buffer, about 80 MiB a rank, and its
        /// peers' mappings) and sets up anew at the communicator's first all-reduce after, where
        /// no CUDA graph may hold its kernels (core::suspending). Every rank suspends at the same
        /// point of its calls, so the core goes on every rank alike: read from the arguments, not
        /// from NCCL's result. After NCCL's suspension, as at the end of a group it is made in:
        /// ranks of a blocking communicator meet in NCCL's first, whether they suspend within a
        /// group or not. Where the real NCCL lacks the function (the stub's answer), the core
        /// stays.
        unsafe fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
            Self::before_forward();
            // SAFETY: the caller's arguments, unchanged.
            let result = unsafe { real::ncclCommSuspend(comm, flags) };
            let has_suspend = real_functions().is_some_and(|t| t.ncclCommSuspend.is_some());
            if has_suspend && flags & NCCL_SUSPEND_MEM as c_int != 0 {
                core::suspending(comm);
            }
            result
        }
    });

    if_exported!(ncclCommWindowRegister {
        /// A symmetric window's calls race NCCL's symmetric kernels: the core follows them
        /// (core/windows.rs).
        unsafe fn ncclCommWindowRegister(
            comm: ncclComm_t,
            buff: *mut std::ffi::c_void,
            size: usize,
            win: *mut ncclWindow_t,
            win_flags: c_int,
        ) -> ncclResult_t {
            Self::before_forward();
            // NCCL 2.28 returns ncclSuccess without writing the handle where it registers nothing
            // (a NULL buffer, no bytes, no symmetric support): the slot then holds NULL, as later
            // NCCLs write, not what the program left there (which ranks could differ in). Put
            // back where NCCL refuses the call.
            let left = (!win.is_null()).then(|| {
                let slot = win.cast::<std::mem::MaybeUninit<ncclWindow_t>>();
                // SAFETY: the caller's slot, which NCCL writes; copied as it is, set or not.
                let left = unsafe { slot.read() };
                // SAFETY: as above.
                unsafe { slot.write(std::mem::MaybeUninit::new(std::ptr::null_mut())) };
                (slot, left)
            });
            // SAFETY: the caller's arguments, unchanged.
            let result = unsafe { real::ncclCommWindowRegister(comm, buff, size, win, win_flags) };
            if result != ncclSuccess && result != ncclInProgress {
                if let Some((slot, left)) = left {
                    // SAFETY: as above.
                    unsafe { slot.write(left) };
                }
                return result;
            }
            let done = result == ncclSuccess;
            // SAFETY: the caller's slot, which NCCL writes (see window_registered).
            unsafe { core::window_registered(comm, win.cast(), buff as usize, size, win_flags, done) };
            result
        }
    });

    if_exported!(ncclCommWindowDeregister {
        unsafe fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
            Self::before_forward();
            // SAFETY: the caller's arguments, unchanged.
            let result = unsafe { real::ncclCommWindowDeregister(comm, win) };
            if result == ncclSuccess {
                core::window_deregistered(comm, win as usize);
            }
            result
        }
    });

    /// A core kernel that gave up waiting for a peer is an asynchronous error of the
    /// communicator (ncclRemoteError), as NCCL reports a peer that failed.
    unsafe fn ncclCommGetAsyncError(
        comm: ncclComm_t,
        async_error: *mut ncclResult_t,
    ) -> ncclResult_t {
        // SAFETY: the caller's arguments, unchanged.
        let result = unsafe { real::ncclCommGetAsyncError(comm, async_error) };
        if result == ncclSuccess && !async_error.is_null() {
            // SAFETY: written by the real NCCL just now.
            unsafe { *async_error = core::async_error(comm, *async_error) };
        }
        result
    }

    unsafe fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        core::destroyed(comm, false);
        calls::comm_destroyed(comm);
        Self::before_forward();
        // SAFETY: the caller's handle.
        unsafe { real::ncclCommDestroy(comm) }
    }

    unsafe fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        core::destroyed(comm, true);
        calls::comm_destroyed(comm);
        Self::before_forward();
        // SAFETY: the caller's handle.
        unsafe { real::ncclCommAbort(comm) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config of `version` (as a program built with those headers writes it) whose `maxCTAs`
    /// is 16 and `CTAPolicy` NCCL_CTA_POLICY_ZERO: read only where its headers have them.
    #[test]
    fn a_config_is_read_no_further_than_its_version_goes() {
        #[repr(C, align(8))]
        struct Written([u8; 256]);
        let config_of = |version: c_int| {
            let mut written = Written([0; 256]);
            let mut put = |at: usize, value: c_int| {
                written.0[at..at + 4].copy_from_slice(&value.to_ne_bytes());
            };
            put(std::mem::offset_of!(ncclConfig_t, version), version);
            put(std::mem::offset_of!(ncclConfig_t, maxCTAs), 16);
            put(CTA_POLICY_AT, 2);
            written
        };
        let read = |version| {
            let written = config_of(version);
            // SAFETY: 256 bytes, more than any version's config, aligned as one.
            unsafe { cta_config(written.0.as_ptr().cast()) }.unwrap()
        };
        let split = |c: CtaConfig| (c.max_ctas, c.policy);
        assert_eq!(split(read(22700)), (16, 2));
        assert_eq!(split(read(22809)), (16, 2));
        assert_eq!(split(read(22605)), (16, CtaConfig::UNSET));
        assert_eq!(split(read(21605)), (CtaConfig::UNSET, CtaConfig::UNSET));
        // SAFETY: NULL is no config.
        assert_eq!(unsafe { cta_config(std::ptr::null()) }, None);
    }
}
