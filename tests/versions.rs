//! Every NCCL release with a spec: each builds into a library that exports exactly its functions;
//! 2.28.9's exports are NVIDIA's; the build for every version serves a 2.28 client over a real
//! 2.27.7; configs pass through untouched; spec-diff tells what changed between two releases.
//!
//! These tests build the shim themselves, in `<target>/versions/` (a cargo target folder and build
//! folders of their own), so that `build/` (2.27.7, which the other tests use) stays as it is.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use ncclshim_tests::{
    builds_target_dir, clean_command, compile_c, defined_symbols, link_nccl, real_library,
    real_nccl, run, scratch, small_shim_build, soname, stdout_of, target_dir, workspace,
};

// The build script's choice of specs, compiled here as it is there.
#[path = "../shim/build/specs.rs"]
mod specs;

/// `NCCL_VERSION` picks the specs (gen/spec-version.sh decides, for `make` as for the build
/// script): a release's own; for a patch release without one (PyTorch ships 2.27.5) its minor
/// release's newest, whose ABI it shares, said in a note; for a minor release without a spec an
/// error naming the nearest and how to make one; `all`, every spec; anything else, refused.
#[test]
fn nccl_version_picks_a_spec_or_says_which_there_are() {
    let dir = workspace().join("spec");
    let (release, note) = specs::spec_release(&workspace(), "2.27.5").unwrap();
    assert_eq!(
        (release.as_str(), specs::spec_files(&dir, &release).unwrap()),
        ("2.27.7", vec![dir.join("nccl-2.27.7.rs")])
    );
    let note = note.unwrap();
    assert!(
        note.starts_with("NCCL 2.27.5 has no spec; building 2.27.7's ABI"),
        "{note}"
    );
    assert_eq!(
        specs::spec_release(&workspace(), "2.28.9").unwrap(),
        ("2.28.9".to_string(), None)
    );
    let error = specs::spec_release(&workspace(), "2.17.1").unwrap_err();
    assert!(
        error.contains("nearest: 2.18.3") && error.ends_with("make spec NCCL_VERSION=2.17.1"),
        "{error}"
    );
    let error = specs::spec_release(&workspace(), "banana").unwrap_err();
    assert_eq!(
        error,
        "NCCL_VERSION=banana is not an NCCL release (X.Y.Z or all)"
    );
    let (release, note) = specs::spec_release(&workspace(), "all").unwrap();
    assert_eq!((release.as_str(), note), ("all", None));
    assert_eq!(
        specs::spec_files(&dir, "all").unwrap().len(),
        committed_versions().len()
    );
}

#[test]
fn every_spec_builds_into_a_library_exporting_exactly_its_functions() {
    let versions = committed_versions();
    assert!(versions.len() >= 15, "specs: {versions:?}");
    for version in &versions {
        let library = shim_of_spec(version);
        let expected = exports_of(&spec_functions(version));
        let ours: BTreeSet<String> = defined_symbols(&library).into_iter().collect();
        assert_eq!(
            ours, expected,
            "the exports of the build for NCCL {version} are not its spec's functions"
        );
        assert_eq!(soname(&library).as_deref(), Some("libnccl.so.2"));
        // Checked: no other test takes it, and fifteen of them fill a few hundred MB.
        std::fs::remove_file(&library).unwrap();
    }
}

#[test]
fn exports_of_2_28_9_are_nvidias_but_for_names_no_header_declares() {
    let build = make_build("2.28.9");
    let library = build.join("lib/libnccl.so.2.28.9");
    let ours: BTreeSet<String> = defined_symbols(&library).into_iter().collect();
    let theirs: BTreeSet<String> = defined_symbols(&real_library("2.28.9"))
        .into_iter()
        .collect();
    let extra: Vec<&String> = ours.difference(&theirs).collect();
    assert!(extra.is_empty(), "exported, but not by NVIDIA: {extra:?}");
    let headers = header_texts(&real_nccl("2.28.9").join("include"));
    let left_out: Vec<&String> = theirs.difference(&ours).collect();
    for name in &left_out {
        let declared = headers.iter().any(|text| text.contains(name.as_str()));
        assert!(
            !declared,
            "{name} is declared in a 2.28.9 header but not exported"
        );
    }
    assert_eq!(left_out, ["ncclResetDebugInitInternal"]);
    // Exported with their host signatures, from nccl_device/*.h (C++).
    for name in ["ncclDevCommCreate", "ncclTeamWorld", "ncclLLA2ACalcSlots"] {
        assert!(
            ours.contains(name) && ours.contains(&format!("p{name}")),
            "{name}"
        );
    }
}

#[test]
fn make_build_of_2_28_9_leaves_its_library_links_and_headers() {
    let build = make_build("2.28.9");
    let lib = build.join("lib");
    assert_eq!(link_target(&lib.join("libnccl.so.2")), "libnccl.so.2.28.9");
    assert_eq!(link_target(&lib.join("libnccl.so")), "libnccl.so.2");
    assert_eq!(
        soname(&lib.join("libnccl.so.2.28.9")).as_deref(),
        Some("libnccl.so.2")
    );
    let header = std::fs::read_to_string(build.join("include/nccl.h")).unwrap();
    assert!(header.contains("#define NCCL_MINOR 28") && header.contains("#define NCCL_PATCH 9"));
    assert!(build.join("include/nccl_device.h").is_file());
    assert!(build.join("include/nccl_device/core.h").is_file());
}

#[test]
fn the_build_for_all_exports_every_spec_with_the_newest_headers() {
    let build = make_build("all");
    let lib = build.join("lib");
    assert_eq!(link_target(&lib.join("libnccl.so.2")), "libnccl.so.all");
    assert_eq!(link_target(&lib.join("libnccl.so")), "libnccl.so.2");
    let library = lib.join("libnccl.so.all");
    assert_eq!(soname(&library).as_deref(), Some("libnccl.so.2"));
    let versions = committed_versions();
    let every: BTreeSet<String> = versions.iter().flat_map(|v| spec_functions(v)).collect();
    let ours: BTreeSet<String> = defined_symbols(&library).into_iter().collect();
    assert_eq!(ours, exports_of(&every));
    let newest = versions.last().unwrap();
    let (_, minor_patch) = newest.split_once('.').unwrap();
    let (minor, patch) = minor_patch.split_once('.').unwrap();
    let header = std::fs::read_to_string(build.join("include/nccl.h")).unwrap();
    assert!(
        header.contains(&format!("#define NCCL_MINOR {minor}"))
            && header.contains(&format!("#define NCCL_PATCH {patch}")),
        "build/include is not NCCL {newest}'s"
    );
}

#[test]
fn a_2_28_client_over_a_real_2_27_7_gets_its_answers_and_invalid_usage_for_what_is_new() {
    let dir = scratch("versions-new-api");
    let client = compile_c(
        "versions_new_api_client.c",
        &real_nccl("2.28.9").join("include"),
        &dir.join("client"),
        &link_nccl(&make_build("all").join("lib")),
    );
    let real = real_library("2.27.7");
    let out = stdout_of(&run(
        &client,
        &[],
        &[("NCCLSHIM_REAL_NCCL", real.to_str().unwrap())],
    ));
    assert!(
        out.contains("ncclGetVersion: rc=0 version=22707\n"),
        "{out}"
    );
    let real_message = real_error_string(&real, 5);
    assert!(
        out.contains(&format!(
            "ncclGetErrorString(ncclInvalidUsage): {real_message}\n"
        )),
        "{out}"
    );
    let alltoall = line_starting(&out, "ncclAlltoAll:");
    assert!(alltoall.starts_with("ncclAlltoAll: rc=5 "), "{out}");
    assert!(
        alltoall.contains("ncclAlltoAll") && alltoall.contains("2.27.7"),
        "the message should name the function and the real version: {alltoall}"
    );
}

/// The build for every version exports no single release's ABI: at load it says which releases it
/// covers and warns of nothing; it warns once for each function that the program calls and the
/// real NCCL lacks.
#[test]
fn the_build_for_all_warns_only_of_missing_functions_that_are_called() {
    let dir = scratch("versions-all-warnings");
    let client = compile_c(
        "versions_missing_twice.c",
        &real_nccl("2.27.7").join("include"),
        &dir.join("client"),
        &link_nccl(&make_build("all").join("lib")),
    );
    let versions = committed_versions();
    let range = format!(
        "ABI of every NCCL from {} to {}, build all",
        versions.first().unwrap(),
        versions.last().unwrap()
    );
    let real = real_library("2.26.5");
    let ours = |args: &[&str]| {
        let out = stdout_of(&run(
            &client,
            args,
            &[
                ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
                ("NCCL_DEBUG", "INFO"),
            ],
        ));
        let lines: Vec<String> = out
            .lines()
            .filter(|l| l.contains("[ncclshim]"))
            .map(str::to_string)
            .collect();
        (out, lines)
    };

    // A real NCCL older than the newest release: at load, the start-up line and nothing else.
    let (out, lines) = ours(&[]);
    assert!(
        out.contains("ncclGetVersion: rc=0 version=22605\n"),
        "{out}"
    );
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].contains("NCCL INFO ncclshim") && lines[0].contains(&range),
        "{}",
        lines[0]
    );

    // Calling what it lacks: one WARN per function, when it is first called.
    let (out, lines) = ours(&["missing"]);
    assert_eq!(
        out.matches("ncclCommShrink: rc=5\n").count(),
        2,
        "ncclInvalidUsage expected: {out}"
    );
    assert!(out.contains("ncclCommWindowRegister: rc=5\n"), "{out}");
    assert!(lines[0].contains(&range), "{}", lines[0]);
    let warns: Vec<&String> = lines.iter().filter(|l| l.contains("NCCL WARN")).collect();
    assert_eq!(warns.len(), 2, "{out}");
    assert!(
        warns[0].contains("ncclCommShrink is not available") && warns[0].contains("2.26.5"),
        "{}",
        warns[0]
    );
    assert!(
        warns[1].contains("ncclCommWindowRegister is not available"),
        "{}",
        warns[1]
    );
}

#[test]
fn a_2_28_config_reaches_the_real_2_27_7_as_the_client_passed_it() {
    let dir = scratch("versions-config");
    let include = real_nccl("2.28.9").join("include");
    let real_lib = real_nccl("2.27.7").join("lib");
    let direct = compile_c(
        "versions_config_client.c",
        &include,
        &dir.join("direct"),
        &link_nccl(&real_lib),
    );
    let through_shim = compile_c(
        "versions_config_client.c",
        &include,
        &dir.join("through-shim"),
        &link_nccl(&make_build("all").join("lib")),
    );
    let real = real_library("2.27.7");
    let from_real = stdout_of(&run(&direct, &[], &[]));
    let from_shim = stdout_of(&run(
        &through_shim,
        &[],
        &[("NCCLSHIM_REAL_NCCL", real.to_str().unwrap())],
    ));
    assert!(from_real.contains("config size: 80\n"), "{from_real}");
    assert_eq!(from_shim, from_real);

    // A stand-in real NCCL that checks the config it gets and hands its address back.
    let recorder = compile_c(
        "versions_config_recorder.c",
        &include,
        &dir.join("libnccl-recorder.so"),
        &["-shared", "-fPIC"],
    );
    let from_recorder = stdout_of(&run(
        &through_shim,
        &[],
        &[("NCCLSHIM_REAL_NCCL", recorder.to_str().unwrap())],
    ));
    assert!(
        from_recorder.contains("ncclCommInitRankConfig: rc=0 ")
            && from_recorder.contains("comm is the config's address: 1\n")
            && from_recorder.contains("config unchanged: 1\n"),
        "{from_recorder}"
    );
}

#[test]
fn spec_diff_from_2_27_7_to_2_28_9_tells_what_changed() {
    let text = spec_diff("2.27.7", "2.28.9");
    assert!(text.starts_with("NCCL 2.27.7 -> 2.28.9\n"), "{text}");
    let added = section(&text, "Functions added");
    for name in [
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
        "ncclCommRevoke",
        "ncclTeamWorld",
    ] {
        assert!(
            added.contains(&format!("+ {name}(")),
            "{name} not added:\n{text}"
        );
    }
    assert!(section(&text, "Functions removed").is_empty(), "{text}");
    let types = section(&text, "Types changed");
    assert!(
        types.contains(
            "~ ncclConfig_t: struct ncclConfig_v22700 -> ncclConfig_v22800, 72 -> 80 bytes"
        ) && types.contains("+ nChannelsPerNetPeer: c_int at 72")
            && types.contains("+ nvlinkCentricSched: c_int at 76"),
        "{text}"
    );
    assert!(
        section(&text, "Types added").contains("+ struct ncclTeam, 12 bytes"),
        "{text}"
    );
}

#[test]
fn spec_diff_tells_the_timeout_result_joining_in_2_30() {
    let text = spec_diff("2.29.7", "2.30.7");
    assert!(
        section(&text, "Constants added").contains("+ ncclTimeout: ncclResult_t = 8"),
        "{text}"
    );
    assert!(
        section(&text, "Constants changed").contains("~ ncclNumResults: ncclResult_t = 8 -> 9"),
        "{text}"
    );
}

/// The build for every version is sound only if no release removed a function or changed how
/// it is called: a client of an older release calls the newest declaration.
#[test]
fn no_release_removes_a_function_or_changes_its_signature() {
    let versions = committed_versions();
    for pair in versions.windows(2) {
        let text = spec_diff(&pair[0], &pair[1]);
        assert!(section(&text, "Functions removed").is_empty(), "{text}");
        assert!(
            section(&text, "Functions whose signature changed").is_empty(),
            "{text}"
        );
    }
}

/// The C++ pass over nccl_device.h is as deterministic as the C pass over nccl.h.
#[test]
fn regenerating_2_28_9_gives_the_committed_spec() {
    let header = real_nccl("2.28.9").join("include/nccl.h");
    let out_dir = scratch("versions-spec-regeneration");
    let out = gen_command()
        .arg("spec")
        .arg(&header)
        .arg(&out_dir)
        .output()
        .expect("cargo runs");
    assert_success(&out, "ncclshim-gen spec");
    let fresh = std::fs::read(out_dir.join("nccl-2.28.9.rs")).unwrap();
    let committed = std::fs::read(workspace().join("spec/nccl-2.28.9.rs")).unwrap();
    assert!(
        fresh == committed,
        "spec/nccl-2.28.9.rs differs from what ncclshim-gen makes of NVIDIA's headers"
    );
}

// ---- building ----

/// The folder these tests build in.
fn versions_dir() -> PathBuf {
    target_dir().join("versions")
}

/// One build at a time (they share a cargo target folder), each once per run.
static BUILDS: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

fn built_once(key: String, build: impl FnOnce() -> PathBuf) -> PathBuf {
    let mut builds = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    builds
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(build)
        .clone()
}

/// `make build NCCL_VERSION=<flavor>` into `<target>/versions/build-<flavor>`; gives that folder.
/// Its release build neither optimises nor keeps debug information: it exports the same, in a
/// fraction of the time.
fn make_build(flavor: &str) -> PathBuf {
    built_once(format!("make {flavor}"), || {
        let build = versions_dir().join(format!("build-{flavor}"));
        let out = clean_command("make")
            .args(["--no-print-directory", "build"])
            .arg(format!("NCCL_VERSION={flavor}"))
            .arg(format!("BUILD={}", build.display()))
            .env("CARGO_TARGET_DIR", builds_target_dir())
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
            .current_dir(workspace())
            .output()
            .expect("make runs");
        assert_success(&out, &format!("make build NCCL_VERSION={flavor}"));
        build
    })
}

/// The shim for one spec, built with cargo alone (no headers to fetch, `small_shim_build`);
/// gives the library.
fn shim_of_spec(version: &str) -> PathBuf {
    built_once(format!("cargo {version}"), || {
        let (mut build, built) = small_shim_build();
        let out = build
            .env("NCCL_VERSION", version)
            .output()
            .expect("cargo runs");
        assert_success(&out, &format!("building the shim for NCCL {version}"));
        let libs = versions_dir().join("libs");
        std::fs::create_dir_all(&libs).unwrap();
        let library = libs.join(format!("libnccl.so.{version}"));
        std::fs::copy(built, &library).unwrap();
        library
    })
}

/// `ncclshim-gen`, run by cargo as `tests/spec_regeneration.rs` does.
fn gen_command() -> Command {
    let mut command = clean_command(env!("CARGO"));
    command
        .args(["run", "--quiet", "--locked", "-p", "ncclshim-gen", "--"])
        .current_dir(workspace());
    command
}

fn assert_success(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn spec_diff(from: &str, to: &str) -> String {
    let spec = |v: &str| workspace().join(format!("spec/nccl-{v}.rs"));
    let out = gen_command()
        .arg("diff")
        .arg(spec(from))
        .arg(spec(to))
        .output()
        .expect("cargo runs");
    assert_success(&out, &format!("ncclshim-gen diff {from} {to}"));
    String::from_utf8(out.stdout).unwrap()
}

// ---- reading specs, headers, output ----

/// The releases in `spec/`, oldest first.
fn committed_versions() -> Vec<String> {
    let mut versions: Vec<String> = std::fs::read_dir(workspace().join("spec"))
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().ok()?;
            Some(name.strip_prefix("nccl-")?.strip_suffix(".rs")?.to_string())
        })
        .collect();
    versions.sort_by_key(|v| {
        v.split('.')
            .map(|n| n.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    });
    versions
}

/// The functions a spec declares, read from its text (`pub fn ncclX(`), independently of the
/// parser the shim is built with.
fn spec_functions(version: &str) -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(workspace().join(format!("spec/nccl-{version}.rs"))).unwrap();
    text.lines()
        .filter_map(|line| {
            let name = line.trim().strip_prefix("pub fn ")?.split('(').next()?;
            name.starts_with("nccl").then(|| name.to_string())
        })
        .collect()
}

/// `ncclX` and `pncclX` for every function.
fn exports_of(functions: &BTreeSet<String>) -> BTreeSet<String> {
    functions
        .iter()
        .flat_map(|f| [f.clone(), format!("p{f}")])
        .collect()
}

/// The text of every header under `dir`.
fn header_texts(dir: &Path) -> Vec<String> {
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            texts.extend(header_texts(&path));
        } else if path
            .extension()
            .is_some_and(|e| e == "h" || e == "hpp" || e == "cuh")
        {
            texts.push(std::fs::read_to_string(&path).unwrap());
        }
    }
    texts
}

/// The entries of one section of spec-diff's output (empty if it has none).
fn section(text: &str, title: &str) -> String {
    let Some(start) = text.find(&format!("\n{title} (")) else {
        return String::new();
    };
    let body = &text[start + 1..];
    let body = &body[body.find('\n').map_or(body.len(), |i| i + 1)..];
    body.split("\n\n").next().unwrap_or("").to_string()
}

fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
}

fn link_target(link: &Path) -> String {
    std::fs::read_link(link)
        .unwrap_or_else(|e| panic!("{}: {e}", link.display()))
        .to_string_lossy()
        .into_owned()
}

/// What the real NCCL at `library` says of `result`, asked directly.
fn real_error_string(library: &Path, result: u32) -> String {
    // SAFETY: NVIDIA's NCCL has no requirements on being loaded.
    let library = unsafe { libloading::Library::new(library) }.unwrap();
    // SAFETY: ncclGetErrorString(ncclResult_t) -> const char* in every release.
    let describe = unsafe {
        library.get::<unsafe extern "C" fn(u32) -> *const std::ffi::c_char>(b"ncclGetErrorString")
    }
    .unwrap();
    // SAFETY: any result code is a valid argument; the answer is a static C string.
    unsafe { std::ffi::CStr::from_ptr(describe(result)) }
        .to_string_lossy()
        .into_owned()
}
