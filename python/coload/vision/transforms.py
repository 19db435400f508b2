"""coload.vision.transforms: a training recipe composed of torchvision's ops, run natively.

    from coload.vision import transforms as T
    recipe = T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                        T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                        T.RandomErasing(0.1),
                        T.RandomChoice([T.MixUp(alpha=0.2), T.CutMix(alpha=1.0)])])
    dataset = coload.vision.ImageFolder(root, recipe=recipe)

Each op is spelled as torchvision.transforms.v2's (the same class names, parameter names and
defaults) and stands for coload's C++ op of that name (vision::Recipe, include/coload/vision/
recipe.hpp): the ops are not callable from Python; `Compose` (or `coload.vision.Recipe`) hands
them to the fused pipeline, which decodes, augments and collates on its worker threads without
the GIL, and checks them when it is built (ValueError naming the op, with torchvision's wording
where torchvision has one). What a parameter's Python type cannot be is refused here (TypeError);
what coload's recipe does not run yet is refused with a ValueError that says so.

`ToImage()` and `PILToTensor()` are accepted and do nothing (the pipeline decodes to an image
already), so a v2 pipeline's list carries over unchanged. `Custom(fn)` and `CustomBatch(fn)` run
a Python callable as a user op (see their docstrings): on the worker that runs the sample, with
the GIL taken for the call, so they serialise the workers while they run.
"""
import torch

from .. import _C
from ._params import (_degrees, _fill, _interpolation, _is_number, _is_seq, _jitter,
                      _optional_pair, _pair, _probability, _size)

__all__ = [
    "AugMix", "AutoAugment", "AutoAugmentPolicy", "CenterCrop", "ColorJitter", "Compose",
    "CutMix", "Custom", "CustomBatch", "GaussianBlur", "Grayscale", "MixUp", "Normalize",
    "PILToTensor", "RandAugment", "RandomAffine", "RandomChoice", "RandomCrop", "RandomErasing",
    "RandomGrayscale", "RandomHorizontalFlip", "RandomPerspective", "RandomResizedCrop",
    "RandomRotation", "RandomVerticalFlip", "Recipe", "Resize", "ToDtype", "ToImage", "ToTensor",
    "TrivialAugmentWide",
]


class AutoAugmentPolicy:
    """torchvision's AutoAugmentPolicy names (coload's recipe runs IMAGENET)."""
    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


# ---- The ops ---------------------------------------------------------------------------------

class _Op:
    """One op of a recipe: `_spec()` is (the C++ op's name, its parameters as plain values)."""
    _name = None

    def _spec(self):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        raise TypeError(f"coload.vision.transforms.{type(self).__name__} is run by coload's "
                        "fused pipeline: compose it into a recipe (Compose([...])) and give it "
                        "to coload.vision.ImageFolder(recipe=...)")

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class RandomResizedCrop(_Op):
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation="bilinear", antialias=True):
        self.size, self.scale, self.ratio = size, scale, ratio
        self.interpolation, self.antialias = interpolation, antialias

    def _spec(self):
        op = "RandomResizedCrop"
        h, w = _size(op, self.size)
        _interpolation(op, self.interpolation, ("bilinear",))
        if self.antialias is not True:
            raise ValueError(f"{op}: antialias={self.antialias!r} is not supported in a recipe "
                             "(coload resamples antialiased, as torchvision's default)")
        if not _is_seq(self.scale):
            raise TypeError(f"{op}: Scale should be a sequence")
        if not _is_seq(self.ratio):
            raise TypeError(f"{op}: Ratio should be a sequence")
        return op, {"height": h, "width": w, "scale": _pair(op, self.scale, "scale"),
                    "ratio": _pair(op, self.ratio, "ratio")}


class Resize(_Op):
    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=True):
        self.size, self.interpolation = size, interpolation
        self.max_size, self.antialias = max_size, antialias

    def _spec(self):
        op = "Resize"
        if self.size is None or self.max_size is not None:
            raise ValueError(f"{op}: max_size is not supported in a recipe yet")
        _interpolation(op, self.interpolation, ("bilinear",))
        if self.antialias is not True:
            raise ValueError(f"{op}: antialias={self.antialias!r} is not supported in a recipe "
                             "(coload resamples antialiased, as torchvision's default)")
        if _is_seq(self.size) and len(self.size) == 2:
            if not all(_is_number(s) for s in self.size):
                raise TypeError(f"{op}: Size should be int or sequence. Got {self.size!r}")
            return op, {"size": int(self.size[0]), "width": int(self.size[1])}
        h, _ = _size(op, self.size)
        return op, {"size": h, "width": 0}


class CenterCrop(_Op):
    def __init__(self, size):
        self.size = size

    def _spec(self):
        h, w = _size("CenterCrop", self.size)
        return "CenterCrop", {"height": h, "width": w}


class RandomCrop(_Op):
    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size, self.padding, self.pad_if_needed = size, padding, pad_if_needed
        self.fill, self.padding_mode = fill, padding_mode

    def _spec(self):
        op = "RandomCrop"
        h, w = _size(op, self.size)
        pad = self.padding
        if pad is None:
            padding = [0, 0, 0, 0]
        elif _is_number(pad):
            padding = [int(pad)] * 4
        elif _is_seq(pad) and len(pad) in (1, 2, 4) and all(_is_number(v) for v in pad):
            # torchvision's order: [all], [left/right, top/bottom], [left, top, right, bottom].
            p = [int(v) for v in pad]
            padding = p * 4 if len(p) == 1 else (p * 2 if len(p) == 2 else p)
        elif _is_seq(pad):
            raise ValueError(f"{op}: Padding must be an int or a 1, 2, or 4 element tuple, not "
                             f"a {len(pad)} element tuple")
        else:
            raise TypeError(f"{op}: Got inappropriate padding arg")
        if self.padding_mode not in ("constant", "edge", "reflect", "symmetric"):
            raise ValueError(f"{op}: Padding mode should be either constant, edge, reflect or "
                             "symmetric")
        return op, {"height": h, "width": w, "padding": padding,
                    "pad_if_needed": bool(self.pad_if_needed),
                    "fill": _fill(op, self.fill, none_ok=False), "padding_mode": self.padding_mode}


class RandomHorizontalFlip(_Op):
    def __init__(self, p=0.5):
        self.p = p

    def _spec(self):
        return "RandomHorizontalFlip", {"p": _probability("RandomHorizontalFlip", self.p)}


class RandomVerticalFlip(_Op):
    def __init__(self, p=0.5):
        self.p = p

    def _spec(self):
        return "RandomVerticalFlip", {"p": _probability("RandomVerticalFlip", self.p)}


class Grayscale(_Op):
    def __init__(self, num_output_channels=1):
        self.num_output_channels = num_output_channels

    def _spec(self):
        return "Grayscale", {"num_output_channels": int(self.num_output_channels)}


class RandomGrayscale(_Op):
    def __init__(self, p=0.1):
        self.p = p

    def _spec(self):
        return "RandomGrayscale", {"p": _probability("RandomGrayscale", self.p)}


class ToTensor(_Op):
    """transforms.ToTensor(): to float, divided by 255."""

    def _spec(self):
        return "ToTensor", {}


class ToImage(_Op):
    """v2.ToImage(): nothing to do (the pipeline decodes to an image); left out of the recipe."""

    def _spec(self):
        return None


class PILToTensor(ToImage):
    """v2.PILToTensor(): nothing to do, as ToImage."""


class ToDtype(_Op):
    def __init__(self, dtype, scale=False):
        self.dtype, self.scale = dtype, scale

    def _spec(self):
        if isinstance(self.dtype, dict):
            raise TypeError("ToDtype: dtype as a dict (per tv_tensor type) is not supported in a "
                            "recipe; give the image's dtype (torch.float32)")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"ToDtype: dtype should be a torch.dtype, got {self.dtype!r}")
        return "ToDtype", {"dtype": str(self.dtype).replace("torch.", ""),
                           "scale": bool(self.scale)}


class Normalize(_Op):
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std, self.inplace = mean, std, inplace

    def _spec(self):
        values = {}
        for name, v in (("mean", self.mean), ("std", self.std)):
            if _is_number(v):
                v = [v]
            if not (_is_seq(v) or isinstance(v, torch.Tensor)):
                raise TypeError(f"Normalize: {name} should be a sequence of numbers, got {v!r}")
            values[name] = [float(x) for x in v]
        return "Normalize", values


class ColorJitter(_Op):
    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None):
        self.brightness, self.contrast = brightness, contrast
        self.saturation, self.hue = saturation, hue

    def _spec(self):
        return "ColorJitter", {"brightness": _jitter("brightness", self.brightness, 1),
                               "contrast": _jitter("contrast", self.contrast, 1),
                               "saturation": _jitter("saturation", self.saturation, 1),
                               "hue": _jitter("hue", self.hue, 0)}


class GaussianBlur(_Op):
    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        self.kernel_size, self.sigma = kernel_size, sigma

    def _spec(self):
        op = "GaussianBlur"
        k = self.kernel_size
        if _is_number(k):
            kx = ky = int(k)
        elif _is_seq(k) and len(k) in (1, 2) and all(_is_number(v) for v in k):
            kx, ky = int(k[0]), int(k[-1])  # torchvision's [x, y]
        else:
            raise ValueError(f"{op}: Kernel size should be a tuple/list of two integers")
        s = self.sigma
        if _is_number(s):
            if s <= 0:
                raise ValueError(f"{op}: If sigma is a single number, it must be positive.")
            sigma = [float(s), float(s)]
        elif _is_seq(s) and len(s) in (1, 2) and all(_is_number(v) for v in s):
            sigma = [float(s[0]), float(s[-1])]
        else:
            raise TypeError(f"{op}: sigma should be a single int or float or a list/tuple with "
                            "length 2 floats.")
        return op, {"kernel_x": kx, "kernel_y": ky, "sigma": sigma}


class RandomErasing(_Op):
    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0, inplace=False):
        self.p, self.scale, self.ratio, self.value, self.inplace = p, scale, ratio, value, inplace

    def _spec(self):
        op = "RandomErasing"
        v = self.value
        if isinstance(v, str):
            raise ValueError(f"{op}: value={v!r} (random values) is not supported in a recipe "
                             "yet; give a number or one per channel")
        if not (_is_number(v) or _is_seq(v)):
            raise TypeError(f"{op}: Argument value should be either a number or str or a "
                            "sequence")
        if not _is_seq(self.scale):
            raise TypeError(f"{op}: Scale should be a sequence")
        if not _is_seq(self.ratio):
            raise TypeError(f"{op}: Ratio should be a sequence")
        return op, {"p": _probability(op, self.p), "scale": _pair(op, self.scale, "scale"),
                    "ratio": _pair(op, self.ratio, "ratio"),
                    "value": [float(v)] if _is_number(v) else [float(x) for x in v]}


class _Mix(_Op):
    def __init__(self, *, alpha=1.0, num_classes=None, labels_getter="default"):
        self.alpha, self.num_classes, self.labels_getter = alpha, num_classes, labels_getter

    def _spec(self):
        op = type(self).__name__
        if self.labels_getter != "default":
            raise ValueError(f"{op}: labels_getter is not supported in a recipe (the pipeline's "
                             "labels are its batch's second tensor)")
        if not _is_number(self.alpha):
            raise TypeError(f"{op}: alpha should be a number, got {self.alpha!r}")
        classes = self.num_classes
        if classes is not None and not isinstance(classes, int):
            raise TypeError(f"{op}: num_classes should be an int or None, got {classes!r}")
        if classes is not None and classes < 1:
            raise ValueError(f"{op}: num_classes must be positive (or None for the pipeline's "
                             f"class count), got {classes}")
        # None: the folder's class count (the C++ op's 0).
        return op, {"alpha": float(self.alpha), "num_classes": classes or 0}


class MixUp(_Mix):
    """v2.MixUp(alpha, num_classes): num_classes None takes the folder's class count."""


class CutMix(_Mix):
    """v2.CutMix(alpha, num_classes): num_classes None takes the folder's class count."""


class RandomChoice(_Op):
    """v2.RandomChoice of MixUp and CutMix (the batch ops; others are not run per batch)."""

    def __init__(self, transforms, p=None):
        self.transforms, self.p = transforms, p

    def _spec(self):
        if not _is_seq(self.transforms):
            raise TypeError("RandomChoice: Argument transforms should be a sequence of callables")
        choices = []
        for t in self.transforms:
            if not isinstance(t, (MixUp, CutMix)):
                raise TypeError("RandomChoice: a recipe's RandomChoice chooses among MixUp and "
                                f"CutMix (per batch), got {t!r}")
            choices.append(t._spec())
        p = [] if self.p is None else [float(w) for w in self.p]
        return "RandomChoice", {"transforms": choices, "p": p}


class TrivialAugmentWide(_Op):
    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_magnitude_bins, self.interpolation, self.fill = (num_magnitude_bins,
                                                                  interpolation, fill)

    def _spec(self):
        op = "TrivialAugmentWide"
        return op, {"num_magnitude_bins": int(self.num_magnitude_bins),
                    "interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill)}


class RandAugment(_Op):
    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest",
                 fill=None):
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, num_magnitude_bins
        self.interpolation, self.fill = interpolation, fill

    def _spec(self):
        op = "RandAugment"
        return op, {"num_ops": int(self.num_ops), "magnitude": int(self.magnitude),
                    "num_magnitude_bins": int(self.num_magnitude_bins),
                    "interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill)}


class AutoAugment(_Op):
    def __init__(self, policy=AutoAugmentPolicy.IMAGENET, interpolation="nearest", fill=None):
        self.policy, self.interpolation, self.fill = policy, interpolation, fill

    def _spec(self):
        op = "AutoAugment"
        name = str(getattr(self.policy, "value", self.policy)).lower()
        if name != "imagenet":
            raise ValueError(f"{op}: policy {name!r} is not supported in a recipe yet (coload's "
                             "AutoAugment has IMAGENET's)")
        return op, {"interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill)}


class RandomRotation(_Op):
    def __init__(self, degrees, interpolation="nearest", expand=False, center=None, fill=0):
        self.degrees, self.interpolation, self.expand = degrees, interpolation, expand
        self.center, self.fill = center, fill

    def _spec(self):
        op = "RandomRotation"
        return op, {"degrees": _degrees(op, self.degrees),
                    "interpolation": _interpolation(op, self.interpolation),
                    "expand": bool(self.expand),
                    "center": _optional_pair(op, self.center, "center"),
                    "fill": _fill(op, self.fill)}


class RandomAffine(_Op):
    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest",
                 fill=0, center=None):
        self.degrees, self.translate, self.scale, self.shear = degrees, translate, scale, shear
        self.interpolation, self.fill, self.center = interpolation, fill, center

    def _spec(self):
        op = "RandomAffine"
        shear = self.shear
        if shear is None:
            shear = []
        elif _is_number(shear):
            shear = _degrees(op, shear, "shear")
        elif _is_seq(shear) and all(_is_number(v) for v in shear):
            shear = [float(v) for v in shear]  # 2 or 4 values: the builder checks the length
        else:
            raise TypeError(f"{op}: shear should be a number or a sequence, got {shear!r}")
        return op, {"degrees": _degrees(op, self.degrees),
                    "translate": _optional_pair(op, self.translate, "translate"),
                    "scale": _optional_pair(op, self.scale, "scale"), "shear": shear,
                    "interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill),
                    "center": _optional_pair(op, self.center, "center")}


class RandomPerspective(_Op):
    def __init__(self, distortion_scale=0.5, p=0.5, interpolation="bilinear", fill=0):
        self.distortion_scale, self.p = distortion_scale, p
        self.interpolation, self.fill = interpolation, fill

    def _spec(self):
        op = "RandomPerspective"
        if not _is_number(self.distortion_scale):
            raise TypeError(f"{op}: distortion_scale should be a number, got "
                            f"{self.distortion_scale!r}")
        return op, {"distortion_scale": float(self.distortion_scale),
                    "p": _probability(op, self.p),
                    "interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill)}


class AugMix(_Op):
    def __init__(self, severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True,
                 interpolation="bilinear", fill=None):
        self.severity, self.mixture_width, self.chain_depth = severity, mixture_width, chain_depth
        self.alpha, self.all_ops, self.interpolation, self.fill = (alpha, all_ops,
                                                                    interpolation, fill)

    def _spec(self):
        op = "AugMix"
        return op, {"severity": int(self.severity), "mixture_width": int(self.mixture_width),
                    "chain_depth": int(self.chain_depth), "alpha": float(self.alpha),
                    "all_ops": bool(self.all_ops),
                    "interpolation": _interpolation(op, self.interpolation),
                    "fill": _fill(op, self.fill)}


class Custom(_Op):
    """A Python callable as a user op: `fn(image, generator)`, where image is a copy of the
    sample (uint8 [3, H, W] before ToDtype/ToTensor; float32 [3, H, W] after Normalize) and
    generator a torch.Generator seeded from the sample's own stream (a function of the loader's
    seed, the epoch and the index only: the same whatever the workers). fn changes the image in
    place and returns None, or returns a tensor of the same shape and dtype. It runs on the
    worker that runs the sample with the GIL taken for the call (in a worker process with
    executor="processes"), so it is safe but serialises the workers while it runs; an exception
    fails the sample (a SampleError naming the index and the op)."""

    def __init__(self, fn, name=None):
        if not callable(fn):
            raise TypeError(f"Custom: fn should be callable, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def _spec(self):
        return "Custom", {"name": str(self.name), "fn": self.fn}


class CustomBatch(_Op):
    """A Python callable as a user batch op (with MixUp/CutMix, the recipe's tail):
    `fn(images, labels, generator)` on the collated batch (images float [N, 3, H, W], labels
    int64 [N] or a previous batch op's soft labels), returning None (changed in place) or
    (images, labels). Run with the GIL on the worker that made the batch."""

    def __init__(self, fn, name=None):
        if not callable(fn):
            raise TypeError(f"CustomBatch: fn should be callable, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def _spec(self):
        return "CustomBatch", {"name": str(self.name), "fn": self.fn}


# ---- The recipe ------------------------------------------------------------------------------

def _flatten(transforms, out):
    for t in transforms:
        if isinstance(t, Recipe):
            _flatten(t.transforms, out)
        elif isinstance(t, _Op):
            out.append(t)
        else:
            raise TypeError(f"Recipe: {t!r} is not an op of coload.vision.transforms (a "
                            "recipe runs natively; a Python callable goes in Custom(fn))")
    return out


class Recipe:
    """A composition of coload.vision.transforms' ops, built and checked at once by coload's
    C++ recipe: `ImageFolder(root, recipe=Recipe([...]))`. `dct_scaling` (default True): JPEGs
    decode at a reduced DCT scale where it covers the output; False decodes at full size, as
    torchvision does (its outputs are then torchvision's bit for bit where the ops are)."""

    def __init__(self, transforms, dct_scaling=True):
        if isinstance(transforms, _Op) or not isinstance(transforms, (list, tuple)):
            raise TypeError("Recipe: transforms should be a list of ops, got "
                            f"{type(transforms).__name__}")
        self.transforms = list(transforms)
        self.dct_scaling = bool(dct_scaling)
        ops = _flatten(self.transforms, [])
        specs, positions = [], []
        for i, op in enumerate(ops):
            spec = op._spec()
            if spec is not None:  # ToImage/PILToTensor: nothing to run
                specs.append(spec)
                positions.append(i)
        _mark_custom_kind(specs)
        try:
            self._native = _C.Recipe(specs, self.dct_scaling)
        except ValueError as e:
            raise ValueError(_renumber(str(e), positions)) from None

    @property
    def output_size(self):
        """(height, width) of every sample."""
        return self._native.output_height, self._native.output_width

    def __repr__(self):
        inner = ",\n    ".join(repr(t) for t in self.transforms)
        return f"{type(self).__name__}([\n    {inner}])"


class Compose(Recipe):
    """v2.Compose([...]) of coload ops: a Recipe."""


def _mark_custom_kind(specs):
    """A Custom op before the conversion to float takes the uint8 crop, after it the float row."""
    is_float = False
    for name, params in specs:
        if name in ("ToTensor", "ToDtype"):
            is_float = True
        elif name == "Custom":
            params["on"] = "float" if is_float else "pixels"


def _renumber(message, positions):
    """The builder numbers ops among those it ran: give the list's own positions."""
    prefix = "Recipe: op "
    if not message.startswith(prefix):
        return message
    digits = message[len(prefix):].split(" ", 1)
    if not digits[0].isdigit() or int(digits[0]) >= len(positions):
        return message
    rest = digits[1] if len(digits) > 1 else ""
    return f"{prefix}{positions[int(digits[0])]} {rest}"
