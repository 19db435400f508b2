"""coload: a native, coroutine-driven DataLoader for PyTorch.

    import coload
    loader = coload.DataLoader(coload.vision.ImageFolder("photos"), batch_size=64,
                               shuffle=True, num_workers=4)
    for images, labels in loader: ...

coload.DataLoader takes torch.utils.data.DataLoader's arguments (and Python datasets too).
"""
# NOTE: torch first: coload._C hands out torch.Tensors through torch's own pybind11 casters,
# which need torch._C loaded (importing the extension first crashes on the first tensor).
import torch  # noqa: F401

from . import _C  # noqa: E402
from . import shards, vision  # noqa: E402
from ._errors import LoaderError, SampleError, TimeoutError, WorkerDied  # noqa: E402,A004
from ._loader import DataLoader  # noqa: E402
from ._worker import get_worker_info  # noqa: E402

__all__ = ["DataLoader", "TensorDataset", "get_worker_info", "LoaderError", "SampleError",
           "TimeoutError", "WorkerDied", "shards", "vision"]


class TensorDataset(_C.TensorDataset):
    """Rows of tensors of equal first dimension, as torch.utils.data.TensorDataset, gathered
    natively: a batch is a list of each tensor's rows."""

    def __init__(self, *tensors):
        super().__init__(list(tensors))
