#!/usr/bin/env python3
"""PyTorch side of tools/bench/vision/image_pipeline: DataLoader over torchvision's ImageFolder.

    image_pipeline_pytorch.py ROOT [--epochs 3] [--batch-size 64] [--workers 2] [--seed 0] [--json]

The standard ImageNet train transform (RandomResizedCrop(224), RandomHorizontalFlip(),
ToTensor(), Normalize(ImageNet mean, std)) through torch.utils.data.DataLoader(batch_size=64,
shuffle=True, num_workers=2) with every other argument at PyTorch's default, so each epoch
starts its workers afresh as a default DataLoader does. One warm-up epoch, then `--epochs`
epochs each timed on its own; images/s per epoch = images delivered / seconds.

With --json prints exactly one JSON line on stdout: {"pytorch": <median images/s or null>,
"best": ..., "epochs_rate": [...], "cpu_ms_per_image": ..., ...}. CPU time counts this process
and its reaped workers (RUSAGE_CHILDREN grows as each epoch's workers exit), so it is the work
done whatever else the machine is running. If torch or torchvision cannot be imported,
"pytorch" is null and "error" says why (exit status 0), so the C++ side can report it.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def cpu_seconds() -> float:
    # Workers are child processes; their time shows in RUSAGE_CHILDREN once they are reaped,
    # which DataLoader does at the end of each epoch (persistent_workers=False).
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def emit(args, out: dict) -> None:
    if args.json:
        print(json.dumps(out))
    elif out.get("pytorch") is None:
        print(out.get("error", "no result"), file=sys.stderr)
    else:
        print(f"pytorch DataLoader (torch {out['torch_version']}, torchvision "
              f"{out['torchvision_version']}): median {out['pytorch']:,.1f} images/s, "
              f"best {out['best']:,.1f}, {out['cpu_ms_per_image']:.2f} CPU ms/image")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="an ImageFolder tree")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--workers", type=int, default=2, help="num_workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args()

    if not os.path.isdir(args.root):
        emit(args, {"pytorch": None, "error": f"ROOT {args.root!r} is not a directory"})
        return 0
    try:
        import torch
        import torchvision
        import torchvision.transforms as T
        from torch.utils.data import DataLoader
    except Exception as e:  # ImportError, or a broken install
        emit(args, {"pytorch": None, "error": f"cannot import torch/torchvision: {e}"})
        return 0

    torch.manual_seed(args.seed)
    transform = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    dataset = torchvision.datasets.ImageFolder(args.root, transform=transform)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)

    def epoch() -> int:
        n = 0
        for images, labels in loader:
            n += images.size(0)
        return n

    total = len(dataset)
    warm = epoch()
    if warm != total:
        print(f"image_pipeline_pytorch: warm-up epoch delivered {warm} of {total} images",
              file=sys.stderr)
        return 1
    rates, cpus = [], []
    for _ in range(args.epochs):
        c0, t0 = cpu_seconds(), time.perf_counter()
        got = epoch()
        seconds = time.perf_counter() - t0
        cpus.append(cpu_seconds() - c0)
        if got != total:
            print(f"image_pipeline_pytorch: an epoch delivered {got} of {total} images",
                  file=sys.stderr)
            return 1
        rates.append(got / seconds)

    emit(args, {
        "pytorch": statistics.median(rates),
        "best": max(rates),
        "epochs_rate": rates,
        "images": total,
        "cpu_ms_per_image": 1e3 * statistics.median(cpus) / total,
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
