#!/usr/bin/env python3
"""PyTorch side of tools/bench/overhead: torch.utils.data.DataLoader over a TensorDataset.

Same workload as the C++ benchmark: `--samples` rows of 64 float32 plus an int64 label,
batch 256, shuffle=True, num_workers=0, torch.set_num_threads(1). One warm-up epoch, then
`--epochs` timed epochs; samples/s = samples delivered / seconds.

With --json prints exactly one JSON line on stdout: {"pytorch": <samples/s or null>, ...}.
If torch cannot be imported, "pytorch" is null and "error" says why (exit status 0).
"""

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (default 3)")
    p.add_argument("--samples", type=int, default=200_000, help="dataset size")
    p.add_argument("--features", type=int, default=64, help="floats per sample")
    p.add_argument("--batch-size", type=int, default=256, help="batch size")
    p.add_argument("--seed", type=int, default=0, help="data and shuffle seed")
    args = p.parse_args()

    try:
        import torch
        from torch.utils.data import DataLoader, TensorDataset
    except Exception as e:  # ImportError, or a broken install
        out = {"pytorch": None, "error": f"cannot import torch: {e}"}
        if args.json:
            print(json.dumps(out))
        else:
            print(out["error"], file=sys.stderr)
        return 0

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randn(args.samples, args.features, generator=gen)
    labels = torch.randint(0, 10, (args.samples,), generator=gen, dtype=torch.int64)

    loader = DataLoader(
        TensorDataset(data, labels),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=0,
        generator=torch.Generator().manual_seed(args.seed),
    )

    def epoch() -> int:
        n = 0
        for x, y in loader:
            n += x.size(0)
        return n

    warm = epoch()
    if warm != args.samples:
        print(f"overhead_pytorch: warm-up epoch delivered {warm} of {args.samples} samples",
              file=sys.stderr)
        return 1
    delivered = 0
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        delivered += epoch()
    seconds = time.perf_counter() - t0
    rate = delivered / seconds

    if args.json:
        print(json.dumps({
            "pytorch": rate,
            "samples": delivered,
            "seconds": seconds,
            "epochs": args.epochs,
            "torch_version": torch.__version__,
        }))
    else:
        print(f"pytorch DataLoader ({torch.__version__}): {rate:,.0f} samples/s "
              f"({delivered} samples in {seconds:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
