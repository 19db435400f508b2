"""coload.shards: tar shards in the WebDataset layout, read natively (no GIL)."""
import os

from . import _C


def _cache(cache_dir, cache_bytes):
    """The native cache_dir and cache_bytes: off without a folder; 10 GiB where none is said."""
    if cache_dir is None:
        return "", 0
    return os.fspath(cache_dir), (10 << 30) if cache_bytes is None else int(cache_bytes)


class ShardDataset(_C.ShardDataset):
    """The samples of a `.tar` shard, a folder of them, a brace pattern, or a URL of one
    (http(s)://, s3://, file://), as a map-style dataset; or of a list of such shards, in
    that order. A batch is a list of dicts: `__key__`, `__url__` (the shard) and each field's
    bytes by name.

    `cache_dir` and `cache_bytes` (default 10 GiB) keep shards named by URL on local disk
    (least recently used evicted past `cache_bytes`): each shard the reads touch is also
    fetched whole, in the background, where all the shards fit the bound, and later epochs read
    it from there. `cache_wait()` waits for those fetches. `cache_fill()` queues every shard
    at once (to fill the cache before training, or for worker processes, whose reads fill
    nothing: call it in the parent)."""

    def __init__(self, path, cache_dir=None, cache_bytes=None):
        if isinstance(path, (list, tuple)):
            self.path = [os.fspath(p) for p in path]
        else:
            self.path = os.fspath(path)
        super().__init__(self.path, *_cache(cache_dir, cache_bytes))

    def __repr__(self):
        return f"coload.shards.ShardDataset({self.path!r}, samples={len(self)})"


class ShardImageFolder(_C.ShardImagePipeline):
    """Image samples of tar shards (a `.tar` or a folder of them, as coload-shard writes an
    ImageFolder tree) through ImageFolder's fused pipeline: each sample's `jpg`/`jpeg`/`png`/
    `webp` field decoded and transformed natively, its label the `cls` field. `recipe` and
    `train` as coload.vision.ImageFolder's. `num_classes` is the class count a recipe's
    MixUp/CutMix without its own uses: None reads classes.txt beside the shards (coload-shard
    writes it; `path` may be a URL, as ShardDataset's), else 0 (such an op then needs its num_classes). A batch is [images float
    [N, 3, S, S], labels]. `cache_dir`, `cache_bytes`, `cache_wait()` and `cache_fill()`:
    ShardDataset's."""

    def __init__(self, path, recipe="classic", train=True, num_classes=None, cache_dir=None,
                 cache_bytes=None):
        from .vision import Recipe
        path = os.fspath(path)
        if num_classes is None:
            # Beside the shards, by path or URL (a folder, a shard, a brace pattern).
            text = _C.read_beside_shards(path, "classes.txt")
            num_classes = 0 if text is None else sum(1 for line in text.splitlines()
                                                     if line.strip())  # bytes: any encoding
        cache = _cache(cache_dir, cache_bytes)
        if isinstance(recipe, Recipe):
            super().__init__(path, recipe._native, train, int(num_classes), *cache)
        elif isinstance(recipe, str):
            super().__init__(path, recipe, train, int(num_classes), *cache)
        else:
            raise TypeError("ShardImageFolder: recipe should be a preset's name or a "
                            f"coload.vision.Recipe, got {type(recipe).__name__}")
        self.path, self.recipe, self.train, self.num_classes = path, recipe, train, num_classes

    def __repr__(self):
        recipe = self.recipe if isinstance(self.recipe, str) else "Recipe(...)"
        return (f"coload.shards.ShardImageFolder({self.path!r}, recipe={recipe!r}, "
                f"train={self.train}, samples={len(self)})")
