"""coload.vision: image folders decoded, augmented and collated natively (no GIL)."""
import os

from . import _C


class ImageFolder(_C.ImagePipeline):
    """A folder of class sub-folders (torchvision's ImageFolder layout) through coload's fused
    pipeline: `recipe` names a preset (coload.vision.presets()), `train` picks its training or
    evaluation transform. A batch is [images float [N, 3, S, S], labels int64 [N]]."""

    def __init__(self, root, recipe="classic", train=True):
        super().__init__(os.fspath(root), recipe, train)
        self.root = os.fspath(root)
        self.recipe = recipe
        self.train = train

    def __repr__(self):
        return (f"coload.vision.ImageFolder(root={self.root!r}, recipe={self.recipe!r}, "
                f"train={self.train}, samples={len(self)})")


def presets():
    """The names of the recipes ImageFolder accepts."""
    return list(_C.recipe_presets())
