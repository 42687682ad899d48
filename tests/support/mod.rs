//! What the integration tests share: where the built library and NVIDIA's libraries are, and
//! compiling and running C clients with gcc.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The workspace's root folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `make build`'s output (`build/`, or `$NCCLSHIM_BUILD`).
pub fn build_dir() -> PathBuf {
    std::env::var_os("NCCLSHIM_BUILD").map_or_else(|| workspace().join("build"), PathBuf::from)
}

/// The shim as `make build` leaves it, `build/lib/libnccl.so.<version>`.
pub fn shim_library(version: &str) -> PathBuf {
    let path = build_dir().join(format!("lib/libnccl.so.{version}"));
    assert!(
        path.is_file(),
        "{} is missing: run `make build` (or `make test`) first",
        path.display()
    );
    path
}

/// What one of the workspace's wheel fetchers (`script`, relative to the workspace) prints: the
/// path of what it fetched into the cache, or had there already.
pub fn fetched(script: &str, args: &[&str]) -> PathBuf {
    let out = Command::new(workspace().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{script} does not run: {e}"));
    assert!(
        out.status.success(),
        "{script} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// NVIDIA's NCCL `version` from its PyPI wheel: the folder holding `lib/` and `include/`,
/// fetched into the cache by `gen/fetch-nccl.sh` if it is not there yet; its library without
/// its GPU code (`host`), which no test here runs.
pub fn real_nccl(version: &str) -> PathBuf {
    fetched("gen/fetch-nccl.sh", &[version, "host"])
}

/// The real `libnccl.so.2` of `version`.
pub fn real_library(version: &str) -> PathBuf {
    real_nccl(version).join("lib/libnccl.so.2")
}

/// The cargo target folder: `$CARGO_TARGET_DIR` where it is set, else the one this test binary
/// was built in (`<target>/[<triple>/]<profile>/deps/<test>-<hash>`, cargo marks it with
/// `CACHEDIR.TAG`), else the workspace's `target/`. Tests write their files under it.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        // Relative to where cargo was run: the workspace, for `make test`.
        return workspace().join(dir);
    }
    let exe = std::env::current_exe().ok();
    exe.as_deref()
        .and_then(|exe| exe.ancestors().find(|d| d.join("CACHEDIR.TAG").is_file()))
        .map_or_else(|| workspace().join("target"), Path::to_path_buf)
}

/// The cargo target folder of the tests' own builds of the shim (tests/versions.rs and
/// tests/locating.rs): one, so that what they share compiles once.
pub fn builds_target_dir() -> PathBuf {
    target_dir().join("versions/cargo")
}

/// A command without what an outer `make` or `make build` would pass down: its jobserver, and the
/// variables that choose what the shim is built for.
pub fn clean_command(program: &str) -> Command {
    let mut command = Command::new(program);
    for var in [
        "MAKEFLAGS",
        "MFLAGS",
        "MAKELEVEL",
        "CARGO_MAKEFLAGS",
        "NCCL_VERSION",
        "REAL_NCCL_LIB",
    ] {
        command.env_remove(var);
    }
    command
}

/// `cargo build -p ncclshim` as the tests build the library to look at what it exports or how it
/// finds NCCL, and where the library will be: a debug build without debug information or
/// kernels, in `builds_target_dir()`. It exports and searches as a release build does, in a
/// fraction of the time and space.
pub fn small_shim_build() -> (Command, PathBuf) {
    let target = builds_target_dir();
    let mut command = clean_command(env!("CARGO"));
    command
        .args(["build", "--locked", "-p", "ncclshim"])
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("NCCLSHIM_KERNEL_ARCHS", "none")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(workspace());
    (command, target.join("debug/libnccl.so"))
}

/// A fresh folder for one test's files, `<target>/tests-scratch/<name>`, removed when the test
/// passes (kept where it fails, to look into).
pub fn scratch(name: &str) -> Scratch {
    let dir = target_dir().join("tests-scratch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's folder, removed when dropped unless the test is failing (panicking).
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;

    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Compiles the C client `tests/c/<source>` with gcc against `include` into `out`; `link` are
/// extra arguments (e.g. `-L... -lnccl`).
pub fn compile_c(
    source: &str,
    include: &Path,
    out: &Path,
    link: &[impl AsRef<std::ffi::OsStr>],
) -> PathBuf {
    compile_c_with(Command::new("gcc"), source, include, out, link)
}

/// As `compile_c`, with `compiler` (a C compiler's command, with any options of its own, such
/// as another processor to compile for).
pub fn compile_c_with(
    mut compiler: Command,
    source: &str,
    include: &Path,
    out: &Path,
    link: &[impl AsRef<std::ffi::OsStr>],
) -> PathBuf {
    let status = compiler
        .args(["-O1", "-Wall", "-Werror", "-std=gnu11", "-pthread"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", workspace().join("tests/c").display()))
        // nccl.h includes CUDA's headers; the clients need none of their contents.
        .arg(format!(
            "-I{}",
            workspace().join("gen/cuda-stand-ins").display()
        ))
        .arg(workspace().join("tests/c").join(source))
        .arg("-o")
        .arg(out)
        .args(link)
        .status()
        .expect("the C compiler runs");
    assert!(
        status.success(),
        "the C compiler failed on tests/c/{source}"
    );
    out.to_path_buf()
}

/// What tests/c/calls_client.c prints in its "empty" mode, through the shim into the stand-in
/// NCCL (tests/c/fake_operations_nccl.c, with FAKE_NCCL_GROUPS set), where the shim answers the
/// calls of no elements NCCL would drop: the first four lines reach no NCCL function; from the
/// fifth on, each call NCCL's checks may refuse (and those after) reaches it.
pub const EMPTY_CALLS_ANSWERED: [&str; 17] = [
    "made: 0",
    "a group of two empty all-reduces",
    "rank 0 of 2",
    "an empty broadcast from root 1",
    "an empty broadcast from root 2",
    "fake ncclBroadcast",
    "an empty all-reduce of type 255",
    "fake ncclAllReduce",
    "an empty all-reduce of op 5",
    "fake ncclAllReduce",
    "an empty all-reduce of 8-bit floats",
    "fake ncclAllReduce",
    "an all-reduce of 4",
    "fake ncclAllReduce",
    "an empty all-reduce once destroyed",
    "fake ncclAllReduce",
    "done",
];

/// For tests of what the shim records of each call: tests/c/calls_client.c (linked with the
/// shim) and tests/c/fake_operations_nccl.c (a stand-in for the real NCCL whose operations
/// succeed without a GPU), built in `dir`: (client, stand-in).
pub fn calls_client_and_fake_nccl(dir: &Path) -> (PathBuf, PathBuf) {
    let include = real_nccl("2.27.7").join("include");
    let fake = compile_c(
        "fake_operations_nccl.c",
        &include,
        &dir.join("libfake_operations_nccl.so"),
        &["-shared", "-fPIC"],
    );
    let client = compile_c(
        "calls_client.c",
        &include,
        &dir.join("calls_client"),
        &link_shim(),
    );
    (client, fake)
}

/// Links with `-lnccl` against the shim in `build/lib`, with an rpath to it.
pub fn link_shim() -> Vec<String> {
    let lib = build_dir().join("lib");
    vec![
        format!("-L{}", lib.display()),
        "-lnccl".into(),
        format!("-Wl,-rpath,{}", lib.display()),
    ]
}

/// Links against the `libnccl.so.2` in `lib_dir`, with an rpath to it.
pub fn link_nccl(lib_dir: &Path) -> Vec<String> {
    vec![
        format!("-L{}", lib_dir.display()),
        "-l:libnccl.so.2".into(),
        format!("-Wl,-rpath,{}", lib_dir.display()),
    ]
}

/// Runs `program` with `args` and only the environment given (plus PATH), so that no
/// `NCCL_*` or `NCCLSHIM_*` variable of the caller's leaks in. A run that hangs is killed after
/// two minutes and fails the test.
pub fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    // Drained while the child runs, so that a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} {args:?} hung (killed after 120 s)", program.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// stdout of a run that must have succeeded.
pub fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The dynamic symbols a library defines, sorted (`nm -D --defined-only`).
pub fn defined_symbols(library: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library)
        .output()
        .expect("nm runs");
    assert!(out.status.success(), "nm failed on {}", library.display());
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().rev();
            let name = fields.next()?;
            let kind = fields.next()?;
            // Linker-made markers such as _edata and __bss_start are not the library's API.
            (kind != "A" && !["_edata", "_end", "__bss_start", "_init", "_fini"].contains(&name))
                .then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The library's SONAME (`readelf -d`).
pub fn soname(library: &Path) -> Option<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(library)
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
}
