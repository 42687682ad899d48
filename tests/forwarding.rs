//! Forwarding against NVIDIA's real NCCL: a C client compiled against the real nccl.h gets the
//! same answers through ncclshim (linked with -lnccl, or LD_PRELOADed) as from the real NCCL.

use std::path::Path;

use ncclshim_tests::{
    compile_c, link_nccl, link_shim, real_library, real_nccl, run, scratch, shim_library, stdout_of,
};

struct Clients {
    /// Linked against the real library.
    direct: std::path::PathBuf,
    /// Linked with `-lnccl` against `build/lib`.
    through_shim: std::path::PathBuf,
}

fn build_clients(source: &str, header_version: &str, real_version: &str, dir: &Path) -> Clients {
    std::fs::create_dir_all(dir).unwrap();
    let include = real_nccl(header_version).join("include");
    let link_real = link_nccl(&real_nccl(real_version).join("lib"));
    Clients {
        direct: compile_c(source, &include, &dir.join("direct"), &link_real),
        through_shim: compile_c(source, &include, &dir.join("through-shim"), &link_shim()),
    }
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn the_shim_answers_like_the_real_nccl_2_27_7() {
    let dir = scratch("forwarding-2.27.7");
    let clients = build_clients("api_client.c", "2.27.7", "2.27.7", &dir);
    let real = real_library("2.27.7");
    let real = real.to_str().unwrap();
    let shim = shim_library("2.27.7");
    let shim = shim.to_str().unwrap();

    let reference = stdout_of(&run(&clients.direct, &[], &[]));
    assert!(
        reference.contains("ncclGetVersion: rc=0 version=22707"),
        "{reference}"
    );
    assert!(
        reference.contains("ncclGetUniqueId: rc=0 nonzero=1"),
        "{reference}"
    );
    assert!(
        reference.contains("ncclGetLastError(NULL) is not NULL"),
        "{reference}"
    );

    let linked = stdout_of(&run(
        &clients.through_shim,
        &[],
        &[("NCCLSHIM_REAL_NCCL", real)],
    ));
    assert_eq!(
        lines(&linked),
        lines(&reference),
        "linked with -lnccl against build/lib"
    );
    let preloaded = stdout_of(&run(
        &clients.direct,
        &[],
        &[("NCCLSHIM_REAL_NCCL", real), ("LD_PRELOAD", shim)],
    ));
    assert_eq!(
        lines(&preloaded),
        lines(&reference),
        "real NCCL linked, shim preloaded"
    );

    // Both ways really went through the shim: it says so at first use with NCCL_DEBUG=INFO.
    for (client, extra) in [
        (&clients.through_shim, None),
        (&clients.direct, Some(("LD_PRELOAD", shim))),
    ] {
        let mut env = vec![("NCCLSHIM_REAL_NCCL", real), ("NCCL_DEBUG", "INFO")];
        env.extend(extra);
        let out = stdout_of(&run(client, &[], &env));
        let ours: Vec<&str> = out.lines().filter(|l| l.contains("[ncclshim]")).collect();
        assert_eq!(ours.len(), 1, "one INFO line of ours at first use:\n{out}");
        assert!(
            ours[0].contains("NCCL INFO ncclshim")
                && ours[0].contains("ABI of NCCL 2.27.7")
                && ours[0].contains(&format!("forwarding to real NCCL 2.27.7 at {real}")),
            "{}",
            ours[0]
        );
    }
}

#[test]
fn functions_missing_from_an_older_real_nccl_get_the_stub() {
    let dir = scratch("forwarding-2.26.5");
    let real = real_library("2.26.5");
    let real = real.to_str().unwrap();
    let env = [("NCCLSHIM_REAL_NCCL", real)];

    let missing = build_clients(
        "missing_functions.c",
        "2.27.7",
        "2.27.7",
        &dir.join("missing"),
    );
    let out = stdout_of(&run(&missing.through_shim, &[], &env));
    for name in ["ncclCommShrink", "ncclCommWindowRegister"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap();
        assert!(line.contains("rc=5 "), "ncclInvalidUsage expected: {line}");
        assert!(
            line.contains(&format!("{name} is not available")) && line.contains("2.26.5"),
            "{line}"
        );
    }
    let later = out
        .lines()
        .find(|l| l.starts_with("ncclCommCount(NULL)"))
        .unwrap();
    assert_eq!(
        later,
        "ncclCommCount(NULL): rc=4 last_error=\"CommCount : comm argument is NULL\""
    );

    // One WARN per missing function, with NCCL_DEBUG=WARN.
    let warned = stdout_of(&run(
        &missing.through_shim,
        &[],
        &[env[0], ("NCCL_DEBUG", "WARN")],
    ));
    let warns: Vec<&str> = warned
        .lines()
        .filter(|l| l.contains("[ncclshim] NCCL WARN"))
        .collect();
    assert_eq!(
        warns.len(),
        3,
        "the older-version warning and one per function:\n{warned}"
    );
    assert!(
        warns[0].contains("is version 2.26.5, older than the ABI this library exports (2.27.7)"),
        "{}",
        warns[0]
    );

    // Everything else still forwards: the 2.27.7 client answers as 2.26.5 itself does.
    let clients = build_clients("api_client.c", "2.27.7", "2.26.5", &dir.join("api"));
    let reference = stdout_of(&run(&clients.direct, &[], &[]));
    assert!(reference.contains("version=22605"), "{reference}");
    let through = stdout_of(&run(&clients.through_shim, &[], &env));
    assert_eq!(lines(&through), lines(&reference));
}

/// The one file in `dir` named as `NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log` expands, for this host.
fn debug_file_in(dir: &Path) -> (std::path::PathBuf, String) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host
        .trim()
        .split('.')
        .next()
        .unwrap()
        .replace(['%', '/'], "-");
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one log file expected: {files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    let pid = name
        .strip_prefix(&format!("nccl.{host}."))
        .and_then(|rest| rest.strip_suffix(".log"))
        .unwrap_or_else(|| panic!("{name} is not nccl.{host}.<pid>.log"));
    assert!(pid.parse::<u32>().is_ok(), "{name}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    (files[0].clone(), text)
}

/// NCCL's own lines of a log, without what differs from run to run (time stamps, host, pid and
/// thread), in order.
fn nccl_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| !l.contains("[ncclshim]"))
        .map(|l| l.find(" [0] ").map_or(l, |at| &l[at..]).to_string())
        .collect()
}

#[test]
fn nccl_debug_file_keeps_every_line_of_ncclshim_and_of_the_real_nccl() {
    let dir = scratch("forwarding-debug-file");
    let clients = build_clients("api_client.c", "2.27.7", "2.27.7", &dir);
    let real = real_library("2.27.7");
    let real = real.to_str().unwrap();
    let log_in = |name: &str| {
        let logs = dir.join(name);
        std::fs::create_dir_all(&logs).unwrap();
        let pattern = logs.join("nccl.%h.%p.log").to_str().unwrap().to_string();
        (logs, pattern)
    };

    let (reference_dir, pattern) = log_in("logs-direct");
    let env = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_FILE", pattern.as_str()),
    ];
    stdout_of(&run(&clients.direct, &[], &env));
    let (_, reference) = debug_file_in(&reference_dir);
    // Without a GPU, NCCL 2.27.7 still logs: its bootstrap network at ncclGetUniqueId, then a
    // WARN per bad argument.
    assert!(
        reference.contains("NCCL INFO Bootstrap: Using") && reference.contains("NCCL WARN"),
        "{reference}"
    );

    // Through the shim, linked or preloaded: NCCL's lines are all there, and ours, written before
    // NCCL opened (and emptied) the file, are there too.
    for (client, preload, logs) in [
        (&clients.through_shim, None, "logs-linked"),
        (
            &clients.direct,
            Some(shim_library("2.27.7")),
            "logs-preloaded",
        ),
    ] {
        let (logs, pattern) = log_in(logs);
        let mut env = vec![
            ("NCCLSHIM_REAL_NCCL", real),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_FILE", pattern.as_str()),
        ];
        let preload = preload.map(|p| p.to_str().unwrap().to_string());
        env.extend(preload.as_deref().map(|p| ("LD_PRELOAD", p)));
        let out = stdout_of(&run(client, &[], &env));
        assert!(
            !out.contains("[ncclshim]"),
            "our lines belong in the file:\n{out}"
        );
        let (path, log) = debug_file_in(&logs);
        let ours: Vec<&str> = log.lines().filter(|l| l.contains("[ncclshim]")).collect();
        assert_eq!(ours.len(), 1, "{}:\n{log}", path.display());
        assert!(
            ours[0].contains("NCCL INFO ncclshim")
                && ours[0].contains(&format!("forwarding to real NCCL 2.27.7 at {real}")),
            "{log}"
        );
        assert_eq!(
            nccl_lines(&log),
            nccl_lines(&reference),
            "{}",
            path.display()
        );
    }
}

#[test]
fn nccl_debug_file_keeps_the_warnings_of_ncclshim() {
    let dir = scratch("forwarding-debug-file-warnings");
    let missing = build_clients("missing_functions.c", "2.27.7", "2.27.7", &dir);
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pattern = logs.join("nccl.%h.%p.log");
    let real = real_library("2.26.5");
    let out = stdout_of(&run(
        &missing.through_shim,
        &[],
        &[
            ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_DEBUG_FILE", pattern.to_str().unwrap()),
        ],
    ));
    assert!(out.contains("ncclCommShrink: rc=5 "), "{out}");
    let (_, log) = debug_file_in(&logs);
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[ncclshim] NCCL WARN"))
        .collect();
    assert_eq!(
        warns.len(),
        3,
        "the older-version warning and one per function:\n{log}"
    );
    for name in ["ncclCommShrink", "ncclCommWindowRegister"] {
        assert!(
            warns
                .iter()
                .any(|w| w.contains(&format!("{name} is not available"))),
            "{log}"
        );
    }
    // The real NCCL's own WARN (ncclCommCount(NULL)), which opened and emptied the file after ours.
    assert!(
        log.contains("NCCL WARN CommCount : comm argument is NULL"),
        "{log}"
    );
}

/// A process that forks after its first NCCL call: the child's lines (the shim's and the real
/// NCCL's) go to the child's own file where `NCCL_DEBUG_FILE` has `%p`, not to the parent's.
#[test]
fn nccl_debug_file_follows_a_forked_child() {
    let dir = scratch("forwarding-debug-file-fork");
    let client = build_clients("fork_client.c", "2.27.7", "2.27.7", &dir).through_shim;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pattern = logs.join("nccl.%p.log");
    let real = real_library("2.26.5");
    let out = stdout_of(&run(
        &client,
        &[],
        &[
            ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_DEBUG_FILE", pattern.to_str().unwrap()),
        ],
    ));
    let pid_of = |who: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{who} ")))
            .and_then(|rest| rest.split(':').next())
            .unwrap_or_else(|| panic!("no {who} line:\n{out}"))
            .to_string()
    };
    let log_of = |pid: &str| {
        std::fs::read_to_string(logs.join(format!("nccl.{pid}.log")))
            .unwrap_or_else(|e| panic!("the log of process {pid}: {e}\n{out}"))
    };
    let (parent, child) = (log_of(&pid_of("parent")), log_of(&pid_of("child")));
    let shrink_warning = "ncclCommShrink is not available";
    assert!(
        child.contains(shrink_warning) && child.contains("CommCount : comm argument is NULL"),
        "the child's file:\n{child}"
    );
    assert!(
        parent.contains("[ncclshim] NCCL WARN") && !parent.contains(shrink_warning),
        "the parent's file:\n{parent}"
    );
}
