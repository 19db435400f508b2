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


def presets():
    """The names of the recipes ImageFolder accepts."""
    return list(_C.recipe_presets())


__all__ = ["ImageFolder", "Recipe", "presets", "transforms"]
