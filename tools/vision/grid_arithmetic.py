#!/usr/bin/python3
"""Which float32 arithmetic this torch's affine and perspective grids take (issue 31).

torchvision's F.affine and F.perspective sample a grid made by one bmm of the base grid
[pixels, 3] by theta [3, 2]; nearest sampling rounds it, so coload must round as that bmm does.
This compares torchvision's own grids (v2's `_affine_grid` / `_perspective_grid` where
torchvision has transforms.v2, else 0.14's) with the two forms coload computes
(lib/vision/geometry.cpp, GridForm):

  plain  (x * t0 + y * t1) + t2, each step rounded (torch's own loop; a generic BLAS)
  fused  fma(y, t1, x * t0) + t2 (MKL's sgemm on a CPU with FMA: the torch 2.x wheels)

over random matrices and sizes on both sides of torch's 400-product threshold (66 pixels), and
prints how many values each form misses. Environment variables reach torch as usual, so
`ATEN_CPU_CAPABILITY=default tools/vision/grid_arithmetic.py` or `MKL_CBWR=COMPATIBLE ...`
show what they change.

usage: PYTHON tools/vision/grid_arithmetic.py [--cases N]
"""
import argparse
import ctypes
import math
import random

import numpy as np
import torch
import torchvision

try:
    from torchvision.transforms.v2.functional import _geometry as G
    affine_grid, perspective_grid = G._affine_grid, G._perspective_grid
except ImportError:
    from torchvision.transforms import functional_tensor as G
    affine_grid, perspective_grid = G._gen_affine_grid, G._perspective_grid

_fmaf = ctypes.CDLL("libm.so.6").fmaf
_fmaf.restype = ctypes.c_float
_fmaf.argtypes = [ctypes.c_float] * 3
fma = np.vectorize(lambda a, b, c: _fmaf(a, b, c), otypes=[np.float32])
f32 = np.float32


def column(x, y, t0, t1, t2, fused):
    return fma(y, t1, x * t0) + t2 if fused else (x * t0 + y * t1) + t2


def ours_affine(theta, w, h, fused):
    t = np.array(theta, dtype=f32)
    a, b = t[:3] / f32(0.5 * w), t[3:] / f32(0.5 * h)
    x = (np.arange(w) + f32(0.5 - w * 0.5)).astype(f32)[None, :].repeat(h, 0)
    y = (np.arange(h) + f32(0.5 - h * 0.5)).astype(f32)[:, None].repeat(w, 1)
    return np.stack([column(x, y, *a, fused), column(x, y, *b, fused)], -1)


def ours_perspective(c, w, h, fused):
    c = np.array(c, dtype=f32)
    a, b = c[:3] / f32(0.5 * w), c[3:6] / f32(0.5 * h)
    x = (np.arange(w) + f32(0.5)).astype(f32)[None, :].repeat(h, 0)
    y = (np.arange(h) + f32(0.5)).astype(f32)[:, None].repeat(w, 1)
    den = column(x, y, c[6], c[7], f32(1), fused)
    return np.stack([column(x, y, *a, fused) / den - f32(1),
                     column(x, y, *b, fused) / den - f32(1)], -1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=60)
    args = parser.parse_args()
    random.seed(31)
    torch.set_num_threads(1)
    missed = {}
    for k in range(args.cases):
        h, w = random.choice([(6, 11), (8, 8), (1, 67), (40, 48), (33, 17), (64, 96)])
        shear = math.degrees(math.atan(random.uniform(-0.3, 0.3)))
        m = torchvision.transforms.functional._get_inverse_affine_matrix(
            [0.0, 0.0], random.uniform(-30, 30), [random.randint(-5, 5), 0],
            random.uniform(0.8, 1.2), [shear, 0.0])
        theirs = affine_grid(torch.tensor(m, dtype=torch.float).reshape(1, 2, 3), w=w, h=h,
                             ow=w, oh=h).numpy().reshape(h, w, 2)
        c = [float(f32(v)) for v in (1 + random.uniform(-.2, .2), random.uniform(-.2, .2),
                                     random.uniform(-5, 5), random.uniform(-.2, .2),
                                     1 + random.uniform(-.2, .2), random.uniform(-5, 5),
                                     random.uniform(-2e-3, 2e-3), random.uniform(-2e-3, 2e-3))]
        theirs_p = perspective_grid(c, ow=w, oh=h, dtype=torch.float,
                                    device=torch.device("cpu")).numpy().reshape(h, w, 2)
        size = "66 pixels or fewer" if h * w <= 66 else "more than 66 pixels"
        for fused in (False, True):
            for kind, got, want in (("affine", ours_affine(m, w, h, fused), theirs),
                                    ("perspective", ours_perspective(c, w, h, fused), theirs_p)):
                key = (kind, size, "fused" if fused else "plain")
                n = missed.setdefault(key, [0, 0])
                n[0] += int((got != want).sum())
                n[1] += got.size
    cpu = getattr(torch.backends, "cpu", None)  # torch 2.x
    capability = cpu.get_cpu_capability() if cpu is not None else "?"
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"CPU capability {capability}")
    for (kind, size, form), (n, total) in sorted(missed.items()):
        print(f"  {kind:11s} {size:19s} {form}: {n:6d} of {total} values differ")


if __name__ == "__main__":
    main()
