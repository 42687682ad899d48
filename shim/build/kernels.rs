//! Compiles the core's kernels ahead of time, so that no GPU the library carries kernels for
//! waits for NVRTC at run time: every element type's program for every architecture of
//! `NCCLSHIM_KERNEL_ARCHS` (default `program::BUILT_IN_ARCHS` and `ptx`, e.g. "80 90 100 120
//! ptx"; `ptx`: the PTX of `program::PTX_ARCH`'s programs, for newer GPUs), with the NVRTC
//! at `NCCLSHIM_BUILD_NVRTC` (or one the loader finds by name), packed per architecture into
//! `$OUT_DIR` and listed in `$OUT_DIR/built_in_kernels.rs` for `include_bytes!`. Packs are cached
//! across builds under `$NCCLSHIM_CACHE/built-in-kernels` (`~/.cache/ncclshim`), keyed by what
//! they are compiled from. Without NVRTC the library is built without kernels (and compiles
//! them at run time).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::program::{self, Arch};
use crate::types::DataType;

const WATCHED: [&str; 10] = [
    "src/core/device/device.cuh",
    "src/core/device/all_reduce.cu",
    "src/core/device/moves.cu",
    "src/core/device/reductions.cu",
    "src/core/device/packets.cu",
    "src/core/device/entry.cu",
    "src/core/program.rs",
    "src/core/limits.rs",
    "src/core/types.rs",
    "build/kernels.rs",
];

/// Writes `$OUT_DIR/built_in_kernels.rs`, compiling what the cache lacks; `Err` stops the build.
pub fn build(out_dir: &Path) -> Result<(), String> {
    for var in [
        "NCCLSHIM_BUILD_NVRTC",
        "NCCLSHIM_KERNEL_ARCHS",
        "NCCLSHIM_CACHE",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for file in WATCHED {
        println!("cargo:rerun-if-changed={file}");
    }
    let wanted = wanted()?;
    let packs = if wanted.archs.is_empty() && !wanted.ptx {
        Packs::default()
    } else if let Err(why) = load_nvrtc()? {
        println!(
            "cargo:warning=no kernels built in ({why}): the library compiles them with NVRTC at run time, a minute or more on each new machine. `make build` fetches NVRTC; or set NCCLSHIM_BUILD_NVRTC"
        );
        Packs::default()
    } else {
        packs(&wanted, out_dir)?
    };
    let mut table = String::from(
        "/// The kernels the library carries: (architecture, its packed cubins), from build/kernels.rs.\n\
         static BUILT_IN: &[((i32, i32), &[u8])] = &[\n",
    );
    for ((major, minor), path) in &packs.cubins {
        let path = path.to_str().ok_or("OUT_DIR is not UTF-8")?;
        table += &format!("    (({major}, {minor}), include_bytes!({path:?})),\n");
    }
    table += "];\n/// The PTX of `program::PTX_ARCH`'s programs, packed alike (empty: none).\n";
    match &packs.ptx {
        Some(path) => {
            let path = path.to_str().ok_or("OUT_DIR is not UTF-8")?;
            table += &format!("static BUILT_IN_PTX: &[u8] = include_bytes!({path:?});\n");
        }
        None => table += "static BUILT_IN_PTX: &[u8] = &[];\n",
    }
    std::fs::write(out_dir.join("built_in_kernels.rs"), table).map_err(|e| e.to_string())
}

/// What to build: cubins for `archs`, and whether the PTX of `program::PTX_ARCH`'s programs.
struct Wanted {
    archs: Vec<Arch>,
    ptx: bool,
}

/// `NCCLSHIM_KERNEL_ARCHS` ("90 100", "80 ptx", "none"), else every built-in architecture and
/// the PTX.
fn wanted() -> Result<Wanted, String> {
    let Ok(list) = std::env::var("NCCLSHIM_KERNEL_ARCHS") else {
        return Ok(Wanted {
            archs: program::BUILT_IN_ARCHS.to_vec(),
            ptx: true,
        });
    };
    let words: Vec<&str> = list
        .split([' ', ','])
        .filter(|w| !w.is_empty() && *w != "none")
        .collect();
    let archs = words
        .iter()
        .filter(|&&w| w != "ptx")
        .map(|word| {
            let digits = word.trim_start_matches("sm_");
            let number: i32 = digits.parse().map_err(|_| {
                format!("NCCLSHIM_KERNEL_ARCHS: {word:?} is not like 90, sm_100 or ptx")
            })?;
            Ok((number / 10, number % 10))
        })
        .collect::<Result<_, String>>()?;
    Ok(Wanted {
        archs,
        ptx: words.contains(&"ptx"),
    })
}

/// The packs written to `$OUT_DIR`: each architecture's cubins, and the PTX.
#[derive(Default)]
struct Packs {
    cubins: Vec<(Arch, PathBuf)>,
    ptx: Option<PathBuf>,
}

/// Makes NVRTC callable: `Ok(Err(why))` where none is found (the build goes on without kernels),
/// `Err` where the one named by NCCLSHIM_BUILD_NVRTC cannot be used (the build stops).
fn load_nvrtc() -> Result<Result<(), String>, String> {
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    let present = || unsafe { cudarc::nvrtc::sys::is_culib_present() };
    let Some(path) = std::env::var_os("NCCLSHIM_BUILD_NVRTC").filter(|p| !p.is_empty()) else {
        return Ok(present()
            .then_some(())
            .ok_or_else(|| "no NVRTC found by name, NCCLSHIM_BUILD_NVRTC unset".to_string()));
    };
    let path = PathBuf::from(path);
    println!("cargo:rerun-if-changed={}", path.display());
    let text = path.to_str().ok_or("NCCLSHIM_BUILD_NVRTC is not UTF-8")?;
    // SAFETY: NVIDIA's NVRTC library; kept loaded while the build script runs, so that cudarc's
    // lookup by name finds it.
    let library = unsafe { Library::open(Some(text), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("NCCLSHIM_BUILD_NVRTC={text}: {e}"))?;
    std::mem::forget(library);
    if !present() {
        return Err(format!(
            "NCCLSHIM_BUILD_NVRTC={text} loaded, but not as libnvrtc.so.N"
        ));
    }
    Ok(Ok(()))
}

/// One pack of `out_dir`, kept in the cache as `cached`.
struct PackFile {
    out: PathBuf,
    cached: Option<PathBuf>,
}

impl PackFile {
    /// The pack named `name`, copied from the cache where it is there (`true`).
    fn new(
        name: &str,
        out_dir: &Path,
        cache: Option<&PathBuf>,
    ) -> Result<(PackFile, bool), String> {
        let out = out_dir.join(name);
        let cached = cache.map(|dir| dir.join(name));
        let hit = match cached.as_ref().filter(|c| c.is_file()) {
            Some(cached) => {
                std::fs::copy(cached, &out).map_err(|e| format!("{}: {e}", cached.display()))?;
                true
            }
            None => false,
        };
        Ok((PackFile { out, cached }, hit))
    }

    /// Writes `packed` out and into the cache.
    fn write(&self, packed: &[u8]) -> Result<(), String> {
        std::fs::write(&self.out, packed).map_err(|e| format!("{}: {e}", self.out.display()))?;
        if let Some(cached) = &self.cached {
            program::keep_in_cache(cached, packed);
        }
        Ok(())
    }
}

/// Each wanted architecture's pack in `out_dir`, and the PTX's, from the cache or compiled (all
/// programs of every architecture with a pack missing at once, one per core).
fn packs(wanted: &Wanted, out_dir: &Path) -> Result<Packs, String> {
    let nvrtc = program::nvrtc_version();
    let cache = program::cache_dir("built-in-kernels");
    let mut archs = wanted.archs.clone();
    if wanted.ptx && !archs.contains(&program::PTX_ARCH) {
        archs.push(program::PTX_ARCH);
    }
    // Per architecture: its programs, its cubins' pack (where wanted), its PTX's (PTX_ARCH's).
    let mut missing = Vec::new();
    let mut files = Vec::new();
    for &arch in &archs {
        let programs = DataType::ALL.map(|t| program::options(t, arch));
        let key = program::fingerprint(programs.iter().map(Vec::as_slice), nvrtc);
        let (sm, layout) = (format!("sm_{}{}", arch.0, arch.1), program::PACK_LAYOUT);
        let mut complete = true;
        let mut file = |name: String| -> Result<PackFile, String> {
            let (file, hit) = PackFile::new(&name, out_dir, cache.as_ref())?;
            complete &= hit;
            Ok(file)
        };
        let cubins = match wanted.archs.contains(&arch) {
            true => Some(file(format!("{sm}-{key:016x}.cubins-{layout}.zst"))?),
            false => None,
        };
        let ptx = match wanted.ptx && arch == program::PTX_ARCH {
            true => Some(file(format!("{sm}-{key:016x}.ptx-{layout}.zst"))?),
            false => None,
        };
        if !complete {
            missing.push((arch, programs));
        }
        files.push((arch, cubins, ptx));
    }
    let jobs: Vec<(usize, usize)> = (0..missing.len())
        .flat_map(|a| (0..DataType::ALL.len()).map(move |t| (a, t)))
        .collect();
    let mut compiled = compile_in_parallel(&missing, &jobs)?.into_iter();
    for (arch, _) in &missing {
        let programs: Vec<program::Compiled> =
            compiled.by_ref().take(DataType::ALL.len()).collect();
        let (_, cubins, ptx) = files.iter().find(|(a, ..)| a == arch).unwrap();
        if let Some(cubins) = cubins {
            let images: Vec<Vec<u8>> = programs.iter().map(|p| p.cubin.clone()).collect();
            cubins.write(&program::pack(&images)?)?;
        }
        if let Some(ptx) = ptx {
            let images: Vec<Vec<u8>> = programs.iter().map(|p| p.ptx.clone()).collect();
            ptx.write(&program::pack(&images)?)?;
        }
    }
    let mut packs = Packs::default();
    for (arch, cubins, ptx) in files {
        if let Some(cubins) = cubins {
            packs.cubins.push((arch, cubins.out));
        }
        if let Some(ptx) = ptx {
            packs.ptx = Some(ptx.out);
        }
    }
    Ok(packs)
}

/// Compiles `jobs` (architecture, type) of `missing` on every core; the programs in job order.
fn compile_in_parallel(
    missing: &[(Arch, [Vec<String>; DataType::ALL.len()])],
    jobs: &[(usize, usize)],
) -> Result<Vec<program::Compiled>, String> {
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut done: Vec<(usize, Result<program::Compiled, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.min(jobs.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(&(a, t)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        mine.push((
                            a * DataType::ALL.len() + t,
                            program::compile(&missing[a].1[t]),
                        ));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a compiling thread panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, compiled)| compiled).collect()
}
