//! The two libraries a job needs: the shim (which build, which NCCL ABI it exports) and the real
//! NCCL it forwards to (found as the shim finds it, in this process's environment).

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use nccl::identity::is_ncclshim;
use nccl::locate::{self, Found, NotFound, SearchEnv};

/// The prefix this program is installed under (`PREFIX/bin/ncclshim`): a build folder, an
/// installation, or a Python environment.
fn own_prefix() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// The search environment of the shim, with this program's prefix searched first as a Python
/// environment (where `pip install ncclshim[cu12]` puts NVIDIA's NCCL beside the shim), or as
/// the packages folder it was installed into with `pip install --target`.
fn search_env() -> SearchEnv {
    let mut env = SearchEnv::from_process();
    if let Some(prefix) = own_prefix() {
        // Installed with `pip install --target DIR`: the packages in DIR, this program in DIR/bin.
        if prefix.join("ncclshim/lib/libnccl.so.2").exists() {
            env.own_packages = Some(prefix.clone());
        }
        env.python_prefixes.retain(|p| *p != prefix);
        env.python_prefixes.insert(0, prefix);
    }
    env
}

/// The shim's library: `--shim`, `$NCCLSHIM_LIB`, `../lib/libnccl.so.2` beside this program
/// (`make build`, `make install`), or the `ncclshim` package of its Python environment (the
/// wheel), or beside it (the wheel installed with `pip install --target DIR`: the package in
/// DIR, this program in DIR/bin).
pub fn find_shim(chosen: Option<PathBuf>) -> Result<PathBuf, String> {
    let beside = || {
        let prefix = own_prefix()?;
        let installed = prefix.join("lib/libnccl.so.2");
        if installed.exists() {
            return Some(installed);
        }
        let targeted = prefix.join("ncclshim/lib/libnccl.so.2");
        if targeted.exists() {
            return Some(targeted);
        }
        let env = SearchEnv {
            python_prefixes: vec![prefix],
            ..SearchEnv::default()
        };
        let packaged = env
            .python_package_dirs(&["ncclshim/lib"])
            .into_iter()
            .next()?;
        Some(packaged.join("libnccl.so.2"))
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

/// The NCCL API a shim build exports ("2.28.9", or "all" for the build for every version), as
/// the build wrote it into its library (the shim's ncclGetVersion answers the real NCCL's).
pub fn shim_abi(shim: &Path) -> Option<String> {
    nccl::identity::build_flavor(shim)
}

/// The real NCCL, as the shim would find it here.
pub fn find_real() -> Result<Found, NotFound> {
    locate::find_real_nccl(&search_env(), is_ncclshim)
}

/// What the library at `path` answers to ncclGetVersion, as a code such as 22809.
pub fn nccl_version(path: &Path) -> Result<i32, String> {
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
    Ok(code)
}

/// Orders "2.27.7" against "2.28.9".
pub fn version_key(text: &str) -> Vec<u32> {
    text.split('.').filter_map(|p| p.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl::version_text;

    #[test]
    fn versions_read_both_encodings() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(2708), "2.7.8");
        assert!(version_key("2.27.7") < version_key("2.28.9"));
        assert_eq!(shim_abi(Path::new("/bin/sh")), None);
    }
}
