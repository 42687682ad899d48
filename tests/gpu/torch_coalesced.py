"""PyTorch's coalescing manager timed as DDP, FSDP and optimizer steps use it: 8 bf16 tensors
all-reduced in one group (`_coalescing_manager`, which PyTorch issues as ncclGroupStart, eight
ncclAllReduce calls on one communicator and stream, ncclGroupEnd), one process per GPU under
torchrun, eager and captured in a CUDA graph; sizes per tensor from 16 B to 64 KiB. Every result
is checked; rank 0 writes the times (microseconds per group) to OUT.json, in torch_bench.py's
form, so that torch_bench_report.py puts runs with and without ncclshim side by side.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_coalesced.py OUT.json
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from torch_bench import eager_and_graph_us, finish

SIZES = [16, 2 << 10, 32 << 10, 64 << 10]
TENSORS = 8


def main():
    out = sys.argv[1]
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    results, wrong = [], []
    for size in SIZES:
        xs = [torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda") for _ in range(TENSORS)]

        def group():
            with _coalescing_manager(device=device, async_ops=True) as cm:
                for x in xs:
                    dist.all_reduce(x)
            cm.wait()

        eager_us, graph_us = eager_and_graph_us(group)

        # One group eagerly, then by one replay of a graph of one group, checked.
        def check(label, run):
            wants = []
            for k, x in enumerate(xs):
                i = torch.arange(x.numel(), device="cuda")
                x.copy_(((i + rank + k) % 5).to(torch.bfloat16))
                wants.append(sum((i + r + k) % 5 for r in range(world)).to(torch.bfloat16))
            run()
            torch.cuda.synchronize()
            if not all(torch.equal(x, want) for x, want in zip(xs, wants)):
                wrong.append(f"{label} {size}")

        check("eager", group)
        one = torch.cuda.CUDAGraph()
        with torch.cuda.graph(one):
            group()
        check("graph", one.replay)
        del one
        results.append({"bytes": size, "eager_us": eager_us, "graph_us": graph_us})
        if rank == 0:
            print(f"torch coalesced {TENSORS} x {size} B: eager {eager_us:.1f} us, graph {graph_us:.1f} us"
                  " a group", flush=True)
    finish(out, "torch coalesced", rank, world, results, wrong)


if __name__ == "__main__":
    main()
