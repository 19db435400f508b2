#!/usr/bin/env python3
"""PyTorch side of tools/bench/device/h2d: the consumer's wait per step with pin_memory=True.

DataLoader(pin_memory=True, num_workers=2) over a dataset of 3x224x224 float32 images (each a
view of one random tensor, so the workers only collate, as the C++ producer does), batch
`--batch-size`; each step takes the next batch, calls .to(device, non_blocking=True) and
"computes" for --compute-ms (a host sleep). The wait is the time spent in next() and .to(),
averaged over the steps after the first.

With --json prints one JSON line: {"wait_ms": <ms or null>, "torch_version": ..., "error": ...}
(exit status 0 also when torch or CUDA is missing: "wait_ms" is null and "error" says why).
"""

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args()

    def report(out):
        if args.json:
            print(json.dumps(out))
        else:
            print(out, file=sys.stderr if out.get("wait_ms") is None else sys.stdout)
        return 0

    try:
        import torch
        from torch.utils.data import DataLoader, Dataset
    except Exception as e:
        return report({"wait_ms": None, "error": f"cannot import torch: {e}"})
    if not torch.cuda.is_available():
        return report({"wait_ms": None, "torch_version": torch.__version__,
                       "error": "torch.cuda.is_available() is false"})

    class Images(Dataset):
        def __init__(self, n):
            self.n = n
            self.image = torch.rand(3, 224, 224)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return self.image

    device = torch.device("cuda", args.device)
    loader = DataLoader(Images(args.batches * args.batch_size), batch_size=args.batch_size,
                        num_workers=2, pin_memory=True)
    waited = 0.0
    it = iter(loader)
    for step in range(args.batches):
        t0 = time.perf_counter()
        x = next(it).to(device, non_blocking=True)
        if step > 0:
            waited += time.perf_counter() - t0
        time.sleep(args.compute_ms / 1e3)
        del x
    torch.cuda.synchronize(device)
    return report({"wait_ms": waited * 1e3 / max(1, args.batches - 1),
                   "torch_version": torch.__version__})


if __name__ == "__main__":
    sys.exit(main())
