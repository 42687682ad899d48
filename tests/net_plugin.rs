//! The GPU suite's network plugin fixture (tests/gpu/net_socket_plugin.c), checked here without a
//! GPU: tests/c/net_plugin_driver.c drives it as NCCL's proxy does, from one thread and from one
//! thread per end, and checks every byte and size that comes through.

use std::process::Command;

use ncclshim_tests::{compile_c, run, scratch, stdout_of, workspace};

#[test]
fn the_socket_plugin_moves_every_message_without_blocking() {
    let dir = scratch("net-plugin");
    let gpu = workspace().join("tests/gpu");
    let plugin = dir.join("libnccl-net-shimtest.so");
    let status = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"])
        .arg(format!("-I{}", gpu.display()))
        .arg(gpu.join("net_socket_plugin.c"))
        .arg("-o")
        .arg(&plugin)
        .status()
        .unwrap();
    assert!(status.success(), "gcc failed on net_socket_plugin.c");
    let driver = compile_c(
        "net_plugin_driver.c",
        &gpu,
        &dir.join("net_plugin_driver"),
        &["-ldl"],
    );
    for (mode, says) in [("one", "ok one thread"), ("threads", "ok threads")] {
        let out = stdout_of(&run(&driver, &[plugin.to_str().unwrap(), mode], &[]));
        assert!(out.contains("NET/shimtest : ready"), "{out}");
        assert!(
            out.contains(&format!("{says}: 5 sizes both ways, up to 8388608 bytes")),
            "{out}"
        );
    }
}
