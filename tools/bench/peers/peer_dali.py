#!/usr/bin/env python3
"""NVIDIA DALI's CPU pipeline, for tools/bench/peers.

    peer_dali.py ROOT [--epochs 3] [--threads 2] [--batch-size 64] [--recipe classic|resnet50]

A pipeline with device_id=None (no GPU used or needed): fn.readers.file over the ImageFolder
tree (shuffled), fn.decoders.image_random_crop on the CPU (RandomResizedCrop's area 0.08-1 and
aspect ratio 3/4-4/3), fn.resize to 224x224, fn.crop_mirror_normalize (random flip, ImageNet
mean and std, float CHW), num_threads=2; batches read as PyTorch tensors through DALI's
DALIGenericIterator (the last batch partial, so an epoch is every image once).

--recipe resnet50: torchvision's ResNet-50 recipe (peer_torch.py's) in DALI's ops, on the CPU:
fn.decoders.image_random_crop and fn.resize to 176x176; nvidia.dali.auto_aug.trivial_augment's
trivial_augment_wide (31 bins, fill 0 as torchvision's, bilinear; it needs
enable_conditionals=True and runs with device_id=None); fn.crop_mirror_normalize (float CHW, the
flip as its mirror: after TrivialAugmentWide rather than before it, the same distribution, since
every geometric op's sign is drawn with even odds); RandomErasing(0.1) as fn.erase under a
coin_flip(0.1) conditional, the box drawn as torchvision draws it (area 0.02-0.33 of the image,
log-uniform ratio 0.3-3.3) in one try clamped to the image where torchvision retries up to 10
times, value 0; then RandomChoice(MixUp(0.2), CutMix(1.0)) of torchvision.transforms.v2 on each
batch the iterator returns (DALI has no batch-mixing op: a DALI user training with PyTorch mixes
there), torch at 1 intra-op thread.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    a = peerlib.threaded_args(__doc__, recipe=True)
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import nvidia.dali: {e}")

    if a.recipe == "resnet50":
        return resnet50(a, dali, fn, types, DALIGenericIterator, LastBatchPolicy)

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


def resnet50(a, dali, fn, types, DALIGenericIterator, LastBatchPolicy):
    """--recipe resnet50: see the module's docstring."""
    import math
    try:
        from nvidia.dali.auto_aug import trivial_augment
        import torch
        import torchvision.transforms.v2 as v2
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import DALI's auto_aug or torchvision.transforms.v2: {e}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    size = 176

    @dali.pipeline_def(enable_conditionals=True)
    def train_pipeline():
        jpegs, labels = fn.readers.file(file_root=a.root, random_shuffle=True, seed=0,
                                        name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = trivial_augment.trivial_augment_wide(images, num_magnitude_bins=31,
                                                      shape=[size, size], fill_value=0)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW",
            mean=[m * 255 for m in peerlib.MEAN], std=[s * 255 for s in peerlib.STD],
            mirror=fn.random.coin_flip(probability=0.5))
        if fn.random.coin_flip(probability=0.1, dtype=types.BOOL):
            area = fn.random.uniform(range=[0.02, 0.33]) * float(size * size)
            ratio = dali.math.exp(fn.random.uniform(range=[math.log(0.3), math.log(3.3)]))
            h = dali.math.min(dali.math.sqrt(area * ratio), float(size))
            w = dali.math.min(dali.math.sqrt(area / ratio), float(size))
            y = dali.math.floor(fn.random.uniform(range=[0.0, 1.0]) * (float(size) - h))
            x = dali.math.floor(fn.random.uniform(range=[0.0, 1.0]) * (float(size) - w))
            images = fn.erase(images, anchor=fn.stack(y, x), shape=fn.stack(h, w),
                              axis_names="HW", fill_value=0.0)
        return images, labels

    classes = sum(1 for d in os.scandir(a.root) if d.is_dir())  # fn.readers.file's labels
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                           v2.CutMix(alpha=1.0, num_classes=classes)])

    def make_loader():
        pipe = train_pipeline(batch_size=a.batch_size, num_threads=a.threads, device_id=None,
                              seed=0)
        return DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader",
                                   last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def epoch(loader, on_first):
        n = 0
        for batch in loader:
            images, labels = mix(batch[0]["images"], batch[0]["labels"].view(-1).long())
            if n == 0:
                on_first()
            n += images.shape[0]
        return n

    import torchvision
    peerlib.run(make_loader, epoch, a.epochs,
                f"nvidia-dali {dali.__version__}, resnet50 recipe (auto_aug.trivial_augment_wide,"
                f" fn.erase; MixUp/CutMix: torchvision {torchvision.__version__} v2)")


if __name__ == "__main__":
    main()
