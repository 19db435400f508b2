#!/usr/bin/env python3
"""SPDL (Meta's spdl: FFmpeg decoding in a thread pool), for tools/bench/peers.

    peer_spdl.py ROOT [--epochs 3] [--threads 2] [--batch-size 64]

An spdl.pipeline over the ImageFolder tree's files (shuffled each epoch): a stage with
concurrency 2 on a 2-thread pipeline reads a file, demuxes it (spdl.io.demux_image, which gives
its size), draws RandomResizedCrop's box as torchvision does (area 0.08-1, aspect ratio 3/4-4/3,
10 tries, then the centre fallback) and a flip, and decodes it through an FFmpeg filter graph
("crop,scale=224:224:bilinear,[hflip,]format=rgb24"); then batches of 64 are stacked and
normalised with torch (1 intra-op thread) into float [64, 3, 224, 224].
"""

import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def crop_box(width, height, rng):
    """torchvision's RandomResizedCrop.get_params, with Python's random: (x, y, w, h)."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif in_ratio > 4 / 3:
        w, h = int(round(height * (4 / 3))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def main():
    a = peerlib.threaded_args(__doc__)
    try:
        import numpy as np
        import spdl
        import spdl.io
        from spdl.pipeline import PipelineBuilder
        import torch
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import spdl: {e}")
    torch.set_num_threads(1)
    mean = torch.tensor(peerlib.MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(peerlib.STD).view(1, 3, 1, 1) * 255
    rng = random.Random(0)
    state = {}

    def load(item):
        path, label, seed = item
        r = random.Random(seed)
        packets = spdl.io.demux_image(path)
        x, y, w, h = crop_box(packets.width, packets.height, r)
        flip = ",hflip" if r.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={w}:{h}:{x}:{y},scale=224:224:flags=bilinear{flip},"
                                 "format=rgb24")
        return spdl.io.to_numpy(spdl.io.convert_frames(frames)), label

    def collate(items):
        images = torch.from_numpy(np.stack([i for i, _ in items])).permute(0, 3, 1, 2)
        images = (images.float() - mean) / std
        return images, torch.tensor([l for _, l in items])

    def build():
        order = list(range(len(state["paths"])))
        rng.shuffle(order)
        source = [(state["paths"][i], state["labels"][i], rng.getrandbits(32)) for i in order]
        return (PipelineBuilder()
                .add_source(source)
                .pipe(load, concurrency=a.threads)
                .aggregate(a.batch_size)
                .pipe(collate)
                .add_sink(4)
                .build(num_threads=a.threads))

    def make_loader():
        state["paths"], state["labels"] = peerlib.list_image_folder(a.root)
        return build()

    def epoch(pipeline, on_first):
        if pipeline is None or state.get("used"):
            pipeline = build()
        state["used"] = True
        n = 0
        with pipeline.auto_stop():
            for images, labels in pipeline:
                if n == 0:
                    on_first()
                n += images.shape[0]
        return n

    version = "spdl " + getattr(spdl, "__version__", "?")
    try:
        import importlib.metadata as md
        version = "spdl " + md.version("spdl")
    except Exception:  # noqa: BLE001
        pass
    peerlib.run(make_loader, epoch, a.epochs, version)


if __name__ == "__main__":
    main()
