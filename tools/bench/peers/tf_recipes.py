"""torchvision's ResNet-50 recipe in TensorFlow ops, for peer_tfdata.py --recipe resnet50.

TensorFlow 2.21 and Keras 3 have no TrivialAugmentWide (Keras' RandAugment layer computes all of
its 11 ops on every image and keeps one by `where`, so it is neither the same policy nor what a
careful user would time), so it is written here as a careful tf.data user would: one
tf.switch_case per image over torchvision's 14 ops with their 31 magnitude bins and random
signs, each op computing only itself, in float32 on the [0, 255] crop:
  ShearX/Y, TranslateX/Y, Rotate  tf.raw_ops.ImageProjectiveTransformV3 (bilinear, fill 0);
                                  shears about the corner, rotation about the centre, as
                                  torchvision's _apply_op
  Brightness, Color, Contrast     torchvision's blends (with black, the grayscale image, its
                                  mean); tf.image.adjust_brightness/adjust_saturation are
                                  different operations (additive; HSV)
  Sharpness                       the 3x3 smoothing kernel (13) by depthwise_conv2d, borders kept
  Posterize, Solarize             bitwise mask on the uint8 values; where(x >= t, 255 - x, x)
  AutoContrast, Equalize          per-channel min/max rescale; per-channel histogram LUT
                                  (torchvision's step arithmetic)
RandomErasing(0.1): torchvision's box draw (area 0.02-0.33, log-uniform ratio 0.3-3.3; one try
clamped to the image), value 0. MixUp(0.2)/CutMix(1.0), one of the two per batch with even odds,
on the batched tensors (one-hot labels, the batch rolled by one as transforms.v2 does; Beta
draws from tf.random.gamma).
"""
import math

import tensorflow as tf

BINS = 31
OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
       "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"]


def _warp(img, m):
    """Output pixel (x, y) reads the input at m applied to (x, y, 1); m is [a0 a1 a2 b0 b1 b2]."""
    size = tf.shape(img)[0:2]
    t = tf.concat([tf.cast(m, tf.float32), tf.zeros([2], tf.float32)], 0)[None, :]
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=img[None], transforms=t, output_shape=size, fill_value=0.0,
        interpolation="BILINEAR", fill_mode="CONSTANT")[0]


def _gray(img):
    return tf.reduce_sum(img * tf.constant([0.2989, 0.587, 0.114]), -1, keepdims=True)


def _blend(a, b, f):
    return tf.clip_by_value(f * a + (1.0 - f) * b, 0.0, 255.0)


def _equalize_channel(c):
    c = tf.cast(c, tf.int32)
    hist = tf.math.bincount(tf.reshape(c, [-1]), minlength=256, maxlength=256)
    nonzero = tf.boolean_mask(hist, hist > 0)
    step = (tf.reduce_sum(hist) - nonzero[-1]) // 255

    def lut():
        table = (tf.cumsum(hist) + step // 2) // tf.maximum(step, 1)
        table = tf.clip_by_value(tf.concat([[0], table[:-1]], 0), 0, 255)
        return tf.cast(tf.gather(table, c), tf.float32)

    return tf.cond(step > 0, lut, lambda: tf.cast(c, tf.float32))


def trivial_augment_wide(img):
    """One of the 14 ops at a random bin and sign on a float32 [H, W, 3] image in [0, 255]."""
    op = tf.random.uniform([], 0, len(OPS), tf.int32)
    level = tf.cast(tf.random.uniform([], 0, BINS, tf.int32), tf.float32) / (BINS - 1)
    sign = tf.where(tf.random.uniform([]) < 0.5, -1.0, 1.0)
    return apply_op(img, op, level, sign)


def apply_op(img, op, level, sign):
    """OPS[op] at magnitude bin level * (BINS - 1), negated when sign is -1."""
    h = tf.cast(tf.shape(img)[0], tf.float32)
    w = tf.cast(tf.shape(img)[1], tf.float32)
    cx, cy = (w - 1) * 0.5, (h - 1) * 0.5
    shear = sign * 0.99 * level
    shift = sign * tf.round(32.0 * level)
    angle = sign * 135.0 * level * math.pi / 180.0
    factor = 1.0 + sign * 0.99 * level
    cos, sin = tf.cos(angle), tf.sin(angle)
    bits = 8 - tf.cast(tf.round(level * (BINS - 1) / ((BINS - 1) / 6)), tf.int32)
    threshold = 255.0 * (1.0 - level)

    def posterize():
        mask = tf.cast(tf.bitwise.left_shift(255, 8 - bits) & 255, tf.uint8)
        return tf.cast(tf.bitwise.bitwise_and(tf.cast(img, tf.uint8), mask), tf.float32)

    def sharpness():
        k = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
        k = tf.tile(k[:, :, None, None], [1, 1, 3, 1])
        blurred = tf.nn.depthwise_conv2d(img[None], k, [1, 1, 1, 1], "VALID")[0]
        inner = tf.pad(tf.round(blurred), [[1, 1], [1, 1], [0, 0]])
        border = tf.pad(tf.ones_like(blurred, tf.bool), [[1, 1], [1, 1], [0, 0]])
        return _blend(img, tf.where(border, inner, img), factor)

    def autocontrast():
        lo = tf.reduce_min(img, [0, 1], keepdims=True)
        hi = tf.reduce_max(img, [0, 1], keepdims=True)
        scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1e-6), 1.0)
        lo = tf.where(hi > lo, lo, 0.0)
        return tf.clip_by_value((img - lo) * scale, 0.0, 255.0)

    def equalize():
        return tf.stack([_equalize_channel(img[:, :, i]) for i in range(3)], -1)

    branches = [
        lambda: img,
        lambda: _warp(img, tf.stack([1.0, shear, 0.0, 0.0, 1.0, 0.0])),
        lambda: _warp(img, tf.stack([1.0, 0.0, 0.0, shear, 1.0, 0.0])),
        lambda: _warp(img, tf.stack([1.0, 0.0, -shift, 0.0, 1.0, 0.0])),
        lambda: _warp(img, tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, -shift])),
        lambda: _warp(img, tf.stack([cos, -sin, cx - cos * cx + sin * cy,
                                     sin, cos, cy - sin * cx - cos * cy])),
        lambda: _blend(img, tf.zeros_like(img), factor),
        lambda: _blend(img, _gray(img), factor),
        lambda: _blend(img, tf.reduce_mean(_gray(tf.floor(img))), factor),
        sharpness,
        posterize,
        lambda: tf.where(img >= threshold, 255.0 - img, img),
        autocontrast,
        equalize,
    ]
    return tf.switch_case(op, branches)


def random_erasing(img, p=0.1):
    """torchvision's RandomErasing(p) with value 0 on a normalised [H, W, C] image."""
    def erase():
        h = tf.cast(tf.shape(img)[0], tf.float32)
        w = tf.cast(tf.shape(img)[1], tf.float32)
        area = tf.random.uniform([], 0.02, 0.33) * h * w
        ratio = tf.exp(tf.random.uniform([], math.log(0.3), math.log(3.3)))
        eh = tf.minimum(tf.round(tf.sqrt(area * ratio)), h)
        ew = tf.minimum(tf.round(tf.sqrt(area / ratio)), w)
        y = tf.floor(tf.random.uniform([]) * (h - eh + 1))
        x = tf.floor(tf.random.uniform([]) * (w - ew + 1))
        rows = tf.range(h)[:, None, None]
        cols = tf.range(w)[None, :, None]
        inside = (rows >= y) & (rows < y + eh) & (cols >= x) & (cols < x + ew)
        return tf.where(inside, 0.0, img)

    return tf.cond(tf.random.uniform([]) < p, erase, lambda: img)


def _beta(alpha):
    a = tf.random.gamma([], alpha)
    return a / (a + tf.random.gamma([], alpha))


def mix_batch(images, labels, classes):
    """RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)]) on a batch [N, H, W, C] with integer
    labels: the mixed batch and its soft labels [N, classes]."""
    one_hot = tf.one_hot(labels, classes)
    rolled_images, rolled_labels = tf.roll(images, 1, 0), tf.roll(one_hot, 1, 0)

    def mixup():
        lam = _beta(0.2)
        return (lam * images + (1 - lam) * rolled_images,
                lam * one_hot + (1 - lam) * rolled_labels)

    def cutmix():
        lam = _beta(1.0)
        h, w = tf.shape(images)[1], tf.shape(images)[2]
        rx = tf.random.uniform([], 0, w, tf.int32)
        ry = tf.random.uniform([], 0, h, tf.int32)
        r = 0.5 * tf.sqrt(1.0 - lam)
        rw = tf.cast(r * tf.cast(w, tf.float32), tf.int32)
        rh = tf.cast(r * tf.cast(h, tf.float32), tf.int32)
        x1, y1 = tf.maximum(rx - rw, 0), tf.maximum(ry - rh, 0)
        x2, y2 = tf.minimum(rx + rw, w), tf.minimum(ry + rh, h)
        rows, cols = tf.range(h)[:, None, None], tf.range(w)[None, :, None]
        inside = (rows >= y1) & (rows < y2) & (cols >= x1) & (cols < x2)
        mixed = tf.where(inside[None], rolled_images, images)
        lam = 1.0 - tf.cast((x2 - x1) * (y2 - y1), tf.float32) / tf.cast(w * h, tf.float32)
        return mixed, lam * one_hot + (1 - lam) * rolled_labels

    return tf.cond(tf.random.uniform([]) < 0.5, mixup, cutmix)
