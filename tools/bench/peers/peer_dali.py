#!/usr/bin/env python3
"""NVIDIA DALI's CPU pipeline, for tools/bench/peers.

    peer_dali.py ROOT [--epochs 3] [--threads 2] [--batch-size 64]

A pipeline with device_id=None (no GPU used or needed): fn.readers.file over the ImageFolder
tree (shuffled), fn.decoders.image_random_crop on the CPU (RandomResizedCrop's area 0.08-1 and
aspect ratio 3/4-4/3), fn.resize to 224x224, fn.crop_mirror_normalize (random flip, ImageNet
mean and std, float CHW), num_threads=2; batches read as PyTorch tensors through DALI's
DALIGenericIterator (the last batch partial, so an epoch is every image once).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    a = peerlib.threaded_args(__doc__)
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import nvidia.dali: {e}")

    @dali.pipeline_def
    def train_pipeline():
        jpegs, labels = fn.readers.file(file_root=a.root, random_shuffle=True, seed=0,
                                        name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", crop=(224, 224),
            mean=[m * 255 for m in peerlib.MEAN], std=[s * 255 for s in peerlib.STD],
            mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    def make_loader():
        pipe = train_pipeline(batch_size=a.batch_size, num_threads=a.threads, device_id=None,
                              seed=0)
        return DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader",
                                   last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def epoch(loader, on_first):
        n = 0
        for batch in loader:
            if n == 0:
                on_first()
            n += batch[0]["images"].shape[0]
        return n

    peerlib.run(make_loader, epoch, a.epochs, f"nvidia-dali {dali.__version__}")


if __name__ == "__main__":
    main()
