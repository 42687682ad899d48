#!/usr/bin/env python3
"""Reads nccl-tests' output as nccl_tests.sh saves it (each line stamped with the seconds since
the run started):
  --check LOG                 exit 1 unless every result row has #wrong 0 (or N/A, unchecked)
                              and the out-of-bounds check, where printed, is OK
  --first-call SHIM REAL      seconds from NCCL's init to the first result, shim against real;
                              exit 1 if the shim adds more than 1 s
  --ratios DIR NAME...        markdown: shim / real time per size for the pairs of runs
                              DIR/NAME-shim.log and DIR/NAME-real.log, then every size and
                              placement above 1.02 x NCCL's time; the last line counts them
  --largest-ratio DIR NAME    the largest shim / real time of one pair (both placements)
  --gate LIMIT DIR NAME...    markdown: per size and placement, the best (least) time over every
                              round DIR/NAME-shim-r*.log against DIR/NAME-real-r*.log (each log
                              may hold several cycles, -N); exit 1 if any shim / real is above
                              LIMIT, or a NAME has no rows on one side or other sizes on each.
                              The best, not the median: noise only adds time, and it comes by
                              process (one driving both GPUs runs 30 % apart from the next), so a
                              median of a few rounds is one process's luck; work the shim adds is
                              in its best round too
  --limits GPU NRANKS DIR NAME...
                              markdown: per collective and size the worst shim / NCCL-at-its-best
                              ratio over the runs limits-*-MODE-BINARY[-r2|-g|-zc] (best of
                              rounds), and last the two rows of the measured-limits table for
                              GPU: per collective the spans of sizes (the first from the smallest)
                              where every size, placement, mode and set came out at most
                              LIMIT_RATIO x NCCL's time, over every set (`any`), then over the
                              sets of buffers in no symmetric window, all but -r2 (`plain`)
  --modes DIR NAME...         markdown: one table per collective and mode (one process per GPU,
                              one for all) of the limits runs NAME (as --limits takes them): per
                              size and set, the best shim and NCCL times out of place and the
                              shim / NCCL ratio out of place and in place (-R 2 against NCCL's
                              faster of its windows and plain buffers)
  --tune DIR NAME...          markdown: per size, the best (least) out-of-place time of the
                              rounds DIR/NAME-real-r*.log (NCCL alone), DIR/NAME-shim-r*.log
                              (the shim as built) and DIR/NAME-tK-r*.log (the shim under the
                              settings DIR/tune-configs.txt names tK), with their ratios to
                              NCCL's, and per setting the sizes where it beat the shim as built
                              by more than TUNE_MARGIN; exit 1 if a run has no rows
A result row: size count type redop root, then time algbw busbw #wrong out of place, then the
same in place.
"""

import glob
import math
import os
import re
import statistics
import sys

NUMBER = re.compile(r"^-?[\d.]+$")


def parse_row(text):
    """A result row's fields (size, count, type, redop, root, then time, algbw, busbw, #wrong
    out of place and in place), or None. Collectives without an op (hypercube) leave redop
    empty."""
    tokens = text.split()
    if len(tokens) == 12:
        tokens = tokens[:3] + [""] + tokens[3:]
    if len(tokens) != 13 or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    timing = tokens[5:8] + tokens[9:12]
    if not all(NUMBER.match(t) for t in timing + [tokens[4]]):
        return None
    return tuple(tokens)


INIT_DONE = re.compile(r"Init COMPLETE|Init timings")
CORE = re.compile(r"core (on|off) for comm")
ADDED_LIMIT_S = 1.0
# Above this shim / NCCL time, a size is listed as slower (the goals' "every size" bound).
SLOWER_LIMIT = 1.02


def stamped(path):
    """(seconds, text) per line."""
    with open(path, errors="replace") as f:
        for line in f:
            stamp, _, text = line.lstrip(" ").partition(" ")
            try:
                yield float(stamp), text.rstrip("\n")
            except ValueError:
                yield None, line.rstrip("\n")


def rows(path):
    """{(size, type, redop, root): (t, row)} for every result row."""
    found = {}
    for t, text in stamped(path):
        row = parse_row(text)
        if row:
            size, _, dtype, redop, root = row[:5]
            found[(int(size), dtype, redop, root)] = (t, row)
    return found


def check(path):
    results = rows(path)
    if not results:
        print(f"{path}: no result rows")
        return 1
    wrong = [k for k, (_, g) in results.items() if g[8] not in ("0", "N/A") or g[12] not in ("0", "N/A")]
    text = open(path, errors="replace").read()
    bounds_failed = re.search(r"Out of bounds values\s*:\s*\d+\s+FAILED", text)
    if wrong or bounds_failed:
        print(f"{path}: wrong at {wrong[:5]}{' and out of bounds' if bounds_failed else ''}")
        return 1
    return 0


def first_call(path):
    """(seconds from the last init line to the first result row, seconds to 'core on/off')."""
    init = first = core = None
    for t, text in stamped(path):
        if t is None:
            continue
        if INIT_DONE.search(text):
            init = t
        if core is None and CORE.search(text):
            core = t
        if first is None and parse_row(text):
            first = t
    if init is None or first is None:
        return None, None
    return first - init, (core - init if core is not None else None)


def first_call_report(shim, real):
    shim_s, core_s = first_call(shim)
    real_s, _ = first_call(real)
    if shim_s is None or real_s is None:
        print("no init line or no result in the logs")
        return 1
    added = shim_s - real_s
    core = f", core set up {core_s:.2f} s after" if core_s is not None else ""
    print(f"first result {shim_s:.2f} s after NCCL's init with the shim{core}, {real_s:.2f} s with NCCL alone: "
          f"{added:+.2f} s (limit +{ADDED_LIMIT_S:.0f} s)")
    return 0 if added <= ADDED_LIMIT_S else 1


def pair(directory, name):
    """[(key, out-of-place ratio, in-place ratio, shim row, real row)] of one pair, by size."""
    shim = rows(f"{directory}/{name}-shim.log")
    real = rows(f"{directory}/{name}-real.log")
    out = []
    for key in sorted(set(shim) & set(real)):
        s, r = shim[key][1], real[key][1]
        oop = float(s[5]) / float(r[5]) if float(r[5]) > 0 else float("nan")
        ip = float(s[9]) / float(r[9]) if float(r[9]) > 0 else float("nan")
        out.append((key, oop, ip, s, r))
    return out


def human(size):
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= step and size % step == 0:
            return f"{size // step} {unit}"
    return f"{size} B"


def ratios(directory, names):
    print("# nccl-tests: time with the shim / time with NCCL alone (same binary, same GPUs)\n")
    print("Out of place and in place; below 1 the shim is faster. Modes: `mpi` one process per GPU")
    print("(`mpirun -np N ... -g 1`), `group` one process driving every GPU (`-g N`).\n")
    print("| run | sizes | out of place: min / median / max | in place: min / median / max |")
    print("|---|---|---|---|")
    failed = 0
    detail, paired = {}, {}
    for name in names:
        got = paired[name] = pair(directory, name)
        if not got:
            print(f"| {name} | no rows | | |")
            failed = 1
            continue
        oop = [g[1] for g in got]
        ip = [g[2] for g in got]
        sizes = sorted({g[0][0] for g in got})
        print(f"| {name} | {human(sizes[0])} – {human(sizes[-1])} | {min(oop):.2f} / {statistics.median(oop):.2f} / "
              f"{max(oop):.2f} | {min(ip):.2f} / {statistics.median(ip):.2f} / {max(ip):.2f} |")
        if name.startswith(("basic-", "large-")):
            detail[name] = got
    for name, got in detail.items():
        print(f"\n## {name}\n")
        print("| size | type | op | out of place | in place |")
        print("|---|---|---|---|---|")
        for (size, dtype, redop, _), oop, ip, _, _ in got:
            print(f"| {human(size)} | {dtype} | {redop} | {oop:.2f} | {ip:.2f} |")
    slower_than_nccl(paired)
    return failed


def slower_than_nccl(paired):
    """Every size and placement of the pairs ({name: pair()}) where the shim took more than
    SLOWER_LIMIT x NCCL's time, slowest first, with both times; the last line counts them (one
    run each: repeat a size before believing it, sub-microsecond rows most of all)."""
    slower, sizes = [], 0
    for name, got in paired.items():
        for key, oop, ip, s, r in got:
            for ratio, col, placement in ((oop, 5, "out of place"), (ip, 9, "in place")):
                sizes += 1
                if ratio > SLOWER_LIMIT:
                    slower.append((ratio, name, key, placement, s[col], r[col]))
    slower.sort(key=lambda x: -x[0])
    print(f"\n## Sizes above {SLOWER_LIMIT} x NCCL's time\n")
    if slower:
        print("| run | size | type | op | placement | shim us | NCCL us | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for ratio, name, (size, dtype, redop, _), placement, s, r in slower:
            print(f"| {name} | {human(size)} | {dtype} | {redop} | {placement} | {s} | {r} | {ratio:.2f} |")
    worst = f" (worst {slower[0][0]:.2f}: {slower[0][1]} {human(slower[0][2][0])} {slower[0][3]})" if slower else ""
    print(f"\n# {len(slower)} of {sizes} sizes above {SLOWER_LIMIT} x NCCL's time{worst}")


def samples(paths):
    """{(size, type, redop, root): (out-of-place times, in-place times)} in us, every result row
    of every log: several rounds, each with several cycles."""
    found = {}
    for path in paths:
        for _, text in stamped(path):
            row = parse_row(text)
            if row:
                size, _, dtype, redop, root = row[:5]
                oop, ip = found.setdefault((int(size), dtype, redop, root), ([], []))
                oop.append(float(row[5]))
                ip.append(float(row[9]))
    return found


PLACEMENTS = ("out of place", "in place")


def gate(limit, directory, names):
    print(f"# nccl-tests gate: best time of the rounds with the shim / with NCCL alone, limit {limit:g}\n")
    checked, above, problems = 0, [], []
    for name in names:
        shim_logs = sorted(glob.glob(f"{directory}/{name}-shim-r*.log"))
        real_logs = sorted(glob.glob(f"{directory}/{name}-real-r*.log"))
        shim, real = samples(shim_logs), samples(real_logs)
        print(f"## {name} ({len(shim_logs)} rounds with the shim, {len(real_logs)} with NCCL alone)\n")
        if not shim or not real or set(shim) != set(real):
            problem = "sizes differ" if shim and real else "no rows"
            print(f"{problem}: {len(shim)} sizes with the shim, {len(real)} with NCCL alone\n")
            problems.append(f"{name}: {problem}")
            continue
        print("| size | type | op | out of place: shim / NCCL us | ratio | in place: shim / NCCL us | ratio |")
        print("|---|---|---|---|---|---|---|")
        for key in sorted(shim):
            cells = []
            for placement, shim_times, real_times in zip(PLACEMENTS, shim[key], real[key]):
                s, r = min(shim_times), min(real_times)
                ratio = s / r if r > 0 else math.inf
                checked += 1
                mark = ""
                if ratio > limit:
                    above.append((ratio, name, key[0], placement))
                    mark = "**"
                cells += [f"{s:.2f} / {r:.2f}", f"{mark}{ratio:.3f}{mark}"]
            size, dtype, redop, _ = key
            print(f"| {human(size)} | {dtype} | {redop} | {' | '.join(cells)} |")
        print()
    line = f"# gate: {len(above)} of {checked} (name, size, placement) above {limit:g} x NCCL"
    if above:
        ratio, name, size, placement = max(above)
        line += f"; largest {ratio:.3f}: {name} {human(size)} {placement}"
    print("; ".join([line] + problems))
    return 1 if above or problems else 0


# The shim's own name for each nccl-tests binary, in the column order of the limits table.
LIMIT_COLUMNS = (
    ("all_gather", "all_gather"),
    ("reduce_scatter", "reduce_scatter"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("alltoall", "all_to_all"),
    ("gather", "gather"),
    ("scatter", "scatter"),
)
# Taken only where the core needs at most this share of NCCL's time: the best of a few rounds
# still varies by a few percent, and the core must never be the slower.
LIMIT_RATIO = 0.97


def best_times(directory, name, lib):
    """{size: (best out-of-place us, best in-place us)} over every round and cycle."""
    found = samples(sorted(glob.glob(f"{directory}/{name}-{lib}-r*.log")))
    return {key[0]: (min(oop), min(ip)) for key, (oop, ip) in found.items()}


# The most spans of sizes a limit holds (shim/src/core/measured.rs, SPANS).
LIMIT_SPANS = 3


def winning_spans(worst):
    """The spans (from, to) of measured sizes in a row where every worst ratio is at most
    LIMIT_RATIO, the first from 0 where it starts at the smallest size measured; at most
    LIMIT_SPANS of them, the smallest sizes first. Sizes between two measured ones in a span are
    taken too: each kernel's time grows smoothly with size. A lone size between two that lose
    is not a span: one cell is too little to rule out noise."""
    spans, start, last = [], None, None
    sizes = sorted(worst)
    for size in sizes:
        if worst[size][0] <= LIMIT_RATIO:
            start = size if start is None else start
            last = size
            continue
        if start is not None:
            spans.append((start, last))
        start = None
    if start is not None:
        spans.append((start, last))
    spans = [(0 if frm == sizes[0] else frm, to) for frm, to in spans]
    return [(frm, to) for frm, to in spans if frm == 0 or frm < to][:LIMIT_SPANS]


def set_times(directory, name, problems):
    """(shim, real) best times of one limits run, real at its best on the same buffers: for -R 2
    the faster of NCCL's windows and its plain buffers. None, and a line in `problems`, where the
    two sides have no rows or other sizes."""
    shim, real = best_times(directory, name, "shim"), best_times(directory, name, "real")
    if name.endswith("-r2"):
        plain = best_times(directory, name[: -len("-r2")], "real")
        real = {size: tuple(min(a, b) for a, b in zip(times, plain.get(size, times)))
                for size, times in real.items()}
    if not shim or set(shim) != set(real):
        problems.append(f"{name}: {len(shim)} sizes with the shim, {len(real)} with NCCL")
        return None
    return shim, real


def worst_ratios(directory, names, problems):
    """{size: (worst ratio, where)} over the runs `names` of one binary."""
    worst = {}
    for name in names:
        times = set_times(directory, name, problems)
        if times is None:
            continue
        shim, real = times
        # Zero bytes (nccl-tests' smallest size rounds down to no element): never the core's.
        for size in filter(None, shim):
            ratio = max(s / r if r > 0 else math.inf for s, r in zip(shim[size], real[size]))
            if ratio > worst.get(size, (0, ""))[0]:
                worst[size] = (ratio, name.split("-", 3)[3])
    return worst


def limit_cell(worst):
    """A cell of the table: the winning spans, or 0."""
    spans = winning_spans(worst)
    return ",".join(str(to) if frm == 0 else f"{frm}-{to}" for frm, to in spans) or "0"


def limits(gpu, nranks, directory, names):
    """Worst ratio per collective and size, against NCCL at its best on the same buffers: plain
    buffers against NCCL's plain, windows (-R 2) against the faster of NCCL's two, graphs (-G)
    against NCCL's graphs, the peers' buffers unmapped (-zc: the staged paths) against NCCL's
    plain. Two rows: over every set (`any`: what holds in symmetric windows too), and over the
    sets of buffers in no symmetric window (`plain`: all but -r2)."""
    print(f"# Where each collective's core beats NCCL: {gpu}, {nranks} ranks\n")
    print(f"Worst shim / NCCL time over modes (one process per GPU, one for all), sets (plain, -R 2, "
          f"{LIMIT_GRAPHS}, unmapped -zc) "
          f"and placements; a limit is the spans of sizes where every cell is at most {LIMIT_RATIO}; "
          f"`plain`: the same without -R 2 (calls whose buffers lie in no symmetric window).\n")
    any_row, plain_row, problems = [], [], []
    for binary, column in LIMIT_COLUMNS:
        ours = [n for n in names if re.search(rf"-{binary}(-r2|-g|-zc)?$", n)]
        if not ours:
            # Not measured in this run (NCCL_TESTS_BINARIES): the table's value stands.
            any_row.append("-")
            plain_row.append("-")
            print(f"## {column}: not measured\n")
            continue
        worst = worst_ratios(directory, ours, problems)
        plain = worst_ratios(directory, [n for n in ours if not n.endswith("-r2")], [])
        any_row.append(limit_cell(worst))
        plain_row.append(limit_cell(plain))
        said = lambda spans: ", ".join(f"up to {human(to)}" if frm == 0 else f"{human(frm)} - {human(to)}"
                                       for frm, to in spans) or "off"
        print(f"## {column}: on {said(winning_spans(worst))}; plain buffers {said(winning_spans(plain))}\n")
        print("| size | worst ratio | where | plain buffers |")
        print("|---|---|---|---|")
        for size in sorted(worst):
            ratio, where = worst[size]
            mine = plain.get(size, (math.nan, ""))
            print(f"| {human(size)} | {ratio:.3f} | {where} | {mine[0]:.3f} {mine[1]} |")
        print()
    for problem in problems:
        print(f"problem: {problem}")
    print("\t".join([gpu, str(nranks), "any"] + any_row))
    print("\t".join([gpu, str(nranks), "plain"] + plain_row))
    return 1 if problems else 0


# The sets of the limits runs (nccl_tests.sh `limit_sets`): name suffix and heading; the graph
# set replays each graph NCCL_TESTS_LIMITS_GRAPHS times.
LIMIT_GRAPHS = f"-G {os.environ.get('NCCL_TESTS_LIMITS_GRAPHS', '1')}"
LIMIT_SETS = (("", "plain"), ("-r2", "-R 2"), ("-g", LIMIT_GRAPHS), ("-zc", "unmapped"))
LIMIT_MODES = (("mpi", "one process per GPU"), ("group", "one process for all"))


def modes(directory, names):
    """One table per collective and mode of the limits runs `names` (PREFIX-MODE-BINARY[SET]):
    per size and set, shim / NCCL out of place, and the ratios."""
    print("Per collective and mode, per size and set: the shim's time / NCCL's out of place in us, "
          "and the ratio out of place (in place in brackets); best of every round and cycle. "
          "-R 2 is against the faster of NCCL's symmetric windows and its plain buffers; "
          "unmapped: one process per GPU with the peers' buffers unmapped (the staged paths).\n")
    problems = []
    for binary, column in LIMIT_COLUMNS:
        for mode, said in LIMIT_MODES:
            runs = []
            for suffix, heading in LIMIT_SETS:
                ours = [n for n in names if n.endswith(f"-{mode}-{binary}{suffix}")]
                for name in ours:
                    times = set_times(directory, name, problems)
                    if times is not None:
                        runs.append((heading, *times))
            if not runs:
                continue
            print(f"## {column}, {said}\n")
            print("| size | " + " | ".join(heading for heading, _, _ in runs) + " |")
            print("|---|" + "---|" * len(runs))
            # Zero bytes (nccl-tests' smallest size rounds down to no element): never the core's.
            for size in sorted(set().union(*(set(shim) for _, shim, _ in runs)) - {0}):
                cells = []
                for _, shim, real in runs:
                    if size not in shim:
                        cells.append("")
                        continue
                    (s_oop, s_ip), (r_oop, r_ip) = shim[size], real[size]
                    cells.append(f"{s_oop:.1f} / {r_oop:.1f}: {s_oop / r_oop:.2f} ({s_ip / r_ip:.2f})")
                print(f"| {human(size)} | " + " | ".join(cells) + " |")
            print()
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0


# A setting is said to beat the shim as built where its best time is below this share of the
# built one's: the best of a few rounds still varies by a percent or two.
TUNE_MARGIN = 0.98


def tune_configs(directory):
    """[(label, NCCLSHIM_TUNE value)] from DIR/tune-configs.txt ("tK VALUE" a line)."""
    with open(f"{directory}/tune-configs.txt") as f:
        return [tuple(line.split(None, 1)) for line in f.read().splitlines() if line.strip()]


def tune(directory, names):
    configs = tune_configs(directory)
    print("# Settings weighed: best out-of-place time of the rounds, us (ratio to NCCL alone's)\n")
    problems, faster = [], {value: set() for _, value in configs}
    for name in names:
        runs = [("NCCL", "real"), ("as built", "shim")] + [(value, label) for label, value in configs]
        best = {title: best_times(directory, name, lib) for title, lib in runs}
        empty = [title for title, times in best.items() if not times]
        if empty:
            problems.append(f"{name}: no rows for {', '.join(empty)}")
            continue
        rounds = len(glob.glob(f"{directory}/{name}-real-r*.log"))
        print(f"## {name} ({rounds} round{'' if rounds == 1 else 's'} each)\n")
        print("| size | " + " | ".join(title for title, _ in runs) + " |")
        print("|---" * (len(runs) + 1) + "|")
        sizes = sorted(set.intersection(*(set(times) for times in best.values())))
        for size in filter(None, sizes):
            real = best["NCCL"][size][0]
            built = best["as built"][size][0]
            cells = [f"{real:.2f}"]
            for title, _ in runs[1:]:
                t = best[title][size][0]
                cells.append(f"{t:.2f} ({t / real:.2f})" if real > 0 else f"{t:.2f}")
                if title != "as built" and t < TUNE_MARGIN * built:
                    faster[title].add((size, name))
            print(f"| {human(size)} | " + " | ".join(cells) + " |")
        print()
    for value, where in faster.items():
        listed = ", ".join(f"{name} {human(size)}" for size, name in sorted(where))
        print(f"{value}: faster than as built (below {TUNE_MARGIN} of its time) "
              f"{'at ' + listed if listed else 'nowhere'}")
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "--check":
        return max(check(p) for p in argv[1:])
    if len(argv) == 3 and argv[0] == "--first-call":
        return first_call_report(argv[1], argv[2])
    if len(argv) >= 3 and argv[0] == "--ratios":
        return ratios(argv[1], argv[2:])
    if len(argv) == 3 and argv[0] == "--largest-ratio":
        got = pair(argv[1], argv[2])
        if got:
            print(f"{max(max(g[1], g[2]) for g in got):.3f}")
        return 0
    if len(argv) >= 4 and argv[0] == "--gate":
        return gate(float(argv[1]), argv[2], argv[3:])
    if len(argv) >= 3 and argv[0] == "--modes":
        return modes(argv[1], argv[2:])
    if len(argv) >= 3 and argv[0] == "--tune":
        return tune(argv[1], argv[2:])
    if len(argv) >= 5 and argv[0] == "--limits":
        return limits(argv[1], int(argv[2]), argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
