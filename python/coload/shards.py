"""coload.shards: tar shards in the WebDataset layout, read natively (no GIL)."""
import os

from . import _C


class ShardDataset(_C.ShardDataset):
    """The samples of a `.tar` shard or a folder of them, as a map-style dataset. A batch is a
    list of dicts: `__key__`, `__url__` (the shard) and each field's bytes by name."""

    def __init__(self, path):
        super().__init__(os.fspath(path))
        self.path = os.fspath(path)

    def __repr__(self):
        return f"coload.shards.ShardDataset({self.path!r}, samples={len(self)})"
