//! The core's kernels. The library carries them compiled for every architecture of
//! `BUILT_IN_ARCHS` (so that no H100, H200 or B200 waits for NVRTC at run time), each program
//! for its architecture and defining every kernel the core looks up by name; and for other GPUs
//! the kernels compile at run time with NVIDIA's real NVRTC (from the nvidia-cuda-nvrtc-cu12
//! wheel). No GPU needed.

use nccl::core::kernels::{
    Source, built_in_archs, built_in_ptx, cached_cubin_path, compile_with_nvrtc, images_for,
};
use nccl::core::nvrtc_load;
use nccl::core::program::{Arch, BUILT_IN_ARCHS, PTX_ARCH, kernel_name};
use nccl::core::types::{Algorithm, DataType, Op};
use ncclshim_tests::{fetched, scratch};

/// One architecture's cubins: one ELF per type, for `arch`, holding exactly the kernels the core
/// plans for that type.
fn check_cubins(cubins: &[Vec<u8>], arch: Arch) {
    assert_eq!(cubins.len(), DataType::ALL.len());
    for (dtype, cubin) in DataType::ALL.iter().zip(cubins) {
        assert_eq!(&cubin[..4], b"\x7fELF", "{dtype:?}: a cubin is an ELF file");
        // e_flags (at 48 in a 64-bit ELF header) name the SM: in their low byte up to CUDA's ELF
        // ABI version 7 (e_ident[8]), in the next byte from version 8 on (sm_100 and later).
        let flags = u32::from_le_bytes(cubin[48..52].try_into().unwrap());
        let built_for = if cubin[8] >= 8 {
            (flags >> 8) & 0xff
        } else {
            flags & 0xff
        };
        let sm = (arch.0 * 10 + arch.1) as u32;
        assert_eq!(
            built_for, sm,
            "{dtype:?}: built for sm_{sm}? flags {flags:#x}"
        );
        // The ELF's NUL-terminated strings that name kernels of ours.
        let names: std::collections::HashSet<&[u8]> = cubin
            .split(|&b| b == 0)
            .filter(|s| s.starts_with(b"ncclshim_"))
            .collect();
        for algorithm in Algorithm::ALL {
            for op in Op::ALL {
                let name = kernel_name(algorithm, *dtype, op);
                let found = names.contains(name.as_bytes());
                if algorithm.supports(*dtype, op) {
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
}

#[test]
fn the_library_carries_every_kernel_for_each_built_in_architecture() {
    assert_eq!(
        built_in_archs(),
        BUILT_IN_ARCHS,
        "the library was built without its kernels (no NVRTC at build time: `make build` fetches it)"
    );
    for arch in BUILT_IN_ARCHS {
        let built = images_for(arch).unwrap_or_else(|e| panic!("sm_{}{}: {e}", arch.0, arch.1));
        assert_eq!(built.from, Source::BuiltIn);
        check_cubins(&built.images, arch);
    }
    // A later minor version of a built-in architecture runs its code (sm_103 that of sm_100,
    // sm_86 and sm_89 that of sm_80).
    for (later, built) in [((10, 3), (10, 0)), ((8, 6), (8, 0)), ((8, 9), (8, 0))] {
        assert_eq!(
            images_for(later).unwrap().images,
            images_for(built).unwrap().images
        );
    }
}

/// PTX of `PTX_ARCH`'s programs, which the driver compiles for a GPU newer than every built-in
/// architecture: one per type, NUL-terminated as the driver loads it, for sm_90, defining every
/// kernel the core looks up for that type.
#[test]
fn the_library_carries_ptx_for_gpus_newer_than_its_cubins() {
    let ptx = built_in_ptx().unwrap().expect("the library carries PTX");
    assert_eq!(ptx.len(), DataType::ALL.len());
    let target = format!(".target sm_{}{}", PTX_ARCH.0, PTX_ARCH.1);
    for (dtype, program) in DataType::ALL.iter().zip(&ptx) {
        assert_eq!(program.last(), Some(&0), "{dtype:?}: NUL-terminated");
        let text = std::str::from_utf8(&program[..program.len() - 1]).expect("PTX is text");
        assert!(text.contains(&target), "{dtype:?}: {target}");
        let entries: std::collections::HashSet<&str> = text
            .split(".entry ")
            .skip(1)
            .filter_map(|rest| rest.split_once('(').map(|(name, _)| name))
            .collect();
        for algorithm in Algorithm::ALL {
            for op in Op::ALL {
                let name = kernel_name(algorithm, *dtype, op);
                assert_eq!(
                    entries.contains(name.as_str()),
                    algorithm.supports(*dtype, op),
                    "{dtype:?}: {name}"
                );
            }
        }
    }
    // A GPU of an architecture the library carries no cubins for, and later than PTX_ARCH, gets
    // the PTX (no NVRTC); one of a later minor version of a built-in one, the cubins.
    let newer = images_for((13, 0)).unwrap();
    assert_eq!(newer.from, Source::Ptx);
    assert_eq!(newer.images, ptx);
    assert_eq!(images_for((12, 1)).unwrap().from, Source::BuiltIn);
}

/// The packet kernels (small calls, where every instruction before the first store to a peer
/// shows) keep their data out of local memory. A parameter passed by value and indexed by a rank
/// puts a copy there that every thread writes and reads back first: the peers' addresses did, 144
/// bytes in every packet kernel. The PTX declares each kernel's local memory (`__local_depot`).
#[test]
fn the_packet_kernels_keep_their_data_out_of_local_memory() {
    let ptx = built_in_ptx().unwrap().expect("the library carries PTX");
    let mut checked = 0;
    for program in &ptx {
        let text = std::str::from_utf8(&program[..program.len() - 1]).expect("PTX is text");
        for entry in text.split(".entry ").skip(1) {
            let name = entry.split_once('(').map_or(entry, |(name, _)| name);
            if !["ncclshim_ll_", "ncclshim_sentinel_"]
                .iter()
                .any(|packets| name.starts_with(packets))
            {
                continue;
            }
            // The kernel's body ends at the first brace in the first column.
            let body = entry.split("\n}\n").next().unwrap_or(entry);
            let depot = body
                .split_once("__local_depot")
                .and_then(|(_, rest)| rest.split_once('[')?.1.split_once(']'))
                .map_or(0, |(bytes, _)| bytes.parse::<usize>().unwrap());
            assert!(depot <= 16, "{name}: {depot} bytes of local memory");
            checked += 1;
        }
    }
    assert!(checked >= 5 * ptx.len(), "{checked} packet kernels");
}

/// The run-time path, as a GPU the library carries nothing for takes it: NVRTC found and
/// loaded, each type's program compiled or read from the disk cache, every kernel there. Two
/// types compile here, float (every algorithm, the sentinel kernels among them) and double, and
/// are the library's own, byte for byte (NVRTC's output depends on nothing else). The other ten,
/// which the build compiled from the same source and options with the same NVRTC
/// (`the_library_carries_every_kernel_...` checks them), are put in the cache from the
/// library's sm_90 cubins beforehand and read from it, as a machine's later jobs read what its
/// first compiled. Each program takes NVRTC 30 s on sm_90 (those of 1-byte and 16-bit types 55 -
/// 110 s): all twelve took about 400 s of `make test` on two cores.
#[test]
fn the_kernels_compile_at_run_time() {
    let nvrtc = fetched("gen/fetch-nvrtc.sh", &[]);
    // SAFETY: set before the core looks for NVRTC; the other tests here read no variable.
    unsafe { std::env::set_var("NCCLSHIM_NVRTC", &nvrtc) };
    // The disk cache must not answer for the compiler here but where this test says so.
    let cache = scratch("kernel-cache");
    // SAFETY: as above.
    unsafe { std::env::set_var("NCCLSHIM_CACHE", &cache) };
    nvrtc_load().unwrap_or_else(|e| panic!("{e}"));

    // The architecture GPUs that the library carries no kernels for would ask for is unknown
    // today: sm_90's compiler path is the same.
    let arch = (9, 0);
    let compiled_here = [DataType::Float32, DataType::Float64];
    let built = images_for(arch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.from, Source::BuiltIn, "the library carries sm_90");
    for (dtype, cubin) in DataType::ALL.iter().zip(&built.images) {
        if !compiled_here.contains(dtype) {
            let path = cached_cubin_path(*dtype, arch).expect("a cache");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, cubin).unwrap();
        }
    }
    let cubins = compile_with_nvrtc(arch).unwrap_or_else(|e| panic!("{e}"));
    check_cubins(&cubins, arch);
    // The library's own are these, byte for byte: the kernels it carries (shim/kernels/,
    // committed) are this source as this NVRTC compiles it.
    for (k, dtype) in DataType::ALL.iter().enumerate() {
        if compiled_here.contains(dtype) {
            assert!(
                cubins[k] == built.images[k],
                "{dtype:?}: the library's sm_90 kernels are not this source's: `make kernels`"
            );
        }
    }
    // The two compiled here were cached beside the ten put there, one per type.
    let cached = std::fs::read_dir(cache.join("kernels")).unwrap().count();
    assert_eq!(cached, DataType::ALL.len());
}
