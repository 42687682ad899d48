//! What the generated exports rely on: the reentrancy guard, the lookup of the real NCCL's
//! symbols, and the answers for calls that can't be served (missing function, no real NCCL,
//! a panic), with the message they leave for `ncclGetLastError`.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ffi::{ncclInternalError, ncclInvalidUsage, ncclResult_t, ncclSystemError};
use crate::log::log_warn;
use crate::real_nccl::{RealState, real_nccl, real_nccl_state};

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Marks this thread as inside the shim for as long as it lives. Only the outermost call routes;
/// a call arriving while the thread is already inside (our core calling NCCL, or the real NCCL
/// calling its own exports through the PLT) goes straight to the real NCCL.
pub struct Reentry {
    outermost: bool,
}

impl Reentry {
    #[inline]
    pub fn enter() -> Reentry {
        let depth = DEPTH.with(|d| {
            let depth = d.get() + 1;
            d.set(depth);
            depth
        });
        Reentry {
            outermost: depth == 1,
        }
    }

    #[inline]
    pub fn outermost(&self) -> bool {
        self.outermost
    }

    /// How many shim calls this thread is inside.
    #[inline]
    pub fn depth() -> u32 {
        DEPTH.with(Cell::get)
    }
}

impl Drop for Reentry {
    #[inline]
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// The real NCCL's symbol `name` (null if it lacks it, or if there is no real NCCL).
pub fn real_symbol(name: &CStr) -> *mut c_void {
    real_nccl().map_or(ptr::null_mut(), |real| real.symbol(name))
}

/// Why a call could not be served, as its export reports it.
pub struct Failure {
    pub code: ncclResult_t,
    /// Never null; lives as long as the process.
    pub message: *const c_char,
}

/// The last error of ours, for `ncclGetLastError`; null once the real NCCL has failed since.
static LAST_SHIM_ERROR: AtomicPtr<c_char> = AtomicPtr::new(ptr::null_mut());
/// One message per function and cause, made once and kept: their pointers are handed out.
static MESSAGES: Mutex<Option<HashMap<String, &'static CStr>>> = Mutex::new(None);

fn fail(code: ncclResult_t, key: &str, make_message: impl FnOnce() -> String) -> Failure {
    let failure = failure(code, key, make_message);
    LAST_SHIM_ERROR.store(failure.message.cast_mut(), Ordering::Release);
    failure
}

/// The failure with its message, made (and warned about) the first time `key` fails.
fn failure(code: ncclResult_t, key: &str, make_message: impl FnOnce() -> String) -> Failure {
    let mut messages = MESSAGES.lock().unwrap_or_else(|e| e.into_inner());
    let message = *messages
        .get_or_insert_with(HashMap::new)
        .entry(key.to_string())
        .or_insert_with(|| {
            let text = make_message();
            log_warn!("{text}");
            let text = CString::new(text.replace('\0', " ")).unwrap_or_default();
            Box::leak(text.into_boxed_c_str())
        });
    Failure {
        code,
        message: message.as_ptr(),
    }
}

/// The answer of a function the real NCCL does not have (or of any function, with no real NCCL).
/// Warns once per function.
pub fn missing_function(name: &'static str) -> Failure {
    match real_nccl_state() {
        RealState::Loaded(real) => fail(ncclInvalidUsage, name, || {
            format!(
                "{name} is not available: the real NCCL in use ({} at {}) does not provide it",
                real.version(),
                real.path.display()
            )
        }),
        RealState::Absent => fail(
            ncclSystemError,
            &format!("{name} without a real NCCL"),
            || {
                format!(
                    "{name} cannot be served: ncclshim has no real NCCL library to forward to (set NCCLSHIM_REAL_NCCL)"
                )
            },
        ),
        // A call from inside the real NCCL while we are still loading it (its initialisers): a
        // passing state, so it leaves no last error behind.
        RealState::Loading => failure(ncclSystemError, &format!("{name} while loading"), || {
            format!("{name} was called by the real NCCL while ncclshim was still loading it")
        }),
    }
}

/// The answer of an export whose Rust code panicked: the panic stops at the C boundary.
pub fn panicked(name: &'static str) -> Failure {
    fail(ncclInternalError, &format!("panic in {name}"), || {
        format!("internal error in ncclshim while serving {name}")
    })
}

/// A forwarded call failed: the real NCCL's own last error is now the newer one.
#[inline]
pub fn real_call_failed() {
    if !LAST_SHIM_ERROR.load(Ordering::Relaxed).is_null() {
        LAST_SHIM_ERROR.store(ptr::null_mut(), Ordering::Relaxed);
    }
}

/// Our last error, if it is newer than any failure of the real NCCL.
pub fn shim_last_error() -> Option<*const c_char> {
    let message = LAST_SHIM_ERROR.load(Ordering::Acquire);
    (!message.is_null()).then_some(message.cast_const())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_call_routes() {
        assert_eq!(Reentry::depth(), 0);
        let outer = Reentry::enter();
        assert!(outer.outermost());
        {
            let inner = Reentry::enter();
            assert!(!inner.outermost());
            assert_eq!(Reentry::depth(), 2);
        }
        assert_eq!(Reentry::depth(), 1);
        drop(outer);
        assert_eq!(Reentry::depth(), 0);
        // Each thread has its own depth.
        let _outer = Reentry::enter();
        std::thread::spawn(|| assert!(Reentry::enter().outermost()))
            .join()
            .unwrap();
    }

    #[test]
    fn failures_keep_one_message_each_and_the_real_nccl_overrides_them() {
        let first = panicked("ncclTestOnly");
        let again = panicked("ncclTestOnly");
        assert_eq!(first.code, ncclInternalError);
        assert_eq!(first.message, again.message);
        // SAFETY: messages are leaked C strings.
        let text = unsafe { CStr::from_ptr(first.message) }.to_str().unwrap();
        assert_eq!(
            text,
            "internal error in ncclshim while serving ncclTestOnly"
        );
        assert_eq!(shim_last_error(), Some(first.message));
        real_call_failed();
        assert_eq!(shim_last_error(), None);
    }
}
