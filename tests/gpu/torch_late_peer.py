"""A late peer under PyTorch: one process per GPU under torchrun, each rank late by its own random
0 - 50 microseconds before every all-reduce (a busy wait in Python before each eager call, a
spin kernel of a random length before each call captured in a CUDA graph), bf16, in place and
apart, sizes across every kernel's range. Run once with the shim and once without (alternating,
several rounds); `--compare` then fails when any size and mode took more than LIMIT x NCCL's
time (medians over the rounds). Eager: the median call; in a graph: the mean over the replays.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_late_peer.py OUT.json
    python3 torch_late_peer.py --compare [--limit 1.5] NCCL.json SHIM.json [NCCL.json SHIM.json ...]
"""
import json
import random
import statistics
import sys
import time

SIZES = [8 << 10, 128 << 10, 192 << 10, 256 << 10, 384 << 10, 512 << 10, 1 << 20, 2 << 20, 8 << 20]
CALLS = 200  # eager all-reduces timed per size
GRAPH_CALLS = 10  # all-reduces in the graph
REPLAYS = 20
MAX_DELAY_US = 50


def spin_us(us):
    until = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < until:
        pass


def run(out):
    import torch
    import torch.distributed as dist
    from torch_bench import finish, joined  # beside this file, as torchrun runs it

    rank, world, _ = joined()
    # About 1.4 GHz clocks; the delays need only be random and equal for both libraries.
    cycles_per_us = 1400
    results, wrong = [], []
    for size in SIZES:
        for in_place in (True, False):
            rng = random.Random(size * 2 + in_place + 1000003 * rank)
            src = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda") * (rank + 1)
            dst = torch.empty_like(src)
            want = torch.full_like(src, sum(r + 1 for r in range(world)))

            def one():
                # Inputs put back before every call: in place, the sum would grow.
                if in_place:
                    dst.copy_(src)
                    dist.all_reduce(dst)
                else:
                    # PyTorch's all-reduce is in place: apart means another tensor each call.
                    x = src.clone()
                    dist.all_reduce(x)
                    dst.copy_(x)

            for _ in range(5):
                one()
            torch.cuda.synchronize()
            dist.barrier()
            # Each call's time on the GPU, from just before it to just after (the stream waits for
            # it there): the median is a stall's, which holds call after call, and not a pause of
            # the Python process's, which comes now and then (seen under NCCL alone too).
            marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(CALLS)]
            for before, after in marks:
                spin_us(rng.uniform(0, MAX_DELAY_US))
                before.record()
                one()
                after.record()
            torch.cuda.synchronize()
            eager_us = statistics.median(before.elapsed_time(after) * 1e3 for before, after in marks)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if not torch.equal(dst, want):
                wrong.append(f"eager {size} in_place={in_place}")

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                one()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(GRAPH_CALLS):
                    torch.cuda._sleep(int(rng.uniform(0, MAX_DELAY_US) * cycles_per_us))
                    one()
            graph.replay()
            torch.cuda.synchronize()
            dist.barrier()
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            graph_us = start.elapsed_time(end) * 1e3 / (REPLAYS * GRAPH_CALLS)
            if not torch.equal(dst, want):
                wrong.append(f"graph {size} in_place={in_place}")
            del graph
            # The slowest rank's times: a stall shows on every rank.
            times = torch.tensor([eager_us, graph_us], device="cuda")
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            eager_us, graph_us = times.tolist()
            results.append({"bytes": size, "in_place": in_place, "eager_us": eager_us, "graph_us": graph_us})
            if rank == 0:
                place = "in place" if in_place else "apart"
                print(f"late peer {size >> 10} KiB {place}: eager {eager_us:.1f} us, graph {graph_us:.1f} us",
                      flush=True)
    torch.cuda.synchronize()
    finish(out, "late peer", rank, world, results, wrong)


def compare(args):
    limit = 1.5
    if args[:1] == ["--limit"]:
        limit, args = float(args[1]), args[2:]
    if not args or len(args) % 2:
        sys.exit("usage: torch_late_peer.py --compare [--limit X] NCCL.json SHIM.json [...]")
    failures = 0
    times = {}  # (bytes, in place, mode) -> ([nccl us], [shim us]), one of each per round
    for nccl_path, shim_path in zip(args[::2], args[1::2]):
        with open(nccl_path) as f:
            nccl = json.load(f)
        with open(shim_path) as f:
            shim = json.load(f)
        if nccl["wrong"] or shim["wrong"]:
            print(f"wrong results: nccl {nccl['wrong']} shim {shim['wrong']}")
            failures += 1
        for a, b in zip(nccl["results"], shim["results"]):
            assert (a["bytes"], a["in_place"]) == (b["bytes"], b["in_place"])
            for mode in ("eager", "graph"):
                pair = times.setdefault((a["bytes"], a["in_place"], mode), ([], []))
                pair[0].append(a[f"{mode}_us"])
                pair[1].append(b[f"{mode}_us"])
    print(f"{'KiB':>8} {'place':>8} {'mode':>5} {'nccl_us':>9} {'shim_us':>9} {'ratio':>6}  rounds (shim/nccl)")
    for (size, in_place, mode), (nccl_us, shim_us) in times.items():
        a, b = statistics.median(nccl_us), statistics.median(shim_us)
        slow = b / a > limit
        failures += slow
        rounds = " ".join(f"{s / n:.2f}" for n, s in zip(nccl_us, shim_us))
        place = "inplace" if in_place else "apart"
        print(f"{size >> 10:>8} {place:>8} {mode:>5} {a:>9.1f} {b:>9.1f} {b / a:>6.2f}  {rounds}"
              f"{'  SLOW' if slow else ''}")
    print(f"# {failures} sizes and modes through the shim above {limit} x NCCL's time (or wrong)")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(sys.argv[2:]))
    run(sys.argv[1])
