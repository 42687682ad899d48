//! The wheel `make wheel` builds, as a user gets it: installed with pip into a fresh virtual
//! environment beside NVIDIA's NCCL wheel, then `ncclshim doctor` and a C client run with the
//! shim in front (`ncclshim run`), with nothing but the environment's own files to go by; and
//! tagged for the glibc its files need, an old one, as auditwheel and readelf read them.
//! `make test` builds the wheel first and names its folder in NCCLSHIM_WHEEL_DIR.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ncclshim_tests::{compile_c, fetched, link_nccl, real_nccl, scratch, workspace};

/// The newest glibc the wheel may need: RHEL 8's and its rebuilds', the oldest of the systems
/// GPU clusters commonly run (NVIDIA's NCCL wheels need 2.17).
const NEWEST_GLIBC_ALLOWED: [u32; 2] = [2, 28];

/// The files in `dir` whose names start with `prefix` and end with `.whl`, oldest first (none
/// where `dir` is not there).
fn wheels_in(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(".whl")
        })
        .collect();
    wheels.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    wheels
}

/// The newest file in `dir` whose name starts with `prefix` and ends with `.whl`.
fn wheel_in(dir: &Path, prefix: &str) -> PathBuf {
    wheels_in(dir, prefix)
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

/// NVIDIA's NCCL wheel of `version`: the one the tests' fetcher kept whole (where PyPI answered
/// no range requests), else one made in `dir` from the files it fetched from that wheel (all of
/// `nvidia/nccl/`, laid out as there), with the wheel's name and metadata: pip installs the same
/// files from it, without the wheel's 300 MB downloaded again.
fn nvidia_nccl_wheel(version: &str, dir: &Path) -> PathBuf {
    let nccl = real_nccl(version);
    let kept = nccl.ancestors().nth(3).unwrap().join("wheels");
    let prefix = format!("nvidia_nccl_cu12-{version}-");
    if let Some(wheel) = wheels_in(&kept, &prefix).pop() {
        return wheel;
    }
    let root = nccl.ancestors().nth(2).unwrap();
    let wheel = dir.join(format!("{prefix}py3-none-manylinux2014_x86_64.whl"));
    checked(
        Command::new("python3")
            .args(["-c", MAKE_WHEEL])
            .arg(root)
            .arg(&wheel)
            .arg(version)
            .arg(workspace().join("gen/make-wheel.py"))
            .output()
            .unwrap(),
        "making NVIDIA's NCCL wheel from its fetched files",
    );
    wheel
}

/// python3 -c MAKE_WHEEL ROOT WHEEL VERSION MAKE_WHEEL_PY: `ROOT/nvidia/` and a dist-info into
/// WHEEL, stored (not compressed: it is installed once, then removed), its RECORD written as
/// gen/make-wheel.py (MAKE_WHEEL_PY) writes ours.
const MAKE_WHEEL: &str = r#"
import importlib.util, os, sys, zipfile
root, wheel, version, make_wheel_py = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("make_wheel", make_wheel_py)
make_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_wheel)
info = f"nvidia_nccl_cu12-{version}.dist-info"
records = []
def add(z, name, data):
    z.writestr(name, data)
    records.append(make_wheel.record_line(name, data))
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
    for folder, _, files in sorted(os.walk(os.path.join(root, "nvidia"))):
        for file in sorted(files):
            path = os.path.join(folder, file)
            with open(path, "rb") as f:
                add(z, os.path.relpath(path, root), f.read())
    add(z, f"{info}/METADATA", f"Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: {version}\n".encode())
    add(z, f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: ncclshim-tests\nRoot-Is-Purelib: true\nTag: py3-none-manylinux2014_x86_64\n")
    z.writestr(f"{info}/RECORD", "\n".join(records + [f"{info}/RECORD,,"]) + "\n")
"#;

/// The wheel `make wheel` left in NCCLSHIM_WHEEL_DIR.
fn built_wheel() -> PathBuf {
    let dir = std::env::var_os("NCCLSHIM_WHEEL_DIR")
        .map(PathBuf::from)
        .expect("NCCLSHIM_WHEEL_DIR names the folder of `make wheel`'s wheel (make test sets it)");
    wheel_in(&dir, "ncclshim-")
}

/// The glibc version, as numbers, that a wheel's name says it needs: that of its first platform
/// tag, `manylinux_X_Y_x86_64`.
fn tagged_glibc(wheel: &Path) -> Vec<u32> {
    let name = wheel.file_stem().unwrap().to_str().unwrap();
    let first_tag = name.rsplit('-').next().unwrap().split('.').next().unwrap();
    first_tag
        .strip_prefix("manylinux_")
        .and_then(|tag| tag.strip_suffix("_x86_64"))
        .unwrap_or_else(|| panic!("{name}: its first platform tag is not manylinux_X_Y_x86_64"))
        .split('_')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Every file under `dir`, in its subfolders too.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .flat_map(|p| if p.is_dir() { files_under(&p) } else { vec![p] })
        .collect()
}

fn is_elf(path: &Path) -> bool {
    std::fs::read(path).unwrap().starts_with(b"\x7fELF")
}

/// The GLIBC_ symbol versions, as numbers, that the ELF file at `path` needs: the names in the
/// version needs section `readelf -V` prints.
fn glibc_versions_needed(path: &Path) -> Vec<Vec<u32>> {
    let said = checked(
        Command::new("readelf")
            .arg("-VW")
            .arg(path)
            .output()
            .unwrap(),
        "readelf -V",
    );
    said.lines()
        .skip_while(|line| !line.starts_with("Version needs section"))
        .filter_map(|line| line.split("Name: GLIBC_").nth(1))
        .map(|rest| {
            let version = rest.split_whitespace().next().unwrap();
            version.split('.').map(|n| n.parse().unwrap()).collect()
        })
        .collect()
}

fn dotted(version: &[u32]) -> String {
    version
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

#[test]
fn the_wheel_is_tagged_for_the_old_glibc_its_files_need() {
    let wheel = built_wheel();
    let glibc = tagged_glibc(&wheel);
    assert!(
        glibc.as_slice() <= NEWEST_GLIBC_ALLOWED.as_slice(),
        "{} is for glibc {} or newer: RHEL 8 (2.28) cannot install it",
        wheel.display(),
        dotted(&glibc)
    );

    // auditwheel finds the same tag: the files need this glibc, and no more.
    let tools = fetched("gen/fetch-wheel-tools.sh", &[]);
    let shown = checked(
        Command::new(tools.join("auditwheel"))
            .arg("show")
            .arg(&wheel)
            .output()
            .unwrap(),
        "auditwheel show",
    );
    let shown = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    let tag = format!("manylinux_{}_{}_x86_64", glibc[0], glibc[1]);
    assert!(
        shown.contains(&format!(
            "is consistent with the following platform tag: \"{tag}\""
        )),
        "{shown}"
    );

    // readelf, on every ELF file of the wheel: no GLIBC_ symbol version newer than the tag's.
    let unpacked = scratch("cli-wheel-files");
    checked(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpacked)
            .output()
            .unwrap(),
        "python3 -m zipfile -e",
    );
    let elf_files: Vec<PathBuf> = files_under(&unpacked)
        .into_iter()
        .filter(|p| is_elf(p))
        .collect();
    assert_eq!(
        elf_files.len(),
        2,
        "the library and the command: {elf_files:?}"
    );
    for file in elf_files {
        let needed = glibc_versions_needed(&file);
        assert!(
            !needed.is_empty(),
            "readelf -V shows no GLIBC_ version {file:?} needs"
        );
        let newer: Vec<String> = needed
            .iter()
            .filter(|v| **v > glibc)
            .map(|v| format!("GLIBC_{}", dotted(v)))
            .collect();
        assert!(
            newer.is_empty(),
            "{} needs {}, newer than its tag {tag}",
            file.display(),
            newer.join(", ")
        );
    }
}

#[test]
fn the_wheel_installs_with_pip_and_finds_nccl_in_its_environment() {
    let ours = built_wheel();
    let scratch = scratch("cli-wheel");
    let nccl = real_nccl("2.28.9");
    let nvidia = nvidia_nccl_wheel("2.28.9", &scratch);
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
    // Built for an old glibc, still with the kernels compiled in (the command holds the
    // library's crate, from the same build).
    assert!(said.contains("kernels built in for sm_"), "{said}");
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
