"""Reads the JSON that bench.cu writes: checks it, plots it, or turns it into markdown tables.

    bench_report.py --check bench-2.json             one line; exit 1 on a wrong element or a
                                                     ratio (ours / NCCL) outside 1.00 +- 0.03
    bench_report.py --check-wrong bench-2.json       the same line; exit 1 on a wrong element only
                                                     (for runs where our own code may be faster)
    bench_report.py --plot OUTDIR bench-*.json       OUTDIR/<json name>.png (time and busbw
                                                     against size) and OUTDIR/bench-ratio.png
    bench_report.py --markdown bench-*.json          tables for docs/performance.md
"""
import json
import os
import sys

BAND = 0.03
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
    data = load(path)
    rs = data["results"]
    wrong = sum(r["shim"]["wrong"] + r["nccl"]["wrong"] for r in rs)
    parts = [f"#wrong {wrong}"]
    outside = []
    for mode in ("eager", "graph"):
        ratios = [r for r in rs if r["mode"] == mode]
        if not ratios:
            continue
        lo = min(ratios, key=lambda r: r["ratio"])
        hi = max(ratios, key=lambda r: r["ratio"])
        parts.append(f"{mode} ratio {lo['ratio']:.3f}..{hi['ratio']:.3f}")
        outside += [r for r in ratios if abs(r["ratio"] - 1) > BAND]
    parts.append(f"{len(outside)} of {len(rs)} sizes outside 1.00+-{BAND:.2f}")
    parts += [f"{r['coll']}/{r['mode']}/{r['bytes']}B={r['ratio']:.3f}" for r in outside[:6]]
    kind = "A/A (NCCL against itself)" if data.get("same") else "ours/NCCL"
    print(f"{data['ngpus']} GPUs, {kind}: " + ", ".join(parts))
    return 0 if wrong == 0 and (not band or not outside) and rs else 1


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


def markdown(paths):
    for path in paths:
        data = load(path)
        print(f"\n### {data['ngpus']} GPUs\n")
        for coll in COLLS:
            rows = {}
            for r in data["results"]:
                if r["coll"] == coll:
                    rows.setdefault(r["bytes"], {})[r["mode"]] = r
            if not rows:
                continue
            print(f"\n#### {coll}, {data['ngpus']} GPUs\n")
            print("| size | count | eager ours (us) | eager NCCL (us) | ratio | busbw ours (GB/s) "
                  "| busbw NCCL (GB/s) | graph ours (us) | graph NCCL (us) | ratio | #wrong |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for size in sorted(rows):
                e, g = rows[size].get("eager"), rows[size].get("graph")
                any_r = e or g
                wrong = sum(x[l]["wrong"] for x in (e, g) if x for l in ("shim", "nccl"))
                cells = [size_label(size), str(any_r["count"])]
                if e:
                    cells += [f"{e['shim']['time_us']:.2f}", f"{e['nccl']['time_us']:.2f}",
                              f"{e['ratio']:.3f}", f"{e['shim']['busbw']:.2f}",
                              f"{e['nccl']['busbw']:.2f}"]
                else:
                    cells += [""] * 5
                if g:
                    cells += [f"{g['shim']['time_us']:.2f}", f"{g['nccl']['time_us']:.2f}",
                              f"{g['ratio']:.3f}"]
                else:
                    cells += [""] * 3
                print("| " + " | ".join(cells + [str(wrong)]) + " |")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] in ("--check", "--check-wrong"):
        sys.exit(max(check(p, band=sys.argv[1] == "--check") for p in sys.argv[2:]))
    if len(sys.argv) >= 4 and sys.argv[1] == "--plot":
        plot(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--markdown":
        markdown(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
