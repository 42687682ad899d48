//! For the macro's own tests: the committed 2.27.7 spec, by absolute path.
fn main() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/nccl-2.27.7.rs");
    println!(
        "cargo:rustc-env=NCCLSHIM_TEST_SPECS={}",
        spec.canonicalize()
            .expect("spec/nccl-2.27.7.rs exists")
            .display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
