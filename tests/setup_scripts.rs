//! What `make` runs to set a machine up: `gen/has-libclang.sh` decides whether `make test`
//! installs libclang for bindgen, and must not take LLVM's C++ library (`libclang-cpp`, which
//! comes with llvm without libclang itself) for it; `make install` lays the build out under a
//! prefix as NCCL's packages do; `make build` checks `NCCL_VERSION` before anything runs and
//! tells one story about the release it builds; `gen/host-only.py` leaves a library's GPU code
//! out.

use std::path::Path;
use std::process::Command;

use ncclshim_tests::{build_dir, scratch, workspace};

/// Whether the script finds libclang in `dir` alone.
fn finds_libclang_in(dir: &Path) -> bool {
    Command::new(workspace().join("gen/has-libclang.sh"))
        .arg(dir)
        .env_remove("LIBCLANG_PATH")
        .status()
        .expect("gen/has-libclang.sh runs")
        .success()
}

#[test]
fn only_libclang_itself_counts_as_libclang() {
    let root = scratch("has-libclang");
    let cases: [(&str, &[&str], bool); 5] = [
        ("empty", &[], false),
        // Debian's llvm-14 and libclang-cpp14, without libclang1-14.
        (
            "cpp-only",
            &["libclang-cpp.so.14", "libclang-cpp.so"],
            false,
        ),
        ("llvm-dir", &["libclang-cpp.so.14", "libclang.so.1"], true),
        ("multiarch", &["libclang-14.so.1"], true),
        ("dev", &["libclang.so"], true),
    ];
    for (name, files, found) in cases {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in files {
            std::fs::write(dir.join(file), b"").unwrap();
        }
        assert_eq!(finds_libclang_in(&dir), found, "{name}: {files:?}");
    }
}

#[test]
fn make_install_lays_out_the_library_its_links_and_headers() {
    let prefix = scratch("make-install");
    let out = Command::new("make")
        .args(["--no-print-directory", "install"])
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("BUILD={}", build_dir().display()))
        // Not an outer make's jobserver.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .current_dir(workspace())
        .output()
        .expect("make runs");
    assert!(
        out.status.success(),
        "make install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = prefix.join("lib");
    let real = std::fs::canonicalize(lib.join("libnccl.so")).unwrap();
    assert_eq!(
        real,
        std::fs::canonicalize(lib.join("libnccl.so.2")).unwrap()
    );
    assert!(
        real.starts_with(std::fs::canonicalize(&lib).unwrap()),
        "the links point into the prefix, not the build: {}",
        real.display()
    );
    let installed = std::fs::read(&real).unwrap();
    let built = std::fs::read(build_dir().join("lib/libnccl.so.2")).unwrap();
    assert!(installed == built, "the installed library is the built one");
    assert!(prefix.join("include/nccl.h").is_file());
}

/// `make -n ARGS` (nothing runs, but variables are worked out as for a real run), without what an
/// outer make or the caller's environment would pass down, but for `env`.
fn make_dry_run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new("make")
        .args(["-n", "--no-print-directory"])
        .args(args)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .env_remove("NCCL_VERSION")
        .envs(env.iter().copied())
        .current_dir(workspace())
        .output()
        .expect("make runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn an_nccl_version_that_is_no_release_stops_make_with_one_line() {
    let (code, out, err) = make_dry_run(&["build", "NCCL_VERSION=banana"], &[]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(out.is_empty(), "nothing may run: {out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("NCCL_VERSION=banana is not an NCCL release (X.Y.Z or all)")
            && !err.contains("make spec"),
        "{err}"
    );
    let (code, _, err) = make_dry_run(&["spec", "NCCL_VERSION=banana"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("NCCL_VERSION=banana is not an NCCL release (X.Y.Z)"),
        "{err}"
    );
    // One from the environment (nvidia/cuda images export NCCL_VERSION=2.21.5-1) is named as
    // such, and stops only the targets that build.
    let nvidia = [("NCCL_VERSION", "2.21.5-1")];
    let (code, _, err) = make_dry_run(&["build"], &nvidia);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("comes from the environment"), "{err}");
    let (code, _, err) = make_dry_run(&["help"], &nvidia);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_patch_release_without_a_spec_builds_its_minor_releases_and_says_so_once() {
    let (code, out, err) = make_dry_run(&["build", "NCCL_VERSION=2.27.5", "BUILD=/b"], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let note = "NCCL 2.27.5 has no spec; building 2.27.7's ABI";
    assert!(out.lines().next().unwrap().starts_with(note), "{out}");
    // Everything after names 2.27.7: the spec cargo builds, the headers, the file, the last line.
    assert_eq!(out.matches("2.27.5").count(), 1, "{out}");
    for says in [
        "NCCL_VERSION=2.27.7 ",
        "fetch-nccl.sh 2.27.7 headers)/include",
        "/b/lib/libnccl.so.2.27.7 && ",
        "built /b/lib/libnccl.so.2.27.7 (NCCL 2.27.7's ABI, headers of 2.27.7)",
    ] {
        assert!(out.contains(says), "{says}: {out}");
    }
    // A release with its own spec: no note.
    let (code, out, _) = make_dry_run(&["build", "NCCL_VERSION=2.28.9", "BUILD=/b"], &[]);
    assert_eq!(code, Some(0));
    assert!(!out.contains("no spec"), "{out}");
    assert!(
        out.contains("built /b/lib/libnccl.so.2.28.9 (NCCL 2.28.9's ABI, headers of 2.28.9)"),
        "{out}"
    );
}

#[test]
fn a_minor_release_without_a_spec_names_the_nearest_and_how_to_make_one() {
    let (code, out, err) = make_dry_run(&["build", "NCCL_VERSION=2.17.1"], &[]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("NCCL 2.17.1 has no spec")
            && err.contains("nearest: 2.18.3")
            && err.contains("make spec NCCL_VERSION=2.17.1"),
        "{err}"
    );
}

/// A build fetches only the headers of NVIDIA's NCCL wheel (by range requests, a few hundred
/// kilobytes of 300 MB): byte for byte the headers of the whole wheel, each checked against the
/// wheel's RECORD; a release PyPI lacks fails, leaving nothing behind.
#[test]
fn headers_alone_come_from_the_wheel_as_they_are_in_it() {
    let whole = ncclshim_tests::real_nccl("2.28.9").join("include");
    let dest = scratch("wheel-files");
    let fetch = |version: &str, into: &Path| {
        Command::new("python3")
            .arg(workspace().join("gen/wheel-files.py"))
            .args(["nvidia-nccl-cu12", version, "nvidia/nccl/include/"])
            .arg(into)
            .args(["manylinux_2_18_x86_64", "manylinux_2_17_x86_64"])
            .output()
            .expect("python3 runs")
    };
    let out = fetch("2.28.9", &dest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fetched = dest.join("nvidia/nccl/include");
    for header in ["nccl.h", "nccl_device/coop.h"] {
        assert_eq!(
            std::fs::read(fetched.join(header)).unwrap(),
            std::fs::read(whole.join(header)).unwrap(),
            "{header}"
        );
    }
    let missing = scratch("wheel-files-missing");
    let out = fetch("2.0.0", &missing.join("out"));
    assert_eq!(out.status.code(), Some(1));
    assert!(!missing.join("out").exists());
}

/// gen/spec-version.sh takes a release's own spec where there is one, else its minor release's
/// newest (a copy of the script beside made-up specs).
#[test]
fn a_release_with_a_spec_of_its_own_builds_it() {
    let root = scratch("spec-version");
    std::fs::create_dir_all(root.join("gen")).unwrap();
    std::fs::create_dir_all(root.join("spec")).unwrap();
    let script = root.join("gen/spec-version.sh");
    std::fs::copy(workspace().join("gen/spec-version.sh"), &script).unwrap();
    for release in ["2.28.3", "2.28.9", "2.29.7"] {
        std::fs::write(root.join(format!("spec/nccl-{release}.rs")), "").unwrap();
    }
    let spec_of = |version: &str| {
        let out = Command::new(&script).arg(version).output().unwrap();
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(spec_of("2.28.3"), "2.28.3");
    assert_eq!(spec_of("2.28.9"), "2.28.9");
    assert_eq!(
        spec_of("2.28.5"),
        "2.28.9",
        "the newest of its minor release"
    );
    assert_eq!(spec_of("all"), "all");
}

/// `gen/host-only.py` (what the tests' NCCL libraries go through): the device code's sections
/// become holes that take no disk, every other byte stays, and the library still loads and runs.
#[test]
fn host_only_leaves_the_device_code_out_and_the_rest_as_it_was() {
    let dir = scratch("host-only");
    let source = dir.join("lib.c");
    // Non-zero, so that the section takes disk; 4 MiB, in the two sections NVIDIA's use.
    std::fs::write(
        &source,
        "__attribute__((section(\".nv_fatbin\"))) const char fatbin[2 << 20] = {1};\n\
         __attribute__((section(\"__nv_relfatbin\"))) const char relfatbin[2 << 20] = {2};\n\
         int answer(void) { return 42 + fatbin[0] * 0; }\n",
    )
    .unwrap();
    let library = dir.join("libhost.so");
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());
    let before = std::fs::read(&library).unwrap();
    let blocks_before =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&library).unwrap());
    let out = Command::new("python3")
        .arg(workspace().join("gen/host-only.py"))
        .arg(&library)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::read(&library).unwrap();
    let blocks_after =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&library).unwrap());
    assert_eq!(after.len(), before.len(), "the file keeps its size");
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    // The sections' whole pages, and nothing else: every changed byte was non-zero and is zero.
    assert!(changed > 0 && before.iter().zip(&after).all(|(a, b)| a == b || *b == 0));
    assert!(changed <= 4 << 20, "{changed} bytes changed");
    // Holes, where the file system makes them (tmpfs and ext4 do).
    assert!(
        blocks_after * 512 + (3 << 20) <= blocks_before * 512,
        "{blocks_before} -> {blocks_after} blocks: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Still a library that loads and runs.
    let main = dir.join("main.c");
    std::fs::write(
        &main,
        "#include <dlfcn.h>\n#include <stdio.h>\n\
         int main(int c, char** v) { void* h = dlopen(v[1], RTLD_NOW); if (!h) return 1;\n\
         int (*answer)(void) = (int (*)(void))dlsym(h, \"answer\"); return answer() == 42 ? 0 : 2; }\n",
    )
    .unwrap();
    let runner = dir.join("main");
    let built = Command::new("gcc")
        .arg("-o")
        .arg(&runner)
        .arg(&main)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(built.success());
    assert!(
        Command::new(&runner)
            .arg(&library)
            .status()
            .unwrap()
            .success()
    );
}
