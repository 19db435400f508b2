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
        else:
            print(f"reference.py: unknown command {op!r}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
