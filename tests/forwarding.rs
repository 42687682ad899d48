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
