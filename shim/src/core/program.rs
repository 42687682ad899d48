//! The kernels' program: `device/`, how NVRTC compiles it (one program per element type,
//! for one GPU architecture), the names of the kernels it defines, and how a set of compiled
//! programs is packed into the library. Shared by the build script, which compiles them ahead of
//! time for the architectures in `BUILT_IN_ARCHS`, and the run time, which compiles them only for
//! other GPUs.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use super::fnv::Fnv;
use super::limits::{
    BARRIERS, LL_MAX_BYTES, MAX_BATCH, MAX_BLOCKS, MAX_FUSED, MAX_RANKS, MAX_THREADS,
    SENTINEL_MAX_BYTES,
};
use super::types::{Algorithm, DataType, Op};

/// The kernels' source: the shared device header, one file per family, the entry points (which
/// instantiate the kernels), in that order, compiled as one program.
pub const SOURCE: &str = concat!(
    include_str!("device/device.cuh"),
    include_str!("device/all_reduce.cu"),
    include_str!("device/moves.cu"),
    include_str!("device/reductions.cu"),
    include_str!("device/packets.cu"),
    include_str!("device/entry.cu"),
);

/// A GPU architecture, as CUDA's compute capability (major, minor).
pub type Arch = (i32, i32);

/// The architectures the library carries compiled kernels for (unless built with
/// `NCCLSHIM_KERNEL_ARCHS`): Ampere (sm_80: A100, A800; its code also runs on sm_86 and sm_89),
/// Hopper (sm_90: H100, H200, GH200), datacenter Blackwell (sm_100: B200, GB200; its code also
/// runs on sm_103) and Blackwell workstations (sm_120). The core needs sm_80 or newer.
pub const BUILT_IN_ARCHS: [Arch; 4] = [(8, 0), (9, 0), (10, 0), (12, 0)];

/// The architecture whose programs the library also carries as PTX, for GPUs newer than every
/// built-in architecture: the driver compiles PTX for any GPU of this architecture or later, and
/// sm_90's is the oldest that has every feature the kernels use (the early launch).
pub const PTX_ARCH: Arch = (9, 0);

/// The kernel's name for one variant, as `device/entry.cu` defines it.
pub fn kernel_name(algorithm: Algorithm, dtype: DataType, op: Op) -> String {
    format!(
        "ncclshim_{}_{}_{}",
        algorithm.name(),
        dtype.kernel_suffix(),
        op.name()
    )
}

/// NVRTC's options for one element type's program.
pub fn options(dtype: DataType, arch: Arch) -> Vec<String> {
    let (name, cuda_type) = (dtype.kernel_suffix(), dtype.cuda_type());
    let mut types = format!("KERNELS({name},{cuda_type})");
    if Algorithm::Sentinel.supports(dtype, Op::Sum) {
        types += &format!(" SENTINEL_KERNELS({name},{cuda_type})");
    }
    if Algorithm::AllGather.supports(dtype, Op::Sum) {
        types += &format!(" MOVE_KERNELS({name},{cuda_type})");
    }
    vec![
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "-std=c++17".into(),
        format!("-DMAX_THREADS={MAX_THREADS}"),
        format!("-DMAX_RANKS={MAX_RANKS}"),
        format!("-DMAX_BLOCKS={MAX_BLOCKS}"),
        format!("-DBARRIERS={BARRIERS}"),
        format!("-DMAX_BATCH={MAX_BATCH}"),
        format!("-DMAX_FUSED={MAX_FUSED}"),
        format!("-DLL_MAX_BYTES={LL_MAX_BYTES}"),
        format!("-DSENTINEL_MAX_BYTES={SENTINEL_MAX_BYTES}"),
        format!("-DNCCL_TYPES={types}"),
    ]
}

/// The loaded NVRTC's version (major, minor).
pub fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// FNV-1a over the source, each program's options and NVRTC's version: what a compiled program
/// depends on, stable across builds and runs (the key of the caches of compiled programs).
pub fn fingerprint<'a>(programs: impl IntoIterator<Item = &'a [String]>, nvrtc: (i32, i32)) -> u64 {
    let mut hash = Fnv::new();
    let mut feed = |bytes: &[u8]| hash = hash.bytes(bytes);
    feed(SOURCE.as_bytes());
    for options in programs {
        for option in options {
            feed(option.as_bytes());
            feed(&[0]);
        }
        feed(&[1]);
    }
    feed(&nvrtc.0.to_le_bytes());
    feed(&nvrtc.1.to_le_bytes());
    hash.finish()
}

/// Where compiled programs are kept across processes and builds: `$NCCLSHIM_CACHE/<sub>`, else
/// `~/.cache/ncclshim/<sub>`.
pub fn cache_dir(sub: &str) -> Option<PathBuf> {
    let base = std::env::var_os("NCCLSHIM_CACHE")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/ncclshim"))
        })?;
    Some(base.join(sub))
}

/// One program as NVRTC compiled it: the cubin for its architecture, and the PTX it came from
/// (NUL-terminated, as the driver loads it).
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub ptx: Vec<u8>,
}

/// Keeps `bytes` in the cache file `path`, its folder made if need be: written whole under
/// another name, then renamed, so that builds and processes compiling at once never read half a
/// file. A cache that cannot be written is no error (the next one compiles again).
pub fn keep_in_cache(path: &std::path::Path, bytes: &[u8]) {
    let partial = path.with_extension(format!("{}.partial", std::process::id()));
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(path))
        .and_then(|()| std::fs::write(&partial, bytes))
        .and_then(|()| std::fs::rename(&partial, path));
}

/// Compiles the kernels' source with `options`. Needs NVRTC loaded.
pub fn compile(options: &[String]) -> Result<Compiled, String> {
    let source = CString::new(SOURCE).expect("the kernel source has no NUL");
    let program = nvrtc::create_program(&source, Some(c"ncclshim.cu"))
        .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    // SAFETY: a program just created, destroyed below.
    let compiled = unsafe { nvrtc::compile_program(program, options) };
    let outcome = match compiled {
        Ok(()) => cubin_of(program).and_then(|cubin| {
            let ptx = ptx_of(program)?;
            Ok(Compiled { cubin, ptx })
        }),
        Err(e) => {
            // SAFETY: the program is alive.
            let log = unsafe { nvrtc::get_program_log(program) }.unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            Err(format!(
                "NVRTC failed ({e:?}) with {options:?}:\n{}",
                String::from_utf8_lossy(&log)
            ))
        }
    };
    // SAFETY: created above, not used after.
    let _ = unsafe { nvrtc::destroy_program(program) };
    outcome
}

fn cubin_of(program: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    output_of(
        program,
        ("nvrtcGetCUBINSize", nvrtc_sys::nvrtcGetCUBINSize),
        ("nvrtcGetCUBIN", nvrtc_sys::nvrtcGetCUBIN),
    )
}

/// The PTX, its NUL included (as the driver loads it).
fn ptx_of(program: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let ptx = output_of(
        program,
        ("nvrtcGetPTXSize", nvrtc_sys::nvrtcGetPTXSize),
        ("nvrtcGetPTX", nvrtc_sys::nvrtcGetPTX),
    )?;
    match ptx.last() {
        Some(0) => Ok(ptx),
        _ => Err("nvrtcGetPTX: no NUL at the end".into()),
    }
}

type SizeOf = unsafe fn(nvrtc_sys::nvrtcProgram, *mut usize) -> nvrtc_sys::nvrtcResult;
type CopyOf = unsafe fn(nvrtc_sys::nvrtcProgram, *mut std::ffi::c_char) -> nvrtc_sys::nvrtcResult;

/// One output of a compiled program, through NVRTC's pair of calls for it: its size, then a
/// copy into a buffer of that size.
fn output_of(
    program: nvrtc_sys::nvrtcProgram,
    (size_name, size_of): (&str, SizeOf),
    (copy_name, copy): (&str, CopyOf),
) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: a compiled program; the buffer has the size NVRTC gave, once it gave one.
    unsafe {
        let sized = size_of(program, &mut size);
        if sized != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return Err(format!("{size_name}: {sized:?}"));
        }
        let mut output = vec![0u8; size];
        let result = copy(program, output.as_mut_ptr().cast());
        if result != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("{copy_name}: {result:?}"));
        }
        Ok(output)
    }
}

/// The layout of `pack`'s output: part of the packs' file names, so that a build never takes
/// a pack of another layout.
pub const PACK_LAYOUT: u32 = 1;

/// The NVRTC release `make build` compiles the kernels with (gen/fetch-nvrtc.sh fetches it), as
/// `nvrtc_version` reads it: the packs committed in `shim/kernels/` are its.
pub const BUILD_NVRTC: (i32, i32) = (12, 9);

/// What a pack holds: an architecture's cubins, or its PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackKind {
    Cubins,
    Ptx,
}

/// The file name of `arch`'s pack of `kind` as NVRTC `nvrtc` compiles it: it names what the
/// programs are compiled from, so that a build never takes a pack of other source, options,
/// NVRTC or layout.
pub fn pack_name(arch: Arch, kind: PackKind, nvrtc: (i32, i32)) -> String {
    let programs = DataType::ALL.map(|t| options(t, arch));
    let key = fingerprint(programs.iter().map(Vec::as_slice), nvrtc);
    let kind = match kind {
        PackKind::Cubins => "cubins",
        PackKind::Ptx => "ptx",
    };
    format!(
        "sm_{}{}-{key:016x}.{kind}-{PACK_LAYOUT}.zst",
        arch.0, arch.1
    )
}

/// The packs a library carries by default, as `BUILD_NVRTC` compiles them: every built-in
/// architecture's cubins and `PTX_ARCH`'s PTX, which `shim/kernels/` holds.
pub fn default_packs() -> Vec<String> {
    let cubins = BUILT_IN_ARCHS.map(|arch| pack_name(arch, PackKind::Cubins, BUILD_NVRTC));
    let ptx = pack_name(PTX_ARCH, PackKind::Ptx, BUILD_NVRTC);
    cubins.into_iter().chain([ptx]).collect()
}

/// One architecture's cubins (or PTX: any image per element type, in `DataType::ALL` order) as
/// the library carries them: each one's length (u64, little-endian) then its bytes, compressed with zstd.
/// The programs of different types share most of their code, which compresses 13-fold together.
pub fn pack(cubins: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    let mut joined = Vec::with_capacity(cubins.iter().map(|c| c.len() + 8).sum());
    for cubin in cubins {
        joined.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
        joined.extend_from_slice(cubin);
    }
    zstd::bulk::compress(&joined, 19).map_err(|e| format!("zstd: {e}"))
}

/// The cubins of `pack`, one per element type.
pub fn unpack(packed: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut joined = Vec::new();
    zstd::stream::copy_decode(packed, &mut joined).map_err(|e| format!("zstd: {e}"))?;
    let mut cubins = Vec::with_capacity(DataType::ALL.len());
    let mut rest = joined.as_slice();
    while let Some((length, tail)) = rest.split_first_chunk::<8>() {
        let length = u64::from_le_bytes(*length) as usize;
        let cubin = tail.get(..length).ok_or("a packed cubin is cut short")?;
        cubins.push(cubin.to_vec());
        rest = &tail[length..];
    }
    if !rest.is_empty() || cubins.len() != DataType::ALL.len() {
        return Err(format!(
            "packed kernels hold {} programs, not one per type ({})",
            cubins.len(),
            DataType::ALL.len()
        ));
    }
    Ok(cubins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_kernels_are_this_sources() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut held: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".zst"))
            .collect();
        let mut wanted = default_packs();
        held.sort();
        wanted.sort();
        assert_eq!(
            held, wanted,
            "shim/kernels/ holds packs of other kernels: `make kernels` compiles this source's \
             (about 25 minutes on two cores) and puts them there, to be committed"
        );
    }

    #[test]
    fn build_nvrtc_is_the_one_make_fetches() {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../gen/fetch-nvrtc.sh");
        let text = std::fs::read_to_string(&script).unwrap();
        let fetched = text
            .lines()
            .find_map(|line| line.strip_prefix("version=${1:-"))
            .and_then(|rest| rest.strip_suffix('}'))
            .expect("fetch-nvrtc.sh sets version=${1:-X.Y.Z}");
        let (major, minor) = BUILD_NVRTC;
        assert!(
            fetched.starts_with(&format!("{major}.{minor}.")),
            "fetch-nvrtc.sh fetches NVRTC {fetched}, BUILD_NVRTC says {major}.{minor}"
        );
    }

    #[test]
    fn packed_cubins_come_back_whole_and_in_order() {
        let cubins: Vec<Vec<u8>> = DataType::ALL
            .iter()
            .map(|t| {
                let mut cubin = b"\x7fELF".to_vec();
                cubin.extend(std::iter::repeat_n(*t as u8, 1000 + *t as usize));
                cubin
            })
            .collect();
        let packed = pack(&cubins).unwrap();
        assert!(packed.len() < cubins.iter().map(Vec::len).sum::<usize>() / 4);
        assert_eq!(unpack(&packed).unwrap(), cubins);
        assert!(
            unpack(&pack(&cubins[..3]).unwrap()).is_err(),
            "one per type"
        );
        let cut = zstd::bulk::compress(&[9, 0, 0, 0, 0, 0, 0, 0, 1], 1).unwrap();
        assert!(unpack(&cut).is_err(), "a length past the end");
        assert!(unpack(b"not zstd").is_err());
    }

    #[test]
    fn the_fingerprint_follows_options_and_nvrtc() {
        let programs = |arch| DataType::ALL.map(|t| options(t, arch));
        let key = |arch, nvrtc| fingerprint(programs(arch).iter().map(Vec::as_slice), nvrtc);
        assert_eq!(key((9, 0), (12, 9)), key((9, 0), (12, 9)));
        assert_ne!(key((9, 0), (12, 9)), key((10, 0), (12, 9)));
        assert_ne!(key((9, 0), (12, 9)), key((9, 0), (13, 0)));
    }
}
