"""coload.vision: image folders decoded, augmented and collated natively (no GIL)."""
import os

from .. import _C
from . import transforms
from .transforms import Recipe


class ImageFolder(_C.ImagePipeline):
    """A folder of class sub-folders (torchvision's ImageFolder layout) through coload's fused
    pipeline. `recipe` is a preset's name (coload.vision.presets(); `train` picks its training
    or evaluation transform) or a composed recipe, `coload.vision.Recipe([...])` or
    `coload.vision.transforms.Compose([...])` of torchvision's ops (which says itself what it
    does: `train` is not used). A batch is [images float [N, 3, S, S], labels]: int64 [N], or
    float [N, classes] soft labels after MixUp/CutMix."""

    def __init__(self, root, recipe="classic", train=True):
        if isinstance(recipe, Recipe):
            super().__init__(os.fspath(root), recipe._native, train)
        elif isinstance(recipe, str):
            super().__init__(os.fspath(root), recipe, train)
        else:
            raise TypeError("ImageFolder: recipe should be a preset's name or a coload.vision."
                            f"Recipe, got {type(recipe).__name__}")
        self.root = os.fspath(root)
        self.recipe = recipe
        self.train = train

    def __repr__(self):
        recipe = self.recipe if isinstance(self.recipe, str) else "Recipe(...)"
        return (f"coload.vision.ImageFolder(root={self.root!r}, recipe={recipe!r}, "
                f"train={self.train}, samples={len(self)})")


def jpeg_checkpoint_budget():
    """The bytes this process may keep for JPEG checkpoints (default 64 MiB; the environment
    variable COLOAD_JPEG_CHECKPOINT_MB, read on first use, sets another; 0: off). A crop of a
    JPEG decoded before (each epoch's RandomResizedCrop of the same file) starts its Huffman
    decoding from the points its earlier decodes left, about 1.3 KB a photo, instead of the
    file's start: the same pixels, less CPU. The oldest files' points go first beyond it."""
    return _C.jpeg_checkpoint_budget()


def set_jpeg_checkpoint_budget(nbytes):
    """Sets jpeg_checkpoint_budget() to `nbytes` (0 turns checkpoints off and drops those kept);
    returns the previous budget. For this process: worker processes forked after it inherit it."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes < 2**63:
        raise ValueError("set_jpeg_checkpoint_budget: nbytes should be an int of bytes from 0 "
                         f"(off) to 2**63 - 1, got {nbytes!r}")
    return _C.set_jpeg_checkpoint_budget(nbytes)


def jpeg_checkpoint_bytes():
    """The bytes of JPEG checkpoints kept now (at most the budget)."""
    return _C.jpeg_checkpoint_bytes()


def presets():
    """The names of the recipes ImageFolder accepts."""
    return list(_C.recipe_presets())


__all__ = ["ImageFolder", "Recipe", "jpeg_checkpoint_budget", "jpeg_checkpoint_bytes", "presets",
           "set_jpeg_checkpoint_budget", "transforms"]
