//! Picks the spec(s) to export (`NCCL_VERSION`, default 2.27.7; `all` for the union of every
//! spec) and the default real NCCL (`REAL_NCCL_LIB`), gives the library its SONAME, and compiles
//! the core's kernels ahead of time (build/kernels.rs).

use std::path::{Path, PathBuf};

// The kernels' program, its limits and types: the library's own modules, read here too so that
// the kernels built in are compiled exactly as the run time would compile them.
#[allow(dead_code)]
#[path = "src/core/fnv.rs"]
mod fnv;
#[allow(dead_code)]
#[path = "src/core/limits.rs"]
mod limits;
#[allow(dead_code)]
#[path = "src/core/program.rs"]
mod program;
#[allow(dead_code)]
#[path = "src/core/types.rs"]
mod types;

#[path = "build/kernels.rs"]
mod kernels;
#[path = "build/specs.rs"]
mod specs;

const DEFAULT_VERSION: &str = "2.27.7";

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace exists");
    let spec_dir = workspace.join("spec");
    println!("cargo:rerun-if-changed={}", spec_dir.display());
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("gen/spec-version.sh").display()
    );
    println!("cargo:rerun-if-env-changed=NCCL_VERSION");
    println!("cargo:rerun-if-env-changed=REAL_NCCL_LIB");

    let version = std::env::var("NCCL_VERSION").ok().filter(|v| !v.is_empty());
    let version = version.as_deref().unwrap_or(DEFAULT_VERSION);
    // The flavor: the release whose spec is exported, which the library then says it is.
    let (flavor, note) = specs::spec_release(&workspace, version).unwrap_or_else(|why| fail(&why));
    if let Some(note) = note {
        println!("cargo:warning={note}");
    }
    let specs = specs::spec_files(&spec_dir, &flavor).unwrap_or_else(|why| fail(&why));
    let joined: Vec<String> = specs.iter().map(|p| p.display().to_string()).collect();
    println!("cargo:rustc-env=NCCLSHIM_SPECS={}", joined.join(":"));
    println!("cargo:rustc-env=NCCLSHIM_BUILD_FLAVOR={flavor}");
    println!(
        "cargo:rustc-env=NCCLSHIM_BUILD_REAL_NCCL={}",
        std::env::var("REAL_NCCL_LIB").unwrap_or_default()
    );
    // Programs link against libnccl.so.2, as they do against NVIDIA's library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    // Never unloaded: after a dlclose, dlopen("libnccl.so.2") would match the soname of the real
    // NCCL the shim loaded (and keeps) and hand the program NVIDIA's library instead of ours.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(why) = kernels::build(&out_dir) {
        fail(&format!("building the core's kernels: {why}"));
    }
}

/// Stops the build with one message, not a panic's backtrace.
fn fail(why: &str) -> ! {
    eprintln!("error: {why}");
    std::process::exit(1);
}
