"""Python datasets in worker processes (executor="processes").

coload forks its worker processes as os.fork() forks torch's (the GIL taken, Python's fork
hooks run); a worker runs the dataset's __getitem__ (or its iterator) and the collate_fn with the
GIL, as a worker of torch.utils.data.DataLoader does. What crosses back is the batch pickled
without its tensors: each plain CPU tensor is written by coload's wire format into the worker's
shared-memory slot, and the parent's batch holds tensors over that slot (no copy on the parent's
side, as for a native batch). Everything else (numbers, strings, numpy arrays, other tensors)
travels in the pickle.
"""
import io
import pickle
import random
import sys

import torch
import torch.utils.data._utils.worker as _torch_worker
from torch.utils.data._utils.worker import WorkerInfo


def _by_slot(obj):
    return (type(obj) is torch.Tensor and obj.layout == torch.strided and obj.device.type == "cpu"
            and not obj.requires_grad and not obj.is_quantized)


class _Pickler(pickle.Pickler):
    def __init__(self, file, tensors):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors

    def persistent_id(self, obj):
        if _by_slot(obj):
            self._tensors.append(obj)
            return len(self._tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors):
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, pid):
        return self._tensors[pid]


def dumps(batch):
    """In the worker: (the batch pickled without its slot tensors, those tensors)."""
    tensors = []
    if _by_slot(batch):  # the common case of one tensor: no pickle at all
        return b"", [batch]
    out = io.BytesIO()
    _Pickler(out, tensors).dump(batch)
    return out.getvalue(), tensors


def loads(data, tensors):
    """In the parent: the batch, its tensors over the worker's slot."""
    if not data:
        return tensors[0]
    return _Unpickler(io.BytesIO(data), tensors).load()


def init_worker(worker_id, num_workers, seed, dataset, worker_init_fn):
    """A worker process's start, as torch's _worker_loop: Python's, torch's (and numpy's, when
    imported) generators seeded from the worker's seed, torch's get_worker_info() set, then the
    user's worker_init_fn."""
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    generate_state = getattr(_torch_worker, "_generate_state", None)
    if numpy is not None and generate_state is not None:
        numpy.random.seed(generate_state(seed - worker_id, worker_id))
    _torch_worker._worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                            dataset=dataset)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
