"""get_worker_info() for coload's worker threads.

torch.utils.data.get_worker_info() reads one process-wide global, which PyTorch's worker
processes each set once; coload's workers are threads of one process, so each asks coload which
worker it is (a thread-local in the native loader). coload.get_worker_info() does that; and so
that datasets written against torch's get_worker_info() shard themselves under coload too,
torch's function is patched (its code, so references imported earlier see it) to ask coload
first and fall back to torch's global.
"""
import torch.utils.data._utils.worker as _torch_worker
from torch.utils.data._utils.worker import WorkerInfo

from . import _C


def get_worker_info():
    """The calling worker's WorkerInfo(id, num_workers, seed, dataset), or None outside one."""
    info = _C.worker_info()
    if info is None:
        return _torch_worker._worker_info
    worker_id, num_workers, seed, dataset = info
    return WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


def _patch_torch():
    namespace = vars(_torch_worker)
    if namespace.get("_coload_get_worker_info") is not None:
        return
    namespace["_coload_get_worker_info"] = get_worker_info
    local = {}
    exec("def get_worker_info():\n    return _coload_get_worker_info()\n", namespace, local)
    _torch_worker.get_worker_info.__code__ = local["get_worker_info"].__code__


_patch_torch()
