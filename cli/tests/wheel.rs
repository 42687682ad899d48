//! The wheel `make wheel` builds, as a user gets it: installed with pip into a fresh virtual
//! environment beside NVIDIA's NCCL wheel, then `ncclshim doctor` and a C client run with the
//! shim in front (`ncclshim run`), with nothing but the environment's own files to go by; and
//! tagged for the glibc its files need, an old one, as auditwheel and readelf read them. The
//! wheel for aarch64 (Grace Hopper, Grace Blackwell), built on x86_64 across: tagged alike,
//! taken by pip for an aarch64 machine, and its library and command run under qemu with C
//! clients built for aarch64. `make test` builds the wheels first and names their folder in
//! NCCLSHIM_WHEEL_DIR.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ncclshim_tests::{
    EMPTY_CALLS_ANSWERED, compile_c, compile_c_with, fetched, link_nccl, real_nccl, scratch,
    workspace,
};

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

/// A fresh virtual environment at `venv`, and in it `pip install -q --no-index ARGS` (`what`
/// names it where it fails).
fn pip_install_in_new_venv(venv: &Path, args: &[&str], what: &str) {
    let _ = std::fs::remove_dir_all(venv);
    checked(
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .output()
            .unwrap(),
        "python3 -m venv",
    );
    let mut install = vec!["install", "-q", "--no-index"];
    install.extend_from_slice(args);
    checked(in_venv(venv, "pip", &install, &[]), what);
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
    let wheel = dir.join(format!("{prefix}py3-none-manylinux2014_{ARCH}.whl"));
    checked(
        Command::new("python3")
            .args(["-c", MAKE_WHEEL])
            .arg(root)
            .arg(&wheel)
            .arg(version)
            .arg(workspace().join("gen/make-wheel.py"))
            .arg(ARCH)
            .output()
            .unwrap(),
        "making NVIDIA's NCCL wheel from its fetched files",
    );
    wheel
}

/// python3 -c MAKE_WHEEL ROOT WHEEL VERSION MAKE_WHEEL_PY ARCH: `ROOT/nvidia/` and a dist-info into
/// WHEEL, stored (not compressed: it is installed once, then removed), its RECORD written as
/// gen/make-wheel.py (MAKE_WHEEL_PY) writes ours.
const MAKE_WHEEL: &str = r#"
import importlib.util, os, sys, zipfile
root, wheel, version, make_wheel_py, arch = sys.argv[1:6]
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
    add(z, f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: ncclshim-tests\nRoot-Is-Purelib: true\nTag: py3-none-manylinux2014_{arch}\n".encode())
    z.writestr(f"{info}/RECORD", "\n".join(records + [f"{info}/RECORD,,"]) + "\n")
"#;

/// This machine's processor, as wheels' tags name it: `make wheel` builds its wheel.
const ARCH: &str = std::env::consts::ARCH;

/// The folder `make test` left its wheels in (NCCLSHIM_WHEEL_DIR).
fn wheel_dir() -> PathBuf {
    std::env::var_os("NCCLSHIM_WHEEL_DIR")
        .map(PathBuf::from)
        .expect("NCCLSHIM_WHEEL_DIR names the folder of `make wheel`'s wheel (make test sets it)")
}

/// The wheel `make wheel` left in NCCLSHIM_WHEEL_DIR for processor `arch`.
fn built_wheel(arch: &str) -> PathBuf {
    let mut wheels = wheels_in(&wheel_dir(), "ncclshim-");
    wheels.retain(|w| w.to_string_lossy().ends_with(&format!("_{arch}.whl")));
    wheels
        .pop()
        .unwrap_or_else(|| panic!("no ncclshim-*_{arch}.whl in {}", wheel_dir().display()))
}

/// The aarch64 wheel, or `None` (said) where `make test` could not build it here
/// (`dist/aarch64-skipped` says why: not an x86_64 host, or no Rust standard library for
/// aarch64 to be had).
fn aarch64_wheel() -> Option<PathBuf> {
    let skipped = wheel_dir().join("aarch64-skipped");
    if let Ok(why) = std::fs::read_to_string(&skipped) {
        eprintln!("the aarch64 wheel is not tested here: {}", why.trim());
        return None;
    }
    Some(built_wheel("aarch64"))
}

/// The glibc version, as numbers, that a wheel's name says it needs: that of its first platform
/// tag, `manylinux_X_Y_ARCH`.
fn tagged_glibc(wheel: &Path, arch: &str) -> Vec<u32> {
    let name = wheel.file_stem().unwrap().to_str().unwrap();
    let first_tag = name.rsplit('-').next().unwrap().split('.').next().unwrap();
    first_tag
        .strip_prefix("manylinux_")
        .and_then(|tag| tag.strip_suffix(&format!("_{arch}")))
        .unwrap_or_else(|| panic!("{name}: its first platform tag is not manylinux_X_Y_{arch}"))
        .split('_')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// ELF's `e_machine` of each processor a wheel is for.
fn elf_machine(arch: &str) -> u16 {
    match arch {
        "x86_64" => 62,
        "aarch64" => 183,
        _ => panic!("no wheel is made for {arch}"),
    }
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

/// `wheel`, for processor `arch`: tagged for an old glibc, the one its files need, as auditwheel
/// and readelf read them; both its files are for `arch`.
fn check_tags(wheel: &Path, arch: &str) {
    let glibc = tagged_glibc(wheel, arch);
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
            .arg(wheel)
            .output()
            .unwrap(),
        "auditwheel show",
    );
    let shown = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    let tag = format!("manylinux_{}_{}_{arch}", glibc[0], glibc[1]);
    assert!(
        shown.contains(&format!(
            "is consistent with the following platform tag: \"{tag}\""
        )),
        "{shown}"
    );

    // readelf, on every ELF file of the wheel: no GLIBC_ symbol version newer than the tag's.
    let unpacked = scratch(&format!("cli-wheel-files-{arch}"));
    checked(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(wheel)
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
        let header = std::fs::read(&file).unwrap();
        let machine = u16::from_le_bytes([header[0x12], header[0x13]]);
        assert_eq!(
            machine,
            elf_machine(arch),
            "{} is not for {arch}",
            file.display()
        );
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
fn the_wheel_is_tagged_for_the_old_glibc_its_files_need() {
    check_tags(&built_wheel(ARCH), ARCH);
}

#[test]
fn the_aarch64_wheel_is_tagged_for_the_old_glibc_and_the_processor_its_files_need() {
    if let Some(wheel) = aarch64_wheel() {
        check_tags(&wheel, "aarch64");
    }
}

#[test]
fn the_wheel_installs_with_pip_and_finds_nccl_in_its_environment() {
    let ours = built_wheel(ARCH);
    let scratch = scratch("cli-wheel");
    let nccl = real_nccl("2.28.9");
    let nvidia = nvidia_nccl_wheel("2.28.9", &scratch);
    let venv = scratch.join("venv");
    pip_install_in_new_venv(
        &venv,
        &[ours.to_str().unwrap(), nvidia.to_str().unwrap()],
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

    // Preloaded by its path, with nothing pointing at its environment (not active, not on PATH,
    // no NCCLSHIM_REAL_NCCL): the library finds NVIDIA's NCCL beside its own package.
    let out = checked(
        Command::new(&client)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LD_PRELOAD", &shim)
            .env("NCCL_DEBUG", "INFO")
            .output()
            .unwrap(),
        "api_client with the shim preloaded",
    );
    assert!(
        out.contains(&format!(
            "forwarding to real NCCL 2.28.9 at {} (found by searching)",
            real.display()
        )),
        "{out}"
    );
}

/// Where Debian's libc6-arm64-cross puts aarch64's glibc: qemu's root for the dynamic loader.
const AARCH64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// Compiles `tests/c/<source>` for aarch64 (glibc 2.17) with zig's C compiler (the wheel's tools)
/// into `out`, with `args` besides.
fn compile_c_for_aarch64(tools: &Path, source: &str, out: &Path, args: &[&str]) -> PathBuf {
    let mut zig_cc = Command::new(tools.join("python"));
    zig_cc.args(["-m", "ziglang", "cc", "-target", "aarch64-linux-gnu.2.17"]);
    let include = real_nccl("2.27.7").join("include");
    compile_c_with(zig_cc, source, &include, out, args)
}

/// Runs the aarch64 `program` under qemu with only `env` (and the loader's root).
fn under_qemu(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("qemu-aarch64")
        .arg(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("QEMU_LD_PREFIX", AARCH64_SYSROOT)
        .envs(env.iter().copied())
        .output()
        .expect("qemu-aarch64 runs (make test installs qemu-user)")
}

/// The aarch64 wheel as pip installs it for an aarch64 machine, and then at work: the library
/// loads, forwards every call to a stand-in NCCL built for aarch64 (from one thread and from
/// several), answers calls of no elements and logs them, and counts the calls for the exit
/// summary; the command says which shim it found and its kernels.
#[test]
fn the_aarch64_wheel_installs_for_aarch64_and_forwards_under_qemu() {
    let Some(wheel) = aarch64_wheel() else {
        return;
    };
    let scratch = scratch("cli-wheel-aarch64");
    let site = scratch.join("site");
    pip_install_in_new_venv(
        &scratch.join("venv"),
        &[
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_aarch64",
            "--target",
            site.to_str().unwrap(),
            wheel.to_str().unwrap(),
        ],
        "pip install for aarch64",
    );
    let shim_dir = site.join("ncclshim/lib");
    let tools = fetched("gen/fetch-wheel-tools.sh", &[]);
    let fake = compile_c_for_aarch64(
        &tools,
        "fake_operations_nccl.c",
        &scratch.join("libfake_operations_nccl.so"),
        &["-shared", "-fPIC"],
    );
    // Linked as programs link NCCL (-lnccl), against the wheel's library.
    let link = scratch.join("link");
    std::fs::create_dir_all(&link).unwrap();
    std::os::unix::fs::symlink(shim_dir.join("libnccl.so.2"), link.join("libnccl.so")).unwrap();
    let client = compile_c_for_aarch64(
        &tools,
        "calls_client.c",
        &scratch.join("calls_client"),
        &[&format!("-L{}", link.display()), "-lnccl", "-lpthread"],
    );
    // The stand-in where `pip install --target` puts NVIDIA's NCCL: beside the shim's package.
    let beside = site.join("nvidia/nccl/lib");
    std::fs::create_dir_all(&beside).unwrap();
    std::fs::copy(&fake, beside.join("libnccl.so.2")).unwrap();
    let out = checked(
        under_qemu(
            &client,
            &["empty"],
            &[
                ("LD_LIBRARY_PATH", shim_dir.to_str().unwrap()),
                ("NCCL_DEBUG", "INFO"),
            ],
        ),
        "calls_client empty, NCCL found beside",
    );
    assert!(
        out.contains(&format!(
            "at {}/libnccl.so.2 (found by searching)",
            beside.display()
        )),
        "{out}"
    );
    let (shim_dir, fake) = (shim_dir.to_str().unwrap(), fake.to_str().unwrap());
    let env = [("LD_LIBRARY_PATH", shim_dir), ("NCCLSHIM_REAL_NCCL", fake)];

    // Calls of no elements: answered, and logged as NCCL logs its calls; the rest forwarded.
    let mut logged = env.to_vec();
    logged.extend([
        ("FAKE_NCCL_GROUPS", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "COLL"),
    ]);
    let out = checked(
        under_qemu(&client, &["empty"], &logged),
        "calls_client empty",
    );
    let printed: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("NCCL INFO") && !l.contains("NCCL WARN"))
        .collect();
    assert_eq!(printed, EMPTY_CALLS_ANSWERED, "{out}");
    let coll_lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("[ncclshim] NCCL INFO ") && l.contains(": opCount "))
        .collect();
    assert_eq!(coll_lines.len(), 3, "{out}");
    assert!(
        coll_lines[2].ends_with(
            "Broadcast: opCount 0 sendbuff (nil) recvbuff (nil) count 0 datatype 7 op 0 root 1 \
             comm 0x1000 [nranks=2] stream (nil)"
        ),
        "{out}"
    );

    // Forwarded calls from five threads, counted for the summary.
    let mut summed = env.to_vec();
    summed.push(("NCCLSHIM_SUMMARY", "1"));
    let out = checked(under_qemu(&client, &[], &summed), "calls_client");
    for line in [
        "summary: comm 0x1000 rank 0  AllReduce < 4 KiB: 100 calls, 100 KiB: forwarded 100",
        "summary: comm 0x5000 rank 4  AllReduce < 4 KiB: 5000 calls, 312.5 KiB: forwarded 5000",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }

    // The command finds the library of its package (installed beside it) and reads the kernels
    // built into it.
    let doctor = under_qemu(
        &site.join("bin/ncclshim"),
        &["doctor", "--no-run"],
        &[("NCCLSHIM_REAL_NCCL", fake)],
    );
    let said = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert!(said.contains("kernels built in for sm_"), "{said}");
    assert!(
        said.contains(&format!(
            "the shim: {}/libnccl.so.2 (exports the API of every NCCL version with a spec)",
            shim_dir
        )),
        "{said}"
    );
}
