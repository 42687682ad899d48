//! Picks the spec(s) to export (`NCCL_VERSION`, default 2.27.7; `all` for the union of every
//! spec) and the default real NCCL (`REAL_NCCL_LIB`), and gives the library its SONAME.

use std::path::{Path, PathBuf};

const DEFAULT_VERSION: &str = "2.27.7";

fn main() {
    let spec_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spec")
        .canonicalize()
        .expect("spec/ exists");
    println!("cargo:rerun-if-changed={}", spec_dir.display());
    println!("cargo:rerun-if-env-changed=NCCL_VERSION");
    println!("cargo:rerun-if-env-changed=REAL_NCCL_LIB");

    let version = std::env::var("NCCL_VERSION").ok().filter(|v| !v.is_empty());
    let version = version.as_deref().unwrap_or(DEFAULT_VERSION);
    let specs: Vec<PathBuf> = if version == "all" {
        let mut all: Vec<PathBuf> = std::fs::read_dir(&spec_dir)
            .expect("spec/ is readable")
            .map(|e| e.expect("spec/ entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .collect();
        all.sort();
        all
    } else {
        let path = spec_dir.join(format!("nccl-{version}.rs"));
        assert!(
            path.is_file(),
            "no spec for NCCL {version}: {} is missing (make spec NCCL_H=...)",
            path.display()
        );
        vec![path]
    };
    let joined: Vec<String> = specs.iter().map(|p| p.display().to_string()).collect();
    println!("cargo:rustc-env=NCCLSHIM_SPECS={}", joined.join(":"));
    println!("cargo:rustc-env=NCCLSHIM_BUILD_FLAVOR={version}");
    println!(
        "cargo:rustc-env=NCCLSHIM_BUILD_REAL_NCCL={}",
        std::env::var("REAL_NCCL_LIB").unwrap_or_default()
    );
    // Programs link against libnccl.so.2, as they do against NVIDIA's library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
