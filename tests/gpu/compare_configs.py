#!/usr/bin/env python3
"""One table from several benchmark runs of the same collective under different settings:
per size, each run's time (us) and ratio to NCCL, eager and graph. For choosing settings:
  compare_configs.py COLL NAME:FILE.json ...
"""
import json
import sys


def main():
    coll, runs = sys.argv[1], [a.split(":", 1) for a in sys.argv[2:]]
    data = {name: json.load(open(path))["results"] for name, path in runs}
    for mode in ("eager", "graph"):
        print(f"# {coll} {mode}: time us (ratio to NCCL)")
        print(f"{'bytes':>10} " + " ".join(f"{name:>18}" for name, _ in runs))
        sizes = sorted({r["bytes"] for rs in data.values() for r in rs if r["coll"] == coll})
        for size in sizes:
            cells = []
            for name, _ in runs:
                row = [r for r in data[name] if r["coll"] == coll and r["mode"] == mode and r["bytes"] == size]
                cells.append(f"{row[0]['shim']['time_us']:9.2f} ({row[0]['ratio']:.3f})" if row else " " * 18)
            print(f"{size:>10} " + " ".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
