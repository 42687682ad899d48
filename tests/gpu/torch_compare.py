"""Compares the results that torch_collectives.py saved in two runs, tensor by tensor, bit for bit.

    python3 torch_compare.py [--ddp-rtol R] OURS_DIR NCCL_DIR

--ddp-rtol: the DDP parameters may differ by R (relative): float sums over more than two ranks
in another order (our own all-reduce) give other bits. Everything else must be bit-equal.
"""
import os
import sys

import torch


def main():
    args = sys.argv[1:]
    rtol = None
    if args[0] == "--ddp-rtol":
        rtol, args = float(args[1]), args[2:]
    ours, theirs = args
    files = sorted(f for f in os.listdir(theirs) if f.endswith(".pt"))
    compared, differ, close = 0, [], []
    for name in files:
        path = os.path.join(ours, name)
        a = torch.load(path) if os.path.exists(path) else {}
        b = torch.load(os.path.join(theirs, name))
        for key, want in b.items():
            compared += 1
            got = a.get(key)
            if got is not None and got.dtype == want.dtype and torch.equal(got, want):
                continue
            if got is not None and rtol is not None and key.startswith("ddp_"):
                rel = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
                if rel <= rtol:
                    close.append(f"{name}:{key} (rel {rel:.1e})")
                    continue
            differ.append(f"{name}:{key}")
    print(f"torch compare: {compared} tensors from {len(files)} ranks, {len(differ)} differ"
          + (f": {' '.join(differ)}" if differ else "")
          + (f"; within {rtol}: {' '.join(close)}" if close else ""))
    sys.exit(0 if files and not differ else 1)


if __name__ == "__main__":
    main()
