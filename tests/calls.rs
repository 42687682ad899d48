//! What the shim records of each call of an operation, seen from outside: the exit summary
//! (`NCCLSHIM_SUMMARY=1`), the trace (`NCCLSHIM_TRACE`) and the flight recorder
//! (`NCCLSHIM_DUMP_ON_SIGNAL=1`), with a C client calling through the shim into a stand-in for
//! the real NCCL whose operations succeed without a GPU (tests/c/fake_operations_nccl.c).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ncclshim_tests::{EMPTY_CALLS_ANSWERED, calls_client_and_fake_nccl, run, scratch, stdout_of};

/// What the calls client prints, run with `args` through the shim into the stand-in NCCL (both
/// built in `dir`), with `env` besides.
fn client_output(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let (client, fake) = calls_client_and_fake_nccl(dir);
    let mut all = vec![("NCCLSHIM_REAL_NCCL", fake.to_str().unwrap())];
    all.extend_from_slice(env);
    stdout_of(&run(&client, args, &all))
}

#[test]
fn the_exit_summary_counts_every_call_by_operation_and_size() {
    let dir = scratch("calls-summary");
    let out = client_output(&dir, &[], &[("NCCLSHIM_SUMMARY", "1")]);
    let summary: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("NCCL INFO summary: ").map(|(_, s)| s))
        .collect();
    let expected = [
        "comm 0x1000 rank 0/2 on GPU 0 (destroyed): the core never set up; 108 calls",
        "comm 0x1000 rank 0  AllReduce < 4 KiB: 100 calls, 100 KiB: forwarded 100",
        "comm 0x1000 rank 0  Broadcast < 4 KiB: 1 calls, 8 B: forwarded 1",
        "comm 0x1000 rank 0  AllGather 1 MiB - 16 MiB: 5 calls, 40 MiB: forwarded 5",
        "comm 0x1000 rank 0  Send < 4 KiB: 1 calls, 16 B: forwarded 1",
        "comm 0x1000 rank 0  Recv < 4 KiB: 1 calls, 16 B: forwarded 1",
    ];
    let threads: Vec<String> = (2..=5)
        .flat_map(|n| {
            [
                format!("comm {n:#x}000 rank {}/2 on GPU 0: the core never set up; 5000 calls", n - 1),
                format!("comm {n:#x}000 rank {}  AllReduce < 4 KiB: 5000 calls, 312.5 KiB: forwarded 5000", n - 1),
            ]
        })
        .collect();
    for line in expected
        .iter()
        .copied()
        .chain(threads.iter().map(String::as_str))
    {
        assert!(summary.contains(&line), "{line:?} not in\n{out}");
    }
    assert_eq!(summary.len(), expected.len() + threads.len(), "{out}");
    assert!(
        out.trim_end().ends_with("done") || out.contains("done\n"),
        "{out}"
    );
}

/// The JSON lines of a trace file: (comm, sequence number, operation, bytes) of each.
fn trace_records(path: &Path) -> Vec<(String, u64, String, u64)> {
    let text = std::fs::read_to_string(path).unwrap();
    let field = |line: &str, name: &str| -> String {
        let at = line
            .find(&format!("\"{name}\":"))
            .unwrap_or_else(|| panic!("{name} in {line}"));
        let rest = &line[at + name.len() + 3..];
        rest[..rest.find([',', '}']).unwrap()]
            .trim_matches('"')
            .to_string()
    };
    text.lines()
        .map(|line| {
            assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
            assert!(!line.contains("dropped"), "{line}");
            (
                field(line, "id"),
                field(line, "coll_sn").parse().unwrap(),
                field(line, "coll"),
                field(line, "coll_msg_size_bytes").parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_forked_childs_summary_is_its_own() {
    let dir = scratch("calls-summary-fork");
    let out = client_output(&dir, &["fork"], &[("NCCLSHIM_SUMMARY", "1")]);
    let heads: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("calls") && l.contains("on GPU"))
        .collect();
    // The parent's five communicators once, the child's one once.
    assert_eq!(heads.len(), 6, "{out}");
    assert_eq!(
        heads.iter().filter(|l| l.contains("comm 0x1000 ")).count(),
        1,
        "{out}"
    );
    assert!(
        out.contains("summary: comm 0x6000 rank 5/2 on GPU 0: the core never set up; 10 calls"),
        "{out}"
    );
}

#[test]
fn the_trace_has_one_line_per_call_in_each_processs_own_file() {
    let dir = scratch("calls-trace");
    let traces = dir.join("traces");
    let _ = std::fs::remove_dir_all(&traces);
    std::fs::create_dir_all(&traces).unwrap();
    let pattern = traces.join("trace.%p.jsonl");
    let out = client_output(
        &dir,
        &["fork"],
        &[("NCCLSHIM_TRACE", pattern.to_str().unwrap())],
    );
    assert!(out.contains("done"), "{out}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort_by_key(|f| std::fs::metadata(f).unwrap().len());
    assert_eq!(files.len(), 2, "the parent's and the child's: {files:?}");
    // The child: its own 10 calls, numbered from 0.
    let child = trace_records(&files[0]);
    assert_eq!(child.len(), 10);
    assert!(
        child
            .iter()
            .enumerate()
            .all(|(i, r)| r.0 == "0x6000" && r.1 == i as u64 && r.3 == 4)
    );
    // The parent: every call, each communicator's numbered 0.. without a gap.
    let parent = trace_records(&files[1]);
    let mut by_comm: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (comm, seq, _, _) in &parent {
        by_comm.entry(comm.clone()).or_default().push(*seq);
    }
    for (comm, calls) in [
        ("0x1000", 108),
        ("0x2000", 5000),
        ("0x3000", 5000),
        ("0x4000", 5000),
        ("0x5000", 5000),
    ] {
        let mut seqs = by_comm.remove(comm).unwrap_or_default();
        seqs.sort();
        assert_eq!(seqs, (0..calls).collect::<Vec<u64>>(), "{comm}");
    }
    assert!(by_comm.is_empty(), "{by_comm:?}");
    let gathers: Vec<_> = parent.iter().filter(|r| r.2 == "AllGather").collect();
    assert_eq!(gathers.len(), 5);
    assert!(gathers.iter().all(|r| r.3 == 8 << 20));
}

#[test]
fn sigusr1_writes_the_flight_recorder() {
    let dir = scratch("calls-signal");
    let out = client_output(
        &dir,
        &["signal"],
        &[("NCCLSHIM_DUMP_ON_SIGNAL", "1"), ("NCCL_DEBUG", "WARN")],
    );
    assert!(
        out.contains("flight recorder (SIGUSR1): comm 0x1000 rank 0/2 on GPU 0: 108 calls made, the last 64 follow"),
        "{out}"
    );
    assert!(
        out.contains("flight recorder: comm 0x1000 rank 0 #107 Recv 16 B (2 x double) op - root 1 forwarded result 0"),
        "{out}"
    );
    assert!(
        out.contains("flight recorder (SIGUSR1): comm 0x2000 rank 1/2"),
        "{out}"
    );
    assert_eq!(
        out.matches("flight recorder: comm 0x1000 ").count(),
        64,
        "{out}"
    );
}

/// NCCL 2.28 returns ncclSuccess without writing the window handle where it registers nothing:
/// the program's slot then reads NULL (as later NCCLs write), not what it held, which the shim
/// would take for a window (and ranks could differ in); a refused call leaves it as it was.
#[test]
fn a_window_handle_nccl_does_not_write_reads_null() {
    let dir = scratch("calls-windows");
    let out = client_output(&dir, &["windows"], &[]);
    for line in [
        "window of nothing: result 0, handle 0\n",
        "window of refused: result 4, handle 0xdead\n",
        "window of a buffer: result 0, handle 0xbeef\n",
        "done\n",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
}

/// A group reaches the real NCCL only with its first call that goes there, and ends there only
/// where it was opened there: NCCL 2.28.9 keeps about 176 bytes of every group that held
/// nothing, so a group whose calls all go to the core must never reach it. A simulated end
/// (which launches nothing) reaches NCCL with the whole group, opened there if need be. (No GPU
/// here: the all-reduces go to NCCL.)
#[test]
fn groups_reach_nccl_only_with_a_call_that_goes_there() {
    let dir = scratch("calls-groups");
    let out = client_output(&dir, &["groups"], &[("FAKE_NCCL_GROUPS", "1")]);
    let seen: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("NCCL INFO") && !l.contains("NCCL WARN"))
        .collect();
    let start = "fake ncclGroupStart";
    let end = "fake ncclGroupEnd";
    let all_reduce = "fake ncclAllReduce";
    let simulate = "fake ncclGroupSimulateEnd";
    let expected = [
        "empty",
        "one call",
        start,
        all_reduce,
        end,
        "nested, the call inside",
        start,
        start,
        all_reduce,
        end,
        end,
        "nested, the call after the inner one",
        start,
        all_reduce,
        end,
        "simulated, empty",
        start,
        simulate,
        "simulated, one call",
        start,
        all_reduce,
        simulate,
        "nested, the inner one simulated",
        start,
        start,
        all_reduce,
        simulate,
        end,
        "an end without a start",
        end,
        "done",
    ];
    assert_eq!(seen, expected, "{out}");
}

/// Calls of no elements on a communicator the shim saw made (here declined by the core: no GPU)
/// are answered by the shim where NCCL would drop them after its checks, so that they never reach
/// NCCL; those NCCL's checks refuse (a root out of range, an unknown type or op, a type some
/// versions lack), a call with elements, and calls on a destroyed communicator reach it. With the
/// core off, or NCCL asked to check pointers, every call reaches it.
#[test]
fn calls_of_no_elements_reach_nccl_only_where_its_checks_may_refuse_them() {
    let dir = scratch("calls-empty");
    let seen = |env: &[(&str, &str)]| -> Vec<String> {
        let mut all = vec![("FAKE_NCCL_GROUPS", "1")];
        all.extend_from_slice(env);
        let out = client_output(&dir, &["empty"], &all);
        out.lines()
            .filter(|l| !l.contains("NCCL INFO") && !l.contains("NCCL WARN"))
            .map(str::to_string)
            .collect()
    };
    let (all_reduce, broadcast) = ("fake ncclAllReduce", "fake ncclBroadcast");
    let (start, end) = ("fake ncclGroupStart", "fake ncclGroupEnd");
    // The group's questions (its size, this rank) reach NCCL without opening its group: with
    // calls the shim answers, the group never reaches NCCL.
    assert_eq!(seen(&[]), EMPTY_CALLS_ANSWERED);
    let refused_and_after = &EMPTY_CALLS_ANSWERED[4..];
    let forwarded: Vec<&str> = [
        "made: 0",
        "a group of two empty all-reduces",
        start,
        all_reduce,
        all_reduce,
        end,
        "rank 0 of 2",
        "an empty broadcast from root 1",
        broadcast,
    ]
    .iter()
    .chain(refused_and_after)
    .copied()
    .collect();
    for setting in [("NCCLSHIM_CORE", "0"), ("NCCL_CHECK_POINTERS", "1")] {
        assert_eq!(seen(&[setting]), forwarded, "{setting:?}");
    }
}

/// NCCL 2.29.7 and later read `NCCL_CHECK_MODE` as they make each communicator: a program that
/// sets it between two gets NCCL's checks of the later one's calls of no elements, which the shim
/// then forwards.
#[test]
fn calls_of_no_elements_reach_nccl_once_a_communicator_is_made_to_check() {
    let dir = scratch("calls-check-mode");
    let out = client_output(&dir, &["checkmode"], &[("FAKE_NCCL_GROUPS", "1")]);
    let seen: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("NCCL INFO") && !l.contains("NCCL WARN"))
        .collect();
    let expected = [
        "made: 0",
        "an empty all-reduce",
        "made with NCCL_CHECK_MODE: 0",
        "an empty all-reduce on it",
        "fake ncclAllReduce",
        "done",
    ];
    assert_eq!(seen, expected, "{out}");
}

/// Under `NCCL_DEBUG=INFO` with COLL in `NCCL_DEBUG_SUBSYS`, NCCL logs a line for each
/// collective call; the shim logs the calls that never reach NCCL (here the three it answers)
/// in NCCL's words, and nothing where the subsystems leave COLL out.
#[test]
fn calls_the_shim_answers_are_logged_as_nccl_logs_its_own() {
    let dir = scratch("calls-coll-lines");
    // (time, message) of each line of a call the shim logs.
    let logged = |env: &[(&str, &str)]| -> Vec<(bool, String)> {
        let mut all = vec![("NCCL_DEBUG", "INFO")];
        all.extend_from_slice(env);
        let out = client_output(&dir, &["empty"], &all);
        out.lines()
            .filter_map(|l| l.split_once("[ncclshim] NCCL INFO "))
            .filter(|(_, m)| m.contains(": opCount "))
            .map(|(prefix, m)| (prefix.starts_with('['), m.to_string()))
            .collect()
    };
    let lines = |subsystems: &str| -> Vec<String> {
        let logged = logged(&[("NCCL_DEBUG_SUBSYS", subsystems)]);
        // As NCCL's INFO lines: no time unless NCCL_DEBUG_TIMESTAMP_LEVELS names INFO.
        assert!(logged.iter().all(|(timed, _)| !timed), "{logged:?}");
        logged.into_iter().map(|(_, m)| m).collect()
    };
    let tail = "comm 0x1000 [nranks=2] stream (nil)";
    let expected = [
        format!(
            "AllReduce: opCount 0 sendbuff 0x10 recvbuff 0x10 count 0 datatype 7 op 0 root 0 {tail}"
        ),
        format!(
            "AllReduce: opCount 0 sendbuff (nil) recvbuff (nil) count 0 datatype 9 op 4 root 0 {tail}"
        ),
        format!(
            "Broadcast: opCount 0 sendbuff (nil) recvbuff (nil) count 0 datatype 7 op 0 root 1 {tail}"
        ),
    ];
    assert_eq!(lines("INIT,COLL"), expected);
    assert_eq!(lines("^NET"), expected);
    assert!(lines("INIT,ENV").is_empty());
    let timed = logged(&[
        ("NCCL_DEBUG_SUBSYS", "COLL"),
        ("NCCL_DEBUG_TIMESTAMP_LEVELS", "WARN,INFO"),
    ]);
    assert_eq!(timed.len(), 3);
    assert!(timed.iter().all(|(timed, _)| *timed), "{timed:?}");
}

/// NCCL's settings come from its configuration files where the environment has none (NCCL loads
/// them into the environment at its first init, `NCCL_CONF_FILE` naming one): the shim's log
/// follows `NCCL_DEBUG` from there, and a communicator `NCCL_COMM_BLOCKING=0` makes nonblocking
/// (whatever its config) is one to the shim too.
#[test]
fn nccls_settings_come_from_its_configuration_files_too() {
    let dir = scratch("calls-conf-file");
    let conf = dir.join("nccl.conf");
    std::fs::write(
        &conf,
        "# NCCL_DEBUG=WARN\nNCCL_DEBUG=INFO\nNCCL_COMM_BLOCKING=0\nNCCL_DEBUG=WARN\n",
    )
    .unwrap();
    let conf = conf.to_str().unwrap();
    let info = |env: &[(&str, &str)]| -> Vec<String> {
        let out = client_output(&dir, &["checkmode"], env);
        assert!(out.contains("done"), "{out}");
        out.lines()
            .filter_map(|l| l.split_once("[ncclshim] NCCL INFO "))
            .map(|(_, m)| m.to_string())
            .collect()
    };
    let nonblocking = "comm 0x1000 is nonblocking: its core is set up after its first all-reduce";
    let from_file = info(&[("NCCL_CONF_FILE", conf)]);
    assert!(
        from_file
            .iter()
            .any(|m| m.contains("forwarding to real NCCL")),
        "{from_file:?}"
    );
    assert!(from_file.iter().any(|m| m == nonblocking), "{from_file:?}");
    // The environment comes first.
    assert!(info(&[("NCCL_CONF_FILE", conf), ("NCCL_DEBUG", "WARN")]).is_empty());
    let blocking = info(&[("NCCL_CONF_FILE", conf), ("NCCL_COMM_BLOCKING", "1")]);
    assert!(
        !blocking.is_empty() && !blocking.iter().any(|m| m == nonblocking),
        "{blocking:?}"
    );
    let by_default = info(&[("NCCL_DEBUG", "INFO")]);
    assert!(
        !by_default.is_empty() && !by_default.iter().any(|m| m == nonblocking),
        "{by_default:?}"
    );
    assert!(
        info(&[("NCCL_DEBUG", "INFO"), ("NCCL_COMM_BLOCKING", "0")])
            .iter()
            .any(|m| m == nonblocking)
    );
}

/// With `NCCL_WARN_ENABLE_DEBUG_INFO=1`, NCCL's log goes on at INFO after a warning it wrote;
/// so does the shim's after one of its own (here: a variable of an earlier release).
#[test]
fn a_warning_raises_the_log_to_info_where_asked() {
    let dir = scratch("calls-warning-raises");
    let lines = |raise: &str| -> (usize, usize) {
        let out = client_output(
            &dir,
            &["checkmode"],
            &[
                ("NCCL_DEBUG", "WARN"),
                ("NCCLSHIM_DIRECT", "0"),
                ("NCCL_WARN_ENABLE_DEBUG_INFO", raise),
            ],
        );
        assert!(out.contains("done"), "{out}");
        let count = |tag: &str| out.lines().filter(|l| l.contains(tag)).count();
        (count("[ncclshim] NCCL WARN"), count("[ncclshim] NCCL INFO"))
    };
    let (warnings, infos) = lines("0");
    assert!(warnings > 0 && infos == 0, "{warnings} {infos}");
    let (warnings, infos) = lines("1");
    assert!(warnings > 0 && infos > 0, "{warnings} {infos}");
}

/// A blocking communicator whose ranks do not all meet in this host's shared memory (here the
/// stand-in NCCL's peer never comes) is set up at its first all-reduce, as a nonblocking one
/// is, not as it is made: ranks that differ in blocking then meet at the same point.
#[test]
fn a_communicator_met_through_nccl_is_set_up_at_its_first_all_reduce() {
    let dir = scratch("calls-first-all-reduce");
    let out = client_output(&dir, &["empty"], &[("NCCL_DEBUG", "INFO")]);
    let at = |text: &str| {
        out.lines()
            .position(|l| l.contains(text))
            .unwrap_or_else(|| panic!("{text:?} not in\n{out}"))
    };
    let deferred = at("comm 0x1000: not all its ranks met in this host's shared memory");
    let declined = at("core off for comm 0x1000");
    assert!(at("made: 0") > deferred, "deferred as it is made\n{out}");
    assert!(
        declined > at("an all-reduce of 4"),
        "set up at its first all-reduce\n{out}"
    );
}

/// The two ranks of a communicator in two processes (the stand-in NCCL's init returning once
/// both have entered it) meet in shared memory as they are made; where one's communicator is
/// nonblocking (`NCCL_COMM_BLOCKING=0`), each sees it from the other's signature and declines,
/// the blocking one as it is made and the other at its first all-reduce, neither waiting for the
/// other.
#[test]
fn ranks_that_differ_in_blocking_decline_without_waiting() {
    let dir = scratch("calls-pair");
    let (client, fake) = calls_client_and_fake_nccl(&dir);
    let pair = |tag: &str, nonblocking_rank: Option<usize>| -> Vec<String> {
        let barrier = dir.join(tag);
        std::fs::create_dir_all(&barrier).unwrap();
        let id = format!("{tag}-{}", std::process::id());
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (client, fake, barrier, id) =
                    (client.clone(), fake.clone(), barrier.clone(), id.clone());
                std::thread::spawn(move || {
                    let mut env = vec![
                        ("NCCLSHIM_REAL_NCCL", fake.to_str().unwrap().to_string()),
                        ("FAKE_NCCL_BARRIER", barrier.to_str().unwrap().to_string()),
                        ("PAIR_ID", id),
                        ("NCCL_DEBUG", "INFO".to_string()),
                    ];
                    if nonblocking_rank == Some(rank) {
                        env.push(("NCCL_COMM_BLOCKING", "0".to_string()));
                    }
                    let env: Vec<(&str, &str)> =
                        env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    stdout_of(&run(&client, &["pair", &rank.to_string()], &env))
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    };
    let started = std::time::Instant::now();
    for out in pair("mixed", Some(1)) {
        assert!(out.contains("done"), "{out}");
        assert!(
            out.contains("are not all blocking nor all nonblocking"),
            "{out}"
        );
    }
    // Alike, they meet here (and go no further without a GPU).
    for out in pair("alike", None) {
        assert!(
            out.contains("done") && !out.contains("not all blocking"),
            "{out}"
        );
        assert!(
            !out.contains("not all its ranks met in this host's shared memory"),
            "{out}"
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}
