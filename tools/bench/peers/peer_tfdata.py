#!/usr/bin/env python3
"""tf.data (tensorflow-cpu), for tools/bench/peers.

    peer_tfdata.py ROOT [--epochs 3] [--threads 2] [--batch-size 64] [--recipe classic|resnet50]

The ImageFolder tree's files (shuffled each epoch) read with tf.io.read_file; RandomResizedCrop
as TensorFlow's reference input pipelines write it (tf.image.sample_distorted_bounding_box on the
JPEG's shape, area 0.08-1, aspect ratio 3/4-4/3, then tf.image.decode_and_crop_jpeg, which
decodes only the crop's rows), tf.image.resize to 224x224 (bilinear),
tf.image.random_flip_left_right, normalised with ImageNet's mean and std; map with
num_parallel_calls=AUTOTUNE, batch 64, prefetch AUTOTUNE; tf.data's private thread pool 2 threads,
intra-op parallelism 1, TensorFlow's own pools 2 inter-op and 1 intra-op thread.

--recipe resnet50: torchvision's ResNet-50 recipe (peer_torch.py's) in TensorFlow's ops
(tf_recipes.py beside this file: TrivialAugmentWide written with tf.switch_case, since neither
TensorFlow nor Keras has it): the same crop at 176x176, flip, TrivialAugmentWide on the float
[0, 255] crop, normalise, RandomErasing(0.1) per image in the same map; then batch and
RandomChoice(MixUp(0.2), CutMix(1.0)) on each batch in a second map (num_parallel_calls=AUTOTUNE),
labels one-hot; the same threads and AUTOTUNE as above.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    a = peerlib.threaded_args(__doc__, recipe=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001
        peerlib.fail(f"cannot import tensorflow: {e}")
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(0)
    mean = tf.constant(peerlib.MEAN, shape=[1, 1, 3]) * 255.0
    std = tf.constant(peerlib.STD, shape=[1, 1, 3]) * 255.0

    side = 176 if a.recipe == "resnet50" else 224
    if a.recipe == "resnet50":
        import tf_recipes
        classes = sum(1 for d in os.scandir(a.root) if d.is_dir())

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.image.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        image = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
        image = tf.image.resize(image, [side, side])
        image = tf.image.random_flip_left_right(image)
        if a.recipe != "resnet50":
            return (image - mean) / std, label
        image = tf_recipes.trivial_augment_wide(image)
        return tf_recipes.random_erasing((image - mean) / std), label

    def make_loader():
        paths, labels = peerlib.list_image_folder(a.root)
        options = tf.data.Options()
        options.threading.private_threadpool_size = a.threads
        options.threading.max_intra_op_parallelism = 1
        ds = tf.data.Dataset.from_tensor_slices((paths, labels))
        ds = ds.shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
        ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(a.batch_size)
        if a.recipe == "resnet50":
            ds = ds.map(lambda x, y: tf_recipes.mix_batch(x, y, classes),
                        num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.prefetch(tf.data.AUTOTUNE).with_options(options)
        return ds

    def epoch(ds, on_first):
        n = 0
        for images, labels in ds:
            if n == 0:
                on_first()
            n += int(images.shape[0])
        return n

    version = f"tensorflow-cpu {tf.__version__}"
    if a.recipe == "resnet50":
        version += ", resnet50 recipe (tf_recipes.py: TrivialAugmentWide by tf.switch_case)"
    peerlib.run(make_loader, epoch, a.epochs, version)


if __name__ == "__main__":
    main()
