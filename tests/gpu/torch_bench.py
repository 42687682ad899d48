"""PyTorch's all-reduce timed as a training or inference step issues it: bf16, one process per
GPU under torchrun, eager and captured in a CUDA graph, each size on its own tensor (made once,
as the caching allocator keeps it). Every result is checked; rank 0 writes the times to OUT.json.
torch_bench_report.py puts runs with and without ncclshim side by side.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_bench.py OUT.json
"""
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

SIZES = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20]
CALLS = 20  # all-reduces per timed batch
BATCHES = 9


def timed(run):
    """Median microseconds per all-reduce over BATCHES batches of CALLS."""
    times = []
    for _ in range(BATCHES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
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


def main():
    out = sys.argv[1]
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    results, wrong = [], []
    for size in SIZES:
        x = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        eager_us, graph_us = eager_and_graph_us(lambda: dist.all_reduce(x))

        # The same tensor, eager and by one replay of a graph of one all-reduce, checked.
        i = torch.arange(x.numel(), device="cuda")
        mine = ((i + rank) % 5).to(torch.bfloat16)
        want = sum((i + r) % 5 for r in range(world)).to(torch.bfloat16)
        x.copy_(mine)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if not torch.equal(x, want):
            wrong.append(f"eager {size}")
        one = torch.cuda.CUDAGraph()
        with torch.cuda.graph(one):
            dist.all_reduce(x)
        x.copy_(mine)
        one.replay()
        torch.cuda.synchronize()
        if not torch.equal(x, want):
            wrong.append(f"graph {size}")
        results.append({"bytes": size, "eager_us": eager_us, "graph_us": graph_us})
        if rank == 0:
            print(f"torch bench {size >> 20} MiB: eager {eager_us:.1f} us, graph {graph_us:.1f} us",
                  flush=True)
    finish(out, "torch bench", rank, world, results, wrong)


def finish(out, label, rank, world, results, wrong):
    """Says how many results were wrong, rank 0 writes OUT, and the process ends (status 1 if any
    was wrong). Not by destroy_process_group: after graphs of NCCL calls it waits for ever (seen
    with NCCL alone, PyTorch 2.11); the results are written. torch_late_peer.py ends so too."""
    print(f"{label} rank {rank}: {len(wrong)} wrong {wrong}", flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "results": results, "wrong": wrong}, f)
    sys.stdout.flush()
    os._exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
