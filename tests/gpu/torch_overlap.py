"""Collectives overlapped with compute, as training steps overlap them: a chain of bf16 matrix
products on the current stream, and after each product a collective issued with
`async_op=True` (PyTorch runs it on its own NCCL stream, which waits for the product, so it
overlaps the next product), waited for at the end of the step. DDP all-reduces its gradient
buckets so during the backward pass; FSDP all-gathers the next layer's parameters and
reduce-scatters the gradients so. One process per GPU under torchrun. What counts is the step:
a collective that is faster alone but takes the SMs the products need makes the job slower.

Rank 0 writes, in torch_bench.py's form, the step's time as `eager_us` and the step captured in
a CUDA graph and replayed as `graph_us` (microseconds per step), per collective ("overlap_" and
its name) and size (the bytes of the larger tensor, as nccl-tests counts them), and, under the
names "alone_" and the collective's name, the same collectives with no products: so that
torch_bench_report.py puts runs with and without ncclshim side by side. Every collective's result
is checked after a step.

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_overlap.py OUT.json

TORCH_OVERLAP_MIB: the collectives' sizes in MiB (default 1 4 25 64); TORCH_OVERLAP_DIM: the
products' side (default 4096; 8192 takes about eight times as long).
"""
import os
import sys

import torch
import torch.distributed as dist

from torch_bench import finish, joined, pattern, timed

SIZES = [int(float(mib) * (1 << 20)) for mib in os.environ.get("TORCH_OVERLAP_MIB", "1 4 25 64").split()]
DIM = int(os.environ.get("TORCH_OVERLAP_DIM", "4096"))
LAYERS = 8  # products, and collectives, per step


def collective_calls(collective, size, world):
    """LAYERS (issue, fill, check) for one collective and size, each on tensors of its own as a
    bucket or a layer's parameters are: `issue` returns PyTorch's work, `fill` writes this rank's
    input (and spoils the rest of the output, so that a call that writes nothing is seen),
    `check` says whether the output is right."""
    rank, n = dist.get_rank(), size // 2 // world * world
    calls = []
    for layer in range(LAYERS):
        if collective == "all_reduce":
            x = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
            want = sum(pattern(n, r + layer).float() for r in range(world)).to(torch.bfloat16)
            calls.append(((lambda x=x: dist.all_reduce(x, async_op=True)),
                          (lambda x=x, layer=layer: x.copy_(pattern(n, rank + layer))),
                          (lambda x=x, want=want: torch.equal(x, want))))
        elif collective == "all_gather":
            out = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
            part = n // world
            inp = out[rank * part:(rank + 1) * part]  # in place, as FSDP gathers its parameters
            want = torch.cat([pattern(part, 7 * r + layer) for r in range(world)])
            calls.append(((lambda out=out, inp=inp: dist.all_gather_into_tensor(out, inp, async_op=True)),
                          (lambda out=out, inp=inp, layer=layer: (out.fill_(float("nan")),
                                                                  inp.copy_(pattern(part, 7 * rank + layer)))),
                          (lambda out=out, want=want: torch.equal(out, want))))
        elif collective == "reduce_scatter":
            inp = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
            out = torch.zeros(n // world, dtype=torch.bfloat16, device="cuda")
            mine = slice(rank * (n // world), (rank + 1) * (n // world))
            want = sum(pattern(n, r + layer).float() for r in range(world))[mine].to(torch.bfloat16)
            calls.append(((lambda out=out, inp=inp: dist.reduce_scatter_tensor(out, inp, async_op=True)),
                          (lambda out=out, inp=inp, layer=layer: (out.fill_(float("nan")),
                                                                  inp.copy_(pattern(n, rank + layer)))),
                          (lambda out=out, want=want: torch.equal(out, want))))
        else:
            raise SystemExit(f"torch_overlap.py: no collective {collective!r}")
    return calls


def step_of(calls, a, b, products):
    """One step: with `products`, a product before each collective (the collective overlapping
    the next product); the collectives waited for at the end."""
    def step():
        works = []
        for issue, _, _ in calls:
            if products:
                torch.mm(a, b, out=products[len(works) % len(products)])
            works.append(issue())
        for work in works:
            work.wait()
    return step


def timed_us(run):
    """Median microseconds of `run` (torch_bench.py's runs of it), after two untimed."""
    run()
    run()
    torch.cuda.synchronize()
    return timed(run, per=1)


def graph_us(step):
    """`step` captured in a CUDA graph (its collectives warmed up on a side stream first, as
    PyTorch's capture needs), replayed: microseconds per replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return timed_us(graph.replay)


def main():
    out = sys.argv[1]
    rank, world, _ = joined()
    a = torch.randn(DIM, DIM, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(DIM, DIM, dtype=torch.bfloat16, device="cuda")
    products = [torch.empty(DIM, DIM, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    compute_us = timed_us(lambda: [torch.mm(a, b, out=products[i % 2]) for i in range(LAYERS)])
    if rank == 0:
        print(f"torch overlap: {LAYERS} products of {DIM} alone: {compute_us:.1f} us", flush=True)
    results, wrong = [], []
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in SIZES:
            calls = collective_calls(collective, size, world)
            for name, with_products in (("overlap", products), ("alone", None)):
                step = step_of(calls, a, b, with_products)
                eager = timed_us(step)
                graph = graph_us(step)
                results.append({"collective": f"{name}_{collective}", "bytes": size,
                                "eager_us": eager, "graph_us": graph})
                if rank == 0:
                    print(f"torch overlap {name} {collective} {size / (1 << 20):g} MiB: step "
                          f"{eager:.1f} us, in a graph {graph:.1f} us", flush=True)
            # One step eagerly, then by one replay of a graph of it, checked.
            step = step_of(calls, a, b, products)
            for mode in ("eager", "graph"):
                for _, fill, _ in calls:
                    fill()
                if mode == "eager":
                    step()
                else:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                    for _, fill, _ in calls:
                        fill()
                    graph.replay()
                torch.cuda.synchronize()
                bad = [layer for layer, (_, _, check) in enumerate(calls) if not check()]
                if bad:
                    wrong.append(f"{collective} {mode} {size}: layers {bad}")
    finish(out, "torch overlap", rank, world, results, wrong, abort=True)


if __name__ == "__main__":
    main()
