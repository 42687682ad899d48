"""Reads the JSON that bench.cu writes: checks it, plots it, or turns it into markdown tables.

    bench_report.py --check bench-2.json             one line; exit 1 on a wrong element, a
                                                     ratio (ours / NCCL) outside 1.00 +- 0.05, or
                                                     a mode whose median ratio is outside
                                                     1.00 +- 0.01
    bench_report.py --check-wrong bench-2.json       the same line; exit 1 on a wrong element only
                                                     (for runs where our own code may be faster)
    bench_report.py --plot OUTDIR bench-*.json       OUTDIR/<json name>.png (time and busbw
                                                     against size) and OUTDIR/bench-ratio.png
    bench_report.py --markdown bench-*.json          the per-size tables, to stdout
    bench_report.py --doc OUTDIR DOCS                from a run.sh OUTDIR, into DOCS/bench/: one
                                                     page per benchmark (<json name>.md: its
                                                     machine, run, verdict, plot and one table per
                                                     collective), summary.md (the run's summary,
                                                     verdicts, how it was measured), the JSON and
                                                     the plots. Files of the same name are
                                                     replaced, others kept (each page names its
                                                     run). DOCS/performance.md is written by hand
                                                     and never touched: bring its figures up to
                                                     date from these pages.
"""
import glob
import json
import os
import re
import shutil
import statistics
import sys

# Forwarding must not show: no size beyond the noise of timing NCCL against itself (A/A runs
# reached 1.034 at single sizes, and CUDA-graph replays, which never enter the shim, 1.04), and
# no overhead across sizes (a cost per call would move the median of every mode).
BAND = 0.05
MEDIAN_BAND = 0.01
COLLS = ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AlltoAll", "Gather",
         "Scatter", "SendRecv"]


def load(path):
    with open(path) as f:
        data = json.load(f)
    for r in data["results"]:
        # The median of per-round ratios (each pair timed back to back); older files lack it.
        r.setdefault("ratio", r["shim"]["time_us"] / r["nccl"]["time_us"])
        for lib in ("shim", "nccl"):
            alg = r["bytes"] / r[lib]["time_us"] / 1e3  # GB/s
            r[lib]["algbw"] = alg
            r[lib]["busbw"] = alg * r["busbw_factor"]
    return data


def check(path, band=True):
    ok, line = verdict(load(path), band)
    print(line)
    return 0 if ok else 1


def verdict(data, band=True):
    """(passed, one line): wrong elements, ratio ranges, sizes outside the band."""
    rs = data["results"]
    wrong = sum(r["shim"]["wrong"] + r["nccl"]["wrong"] for r in rs)
    parts = [f"#wrong {wrong}"]
    outside = []
    medians_off = []
    for mode in ("eager", "graph"):
        ratios = [r for r in rs if r["mode"] == mode]
        if not ratios:
            continue
        lo = min(ratios, key=lambda r: r["ratio"])
        hi = max(ratios, key=lambda r: r["ratio"])
        median = statistics.median(r["ratio"] for r in ratios)
        parts.append(f"{mode} ratio {lo['ratio']:.3f}..{hi['ratio']:.3f} (median {median:.3f})")
        outside += [r for r in ratios if abs(r["ratio"] - 1) > BAND]
        if abs(median - 1) > MEDIAN_BAND:
            medians_off.append(mode)
    parts.append(f"{len(outside)} of {len(rs)} sizes outside 1.00+-{BAND:.2f}")
    parts += [f"{r['coll']}/{r['mode']}/{r['bytes']}B={r['ratio']:.3f}" for r in outside[:6]]
    if medians_off:
        parts.append(f"median outside 1.00+-{MEDIAN_BAND:.2f}: {', '.join(medians_off)}")
    kind = "A/A (NCCL against itself)" if data.get("same") else "ours/NCCL"
    line = f"{data['ngpus']} GPUs, {kind}: " + ", ".join(parts)
    in_band = not outside and not medians_off
    return wrong == 0 and (not band or in_band) and bool(rs), line


def version(code):
    """NCCL's version code (22809) as written (2.28.9)."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def size_label(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


def plot(outdir, paths):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {("shim", "eager"): ("tab:blue", "-", "o", "ours, eager"),
              ("nccl", "eager"): ("tab:orange", "--", "x", "NCCL, eager"),
              ("shim", "graph"): ("tab:green", "-", "o", "ours, CUDA graph"),
              ("nccl", "graph"): ("tab:red", "--", "x", "NCCL, CUDA graph")}
    ratio_fig, ratio_axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for path in paths:
        data = load(path)
        n = data["ngpus"]
        stem = os.path.basename(path).removesuffix(".json")
        fig, axes = plt.subplots(3, 6, figsize=(26, 12))
        for k, coll in enumerate(COLLS):
            t_ax, b_ax = axes[k // 3][2 * (k % 3)], axes[k // 3][2 * (k % 3) + 1]
            for (lib, mode), (color, line, marker, label) in styles.items():
                rs = [r for r in data["results"] if r["coll"] == coll and r["mode"] == mode]
                if not rs:
                    continue
                x = [r["bytes"] for r in rs]
                kw = dict(color=color, linestyle=line, marker=marker, markersize=3, label=label,
                          fillstyle="none")
                t_ax.plot(x, [r[lib]["time_us"] for r in rs], **kw)
                b_ax.plot(x, [r[lib]["busbw"] for r in rs], **kw)
            for ax, what in ((t_ax, "time (us)"), (b_ax, "busbw (GB/s)")):
                ax.set_xscale("log", base=2)
                ax.set_title(f"{coll}: {what}", fontsize=9)
                ax.tick_params(labelsize=7)
                ax.grid(True, alpha=0.3)
            t_ax.set_yscale("log")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{stem}: ncclshim vs NCCL {version(data['nccl']['version'])}, "
                     f"{n} x {data['gpu']}, float; x: size in bytes")
        fig.tight_layout()
        fig.savefig(f"{outdir}/{stem}.png", dpi=80)
        plt.close(fig)
        for ax, mode in zip(ratio_axes, ("eager", "graph")):
            rs = [r for r in data["results"] if r["mode"] == mode]
            ax.plot([r["bytes"] for r in rs], [r["ratio"] for r in rs], ".", markersize=4,
                    label=stem)
    for ax, mode in zip(ratio_axes, ("eager", "CUDA graph")):
        ax.axhspan(1 - BAND, 1 + BAND, color="green", alpha=0.1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"time ours / NCCL, {mode}, every collective")
        ax.set_xlabel("size (bytes)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ratio_fig.tight_layout()
    ratio_fig.savefig(f"{outdir}/bench-ratio.png", dpi=80)
    print(f"wrote {len(paths)} plots and {outdir}/bench-ratio.png")


def tables(data):
    """One markdown table per collective: eager and graph side by side."""
    out = {}
    for coll in COLLS:
        rows = {}
        for r in data["results"]:
            if r["coll"] == coll:
                rows.setdefault(r["bytes"], {})[r["mode"]] = r
        if not rows:
            continue
        lines = ["| size | count | eager ours (us) | eager NCCL (us) | ratio | busbw ours (GB/s) "
                 "| busbw NCCL (GB/s) | graph ours (us) | graph NCCL (us) | ratio | #wrong |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for size in sorted(rows):
            e, g = rows[size].get("eager"), rows[size].get("graph")
            wrong = sum(x[lib]["wrong"] for x in (e, g) if x for lib in ("shim", "nccl"))
            cells = [size_label(size), str((e or g)["count"])]
            cells += [f"{e['shim']['time_us']:.2f}", f"{e['nccl']['time_us']:.2f}",
                      f"{e['ratio']:.3f}", f"{e['shim']['busbw']:.2f}",
                      f"{e['nccl']['busbw']:.2f}"] if e else [""] * 5
            cells += [f"{g['shim']['time_us']:.2f}", f"{g['nccl']['time_us']:.2f}",
                      f"{g['ratio']:.3f}"] if g else [""] * 3
            lines.append("| " + " | ".join(cells + [str(wrong)]) + " |")
        out[coll] = lines
    return out


def markdown(paths):
    for path in paths:
        data = load(path)
        for coll, lines in tables(data).items():
            print(f"\n#### {coll}, {data['ngpus']} GPUs\n")
            print("\n".join(lines))


CONFIGS = {
    "forward": "the shim forwards every call (`NCCLSHIM_CORE=0`): its cost over NCCL",
    "default": "the shim as built: its own all-reduce (the core) where its policy takes it, "
               "NCCL for everything else",
    "aa": "NCCL against itself (`--same`): two sets of communicators of one library, the "
          "comparison's noise floor",
}


def portable(text):
    """`text` without the paths of the machine it ran on: the libraries by where they sit in the
    bundle (`<bundle>/shim/lib/...`) or in a Python environment (`<env>/site-packages/...`)."""
    text = re.sub(r"/[^\s`\"']*/(shim(?:-[\d.]+)?/lib/)", r"<bundle>/\1", text)
    return re.sub(r"/[^\s`\"']*/site-packages/", "<env>/site-packages/", text)


def cuda_version(code):
    return f"{code // 1000}.{code % 1000 // 10}"


GENERATED = ("<!-- Generated by tests/gpu/bench_report.py --doc OUTDIR docs from the GPU suite's "
             "output; do not edit. -->")


def stem_of(path):
    return os.path.basename(path).removesuffix(".json")


def run_of(summary, ngpus, config):
    """The header lines (suite, date, bundle; GPUs and driver) of the block of `summary` that
    ran `bench N GPUs config`; empty where none did."""
    for block in re.split(r"\n\s*\n", summary):
        lines = block.strip().splitlines()
        if lines and any(re.match(rf"bench {ngpus} GPUs {re.escape(config)}\b", line)
                         for line in lines):
            return [line.strip() for line in lines[:2]]
    return []


def machine(data):
    """The machine and versions of one benchmark, in words."""
    return (f"{data['ngpus']} {data['gpu']}, CUDA driver {cuda_version(data['cuda_driver'])}, "
            f"runtime {cuda_version(data['cuda_runtime'])}; real NCCL "
            f"{version(data['nccl']['version'])} (`{portable(data['nccl']['path'])}`); the shim "
            f"`{portable(data['shim']['path'])}` (ABI of NCCL {version(data['shim']['version'])})")


def bench_page(path, summary):
    """The markdown page of one benchmark's JSON: what it ran on, its verdict, plot and tables."""
    data = load(path)
    stem = stem_of(path)
    config = stem.split("-")[1]
    note = " (\"ours\" and \"NCCL\" below are its two sets)" if config == "aa" else ""
    run = run_of(summary, data["ngpus"], config)
    what = CONFIGS.get(config, f"configuration `{config}`") + note + "."
    out = [GENERATED, "", f"# {stem}: {data['ngpus']} GPUs, {config}", "",
           what[0].upper() + what[1:], "",
           f"- Machine: {machine(data)}."]
    if run:
        out.append(f"- Run: `{run[0]}` (GPUs of the machine: `{run[1]}`)." if len(run) > 1
                   else f"- Run: `{run[0]}`.")
    out += [f"- {data['type']}, sum, root 0; time: the median of {data['rounds']} rounds; ratio: "
            "the median over rounds of ours / NCCL, timed back to back ([how it was "
            "measured](summary.md#how-it-was-measured)).",
            f"- Verdict: {verdict(data)[1]}.", "",
            f"![{stem}]({stem}.png)", ""]
    for coll, lines in tables(data).items():
        out += [f"<details{' open' if coll == 'AllReduce' else ''}><summary>{coll}, "
                f"{data['ngpus']} GPUs, {config}</summary>", "", *lines, "", "</details>", ""]
    return "\n".join(out)


def summary_page(paths, summary):
    """The run's page: its summary (correctness suite included), each benchmark's verdict and
    page, the ratio plot, how it was measured, the command."""
    first = load(paths[0])
    out = [GENERATED, "", "# The side-by-side benchmark: one run of the GPU suite", "",
           "The pages of this run's benchmarks, with their tables per collective and size:", ""]
    out += [f"- [{stem_of(p)}]({stem_of(p)}.md): {verdict(load(p))[1]}" for p in paths]
    out += [
        "",
        "## Ratio of times, every collective and size",
        "",
        f"Green band: 1.00 ± {BAND:.2f}.",
        "",
        "![ratio](bench-ratio.png)",
        "",
        "## How it was measured",
        "",
        "`tests/gpu/bench.cu`: one process, one thread driving every GPU (as nccl-tests `-g N`). "
        "It `dlopen()`s the shim and the real `libnccl.so.2` by absolute path and calls each "
        "through its own function table, with communicators made through each "
        "(`ncclCommInitAll`); the shim forwards to that same real library "
        "(`NCCLSHIM_REAL_NCCL`). At every size the two are timed in alternating rounds (the "
        "order flips every round): a round is enough back-to-back calls (each one group over the "
        "GPUs) to last about 1.5 ms, eager, or one replay of a CUDA graph holding as many calls. "
        f"Time: the median of {first['rounds']} rounds; ratio: the median over rounds of ours / "
        "NCCL for the two timed back to back. float, sum, root 0; sizes 8 B to 256 MiB by "
        "factors of 2 (per rank `count` as nccl-tests: AllGather, ReduceScatter, AlltoAll, "
        "Gather, Scatter take size / nranks); algbw = size / time, busbw with nccl-tests' "
        "factors (AllReduce 2(n-1)/n; AllGather, ReduceScatter, AlltoAll, Gather, Scatter "
        "(n-1)/n; others 1). Before timing, each library runs each size once on fresh inputs and "
        "poisoned outputs, and `#wrong` counts the output elements that differ from the "
        "expected values (checked on the GPU).",
        "",
        "Configurations:",
        "",
        *[f"- `{name}`: {what}." for name, what in CONFIGS.items()],
        "",
        "## The command",
        "",
        "```",
        "make gpu-bundle                          # here: the shim for NCCL 2.28.9, sources, scripts",
        "# on the GPU machine (the bundle copied there):",
        ".bundle/run.sh OUT                       # GPU_COUNTS=\"2 4\" by default; BENCH_AA=1 adds A/A",
        "# back here, with OUT copied back:",
        "python3 tests/gpu/bench_report.py --doc OUT docs",
        "```",
        "",
        "## Summary of the run (correctness suite included)",
        "",
        "```",
        summary,
        "```",
        "",
    ]
    return "\n".join(out)


def doc(outdir, docs):
    def order(path):  # forward, default, aa; fewer GPUs first
        stem = stem_of(path).split("-")
        return (list(CONFIGS).index(stem[1]) if stem[1] in CONFIGS else 9, int(stem[-1]))

    paths = sorted(glob.glob(os.path.join(outdir, "bench-*.json")), key=order)
    if not paths:
        sys.exit(f"no bench-*.json in {outdir}")
    bench = os.path.join(docs, "bench")
    os.makedirs(bench, exist_ok=True)
    before = set(os.listdir(bench))
    with open(os.path.join(outdir, "summary.txt")) as f:
        summary = portable(f.read().rstrip())
    written = []

    def write(name, text):
        with open(os.path.join(bench, name), "w") as f:
            f.write(text)
        written.append(name)

    for path in paths:
        with open(path) as src:
            write(os.path.basename(path), portable(src.read()))
        write(f"{stem_of(path)}.md", bench_page(path, summary))
    for f in sorted(glob.glob(os.path.join(outdir, "bench-*.png"))):
        shutil.copy(f, os.path.join(bench, os.path.basename(f)))
        written.append(os.path.basename(f))
    write("summary.md", summary_page(paths, summary))
    print(f"wrote {len(written)} files in {bench}/: {', '.join(written)}")
    kept = sorted(before - set(written))
    if kept:
        print(f"kept from earlier runs: {', '.join(kept)}")
    print(f"{docs}/performance.md is written by hand: bring its figures up to date from these")


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(sys.argv) >= 3 and sys.argv[1] in ("--check", "--check-wrong"):
        sys.exit(max(check(p, band=sys.argv[1] == "--check") for p in sys.argv[2:]))
    if len(sys.argv) >= 4 and sys.argv[1] == "--plot":
        plot(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--markdown":
        markdown(sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--doc":
        doc(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
