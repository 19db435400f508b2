#!/usr/bin/env python3
"""PyTorch's DataLoader over torchvision's ImageFolder, for tools/bench/peers.

    peer_torch.py ROOT --config default|tuned [--prefetch-factor 2] [--epochs 3] [--workers 2]
                  [--recipe classic|resnet50]

The standard train transform (RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize(ImageNet)) and DataLoader(batch_size=64, shuffle=True, num_workers=2):
  default  every other argument at PyTorch's default (workers started anew each epoch);
  tuned    persistent_workers=True, prefetch_factor as given, torch.set_num_threads(1) in the
           main process (DataLoader already sets 1 in its workers).
Run with the venv's python for PyTorch 2.x, with /usr/bin/python3 for Debian's 1.13.
--recipe resnet50 runs torchvision's references/classification ResNet-50 recipe with
transforms.v2 (as train.py --use-v2 builds it: RandomResizedCrop(176), flip, TrivialAugmentWide
on the PIL image, PILToTensor, ToDtype(float32, scale), Normalize, RandomErasing(0.1), and
RandomChoice(MixUp(0.2), CutMix(1.0)) on each collated batch); a torchvision without v2 (before
0.16) says so in its row.
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
    p.add_argument("--recipe", choices=["classic", "resnet50"], default="classic")
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

    collate = None
    if a.recipe == "resnet50":
        try:
            import torchvision.transforms.v2 as v2
            from torch.utils.data import default_collate
        except Exception as e:  # noqa: BLE001
            peerlib.fail(f"torchvision {torchvision.__version__} lacks transforms.v2 (MixUp, "
                         f"CutMix: 0.16 and later), needed for --recipe resnet50: {e}")
        transform = v2.Compose([
            v2.RandomResizedCrop(176, antialias=True), v2.RandomHorizontalFlip(),
            # train.py's --interpolation (bilinear), as presets.py passes it on.
            v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR),
            v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(peerlib.MEAN, peerlib.STD), v2.RandomErasing(0.1)])
        classes = len(torchvision.datasets.ImageFolder(a.root).classes)
        mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                               v2.CutMix(alpha=1.0, num_classes=classes)])

        def collate(batch):
            return mix(*default_collate(batch))
    else:
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                               T.Normalize(peerlib.MEAN, peerlib.STD)])

    def make_loader():
        dataset = torchvision.datasets.ImageFolder(a.root, transform=transform)
        extra = {"collate_fn": collate} if collate else {}
        if a.config == "tuned":
            extra.update(persistent_workers=True, prefetch_factor=a.prefetch_factor)
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
    if a.recipe == "resnet50":
        version += ", resnet50 recipe (transforms.v2)"
    peerlib.run(make_loader, epoch, a.epochs, version)


if __name__ == "__main__":
    main()
