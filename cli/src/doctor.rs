//! `ncclshim doctor`: whether a job can use the shim on this machine, each check one line
//! ("ok", "warn" or "FAIL", a FAIL with its fix), a verdict last. Without a GPU it says so and
//! checks the rest: the exit status fails only for what a job cannot do without.

use std::path::PathBuf;
use std::process::ExitCode;

use nccl::core::measured::Buffers;
use nccl::core::types::Collective;
use nccl::core::{kernels, measured, policy, program, settings};

use crate::gpus::{self, Machine};
use crate::libraries;

#[derive(Default)]
struct Report {
    failures: usize,
    warnings: usize,
}

impl Report {
    fn section(&self, title: &str) {
        println!("\n{title}");
    }
    fn ok(&self, text: impl AsRef<str>) {
        println!("  ok    {}", text.as_ref());
    }
    fn warn(&mut self, text: impl AsRef<str>) {
        self.warnings += 1;
        println!("  warn  {}", text.as_ref());
    }
    fn fail(&mut self, text: impl AsRef<str>, fix: impl AsRef<str>) {
        self.failures += 1;
        println!("  FAIL  {}\n        fix: {}", text.as_ref(), fix.as_ref());
    }
    fn note(&self, text: impl AsRef<str>) {
        println!("        {}", text.as_ref());
    }
}

pub fn run(shim: Option<PathBuf>, all_reduce: bool) -> ExitCode {
    let mut report = Report::default();
    let (abi, libraries) = check_libraries(&mut report, shim);
    let machine = check_gpus(&mut report);
    check_core(&mut report, machine.as_ref());
    check_routing(&mut report, machine.as_ref());
    if all_reduce {
        check_all_reduce(&mut report, machine.as_ref(), libraries);
    }
    println!();
    let verdict = if report.failures > 0 {
        format!(
            "{} problem(s) a job cannot run with: see FAIL above",
            report.failures
        )
    } else {
        format!(
            "ready{}{}",
            abi.map_or(String::new(), |v| format!(" (NCCL {v} ABI)")),
            if report.warnings > 0 {
                format!(", {} warning(s)", report.warnings)
            } else {
                String::new()
            }
        )
    };
    println!("verdict: {verdict}");
    if report.failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The shim and the real NCCL; returns the ABI the shim exports, and both libraries where
/// both are there.
fn check_libraries(
    report: &mut Report,
    shim: Option<PathBuf>,
) -> (Option<String>, Option<(PathBuf, PathBuf)>) {
    report.section("Libraries");
    let mut shim_path = None;
    let mut real_path = None;
    let abi = match libraries::find_shim(shim) {
        Ok(path) => {
            shim_path = Some(path.clone());
            let abi = libraries::shim_abi(&path);
            match abi.as_deref() {
                Some("all") => report.ok(format!(
                    "the shim: {} (exports the API of every NCCL version with a spec)",
                    path.display()
                )),
                other => report.ok(format!(
                    "the shim: {} (exports the NCCL {} ABI)",
                    path.display(),
                    other.unwrap_or("?")
                )),
            }
            abi.filter(|v| v != "all")
        }
        Err(e) => {
            let (problem, fix) = e.split_once("; fix: ").unwrap_or((&e, "make build"));
            report.fail(problem, fix);
            None
        }
    };
    match libraries::find_real() {
        Ok(found) => match libraries::nccl_version(&found.path) {
            Ok(code) => {
                // Settings read from here on are read as this NCCL reads them, as the library's.
                nccl::nccl_env::noted_version(code);
                let version = nccl::version_text(code);
                real_path = Some(found.path.clone());
                report.ok(format!(
                    "the real NCCL: {} ({version}), found by {}",
                    found.path.display(),
                    found.origin
                ));
                if let Some(abi) = &abi
                    && libraries::version_key(&version) < libraries::version_key(abi)
                {
                    report.warn(format!(
                        "the real NCCL {version} is older than the ABI exported ({abi}): functions it lacks answer ncclInvalidUsage"
                    ));
                }
            }
            Err(e) => report.fail(
                format!(
                    "the real NCCL at {} does not load: {e}",
                    found.path.display()
                ),
                "set NCCLSHIM_REAL_NCCL to a working libnccl.so.2",
            ),
        },
        Err(not_found) => {
            report.fail("no real NCCL found", nccl::locate::HOW_TO_GET_NCCL);
            report.note("looked at:");
            for place in not_found.places() {
                report.note(format!("  {place}"));
            }
        }
    }
    (abi, shim_path.zip(real_path))
}

fn check_gpus(report: &mut Report) -> Option<Machine> {
    report.section("GPUs");
    let machine = match gpus::machine() {
        Ok(machine) if !machine.gpus.is_empty() => machine,
        Ok(_) => {
            report.warn("no GPU: the core cannot be checked here");
            return None;
        }
        Err(e) => {
            report.warn(format!("{e}: no GPU to check here"));
            return None;
        }
    };
    // CUDA's encoding: 1000 * major + 10 * minor.
    let driver = machine.driver_version;
    report.ok(format!(
        "CUDA driver {}.{}, {} GPU(s)",
        driver / 1000,
        driver % 1000 / 10,
        machine.gpus.len()
    ));
    for gpu in &machine.gpus {
        report.note(format!(
            "GPU {}: {}, sm_{}{}, {} GiB",
            gpu.ordinal,
            gpu.name,
            gpu.arch.0,
            gpu.arch.1,
            gpu.memory_bytes >> 30
        ));
    }
    if machine.gpus.len() > 1 {
        report.note("peer access (rank of the link, 0 the best; - none):");
        let header: String = (0..machine.gpus.len()).map(|b| format!("{b:>5}")).collect();
        report.note(format!("      {header}"));
        for (a, row) in machine.peers.iter().enumerate() {
            let cells: String = row
                .iter()
                .map(|cell| match cell {
                    None => format!("{:>5}", "x"),
                    Some((true, rank)) => format!("{rank:>5}"),
                    Some((false, _)) => format!("{:>5}", "-"),
                })
                .collect();
            report.note(format!("GPU {a:>2}{cells}"));
        }
    }
    Some(machine)
}

/// Whether the core would serve a job on this machine's GPUs, and if not, why.
fn check_core(report: &mut Report, machine: Option<&Machine>) {
    report.section("The core (collectives over NVLink)");
    let settings = policy::settings();
    if !settings.enabled {
        report.warn("NCCLSHIM_CORE=0: every call forwards to NCCL");
        return;
    }
    if let Some(why) = nccl::core::p2p_forbidden() {
        report.warn(format!("{why}: the core stays off"));
    }
    if let Some(bound) = nccl::core::cta_bound() {
        report.note(format!(
            "NCCL_MAX_CTAS or NCCL_MAX_NCHANNELS bounds NCCL's kernels to {bound} CTAs: the core takes only calls whose kernels fit {bound} blocks"
        ));
    }
    if nccl::core::copy_engines_asked() {
        report.note(
            "NCCL_CTA_POLICY asks NCCL for its copy engines: the core leaves to NCCL the all-gathers, all-to-alls, gathers and scatters whose buffers lie in symmetric windows",
        );
    }
    let built_in = kernels::built_in_archs();
    if built_in.is_empty() {
        report.warn(
            "no kernels built in (a build without NVRTC): every GPU compiles them at first use",
        );
    } else {
        report.ok(format!(
            "kernels built in for {}",
            built_in
                .iter()
                .map(|(major, minor)| format!("sm_{major}{minor}"))
                .collect::<Vec<_>>()
                .join(", ")
                + &match kernels::carries_ptx() {
                    true => format!(
                        ", and as PTX for later GPUs (from sm_{}{})",
                        program::PTX_ARCH.0,
                        program::PTX_ARCH.1
                    ),
                    false => String::new(),
                }
        ));
    }
    let Some(machine) = machine else {
        report.note("no GPU here: whether the core serves a job is decided on the GPU machine");
        return;
    };
    let mut usable = 0;
    for gpu in &machine.gpus {
        let (major, minor) = gpu.arch;
        if major < 8 {
            report.warn(format!(
                "GPU {}: sm_{major}{minor}: the core needs sm_80 or newer; its calls forward",
                gpu.ordinal
            ));
            continue;
        }
        let from = kernels::source_for(gpu.arch);
        if from == kernels::Source::BuiltIn {
            report.ok(format!(
                "GPU {}: sm_{major}{minor}: kernels built in",
                gpu.ordinal
            ));
        } else if from == kernels::Source::Ptx {
            report.ok(format!(
                "GPU {}: sm_{major}{minor}: kernels from the PTX built in (the driver compiles it at the first job, then caches it)",
                gpu.ordinal
            ));
        } else {
            match nccl::core::nvrtc_load() {
                Ok(()) => report.warn(format!(
                    "GPU {}: sm_{major}{minor} has no built-in kernels: NVRTC compiles them at the first job (about a minute, then cached)",
                    gpu.ordinal
                )),
                Err(e) => {
                    report.warn(format!(
                        "GPU {}: sm_{major}{minor} has no built-in kernels and NVRTC is not found ({e}): its calls forward",
                        gpu.ordinal
                    ));
                    continue;
                }
            }
        }
        usable += 1;
    }
    let all_pairs = machine
        .peers
        .iter()
        .flatten()
        .all(|cell| cell.is_none_or(|(access, _)| access));
    match (usable, all_pairs) {
        (0 | 1, _) => report.warn("fewer than 2 GPUs the core can use: every call forwards"),
        (n, true) => report.ok(format!("a job on these {n} GPUs gets the core")),
        (_, false) => {
            report.warn("some GPU pairs have no peer access: communicators spanning them forward")
        }
    }
}

/// Which calls the core takes, by size, for a job on this machine's GPUs (2 without a GPU).
fn check_routing(report: &mut Report, machine: Option<&Machine>) {
    let nranks = machine.map_or(2, |m| m.gpus.len().max(2));
    report.section(&format!(
        "Routing for {nranks} ranks (this environment's NCCLSHIM_* settings)"
    ));
    let settings = policy::settings();
    for problem in settings::problems(nccl::nccl_env::get) {
        report.warn(problem);
    }
    let size = |bytes: usize| match bytes {
        0 => "none".to_string(),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    };
    report.note(format!(
        "all-reduce: sentinel up to {} (floating point; in one block up to {}), low-latency up to {}, one-shot up to {}",
        size(settings.sentinel_max(nranks)),
        size(settings.sentinel_block(nranks)),
        size(settings.ll_max(nranks)),
        size(settings.one_shot_max(nranks))
    ));
    for (label, single_process) in [
        ("one process driving every GPU", true),
        ("one process per GPU", false),
    ] {
        let two_shot = match (single_process, settings.uses_direct(true)) {
            (true, true) => "direct",
            (false, true) if settings.zero_copy => "zero-copy direct",
            _ => "staged",
        };
        report.note(format!(
            "all-reduce, {label}: {two_shot} two-shot up to {}, NCCL above",
            size(settings.all_reduce_max(nranks, single_process))
        ));
    }
    // Each GPU's measured rows; a communicator over several takes the least of them.
    let measured = measured::least_measured(
        machine
            .map(|m| m.gpus.iter().map(|g| g.name.clone()).collect())
            .unwrap_or_else(|| vec![String::new()])
            .iter()
            .map(|gpu| measured::limits(gpu, nranks)),
    );
    for collective in Collective::ALL.into_iter().skip(1) {
        let source = match settings.max_bytes[collective as usize] {
            Some(_) => "NCCLSHIM_MAX_BYTES".to_string(),
            None if machine.is_some() => format!("measured on these GPUs for {nranks} ranks"),
            None => "no GPU to look up".to_string(),
        };
        let routed = |buffers| match settings.limit(collective, measured.of(buffers)) {
            _ if settings.force_core => {
                "the core at every size it can take (NCCLSHIM_CORE=force)".to_string()
            }
            _ if !settings.enabled => "NCCL (the core is off)".into(),
            limit if limit.is_none() => format!("NCCL ({source})"),
            limit => format!(
                "the core {}, NCCL at other sizes ({source})",
                limit.describe(size)
            ),
        };
        let (plain, windows) = (routed(Buffers::Plain), routed(Buffers::InWindows));
        match plain == windows {
            true => report.note(format!("{}: {plain}", collective.name())),
            false => report.note(format!(
                "{}: {plain}; buffers in symmetric windows (NCCL's symmetric kernels): {windows}",
                collective.name()
            )),
        }
    }
    report.note("every other operation: forwarded to NCCL");
}

/// A short all-reduce on every GPU through the real NCCL, then through the shim: results equal
/// (each checked against the sum), times side by side.
fn check_all_reduce(
    report: &mut Report,
    machine: Option<&Machine>,
    libraries: Option<(PathBuf, PathBuf)>,
) {
    let Some(machine) = machine else { return };
    let Some((shim, real)) = libraries else {
        return;
    };
    let gpus = machine.gpus.len();
    report.section(&format!(
        "An all-reduce on {gpus} GPU(s), one process, through NCCL and through the shim (median of 20)"
    ));
    match crate::allreduce::compare(&shim, &real, gpus) {
        Ok(rows) => {
            report.note(format!(
                "{:>10} {:>10} {:>10} {:>8}",
                "bytes", "NCCL us", "shim us", "shim/NCCL"
            ));
            for &(bytes, real_us, shim_us, _) in &rows {
                report.note(format!(
                    "{bytes:>10} {real_us:>10.1} {shim_us:>10.1} {:>8.2}",
                    shim_us / real_us
                ));
            }
            if rows.iter().all(|row| row.3) {
                report.ok("every result right through both");
            } else {
                report.fail(
                    "an all-reduce through the shim or NCCL gave a wrong result",
                    "run the GPU suite (README, \"The GPU suite\") and report it",
                );
            }
        }
        Err(e) => report.fail(
            format!("the all-reduce check did not run: {e}"),
            "run with NCCL_DEBUG=WARN to see why; `ncclshim doctor --no-run` skips it",
        ),
    }
}
