//! What `make` runs to set a machine up: `gen/has-libclang.sh` decides whether `make test`
//! installs libclang for bindgen, and must not take LLVM's C++ library (`libclang-cpp`, which
//! comes with llvm without libclang itself) for it; `make install` lays the build out under a
//! prefix as NCCL's packages do.

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
