"""PyTorch's collectives and a few DDP training steps, as any user would write them: run under
torchrun with or without ncclshim preloaded. Every result is checked against what each rank can
compute by itself, and saved to OUT/rank<R>.pt so that the two runs can be compared bit for bit
(torch_compare.py).

    python3 -m torch.distributed.run --standalone --nproc_per_node N torch_collectives.py OUT

TORCH_COLLECTIVES_SKIP: steps to leave out, by name, comma-separated (e.g. all_to_all).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

N = 4099  # odd, and not a multiple of 16 bytes for any type


def mapped_nccl():
    """The libnccl files this process has mapped: the proof of which library served the calls."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libnccl" in line})


class Run:
    def __init__(self, out):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.out = out
        self.results = {}
        self.failures = []

    def data(self, r, dtype, n=N, kind="sum"):
        """Rank r's input: small integers, so sums and products are exact in any order."""
        i = torch.arange(n, device=self.dev)
        if kind == "prod":
            return ((i + r) % 2 + 1).to(dtype)
        return ((i * 7 + r * 3) % 13).to(dtype)

    def record(self, name, got, want):
        got = got.detach().cpu().clone()
        self.results[name] = got
        if not torch.equal(got, want.detach().cpu()):
            self.failures.append(name)

    def all_reduce(self):
        ranks = range(self.world)
        ops = {
            "sum": (dist.ReduceOp.SUM, "sum", lambda xs: sum(xs)),
            "prod": (dist.ReduceOp.PRODUCT, "prod", lambda xs: torch.stack(xs).prod(0)),
            "min": (dist.ReduceOp.MIN, "sum", lambda xs: torch.stack(xs).min(0).values),
            "max": (dist.ReduceOp.MAX, "sum", lambda xs: torch.stack(xs).max(0).values),
            "avg": (dist.ReduceOp.AVG, "sum", lambda xs: sum(xs) / len(xs)),
        }
        if hasattr(dist, "_make_nccl_premul_sum"):  # NCCL's PreMulSum, as PyTorch exposes it
            ops["premul_sum"] = (dist._make_nccl_premul_sum(2.0), "sum", lambda xs: 2 * sum(xs))
        for name, (op, kind, reference) in ops.items():
            dtypes = [torch.float32, torch.int32] if name in ("prod", "min", "max") else [torch.float32]
            if name == "sum":
                dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                          torch.int8, torch.uint8, torch.int32, torch.int64]
            for dtype in dtypes:
                t = self.data(self.rank, dtype, kind=kind)
                dist.all_reduce(t, op=op)
                want = reference([self.data(r, dtype, kind=kind).double() for r in ranks]).to(dtype)
                self.record(f"all_reduce_{name}_{dtype}", t, want)

    def gather_scatter(self):
        w, r, f = self.world, self.rank, torch.float32
        everyone = [self.data(k, f) for k in range(w)]
        out = torch.empty(w * N, device=self.dev)
        dist.all_gather_into_tensor(out, self.data(r, f))
        self.record("all_gather_into_tensor", out, torch.cat(everyone))

        lists = [torch.empty(N, device=self.dev) for _ in range(w)]
        dist.all_gather(lists, self.data(r, f))
        self.record("all_gather", torch.cat(lists), torch.cat(everyone))

        out = torch.empty(N, device=self.dev)
        dist.reduce_scatter_tensor(out, self.data(r, f, n=w * N))
        want = sum(self.data(k, f, n=w * N) for k in range(w))[r * N:(r + 1) * N]
        self.record("reduce_scatter_tensor", out, want)

        t = self.data(r, f)
        dist.broadcast(t, src=w - 1)
        self.record("broadcast", t, self.data(w - 1, f))

        t = self.data(r, f)
        dist.reduce(t, dst=w - 1)
        if r == w - 1:
            self.record("reduce", t, sum(everyone))

        gathered = [torch.empty(N, device=self.dev) for _ in range(w)] if r == 0 else None
        dist.gather(self.data(r, f), gathered, dst=0)
        if r == 0:
            self.record("gather", torch.cat(gathered), torch.cat(everyone))

        t = torch.empty(N, device=self.dev)
        dist.scatter(t, [self.data(k, f) for k in range(w)] if r == 0 else None, src=0)
        self.record("scatter", t, self.data(r, f))

    def all_to_all(self):
        w, r, f = self.world, self.rank, torch.float32
        out = torch.empty(w * N, device=self.dev)
        dist.all_to_all_single(out, self.data(r, f, n=w * N))
        want = torch.cat([self.data(k, f, n=w * N)[r * N:(r + 1) * N] for k in range(w)])
        self.record("all_to_all_single", out, want)

        # Uneven: rank k sends k + j + 1 elements to rank j.
        def splits(k):
            return [k + j + 1 for j in range(w)]

        out = torch.empty(sum(splits(r)), device=self.dev)
        dist.all_to_all_single(out, self.data(r, f, n=sum(splits(r))),
                               output_split_sizes=splits(r), input_split_sizes=splits(r))
        pieces = []
        for k in range(w):
            start = sum(splits(k)[:r])
            pieces.append(self.data(k, f, n=sum(splits(k)))[start:start + splits(k)[r]])
        self.record("all_to_all_single_uneven", out, torch.cat(pieces))

    def send_recv(self):
        w, r, f = self.world, self.rank, torch.float32
        got = torch.empty(N, device=self.dev)
        ops = [dist.P2POp(dist.isend, self.data(r, f), (r + 1) % w),
               dist.P2POp(dist.irecv, got, (r - 1) % w)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        self.record("batch_isend_irecv_ring", got, self.data((r - 1) % w, f))

        if r in (0, 1):  # plain blocking send and recv between a pair
            t = self.data(r, f)
            if r == 0:
                dist.send(t, dst=1)
            else:
                dist.recv(t, src=0)
            self.record("send_recv_pair", t, self.data(0, f))

    def groups(self):
        w, r, f = self.world, self.rank, torch.float32
        members = [0, w - 1]
        pair = dist.new_group(members)
        if r in members:
            t = self.data(r, f)
            dist.all_reduce(t, group=pair)
            self.record("new_group_pair_all_reduce", t, sum(self.data(k, f) for k in members))
        reversed_world = dist.new_group(list(reversed(range(w))))
        t = self.data(r, f)
        dist.broadcast(t, src=0, group=reversed_world)
        self.record("new_group_reversed_broadcast", t, self.data(0, f))
        # Twice: a nonblocking communicator's first all-reduce goes to NCCL, the next to the core.
        for i in range(2):
            t = self.data(r, f)
            dist.all_reduce(t, group=reversed_world)
            self.record(f"new_group_reversed_all_reduce_{i}", t, sum(self.data(k, f) for k in range(w)))
        dist.barrier()

    def first_nccl_in_graph(self):
        """NCCL's first work on a communicator captured in a CUDA graph (global capture mode, as
        torch.cuda.graph's default): lone all-reduces on a new group first (the core's, so that
        NCCL has run nothing there yet), then a coalesced group of four 1 MiB broadcasts that
        goes to NCCL whole, which connects its channels inside the capture. Replayed with new
        values."""
        from torch.distributed.distributed_c10d import _coalescing_manager

        w, r, f, n = self.world, self.rank, torch.float32, 1 << 18
        group = dist.new_group(list(range(w)))
        for i in range(3):
            t = self.data(r, f, n=n)
            dist.all_reduce(t, group=group)
            self.record(f"first_nccl_in_graph_all_reduce_{i}", t, sum(self.data(k, f, n=n) for k in range(w)))
        torch.cuda.synchronize()
        bufs = [torch.empty(n, device=self.dev) for _ in range(4)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            with _coalescing_manager(group=group, device=self.dev):
                for i, b in enumerate(bufs):
                    dist.broadcast(b, src=i % w, group=group)
        for replay in range(2):
            for i, b in enumerate(bufs):
                b.copy_(self.data(r, f, n=n) + 100 * replay + i)
            graph.replay()
            torch.cuda.synchronize()
            for i, b in enumerate(bufs):
                want = self.data(i % w, f, n=n) + 100 * replay + i
                self.record(f"first_nccl_in_graph_broadcast_{replay}_{i}", b, want)
        del graph
        dist.barrier()

    def ddp(self):
        torch.manual_seed(0)  # the same initial weights on every rank
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(self.dev)
        ddp = DDP(model, device_ids=[self.dev.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1000 + self.rank)  # different data on every rank
        for _ in range(5):
            x = torch.randn(16, 32, generator=g).to(self.dev)
            y = torch.randn(16, 8, generator=g).to(self.dev)
            loss = ((ddp(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(every, flat)
        # The replicas must agree with each other; the bits are compared across runs.
        self.record("ddp_parameters", flat, every[0])


def main():
    out = sys.argv[1]
    local = int(os.environ["LOCAL_RANK"])
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.cuda.set_device(local)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    run = Run(out)
    skip = set(filter(None, os.environ.get("TORCH_COLLECTIVES_SKIP", "").split(",")))
    for step in (run.all_reduce, run.gather_scatter, run.all_to_all, run.send_recv, run.groups,
                 run.first_nccl_in_graph, run.ddp):
        if step.__name__ not in skip:
            step()
    torch.cuda.synchronize()
    os.makedirs(out, exist_ok=True)
    torch.save(run.results, os.path.join(out, f"rank{run.rank}.pt"))
    print(f"torch rank {run.rank}/{run.world}: {len(run.results)} results, "
          f"{len(run.failures)} wrong {run.failures}", flush=True)
    print(f"torch rank {run.rank} mapped: {' '.join(mapped_nccl())}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if run.failures else 0)


if __name__ == "__main__":
    main()
