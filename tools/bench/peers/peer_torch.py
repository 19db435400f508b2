#!/usr/bin/env python3
"""PyTorch's DataLoader over torchvision's ImageFolder, for tools/bench/peers.

    peer_torch.py ROOT --config default|tuned [--prefetch-factor 2] [--epochs 3] [--workers 2]

The standard train transform (RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize(ImageNet)) and DataLoader(batch_size=64, shuffle=True, num_workers=2):
  default  every other argument at PyTorch's default (workers started anew each epoch);
  tuned    persistent_workers=True, prefetch_factor as given, torch.set_num_threads(1) in the
           main process (DataLoader already sets 1 in its workers).
Run with the venv's python for PyTorch 2.x, with /usr/bin/python3 for Debian's 1.13.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--config", choices=["default", "tuned"], default="default")
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args()
    try:
        import torch
        import torchvision
        import torchvision.transforms as T
        from torch.utils.data import DataLoader
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import torch/torchvision: {e}")
    torch.manual_seed(0)
    if a.config == "tuned":
        torch.set_num_threads(1)

    def make_loader():
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                               T.Normalize(peerlib.MEAN, peerlib.STD)])
        dataset = torchvision.datasets.ImageFolder(a.root, transform=transform)
        extra = {}
        if a.config == "tuned":
            extra = {"persistent_workers": True, "prefetch_factor": a.prefetch_factor}
        return DataLoader(dataset, batch_size=a.batch_size, shuffle=True,
                          num_workers=a.workers, **extra)

    def epoch(loader, on_first):
        n = 0
        for images, labels in loader:
            if n == 0:
                on_first()
            n += images.size(0)
        return n

    version = f"torch {torch.__version__}, torchvision {torchvision.__version__}"
    if a.config == "tuned":
        version += f", prefetch_factor {a.prefetch_factor}"
    peerlib.run(make_loader, epoch, a.epochs, version)


if __name__ == "__main__":
    main()
