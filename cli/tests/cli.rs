//! The `ncclshim` command, run as users run it: `doctor` with and without a real NCCL to find,
//! `run` with the shim in front, `trace` on trace files.

use std::path::Path;
use std::process::{Command, Output};

use ncclshim_tests::{real_library, scratch, shim_library};

fn ncclshim(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ncclshim"));
    command
        .args(args)
        .env_remove("NCCLSHIM_REAL_NCCL")
        .env_remove("LD_PRELOAD");
    command.envs(env.iter().copied());
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn shim() -> String {
    shim_library("2.27.7").to_str().unwrap().to_string()
}

#[test]
fn doctor_names_the_libraries_and_passes_without_a_gpu() {
    let real = real_library("2.27.7");
    let out = ncclshim(
        &["--shim", &shim(), "doctor"],
        &[("NCCLSHIM_REAL_NCCL", real.to_str().unwrap())],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("exports the NCCL 2.27.7 ABI"), "{said}");
    assert!(
        said.contains(&format!(
            "the real NCCL: {} (2.27.7), found by NCCLSHIM_REAL_NCCL",
            real.display()
        )),
        "{said}"
    );
    assert!(
        said.contains("kernels built in for sm_80, sm_90, sm_100, sm_120, and as PTX for later GPUs (from sm_90)"),
        "{said}"
    );
    assert!(
        said.contains("all-reduce, one process per GPU: zero-copy direct two-shot up to 256 MiB"),
        "{said}"
    );
    assert!(
        said.lines().last().unwrap().starts_with("verdict: ready"),
        "{said}"
    );
}

/// NCCL's configuration file forbidding peer-to-peer keeps the core off, as the variable does;
/// one bounding NCCL's CTAs bounds the core's calls.
#[test]
fn doctor_reads_nccls_configuration_files() {
    let dir = scratch("doctor-conf-file");
    let conf = dir.join("nccl.conf");
    std::fs::write(&conf, "NCCL_P2P_DISABLE=1\nNCCL_MAX_CTAS=8\n").unwrap();
    let real = real_library("2.27.7");
    let warning = "warn  NCCL_P2P_DISABLE is set: no peer-to-peer between GPUs: the core stays off";
    let bound = "the core takes only calls whose kernels fit 8 blocks";
    for (conf_file, warned) in [(conf.to_str().unwrap(), true), ("/nonexistent", false)] {
        let out = ncclshim(
            &["--shim", &shim(), "doctor", "--no-run"],
            &[
                ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
                ("NCCL_CONF_FILE", conf_file),
            ],
        );
        let said = text(&out);
        assert_eq!(said.contains(warning), warned, "{said}");
        assert_eq!(said.contains(bound), warned, "{said}");
    }
}

/// `NCCL_CTA_POLICY=ZERO` asks NCCL 2.28 and later for its copy engines: the doctor says which
/// calls that leaves to NCCL, as the real NCCL found reads the setting (2.27 has no copy
/// engines; 2.28 reads an integer).
#[test]
fn doctor_says_where_nccl_is_asked_for_its_copy_engines() {
    let note = "NCCL_CTA_POLICY asks NCCL for its copy engines";
    for (version, policy, asked) in [
        ("2.28.9", "2", true),
        ("2.28.9", "ZERO", false),
        ("2.28.9", "0", false),
        ("2.27.7", "2", false),
    ] {
        let real = real_library(version);
        let out = ncclshim(
            &["--shim", &shim(), "doctor", "--no-run"],
            &[
                ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
                ("NCCL_CTA_POLICY", policy),
            ],
        );
        let said = text(&out);
        assert_eq!(said.contains(note), asked, "{version} {policy}: {said}");
    }
}

#[test]
fn doctor_fails_with_the_fix_when_no_real_nccl_is_found() {
    let out = ncclshim(
        &["--shim", &shim(), "doctor"],
        &[("NCCLSHIM_REAL_NCCL", "/nonexistent/libnccl.so.2")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("FAIL  no real NCCL found"), "{said}");
    assert!(said.contains("fix: Set NCCLSHIM_REAL_NCCL"), "{said}");
    // A shim that is not one: the fix names --shim.
    let out = ncclshim(&["--shim", "/bin/sh", "doctor"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("is not ncclshim"), "{}", text(&out));
}

#[test]
fn run_puts_the_shim_in_front_and_passes_the_exit_status_on() {
    let real = real_library("2.27.7");
    let out = ncclshim(
        &[
            "--shim",
            &shim(),
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD|$NCCLSHIM_REAL_NCCL\"; exit 7",
        ],
        &[
            ("NCCLSHIM_REAL_NCCL", real.to_str().unwrap()),
            ("LD_PRELOAD", "/lib/other.so"),
        ],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(7), "{said}");
    let shim_file = Path::new(&shim()).canonicalize().unwrap();
    assert!(
        said.contains(&format!(
            "{}:/lib/other.so|{}",
            shim_file.display(),
            real.display()
        )),
        "{said}"
    );
}

#[test]
fn trace_sums_up_trace_files() {
    let dir = scratch("cli-trace");
    let line = |comm: &str, rank: i32, seq: u64, bytes: u64, path: &str| {
        format!(
            "{{\"id\":\"{comm}\",\"rank\":{rank},\"n_ranks\":2,\"coll\":\"AllReduce\",\"coll_sn\":{seq},\"coll_msg_size_bytes\":{bytes},\"count\":1,\"dtype\":\"float\",\"red_op\":\"sum\",\"root\":-1,\"path\":\"{path}\",\"algo\":null,\"captured\":null,\"result\":0,\"ts_us\":1}}\n"
        )
    };
    let rank0: String = (0..10)
        .map(|s| line("0xa0", 0, s, 1024, "routed"))
        .collect();
    let rank1: String = (0..7)
        .map(|s| {
            line(
                "0xb0",
                1,
                s,
                1024,
                if s % 2 == 0 { "routed" } else { "forwarded" },
            )
        })
        .collect();
    let (a, b) = (dir.join("trace.1.jsonl"), dir.join("trace.2.jsonl"));
    std::fs::write(&a, rank0).unwrap();
    std::fs::write(&b, rank1).unwrap();
    let out = ncclshim(&["trace", a.to_str().unwrap(), b.to_str().unwrap()], &[]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let row = said.lines().find(|l| l.starts_with("AllReduce")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["AllReduce", "<", "4", "KiB", "17", "82%", "17408"],
        "{said}"
    );
    assert!(
        said.contains("comm 0xa0 rank 0/2: 10 calls")
            && said.contains("comm 0xb0 rank 1/2: 7 calls"),
        "{said}"
    );
    assert!(
        said.contains("behind: communicator 1 of 2 ranks (by first use): rank 1 (7 calls) behind the others' 10 calls"),
        "{said}"
    );
}

/// `ncclshim dump PID` makes a running job write its flight recorder, and `ncclshim trace` reads
/// where each communicator stopped from that log.
#[test]
fn dump_asks_a_running_job_for_its_last_calls_and_trace_reads_them() {
    use std::io::{BufRead, BufReader};
    let dir = scratch("cli-dump");
    let (client, fake) = ncclshim_tests::calls_client_and_fake_nccl(&dir);
    let mut job = Command::new(&client)
        .arg("wait")
        .env("NCCLSHIM_REAL_NCCL", &fake)
        .env("NCCLSHIM_DUMP_ON_SIGNAL", "1")
        .env("NCCL_DEBUG", "WARN")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(job.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "waiting" {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the job ended before waiting"
        );
    }
    let pid = job.id().to_string();
    let said = ncclshim(&["dump", &pid], &[]);
    assert!(said.status.success(), "{}", text(&said));
    let mut log = String::new();
    std::io::Read::read_to_string(&mut out, &mut log).unwrap();
    assert!(job.wait().unwrap().success());
    assert!(
        log.contains("flight recorder (SIGUSR1): comm 0x1000 rank 0/2"),
        "{log}"
    );
    let log_file = dir.join("job.log");
    std::fs::write(&log_file, &log).unwrap();
    let summary = text(&ncclshim(&["trace", log_file.to_str().unwrap()], &[]));
    assert!(
        summary.contains("comm 0x1000 rank 0/2: 108 calls"),
        "{summary}"
    );
    assert!(
        summary.contains("comm 0x2000 rank 1/2: 5000 calls"),
        "{summary}"
    );
    // A process that is not there: a failure, said.
    assert!(!ncclshim(&["dump", "999999999"], &[]).status.success());
}
