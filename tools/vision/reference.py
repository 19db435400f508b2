#!/usr/bin/python3
"""torchvision/PIL reference outputs for coload's vision tests.

Usage: reference.py COMMANDS_FILE

Each line of COMMANDS_FILE is one command; outputs go to the paths the commands name, as raw
bytes (uint8 RGB, HWC) or raw float32 (CHW), or text for `params`. One process serves a whole
test, because importing torch takes about a second.

  decode IN OUT                         PIL: Image.open(IN).convert('RGB'), raw bytes
  encode IN W H MODE FORMAT OUT [K=V..] PIL: Image.frombytes(MODE, (W, H), IN's bytes), saved
                                        as FORMAT with options K=V (ints where they parse;
                                        orientation=N sets the TIFF Orientation tag)
  resized_crop IN TOP LEFT H W SIZE OUT F.resized_crop(img, TOP, LEFT, H, W, [SIZE, SIZE])
  params SEED0 SEED1 H W OUT            for each seed: torch.manual_seed(seed);
                                        RandomResizedCrop.get_params -> "top left h w" lines
  params_fallback SEED H W OUT          get_params with scale (2, 3): always the fallback
  train IN SEED SIZE OUT                torch.manual_seed(SEED); the ImageNet train transform
  eval IN OUT                           the ImageNet eval transform (Resize 256, CenterCrop 224)
  draws SEED0 SEED1 B C S H OUT         per seed: ColorJitter, GaussianBlur and RandomErasing
                                        get_params after torch.manual_seed, one line each
  batch_draws SEED0 SEED1 H W OUT       per seed: RandomChoice([MixUp(0.2), CutMix(1.0)])'s
                                        draws, with transforms.v2's calls
  augment_op IN H W NAME MAG INTERP FILL OUT
                                        autoaugment._apply_op on the raw uint8 HWC image IN
                                        (H x W), tensor path; FILL: none or F0,F1,F2; raw out
  policy_draws KIND SEED0 SEED1 H W OUT [ARGS]
                                        per seed: the (op, magnitude) pairs KIND's forward
                                        (trivial, rand NUM_OPS MAGNITUDE, auto) passes to
                                        _apply_op after torch.manual_seed, one line each
  warp_draws SEED0 SEED1 H W OUT        per seed: RandomRotation.get_params((-30, 45)), then
                                        RandomAffine.get_params((-20, 10), (0.1, 0.2), (0.8, 1.2),
                                        (-5, 5, -3, 8), [W, H]), one line each
  perspective_forward IN H W SEED0 SEED1 DIST P INTERP FILL OUT DRAWS
                                        per seed: torch.manual_seed(seed), then
                                        RandomPerspective(DIST, P, INTERP, FILL) on the centre
                                        H x W crop's uint8 tensor (outputs one after another,
                                        raw HWC; DRAWS: "applied x y x y x y x y" per seed)
  augmix_forward IN H W SEED0 SEED1 SEV WIDTH DEPTH ALPHA ALL INTERP FILL OUT DRAWS
                                        per seed: torch.manual_seed(seed), then AugMix on the
                                        centre crop's uint8 tensor (raw HWC outputs; DRAWS: the
                                        weights, the depths and the ops _apply_op was given)
  arithmetic W H M0 .. M5 GRID INFO     the float32 affine grid torchvision's F.affine samples
                                        for the 2 x 3 matrix M (v2's _affine_grid, or 0.14's
                                        _gen_affine_grid), raw [H, W, 2]; INFO: "TORCH
                                        TORCHVISION" versions (the tests follow this torch's
                                        grid arithmetic and this torchvision's perspective
                                        solve when it is not the torch coload links)
  recipe IN OPS OUT                     a recipe's ops with coload's draws (OPS: one op a line),
                                        geometry on the PIL image, the rest through the tensor
                                        functional API; raw float32 CHW (uint8 values when OPS
                                        has no to_float)

Runs under any torchvision from 0.14 (Debian's, /usr/bin/python3) to 0.29 (PyPI): where
torchvision has transforms.v2 (0.16 and later) the ops run through transforms.v2.functional
(train and eval through v2's transforms), which is what current torchvision runs; 0.14 runs its
classic functional API. The draws (params, draws, policy_draws, warp_draws) are the classic
transforms' get_params on any version: coload draws as those do. The tests choose the
interpreter with COLOAD_REFERENCE_PYTHON (default /usr/bin/python3).

Exits 77 (the "skipped" status of test harnesses) when torch or torchvision is missing.
"""
import math
import sys

try:
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.autoaugment as AA
    from PIL import Image
except ImportError as e:  # pragma: no cover
    print(f"reference.py: {e}", file=sys.stderr)
    sys.exit(77)
try:  # torchvision 0.16 and later: the ops as current torchvision runs them
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0.15-0.16's "v2 is in beta" warning
        import torchvision.transforms.v2 as V2
        import torchvision.transforms.v2.functional as F2
    if not hasattr(F2, "to_dtype"):  # 0.15's beta v2 lacks it: use the classic API there
        V2 = F2 = None
except ImportError:
    V2 = F2 = None

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


def adjust_hue(t, factor):
    """F.adjust_hue as torchvision 0.15 and later run it on uint8: converted to float with
    scale, shifted, converted back with scale (x 255.999, truncated); transforms.v2's does
    exactly this. torchvision 0.14's own uint8 path converted back with a plain x 255; its
    float path is the same arithmetic."""
    if F2 is not None:
        return F2.adjust_hue(t, factor)
    if t.dtype != torch.uint8:
        return F.adjust_hue(t, factor)
    hue = F.adjust_hue(F.convert_image_dtype(t, torch.float32), factor)
    return F.convert_image_dtype(hue, torch.uint8)


class ClassicOps:
    """The tensor ops by the classic functional API (torchvision 0.14, or no v2)."""
    hflip, vflip, erase, rotate, affine, normalize = (F.hflip, F.vflip, F.erase, F.rotate,
                                                      F.affine, F.normalize)
    adjust_brightness, adjust_contrast = F.adjust_brightness, F.adjust_contrast
    adjust_saturation, gaussian_blur, pil_to_tensor = (F.adjust_saturation, F.gaussian_blur,
                                                       F.pil_to_tensor)
    adjust_hue = adjust_hue

    @staticmethod
    def gray3(t):
        return F.rgb_to_grayscale(t, num_output_channels=3)

    @staticmethod
    def scale_to_float(t):
        return F.convert_image_dtype(t, torch.float32)


class V2Ops:
    """The same ops by transforms.v2.functional (a plain tensor is an image to it)."""
    if F2 is not None:
        hflip, vflip, erase, rotate, affine, normalize = (
            F2.horizontal_flip, F2.vertical_flip, F2.erase, F2.rotate, F2.affine, F2.normalize)
        adjust_brightness, adjust_contrast = F2.adjust_brightness, F2.adjust_contrast
        adjust_saturation, gaussian_blur, pil_to_tensor = (F2.adjust_saturation,
                                                           F2.gaussian_blur, F2.pil_to_tensor)
        adjust_hue = F2.adjust_hue

        @staticmethod
        def gray3(t):
            return F2.rgb_to_grayscale(t, num_output_channels=3)

        @staticmethod
        def scale_to_float(t):
            # NOTE: ToTensor's and 0.14's convert_image_dtype's v / 255, which 0.29's ToTensor
            # still computes and coload's ToTensor follows. transforms.v2's ToDtype(scale=True)
            # multiplies by 1/255 instead (one float32 step apart in about 40% of values):
            # `to_float v2`, which coload's ToDtype(float32, scale) follows.
            return t.to(torch.float32).div(255)


OPS = V2Ops if F2 is not None else ClassicOps
# The geometry on PIL images: v2's functional where torchvision has it (its PIL kernels).
GEO = F2 if F2 is not None else F


def apply_augment(t, v):
    """`augment NAME MAG INTERP FILL`: autoaugment._apply_op on the uint8 tensor t, or where
    torchvision has transforms.v2 the transforms.v2.functional calls its policies make for NAME
    (_AutoAugmentBase._apply_image_or_video_transform), given the classic magnitude: Solarize's
    threshold in pixel values, where v2's policies pass a fraction of the maximum."""
    name, mag, interp, fill = v[0], float(v[1]), v[2], v[3]
    mode = {"nearest": T.InterpolationMode.NEAREST, "bilinear": T.InterpolationMode.BILINEAR}[interp]
    fill = None if fill == "none" else [float(x) for x in fill.split(",")]
    if F2 is None:
        return AA._apply_op(t, name, mag, interpolation=mode, fill=fill)
    warp = {"interpolation": mode, "fill": fill}
    shear = math.degrees(math.atan(mag))
    calls = {
        "Identity": lambda: t,
        "ShearX": lambda: F2.affine(t, 0.0, [0, 0], 1.0, [shear, 0.0], center=[0, 0], **warp),
        "ShearY": lambda: F2.affine(t, 0.0, [0, 0], 1.0, [0.0, shear], center=[0, 0], **warp),
        "TranslateX": lambda: F2.affine(t, 0.0, [int(mag), 0], 1.0, [0.0, 0.0], **warp),
        "TranslateY": lambda: F2.affine(t, 0.0, [0, int(mag)], 1.0, [0.0, 0.0], **warp),
        "Rotate": lambda: F2.rotate(t, mag, **warp),
        "Brightness": lambda: F2.adjust_brightness(t, 1.0 + mag),
        "Color": lambda: F2.adjust_saturation(t, 1.0 + mag),
        "Contrast": lambda: F2.adjust_contrast(t, 1.0 + mag),
        "Sharpness": lambda: F2.adjust_sharpness(t, 1.0 + mag),
        "Posterize": lambda: F2.posterize(t, int(mag)),
        "Solarize": lambda: F2.solarize(t, mag),
        "AutoContrast": lambda: F2.autocontrast(t),
        "Equalize": lambda: F2.equalize(t),
        "Invert": lambda: F2.invert(t),
    }
    return calls[name]()


def policy_draws(kind, seeds, h, w, extra):
    """What each policy's forward passes to _apply_op, recorded by wrapping _apply_op: the
    policies' own draws, on this torch's generator."""
    if kind == "trivial":
        policy = T.TrivialAugmentWide()
    elif kind == "rand":
        policy = T.RandAugment(num_ops=int(extra[0]), magnitude=int(extra[1]))
    else:
        policy = T.AutoAugment(T.AutoAugmentPolicy.IMAGENET)
    calls = []
    real = AA._apply_op

    def record(img, op_name, magnitude, interpolation, fill):
        calls.append(f"{op_name} {magnitude!r}")
        return img

    AA._apply_op = record
    rows = []
    try:
        img = torch.zeros((3, h, w), dtype=torch.uint8)
        for seed in seeds:
            torch.manual_seed(seed)
            calls.clear()
            policy(img)
            rows.append(" ".join(calls) + "\n")
    finally:
        AA._apply_op = real
    return "".join(rows)


def run_recipe(img, ops_path):
    """Applies the ops of OPS_PATH: geometry on the PIL image (PIL's antialiased bilinear, as
    coload's resampling matches), then everything else on its uint8 tensor through
    torchvision.transforms.functional's tensor path (transforms.v2.functional's where torchvision
    has it), which is what torchvision runs for tensor images (and what coload's uint8 ops
    reproduce)."""
    bilinear = T.InterpolationMode.BILINEAR
    t = None
    with open(ops_path) as f:
        ops = [line.split() for line in f if line.strip()]
    for name, *v in ops:
        if name == "resized_crop":
            top, left, h, w, oh, ow = map(int, v)
            img = GEO.resized_crop(img, top, left, h, w, [oh, ow], interpolation=bilinear)
        elif name == "resize":
            img = GEO.resize(img, [int(x) for x in v], interpolation=bilinear)
        elif name == "pad_crop":
            # pad_crop LEFT TOP RIGHT BOTTOM MODE F0 F1 F2 TOP LEFT H W: F.pad on the PIL image
            # (a per-channel fill), then F.crop.
            pad = [int(x) for x in v[:4]]
            fill = tuple(int(float(x)) for x in v[5:8])
            img = GEO.pad(img, pad, fill=fill, padding_mode=v[4])
            img = GEO.crop(img, *[int(x) for x in v[8:12]])
        elif name == "center_crop":
            img = GEO.center_crop(img, [int(x) for x in v])
        else:
            if t is None:
                t = OPS.pil_to_tensor(img)
            if name == "hflip":
                t = OPS.hflip(t)
            elif name == "vflip":
                t = OPS.vflip(t)
            elif name == "gray3":
                t = OPS.gray3(t)
            elif name == "to_float":
                if v[0] == "v2":  # ToDtype(float32, scale=True): v2's times 1/255, any version
                    t = t.to(torch.float32).mul_(1.0 / 255)
                else:  # ToTensor (1): divided by 255; ToDtype without scale (0)
                    t = OPS.scale_to_float(t) if v[0] == "1" else t.to(torch.float32)
            elif name == "jitter":
                order, factors = [int(x) for x in v[:4]], [float(x) for x in v[4:]]
                adjust = [OPS.adjust_brightness, OPS.adjust_contrast, OPS.adjust_saturation,
                          OPS.adjust_hue]
                for fn in order:
                    if factors[fn] == factors[fn]:  # not NaN: this adjustment was drawn
                        t = adjust[fn](t, factors[fn])
            elif name == "blur":
                kx, ky, sigma = int(v[0]), int(v[1]), float(v[2])
                t = OPS.gaussian_blur(t, [kx, ky], [sigma, sigma])
            elif name == "erase":
                i, j, h, w = map(int, v[:4])
                value = torch.tensor([float(x) for x in v[4:]])[:, None, None]
                t = OPS.erase(t, i, j, h, w, value)
            elif name == "augment":
                t = apply_augment(t, v)
            elif name == "warp":
                # warp rotate|affine ANGLE TX TY SCALE SHX SHY INTERP F0,F1,F2 CX,CY|none
                angle, tx, ty, scale, shx, shy = map(float, v[1:7])
                mode = {"nearest": T.InterpolationMode.NEAREST,
                        "bilinear": T.InterpolationMode.BILINEAR}[v[7]]
                fill = [float(x) for x in v[8].split(",")]
                center = None if v[9] == "none" else [float(x) for x in v[9].split(",")]
                if v[0] == "rotate":
                    t = OPS.rotate(t, angle, interpolation=mode, center=center, fill=fill)
                else:
                    t = OPS.affine(t, angle, [int(tx), int(ty)], scale, [shx, shy],
                                   interpolation=mode, fill=fill, center=center)
            elif name == "normalize":
                vals = [float(x) for x in v]
                t = OPS.normalize(t, vals[:3], vals[3:])
            else:
                raise ValueError(f"unknown recipe op {name!r}")
    return OPS.pil_to_tensor(img) if t is None else t


def main():
    with open(sys.argv[1]) as f:
        lines = [line.split() for line in f if line.strip()]
    for cmd in lines:
        op, args = cmd[0], cmd[1:]
        if op == "decode":
            write(args[1], load(args[0]).tobytes())
        elif op == "encode":
            with open(args[0], "rb") as f:
                img = Image.frombytes(args[3], (int(args[1]), int(args[2])), f.read())
            options = {}
            for kv in args[6:]:
                key, val = kv.split("=", 1)
                options[key] = int(val) if val.lstrip("-").isdigit() else val
            if "orientation" in options:
                options["tiffinfo"] = {274: options.pop("orientation")}
            img.save(args[5], args[4], **options)
        elif op == "resized_crop":
            top, left, h, w, size = map(int, args[1:6])
            img = GEO.resized_crop(load(args[0]), top, left, h, w, [size, size],
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
            if V2 is not None:  # v2's draws and resampling (antialias is on for PIL); ToTensor
                transform = V2.Compose([V2.RandomResizedCrop(size), V2.RandomHorizontalFlip(),
                                        T.ToTensor(), V2.Normalize(MEAN, STD)])
            else:
                transform = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                                       T.ToTensor(), T.Normalize(MEAN, STD)])
            img = load(args[0])
            torch.manual_seed(seed)
            write(args[3], tensor_bytes(transform(img)))
        elif op == "eval":
            if V2 is not None:
                transform = V2.Compose([V2.Resize(256), V2.CenterCrop(224), T.ToTensor(),
                                        V2.Normalize(MEAN, STD)])
            else:
                transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                                       T.Normalize(MEAN, STD)])
            write(args[1], tensor_bytes(transform(load(args[0]))))
        elif op == "draws":
            # draws SEED0 SEED1 B C S H OUT: per seed, after torch.manual_seed(seed),
            # ColorJitter(B, C, S, H).get_params, then GaussianBlur(3).get_params(0.1, 2.0),
            # then RandomErasing.get_params on a 3 x 64 x 48 image ("none" where nothing fits).
            seeds = range(int(args[0]), int(args[1]))
            jitter = T.ColorJitter(*[float(x) for x in args[2:6]])
            rows = []
            for seed in seeds:
                torch.manual_seed(seed)
                fn_idx, *factors = T.ColorJitter.get_params(
                    jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
                sigma = T.GaussianBlur.get_params(0.1, 2.0)
                i, j, h, w, _ = T.RandomErasing.get_params(
                    torch.empty(3, 64, 48), scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0.0])
                box = "none" if (h, w) == (64, 48) else f"{i} {j} {h} {w}"
                f = " ".join("nan" if x is None else repr(float(x)) for x in factors)
                rows.append(f"{' '.join(str(int(k)) for k in fn_idx)} {f} {sigma!r} {box}\n")
            write(args[6], "".join(rows).encode())
        elif op == "batch_draws":
            # batch_draws SEED0 SEED1 H W OUT: per seed, after torch.manual_seed(seed), what
            # RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)]) draws, as torchvision 0.16+
            # (transforms.v2) draws it: "op lam x1 y1 x2 y2" (torchvision 0.14 has no MixUp or
            # CutMix; these are v2's calls, made on this torch).
            seeds = range(int(args[0]), int(args[1]))
            H, W = int(args[2]), int(args[3])
            rows = []
            for seed in seeds:
                torch.manual_seed(seed)
                idx = int(torch.multinomial(torch.tensor([0.5, 0.5]), 1))
                alpha = [0.2, 1.0][idx]
                dist = torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha]))
                lam = float(dist.sample(()))
                x1 = y1 = x2 = y2 = 0
                if idx == 1:
                    r_x = torch.randint(W, size=(1,))
                    r_y = torch.randint(H, size=(1,))
                    r = 0.5 * math.sqrt(1.0 - lam)
                    r_w_half, r_h_half = int(r * W), int(r * H)
                    x1 = int(torch.clamp(r_x - r_w_half, min=0))
                    y1 = int(torch.clamp(r_y - r_h_half, min=0))
                    x2 = int(torch.clamp(r_x + r_w_half, max=W))
                    y2 = int(torch.clamp(r_y + r_h_half, max=H))
                    lam = float(1.0 - (x2 - x1) * (y2 - y1) / (W * H))
                rows.append(f"{idx} {lam!r} {x1} {y1} {x2} {y2}\n")
            write(args[4], "".join(rows).encode())
        elif op == "augment_op":
            h, w = int(args[1]), int(args[2])
            with open(args[0], "rb") as f:
                raw = f.read()
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(h, w, 3).permute(2, 0, 1)
            t = apply_augment(t.contiguous(), args[3:7])
            write(args[7], t.permute(1, 2, 0).contiguous().numpy().tobytes())
        elif op == "policy_draws":
            seeds = range(int(args[1]), int(args[2]))
            write(args[5], policy_draws(args[0], seeds, int(args[3]), int(args[4]), args[6:]).encode())
        elif op == "warp_draws":
            rows = []
            for seed in range(int(args[0]), int(args[1])):
                torch.manual_seed(seed)
                angle = T.RandomRotation.get_params([-30.0, 45.0])
                a, (tx, ty), sc, (shx, shy) = T.RandomAffine.get_params(
                    [-20.0, 10.0], [0.1, 0.2], [0.8, 1.2], [-5.0, 5.0, -3.0, 8.0],
                    [int(args[3]), int(args[2])])
                rows.append(f"{angle!r} {a!r} {tx} {ty} {sc!r} {shx!r} {shy!r}\n")
            write(args[4], "".join(rows).encode())
        elif op == "recipe":
            write(args[2], tensor_bytes(run_recipe(load(args[0]), args[1]).to(torch.float32)))
        elif op in EXTRA_COMMANDS:
            EXTRA_COMMANDS[op](args)
        else:
            print(f"reference.py: unknown command {op!r}", file=sys.stderr)
            return 2
    return 0


def centre_crop_tensor(path, h, w):
    """The centre h x w crop of IN as a uint8 CHW tensor (what a recipe's leading CenterCrop
    hands its ops)."""
    return F.pil_to_tensor(F.center_crop(load(path), [h, w]))


def interpolation_of(name):
    return {"nearest": T.InterpolationMode.NEAREST, "bilinear": T.InterpolationMode.BILINEAR}[name]


def perspective_forward(args):
    h, w, seed0, seed1 = map(int, args[1:5])
    dist, p = float(args[5]), float(args[6])
    fill = [float(x) for x in args[8].split(",")]
    t = centre_crop_tensor(args[0], h, w)
    transform = T.RandomPerspective(dist, p, interpolation_of(args[7]), fill)
    outs, rows = [], []
    for seed in range(seed0, seed1):
        torch.manual_seed(seed)
        outs.append(transform(t).permute(1, 2, 0).contiguous().numpy().tobytes())
        # The same draws again, as forward makes them: rand(1) < p, then get_params.
        torch.manual_seed(seed)
        applied = bool(torch.rand(1) < p)
        corners = ""
        if applied:
            _, end = T.RandomPerspective.get_params(w, h, dist)
            corners = " " + " ".join(str(v) for point in end for v in point)
        rows.append(f"{int(applied)}{corners}\n")
    write(args[9], b"".join(outs))
    write(args[10], "".join(rows).encode())


def augmix_forward(args):
    h, w, seed0, seed1 = map(int, args[1:5])
    severity, width, depth = int(args[5]), int(args[6]), int(args[7])
    alpha, all_ops = float(args[8]), args[9] == "1"
    fill = None if args[11] == "none" else [float(x) for x in args[11].split(",")]
    t = centre_crop_tensor(args[0], h, w)
    dirichlet = []

    class Recorded(T.AugMix):
        def _sample_dirichlet(self, params):
            out = super()._sample_dirichlet(params)
            dirichlet.append(out)
            return out

    transform = Recorded(severity, width, depth, alpha, all_ops, interpolation_of(args[10]), fill)
    calls = []
    real = AA._apply_op

    def record(img, op_name, magnitude, interpolation, fill):
        calls.append(f"{op_name} {magnitude!r}")
        return real(img, op_name, magnitude, interpolation, fill)

    outs, rows = [], []
    AA._apply_op = record
    try:
        for seed in range(seed0, seed1):
            dirichlet.clear()
            calls.clear()
            torch.manual_seed(seed)
            outs.append(transform(t).permute(1, 2, 0).contiguous().numpy().tobytes())
            m, d = dirichlet
            weights = [float(m[0, 0])] + [float(x) for x in (d * m[:, 1].view(1, -1))[0]]
            rows.append(" ".join(repr(x) for x in weights) + " | " + " ".join(calls) + "\n")
    finally:
        AA._apply_op = real
    write(args[12], b"".join(outs))
    write(args[13], "".join(rows).encode())


def arithmetic(args):
    w, h = int(args[0]), int(args[1])
    theta = torch.tensor([float(x) for x in args[2:8]], dtype=torch.float).reshape(1, 2, 3)
    if F2 is not None:
        from torchvision.transforms.v2.functional import _geometry as G
        grid = G._affine_grid(theta, w=w, h=h, ow=w, oh=h)
    else:
        from torchvision.transforms import functional_tensor as FT
        grid = FT._gen_affine_grid(theta, w=w, h=h, ow=w, oh=h)
    write(args[8], grid.contiguous().numpy().astype("<f4").tobytes())
    import torchvision
    write(args[9], f"{torch.__version__} {torchvision.__version__}\n".encode())


EXTRA_COMMANDS = {
    "arithmetic": arithmetic,
    "perspective_forward": perspective_forward,
    "augmix_forward": augmix_forward,
}


if __name__ == "__main__":
    sys.exit(main())
