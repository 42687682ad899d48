//! Where the real NCCL is: `NCCLSHIM_REAL_NCCL` (an absolute path), else the path given at build
//! time (`make build REAL_NCCL_LIB=...`), else a search of the usual places. Any file that is
//! ncclshim itself is passed over. Pure logic over a `SearchEnv`, so that tests can drive it.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Folders searched after NCCL_HOME and the Python environments.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/local/nccl/lib",
    "/usr/local/cuda/lib64",
];
const FILE_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// What the search looks at, read from the process's environment or made up by a test.
#[derive(Clone, Debug, Default)]
pub struct SearchEnv {
    pub explicit: Option<OsString>,
    pub build_default: Option<PathBuf>,
    pub nccl_home: Option<PathBuf>,
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
            explicit: var("NCCLSHIM_REAL_NCCL"),
            build_default: (!built.is_empty()).then(|| PathBuf::from(built)),
            nccl_home: var("NCCL_HOME").map(PathBuf::from),
            python_prefixes,
            system_dirs: SYSTEM_DIRS.iter().map(PathBuf::from).collect(),
        }
    }
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

/// Why nothing was found: what was wrong with each place looked at.
#[derive(Debug, Default)]
pub struct NotFound {
    pub looked_at: Vec<(PathBuf, &'static str)>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let places: Vec<String> = self
            .looked_at
            .iter()
            .map(|(p, why)| format!("{} ({why})", p.display()))
            .collect();
        write!(
            f,
            "looked at {}",
            if places.is_empty() {
                "nothing".into()
            } else {
                places.join(", ")
            }
        )
    }
}

/// Finds the real NCCL. `is_shim` tells whether a file is ncclshim (this library or a copy).
pub fn find_real_nccl(env: &SearchEnv, is_shim: impl Fn(&Path) -> bool) -> Result<Found, NotFound> {
    let mut not_found = NotFound::default();
    let check = |path: &Path, not_found: &mut NotFound| -> bool {
        let why = if !path.is_absolute() {
            "not an absolute path"
        } else if !path.is_file() {
            "no such file"
        } else if is_shim(path) {
            "that is ncclshim itself"
        } else {
            return true;
        };
        not_found.looked_at.push((path.to_path_buf(), why));
        false
    };
    // An explicit choice is final: if it is unusable, say so rather than load something else.
    if let Some(explicit) = &env.explicit {
        let path = PathBuf::from(explicit);
        return if check(&path, &mut not_found) {
            Ok(Found {
                path,
                origin: Origin::Variable,
            })
        } else {
            Err(not_found)
        };
    }
    if let Some(path) = &env.build_default
        && check(path, &mut not_found)
    {
        return Ok(Found {
            path: path.clone(),
            origin: Origin::BuildDefault,
        });
    }
    for dir in search_dirs(env) {
        for name in FILE_NAMES {
            let path = dir.join(name);
            if path.exists() && check(&path, &mut not_found) {
                return Ok(Found {
                    path,
                    origin: Origin::Search,
                });
            }
        }
        if !not_found.looked_at.iter().any(|(p, _)| p.starts_with(&dir)) {
            not_found.looked_at.push((dir, "no libnccl.so.2"));
        }
    }
    Err(not_found)
}

/// The folders searched, in order: `$NCCL_HOME/lib`, the `nvidia/nccl/lib` folder of every
/// Python environment, then the system folders. Folders that don't exist are left out.
fn search_dirs(env: &SearchEnv) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    dirs.extend(env.nccl_home.iter().map(|home| home.join("lib")));
    dirs.extend(env.python_package_dirs(&["nvidia/nccl/lib"]));
    dirs.extend(env.system_dirs.iter().cloned());
    dirs.retain(|d| d.is_dir());
    dirs
}

impl SearchEnv {
    /// `<prefix>/lib/python3.*/{site,dist}-packages/<sub>` for every Python environment and
    /// every `sub` (NVIDIA's wheels put their libraries there), in search order.
    pub fn python_package_dirs(&self, subs: &[&str]) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for prefix in &self.python_prefixes {
            let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
                continue;
            };
            let mut pythons: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path())
                .collect();
            pythons.sort();
            for python in pythons {
                for packages in ["site-packages", "dist-packages"] {
                    dirs.extend(subs.iter().map(|sub| python.join(packages).join(sub)));
                }
            }
        }
        dirs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> PathBuf {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("ncclshim-locate-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [
            "home/lib",
            "venv/lib/python3.12/site-packages/nvidia/nccl/lib",
            "sys",
            "empty",
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        root
    }

    fn lib(path: &Path, content: &str) {
        std::fs::write(path, content).unwrap();
    }

    fn is_shim(p: &Path) -> bool {
        std::fs::read_to_string(p).is_ok_and(|c| c == "shim")
    }

    #[test]
    fn the_variable_wins_and_is_final() {
        let root = tree();
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
    fn the_build_default_comes_next_and_falls_back_to_the_search() {
        let root = tree();
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
    fn the_search_goes_home_python_system_and_skips_the_shim() {
        let root = tree();
        let python = root.join("venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2");
        lib(&root.join("sys/libnccl.so.2"), "real");
        lib(&python, "real");
        lib(&root.join("home/lib/libnccl.so.2"), "shim");
        let env = SearchEnv {
            nccl_home: Some(root.join("home")),
            python_prefixes: vec![root.join("empty"), root.join("venv")],
            system_dirs: vec![root.join("sys")],
            ..Default::default()
        };
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

    #[test]
    fn nothing_found_says_where_it_looked() {
        let root = tree();
        lib(&root.join("home/lib/libnccl.so.2"), "shim");
        let env = SearchEnv {
            nccl_home: Some(root.join("home")),
            python_prefixes: vec![root.join("venv")],
            system_dirs: vec![root.join("sys"), root.join("missing")],
            ..Default::default()
        };
        let err = find_real_nccl(&env, is_shim).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("home/lib/libnccl.so.2 (that is ncclshim itself)"),
            "{text}"
        );
        assert!(text.contains("nvidia/nccl/lib (no libnccl.so.2)"), "{text}");
        assert!(text.contains("sys (no libnccl.so.2)"), "{text}");
        assert!(!text.contains("missing"), "{text}");
    }
}
