"""torchvision's parameter forms (an int size, a single degrees value, a None fill, an
InterpolationMode) turned into the plain values coload's C++ recipe builder takes; what a form
cannot be is a TypeError, with torchvision's wording where it has one."""
import math
import numbers


def _is_number(v):
    return isinstance(v, numbers.Number) and not isinstance(v, bool)


def _is_seq(v):
    return isinstance(v, (list, tuple))


def _size(op, size, what="size"):
    """torchvision's int or (h, w) (or [s]) as (height, width)."""
    if _is_number(size) and int(size) == size:
        return int(size), 0
    if _is_seq(size) and len(size) == 1 and _is_number(size[0]):
        return int(size[0]), 0
    if _is_seq(size) and len(size) == 2 and all(_is_number(s) for s in size):
        h, w = int(size[0]), int(size[1])
        return h, (w if w != h else 0)
    if _is_seq(size):
        raise ValueError(f"{op}: Please provide only two dimensions (h, w) for {what}.")
    raise TypeError(f"{op}: Size should be int or sequence. Got {type(size)}")


def _pair(op, value, name):
    """A (min, max) range as a list of two floats."""
    if not _is_seq(value) or len(value) != 2 or not all(_is_number(v) for v in value):
        raise TypeError(f"{op}: {name} should be a sequence of two numbers, got {value!r}")
    return [float(value[0]), float(value[1])]


def _fill(op, fill, none_ok=True):
    """None (torchvision's None: an empty list), a number or one per channel."""
    if fill is None:
        if not none_ok:
            raise TypeError(f"{op}: fill None is not supported here; give a number")
        return []
    if _is_number(fill):
        return [float(fill)]
    if _is_seq(fill) and all(_is_number(v) for v in fill):
        return [float(v) for v in fill]
    if isinstance(fill, dict):
        raise TypeError(f"{op}: fill as a dict (per tv_tensor type) is not supported in a "
                        "recipe; give a number or a sequence")
    raise TypeError(f"{op}: Got inappropriate fill arg: {fill!r}")


def _interpolation(op, mode, allowed=("nearest", "bilinear")):
    """torchvision's InterpolationMode (or its string or PIL int) as 'nearest'/'bilinear'."""
    name = getattr(mode, "value", mode)
    if isinstance(name, int) and not isinstance(name, bool):
        name = {0: "nearest", 2: "bilinear", 3: "bicubic", 1: "lanczos", 4: "box",
                5: "hamming"}.get(name, str(name))
    if not isinstance(name, str):
        raise TypeError(f"{op}: Argument interpolation should be a InterpolationMode, str or int, "
                        f"got {mode!r}")
    name = name.lower()
    if name not in allowed:
        raise ValueError(f"{op}: interpolation {name!r} is not supported in a recipe yet "
                         f"(coload's {op} runs {' or '.join(allowed)})")
    return name


def _degrees(op, degrees, name="degrees"):
    """torchvision's _setup_number_or_seq: d as (-d, d), or a (min, max) pair."""
    if _is_number(degrees):
        if degrees < 0:
            raise ValueError(f"{op}: If {name} is a single number, it must be positive. "
                             f"Got {degrees}")
        return [-float(degrees), float(degrees)]
    if _is_seq(degrees) and len(degrees) == 2 and all(_is_number(d) for d in degrees):
        return [float(degrees[0]), float(degrees[1])]
    if _is_seq(degrees):
        raise ValueError(f"{op}: If {name} is a sequence its length should be 2. "
                         f"Got {len(degrees)}")
    raise TypeError(f"{op}: {name} should be a number or a sequence, got {type(degrees)}")


def _optional_pair(op, value, name):
    return None if value is None else _pair(op, value, name)


def _jitter(name, value, center):
    """ColorJitter's argument as the single number the C++ op takes: b for [max(0, 1 - b), 1 + b]
    (center 1) or h for [-h, h] (hue). A (min, max) pair of that form maps to its number."""
    if value is None:
        return 0.0
    if _is_number(value):
        return float(value)  # the builder checks the sign, with torchvision's wording
    if not (_is_seq(value) and len(value) == 2 and all(_is_number(v) for v in value)):
        raise TypeError(f"ColorJitter: {name} should be a single number or a list/tuple with "
                        f"length 2. Got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if lo == hi == center:
        return 0.0
    b = hi - center
    expected = max(0.0, center - b) if center == 1 else center - b
    if b >= 0 and math.isclose(lo, expected, rel_tol=1e-9, abs_tol=1e-12):
        return b
    raise ValueError(f"ColorJitter: {name}=({lo}, {hi}) is not supported in a recipe yet: "
                     f"coload's ColorJitter takes the single-number form (a range "
                     f"{'[max(0, 1 - b), 1 + b]' if center == 1 else '[-h, h]'})")


def _probability(op, p):
    if not _is_number(p):
        raise TypeError(f"{op}: p should be a number, got {type(p)}")
    return float(p)
