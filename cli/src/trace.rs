//! `ncclshim trace FILES...`: a summary of trace files (NCCLSHIM_TRACE, one per process): per
//! operation and size band the calls, bytes and the share the core ran; then, per file, where
//! each communicator's calls stopped (its last sequence number), the first thing to look at when
//! a job hangs: the rank whose communicator stopped earliest is the one the others wait for.
//! Logs with flight-recorder dumps (a core wait that gave up, SIGUSR1) count as well: their
//! "flight recorder: comm C rank R #SEQ ..." lines say where each communicator was.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// The fields of one trace line this summary reads.
struct Call {
    comm: String,
    rank: i64,
    nranks: i64,
    coll: String,
    seq: u64,
    bytes: u64,
    routed: bool,
}

/// A field of a trace line (one flat JSON object, as the shim writes it).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = &line[at..];
    let end = if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.find('"').map(|e| &quoted[..e]);
    } else {
        rest.find([',', '}'])?
    };
    Some(&rest[..end])
}

/// A flight recorder's head line in a log: "... flight recorder (WHY): comm 0x.. rank R/N on
/// GPU G: M calls made, ...": (comm, rank, ranks, calls made).
fn parse_dump(line: &str) -> Option<(String, i64, i64, u64)> {
    let rest = line
        .split_once("flight recorder (")?
        .1
        .split_once("): comm ")?
        .1;
    let mut words = rest.split_whitespace();
    let comm = words.next()?.to_string();
    (words.next()? == "rank").then_some(())?;
    let (rank, nranks) = words.next()?.split_once('/')?;
    let calls = rest
        .split_once(": ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((comm, rank.parse().ok()?, nranks.parse().ok()?, calls))
}

fn parse(line: &str) -> Option<Call> {
    Some(Call {
        comm: field(line, "id")?.to_string(),
        rank: field(line, "rank")?.parse().ok()?,
        nranks: field(line, "n_ranks")?.parse().ok()?,
        coll: field(line, "coll")?.to_string(),
        seq: field(line, "coll_sn")?.parse().ok()?,
        bytes: field(line, "coll_msg_size_bytes")?.parse().ok()?,
        routed: field(line, "path")? == "routed",
    })
}

const BANDS: [(u64, &str); 6] = [
    (4 << 10, "< 4 KiB"),
    (64 << 10, "4 KiB - 64 KiB"),
    (1 << 20, "64 KiB - 1 MiB"),
    (16 << 20, "1 MiB - 16 MiB"),
    (256 << 20, "16 MiB - 256 MiB"),
    (u64::MAX, ">= 256 MiB"),
];

/// Where one communicator of one file stopped.
struct Stop {
    comm: String,
    rank: i64,
    nranks: i64,
    calls: u64,
}

/// A file's communicators, in the order of their first call.
#[derive(Default)]
struct Stops(Vec<Stop>);

impl Stops {
    fn saw(&mut self, comm: &str, rank: i64, nranks: i64, calls: u64) {
        match self.0.iter_mut().find(|s| s.comm == comm) {
            Some(stop) => stop.calls = stop.calls.max(calls),
            None => self.0.push(Stop {
                comm: comm.to_string(),
                rank,
                nranks,
                calls,
            }),
        }
    }
}

#[derive(Default)]
struct Tally {
    calls: u64,
    routed: u64,
    bytes: u64,
}

pub fn run(files: &[PathBuf]) -> ExitCode {
    let mut tallies: BTreeMap<(String, usize), Tally> = BTreeMap::new();
    let mut stops: Vec<(String, Stops)> = Vec::new();
    let (mut unread, mut dropped) = (0, 0u64);
    for file in files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("ncclshim trace: {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        };
        let mut last = Stops::default();
        for line in text.lines() {
            if let Some(n) = field(line, "dropped") {
                dropped += n.parse::<u64>().unwrap_or(0);
                continue;
            }
            if !line.starts_with('{') {
                // A log: only its flight recorder's lines count.
                if let Some((comm, rank, nranks, calls)) = parse_dump(line) {
                    last.saw(&comm, rank, nranks, calls);
                }
                continue;
            }
            let Some(call) = parse(line) else {
                unread += 1;
                continue;
            };
            let band = BANDS
                .iter()
                .position(|(bound, _)| call.bytes < *bound)
                .unwrap_or(5);
            let tally = tallies.entry((call.coll.clone(), band)).or_default();
            tally.calls += 1;
            tally.routed += call.routed as u64;
            tally.bytes += call.bytes;
            last.saw(&call.comm, call.rank, call.nranks, call.seq + 1);
        }
        stops.push((file.display().to_string(), last));
    }
    println!(
        "{:<14} {:<18} {:>10} {:>8} {:>14}",
        "operation", "size", "calls", "routed", "bytes"
    );
    for ((coll, band), t) in &tallies {
        println!(
            "{coll:<14} {:<18} {:>10} {:>7.0}% {:>14}",
            BANDS[*band].1,
            t.calls,
            100.0 * t.routed as f64 / t.calls as f64,
            t.bytes
        );
    }
    println!("\nwhere each communicator's calls stop (calls made), per file:");
    for (file, last) in &stops {
        println!("  {file}");
        for stop in &last.0 {
            println!(
                "    comm {} rank {}/{}: {} calls",
                stop.comm, stop.rank, stop.nranks, stop.calls
            );
        }
    }
    for line in behind(&stops) {
        println!("{line}");
    }
    if dropped > 0 {
        println!("\n{dropped} calls were dropped from the traces (the writer fell behind)");
    }
    if unread > 0 {
        eprintln!("ncclshim trace: {unread} lines were not trace records");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Which ranks are behind: a communicator's handle differs from process to process, so the
/// communicators of the files are matched by their size and the order of their first call (the
/// k-th communicator of N ranks in each file); where ranks of one made fewer calls than the
/// others, those are the ones the others wait for.
fn behind(stops: &[(String, Stops)]) -> Vec<String> {
    let mut groups: BTreeMap<(i64, usize), Vec<&Stop>> = BTreeMap::new();
    for (_, last) in stops {
        let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
        for stop in &last.0 {
            let k = seen.entry(stop.nranks).or_default();
            groups.entry((stop.nranks, *k)).or_default().push(stop);
            *k += 1;
        }
    }
    let mut lines = vec![String::new()];
    for ((nranks, k), group) in groups {
        let most = group.iter().map(|s| s.calls).max().unwrap_or(0);
        let late: Vec<String> = group
            .iter()
            .filter(|s| s.calls < most)
            .map(|s| format!("rank {} ({} calls)", s.rank, s.calls))
            .collect();
        if group.len() > 1 && !late.is_empty() {
            lines.push(format!(
                "behind: communicator {} of {nranks} ranks (by first use): {} behind the others' {most} calls",
                k + 1,
                late.join(", ")
            ));
        }
    }
    if lines.len() == 1 {
        lines.push(
            "behind: no rank (each matched communicator made as many calls on every rank)".into(),
        );
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_line_is_read() {
        let line = r#"{"id":"0x1000","rank":1,"n_ranks":2,"coll":"AllReduce","coll_sn":7,"coll_msg_size_bytes":1024,"count":256,"dtype":"float","red_op":"sum","root":-1,"path":"routed","algo":"one_shot","captured":null,"result":0,"ts_us":1}"#;
        let call = parse(line).unwrap();
        assert_eq!(
            (call.comm.as_str(), call.rank, call.nranks),
            ("0x1000", 1, 2)
        );
        assert_eq!(
            (call.coll.as_str(), call.seq, call.bytes, call.routed),
            ("AllReduce", 7, 1024, true)
        );
        assert!(parse(r#"{"dropped":3}"#).is_none());
        let head = "[2026-11-24 01:53:45] vm:951:951 [ncclshim] NCCL WARN flight recorder (SIGUSR1): comm 0x55b7dee75370 rank 1/2 on GPU 1: 41 calls made, the last 41 follow";
        assert_eq!(parse_dump(head), Some(("0x55b7dee75370".into(), 1, 2, 41)));
        let entry = "NCCL WARN flight recorder: comm 0x1 rank 0 #4 AllReduce 8 KiB";
        assert_eq!(parse_dump(entry), None);
    }

    #[test]
    fn the_rank_that_made_fewer_calls_is_behind() {
        let file = |comms: &[(&str, i64, i64, u64)]| {
            let mut stops = Stops::default();
            for &(comm, rank, nranks, calls) in comms {
                stops.saw(comm, rank, nranks, calls);
            }
            (String::new(), stops)
        };
        let stops = [
            file(&[("0xa", 0, 2, 50), ("0xb", 0, 8, 7)]),
            file(&[("0xc", 1, 2, 41), ("0xd", 1, 8, 7)]),
        ];
        assert_eq!(
            behind(&stops)[1..],
            [
                "behind: communicator 1 of 2 ranks (by first use): rank 1 (41 calls) behind the others' 50 calls"
            ]
        );
    }
}
