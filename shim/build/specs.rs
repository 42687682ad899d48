//! Which specs a build exports, from `NCCL_VERSION` (also compiled into tests/versions.rs).
//! `gen/spec-version.sh` decides which release's spec, as it does for the Makefile.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The release whose spec a build for `version` exports (`all` for every spec), and a note to
/// show where that is not the release asked for; an error saying what to do where there is none.
pub fn spec_release(workspace: &Path, version: &str) -> Result<(String, Option<String>), String> {
    let script = workspace.join("gen/spec-version.sh");
    let out = Command::new(&script)
        .arg(version)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let release = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let note = (release != version).then(|| {
        format!("NCCL {version} has no spec; building {release}'s ABI (the nearest: its minor release's)")
    });
    Ok((release, note))
}

/// The spec files of `release`: its own, or every one for `all`.
pub fn spec_files(spec_dir: &Path, release: &str) -> Result<Vec<PathBuf>, String> {
    if release != "all" {
        return Ok(vec![spec_dir.join(format!("nccl-{release}.rs"))]);
    }
    let mut all: Vec<PathBuf> = std::fs::read_dir(spec_dir)
        .map_err(|e| format!("{}: {e}", spec_dir.display()))?
        .map(|e| e.expect("spec/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    all.sort();
    Ok(all)
}
