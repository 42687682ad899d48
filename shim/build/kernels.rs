//! The core's kernels, compiled ahead of time, so that no GPU the library carries kernels for
//! waits for NVRTC at run time: every element type's program for every architecture of
//! `NCCLSHIM_KERNEL_ARCHS` (default `program::BUILT_IN_ARCHS` and `ptx`, e.g. "80 90 100 120
//! ptx"; `ptx`: the PTX of `program::PTX_ARCH`'s programs, for newer GPUs), packed per
//! architecture into `$OUT_DIR` and listed in `$OUT_DIR/built_in_kernels.rs` for
//! `include_bytes!`. Each pack is named for what it is compiled from (`program::pack_name`) and
//! taken from the first place that has it: `shim/kernels/` (committed: this source's default
//! packs, as `program::BUILD_NVRTC` compiles them), the cache `$NCCLSHIM_CACHE/built-in-kernels`
//! (`~/.cache/ncclshim`), else compiled there with NVRTC: the one at `NCCLSHIM_BUILD_NVRTC`,
//! else the one the script `NCCLSHIM_FETCH_NVRTC` fetches (gen/fetch-nvrtc.sh), else one the
//! loader finds by name. Without NVRTC the library carries what was found (and compiles the rest
//! at run time). `NCCLSHIM_KERNELS_UPDATE=1` (`make kernels`) puts this source's default packs
//! into `shim/kernels/` and takes the others out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::program::{self, Arch, PackKind};
use crate::types::DataType;

const WATCHED: [&str; 11] = [
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
    "kernels",
];

/// Writes `$OUT_DIR/built_in_kernels.rs`, compiling what no pack holds; `Err` stops the build.
pub fn build(out_dir: &Path) -> Result<(), String> {
    for var in [
        "NCCLSHIM_BUILD_NVRTC",
        "NCCLSHIM_FETCH_NVRTC",
        "NCCLSHIM_KERNEL_ARCHS",
        "NCCLSHIM_KERNELS_UPDATE",
        "NCCLSHIM_CACHE",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for file in WATCHED {
        println!("cargo:rerun-if-changed={file}");
    }
    let wanted = wanted()?;
    let update = std::env::var("NCCLSHIM_KERNELS_UPDATE").is_ok_and(|v| v == "1");
    if update && !wanted.is_default() {
        return Err("make kernels writes every built-in architecture's kernels: unset NCCLSHIM_KERNEL_ARCHS".into());
    }
    let packs = match wanted.archs.is_empty() && !wanted.ptx {
        true => Packs::default(),
        false => packs(&wanted, out_dir)?,
    };
    if update {
        commit(&packs)?;
    }
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

impl Wanted {
    /// Every built-in architecture and the PTX, as a library is built by default.
    fn is_default(&self) -> bool {
        self.ptx
            && program::BUILT_IN_ARCHS
                .iter()
                .all(|a| self.archs.contains(a))
    }
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

/// `shim/kernels/`: this source's default packs, committed.
fn committed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernels")
}

/// Loads the NVRTC at `path` for the build: `Err` where it cannot be used.
fn open_nvrtc(path: &Path) -> Result<(), String> {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = path.to_str().ok_or("the NVRTC's path is not UTF-8")?;
    // SAFETY: NVIDIA's NVRTC library; kept loaded while the build script runs, so that cudarc's
    // lookup by name finds it.
    let library = unsafe { Library::open(Some(text), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("NVRTC {text}: {e}"))?;
    std::mem::forget(library);
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    match unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        true => Ok(()),
        false => Err(format!("NVRTC {text} loaded, but not as libnvrtc.so.N")),
    }
}

/// Loads the NVRTC named by NCCLSHIM_BUILD_NVRTC (`true`), if it is set.
fn given_nvrtc() -> Result<bool, String> {
    match std::env::var_os("NCCLSHIM_BUILD_NVRTC").filter(|p| !p.is_empty()) {
        Some(path) => open_nvrtc(Path::new(&path)).map(|()| true),
        None => Ok(false),
    }
}

/// Makes an NVRTC callable when no pack has the kernels: the one NCCLSHIM_FETCH_NVRTC's script
/// fetches, else one the loader finds by name; `Ok(Err(why))` where there is none (the build goes
/// on), `Err` where the script fails (the build stops).
fn find_nvrtc() -> Result<Result<(), String>, String> {
    if let Some(script) = std::env::var_os("NCCLSHIM_FETCH_NVRTC").filter(|s| !s.is_empty()) {
        let shown = Path::new(&script).display().to_string();
        let output = Command::new(&script)
            .output()
            .map_err(|e| format!("NCCLSHIM_FETCH_NVRTC={shown}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "NCCLSHIM_FETCH_NVRTC={shown} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
        return open_nvrtc(Path::new(&path)).map(Ok);
    }
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    Ok(present
        .then_some(())
        .ok_or_else(|| "no NVRTC found by name, NCCLSHIM_BUILD_NVRTC unset".to_string()))
}

/// One pack of `out_dir`, kept in the cache as `cached`.
struct PackFile {
    out: PathBuf,
    cached: Option<PathBuf>,
}

impl PackFile {
    /// The pack named `name`, copied from the first of `sources` that has it (`true`).
    fn new(
        name: &str,
        out_dir: &Path,
        sources: &[&Path],
        cache: Option<&PathBuf>,
    ) -> Result<(PackFile, bool), String> {
        let out = out_dir.join(name);
        let cached = cache.map(|dir| dir.join(name));
        let hit = match sources
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
        {
            Some(source) => {
                std::fs::copy(&source, &out).map_err(|e| format!("{}: {e}", source.display()))?;
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

/// Per architecture: its cubins' pack (where wanted) and its PTX's (`PTX_ARCH`'s), each with
/// whether it was found.
type Located = Vec<(Arch, Option<(PackFile, bool)>, Option<(PackFile, bool)>)>;

/// Where each wanted pack of NVRTC `nvrtc`'s is: copied into `out_dir` from `shim/kernels/` or
/// the cache where one has it.
fn locate(wanted: &Wanted, out_dir: &Path, nvrtc: (i32, i32)) -> Result<Located, String> {
    let cache = program::cache_dir("built-in-kernels");
    let committed = committed_dir();
    let mut sources = vec![committed.as_path()];
    sources.extend(cache.as_deref());
    let mut archs = wanted.archs.clone();
    if wanted.ptx && !archs.contains(&program::PTX_ARCH) {
        archs.push(program::PTX_ARCH);
    }
    let file = |arch, kind| {
        let name = program::pack_name(arch, kind, nvrtc);
        PackFile::new(&name, out_dir, &sources, cache.as_ref())
    };
    archs
        .into_iter()
        .map(|arch| {
            let cubins = match wanted.archs.contains(&arch) {
                true => Some(file(arch, PackKind::Cubins)?),
                false => None,
            };
            let ptx = match wanted.ptx && arch == program::PTX_ARCH {
                true => Some(file(arch, PackKind::Ptx)?),
                false => None,
            };
            Ok((arch, cubins, ptx))
        })
        .collect()
}

/// The architectures of `located` that lack a pack.
fn lacking(located: &Located) -> impl Iterator<Item = Arch> + '_ {
    located.iter().filter_map(|(arch, cubins, ptx)| {
        let found = |p: &Option<(PackFile, bool)>| p.as_ref().is_none_or(|(_, hit)| *hit);
        (!found(cubins) || !found(ptx)).then_some(*arch)
    })
}

/// Each wanted architecture's pack in `out_dir`, and the PTX's: found, else compiled (all
/// programs of every architecture with a pack missing at once, one per core).
fn packs(wanted: &Wanted, out_dir: &Path) -> Result<Packs, String> {
    // Packs are named for the NVRTC given, else for the one the committed packs are of.
    let given = given_nvrtc()?;
    let named_for = match given {
        true => program::nvrtc_version(),
        false => program::BUILD_NVRTC,
    };
    let mut located = locate(wanted, out_dir, named_for)?;
    if !given && lacking(&located).next().is_some() {
        if let Err(why) = find_nvrtc()? {
            println!(
                "cargo:warning=some kernels are not built in ({why}): the library compiles them with NVRTC at run time, a minute or more on each new machine. `make build` fetches NVRTC; or set NCCLSHIM_BUILD_NVRTC"
            );
            return Ok(found_only(located));
        }
        let loaded = program::nvrtc_version();
        if loaded != named_for {
            located = locate(wanted, out_dir, loaded)?;
        }
    }
    let missing: Vec<(Arch, [Vec<String>; DataType::ALL.len()])> = lacking(&located)
        .map(|arch| (arch, DataType::ALL.map(|t| program::options(t, arch))))
        .collect();
    let jobs: Vec<(usize, usize)> = (0..missing.len())
        .flat_map(|a| (0..DataType::ALL.len()).map(move |t| (a, t)))
        .collect();
    let mut compiled = compile_in_parallel(&missing, &jobs)?.into_iter();
    for (arch, _) in &missing {
        let programs: Vec<program::Compiled> =
            compiled.by_ref().take(DataType::ALL.len()).collect();
        let (_, cubins, ptx) = located.iter().find(|(a, ..)| a == arch).unwrap();
        if let Some((cubins, _)) = cubins {
            let images: Vec<Vec<u8>> = programs.iter().map(|p| p.cubin.clone()).collect();
            cubins.write(&program::pack(&images)?)?;
        }
        if let Some((ptx, _)) = ptx {
            let images: Vec<Vec<u8>> = programs.iter().map(|p| p.ptx.clone()).collect();
            ptx.write(&program::pack(&images)?)?;
        }
    }
    Ok(all_of(located))
}

/// The packs of `located`, every one of them there.
fn all_of(located: Located) -> Packs {
    let mut packs = Packs::default();
    for (arch, cubins, ptx) in located {
        if let Some((cubins, _)) = cubins {
            packs.cubins.push((arch, cubins.out));
        }
        if let Some((ptx, _)) = ptx {
            packs.ptx = Some(ptx.out);
        }
    }
    packs
}

/// The packs of `located` that were found.
fn found_only(located: Located) -> Packs {
    let keep = |p: Option<(PackFile, bool)>| p.filter(|(_, hit)| *hit);
    all_of(
        located
            .into_iter()
            .map(|(arch, cubins, ptx)| (arch, keep(cubins), keep(ptx)))
            .collect(),
    )
}

/// `make kernels`: puts `packs` (every default one) into `shim/kernels/`, and takes out the
/// packs there that this source no longer compiles to.
fn commit(packs: &Packs) -> Result<(), String> {
    let dir = committed_dir();
    let wanted = program::default_packs();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let paths = packs
        .cubins
        .iter()
        .map(|(_, p)| p)
        .chain(packs.ptx.as_ref());
    for path in paths {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !wanted.iter().any(|w| *w == name) {
            return Err(format!(
                "make kernels: {name} is not compiled by NVRTC {}.{}, which the committed kernels are",
                program::BUILD_NVRTC.0,
                program::BUILD_NVRTC.1
            ));
        }
        let to = dir.join(&*name);
        if !to.is_file() {
            std::fs::copy(path, &to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".zst") && !wanted.contains(&name) {
            std::fs::remove_file(entry.path()).map_err(|e| format!("{name}: {e}"))?;
        }
    }
    Ok(())
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
