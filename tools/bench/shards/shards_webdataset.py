#!/usr/bin/env python3
"""PyTorch side of tools/bench/shards: DataLoader over the webdataset package.

    shards_webdataset.py SHARDS [--workers 2] [--batch-size 64] [--epochs 2] [--json]

Reads the `.tar` shards of SHARDS with webdataset.WebDataset (shardshuffle and a 1000-sample
shuffle buffer), decodes each jpg with PIL, applies the standard ImageNet train transform
(RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize) and batches 64 samples
through torch.utils.data.DataLoader(num_workers=2), as webdataset's documentation sets it up,
tuned as tools/bench/peers tunes PyTorch: persistent_workers=True, prefetch_factor=4 and one
intra-op thread. webdataset deals whole shards to the workers: give it a multiple of --workers
shards (8 shards of 6000 generated images for 2 workers), or one worker idles at the end.
One warm-up epoch, then the best of `--epochs` timed epochs. With --json prints one line:
{"images_per_s": ..., "images": N, "versions": "torch X, torchvision Y, webdataset Z"}.
Run it in the virtual environment tools/bench/shards/setup_venv.sh makes (the peers' one).
"""

import argparse
import glob
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shards")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        import torch
        import torchvision
        import webdataset as wds
        from torchvision import transforms
    except Exception as e:  # report, do not fail: the C++ side says why
        print(json.dumps({"images_per_s": None, "versions": f"unavailable: {e}"}))
        return 0
    from importlib.metadata import version
    torch.set_num_threads(1)
    urls = sorted(glob.glob(os.path.join(a.shards, "*.tar")))
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = (wds.WebDataset(urls, shardshuffle=True, nodesplitter=wds.split_by_node)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, int)
          .batched(a.batch_size, partial=True))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=a.workers,
                                         persistent_workers=a.workers > 0,
                                         prefetch_factor=4 if a.workers > 0 else None)
    rates = []
    for epoch in range(a.epochs + 1):
        t = time.perf_counter()
        n = 0
        for x, y in loader:
            n += x.shape[0]
        if epoch > 0:
            rates.append(n / (time.perf_counter() - t))
    versions = (f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
                f"webdataset {version('webdataset')}, python {sys.version.split()[0]}")
    # `images`: samples of the last epoch, which the bench checks against the shards' index (so
    # a run also shows that webdataset reads coload's shards whole).
    out = {"images_per_s": max(rates), "images": n, "versions": versions}
    print(json.dumps(out) if a.json else f"{out['images_per_s']:.1f} images/s ({versions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
