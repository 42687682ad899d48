"""PyTorch's collectives timed as a training or inference step issues them: bf16, one process
per GPU under torchrun, eager and captured in a CUDA graph, each size on its own tensors (made
once, as the caching allocator keeps them). Every result is checked; rank 0 writes the times to
OUT.json. torch_bench_report.py puts runs with and without ncclshim side by side.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_bench.py OUT.json

TORCH_BENCH_COLLECTIVES: which ones, a space between them (default all_reduce): all_reduce,
reduce_scatter (reduce_scatter_tensor), all_gather (all_gather_into_tensor), all_gather_in_place
(the same, each rank's input its part of the output, as FSDP's), broadcast (from the last
rank). A size is the bytes of the larger tensor, as nccl-tests counts them.
TORCH_BENCH_MIB: the sizes in MiB, a space between them (default 1 2 4 8 16 32 64).
"""
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

from torch_collectives import mapped_nccl

SIZES = [int(mib) << 20 for mib in os.environ.get("TORCH_BENCH_MIB", "1 2 4 8 16 32 64").split()]
CALLS = 20  # all-reduces per timed batch
BATCHES = 9


def timed(run, per=CALLS):
    """Median microseconds per call over BATCHES runs of `run`, which makes `per` calls."""
    times = []
    for _ in range(BATCHES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per)
    return statistics.median(times)


def eager_and_graph_us(call):
    """Median microseconds per `call` over batches of CALLS, eager (after a warm-up) and replayed
    from a CUDA graph of CALLS calls (its communicator warmed up on a side stream first, as
    PyTorch's capture needs)."""
    def eager():
        for _ in range(CALLS):
            call()

    for _ in range(3):
        eager()
    torch.cuda.synchronize()
    eager_us = timed(eager)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    graph.replay()
    torch.cuda.synchronize()
    return eager_us, timed(graph.replay)


def joined():
    """This process's GPU (torchrun's LOCAL_RANK) made current and its process group joined over
    NCCL: (rank, world size, device)."""
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def pattern(n, offset):
    """n bf16 values (i + offset) % 5, exact in bf16 and in sums of a few of them."""
    return ((torch.arange(n, device="cuda") + offset) % 5).to(torch.bfloat16)


def prepared(collective, size, rank, world):
    """(call, fill, want, out) for one collective and size: `call` issues it, `fill` writes this
    rank's input, `want` is what `out` holds afterwards."""
    n = size // 2
    if collective == "all_reduce":
        x = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        want = sum(pattern(n, r).float() for r in range(world)).to(torch.bfloat16)
        return (lambda: dist.all_reduce(x)), (lambda: x.copy_(pattern(n, rank))), want, x
    if collective == "reduce_scatter":
        inp = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        out = torch.zeros(n // world, dtype=torch.bfloat16, device="cuda")
        mine = slice(rank * (n // world), (rank + 1) * (n // world))
        want = sum(pattern(n, r).float() for r in range(world))[mine].to(torch.bfloat16)
        return (lambda: dist.reduce_scatter_tensor(out, inp)), (lambda: inp.copy_(pattern(n, rank))), want, out
    if collective in ("all_gather", "all_gather_in_place"):
        out = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        # In place as FSDP gathers its parameters: each rank's shard is its part of the output.
        inp = (out[rank * (n // world):(rank + 1) * (n // world)] if collective == "all_gather_in_place"
               else torch.zeros(n // world, dtype=torch.bfloat16, device="cuda"))
        want = torch.cat([pattern(n // world, 7 * r) for r in range(world)])
        return (lambda: dist.all_gather_into_tensor(out, inp)), (lambda: inp.copy_(pattern(n // world, 7 * rank))), want, out
    if collective == "broadcast":
        x = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        root = world - 1
        return (lambda: dist.broadcast(x, root)), (lambda: x.copy_(pattern(n, rank))), pattern(n, root), x
    raise SystemExit(f"torch_bench.py: no collective {collective!r}")


def main():
    out = sys.argv[1]
    rank, world, _ = joined()
    results, wrong = [], []
    for collective in os.environ.get("TORCH_BENCH_COLLECTIVES", "all_reduce").split():
        for size in SIZES:
            call, fill, want, result = prepared(collective, size, rank, world)
            eager_us, graph_us = eager_and_graph_us(call)

            # The same tensors, eager and by one replay of a graph of one call, checked.
            fill()
            call()
            torch.cuda.synchronize()
            if not torch.equal(result, want):
                wrong.append(f"{collective} eager {size}")
            one = torch.cuda.CUDAGraph()
            with torch.cuda.graph(one):
                call()
            result.zero_()
            fill()
            one.replay()
            torch.cuda.synchronize()
            if not torch.equal(result, want):
                wrong.append(f"{collective} graph {size}")
            results.append({"collective": collective, "bytes": size, "eager_us": eager_us,
                            "graph_us": graph_us})
            if rank == 0:
                print(f"torch bench {collective} {size >> 20} MiB: eager {eager_us:.1f} us, "
                      f"graph {graph_us:.1f} us", flush=True)
    finish(out, "torch bench", rank, world, results, wrong, abort=True)


def finish(out, label, rank, world, results, wrong, abort=False):
    """Says how many results were wrong, rank 0 writes OUT, and the process ends (status 1 if any
    was wrong). Not by destroy_process_group: after graphs of NCCL calls it waits for ever (seen
    with NCCL alone, PyTorch 2.11); the results are written. torch_late_peer.py ends so too.
    With `abort`, under the shim (NCCLSHIM_REAL_NCCL set), the communicators are aborted first,
    so that the shim releases their cores and logs what each served (run.sh counts the calls
    zero-copy took); a process that ends by os._exit tells nothing else. Not under NCCL alone:
    after graphs of its kernels, its abort waits too (seen: over 150 s, PyTorch 2.11, NCCL
    2.28.9)."""
    print(f"{label} rank {rank} mapped: {' '.join(mapped_nccl())}", flush=True)
    print(f"{label} rank {rank}: {len(wrong)} wrong {wrong}", flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "results": results, "wrong": wrong}, f)
    sys.stdout.flush()
    abort_process_group = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort and abort_process_group is not None and "NCCLSHIM_REAL_NCCL" in os.environ:
        torch.cuda.synchronize()
        try:
            abort_process_group()
            print(f"{label} rank {rank}: communicators aborted", flush=True)
        except Exception as e:  # the results stand: only the shim's counts go unsaid
            print(f"{label} rank {rank}: abort failed: {e}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
