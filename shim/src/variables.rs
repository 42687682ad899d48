//! Every variable the shim and its command read at run time, with its default and what it does:
//! the one place they are said. The README's tables are written from these (`make readme`), and
//! a test holds them equal; another holds every variable the code reads to a row here.

/// One row of a table: a variable (or one of `NCCLSHIM_TUNE`'s keys), its default as users read
/// it (empty where there is none), and what it does.
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn row(name: &'static str, default: &'static str, meaning: &'static str) -> Variable {
    Variable {
        name,
        default,
        meaning,
    }
}

/// What users set that each process may have its own value of.
pub const GENERAL: &[Variable] = &[
    row(
        "NCCLSHIM_REAL_NCCL",
        "",
        "absolute path of the real `libnccl.so.2` to forward to, or of its folder",
    ),
    row(
        "NCCL_DEBUG",
        "",
        "NCCL's own, with `NCCL_DEBUG_FILE`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_TIMESTAMP_LEVELS`, `NCCL_DEBUG_TIMESTAMP_FORMAT` and `NCCL_WARN_ENABLE_DEBUG_INFO` (INFO after a warning of the shim's), read as the real NCCL's version reads them: the shim's lines follow them (`WARN`: warnings; `INFO`: also the start-up line, each communicator's \"core on/off\" line and the exit summary; with `COLL` in `NCCL_DEBUG_SUBSYS`, NCCL's line for each collective call the core takes or answers, tagged `[ncclshim]` where NCCL's lines name the GPU, its `opCount` counting the calls the core took on the communicator: 0 where it has no core)",
    ),
    row(
        "NCCLSHIM_SUMMARY",
        "",
        "`1`: the exit summary, whatever `NCCL_DEBUG` says",
    ),
    row(
        "NCCLSHIM_TRACE",
        "",
        "file to write one JSON line per call to (`%h` host, `%p` process id)",
    ),
    row(
        "NCCLSHIM_TRACE_TIMING",
        "",
        "`1` (with `NCCLSHIM_TRACE`): also the GPU time and bandwidth of each routed call outside a CUDA graph (a debugging mode: it waits for each kernel)",
    ),
    row(
        "NCCLSHIM_DUMP_ON_SIGNAL",
        "",
        "`1`: `SIGUSR1` writes every communicator's last 64 calls to the log",
    ),
    row(
        "NCCLSHIM_CACHE",
        "",
        "where kernels compiled at run time are kept (GPUs whose kernels are not built in; default `~/.cache/ncclshim`)",
    ),
    row(
        "NCCLSHIM_NVRTC",
        "",
        "absolute path of `libnvrtc.so` if the loader cannot find it (GPUs whose kernels are not built in)",
    ),
    row(
        "NCCLSHIM_LIB",
        "",
        "the shim library `ncclshim doctor` and `ncclshim run` use (default: beside the command, or in its Python environment)",
    ),
];

/// The core's settings: every rank of a communicator must have the same (`Settings::agreed`).
pub const CORE: &[Variable] = &[
    row(
        "NCCLSHIM_CORE",
        "`1`",
        "`0`: no core (everything forwards; the ranks still compare settings when a communicator is set up: two small exchanges, in shared memory or through NCCL). `force`: every call the core can take: every collective at any size",
    ),
    row(
        "NCCLSHIM_MAX_BYTES",
        "by ranks, measured",
        "the largest call of each collective the core takes, as `COLLECTIVE:SIZE` entries separated by commas (`all_gather:128K,reduce:0`), in bytes as nccl-tests counts them (all ranks' chunks together; a broadcast's, reduce's or all-reduce's one buffer). `all_reduce`: two-shot above the one-shot limit, by default 256 MiB on 2 GPUs, 32 MiB for one process on 3–4, 16 MiB otherwise. `all_gather`, `reduce_scatter`, `broadcast`, `reduce`, `all_to_all`, `gather`, `scatter`: by default the sizes measured faster than NCCL for the ranks' GPUs and number of ranks (the small calls up to a size, and spans of larger ones where the core wins again; those every rank's GPU has; none where not measured; for a call whose buffers lie in windows registered with `NCCL_WIN_COLL_SYMMETRIC`, the sizes faster than NCCL's symmetric kernels too; `ncclshim doctor` shows them); a setting takes every call up to its size and no span above, whatever the buffers (at any size: where the peers cannot reach the buffers, the core goes through its staging, a rank's chunk past 8 MiB in windows); `0`: none, NCCL takes them. A collective not named keeps its default",
    ),
    row(
        "NCCLSHIM_TIMEOUT",
        "`1800`",
        "seconds a core kernel waits for a peer before it gives up and the shim reports it (`0`: for ever)",
    ),
    row(
        "NCCLSHIM_TUNE",
        "",
        "switches for finding a fault or tuning the core, as `KEY:VALUE` entries separated by commas (`direct:0,ll_max:64K`); the keys are below. A key not named keeps its default",
    ),
];

/// `NCCLSHIM_TUNE`'s keys: what each changes of the core, for debugging and tuning.
pub const TUNE: &[Variable] = &[
    row(
        "sentinel_max",
        "by ranks",
        "largest floating-point all-reduce done by the sentinel kernel (512 KiB for 2–4 ranks, none above; at most 512 KiB; `0`: none, for the low-latency kernel's exact bits where a NaN's sign matters); where set, also the most a group's fused launch of them carries (by default 2 MiB on 2 ranks)",
    ),
    row(
        "sentinel_block",
        "by ranks",
        "largest sentinel all-reduce (or fused group of them) run in one block of one thread per 16 bytes (8 KiB for 2 ranks, 2 KiB for 4, none for others; at most 8 KiB, 512 threads); larger ones run in blocks of 64 threads",
    ),
    row(
        "ll_max",
        "by ranks",
        "largest all-reduce done by the low-latency kernel, past the sentinel kernel's (128 KiB for 2 ranks, 32 KiB above; at most 256 KiB), and largest chunk (what one rank sends another) of the other collectives sent as packets (1 MiB for 2 ranks, 256 KiB for 3–4, 32 KiB above; at most what the inboxes hold: 1 MiB for 2 ranks, 512 KiB for 3–4, 256 KiB above)",
    ),
    row(
        "ll_block",
        "by ranks",
        "largest chunk (what one rank sends another) of the other collectives' packet calls run in one block of one thread per 8 bytes (4 KiB for 2 ranks, none for others; at most 4 KiB, 512 threads); larger ones run in blocks of 128 threads",
    ),
    row(
        "sentinel_move_from",
        "`32K`",
        "on 2 ranks, a lone call of all-gather, broadcast, all-to-all, gather or scatter whose chunk (what one rank sends another) is larger than this and at most 2 MiB sends it as sentinel stores (every byte on NVLink data) rather than as packets or through the buffers; `0`: from the smallest, `2M`: never",
    ),
    row(
        "one_shot_max",
        "by ranks",
        "largest all-reduce done one-shot (2 MiB for 2 ranks, 512 KiB for 3–4, 256 KiB above; at most 4 MiB)",
    ),
    row(
        "two_shot_blocks",
        "by ranks and size",
        "most blocks of a two-shot grid and of the other collectives' larger kernels (128; 64 on 3–4 ranks and for calls of 8 MiB or more, which leave SMs to the compute they run beside; 1 to 256, never more than every GPU holds at once)",
    ),
    row(
        "max_blocks",
        "",
        "most blocks of any core kernel's grid (1 to 256; by default each kernel's own: up to 256 blocks of 128 threads for packets, 128 of 512 for two-shot, 64 from 8 MiB), to leave SMs to kernels that run beside the core's, as NCCL's `maxCTAs` does for its own; fewer blocks make larger calls slower",
    ),
    row(
        "direct",
        "`1`",
        "`0`: no direct two-shot all-reduce (staged only, with the staged limits)",
    ),
    row(
        "zero_copy",
        "`1`",
        "`0`: ranks in separate processes do not map each other's buffers (staged kernels only)",
    ),
    row(
        "group_core",
        "`384K-2M`",
        "`LO-HI`: a group (`ncclGroupStart`/`ncclGroupEnd`) with several calls on one communicator that the core would take stays the core's where its calls are small calls of one packet kernel (all-reduces of one type and op; all-gathers, or broadcasts, or another collective that moves data, of any type; reduce-scatters, or reduces, of one type and op) that fit at most two fused launches (four for floating-point all-reduces on 2 ranks; each of up to eight calls whose data together is no more than one packet call's, or for floating-point all-reduces on 2 ranks four calls': for all-reduce 2 MiB of floating-point data on 2 ranks (calls of up to 512 KiB), 512 KiB on 3–4, 128 KiB of other types on 2, 32 KiB on more; for the others chunks of 1 MiB on 2 ranks, 256 KiB on 3–4, 32 KiB on more), or where they are at most four all-reduces and each is larger than `LO` and at most `HI` bytes (where they are two on 2 ranks, at most 128 MiB, or `HI` if larger), or on 2 ranks two all-gathers, reduce-scatters or all-to-alls, or up to four all-to-alls, each of chunks up to 4 MiB; otherwise all of them go to NCCL, which runs a group's calls in one kernel (all-reduces measured on 2 H100, the others on 2 H200; `0-0`: no such band, for two calls either)",
    ),
    row(
        "batch",
        "`1`",
        "`0`: each core call of a group is launched as a kernel of its own, and small calls are not fused, so that groups of them go to NCCL (by default, a group's small calls of one communicator and packet kernel run as one call per launch, up to eight calls a launch, and up to four consecutive calls of one communicator, stream and kernel of other kinds share one launch)",
    ),
    row(
        "launch_helpers",
        "`1`",
        "`0`: a group's all-reduces on several GPUs are launched in turn by the calling thread (no helper threads)",
    ),
    row(
        "early_launch",
        "`1`",
        "`0`: core kernels are launched without programmatic stream serialization",
    ),
    row(
        "graph_launch_max",
        "`128K`",
        "a launch of two or more of a group's small calls run as one, of at most this many bytes together, goes through a graph of the communicator's, which takes the host about 1.2 µs less than a kernel launch and the GPU about 0.8 µs more (its kernel starts once the work before it is done, not while it ends); a communicator keeps up to 32 (each about 112 KiB of the GPU's memory on H200), each with the calls it last ran, so that a group that runs again on the same buffers launches its graph as it is (0.3 – 0.7 µs less again on H200); groups launched fewer than 8 times (as a program moving its buffers at each group launches them) share one graph, made at set-up, and from its 8th launch a group takes one of its own; a lone call's launch never does; `0`: none",
    ),
];

/// `rows` as a Markdown table under `header` (its columns: the name, then the default where
/// `with_default`, then the meaning).
pub fn markdown_table(header: &str, rows: &[Variable], with_default: bool) -> String {
    let mut table = String::from(header);
    table.push('\n');
    table.push_str(if with_default {
        "|---|---|---|\n"
    } else {
        "|---|---|\n"
    });
    for row in rows {
        let default = match (with_default, row.default) {
            (false, _) => String::new(),
            (true, "") => " |".to_string(),
            (true, default) => format!(" {default} |"),
        };
        table.push_str(&format!("| `{}` |{default} {} |\n", row.name, row.meaning));
    }
    table
}

/// The README's generated tables: the name of each (as its markers say) and its text.
pub fn readme_tables() -> [(&'static str, String); 3] {
    [
        (
            "general",
            markdown_table("| variable | meaning |", GENERAL, false),
        ),
        (
            "core",
            markdown_table(
                "| variable (same value on every rank) | default | meaning |",
                CORE,
                true,
            ),
        ),
        (
            "tune",
            markdown_table(
                "| `NCCLSHIM_TUNE` key (same value on every rank) | default | meaning |",
                TUNE,
                true,
            ),
        ),
    ]
}

/// `readme` with each generated table put in its place, between `<!-- table NAME: ... -->` and
/// `<!-- end of table NAME -->`; `None` where a table's markers are missing.
pub fn with_tables(readme: &str) -> Option<String> {
    let mut text = readme.to_string();
    for (name, table) in readme_tables() {
        let begin = format!("<!-- table {name}:");
        let start = text.find(&begin)?;
        let start = start + text[start..].find("-->\n")? + 4;
        let end = start + text[start..].find(&format!("<!-- end of table {name} -->"))?;
        text.replace_range(start..end, &table);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn repository() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
    }

    /// The README's tables are these; `UPDATE_README=1` (`make readme`) writes them there.
    #[test]
    fn the_readme_tables_are_generated_from_here() {
        let path = repository().join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let generated = with_tables(&readme).expect("the README has every table's markers");
        if std::env::var_os("UPDATE_README").is_some() {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        assert!(
            readme == generated,
            "the README's tables differ from shim/src/variables.rs: run `make readme`"
        );
    }

    /// Every `NCCLSHIM_*` variable the library or the command names has its row, but those the
    /// build script reads (the build's, said with `make build`) and those of earlier releases.
    #[test]
    fn every_variable_read_has_a_row() {
        let mut named = Vec::new();
        for dir in ["shim/src", "cli/src"] {
            sources(&repository().join(dir), &mut named);
        }
        let mut build = Vec::new();
        sources(&repository().join("shim/build"), &mut build);
        let build_script = std::fs::read_to_string(repository().join("shim/build.rs")).unwrap();
        let rows: Vec<&str> = GENERAL.iter().chain(CORE).map(|v| v.name).collect();
        for name in named {
            let build_time = build.contains(&name) || build_script.contains(&name);
            let replaced = crate::core::settings::replaced(&name, "VALUE").is_some();
            // `NCCLSHIM_` alone: the prefix, as code that builds a name writes it.
            if build_time || replaced || name == "NCCLSHIM_" {
                continue;
            }
            assert!(rows.contains(&name.as_str()), "{name} has no row");
        }
    }

    fn sources(dir: &Path, names: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, names);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("NCCLSHIM_") {
                    let name: String = text[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    names.push(name);
                }
            }
        }
    }
}
