"""PyTorch's coalescing manager timed as DDP, FSDP and optimizer steps use it: 8 bf16 tensors
all-reduced, all-gathered (`all_gather_into_tensor`) or reduce-scattered
(`reduce_scatter_tensor`) in one group (`_coalescing_manager`, which PyTorch issues as
ncclGroupStart, eight calls on one communicator and stream, ncclGroupEnd), one process per GPU
under torchrun, eager and captured in a CUDA graph; sizes per tensor (each rank's input) from
16 B to 64 KiB. Every result is checked; rank 0 writes the times (microseconds per group) to
OUT.json, in torch_bench.py's form, so that torch_bench_report.py puts runs with and without
ncclshim side by side.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_coalesced.py OUT.json
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from torch_bench import eager_and_graph_us, finish, joined

SIZES = [16, 2 << 10, 32 << 10, 64 << 10]
TENSORS = 8
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]


def tensors(collective, size, world):
    """The group's inputs and outputs (an all-reduce's are the same tensors)."""
    n = size // 2
    ins = [torch.zeros(n * (world if collective == "reduce_scatter" else 1), dtype=torch.bfloat16,
                       device="cuda") for _ in range(TENSORS)]
    if collective == "all_reduce":
        return ins, ins
    outs = [torch.zeros(n * (world if collective == "all_gather" else 1), dtype=torch.bfloat16, device="cuda")
            for _ in range(TENSORS)]
    return ins, outs


def issue(collective, x, y):
    if collective == "all_reduce":
        dist.all_reduce(x)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(y, x)
    else:
        dist.reduce_scatter_tensor(y, x)


def wanted(collective, rank, world, k, numel):
    """Tensor k's input on `rank` (small integers, exact in bf16), and its output on this rank."""
    def input_of(r):
        i = torch.arange(numel, device="cuda")
        return ((i + r + k) % 5).to(torch.bfloat16)
    if collective == "all_gather":
        return input_of, lambda me: torch.cat([input_of(r) for r in range(world)])
    total = lambda: sum(input_of(r).float() for r in range(world)).to(torch.bfloat16)
    if collective == "all_reduce":
        return input_of, lambda me: total()
    return input_of, lambda me: total().chunk(world)[me]


def main():
    out = sys.argv[1]
    rank, world, device = joined()
    results, wrong = [], []
    for collective in COLLECTIVES:
        for size in SIZES:
            xs, ys = tensors(collective, size, world)

            def group():
                with _coalescing_manager(device=device, async_ops=True) as cm:
                    for x, y in zip(xs, ys):
                        issue(collective, x, y)
                cm.wait()

            eager_us, graph_us = eager_and_graph_us(group)

            # One group eagerly, then by one replay of a graph of one group, checked.
            def check(label, run):
                wants = []
                for k, (x, y) in enumerate(zip(xs, ys)):
                    input_of, output_of = wanted(collective, rank, world, k, x.numel())
                    x.copy_(input_of(rank))
                    if y is not x:
                        y.zero_()
                    wants.append(output_of(rank))
                run()
                torch.cuda.synchronize()
                if not all(torch.equal(y, want) for y, want in zip(ys, wants)):
                    wrong.append(f"{collective} {label} {size}")

            check("eager", group)
            one = torch.cuda.CUDAGraph()
            with torch.cuda.graph(one):
                group()
            check("graph", one.replay)
            del one
            results.append({"collective": collective, "bytes": size, "eager_us": eager_us, "graph_us": graph_us})
            if rank == 0:
                print(f"torch coalesced {collective} {TENSORS} x {size} B: eager {eager_us:.1f} us,"
                      f" graph {graph_us:.1f} us a group", flush=True)
    finish(out, "torch coalesced", rank, world, results, wrong)


if __name__ == "__main__":
    main()
