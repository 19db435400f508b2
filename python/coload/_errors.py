"""coload's errors, as Python exceptions (raised by coload._C's translator).

Each carries what coload knows of the failure as attributes (worker_id, pid, batch, index...),
and the message names them. A Python dataset's own exception is the SampleError's __cause__,
with its traceback (from a worker process: its type's name and traceback text).
"""
import builtins


class LoaderError(RuntimeError):
    """A DataLoader failed (the base of coload's loader errors)."""


class SampleError(LoaderError):
    """A sample could not be fetched or a batch collated: worker_id (-1: no worker), pid (-1: a
    thread), batch (its number in the epoch), index (the sample, -1 for the collate). From a
    worker process (executor="processes"), where the exception object stays, original_type is
    its type's name and traceback the child's traceback text, which the message ends with."""


class WorkerDied(LoaderError):
    """A worker process died: worker_id, pid, batch (-1: it died idle, between batches),
    signal, exit_code."""


class TimeoutError(builtins.TimeoutError, LoaderError):  # noqa: A001 (as PyTorch's name)
    """No batch came within `timeout` seconds: batch, seconds, worker_id, pid. Also a
    RuntimeError, as torch.utils.data.DataLoader raises one there."""
