"""coload's errors, as Python exceptions (raised by coload._C's translator).

Each carries what coload knows of the failure as attributes (worker_id, pid, batch, index...),
and the message names them. A Python dataset's own exception is the SampleError's __cause__,
with its traceback (from a worker process: its type's name and traceback text).
"""
import builtins
import sys


class LoaderError(RuntimeError):
    """A DataLoader failed (the base of coload's loader errors)."""


class SampleError(LoaderError):
    """A sample could not be fetched or a batch collated: worker_id (-1: no worker), pid (-1: a
    thread), batch (its number in the epoch), index (the sample, -1 for the collate). From a
    worker process (executor="processes"), where the exception object stays, original_type is
    its type's name and traceback the child's traceback text, which the message ends with.
    It is also an instance of the dataset's exception's type where it can be (see
    sample_error_for): `except KeyError:` catches a dataset's KeyError."""

    _cause_type = None  # the class made for a dataset's exception type: that type

    def __reduce__(self):
        # The class made for a type is found again by that type (pickle finds classes by name);
        # a type pickle cannot find (one defined in a function) leaves a plain SampleError.
        cause = self._cause_type if _importable(self._cause_type) else None
        return (_rebuild, (cause, self.args, self.__dict__))


def _rebuild(cause_type, args, state):
    error = _for_type(cause_type)(*args)
    error.__dict__.update(state)
    return error


def _importable(cls):
    """Whether pickle finds `cls` by its module and qualified name."""
    if cls is None or "<locals>" in getattr(cls, "__qualname__", "<locals>"):
        return False
    found = sys.modules.get(getattr(cls, "__module__", None))
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is cls


# What the translator sets on a SampleError (module.cpp), probed on each class made.
_ATTRIBUTES = {"worker_id": -1, "pid": -1, "batch": -1, "index": -1, "original_type": "",
               "traceback": ""}


class WorkerDied(LoaderError):
    """A worker process died: worker_id, pid, batch (-1: it died idle, between batches),
    signal, exit_code."""


class TimeoutError(builtins.TimeoutError, LoaderError):  # noqa: A001 (as PyTorch's name)
    """No batch came within `timeout` seconds: batch, seconds, worker_id, pid. Also a
    RuntimeError, as torch.utils.data.DataLoader raises one there."""


_WITH_CAUSE = {}


def sample_error_for(cause):
    """The class of the SampleError raised for `cause`, the dataset's own exception (or the
    name of its type, from a worker process): SampleError that is also a `type(cause)`, so that
    `except KeyError:` catches a dataset's KeyError as it catches the one torch raises again in
    the main process. SampleError itself where the two cannot be one class (an OSError's
    layout, a type that is no Exception or that refuses subclasses, StopIteration) or the type
    is unknown."""
    if isinstance(cause, str):  # a worker process's: a built-in type by name, else unknown
        return _for_type(getattr(builtins, cause, None) if "." not in cause else None)
    return _for_type(None if cause is None else type(cause))


def _for_type(cause):
    # Never a StopIteration: raised from an iterator's __next__, it would end the loop quietly.
    if (not isinstance(cause, type) or not issubclass(cause, Exception)
            or issubclass(cause, (StopIteration, StopAsyncIteration))
            or issubclass(SampleError, cause)):
        return SampleError
    made = _WITH_CAUSE.get(cause)
    if made is None:
        try:
            # The message as SampleError's: KeyError's own str() would quote it.
            made = type("SampleError", (SampleError, cause),
                        {"__module__": __name__, "__str__": BaseException.__str__,
                         "__doc__": SampleError.__doc__, "_cause_type": cause})
            # Made as the translator makes it: a type whose constructor wants more than the
            # message (ExceptionGroup), or that refuses one of the attributes, is left out.
            probe = made("probe")
            for name, value in _ATTRIBUTES.items():
                setattr(probe, name, value)
        except Exception:  # noqa: BLE001 (any failure of a foreign type: plain SampleError)
            made = SampleError
        # Kept for types defined at a module's level; one defined in a function (a class per
        # call) is made again each time, and let go with its type.
        if _importable(cause):
            _WITH_CAUSE[cause] = made
    return made
