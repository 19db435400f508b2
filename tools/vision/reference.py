#!/usr/bin/python3
"""torchvision/PIL reference outputs for coload's vision tests.

Usage: reference.py COMMANDS_FILE

Each line of COMMANDS_FILE is one command; outputs go to the paths the commands name, as raw
bytes (uint8 RGB, HWC) or raw float32 (CHW), or text for `params`. One process serves a whole
test, because importing torch takes about a second.

  decode IN OUT                         PIL: Image.open(IN).convert('RGB'), raw bytes
  resized_crop IN TOP LEFT H W SIZE OUT F.resized_crop(img, TOP, LEFT, H, W, [SIZE, SIZE])
  params SEED0 SEED1 H W OUT            for each seed: torch.manual_seed(seed);
                                        RandomResizedCrop.get_params -> "top left h w" lines
  params_fallback SEED H W OUT          get_params with scale (2, 3): always the fallback
  train IN SEED SIZE OUT                torch.manual_seed(SEED); the ImageNet train transform
  eval IN OUT                           the ImageNet eval transform (Resize 256, CenterCrop 224)
  recipe IN OPS OUT                     a recipe's ops with coload's draws (OPS: one op a line),
                                        geometry on the PIL image, the rest through the tensor
                                        functional API; raw float32 CHW (uint8 values when OPS
                                        has no to_float)

Exits 77 (the "skipped" status of test harnesses) when torch or torchvision is missing.
"""
import sys

try:
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image
except ImportError as e:  # pragma: no cover
    print(f"reference.py: {e}", file=sys.stderr)
    sys.exit(77)

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def load(path):
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def tensor_bytes(t):
    return t.contiguous().numpy().astype("<f4").tobytes()


def run_recipe(img, ops_path):
    """Applies the ops of OPS_PATH: geometry on the PIL image (PIL's antialiased bilinear, as
    coload's resampling matches), then everything else on its uint8 tensor through
    torchvision.transforms.functional's tensor path, which is what torchvision runs for tensor
    images (and what coload's uint8 ops reproduce)."""
    bilinear = T.InterpolationMode.BILINEAR
    t = None
    with open(ops_path) as f:
        ops = [line.split() for line in f if line.strip()]
    for name, *v in ops:
        if name == "resized_crop":
            top, left, h, w, oh, ow = map(int, v)
            img = F.resized_crop(img, top, left, h, w, [oh, ow], interpolation=bilinear)
        elif name == "resize":
            img = F.resize(img, [int(x) for x in v], interpolation=bilinear)
        elif name == "center_crop":
            img = F.center_crop(img, [int(x) for x in v])
        else:
            if t is None:
                t = F.pil_to_tensor(img)
            if name == "hflip":
                t = F.hflip(t)
            elif name == "vflip":
                t = F.vflip(t)
            elif name == "gray3":
                t = F.rgb_to_grayscale(t, num_output_channels=3)
            elif name == "to_float":
                t = F.convert_image_dtype(t, torch.float32) if v[0] == "1" else t.to(torch.float32)
            elif name == "normalize":
                vals = [float(x) for x in v]
                t = F.normalize(t, vals[:3], vals[3:])
            else:
                raise ValueError(f"unknown recipe op {name!r}")
    return F.pil_to_tensor(img) if t is None else t


def main():
    with open(sys.argv[1]) as f:
        lines = [line.split() for line in f if line.strip()]
    for cmd in lines:
        op, args = cmd[0], cmd[1:]
        if op == "decode":
            write(args[1], load(args[0]).tobytes())
        elif op == "resized_crop":
            top, left, h, w, size = map(int, args[1:6])
            img = F.resized_crop(load(args[0]), top, left, h, w, [size, size],
                                 interpolation=T.InterpolationMode.BILINEAR)
            write(args[6], img.tobytes())
        elif op in ("params", "params_fallback"):
            if op == "params":
                seeds = range(int(args[0]), int(args[1]))
                h, w, out = int(args[2]), int(args[3]), args[4]
                scale = (0.08, 1.0)
            else:
                seeds = [int(args[0])]
                h, w, out = int(args[1]), int(args[2]), args[3]
                scale = (2.0, 3.0)
            dummy = torch.empty((3, h, w), dtype=torch.uint8)
            rows = []
            for s in seeds:
                torch.manual_seed(s)
                i, j, hh, ww = T.RandomResizedCrop.get_params(dummy, scale, (3.0 / 4.0, 4.0 / 3.0))
                rows.append(f"{i} {j} {hh} {ww}\n")
            write(out, "".join(rows).encode())
        elif op == "train":
            seed, size = int(args[1]), int(args[2])
            transform = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                                   T.ToTensor(), T.Normalize(MEAN, STD)])
            img = load(args[0])
            torch.manual_seed(seed)
            write(args[3], tensor_bytes(transform(img)))
        elif op == "eval":
            transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                                   T.Normalize(MEAN, STD)])
            write(args[1], tensor_bytes(transform(load(args[0]))))
        elif op == "recipe":
            write(args[2], tensor_bytes(run_recipe(load(args[0]), args[1]).to(torch.float32)))
        else:
            print(f"reference.py: unknown command {op!r}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
