#!/usr/bin/env python3
"""Checks the shim's trace files (NCCLSHIM_TRACE) of one run: every line one JSON object, no
dropped records, each communicator's calls numbered 0, 1, 2, ... without a gap, and at least one
call routed to the core. With --timed (NCCLSHIM_TRACE_TIMING=1), routed calls must carry a GPU
time and bandwidths, and forwarded ones none. Prints one line: files, calls, routed share,
algorithms (and the timed calls' median time).
  trace_check.py [--timed] TRACE_FILE...
Exits 1 on the first problem, naming it."""
import collections
import json
import sys


def main(paths, timed_run=False):
    calls, routed = 0, 0
    times = []
    algorithms = collections.Counter()
    for path in paths:
        seqs = collections.defaultdict(list)
        with open(path) as f:
            for number, line in enumerate(f, 1):
                record = json.loads(line)
                if "dropped" in record:
                    return f"{path}: {record['dropped']} records dropped"
                seqs[record["id"]].append(record["coll_sn"])
                calls += 1
                exec_us = record.get("coll_exec_time_us")
                if record["path"] == "routed":
                    routed += 1
                    algorithms[record["algo"]] += 1
                    if exec_us is not None:
                        if exec_us <= 0 or record["coll_busbw_gbs"] is None:
                            return f"{path}:{number}: a time of {exec_us} us without a bandwidth"
                        times.append(exec_us)
                elif record["algo"] is not None:
                    return f"{path}:{number}: a forwarded call with an algorithm"
                elif exec_us is not None:
                    return f"{path}:{number}: a forwarded call with a GPU time"
        for comm, numbers in seqs.items():
            if sorted(numbers) != list(range(len(numbers))):
                return f"{path}: comm {comm}'s calls are not numbered 0..{len(numbers) - 1}"
    if routed == 0:
        return f"no call routed to the core in {calls} calls"
    if timed_run and not times:
        return f"NCCLSHIM_TRACE_TIMING: none of {routed} routed calls has a GPU time"
    if not timed_run and times:
        return f"{len(times)} calls have a GPU time without NCCLSHIM_TRACE_TIMING"
    used = ", ".join(f"{name} {count}" for name, count in algorithms.most_common())
    timing = f"; {len(times)} timed, median {sorted(times)[len(times) // 2]:.1f} us" if times else ""
    print(f"{len(paths)} trace files, {calls} calls, {routed} routed ({used}){timing}")
    return None


if __name__ == "__main__":
    args = sys.argv[1:]
    timed = "--timed" in args
    files = [a for a in args if a != "--timed"]
    problem = main(files, timed) if files else "usage: trace_check.py [--timed] TRACE_FILE..."
    if problem:
        print(problem)
        sys.exit(1)
