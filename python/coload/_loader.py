"""coload.DataLoader: torch.utils.data.DataLoader's signature over coload's native loader.

The index order is torch's own: samplers and batch samplers are torch's classes (or the user's),
iterated here and handed to the native loader one index list at a time, after the same draw of
the base seed from the same generator as torch's DataLoader iterator takes; so a loader given
`generator=torch.Generator().manual_seed(s)` yields exactly the batches torch's does, epoch after
epoch. Fetching, decoding and collating run on coload's worker threads (native datasets without
the GIL; Python datasets take it for their own code).
"""
import atexit
import itertools
import json
import math
import os
import weakref

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate, default_convert

from . import _C

_STATE_VERSION = 1

# Every native loader alive, closed at exit while the interpreter still runs: a worker thread
# that asked for the GIL during finalization would be ended mid-call by Python.
_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
    for native in list(_LIVE):
        native.close()


def _fork_executor(context, num_workers):
    # torch's check of multiprocessing_context (at construction and when set), for coload's
    # worker processes, which are forked: the executor it asks for.
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading "
                         f"(num_workers > 0), but got num_workers={num_workers}")
    method = getattr(context, "get_start_method", lambda: context)()
    if method != "fork":
        raise ValueError("coload's worker processes are forked: multiprocessing_context must be "
                         f"'fork', got {method!r}")
    return "processes"


def _draw_seed(generator):
    # As torch's _BaseDataLoaderIter: one int64 from the loader's generator (or the global one).
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class _PerSample:
    """batch_size=None: each index is a batch of one, and the collate sees the sample alone."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, samples):
        return self.collate_fn(samples[0])


class _Through:
    """What the native loader calls in place of the DataLoader's collate or `worker_init_fn`:
    the DataLoader's own, reached through a weak reference. Held by C++ directly, a bound method
    of an object that holds the DataLoader (`collate_fn=self.collate`) closed a cycle through
    C++ that Python's collector cannot see: that object, the loader and its worker threads (or
    processes) lived for ever."""

    __slots__ = ("_loader", "_name")

    def __init__(self, loader, name):
        self._loader = weakref.ref(loader)
        self._name = name

    def __call__(self, *args):
        loader = self._loader()
        if loader is None:  # only while the loader is being collected and its workers stop
            raise RuntimeError("the DataLoader was collected while its workers ran")
        fn = getattr(loader, self._name)
        return None if fn is None else fn(*args)  # a worker_init_fn set to None meanwhile


class _EpochIterator:
    """One epoch, as torch's _BaseDataLoaderIter: an iterator (not a generator, which an
    exception would close), so that after a batch's error the epoch goes on with the next.

    A coload.DataLoader runs one epoch at a time: a later iter() (or load_state_dict()) stops
    this one's epoch, and this iterator then raises RuntimeError rather than hand out the later
    epoch's batches (torch's iterators, each with workers of its own, would go on
    independently)."""

    def __init__(self, loader, native):
        self._loader = loader
        self._native = native
        self._serial = loader._epochs
        self._pin = (loader.pin_memory and not loader._native_dataset
                     and torch.cuda.is_available())

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._loader)

    def __next__(self):
        if self._native is None:
            raise StopIteration
        if self._loader._epochs != self._serial:
            self._native = None
            raise RuntimeError("this coload.DataLoader iterator's epoch was stopped by a later "
                               "iter() or load_state_dict() on the same loader, which runs one "
                               "epoch at a time (copy.copy(loader) makes a loader of its own)")
        batch = self._native.next()
        if batch is None:
            self._native = None
            self._loader._epoch_open = False
            raise StopIteration
        if self._pin:
            from torch.utils.data._utils.pin_memory import pin_memory
            batch = pin_memory(batch)
        return batch


class DataLoader:
    """torch.utils.data.DataLoader's arguments and semantics, loaded by coload.

    coload's own keywords: `executor` ("threads", or "processes": forked worker processes, as
    torch's; a Python dataset's batch comes back with its tensors in shared memory), `seed` (seeds the shuffle, as generator=torch.Generator().manual_seed(seed),
    and the native pipelines' per-sample augmentation), `auto_workers` (coload picks and adjusts
    the number of worker threads, up to num_workers or the CPUs), `on_error` ("raise", or "skip":
    a sample that fails is left out and counted).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, executor="threads", seed=None, auto_workers=False,
                 on_error="raise"):
        # torch.utils.data.DataLoader's checks, in its order and with its messages.
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set "
                             "prefetch_factor to None.")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            if shuffle not in {False, None}:
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                                 f"option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
            if batch_size is not None:
                # torch batches an IterableDataset through a BatchSampler too, whose checks
                # (batch_size a positive int, drop_last a bool) and messages these are.
                BatchSampler(range(0), batch_size, drop_last)
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if executor not in ("threads", "processes"):
            raise ValueError(f"executor must be 'threads' or 'processes', got {executor!r}")
        if multiprocessing_context is not None:
            executor = _fork_executor(multiprocessing_context, num_workers)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")

        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(seed)
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.executor = executor
        self.seed = seed
        self.auto_workers = auto_workers
        self.on_error = on_error

        native = isinstance(dataset, (_C.TensorDataset, _C.ImagePipeline, _C.ShardDataset,
                                      _C.ShardImagePipeline))
        self._native_dataset = native
        if native and collate_fn is not None:
            raise ValueError(f"collate_fn is not supported with {type(dataset).__name__}, whose "
                             "batches are collated natively; wrap it in a Python dataset")
        if native and batch_size is None and batch_sampler is None:
            raise ValueError(f"batch_size=None is not supported with {type(dataset).__name__}")

        # Where indices come from: natively in order (no sampler given), or torch's samplers.
        # NOTE: the native order's length is the dataset's when the native loader is made; as
        # torch's samplers read len() again at each iter(), a loader is made again for a Python
        # dataset whose length changed (_follow_length).
        self._own_order = iterable or (sampler is None and batch_sampler is None and not shuffle)
        if sampler is None and not iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.sampler = sampler
        self.batch_sampler = batch_sampler

        # The native pipelines' per-sample random streams: `seed`, else fresh per loader (from
        # the OS, not torch's generators, whose draws must stay torch's).
        self._native_seed = (seed if seed is not None
                             else int.from_bytes(os.urandom(8), "little") >> 1)
        self._native = None
        self._epochs = 0  # iter() calls: which _EpochIterator is the current one
        self._iterated = False
        self._epoch_iterated = False  # _iterated as the current epoch began
        self._epoch_open = False
        self._epoch_rng = None
        self._base_seed = None
        self._state_pending = False  # a state load_state_dict took, until iter() resumes it
        self._state_len = None  # the Python dataset's length it was taken at
        self._resume_draws_seed = True  # whether its epoch draws a base seed
        self._own_len = None
        self._native_started = False  # the native loader has started an epoch
        self._native_made_with = None  # _made_with() when it was made
        self._carry = None  # what the next native loader goes on from (_carry_from)
        self._skipped_before = 0  # skipped() of native loaders let go
        self._initialized = True

    def __setattr__(self, attr, val):
        # As torch's DataLoader: what shapes the batches is fixed once it is made.
        if self.__dict__.get("_initialized") and attr in (
                "batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        if (attr == "multiprocessing_context" and self.__dict__.get("_initialized")
                and val is not None):
            # torch's setter checks it at once; the next iter() forks the workers.
            super().__setattr__("executor", _fork_executor(val, self.num_workers))
        super().__setattr__(attr, val)

    def __copy__(self):
        # A copy makes its own native loader, starting where a fresh one would: the original's
        # calls back through a weak reference to it (_Through), which may be gone before the
        # copy is used.
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._native = None
        other._epoch_open = False
        other._state_pending = False
        other._native_started = False
        other._carry = None
        other._skipped_before = 0
        return other

    # -- the native loader, made on first use (load_state_dict may change its seed first) --------
    def _index_iter(self):
        if self.batch_sampler is not None:
            return iter(self.batch_sampler)
        return ([i] for i in self.sampler)  # batch_size=None: one index per batch

    def _made_with(self):
        # The options as the native loader takes them, read again at each iter()
        # (_follow_options). As torch's single-process iterator, one without workers ignores
        # prefetch_factor and persistent_workers (num_workers set to 0 after a loader was made
        # with them); pin_memory pins a native dataset's batches (a Python dataset's are pinned
        # here, by torch's pin_memory, as each is delivered).
        workers = self.num_workers > 0
        return {"num_workers": self.num_workers, "auto_workers": bool(self.auto_workers),
                "pin_memory": bool(self.pin_memory) and self._native_dataset,
                "timeout": float(self.timeout),
                "prefetch_factor": self.prefetch_factor if workers else None,
                "persistent_workers": bool(self.persistent_workers) and workers,
                "in_order": self.in_order, "on_error": self.on_error, "executor": self.executor}

    def _make_native(self):
        o = _C.Options()
        if self._own_order:
            o.batch_size = 1 if self.batch_size is None else self.batch_size
            o.drop_last = self.drop_last
        else:
            o.batches = True  # an iterator of index lists given to each start_epoch
            source = self.batch_sampler if self.batch_sampler is not None else self.sampler
            try:
                o.batches_len = len(source)
            except TypeError:  # a sampler without __len__ (under a BatchSampler too): as torch's,
                o.batches_len = None  # iterated all the same
        made_with = self._made_with()
        o.num_workers = made_with["num_workers"]
        o.auto_workers = made_with["auto_workers"]
        if not self._native_dataset:
            self._resolve_collate()
            o.collate = _Through(self, "_collate")
        o.pin_memory = made_with["pin_memory"]
        o.timeout = made_with["timeout"]
        o.worker_init_fn = (_Through(self, "worker_init_fn") if self.worker_init_fn is not None
                            else None)
        o.prefetch_factor = made_with["prefetch_factor"]
        o.persistent_workers = made_with["persistent_workers"]
        o.in_order = made_with["in_order"]
        o.seed = self._native_seed
        o.on_error = made_with["on_error"]
        o.executor = made_with["executor"]
        return _C.Loader(self.dataset, o)

    def _loader(self):
        if self._native is None:
            native = self._make_native()
            self._carry_into(native, self._carry)
            self._install(native)
        return self._native

    def _install(self, native):
        # The native loader from now on (one before it let go).
        if self._native is not None:
            self._let_go()
        self._native = native
        self._native_made_with = self._made_with()
        # A Python dataset's length, which the native loader's own sequential order is made
        # for (else None).
        self._own_len = self._python_len() if self._own_order else None
        self._native_started = False
        self._carry = None
        _LIVE.add(native)

    def _let_go(self):
        # Closes the native loader, keeping what the next one goes on from; an epoch open in
        # it is over.
        native, self._native = self._native, None
        try:
            self._carry = self._carry_from(native)
            self._skipped_before += native.skipped()
        except RuntimeError as e:
            if "was closed" not in str(e):
                raise
            self._carry = None  # closed already (at exit, by _close_all): nothing to go on from
        finally:
            native.close()
            self._epoch_open = False

    def _carry_from(self, native):
        # What a native loader made again goes on from: a state load_state_dict took that no
        # iter() has resumed yet, else the epoch `native` would begin next (a native dataset's
        # samples draw their randomness by (seed, epoch, index); the epoch numbers began at 0
        # again).
        if self._state_pending:
            return native.state()
        return native.state_epoch() + self._epoch_open

    @staticmethod
    def _carry_into(native, carry):
        try:
            if isinstance(carry, str):
                native.load_state(carry)
            elif carry:
                native.begin_at_epoch(carry)
        except BaseException:
            native.close()
            raise

    def _resolve_collate(self):
        # What the native loader's collate calls: collate_fn as it is when an epoch starts (as
        # torch's iterator takes it), or torch's default.
        collate = self.collate_fn
        if self.batch_size is None and self.batch_sampler is None:
            collate = _PerSample(collate or default_convert)
        self._collate = collate or default_collate

    def _rng_state(self):
        return self.generator.get_state() if self.generator is not None else torch.get_rng_state()

    def _set_rng_state(self, state):
        if self.generator is not None:
            self.generator.set_state(state)
        else:
            torch.set_rng_state(state)

    # -- torch.utils.data.DataLoader's interface ---------------------------------------------------
    def __len__(self):
        if isinstance(self.dataset, IterableDataset):
            n = len(self.dataset)  # TypeError without __len__, as torch's
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
            return n
        if not self._own_order:
            # As torch's: the index sampler's length (a TypeError where it has none).
            return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)
        if self._native_dataset:
            return len(self._loader())
        # A Python dataset in the native loader's own sequential order: as torch's
        # SequentialSampler under its BatchSampler, from the dataset's length now.
        n = len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _python_len(self):
        # A map-style Python dataset's length now (None for other datasets).
        if self._native_dataset or isinstance(self.dataset, IterableDataset):
            return None
        return len(self.dataset)

    def _length_changed(self):
        # torch's samplers read len(dataset) at each iter(): a Python dataset whose length
        # changed since the native loader made its own sequential order needs a loader made
        # for the new one (its workers too: worker_init_fn runs again in them).
        return (self._native is not None and self._own_len is not None
                and len(self.dataset) != self._own_len)

    def _follow_length(self):
        if self._length_changed():
            self._let_go()

    def _check_state_length(self):
        # A state load_state_dict took (at its dataset size, which it checked) is for that
        # size only: resumed at another, with torch's samplers or the own order, it would
        # deliver again what the state says was delivered, or leave samples out.
        if self._state_pending and self._state_len is not None:
            n = len(self.dataset)
            if n != self._state_len:
                raise ValueError(f"loader state: load_state_dict() took a state for dataset "
                                 f"size {self._state_len}, but the dataset has {n} samples "
                                 f"now; iter() resumes it at that size only")

    def _follow_options(self):
        # torch's DataLoader makes an iterator at each iter() from its options as they are then
        # (num_workers, pin_memory, timeout...), but for persistent workers, which keep theirs:
        # a loader is made again when they changed, with a state load_state_dict took (one
        # the new options refuse, as an iterable dataset's for another num_workers, raises).
        if self._options_changed():
            native = self._make_native()
            self._carry_into(native, self._carry_from(self._native))
            self._install(native)

    def _options_changed(self):
        if self._native is None or self._native_made_with == self._made_with():
            return False
        # torch's iterator is kept with its workers (not for num_workers=0, set since; a loader
        # made without workers makes new ones when num_workers is set again, where torch would
        # take up its first iterator's).
        return not (self.persistent_workers and self.num_workers > 0 and self._native_started
                    and self._native_made_with["persistent_workers"])

    def __iter__(self):
        self._check_state_length()
        self._follow_length()
        self._follow_options()
        native = self._loader()
        self._epochs += 1  # the current iterator's epoch stops here, if unfinished
        # Before this epoch's draws: a stopped epoch's driver may still be in its index
        # iterator's last call (the sampler's trailing permutation); stop_epoch waits for it.
        stopped = self._epoch_open
        native.stop_epoch()
        self._epoch_open = False
        try:
            return self._start(native)
        except BaseException:
            if stopped:
                # The stopped epoch is over all the same: the loader (and a state taken now)
                # stands at the next one, where its next start would begin.
                native.begin_at_epoch(native.state_epoch() + 1)
            raise

    def _start(self, native):
        self._epoch_rng = self._rng_state()
        # As torch's iterator: the sampler's iterator first, then the base seed (its draws come
        # at the first next(), after it), which seeds the workers (worker i's seed is base + i);
        # persistent workers draw it once.
        indices = None if self._own_order else self._index_iter()
        if self._resume_draws_seed if self._state_pending else self._draws_base_seed():
            self._base_seed = _draw_seed(self.generator)
        if indices is not None and self.num_workers > 0:
            # torch's iterator with workers takes its first prefetch_factor x num_workers index
            # lists within iter(), after the base seed: a sampler's draws from the global
            # generator (RandomSampler's seed, without a generator) are made there, not on the
            # driver later, racing the caller's own. One that raises raises here, as torch's,
            # and the next iter() draws the base seed again (its iterator was never made).
            head = list(itertools.islice(indices, (self.prefetch_factor or 2) * self.num_workers))
            indices = itertools.chain(head, indices)
        self._epoch_iterated = self._iterated
        self._iterated = True
        if not self._native_dataset:
            self._resolve_collate()
        native.start_epoch(indices, self._base_seed)
        self._state_pending = False
        self._native_started = True
        self._epoch_open = True
        return self._epoch(native)

    def _draws_base_seed(self):
        # Whether an epoch begun now draws its workers' base seed: persistent workers draw it
        # once.
        return not (self.persistent_workers and self.num_workers > 0 and self._iterated)

    def _epoch(self, native):
        return _EpochIterator(self, native)

    # -- coload's additions ------------------------------------------------------------------------
    def state_dict(self):
        """Where the loader stands between two batches: load it into a loader made with the same
        arguments (any generator state) and it delivers exactly the batches this one had not,
        then the epochs the uninterrupted run would."""
        if not self._epoch_open and not self._state_pending:
            self._follow_length()  # the next epoch's loader: the one a state must fit
            self._follow_options()
        if self._native is None and self._state_pending and isinstance(self._carry, str):
            # Closed with a state loaded: that state, as it was loaded (a loader made for it
            # now would refuse it while the dataset's length differs, as iter() does).
            native_state = self._carry
        else:
            native_state = self._loader().state()
        return {
            "version": _STATE_VERSION,
            "native": native_state,
            "native_seed": self._native_seed,
            "rng": (self._epoch_rng if self._epoch_open else self._rng_state()).clone(),
            # Mid-epoch, as the epoch began: its resumption draws the base seed again, from the
            # same rng, where this epoch drew it (persistent workers' first epoch).
            "iterated": self._epoch_iterated if self._epoch_open else self._iterated,
            # Persistent workers keep their first epoch's base seed: a resumed run keeps it too.
            "base_seed": self._base_seed,
        }

    def load_state_dict(self, state):
        """Makes the next iter() resume where `state` was taken. An epoch in progress stops
        (its iterator raises RuntimeError from then on), as torchdata's StatefulDataLoader.
        The state's generator is set: the loader's `generator`, or without one torch's global
        generator (whose draws the shuffle and the base seed take, as in torch). A Python
        dataset's length must be the state's, here and at that iter() (ValueError else)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"coload.DataLoader state version {state.get('version')!r} is not "
                             f"{_STATE_VERSION}")
        # What could refuse the state, before the epoch in progress is stopped for it.
        missing = [k for k in ("native", "native_seed", "rng", "iterated") if k not in state]
        if missing:
            raise ValueError(f"coload.DataLoader state without {', '.join(missing)}")
        torch.Generator().set_state(state["rng"])  # a RuntimeError for a state that is none
        if self._epoch_open:
            # As torchdata's StatefulDataLoader: the state replaces the epoch in progress (one
            # broken off, or still being iterated, whose iterator raises from now on, as after
            # a later iter()). Until the state is taken, that epoch stays the one state_dict()
            # describes: a state refused leaves the loader where it was.
            self._epochs += 1
            if self._native is not None:
                self._native.stop_epoch()
        # A loader made for the dataset's length and options now (else the next iter() would
        # make one without the state); the one before stays, with the state it had, where this
        # state is refused.
        if (self._native is None or state["native_seed"] != self._native_seed
                or self._length_changed() or self._options_changed()):
            own_seed = self._native_seed
            self._native_seed = state["native_seed"]
            try:
                native = self._make_native()
                self._carry_into(native, state["native"])
            except BaseException:
                self._native_seed = own_seed
                raise
            self._install(native)
        else:
            self._native.load_state(state["native"])
        self._epoch_open = False
        self._set_rng_state(state["rng"])
        self._iterated = state["iterated"]
        self._base_seed = state.get("base_seed")
        self._state_pending = True
        self._state_len = self._python_len()
        # Whether the resumed epoch draws its base seed is the state's loader's (its options,
        # which may change before iter(): its draws and the shuffle's share the generator).
        self._resume_draws_seed = self._draws_base_seed()

    def metrics(self, total=False):
        """Where the current (or last) epoch's time went, as a dict (`total`: every epoch)."""
        return json.loads(self._loader().metrics_json(total))

    def verdict(self):
        """The metrics' verdict in a line or two: input-bound or compute-bound, and why."""
        return self._loader().verdict()

    def skipped(self):
        """Samples on_error='skip' has left out so far."""
        return self._skipped_before + self._loader().skipped()

    def close(self):
        """Stops the epoch and the workers now (as dropping the loader does); an iterator of
        the loader raises RuntimeError after. The loader makes new workers if used again, and
        goes on where it stood (the next epoch, or a state load_state_dict took)."""
        if self._native is not None:
            self._let_go()
        self._epoch_open = False

    def __del__(self):
        self._native = None
