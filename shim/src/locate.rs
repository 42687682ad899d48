//! Where the real NCCL is: `NCCLSHIM_REAL_NCCL` (an absolute path, of the library or of a
//! folder holding it), else the path given at build time (`make build REAL_NCCL_LIB=...`), else a
//! search of the usual places. Any file that is ncclshim itself is passed over. Pure logic over a
//! `SearchEnv`, so that tests can drive it.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Folders searched after NCCL_HOME, LD_LIBRARY_PATH, the Python environments and conda's
/// (`system_dirs`): Debian's and Ubuntu's for this processor (NVIDIA's libnccl2 package),
/// RHEL's (its libnccl package), NVIDIA's archive unpacked, CUDA's.
pub const SYSTEM_DIRS: &[&str] = &[
    MULTIARCH_DIR,
    "/usr/lib64",
    "/usr/local/nccl/lib",
    "/usr/local/cuda/lib64",
];
#[cfg(target_arch = "aarch64")]
const MULTIARCH_DIR: &str = "/usr/lib/aarch64-linux-gnu";
#[cfg(not(target_arch = "aarch64"))]
const MULTIARCH_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const FILE_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];
/// Where NVIDIA's wheels (`nvidia-nccl-cu12`, `nvidia-nccl-cu13`) put the library, inside a
/// Python environment's `site-packages`.
const WHEEL_DIR: &str = "nvidia/nccl/lib";

/// What the search looks at, read from the process's environment or made up by a test.
#[derive(Clone, Debug, Default)]
pub struct SearchEnv {
    pub explicit: Option<OsString>,
    pub build_default: Option<PathBuf>,
    pub nccl_home: Option<PathBuf>,
    /// The folders of `LD_LIBRARY_PATH`, in order.
    pub library_path: Vec<PathBuf>,
    /// The Python packages folder ncclshim itself was installed into (by its wheel:
    /// `<it>/ncclshim/lib/libnccl.so.2`), where `pip install ncclshim[cu12]` put NVIDIA's NCCL
    /// too: searched before the Python environments, whether or not its environment is active.
    pub own_packages: Option<PathBuf>,
    /// Prefixes of Python environments (`$VIRTUAL_ENV`, `$CONDA_PREFIX`, the parents of `bin`
    /// folders on `PATH`, the usual system ones).
    pub python_prefixes: Vec<PathBuf>,
    pub system_dirs: Vec<PathBuf>,
}

impl SearchEnv {
    pub fn from_process() -> SearchEnv {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut python_prefixes: Vec<PathBuf> = Vec::new();
        python_prefixes.extend(var("VIRTUAL_ENV").map(PathBuf::from));
        python_prefixes.extend(var("CONDA_PREFIX").map(PathBuf::from));
        if let Some(path) = var("PATH") {
            python_prefixes.extend(
                std::env::split_paths(&path)
                    .filter(|d| d.ends_with("bin"))
                    .filter_map(|d| d.parent().map(Path::to_path_buf)),
            );
        }
        if let Some(home) = var("HOME") {
            python_prefixes.push(Path::new(&home).join(".local"));
        }
        python_prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
        // Virtual environments kept under /opt (e.g. /opt/torch/.venv).
        if let Ok(entries) = std::fs::read_dir("/opt") {
            let mut opt: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            opt.sort();
            for dir in opt {
                python_prefixes.push(dir.join(".venv"));
                python_prefixes.push(dir);
            }
        }
        let mut seen = std::collections::HashSet::new();
        python_prefixes.retain(|p| seen.insert(p.clone()));
        let built = env!("NCCLSHIM_BUILD_REAL_NCCL");
        SearchEnv {
            explicit: crate::nccl_env::get_os("NCCLSHIM_REAL_NCCL").filter(|v| !v.is_empty()),
            build_default: (!built.is_empty()).then(|| PathBuf::from(built)),
            nccl_home: var("NCCL_HOME").map(PathBuf::from),
            library_path: var("LD_LIBRARY_PATH")
                .map(|v| library_path_dirs(&v.to_string_lossy()))
                .unwrap_or_default(),
            own_packages: own_library().as_deref().and_then(packages_holding),
            python_prefixes,
            system_dirs: system_dirs(var("CONDA_PREFIX").map(PathBuf::from)),
        }
    }
}

/// The library folders searched last: those of conda environments (`conda install nccl` puts
/// the library in the environment's `lib/`): `$CONDA_PREFIX`'s, then `/opt/conda`'s (container
/// images' base environment, where no shell activated it); then `SYSTEM_DIRS`.
fn system_dirs(conda_prefix: Option<PathBuf>) -> Vec<PathBuf> {
    let conda = conda_prefix
        .into_iter()
        .chain([PathBuf::from("/opt/conda")]);
    conda
        .map(|prefix| prefix.join("lib"))
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .collect()
}

/// The Python packages folder holding the ncclshim library at `library`, where that is its
/// wheel's place (`<packages>/ncclshim/lib/<library>`, beside the package's `__init__.py`; not
/// an installation such as `make install PREFIX=/opt/ncclshim`).
pub fn packages_holding(library: &Path) -> Option<PathBuf> {
    let lib = library.parent()?;
    let package = lib.parent()?;
    let wheels = lib.file_name()? == "lib"
        && package.file_name()? == "ncclshim"
        && package.join("__init__.py").is_file();
    wheels
        .then(|| package.parent().map(Path::to_path_buf))
        .flatten()
}

#[repr(C)]
struct DlInfo {
    fname: *const std::ffi::c_char,
    fbase: *mut std::ffi::c_void,
    sname: *const std::ffi::c_char,
    saddr: *mut std::ffi::c_void,
}

unsafe extern "C" {
    fn dladdr(address: *const std::ffi::c_void, info: *mut DlInfo) -> std::ffi::c_int;
}

/// The file this code was loaded from, as the loader names it (the shim's library: the path it
/// was opened by; in a program built with this crate, the program's name as it was started, as
/// glibc gives it), resolved from the current folder, links too.
fn own_library() -> Option<PathBuf> {
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr fills `info` for an address of this object's code; the name it gives lives
    // as long as the object stays loaded, and is copied at once.
    let name = unsafe {
        if dladdr(own_library as *const std::ffi::c_void, &mut info) == 0 || info.fname.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(info.fname)
    };
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()))
        .canonicalize()
        .ok()
}

/// The folders of an `LD_LIBRARY_PATH` value, as the loader reads it: separated by `:` or `;`;
/// relative ones are taken from the current folder; empty ones are left out.
fn library_path_dirs(value: &str) -> Vec<PathBuf> {
    let here = std::env::current_dir().ok();
    value
        .split([':', ';'])
        .filter(|d| !d.is_empty())
        .map(|d| match &here {
            Some(here) if Path::new(d).is_relative() => here.join(d),
            _ => PathBuf::from(d),
        })
        .collect()
}

/// How the real NCCL was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Variable,
    BuildDefault,
    Search,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Variable => "NCCLSHIM_REAL_NCCL",
            Origin::BuildDefault => "the build's REAL_NCCL_LIB",
            Origin::Search => "searching",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub origin: Origin,
}

/// Why nothing was found: every place looked at, in order, with what was wrong with it.
#[derive(Debug, Default)]
pub struct NotFound {
    pub looked_at: Vec<(PathBuf, &'static str)>,
}

impl NotFound {
    /// Notes a place once, however many names it has (`libnccl.so`, a link to `libnccl.so.2`).
    fn note(&mut self, place: &Path, why: &'static str) {
        let key = canonical(place);
        if !self.looked_at.iter().any(|(p, _)| canonical(p) == key) {
            self.looked_at.push((place.to_path_buf(), why));
        }
    }

    /// Each place looked at, with what was wrong with it: "/usr/local/cuda/lib64 (no such folder)".
    pub fn places(&self) -> Vec<String> {
        if self.looked_at.is_empty() {
            return vec![NOWHERE.into()];
        }
        self.looked_at
            .iter()
            .map(|(p, why)| format!("{} ({why})", p.display()))
            .collect()
    }
}

/// What is said where no place was named and none of the guessed ones exists.
const NOWHERE: &str =
    "nowhere: no NCCL_HOME, LD_LIBRARY_PATH, Python environment or system library folder";

/// The path with every link resolved, as far as it exists: a folder that doesn't exist may still
/// be reached twice through a link (`/lib` is `/usr/lib` on most systems).
fn canonical(path: &Path) -> PathBuf {
    path.ancestors()
        .find_map(|at| Some(at.canonicalize().ok()?.join(path.strip_prefix(at).ok()?)))
        .unwrap_or_else(|| path.to_path_buf())
}

/// The places looked at, one a line, indented: what follows "looked at:" in a message.
impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.places().iter().map(|p| format!("    {p}")).collect();
        f.write_str(&lines.join("\n"))
    }
}

/// How to get NVIDIA's NCCL and point ncclshim at it: the fix, when none is found.
pub const HOW_TO_GET_NCCL: &str = "Set NCCLSHIM_REAL_NCCL=/abs/path/libnccl.so.2 (NVIDIA's library, or the folder holding it), or `pip install nvidia-nccl-cu12` (CUDA 12) or `pip install nvidia-nccl-cu13` (CUDA 13) into the program's Python environment, where the search finds it";

/// Finds the real NCCL. `is_shim` tells whether a file is ncclshim (this library or a copy).
pub fn find_real_nccl(env: &SearchEnv, is_shim: impl Fn(&Path) -> bool) -> Result<Found, NotFound> {
    let mut not_found = NotFound::default();
    // An explicit choice is final: if it is unusable, say so rather than load something else.
    if let Some(explicit) = &env.explicit {
        return match chosen(Path::new(explicit), &is_shim, &mut not_found) {
            Some(path) => Ok(Found {
                path,
                origin: Origin::Variable,
            }),
            None => Err(not_found),
        };
    }
    if let Some(built) = &env.build_default
        && let Some(path) = chosen(built, &is_shim, &mut not_found)
    {
        return Ok(Found {
            path,
            origin: Origin::BuildDefault,
        });
    }
    for dir in search_dirs(env) {
        if let Some(path) = in_folder(&dir, &is_shim, &mut not_found) {
            return Ok(Found {
                path,
                origin: Origin::Search,
            });
        }
    }
    Err(not_found)
}

/// The library a chosen path names: the file itself, or the library in the folder it names.
fn chosen(
    path: &Path,
    is_shim: &impl Fn(&Path) -> bool,
    not_found: &mut NotFound,
) -> Option<PathBuf> {
    if !path.is_absolute() {
        not_found.note(path, "not an absolute path");
        None
    } else if path.is_dir() {
        in_folder(path, is_shim, not_found)
    } else if !path.is_file() {
        not_found.note(path, "no such file");
        None
    } else if is_shim(path) {
        not_found.note(path, "that is ncclshim itself");
        None
    } else {
        Some(path.to_path_buf())
    }
}

/// The first `libnccl.so.2` or `libnccl.so` in `dir` that is not ncclshim.
fn in_folder(
    dir: &Path,
    is_shim: &impl Fn(&Path) -> bool,
    not_found: &mut NotFound,
) -> Option<PathBuf> {
    if !dir.is_dir() {
        not_found.note(dir, "no such folder");
        return None;
    }
    let mut passed_over = false;
    for name in FILE_NAMES {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        if !is_shim(&path) {
            return Some(path);
        }
        not_found.note(&path, "that is ncclshim itself");
        passed_over = true;
    }
    if !passed_over {
        not_found.note(dir, "a folder without libnccl.so.2");
    }
    None
}

/// The folders searched, in order: `$NCCL_HOME/lib`, the folders of `LD_LIBRARY_PATH`, the
/// `nvidia/nccl/lib` folder beside ncclshim's own package, then that of every Python
/// environment, then the system folders. Each once (a folder reached again through a link too). Those the user named (`NCCL_HOME`,
/// `LD_LIBRARY_PATH`) are searched, and reported, even where they don't exist; those guessed
/// only where there is something: Python environments that exist, system folders that exist.
fn search_dirs(env: &SearchEnv) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    dirs.extend(env.nccl_home.iter().map(|home| home.join("lib")));
    dirs.extend(env.library_path.iter().cloned());
    dirs.extend(env.own_packages.iter().map(|p| p.join(WHEEL_DIR)));
    dirs.extend(env.python_package_dirs(&[WHEEL_DIR]));
    dirs.extend(env.system_dirs.iter().filter(|d| d.is_dir()).cloned());
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(canonical(d)));
    dirs
}

impl SearchEnv {
    /// `<prefix>/lib/python3.*/{site,dist}-packages/<sub>` for every Python environment and
    /// every `sub` (NVIDIA's wheels put their libraries there), in search order.
    pub fn python_package_dirs(&self, subs: &[&str]) -> Vec<PathBuf> {
        self.python_prefixes
            .iter()
            .flat_map(|prefix| self.python_package_dirs_of(prefix, subs))
            .collect()
    }

    /// As `python_package_dirs`, for one prefix; empty where it has no
    /// `lib/python3.*/{site,dist}-packages`.
    fn python_package_dirs_of(&self, prefix: &Path, subs: &[&str]) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            return Vec::new();
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        let mut dirs = Vec::new();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let packages = python.join(packages);
                if packages.is_dir() {
                    dirs.extend(subs.iter().map(|sub| packages.join(sub)));
                }
            }
        }
        dirs
    }
}

/// A fresh folder for a unit test's files, under the cargo target folder the test binary was
/// built in (never the system's temporary folder); removed when dropped.
#[cfg(test)]
pub(crate) struct Scratch(pub PathBuf);

#[cfg(test)]
impl Scratch {
    pub(crate) fn new(name: &str) -> Scratch {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The test binary is <target>/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().unwrap();
        let target = exe.ancestors().nth(3).unwrap();
        let dir = target
            .join("unit-scratch")
            .join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

#[cfg(test)]
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        // The shared parent too, once the last test's folder is gone.
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Scratch {
        let scratch = Scratch::new("locate");
        for dir in [
            "home/lib",
            "venv/lib/python3.12/site-packages/nvidia/nccl/lib",
            "sys",
            "empty",
            "ld1",
            "ld2",
        ] {
            std::fs::create_dir_all(scratch.0.join(dir)).unwrap();
        }
        scratch
    }

    fn lib(path: &Path, content: &str) {
        std::fs::write(path, content).unwrap();
    }

    fn is_shim(p: &Path) -> bool {
        std::fs::read_to_string(p).is_ok_and(|c| c == "shim")
    }

    #[test]
    fn the_variable_wins_and_is_final() {
        let scratch = tree();
        let root = &scratch.0;
        lib(&root.join("sys/libnccl.so.2"), "real");
        lib(&root.join("chosen.so"), "real");
        let env = SearchEnv {
            explicit: Some(root.join("chosen.so").into()),
            system_dirs: vec![root.join("sys")],
            ..Default::default()
        };
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap(),
            Found {
                path: root.join("chosen.so"),
                origin: Origin::Variable
            }
        );
        // Unusable choices are refused, not replaced by the search's find.
        for (bad, why) in [
            ("relative/libnccl.so.2", "not an absolute path"),
            ("/nonexistent/libnccl.so.2", "no such file"),
        ] {
            let err = find_real_nccl(
                &SearchEnv {
                    explicit: Some(bad.into()),
                    ..env.clone()
                },
                is_shim,
            )
            .unwrap_err();
            assert_eq!(err.looked_at, vec![(PathBuf::from(bad), why)]);
        }
        lib(&root.join("chosen.so"), "shim");
        let err = find_real_nccl(&env, is_shim).unwrap_err();
        assert!(err.to_string().contains("that is ncclshim itself"), "{err}");
    }

    #[test]
    fn the_variable_may_name_the_folder_holding_the_library() {
        let scratch = tree();
        let root = &scratch.0;
        let folder = root.join("venv/lib/python3.12/site-packages/nvidia/nccl/lib");
        let env = SearchEnv {
            explicit: Some(folder.clone().into()),
            system_dirs: vec![root.join("sys")],
            ..Default::default()
        };
        lib(&root.join("sys/libnccl.so.2"), "real");
        // A folder without the library: said precisely, and final.
        let err = find_real_nccl(&env, is_shim).unwrap_err();
        assert_eq!(
            err.looked_at,
            vec![(folder.clone(), "a folder without libnccl.so.2")]
        );
        lib(&folder.join("libnccl.so.2"), "real");
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap(),
            Found {
                path: folder.join("libnccl.so.2"),
                origin: Origin::Variable
            }
        );
        // A folder of ncclshim's (build/lib): refused, naming the file.
        lib(&folder.join("libnccl.so.2"), "shim");
        let err = find_real_nccl(&env, is_shim).unwrap_err();
        assert_eq!(
            err.looked_at,
            vec![(folder.join("libnccl.so.2"), "that is ncclshim itself")]
        );
    }

    #[test]
    fn the_build_default_comes_next_and_falls_back_to_the_search() {
        let scratch = tree();
        let root = &scratch.0;
        lib(&root.join("sys/libnccl.so.2"), "real");
        lib(&root.join("built.so"), "real");
        let env = SearchEnv {
            build_default: Some(root.join("built.so")),
            system_dirs: vec![root.join("sys")],
            ..Default::default()
        };
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap().origin,
            Origin::BuildDefault
        );
        let moved = SearchEnv {
            build_default: Some(root.join("gone.so")),
            ..env
        };
        assert_eq!(
            find_real_nccl(&moved, is_shim).unwrap(),
            Found {
                path: root.join("sys/libnccl.so.2"),
                origin: Origin::Search
            }
        );
    }

    #[test]
    fn the_search_goes_home_library_path_python_system_and_skips_the_shim() {
        let scratch = tree();
        let root = &scratch.0;
        let python = root.join("venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2");
        lib(&root.join("sys/libnccl.so.2"), "real");
        lib(&python, "real");
        lib(&root.join("home/lib/libnccl.so.2"), "shim");
        // LD_LIBRARY_PATH as deployed: the shim's folder first, then the real NCCL's.
        lib(&root.join("ld1/libnccl.so.2"), "shim");
        lib(&root.join("ld1/libnccl.so"), "shim");
        lib(&root.join("ld2/libnccl.so.2"), "real");
        let env = SearchEnv {
            nccl_home: Some(root.join("home")),
            library_path: vec![root.join("missing"), root.join("ld1"), root.join("ld2")],
            python_prefixes: vec![root.join("empty"), root.join("venv")],
            system_dirs: vec![root.join("sys")],
            ..Default::default()
        };
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap().path,
            root.join("ld2/libnccl.so.2")
        );
        std::fs::remove_file(root.join("ld2/libnccl.so.2")).unwrap();
        assert_eq!(find_real_nccl(&env, is_shim).unwrap().path, python);
        std::fs::remove_file(&python).unwrap();
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap().path,
            root.join("sys/libnccl.so.2")
        );
        // A plain libnccl.so counts too.
        std::fs::rename(root.join("sys/libnccl.so.2"), root.join("sys/libnccl.so")).unwrap();
        assert_eq!(
            find_real_nccl(&env, is_shim).unwrap().path,
            root.join("sys/libnccl.so")
        );
    }

    /// A wheel installed where no environment is active (its library preloaded by path, or
    /// installed with `pip install --target`): NVIDIA's NCCL beside its package comes before
    /// any other Python environment's.
    #[test]
    fn the_nccl_beside_the_shims_own_package_comes_before_other_environments() {
        let scratch = tree();
        let root = &scratch.0;
        let packages = root.join("target-dir");
        let shim = packages.join("ncclshim/lib/libnccl.so.2");
        let beside = packages.join("nvidia/nccl/lib/libnccl.so.2");
        for file in [&shim, &beside] {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        }
        lib(&shim, "shim");
        // Not the wheel's package without its __init__.py (an installation's lib/ folder).
        assert_eq!(packages_holding(&shim), None);
        lib(&packages.join("ncclshim/__init__.py"), "");
        lib(&beside, "real");
        lib(
            &root.join("venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"),
            "real",
        );
        assert_eq!(packages_holding(&shim), Some(packages.clone()));
        assert_eq!(packages_holding(&root.join("build/lib/libnccl.so.2")), None);
        let env = SearchEnv {
            own_packages: packages_holding(&shim),
            python_prefixes: vec![root.join("venv")],
            ..Default::default()
        };
        assert_eq!(find_real_nccl(&env, is_shim).unwrap().path, beside);
        std::fs::remove_file(&beside).unwrap();
        let next = find_real_nccl(&env, is_shim).unwrap().path;
        assert!(next.starts_with(root.join("venv")), "{next:?}");
    }

    #[test]
    fn conda_environments_libraries_come_before_the_systems() {
        let dirs = system_dirs(Some(PathBuf::from("/envs/train")));
        assert_eq!(
            dirs[..2],
            [PathBuf::from("/envs/train/lib"), "/opt/conda/lib".into()]
        );
        assert_eq!(dirs[2..].len(), SYSTEM_DIRS.len());
        assert_eq!(system_dirs(None)[0], PathBuf::from("/opt/conda/lib"));
    }

    /// This library's own file, as the loader names it (the test binary here).
    #[test]
    fn the_shim_knows_its_own_file() {
        let own = own_library().unwrap();
        assert_eq!(
            own,
            std::env::current_exe().unwrap().canonicalize().unwrap()
        );
    }

    #[test]
    fn library_path_reads_like_the_loaders() {
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            library_path_dirs("/a::/b;rel/lib:"),
            vec![
                PathBuf::from("/a"),
                PathBuf::from("/b"),
                here.join("rel/lib")
            ]
        );
    }

    /// The places the user named are all reported, existing or not; of those guessed, the
    /// Python environments and system folders that exist; each once, one a line.
    #[test]
    fn nothing_found_names_the_places_that_matter_once_each() {
        let scratch = tree();
        let root = &scratch.0;
        lib(&root.join("home/lib/libnccl.so.2"), "shim");
        lib(&root.join("ld1/libnccl.so.2"), "shim");
        // Links, as `make build` and the system's packages make them: the same place twice.
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, root.join(name));
        link(Path::new("libnccl.so.2"), "home/lib/libnccl.so").unwrap();
        link(&root.join("sys"), "sys-link").unwrap();
        link(root, "root-link").unwrap();
        let env = SearchEnv {
            nccl_home: Some(root.join("home")),
            library_path: vec![
                root.join("ld1"),
                root.join("ld-missing"),
                root.join("sys"),
                root.join("root-link/ld-missing"),
            ],
            python_prefixes: vec![
                root.join("venv"),
                root.join("empty"),
                root.join("root-link/venv"),
            ],
            system_dirs: vec![root.join("sys-link"), root.join("missing")],
            ..Default::default()
        };
        let err = find_real_nccl(&env, is_shim).unwrap_err();
        let at = |place: &str| root.join(place).display().to_string();
        assert_eq!(
            err.places(),
            [
                format!("{} (that is ncclshim itself)", at("home/lib/libnccl.so.2")),
                format!("{} (that is ncclshim itself)", at("ld1/libnccl.so.2")),
                format!("{} (no such folder)", at("ld-missing")),
                format!("{} (a folder without libnccl.so.2)", at("sys")),
                format!(
                    "{} (a folder without libnccl.so.2)",
                    at("venv/lib/python3.12/site-packages/nvidia/nccl/lib")
                ),
            ]
        );
        let text = err.to_string();
        assert_eq!(text.lines().count(), 5, "{text}");
        assert!(text.lines().all(|l| l.starts_with("    /")), "{text}");
        let nowhere = NotFound::default().to_string();
        assert!(nowhere.starts_with("    nowhere: "), "{nowhere}");
    }
}
