//! Finding the real NCCL, in real processes: the variable (a library or its folder), the build's
//! default, the search (NCCL_HOME, LD_LIBRARY_PATH, Python environments), refusing ncclshim itself
//! (and copies of it), and nothing found (every call fails with ncclSystemError, error strings
//! still answer; the warning says how to get NVIDIA's NCCL, then the places looked at, one a
//! line).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use ncclshim_tests::{
    build_dir, compile_c, link_nccl, link_shim, real_library, real_nccl, run, scratch,
    shim_library, small_shim_build, stdout_of,
};

/// The C client linked against `build/lib` (the shim).
fn client(dir: &Path) -> PathBuf {
    api_client(&dir.join("api_client"), &link_shim())
}

/// The C client linked against the real NCCL 2.27.7.
fn direct_client(dir: &Path) -> PathBuf {
    api_client(
        &dir.join("direct"),
        &link_nccl(&real_nccl("2.27.7").join("lib")),
    )
}

fn api_client(out: &Path, link: &[String]) -> PathBuf {
    compile_c(
        "api_client.c",
        &real_nccl("2.27.7").join("include"),
        out,
        link,
    )
}

/// Our lines of a run with NCCL_DEBUG=INFO.
fn shim_lines(client: &Path, env: &[(&str, &str)]) -> (String, Vec<String>) {
    let mut env = env.to_vec();
    env.push(("NCCL_DEBUG", "INFO"));
    let out = stdout_of(&run(client, &[], &env));
    let ours = out
        .lines()
        .filter(|l| l.contains("[ncclshim]"))
        .map(str::to_string)
        .collect();
    (out, ours)
}

/// The warning that no real NCCL could be used: its first line, then the places it looked at,
/// one a line (indented, without the log's prefix).
fn no_nccl_warning(out: &str) -> (&str, Vec<&str>) {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.contains("NCCL WARN no real NCCL library could be used"));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no warning in {out}"));
    let places = lines.map_while(|l| l.strip_prefix("    ")).collect();
    (first, places)
}

fn found_line(lines: &[String]) -> &str {
    lines
        .iter()
        .find(|l| l.contains("forwarding to real NCCL"))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("{lines:?}"))
}

/// A Python environment whose nvidia/nccl/lib holds `library`.
fn python_env(root: &Path, library: &Path) -> PathBuf {
    let lib_dir = root.join("lib/python3.12/site-packages/nvidia/nccl/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    symlink(library, lib_dir.join("libnccl.so.2")).unwrap();
    lib_dir.join("libnccl.so.2")
}

fn system_has_nccl() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nccl/lib",
        "/usr/local/cuda/lib64",
    ]
    .iter()
    .any(|d| Path::new(d).join("libnccl.so.2").exists() || Path::new(d).join("libnccl.so").exists())
}

#[test]
fn the_variable_names_the_real_nccl() {
    let dir = scratch("locating-variable");
    let real = real_library("2.27.7");
    let (_, ours) = shim_lines(
        &client(&dir),
        &[("NCCLSHIM_REAL_NCCL", real.to_str().unwrap())],
    );
    let line = found_line(&ours);
    assert!(
        line.contains(&format!(
            "at {} (found by NCCLSHIM_REAL_NCCL)",
            real.display()
        )),
        "{line}"
    );
}

#[test]
fn the_variable_may_name_the_folder_holding_the_real_nccl() {
    let dir = scratch("locating-variable-folder");
    let client = client(&dir);
    let folder = real_nccl("2.27.7").join("lib");
    let (_, ours) = shim_lines(&client, &[("NCCLSHIM_REAL_NCCL", folder.to_str().unwrap())]);
    assert!(
        found_line(&ours).contains(&format!(
            "at {}/libnccl.so.2 (found by NCCLSHIM_REAL_NCCL)",
            folder.display()
        )),
        "{ours:?}"
    );

    // A folder without the library, or holding ncclshim: said precisely, and final.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let shim_folder = build_dir().join("lib");
    for (chosen, says) in [
        (
            empty.clone(),
            format!("{} (a folder without libnccl.so.2)", empty.display()),
        ),
        (
            shim_folder.clone(),
            format!(
                "{}/libnccl.so.2 (that is ncclshim itself)",
                shim_folder.display()
            ),
        ),
    ] {
        let (out, _) = shim_lines(&client, &[("NCCLSHIM_REAL_NCCL", chosen.to_str().unwrap())]);
        assert_eq!(no_nccl_warning(&out).1, [says.as_str()], "{out}");
        assert!(out.contains("ncclGetVersion: rc=2 version=0"), "{out}");
    }
}

#[test]
fn the_search_looks_in_ld_library_path_past_the_shim_and_its_copies() {
    let dir = scratch("locating-library-path");
    let client = client(&dir);
    let real_dir = dir.join("real");
    std::fs::create_dir_all(&real_dir).unwrap();
    symlink(real_library("2.27.7"), real_dir.join("libnccl.so.2")).unwrap();
    let copy_dir = dir.join("copy");
    std::fs::create_dir_all(&copy_dir).unwrap();
    std::fs::copy(shim_library("2.27.7"), copy_dir.join("libnccl.so.2")).unwrap();
    // As deployed: the shim's folder first (the loader takes it from there), then the others.
    let library_path = [
        build_dir().join("lib"),
        copy_dir,
        dir.join("missing"),
        real_dir.clone(),
    ]
    .map(|d| d.display().to_string())
    .join(":");
    let (out, ours) = shim_lines(&client, &[("LD_LIBRARY_PATH", &library_path)]);
    assert!(
        found_line(&ours).contains(&format!(
            "at {}/libnccl.so.2 (found by searching)",
            real_dir.display()
        )),
        "{out}"
    );
    assert!(out.contains("ncclGetVersion: rc=0 version=22707"), "{out}");
}

#[test]
fn the_search_finds_nccl_home_python_and_conda_environments() {
    let dir = scratch("locating-search");
    let client = client(&dir);
    let real = real_library("2.27.7");

    let home = dir.join("nccl-home");
    std::fs::create_dir_all(home.join("lib")).unwrap();
    symlink(&real, home.join("lib/libnccl.so.2")).unwrap();
    let (_, ours) = shim_lines(&client, &[("NCCL_HOME", home.to_str().unwrap())]);
    assert!(found_line(&ours).contains(&format!(
        "at {}/lib/libnccl.so.2 (found by searching)",
        home.display()
    )));

    let venv = dir.join("venv");
    let in_venv = python_env(&venv, &real);
    let (_, ours) = shim_lines(&client, &[("VIRTUAL_ENV", venv.to_str().unwrap())]);
    assert!(found_line(&ours).contains(&format!("at {} (found by searching)", in_venv.display())));
    // A Python environment on PATH counts too.
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap()
    );
    let (_, ours) = shim_lines(&client, &[("PATH", &path)]);
    assert!(found_line(&ours).contains(&format!("at {} (found by searching)", in_venv.display())));

    // conda's nccl package: the library in the environment's lib/.
    let conda = dir.join("conda-env");
    std::fs::create_dir_all(conda.join("lib")).unwrap();
    symlink(&real, conda.join("lib/libnccl.so.2")).unwrap();
    let (_, ours) = shim_lines(&client, &[("CONDA_PREFIX", conda.to_str().unwrap())]);
    assert!(found_line(&ours).contains(&format!(
        "at {}/lib/libnccl.so.2 (found by searching)",
        conda.display()
    )));
}

#[test]
fn ncclshim_and_its_copies_are_never_taken_for_the_real_nccl() {
    let dir = scratch("locating-itself");
    let client = client(&dir);
    let shim = shim_library("2.27.7");

    // Named explicitly: refused, and every call fails, with error strings still answering.
    let (out, _) = shim_lines(&client, &[("NCCLSHIM_REAL_NCCL", shim.to_str().unwrap())]);
    assert_eq!(
        no_nccl_warning(&out).1,
        [format!("{} (that is ncclshim itself)", shim.display())],
        "{out}"
    );
    assert!(out.contains("ncclGetVersion: rc=2 version=0"), "{out}");
    assert!(
        out.contains("ncclGetErrorString(5): invalid usage (run with NCCL_DEBUG=WARN for details)"),
        "{out}"
    );

    // Found by the search: a copy of the shim in NCCL_HOME is passed over for the real one.
    let home = dir.join("nccl-home");
    std::fs::create_dir_all(home.join("lib")).unwrap();
    std::fs::copy(&shim, home.join("lib/libnccl.so.2")).unwrap();
    let venv = dir.join("venv");
    let in_venv = python_env(&venv, &real_library("2.27.7"));
    let env = [
        ("NCCL_HOME", home.to_str().unwrap()),
        ("VIRTUAL_ENV", venv.to_str().unwrap()),
    ];
    let (_, ours) = shim_lines(&client, &env);
    assert!(
        found_line(&ours).contains(&format!("at {} (found by searching)", in_venv.display())),
        "{ours:?}"
    );
}

#[test]
fn nothing_found_fails_every_call_but_still_answers_error_strings() {
    let dir = scratch("locating-nothing");
    let client = client(&dir);
    if system_has_nccl() {
        // This machine has a system NCCL: the search must find it instead.
        let (_, ours) = shim_lines(&client, &[]);
        assert!(found_line(&ours).contains("(found by searching)"));
        return;
    }
    let home = dir.join("empty-home");
    std::fs::create_dir_all(home.join("lib")).unwrap();
    let missing = dir.join("missing-lib");
    let out = stdout_of(&run(
        &client,
        &[],
        &[
            ("NCCL_HOME", home.to_str().unwrap()),
            ("LD_LIBRARY_PATH", missing.to_str().unwrap()),
        ],
    ));
    // Said once, even without NCCL_DEBUG: what is wrong and the fix first, then the places.
    let warns = out.matches("[ncclshim] NCCL WARN").count();
    assert_eq!(warns, 1, "{out}");
    let (first, places) = no_nccl_warning(&out);
    for advice in [
        &format!(
            "ncclshim {}, so every NCCL call fails",
            env!("CARGO_PKG_VERSION")
        ),
        "Set NCCLSHIM_REAL_NCCL=/abs/path/libnccl.so.2",
        "pip install nvidia-nccl-cu12",
        "pip install nvidia-nccl-cu13",
    ] {
        assert!(first.contains(advice), "{advice}: {first}");
    }
    assert!(first.ends_with("Looked at:"), "{first}");
    // One a line, in order: those named, existing or not; of the system folders, those that
    // exist; nothing twice.
    let mut expected = vec![
        format!("{}/lib (a folder without libnccl.so.2)", home.display()),
        format!("{} (no such folder)", missing.display()),
    ];
    let system = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nccl/lib",
        "/usr/local/cuda/lib64",
    ];
    expected.extend(
        system
            .iter()
            .filter(|d| Path::new(d).is_dir())
            .map(|d| format!("{d} (a folder without libnccl.so.2)")),
    );
    assert_eq!(&places[..2], &expected[..2], "{out}");
    let listed_system: Vec<&str> = places
        .iter()
        .copied()
        .filter(|p| system.iter().any(|d| p.starts_with(d)))
        .collect();
    assert_eq!(listed_system, &expected[2..], "{out}");
    let mut unique = places.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), places.len(), "{out}");
    assert!(
        places.iter().all(|p| !p.contains('*')),
        "no pattern for a place without Python: {out}"
    );
    assert!(out.contains("ncclGetVersion: rc=2 version=0"), "{out}");
    assert!(
        out.contains(
            "ncclCommInitRank(nranks=0): rc=2 last_error=\"ncclCommInitRank cannot be served"
        ),
        "{out}"
    );
    // The error strings are NCCL's own, as the real library gives them.
    let reference = stdout_of(&run(&direct_client(&dir), &[], &[]));
    let strings = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("ncclGetErrorString"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(strings(&out), strings(&reference));
    assert_eq!(strings(&out).len(), 11);
}

#[test]
fn the_build_default_is_used_when_no_variable_is_set() {
    let real = real_library("2.27.7");
    let (mut build, built) = small_shim_build();
    let status = build
        .env("REAL_NCCL_LIB", &real)
        .env("NCCL_VERSION", "2.27.7")
        .status()
        .unwrap();
    assert!(status.success());
    let dir = scratch("locating-build-default");
    // Kept aside: the next build in that folder (tests/versions.rs) replaces it.
    let shim = dir.join("libnccl.so");
    std::fs::copy(built, &shim).unwrap();
    let direct = direct_client(&dir);
    let (_, ours) = shim_lines(&direct, &[("LD_PRELOAD", shim.to_str().unwrap())]);
    assert!(
        found_line(&ours).contains(&format!(
            "at {} (found by the build's REAL_NCCL_LIB)",
            real.display()
        )),
        "{ours:?}"
    );
    // The variable still wins over the build's default.
    let older = real_library("2.26.5");
    let (_, ours) = shim_lines(
        &direct,
        &[
            ("LD_PRELOAD", shim.to_str().unwrap()),
            ("NCCLSHIM_REAL_NCCL", older.to_str().unwrap()),
        ],
    );
    assert!(
        found_line(&ours).contains("found by NCCLSHIM_REAL_NCCL"),
        "{ours:?}"
    );
}
