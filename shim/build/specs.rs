//! Which specs a build exports, from `NCCL_VERSION` (also compiled into tests/versions.rs).

use std::path::{Path, PathBuf};

/// The specs to export for `version` and the build's name for them: every spec for `all`;
/// a release's own spec; or, for a patch release without one (2.27.5), its minor release's
/// newest spec (2.27.7), whose ABI it shares.
pub fn specs_of(spec_dir: &Path, version: &str) -> Result<(String, Vec<PathBuf>), String> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(spec_dir)
        .map_err(|e| format!("{}: {e}", spec_dir.display()))?
        .map(|e| e.expect("spec/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    all.sort();
    if version == "all" {
        return Ok((version.to_string(), all));
    }
    let release_of = |p: &PathBuf| {
        let stem = p.file_stem()?.to_str()?;
        Some(stem.strip_prefix("nccl-")?.to_string())
    };
    let releases: Vec<String> = all.iter().filter_map(release_of).collect();
    if releases.iter().any(|r| r == version) {
        return Ok((
            version.to_string(),
            vec![spec_dir.join(format!("nccl-{version}.rs"))],
        ));
    }
    let minor = |v: &str| v.rsplit_once('.').map(|(m, _)| m.to_string());
    let same_minor = releases
        .iter()
        .filter(|r| minor(r).is_some() && minor(r) == minor(version))
        .max_by_key(|r| r.rsplit('.').next().and_then(|p| p.parse::<u32>().ok()));
    match same_minor {
        Some(release) => {
            println!(
                "cargo:warning=no spec for NCCL {version}: exporting the ABI of {release}, the spec of its minor release"
            );
            Ok((
                release.clone(),
                vec![spec_dir.join(format!("nccl-{release}.rs"))],
            ))
        }
        None => Err(format!(
            "no spec for NCCL {version}. Specs: {} (a patch release uses its minor release's; `all` exports every one). For another release: make spec NCCL_VERSION={version}",
            releases.join(", ")
        )),
    }
}
