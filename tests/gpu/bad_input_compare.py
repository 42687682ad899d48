#!/usr/bin/env python3
"""Sets the shim's answers to bad input beside the real NCCL's (tests/gpu/bad_input.cu).

    bad_input_compare.py NCCL_LOG SHIM_LOG

Reads the two runs' output (bad_input's `begin` and `case` lines, with the WARN lines NCCL and the
shim logged between them), prints a markdown table, one row per case, and exits 1 if any case
fails:
  - its result differs (the first call's, every call's, the group end's, or the value: strings,
    handles, whether an output holds the right sums);
  - it crashed or hung under the shim only (where NCCL's own stream did not fail: past a fault,
    a hang and a crash are alike);
  - the shim wrote outside the outputs (guard bytes) where NCCL did not;
  - the shim's streams failed, or its communicators stopped summing right afterwards, where NCCL's
    did not;
  - NCCL logged a WARN in the case and the shim's run logged none (neither its own, "[ncclshim]",
    nor the real NCCL's, where the shim forwarded the call).
The other way round (NCCL crashed, its stream failed, its communicator broke or its sums were
wrong, and the shim's did not) is noted, not failed; so is a group end that saw a fault of the
group's own kernels in one run only (timing), with NCCL's WARN of it. Exit status 2: a log without cases.
"""
import re
import sys


def parse(path):
    """Case id -> {name, status: done|crashed|hung, stage, fields, warns: [(line, ours)]}."""
    cases = {}
    current = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"begin (\d+) (\S+)$", line)
            if m:
                current = cases.setdefault(int(m.group(1)), new_case(m.group(2)))
                continue
            m = re.match(r"case (\d+) (\S+) (.*)$", line)
            if m:
                case = cases.setdefault(int(m.group(1)), new_case(m.group(2)))
                read_case_line(case, m.group(3).split())
                continue
            # WARN lines belong to the case begun last (a late one, from a thread of NCCL's, to
            # the case it most likely came from).
            if current is not None and re.search(r"\bNCCL WARN\b", line):
                current["warns"].append((line, "[ncclshim]" in line))
    return cases


def new_case(name):
    return {"name": name, "status": None, "stage": None, "fields": {}, "warns": []}


def read_case_line(case, words):
    if words and words[0] in ("crashed", "hung"):
        case["status"] = words[0]
        return
    case["status"] = "done"
    fields = case["fields"]
    i = 0
    while i < len(words):
        key = words[i]
        if key == "result":
            # "result <n> <name>", or "result - none" where the case made no call
            fields["result"] = words[i + 2] if i + 2 < len(words) else "?"
            i += 3
            continue
        value = words[i + 1] if i + 1 < len(words) else ""
        if key == "hung":
            case["status"], case["stage"] = "hung", value
        else:
            fields[key] = value
        i += 2


COMPARED = ("result", "calls", "end", "value")


def short(name):
    return name[4:] if name.startswith("nccl") else name


def cell(case):
    """What a run gave, in a few words."""
    if case is None:
        return "missing"
    if case["status"] in ("crashed", "hung") and not case["fields"]:
        return case["status"]
    f = case["fields"]
    parts = [short(f.get("result", "?"))]
    if "calls" in f:
        parts.append("calls " + f["calls"])
    if "end" in f:
        parts.append("end " + f["end"])
    if "value" in f:
        v = f["value"]
        parts.append("value " + (v if len(v) <= 48 else v[:45] + "..."))
    if f.get("sync", "ok") != "ok":
        parts.append("sync " + f["sync"])
    if f.get("after", "ok") not in ("ok", "-"):
        parts.append("after " + f["after"])
    if case["status"] == "hung":
        parts.append("**hung** (%s)" % case["stage"])
    return "; ".join(parts).replace("|", "/")


def warn_cell(case):
    if case is None:
        return "?"
    ours = any(o for _, o in case["warns"])
    theirs = any(not o for _, o in case["warns"])
    return {(False, False): "no", (True, False): "shim's", (False, True): "NCCL's",
            (True, True): "shim's, NCCL's"}[(ours, theirs)]


def judge(nccl, shim):
    """(failures, notes) for one case."""
    fails, notes = [], []
    if nccl is None or shim is None:
        return ["missing in the %s run" % ("NCCL" if nccl is None else "shim")], notes
    n_broke = nccl["status"] in ("crashed", "hung")
    s_broke = shim["status"] in ("crashed", "hung")
    # Where NCCL's own run broke the GPU (a fault), what follows is undefined: a fault in one run
    # may be a hang in the next (seen: allreduce-count-overflow under NCCL alone).
    n_faulted = nccl["fields"].get("sync", "ok") != "ok"
    if s_broke and not n_broke:
        if n_faulted:
            notes.append("the shim %s where NCCL's stream failed" % shim["status"])
        else:
            fails.append("%s under the shim only" % shim["status"])
    elif n_broke and not s_broke:
        notes.append("NCCL %s, the shim did not" % nccl["status"])
    nf, sf = nccl["fields"], shim["fields"]
    end_saw_fault = False
    if nf and sf:
        # Where a run hung (or crashed) part of the way, only what both got to is compared.
        keys = [k for k in COMPARED if k in nf and k in sf] if n_broke or s_broke else COMPARED
        # Where both runs' kernels faulted alike, a group end that saw the fault (1,
        # ncclUnhandledCudaError: a launch after a kernel of the group had faulted) in one run
        # and not in the other is timing: NCCL alone returns either, run to run.
        end_saw_fault = (n_faulted and nf.get("sync") == sf.get("sync")
                         and {nf.get("end"), sf.get("end")} == {"0", "1"})
        if end_saw_fault:
            keys = [k for k in keys if k != "end"]
            notes.append("the group's end saw the fault in one run only (timing)")
        differ = [k for k in keys if nf.get(k) != sf.get(k)]
        # Right sums where NCCL's were wrong (its kernels race where each rank's output lies on
        # the other GPU, and NCCL alone gives either, run to run).
        if "value" in differ and (nf.get("value"), sf.get("value")) == ("sums-wrong", "sums-right"):
            differ.remove("value")
            notes.append("NCCL's sums were wrong, the shim's right")
        if differ:
            fails.append("differs in " + ", ".join(differ))
        n_guard, s_guard = nf.get("guard", "-"), sf.get("guard", "-")
        if s_guard.startswith("bad"):
            if n_guard.startswith("bad"):
                notes.append("both wrote outside the outputs")
            else:
                fails.append("the shim wrote outside the outputs (%s)" % s_guard)
        n_sync, s_sync = nf.get("sync"), sf.get("sync")
        if n_sync == "ok" and s_sync not in (None, "ok"):
            fails.append("stream failed under the shim only (%s)" % s_sync)
        elif s_sync == "ok" and n_sync not in (None, "ok"):
            notes.append("NCCL's stream failed (%s), the shim's did not" % n_sync)
        n_after, s_after = nf.get("after"), sf.get("after")
        if n_after == "ok" and s_after not in (None, "ok"):
            fails.append("communicator broken under the shim only (after: %s)" % s_after)
        elif s_after == "ok" and n_after not in (None, "ok"):
            notes.append("NCCL's communicator broke (after: %s), the shim's did not" % n_after)
    # NCCL's WARN of a fault its end saw is that end's, excused with it.
    if nccl["warns"] and not shim["warns"] and not (end_saw_fault and nf.get("end") == "1"):
        fails.append("NCCL logged a WARN, the shim's run none")
    return fails, notes


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    nccl_cases, shim_cases = parse(argv[1]), parse(argv[2])
    if not nccl_cases or not shim_cases:
        print("no cases in %s" % (argv[1] if not nccl_cases else argv[2]), file=sys.stderr)
        return 2
    print("# Bad input: the real NCCL and the shim\n")
    print("NCCL: `%s`; shim: `%s`.\n" % (argv[1], argv[2]))
    print("| id | case | real NCCL | shim | same? | guard ok (shim / NCCL) | WARN (NCCL / shim run) |")
    print("|---:|---|---|---|---|---|---|")
    failed, noted = [], []
    for cid in sorted(set(nccl_cases) | set(shim_cases)):
        nccl, shim = nccl_cases.get(cid), shim_cases.get(cid)
        name = (nccl or shim)["name"]
        fails, notes = judge(nccl, shim)
        if fails:
            same = "**NO**: " + "; ".join(fails)
            failed.append((cid, name, fails))
        elif notes:
            same = "yes (" + "; ".join(notes) + ")"
            noted.append((cid, name, notes))
        else:
            same = "yes"
        guards = "%s / %s" % ((shim or {}).get("fields", {}).get("guard", "-"),
                              (nccl or {}).get("fields", {}).get("guard", "-"))
        warns = "%s / %s" % (warn_cell(nccl), warn_cell(shim))
        print("| %d | %s | %s | %s | %s | %s | %s |" % (cid, name, cell(nccl), cell(shim), same,
                                                       guards, warns))
    total = len(set(nccl_cases) | set(shim_cases))
    print()
    for cid, name, fails in failed:
        print("- FAIL %d %s: %s" % (cid, name, "; ".join(fails)))
        for label, case in (("NCCL", nccl_cases.get(cid)), ("shim", shim_cases.get(cid))):
            for line, _ in (case or {"warns": []})["warns"][:3]:
                print("  - %s WARN: `%s`" % (label, line.strip()[:200]))
    for cid, name, notes in noted:
        print("- note %d %s: %s" % (cid, name, "; ".join(notes)))
    print()
    print("%d cases: %d as NCCL, %d differ%s" % (
        total, total - len(failed), len(failed),
        " (%d with notes)" % len(noted) if noted else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
