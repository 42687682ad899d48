//! Regenerating a committed spec from NVIDIA's header gives the committed file, byte for byte.

use std::process::Command;

use ncclshim_tests::{real_nccl, scratch, workspace};

#[test]
fn regenerating_2_27_7_gives_the_committed_spec() {
    let header = real_nccl("2.27.7").join("include/nccl.h");
    let out_dir = scratch("spec-regeneration");
    let status = Command::new(env!("CARGO"))
        .args([
            "run",
            "--quiet",
            "--locked",
            "-p",
            "ncclshim-gen",
            "--",
            "spec",
        ])
        .arg(&header)
        .arg(&out_dir)
        .current_dir(workspace())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "ncclshim-gen failed");
    let fresh = std::fs::read(out_dir.join("nccl-2.27.7.rs")).unwrap();
    let committed = std::fs::read(workspace().join("spec/nccl-2.27.7.rs")).unwrap();
    assert!(
        fresh == committed,
        "spec/nccl-2.27.7.rs differs from what ncclshim-gen makes of NVIDIA's header"
    );
}
