//! The real NCCL: found (see `locate`), opened by absolute path and asked its version, once, at
//! first use, never from a constructor. The library stays loaded for the life of the process.

use std::ffi::{CStr, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};

use crate::ffi::{ABI_VERSION, ABI_VERSION_CODE};
use crate::locate::{self, SearchEnv};
use crate::log::{log_info, log_warn, log_warn_always};

pub struct RealNccl {
    library: Library,
    pub path: PathBuf,
    /// `NCCL_VERSION_CODE` the real library reports, e.g. 22707.
    pub version_code: i32,
}

static REAL_NCCL: OnceLock<Option<RealNccl>> = OnceLock::new();

/// The real NCCL, loading it on first use; `None` if there is none to be had.
pub fn real_nccl() -> Option<&'static RealNccl> {
    REAL_NCCL.get_or_init(load).as_ref()
}

/// Where loading the real NCCL stands.
pub enum RealState {
    Loading,
    Loaded(&'static RealNccl),
    Absent,
}

/// The real NCCL's state; never loads (safe while loading is under way).
pub fn real_nccl_state() -> RealState {
    match REAL_NCCL.get() {
        None => RealState::Loading,
        Some(Some(real)) => RealState::Loaded(real),
        Some(None) => RealState::Absent,
    }
}

impl RealNccl {
    /// The address of the real library's symbol `name`, or null if it has none.
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: we only take the address; callers give it the signature the spec declares.
        match unsafe { self.library.get::<*mut c_void>(name) } {
            Ok(symbol) => *symbol,
            Err(_) => std::ptr::null_mut(),
        }
    }

    /// "2.27.7" from 22707.
    pub fn version(&self) -> String {
        version_text(self.version_code)
    }
}

pub fn version_text(code: i32) -> String {
    if code < 10000 {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    }
}

fn load() -> Option<RealNccl> {
    let env = SearchEnv::from_process();
    let path = match locate::find_real_nccl(&env, crate::identity::is_ncclshim) {
        Ok(found) => found,
        Err(not_found) => {
            // Once per process, whatever NCCL_DEBUG says: the fix first, then the places.
            log_warn_always!(
                "no real NCCL library could be used by ncclshim {}, so every NCCL call fails with ncclSystemError. {}. Looked at:\n{not_found}",
                env!("CARGO_PKG_VERSION"),
                locate::HOW_TO_GET_NCCL
            );
            return None;
        }
    };
    let Some(path_text) = path.path.to_str() else {
        log_warn_always!(
            "the real NCCL's path {} is not UTF-8; set NCCLSHIM_REAL_NCCL",
            path.path.display()
        );
        return None;
    };
    // SAFETY: NVIDIA's NCCL is an ordinary shared library; its initialisers have no requirements.
    let library = match unsafe { Library::open(Some(path_text), RTLD_LAZY | RTLD_LOCAL) } {
        Ok(library) => library,
        Err(e) => {
            log_warn_always!(
                "could not open the real NCCL {path_text}: {e}. Set NCCLSHIM_REAL_NCCL to another libnccl.so.2"
            );
            return None;
        }
    };
    let mut real = RealNccl {
        library,
        path: path.path.clone(),
        version_code: 0,
    };
    let get_version = real.symbol(c"ncclGetVersion");
    if get_version.is_null() {
        log_warn_always!("{path_text} has no ncclGetVersion: it is not an NCCL library");
        return None;
    }
    // SAFETY: ncclGetVersion(int*) -> ncclResult_t in every NCCL release.
    let get_version: unsafe extern "C" fn(*mut c_int) -> u32 =
        unsafe { std::mem::transmute(get_version) };
    let mut code: c_int = 0;
    // SAFETY: `code` is a valid int to write.
    if unsafe { get_version(&mut code) } != 0 {
        log_warn!("ncclGetVersion of {path_text} failed");
    }
    real.version_code = code;
    // Before the line below: the log reads NCCL's settings, whose files follow its version.
    crate::nccl_env::noted_version(code);
    let every_version = built_for_every_version();
    log_info!(
        "ncclshim {} ({}, build {}) forwarding to real NCCL {} at {path_text} (found by {})",
        env!("CARGO_PKG_VERSION"),
        abi_description(every_version, env!("NCCLSHIM_SPECS")),
        env!("NCCLSHIM_BUILD_FLAVOR"),
        real.version(),
        path.origin
    );
    // The build for every version exports functions that most releases lack, by design: each
    // such function warns when it is called (runtime::missing_function), not here. Patch
    // releases share their minor release's API (NCCL's codes: major * 10000 + minor * 100 +
    // patch).
    if !every_version && code / 100 < ABI_VERSION_CODE / 100 {
        log_warn!(
            "the real NCCL at {path_text} is version {}, older than the ABI this library exports ({ABI_VERSION}): functions it lacks return ncclInvalidUsage. Set NCCLSHIM_REAL_NCCL to a newer libnccl.so.2",
            real.version()
        );
    }
    Some(real)
}

/// Whether this is the build for every version (`make build NCCL_VERSION=all`), which exports
/// the union of every spec's functions rather than one release's ABI.
fn built_for_every_version() -> bool {
    env!("NCCLSHIM_BUILD_FLAVOR") == "all"
}

/// What the library exports, for the start-up line: one release's ABI, or, for the build for
/// every version, the range of the releases whose specs it was built from (`specs`: their paths,
/// `:`-separated, `.../nccl-2.18.3.rs`).
fn abi_description(every_version: bool, specs: &str) -> String {
    let releases = specs.split(':').filter_map(|path| {
        let name = path.rsplit('/').next()?;
        let version = name.strip_prefix("nccl-")?.strip_suffix(".rs")?;
        let parts: Option<Vec<u32>> = version.split('.').map(|n| n.parse().ok()).collect();
        Some((parts?, version))
    });
    let oldest = releases.clone().min_by(|a, b| a.0.cmp(&b.0));
    let newest = releases.max_by(|a, b| a.0.cmp(&b.0));
    match (every_version, oldest, newest) {
        (true, Some((_, oldest)), Some((_, newest))) => {
            format!("ABI of every NCCL from {oldest} to {newest}")
        }
        _ => format!("ABI of NCCL {ABI_VERSION}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_build_for_every_version_names_its_range_of_releases() {
        let specs = "/w/spec/nccl-2.18.3.rs:/w/spec/nccl-2.9.9.rs:/w/spec/nccl-2.32.3.rs:/w/spec/nccl-2.28.9.rs";
        assert_eq!(
            super::abi_description(true, specs),
            "ABI of every NCCL from 2.9.9 to 2.32.3"
        );
        assert_eq!(
            super::abi_description(false, specs),
            format!("ABI of NCCL {}", crate::ffi::ABI_VERSION)
        );
        assert_eq!(
            super::abi_description(true, ""),
            format!("ABI of NCCL {}", crate::ffi::ABI_VERSION)
        );
    }

    #[test]
    fn version_codes_read_like_nccl() {
        assert_eq!(super::version_text(22707), "2.27.7");
        assert_eq!(super::version_text(22809), "2.28.9");
        assert_eq!(super::version_text(2804), "2.8.4");
    }
}
