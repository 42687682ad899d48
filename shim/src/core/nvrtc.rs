//! Finding NVRTC for the core's kernels. cudarc loads it by name; where the loader cannot find
//! it by name, we open it first by absolute path (`NCCLSHIM_NVRTC`, the CUDA toolkit, the
//! Python environments' NVIDIA wheels), so that cudarc's lookup by name finds it loaded.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::locate::SearchEnv;

/// Makes NVRTC loadable, or says why it is not.
pub fn load() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(find_and_open).clone()
}

fn present() -> bool {
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn find_and_open() -> Result<(), String> {
    if present() {
        return Ok(());
    }
    let candidates = candidates();
    for path in &candidates {
        if !path.is_file() {
            continue;
        }
        let Some(text) = path.to_str() else { continue };
        // SAFETY: NVIDIA's NVRTC library; kept loaded for the life of the process.
        if let Ok(library) = unsafe { Library::open(Some(text), RTLD_NOW | RTLD_GLOBAL) } {
            std::mem::forget(library);
            if present() {
                return Ok(());
            }
        }
    }
    Err(format!(
        "NVRTC not found (looked for libnvrtc.so by name and at {}); set NCCLSHIM_NVRTC to its absolute path",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

fn candidates() -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Some(path) = crate::nccl_env::get_os("NCCLSHIM_NVRTC") {
        found.push(PathBuf::from(path));
    }
    let mut dirs = vec![
        PathBuf::from("/usr/local/cuda/lib64"),
        PathBuf::from("/usr/local/cuda/lib"),
    ];
    dirs.extend(
        SearchEnv::from_process()
            .python_package_dirs(&["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"]),
    );
    for dir in dirs {
        found.extend(nvrtc_files(&dir));
    }
    found
}

/// `libnvrtc.so.N` files in `dir`, newest first.
fn nvrtc_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .collect();
    files.sort();
    files.reverse();
    files
}
