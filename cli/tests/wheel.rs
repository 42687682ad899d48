//! The wheel `make wheel` builds, as a user gets it: installed with pip into a fresh virtual
//! environment beside NVIDIA's NCCL wheel, then `ncclshim doctor` and a C client run with the
//! shim in front (`ncclshim run`), with nothing but the environment's own files to go by.
//! `make test` builds the wheel first and names its folder in NCCLSHIM_WHEEL_DIR.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ncclshim_tests::{compile_c, link_nccl, real_nccl, scratch};

/// The newest file in `dir` whose name starts with `prefix` and ends with `.whl`.
fn wheel_in(dir: &Path, prefix: &str) -> PathBuf {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(".whl")
        })
        .collect();
    wheels.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    wheels
        .pop()
        .unwrap_or_else(|| panic!("no {prefix}*.whl in {}", dir.display()))
}

fn checked(output: Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

/// A program of the virtual environment, run with an environment that points nowhere else.
fn in_venv(venv: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(venv.join("bin").join(program))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn the_wheel_installs_with_pip_and_finds_nccl_in_its_environment() {
    let dir = std::env::var_os("NCCLSHIM_WHEEL_DIR")
        .map(PathBuf::from)
        .expect("NCCLSHIM_WHEEL_DIR names the folder of `make wheel`'s wheel (make test sets it)");
    let ours = wheel_in(&dir, "ncclshim-");
    // NVIDIA's NCCL 2.28.9 wheel, as the tests' fetcher keeps it.
    let nccl = real_nccl("2.28.9");
    let cache = nccl.ancestors().nth(3).unwrap().join("wheels");
    let nvidia = wheel_in(&cache, "nvidia_nccl_cu12-2.28.9-");

    let scratch = scratch("cli-wheel");
    let venv = scratch.join("venv");
    let _ = std::fs::remove_dir_all(&venv);
    checked(
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .unwrap(),
        "python3 -m venv",
    );
    checked(
        in_venv(
            &venv,
            "pip",
            &[
                "install",
                "-q",
                "--no-index",
                ours.to_str().unwrap(),
                nvidia.to_str().unwrap(),
            ],
            &[],
        ),
        "pip install",
    );
    let packages = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .map(|e| e.unwrap().path().join("site-packages"))
        .find(|p| p.is_dir())
        .unwrap();

    let said = checked(
        in_venv(&venv, "ncclshim", &["doctor"], &[]),
        "ncclshim doctor",
    );
    let shim = packages.join("ncclshim/lib/libnccl.so.2");
    let real = packages.join("nvidia/nccl/lib/libnccl.so.2");
    assert!(
        said.contains(&format!(
            "the shim: {} (exports the API of every NCCL version with a spec)",
            shim.display()
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "the real NCCL: {} (2.28.9), found by searching",
            real.display()
        )),
        "{said}"
    );

    // A C client built against NVIDIA's NCCL, run with the shim in front.
    let client = compile_c(
        "api_client.c",
        &nccl.join("include"),
        &scratch.join("api_client"),
        &link_nccl(&nccl.join("lib")),
    );
    let out = checked(
        in_venv(
            &venv,
            "ncclshim",
            &["run", "--", client.to_str().unwrap()],
            &[("NCCL_DEBUG", "INFO")],
        ),
        "ncclshim run -- api_client",
    );
    assert!(out.contains("ncclGetVersion: rc=0 version=22809"), "{out}");
    assert!(
        out.contains(&format!(
            "forwarding to real NCCL 2.28.9 at {}",
            real.display()
        )),
        "{out}"
    );
}
