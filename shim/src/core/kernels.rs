//! The core's kernels: `all_reduce.cu`, compiled at run time by NVRTC (through cudarc) into a
//! cubin for the device's architecture, one program per element type, in parallel; cubins are
//! cached on disk (keyed by source, options, architecture and NVRTC version) and the loaded
//! functions in memory, per device.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use super::cuda::{self, Device, Function};
use super::policy;
use super::types::{Algorithm, DataType, Op};

pub const SOURCE: &str = include_str!("all_reduce.cu");

/// Every kernel of one device: `[algorithm][type][op]`, `None` where the algorithm does not
/// support the type.
pub struct Kernels {
    functions: Vec<Option<Function>>,
    /// Blocks of `policy::MAX_THREADS` that every two-shot kernel (staged and direct) can have
    /// resident at once on the device: the fewest of any type and op.
    pub two_shot_resident_blocks: u32,
}

// SAFETY: CUfunction handles may be used from any thread.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    pub fn get(&self, algorithm: Algorithm, dtype: DataType, op: Op) -> Option<Function> {
        Kernels::index(&self.functions, algorithm, dtype, op)
    }

    fn index(
        functions: &[Option<Function>],
        algorithm: Algorithm,
        dtype: DataType,
        op: Op,
    ) -> Option<Function> {
        functions[(algorithm as usize * DataType::ALL.len() + dtype as usize) * Op::ALL.len()
            + op as usize]
    }
}

fn two_shot_resident_blocks(functions: &[Option<Function>], device: &Device) -> cuda::Cuda<u32> {
    let mut fewest = u32::MAX;
    for algorithm in Algorithm::ALL.into_iter().filter(|a| a.is_two_shot()) {
        for dtype in DataType::ALL {
            for op in Op::ALL {
                if let Some(function) = Kernels::index(functions, algorithm, dtype, op) {
                    fewest = fewest.min(device.resident_blocks(function, policy::MAX_THREADS)?);
                }
            }
        }
    }
    Ok(fewest)
}

/// The kernel's name for one variant, as `all_reduce.cu` defines it.
pub fn kernel_name(algorithm: Algorithm, dtype: DataType, op: Op) -> String {
    format!(
        "ncclshim_{}_{}_{}",
        algorithm.name(),
        dtype.kernel_suffix(),
        op.name()
    )
}

/// NVRTC's options for one element type's program.
pub fn options(dtype: DataType, arch: (i32, i32)) -> Vec<String> {
    let (name, cuda_type) = (dtype.kernel_suffix(), dtype.cuda_type());
    let mut types = format!("KERNELS({name},{cuda_type})");
    if Algorithm::Sentinel.supports(dtype) {
        types += &format!(" SENTINEL_KERNELS({name},{cuda_type})");
    }
    vec![
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "-std=c++17".into(),
        format!("-DMAX_THREADS={}", policy::MAX_THREADS),
        format!("-DMAX_RANKS={}", policy::MAX_RANKS),
        format!("-DMAX_BLOCKS={}", policy::MAX_BLOCKS),
        format!("-DLL_MAX_BYTES={}", policy::LL_MAX_BYTES),
        format!("-DSENTINEL_MAX_BYTES={}", policy::SENTINEL_MAX_BYTES),
        format!("-DNCCL_TYPES={types}"),
    ]
}

static LOADED: Mutex<Option<HashMap<i32, Arc<Kernels>>>> = Mutex::new(None);

/// The kernels of `device`, compiled (or read from the disk cache) and loaded on first use.
/// Needs the device's context current.
pub fn for_device(device: &Device) -> Result<Arc<Kernels>, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(kernels) = loaded.get_or_insert_with(HashMap::new).get(&device.ordinal) {
        return Ok(kernels.clone());
    }
    let arch = device.compute_capability().map_err(|e| e.to_string())?;
    let cubins = compile_all(arch)?;
    let modules = cubins
        .iter()
        .map(|cubin| cuda::load_module(cubin))
        .collect::<Result<Vec<_>, _>>();
    let modules = modules.map_err(|e| e.to_string())?;
    let mut functions = Vec::new();
    for algorithm in Algorithm::ALL {
        for (dtype, &module) in DataType::ALL.iter().zip(&modules) {
            for op in Op::ALL {
                if !algorithm.supports(*dtype) {
                    functions.push(None);
                    continue;
                }
                let name = kernel_name(algorithm, *dtype, op);
                let function =
                    cuda::get_function(module, &name).map_err(|e| format!("{name}: {e}"))?;
                functions.push(Some(function));
            }
        }
    }
    let two_shot_resident_blocks =
        two_shot_resident_blocks(&functions, device).map_err(|e| e.to_string())?;
    let kernels = Arc::new(Kernels {
        functions,
        two_shot_resident_blocks,
    });
    loaded
        .get_or_insert_with(HashMap::new)
        .insert(device.ordinal, kernels.clone());
    Ok(kernels)
}

/// One cubin per element type, in `DataType::ALL` order, compiled in parallel (or read from the
/// disk cache) once per architecture in this process.
pub fn compile_all(arch: (i32, i32)) -> Result<Arc<Vec<Vec<u8>>>, String> {
    type Cubins = Arc<Vec<Vec<u8>>>;
    static COMPILED: Mutex<Option<HashMap<(i32, i32), Cubins>>> = Mutex::new(None);
    let mut compiled = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cubins) = compiled.get_or_insert_with(HashMap::new).get(&arch) {
        return Ok(cubins.clone());
    }
    let cubins = Arc::new(compile_each_type(arch)?);
    compiled
        .get_or_insert_with(HashMap::new)
        .insert(arch, cubins.clone());
    Ok(cubins)
}

fn compile_each_type(arch: (i32, i32)) -> Result<Vec<Vec<u8>>, String> {
    std::thread::scope(|scope| {
        let jobs: Vec<_> = DataType::ALL
            .iter()
            .map(|&dtype| scope.spawn(move || cached_cubin(dtype, arch)))
            .collect();
        jobs.into_iter()
            .map(|job| {
                job.join()
                    .unwrap_or_else(|_| Err("NVRTC compilation panicked".into()))
            })
            .collect()
    })
}

fn cached_cubin(dtype: DataType, arch: (i32, i32)) -> Result<Vec<u8>, String> {
    let options = options(dtype, arch);
    let key = cache_key(&options);
    let path = cache_dir().map(|dir| dir.join(format!("all_reduce-{key:016x}.cubin")));
    if let Some(cubin) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(cubin);
    }
    let cubin = compile(&options)?;
    if let Some(path) = path {
        // Written whole, then renamed: processes compiling at once never read half a file.
        let partial = path.with_extension(format!("{}.partial", std::process::id()));
        if std::fs::create_dir_all(path.parent().unwrap()).is_ok()
            && std::fs::write(&partial, &cubin).is_ok()
        {
            let _ = std::fs::rename(&partial, &path);
        }
    }
    Ok(cubin)
}

/// `$NCCLSHIM_CACHE/kernels`, else `~/.cache/ncclshim/kernels`.
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("NCCLSHIM_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/ncclshim"))
        })?;
    Some(base.join("kernels"))
}

/// FNV-1a over the source, the options and NVRTC's version: stable across builds and runs.
fn cache_key(options: &[String]) -> u64 {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    let mut hash: u64 = 0xcbf29ce484222325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ b as u64).wrapping_mul(0x100000001b3);
        }
    };
    feed(SOURCE.as_bytes());
    for option in options {
        feed(option.as_bytes());
        feed(&[0]);
    }
    feed(&major.to_le_bytes());
    feed(&minor.to_le_bytes());
    hash
}

/// Compiles `all_reduce.cu` with `options` and returns the cubin.
pub fn compile(options: &[String]) -> Result<Vec<u8>, String> {
    let source = CString::new(SOURCE).expect("the kernel source has no NUL");
    let program = nvrtc::create_program(&source, Some(c"all_reduce.cu"))
        .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    // SAFETY: a program just created, destroyed below.
    let compiled = unsafe { nvrtc::compile_program(program, options) };
    let outcome = match compiled {
        Ok(()) => cubin_of(program),
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
    let mut size = 0usize;
    // SAFETY: a compiled program; the buffer has the size NVRTC gave.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(program, &mut size);
        let mut cubin = vec![0u8; size];
        let result = nvrtc_sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast());
        if result != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return Err(format!("nvrtcGetCUBIN: {result:?}"));
        }
        Ok(cubin)
    }
}
