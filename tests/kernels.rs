//! Every variant of the core's kernels compiles with NVIDIA's real NVRTC (from the
//! nvidia-cuda-nvrtc-cu12 wheel) for sm_90, and each program defines the kernels the core will
//! look up by name. No GPU needed: NVRTC runs on the CPU.

use nccl::core::kernels::{compile_all, kernel_name};
use nccl::core::types::{Algorithm, DataType, Op};
use ncclshim_tests::{fetched, workspace};

#[test]
fn every_kernel_variant_compiles_for_sm_90() {
    let nvrtc = fetched("tests/fetch-nvrtc.sh", &[]);
    // SAFETY: set before the core looks for NVRTC, and before this test starts any thread.
    unsafe { std::env::set_var("NCCLSHIM_NVRTC", &nvrtc) };
    // The disk cache must not answer for the compiler here.
    let cache = workspace().join("target/tests-scratch/kernel-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // SAFETY: as above.
    unsafe { std::env::set_var("NCCLSHIM_CACHE", &cache) };
    nccl::core::nvrtc_load().expect("NVRTC loads from the wheel");

    let cubins = compile_all((9, 0)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cubins.len(), DataType::ALL.len());
    for (dtype, cubin) in DataType::ALL.iter().zip(cubins.iter()) {
        assert_eq!(&cubin[..4], b"\x7fELF", "{dtype:?}: a cubin is an ELF file");
        for algorithm in Algorithm::ALL {
            for op in Op::ALL {
                let name = kernel_name(algorithm, *dtype, op);
                let found = cubin
                    .windows(name.len() + 1)
                    .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
                if algorithm.supports(*dtype) {
                    assert!(found, "{name} is missing from the {dtype:?} cubin");
                } else {
                    assert!(
                        !found,
                        "{name}: the core never plans it, so it is not built"
                    );
                }
            }
        }
    }
    // The cubins were cached on disk, one per type.
    let cached = std::fs::read_dir(cache.join("kernels")).unwrap().count();
    assert_eq!(cached, DataType::ALL.len());
}
