#!/usr/bin/env python3
"""Checks the shim's trace files (NCCLSHIM_TRACE) of one run: every line one JSON object, no
dropped records, each communicator's calls numbered 0, 1, 2, ... without a gap, and at least one
call routed to the core. Prints one line: files, calls, routed share, algorithms.
  trace_check.py TRACE_FILE...
Exits 1 on the first problem, naming it."""
import collections
import json
import sys


def main(paths):
    calls, routed = 0, 0
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
                if record["path"] == "routed":
                    routed += 1
                    algorithms[record["algo"]] += 1
                elif record["algo"] is not None:
                    return f"{path}:{number}: a forwarded call with an algorithm"
        for comm, numbers in seqs.items():
            if sorted(numbers) != list(range(len(numbers))):
                return f"{path}: comm {comm}'s calls are not numbered 0..{len(numbers) - 1}"
    if routed == 0:
        return f"no call routed to the core in {calls} calls"
    used = ", ".join(f"{name} {count}" for name, count in algorithms.most_common())
    print(f"{len(paths)} trace files, {calls} calls, {routed} routed ({used})")
    return None


if __name__ == "__main__":
    problem = main(sys.argv[1:]) if len(sys.argv) > 1 else "usage: trace_check.py TRACE_FILE..."
    if problem:
        print(problem)
        sys.exit(1)
