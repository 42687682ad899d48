//! The reentrancy guard: calls that the real NCCL makes to its own exports, landing in ncclshim
//! on a thread already inside it, go straight to the real NCCL (never through the router, never
//! waiting for a load under way); and many threads at once, from the first call, get right
//! answers.

use std::process::Command;

use ncclshim_tests::{
    compile_c, link_shim, real_library, real_nccl, run, scratch, stdout_of, workspace,
};

fn threads_client(dir: &std::path::Path) -> std::path::PathBuf {
    let include = real_nccl("2.27.7").join("include");
    compile_c(
        "threads_client.c",
        &include,
        &dir.join("threads_client"),
        &link_shim(),
    )
}

#[test]
fn nested_calls_from_the_real_library_go_straight_back_to_it() {
    let dir = scratch("reentrancy-nested");
    let fake = dir.join("libfake_nccl.so");
    let status = Command::new("gcc")
        .args(["-O0", "-fPIC", "-shared", "-Wall", "-Werror"])
        .arg(format!(
            "-I{}",
            real_nccl("2.27.7").join("include").display()
        ))
        .arg(format!(
            "-I{}",
            workspace().join("gen/cuda-stand-ins").display()
        ))
        .arg(workspace().join("tests/c/fake_nccl.c"))
        .arg("-o")
        .arg(&fake)
        .status()
        .unwrap();
    assert!(status.success(), "gcc failed on fake_nccl.c");
    let client = threads_client(&dir);
    let out = run(
        &client,
        &["fake", "22707"],
        &[("NCCLSHIM_REAL_NCCL", fake.to_str().unwrap())],
    );
    let out = stdout_of(&out);
    let lines: Vec<&str> = out.lines().collect();
    // Loading the fake made it call back into the shim (from its ncclGetVersion): no deadlock,
    // and the version it then reported came through.
    assert_eq!(lines[0], "missing function: rc=5", "{out}");
    assert!(
        lines[1].starts_with("application's last error: ncclCommShrink is not available"),
        "{out}"
    );
    assert_eq!(
        lines[2], "nested call reached the real library: rc=0 count=1",
        "{out}"
    );
    assert_eq!(lines[3], "threads=8 calls=160000 wrong=0", "{out}");
}

#[test]
fn many_threads_from_the_first_call_get_the_real_answers() {
    let dir = scratch("reentrancy-threads");
    let client = threads_client(&dir);
    let real = real_library("2.27.7");
    for _ in 0..3 {
        let out = stdout_of(&run(
            &client,
            &["real", "22707"],
            &[("NCCLSHIM_REAL_NCCL", real.to_str().unwrap())],
        ));
        assert_eq!(out.trim(), "threads=8 calls=160000 wrong=0");
    }
}
