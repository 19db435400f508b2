#!/usr/bin/env python3
"""coload from Python (the coload package, python/), for tools/bench/peers.

    peer_coload_python.py ROOT [--epochs 3] [--workers 2] [--batch-size 64] [--recipe classic]

coload_threads' pipeline iterated from a Python loop: coload.vision.ImageFolder(ROOT, recipe)
(the preset's train recipe: RandomResizedCrop 224, flip, normalise) through coload.DataLoader
(batch 64, shuffle through torch's RandomSampler, --workers threads, persistent_workers), each
batch a torch.Tensor [64, 3, 224, 224] handed over without a copy. What it measures against
coload_threads is what the binding costs (the target: within 5%).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--recipe", default="classic")
    a = p.parse_args()
    try:
        import torch
        import coload
    except ImportError as e:
        peerlib.fail(f"the coload package is not installed in {sys.executable}: {e} "
                     "(tools/ci/python.sh installs it into ~/.cache/coload/venv-torch-*)")
    torch.set_num_threads(1)

    def make_loader():
        return coload.DataLoader(coload.vision.ImageFolder(a.root, recipe=a.recipe),
                                 batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                 persistent_workers=True)

    def epoch(loader, on_first):
        n = 0
        for images, labels in loader:
            if n == 0:
                on_first()
            n += images.shape[0]
        return n

    peerlib.run(make_loader, epoch, a.epochs, f"coload (Python, torch {torch.__version__})")


if __name__ == "__main__":
    main()
