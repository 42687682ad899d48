//! The library's dynamic symbols are exactly NVIDIA's, and its SONAME is theirs.

use ncclshim_tests::{build_dir, defined_symbols, real_library, shim_library, soname};

#[test]
fn exports_equal_those_of_nvidias_2_27_7() {
    let shim = shim_library("2.27.7");
    let ours = defined_symbols(&shim);
    let theirs = defined_symbols(&real_library("2.27.7"));
    let extra: Vec<&String> = ours.iter().filter(|s| !theirs.contains(s)).collect();
    let missing: Vec<&String> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "extra: {extra:?}\nmissing: {missing:?}"
    );
    assert_eq!(ours.iter().filter(|s| s.starts_with("nccl")).count(), 37);
    assert_eq!(ours.iter().filter(|s| s.starts_with("pnccl")).count(), 37);
    assert_eq!(ours.len(), 74);
}

#[test]
fn soname_and_links_are_nvidias() {
    assert_eq!(
        soname(&shim_library("2.27.7")).as_deref(),
        Some("libnccl.so.2")
    );
    let lib = build_dir().join("lib");
    assert_eq!(
        std::fs::read_link(lib.join("libnccl.so.2"))
            .unwrap()
            .to_str(),
        Some("libnccl.so.2.27.7")
    );
    assert_eq!(
        std::fs::read_link(lib.join("libnccl.so")).unwrap().to_str(),
        Some("libnccl.so.2")
    );
    let header = std::fs::read_to_string(build_dir().join("include/nccl.h")).unwrap();
    assert!(header.contains("#define NCCL_MINOR 27") && header.contains("#define NCCL_PATCH 7"));
}
