//! What `make` runs to set a machine up: `gen/has-libclang.sh` decides whether `make test`
//! installs libclang for bindgen, and must not take LLVM's C++ library (`libclang-cpp`, which
//! comes with llvm without libclang itself) for it.

use std::path::Path;
use std::process::Command;

use ncclshim_tests::{scratch, workspace};

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
