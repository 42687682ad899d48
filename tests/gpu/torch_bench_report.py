"""Runs of torch_bench.py with and without ncclshim, side by side: per collective and size, the
best time of each library over its runs (the runs alternate) and the ratio, shim / NCCL, eager
and in a graph. The best, not the median: how fast a process's host thread issues calls varies
from one launch to the next (seen with NCCL alone on 2 H100: eager 8 MiB all-gathers issued at
46 us a call in one run and 23 us in the next, the slower run host-bound), and a library's own
host cost shows in every one of its runs.
With --limit X it fails (exit 1) where a ratio is above X: every graph ratio, and the eager
ratios where NCCL's eager time is within 1.25 x its graph time (elsewhere Python's own time per
call, which varies from process to process by more than the limit, is what eager measures).

    python3 torch_bench_report.py [--limit X] --nccl A.json [A2.json ...] --shim B.json [B2.json ...]
"""
import argparse
import json


def times(files):
    """{(collective, bytes): ([eager_us], [graph_us])} over the files."""
    by_size = {}
    for name in files:
        with open(name) as f:
            for r in json.load(f)["results"]:
                key = (r.get("collective", "all_reduce"), r["bytes"])
                eager, graph = by_size.setdefault(key, ([], []))
                eager.append(r["eager_us"])
                graph.append(r["graph_us"])
    return by_size


def label(size):
    """A size as 16 B, 32 KiB or 4 MiB."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nccl", nargs="+", required=True)
    parser.add_argument("--shim", nargs="+", required=True)
    parser.add_argument("--limit", type=float)
    args = parser.parse_args()
    above = []
    nccl, shim = times(args.nccl), times(args.shim)
    print(f"{'collective':>14} {'size':>8} {'NCCL eager':>11} {'shim eager':>11} {'ratio':>6} "
          f"{'NCCL graph':>11} {'shim graph':>11} {'ratio':>6}")
    for key in sorted(nccl):
        if key not in shim:
            continue
        collective, size = key
        row = [collective.rjust(14), label(size).rjust(8)]
        for k in (0, 1):
            a, b = min(nccl[key][k]), min(shim[key][k])
            row += [f"{a:11.1f}", f"{b:11.1f}", f"{b / a:6.2f}"]
            gpu_bound = k == 1 or a <= 1.25 * min(nccl[key][1])
            if args.limit is not None and gpu_bound and b / a > args.limit:
                above.append(f"{collective} {label(size)} {('eager', 'graph')[k]} {b / a:.2f}")
        print(" ".join(row))
    if args.limit is not None:
        print(f"# {len(above)} above {args.limit} x NCCL{': ' + ', '.join(above) if above else ''}")
    return 1 if above else 0


if __name__ == "__main__":
    raise SystemExit(main())
