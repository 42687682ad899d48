//! A program that closes the shim and opens `libnccl.so.2` again gets the shim again, not the
//! real NCCL the shim loaded behind itself (whose soname is also `libnccl.so.2`).

use std::path::Path;

use ncclshim_tests::{build_dir, compile_c, real_library, real_nccl, run, scratch, stdout_of};

/// The dynamic section's FLAGS_1 line (`readelf -d`).
fn flags_1(library: &Path) -> String {
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(library)
        .output()
        .expect("readelf runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("(FLAGS_1)"))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn reopening_libnccl_after_dlclose_finds_the_shim_again() {
    let dir = scratch("reloading");
    let lib = build_dir().join("lib");
    let shim = lib.join("libnccl.so.2").canonicalize().unwrap();
    // Kept loaded through dlclose: see shim/build.rs.
    assert!(flags_1(&shim).contains("NODELETE"), "{}", flags_1(&shim));

    let client = compile_c(
        "reload_client.c",
        &real_nccl("2.27.7").join("include"),
        &dir.join("reload_client"),
        &["-ldl"],
    );
    let real = real_library("2.27.7");
    let out = stdout_of(&run(
        &client,
        &[],
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
        ],
    ));
    let rounds: Vec<&str> = out.lines().filter(|l| l.starts_with("round ")).collect();
    assert_eq!(rounds.len(), 2, "{out}");
    for line in rounds {
        let file = line
            .split(" from ")
            .nth(1)
            .and_then(|rest| rest.split(" rc=").next())
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(
            Path::new(file).canonicalize().unwrap(),
            shim,
            "a round was answered by another library: {out}"
        );
        assert!(line.ends_with("rc=0 version=22707"), "{out}");
    }
}
