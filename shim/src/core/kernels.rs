//! The core's kernels on each device: `device/` (program.rs), one program per element type. The
//! library carries them compiled for the architectures of `BUILT_IN_ARCHS` (the build script
//! compiles them), and as PTX for GPUs newer than those (the driver compiles it); for any other
//! GPU they are compiled at run time by NVRTC, in parallel, and cached on disk (keyed by source,
//! options and NVRTC version). Loaded functions are kept in memory, per device.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::cuda::{self, Device, Function};
use super::policy;
use super::program::{self, Arch, kernel_name};
use super::types::{Algorithm, DataType, Op};
use crate::log::log_info;

// BUILT_IN: [(architecture, its packed cubins)] and BUILT_IN_PTX, written by the build script
// (build/kernels.rs).
include!(concat!(env!("OUT_DIR"), "/built_in_kernels.rs"));

/// Every kernel of one device: `[algorithm][type][op]`, `None` where the algorithm does not
/// support the type and op.
pub struct Kernels {
    /// The device's compute capability.
    pub arch: Arch,
    functions: Vec<Option<Function>>,
    /// Blocks of `policy::MAX_THREADS` that every kernel whose grid must be resident at once
    /// (`Algorithm::needs_resident_grid`) can have on the device: the fewest of any type and op.
    pub two_shot_resident_blocks: u32,
    /// Blocks of `policy::MAX_THREADS` that every kernel can have on the device at once: the
    /// most a launch of several calls may have (its blocks wait for each other between calls).
    pub batch_resident_blocks: u32,
}

// SAFETY: CUfunction handles may be used from any thread.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// The device's compute capability as one number, e.g. 90.
    pub fn compute_capability(&self) -> u32 {
        (self.arch.0 * 10 + self.arch.1) as u32
    }

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

/// The fewest blocks of `policy::MAX_THREADS` that any kernel of the algorithms `which` picks
/// can have on the device at once (fewer threads per block fit at least as many blocks).
fn resident_blocks(
    functions: &[Option<Function>],
    device: &Device,
    which: impl Fn(Algorithm) -> bool,
) -> cuda::Cuda<u32> {
    let mut fewest = u32::MAX;
    for algorithm in Algorithm::ALL.into_iter().filter(|&a| which(a)) {
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

static LOADED: Mutex<Option<HashMap<i32, Arc<Kernels>>>> = Mutex::new(None);

/// The kernels of `device`, compiled (or read from the disk cache) and loaded on first use.
/// Needs the device's context current.
pub fn for_device(device: &Device) -> Result<Arc<Kernels>, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(kernels) = loaded.get_or_insert_with(HashMap::new).get(&device.ordinal) {
        return Ok(kernels.clone());
    }
    let arch = device.compute_capability().map_err(|e| e.to_string())?;
    let images = images_for(arch)?;
    let started = Instant::now();
    let modules = match load_modules(device, &images) {
        Ok(modules) if images.from == Source::Ptx => {
            log_info!(
                "loaded the core's kernels for sm_{}{} from the PTX the library carries in {:.1} s (compiled by the driver, which caches them)",
                arch.0,
                arch.1,
                started.elapsed().as_secs_f64()
            );
            modules
        }
        Ok(modules) => modules,
        Err(e) if images.from == Source::Ptx => {
            log_info!(
                "the driver could not load the PTX the library carries for sm_{}{} ({e}): NVRTC compiles the kernels",
                arch.0,
                arch.1
            );
            let compiled = compiled_instead_of_ptx(arch)?;
            load_modules(device, &compiled)?
        }
        Err(e) => return Err(e),
    };
    let mut functions = Vec::new();
    for algorithm in Algorithm::ALL {
        for (dtype, &module) in DataType::ALL.iter().zip(&modules) {
            for op in Op::ALL {
                if !algorithm.supports(*dtype, op) {
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
    let two_shot_resident_blocks = resident_blocks(&functions, device, |a| a.needs_resident_grid())
        .map_err(|e| e.to_string())?;
    let batch_resident_blocks =
        resident_blocks(&functions, device, |_| true).map_err(|e| e.to_string())?;
    let kernels = Arc::new(Kernels {
        arch,
        functions,
        two_shot_resident_blocks,
        batch_resident_blocks,
    });
    loaded
        .get_or_insert_with(HashMap::new)
        .insert(device.ordinal, kernels.clone());
    Ok(kernels)
}

/// The architectures whose kernels the library carries.
pub fn built_in_archs() -> Vec<Arch> {
    BUILT_IN.iter().map(|(arch, _)| *arch).collect()
}

/// The built-in kernels that run on `arch`: those of the same major version and the newest
/// minor one not past it (a cubin runs on later minor versions of its major one).
fn built_in_for(arch: Arch) -> Option<&'static (Arch, &'static [u8])> {
    BUILT_IN
        .iter()
        .filter(|((major, minor), _)| *major == arch.0 && *minor <= arch.1)
        .max_by_key(|((_, minor), _)| *minor)
}

/// Whether the library carries PTX (`built_in_ptx`): GPUs of `program::PTX_ARCH` or later run it.
pub fn carries_ptx() -> bool {
    !BUILT_IN_PTX.is_empty()
}

/// The PTX of `program::PTX_ARCH`'s programs, one per element type, each NUL-terminated as the
/// driver loads it, if the library carries it.
pub fn built_in_ptx() -> Result<Option<Vec<Vec<u8>>>, String> {
    if BUILT_IN_PTX.is_empty() {
        return Ok(None);
    }
    let programs = program::unpack(BUILT_IN_PTX)?;
    if programs.iter().any(|p| p.last() != Some(&0)) {
        return Err("the PTX the library carries is not NUL-terminated".into());
    }
    Ok(Some(programs))
}

/// Where a device's programs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The cubins the library carries for its architecture.
    BuiltIn,
    /// The PTX the library carries, which the driver compiles (a GPU newer than every built-in
    /// architecture).
    Ptx,
    /// NVRTC, at run time (or its disk cache).
    Nvrtc,
}

/// One program per element type, in `DataType::ALL` order, as the driver loads them.
pub struct Images {
    pub from: Source,
    pub images: Vec<Vec<u8>>,
}

/// Where the programs for `arch` come from: the built-in cubins, else the built-in PTX where
/// `arch` can run it (its architecture and every later one), else NVRTC.
pub fn source_for(arch: Arch) -> Source {
    if built_in_for(arch).is_some() {
        Source::BuiltIn
    } else if carries_ptx() && arch >= program::PTX_ARCH {
        Source::Ptx
    } else {
        Source::Nvrtc
    }
}

/// The programs for `arch`, from where `source_for` says; once per architecture in this process.
pub fn images_for(arch: Arch) -> Result<Arc<Images>, String> {
    let mut ready = READY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(images) = ready.get_or_insert_with(HashMap::new).get(&arch) {
        return Ok(images.clone());
    }
    let from = source_for(arch);
    let images = match (from, built_in_for(arch)) {
        (Source::BuiltIn, Some((_, packed))) => program::unpack(packed)?,
        (Source::Ptx, _) => built_in_ptx()?.ok_or("the library carries no PTX")?,
        _ => compile_with_nvrtc(arch)?,
    };
    let images = Arc::new(Images { from, images });
    ready
        .get_or_insert_with(HashMap::new)
        .insert(arch, images.clone());
    Ok(images)
}

/// The programs of each architecture, as `images_for` found them (or the fallback replaced them).
static READY: Mutex<Option<HashMap<Arch, Arc<Images>>>> = Mutex::new(None);

/// The programs for `arch` compiled by NVRTC, in place of PTX the driver could not load: the
/// architecture's other devices take them too.
fn compiled_instead_of_ptx(arch: Arch) -> Result<Arc<Images>, String> {
    let images = Arc::new(Images {
        from: Source::Nvrtc,
        images: compile_with_nvrtc(arch)?,
    });
    READY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(arch, images.clone());
    Ok(images)
}

/// One module per program. The driver compiles PTX here, each program on a thread of its own
/// (as NVRTC's compiles): a minute or more each on an H100's host, the first time.
fn load_modules(device: &Device, images: &Images) -> Result<Vec<cuda::Module>, String> {
    let loaded: Vec<cuda::Cuda<cuda::Module>> = match images.from {
        Source::Ptx => std::thread::scope(|scope| {
            let jobs: Vec<_> = (images.images.iter())
                .map(|image| {
                    // The handle as an address: a module serves every thread of its context.
                    scope.spawn(move || {
                        device.make_current()?;
                        cuda::load_module(image).map(|module| module as usize)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|job| {
                    job.join()
                        .unwrap_or_else(|_| Err(cuda::CudaError::panicked()))
                        .map(|address| address as cuda::Module)
                })
                .collect()
        }),
        _ => images
            .images
            .iter()
            .map(|image| cuda::load_module(image))
            .collect(),
    };
    loaded
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The kernels for a GPU the library carries none for, compiled by NVRTC (or read from the disk
/// cache), saying so: the first time on a machine this takes about a minute.
pub fn compile_with_nvrtc(arch: Arch) -> Result<Vec<Vec<u8>>, String> {
    super::nvrtc::load()?;
    let (major, minor) = program::nvrtc_version();
    let built_in: Vec<String> = built_in_archs()
        .iter()
        .map(|(a, b)| format!("sm_{a}{b}"))
        .collect();
    log_info!(
        "compiling the core's kernels for sm_{}{} with NVRTC {major}.{minor} (built in: {}): about a minute the first time on a machine, then cached{}",
        arch.0,
        arch.1,
        if built_in.is_empty() {
            "none".to_string()
        } else {
            built_in.join(", ")
        },
        cache_dir().map_or(String::new(), |d| format!(" in {}", d.display()))
    );
    let started = Instant::now();
    let cubins = compile_each_type(arch)?;
    log_info!(
        "compiled the core's kernels for sm_{}{} in {:.1} s",
        arch.0,
        arch.1,
        started.elapsed().as_secs_f64()
    );
    Ok(cubins)
}

fn compile_each_type(arch: Arch) -> Result<Vec<Vec<u8>>, String> {
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

/// Where the disk cache keeps the cubin of one type's program for `arch`, compiled at run time
/// (NVRTC loaded: its version is part of the key); `None` where there is no cache.
pub fn cached_cubin_path(dtype: DataType, arch: Arch) -> Option<PathBuf> {
    let options = program::options(dtype, arch);
    let key = program::fingerprint([options.as_slice()], program::nvrtc_version());
    cache_dir().map(|dir| dir.join(format!("all_reduce-{key:016x}.cubin")))
}

fn cached_cubin(dtype: DataType, arch: Arch) -> Result<Vec<u8>, String> {
    let path = cached_cubin_path(dtype, arch);
    if let Some(cubin) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(cubin);
    }
    let cubin = program::compile(&program::options(dtype, arch))?.cubin;
    if let Some(path) = path {
        program::keep_in_cache(&path, &cubin);
    }
    Ok(cubin)
}

/// Where the kernels compiled at run time are kept.
fn cache_dir() -> Option<PathBuf> {
    program::cache_dir("kernels")
}
