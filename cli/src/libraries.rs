//! The two libraries a job needs: the shim (which build, which NCCL ABI it exports) and the real
//! NCCL it forwards to (found as the shim finds it, in this process's environment).

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use nccl::identity::is_ncclshim;
use nccl::locate::{self, Found, NotFound, SearchEnv};

/// The shim's library: `--shim`, `$NCCLSHIM_LIB`, or `../lib/libnccl.so.2` beside this program.
pub fn find_shim(chosen: Option<PathBuf>) -> Result<PathBuf, String> {
    let beside = || {
        let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
        Some(exe.parent()?.parent()?.join("lib/libnccl.so.2"))
    };
    let (path, how) = match chosen {
        Some(path) => (path, "--shim"),
        None => match std::env::var_os("NCCLSHIM_LIB").filter(|v| !v.is_empty()) {
            Some(path) => (PathBuf::from(path), "NCCLSHIM_LIB"),
            None => (
                beside().unwrap_or_else(|| PathBuf::from("lib/libnccl.so.2")),
                "beside this program",
            ),
        },
    };
    let path = path.canonicalize().map_err(|e| {
        format!(
            "the shim's library ({how}: {}): {e}; fix: pass --shim PATH/libnccl.so.2 or set NCCLSHIM_LIB (`make build` puts it in build/lib)",
            path.display()
        )
    })?;
    if !is_ncclshim(&path) {
        return Err(format!(
            "{} ({how}) is not ncclshim; fix: pass --shim PATH to the shim's libnccl.so.2",
            path.display()
        ));
    }
    Ok(path)
}

/// The NCCL ABI a shim build exports, from its file name (`libnccl.so.<version>`, links
/// resolved): the shim's own ncclGetVersion answers the real NCCL's version.
pub fn shim_abi(shim: &Path) -> Option<String> {
    let name = shim.file_name()?.to_str()?;
    let version = name.strip_prefix("libnccl.so.")?;
    (version.split('.').count() == 3).then(|| version.to_string())
}

/// The real NCCL, as the shim would find it here.
pub fn find_real() -> Result<Found, NotFound> {
    locate::find_real_nccl(&SearchEnv::from_process(), is_ncclshim)
}

/// What the library at `path` answers to ncclGetVersion, as "2.28.9".
pub fn nccl_version(path: &Path) -> Result<String, String> {
    let text = path.to_str().ok_or("not a UTF-8 path")?;
    // SAFETY: NVIDIA's NCCL, opened by absolute path; nothing of it runs at load but its own
    // initialisers. Kept loaded: unloading NCCL is not something it is made for.
    let library =
        unsafe { Library::open(Some(text), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    // SAFETY: ncclGetVersion has this signature in every NCCL release.
    let get_version =
        unsafe { library.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion") }
            .map_err(|e| e.to_string())?;
    let mut code: c_int = 0;
    // SAFETY: one int to write.
    let result = unsafe { get_version(&mut code) };
    std::mem::forget(library);
    if result != 0 {
        return Err(format!("ncclGetVersion returned {result}"));
    }
    Ok(version_text(code))
}

/// NCCL's version code as "major.minor.patch" (the code's encoding changed after 2.8).
pub fn version_text(code: c_int) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code / 100 % 10, code % 100)
    }
}

/// Orders "2.27.7" against "2.28.9".
pub fn version_key(text: &str) -> Vec<u32> {
    text.split('.').filter_map(|p| p.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_both_encodings() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(2708), "2.7.8");
        assert!(version_key("2.27.7") < version_key("2.28.9"));
        assert_eq!(
            shim_abi(Path::new("/x/libnccl.so.2.28.9")).as_deref(),
            Some("2.28.9")
        );
        assert_eq!(shim_abi(Path::new("/x/libnccl.so.2")), None);
    }
}
