"""coload.DataLoader over native and Python datasets: batches, len, arguments, workers."""
import threading

import pytest
import torch
from torch.utils.data import IterableDataset

import coload
from conftest import IndexDataset


def torch_batches(dataset, **kwargs):
    return [b for b in torch.utils.data.DataLoader(dataset, **kwargs)]


def as_lists(batches):
    return [[t.tolist() for t in b] if isinstance(b, list) else b.tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_tensor_dataset_batches_as_torch(workers, drop_last):
    x = torch.arange(23 * 3, dtype=torch.float32).reshape(23, 3)
    y = torch.arange(23)
    loader = coload.DataLoader(coload.TensorDataset(x, y), batch_size=5, drop_last=drop_last,
                               num_workers=workers)
    expected = torch_batches(torch.utils.data.TensorDataset(x, y), batch_size=5,
                             drop_last=drop_last)
    assert len(loader) == len(expected) == (4 if drop_last else 5)
    for _ in range(2):  # two epochs, the same batches
        got = list(loader)
        assert as_lists(got) == as_lists(expected)
        assert all(isinstance(t, torch.Tensor) for b in got for t in b)


def test_batch_tensor_is_not_a_copy_and_outlives_the_loader():
    x = torch.arange(12).reshape(6, 2)
    loader = coload.DataLoader(coload.TensorDataset(x), batch_size=6)
    (batch,) = next(iter(loader))
    del loader
    assert batch.tolist() == x.tolist()  # the storage lives as long as Python holds it


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_python_dataset_default_collate(workers):
    loader = coload.DataLoader(IndexDataset(10), batch_size=4, num_workers=workers)
    assert len(loader) == 3
    got = [b.tolist() for b in loader]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class Recording(IndexDataset):
    """Records, for each sample, the thread, grad mode, a draw from torch's global generator
    and how many batches the loop had taken."""

    def __init__(self, n):
        super().__init__(n)
        self.calls = []
        self.taken = 0

    def __getitem__(self, i):
        self.calls.append((i, threading.get_ident(), torch.is_grad_enabled(),
                           torch.rand(1).item(), self.taken))
        return i


def test_without_workers_the_dataset_runs_in_next_on_the_callers_thread_as_torchs():
    # torch's num_workers=0 calls the dataset inside next(), on the caller's thread, a batch
    # per call: the caller's thread-local state holds (no_grad here), and the dataset draws
    # from the global generator in turn with the loop. A loader that fetched ahead, or on a
    # thread of its own, would draw other numbers.
    def run(make):
        torch.manual_seed(5)
        dataset = Recording(7)
        loop = []
        with torch.no_grad():
            for b in make(dataset, batch_size=2, shuffle=True):
                loop.append((b.tolist(), torch.rand(1).item()))
                dataset.taken += 1
        return dataset.calls, loop

    got = run(coload.DataLoader)
    expected = run(torch.utils.data.DataLoader)
    assert got == expected
    calls, loop = got
    me = threading.get_ident()
    assert [c[1:3] for c in calls] == [(me, False)] * 7
    assert [c[4] for c in calls] == [0, 0, 1, 1, 2, 2, 3]
    assert len(loop) == 4


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_without_workers_an_interrupt_in_the_dataset_is_raised_as_it_is(on_error):
    # Ctrl-C raises KeyboardInterrupt in whatever Python code runs: without workers that may be
    # the dataset's. It is no sample error: raised as it is (not skipped), it stops the epoch.
    class Interrupted(IndexDataset):
        def __getitem__(self, i):
            self.calls.append(i)
            if i == 2 and self.armed:
                self.armed = False
                raise KeyboardInterrupt
            return i

    dataset = Interrupted(8)
    dataset.armed, dataset.calls = True, []
    loader = coload.DataLoader(dataset, batch_size=2, on_error=on_error)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    # Nothing fetched after it (sample 3 neither), nothing skipped, and the batch it stopped
    # is not delivered: a state taken now resumes with it.
    assert dataset.calls == [0, 1, 2]
    assert loader.skipped() == 0
    state = loader.state_dict()
    with pytest.raises(StopIteration):
        next(it)  # the epoch was stopped
    resumed = coload.DataLoader(dataset, batch_size=2, on_error=on_error)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[2, 3], [4, 5], [6, 7]]
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_grows_between_epochs_is_sampled_whole_as_torchs(workers):
    # torch's samplers read len(dataset) at each iter(): the indices past the first length are
    # the dataset's (the loader checked them against the length it read first).
    dataset = IndexDataset(4)
    shuffled = coload.DataLoader(dataset, batch_size=3, shuffle=True, num_workers=workers)
    assert sorted(i for b in shuffled for i in b.tolist()) == list(range(4))
    dataset.n = 7
    assert len(shuffled) == 3
    assert sorted(i for b in shuffled for i in b.tolist()) == list(range(7))
    sampled = coload.DataLoader(dataset, batch_size=2, num_workers=workers,
                                sampler=torch.utils.data.SequentialSampler(dataset))
    assert len(list(sampled)) == 4
    dataset.n = 9
    assert [b.tolist() for b in sampled][-1] == [8]
    # Without a sampler or shuffle the loader keeps a sequential order of its own: it follows
    # the length as torch's SequentialSampler does, growing and shrinking, len() too.
    own = coload.DataLoader(dataset, batch_size=4, num_workers=workers)
    peer = torch.utils.data.DataLoader(dataset, batch_size=4)
    for n in (9, 11, 3, 3, 0, 5):
        dataset.n = n
        assert len(own) == len(peer)
        assert [b.tolist() for b in own] == [b.tolist() for b in peer]
    # A state loaded while the length is back to the state's is the one the next epoch resumes.
    it = iter(own)
    assert next(it).tolist() == [0, 1, 2, 3]
    state = own.state_dict()
    dataset.n = 8
    assert len(list(own)) == 2
    dataset.n = 5
    own.load_state_dict(state)
    assert [b.tolist() for b in own] == [[4]]
    # One taken between epochs after the length changed is the next epoch's, at the new length.
    dataset.n = 6
    state = own.state_dict()
    fresh = coload.DataLoader(dataset, batch_size=4, num_workers=workers)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in fresh] == [[0, 1, 2, 3], [4, 5]]
    # A state loaded, then the length changed before iter() resumed it: refused, as
    # load_state_dict refuses a state of another size (a loader made anew for the new length
    # would deliver the state's batches again). state_dict() is still the loaded state; back at
    # its size, iter() resumes it.
    it = iter(own)
    assert next(it).tolist() == [0, 1, 2, 3]
    own.load_state_dict(own.state_dict())
    dataset.n = 7
    with pytest.raises(ValueError, match="took a state for dataset size 6, but the dataset has 7 "
                                         "samples now"):
        iter(own)
    again = own.state_dict()
    # A state refused meanwhile (taken at 6, the dataset at 7) leaves the one loaded before.
    with pytest.raises(ValueError, match="saved by a loader with dataset size 6, but this "
                                         "loader has 7"):
        own.load_state_dict(again)
    # So after close(): state_dict() is the loaded state still.
    own.close()
    assert own.state_dict()["native"] == again["native"]
    dataset.n = 6
    assert [b.tolist() for b in own] == [[4, 5]]
    fresh = coload.DataLoader(dataset, batch_size=4, num_workers=workers)
    fresh.load_state_dict(again)
    assert [b.tolist() for b in fresh] == [[4, 5]]
    # So with torch's samplers, which would sample the new length.
    shuffled = coload.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=workers)
    it = iter(shuffled)
    next(it)
    shuffled.load_state_dict(shuffled.state_dict())
    dataset.n = 7
    with pytest.raises(ValueError, match="took a state for dataset size 6, but the dataset has 7 "
                                         "samples now"):
        iter(shuffled)
    dataset.n = 6
    assert len(list(shuffled)) == 1


class _WhoMade(IndexDataset):
    """Sample i is (i, the id of the worker that made it, -1 on the caller's thread)."""

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return i, -1 if info is None else info.id


def test_options_set_between_epochs_apply_at_the_next_iter_as_torchs():
    # torch's DataLoader makes each epoch's iterator from its options as they are at iter():
    # the native loader is made again when they changed (it once kept its first epoch's).
    loader = coload.DataLoader(_WhoMade(4), batch_size=2)
    assert [b[1].tolist() for b in loader] == [[-1, -1], [-1, -1]]
    loader.num_workers = 2
    assert {w for b in loader for w in b[1].tolist()} <= {0, 1}  # made on its workers
    loader.executor = "processes"
    assert {w for b in loader for w in b[1].tolist()} <= {0, 1}
    loader.num_workers = 0
    loader.executor = "threads"
    loader.prefetch_factor = 4  # ignored without workers, as torch's
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3]]
    # A state load_state_dict took is resumed by the loader made for the new options.
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1]
    loader.load_state_dict(loader.state_dict())
    loader.num_workers = 2
    assert [b[0].tolist() for b in loader] == [[2, 3]]
    # The loader made again goes on with the epoch numbers, by which a native dataset's samples
    # draw their randomness (seed, epoch, index): epochs 0 and 1, 2 broken off, then 3.
    native = coload.DataLoader(coload.TensorDataset(torch.arange(6)), batch_size=2)
    assert len(list(native)) == 3 and len(list(native)) == 3
    native.num_workers = 2
    it = iter(native)
    assert next(it)[0].tolist() == [0, 1]
    assert "\nepoch 2\ndelivered 1\n" in native.state_dict()["native"]
    native.num_workers = 0
    assert len(list(native)) == 3
    assert "\nepoch 4\ndelivered 0\n" in native.state_dict()["native"]
    # An iter() that failed (its sampler raised) stopped the epoch in progress all the same:
    # epoch 0 broken off, the failed iter(), then epoch 1, by a loader made again for a new
    # timeout (it began epoch 0 again); a state taken in between is epoch 1's (it was epoch
    # 0's after its first batch, with the rng of epoch 1).
    class Failing(torch.utils.data.SequentialSampler):
        fail = False

        def __iter__(self):
            if self.fail:
                self.fail = False
                raise KeyError("once")
            return super().__iter__()

    sampler = Failing(range(6))
    sampled = coload.DataLoader(native.dataset, batch_size=2, sampler=sampler, num_workers=1)
    it = iter(sampled)
    assert next(it)[0].tolist() == [0, 1]
    sampler.fail = True
    with pytest.raises(KeyError):
        iter(sampled)
    assert "\nepoch 1\ndelivered 0\n" in sampled.state_dict()["native"]
    sampled.timeout = 5.0
    assert len(list(sampled)) == 3
    assert "\nepoch 2\ndelivered 0\n" in sampled.state_dict()["native"]
    # skipped() counts every epoch's, those of the loader made before too.
    class Bad(IndexDataset):
        def __getitem__(self, i):
            if i == 3:
                raise IndexError("bad")
            return i

    skipping = coload.DataLoader(Bad(6), batch_size=2, on_error="skip")
    assert [b.tolist() for b in skipping] == [[0, 1], [2], [4, 5]] and skipping.skipped() == 1
    skipping.timeout = 5.0
    assert len(list(skipping)) == 3 and skipping.skipped() == 2
    # A state of a loader with persistent workers (its epoch drew no base seed, the shuffle's
    # draws came first) resumed without workers: the rest of its epoch, as it was.
    for close in (False, True):
        shuffled = coload.DataLoader(IndexDataset(8), batch_size=2, shuffle=True, num_workers=2,
                                     persistent_workers=True,
                                     generator=torch.Generator().manual_seed(1))
        assert len(list(shuffled)) == 4
        it = iter(shuffled)
        first = next(it).tolist()
        shuffled.load_state_dict(shuffled.state_dict())
        shuffled.num_workers = 0
        if close:
            shuffled.close()
        assert sorted(first + [i for b in shuffled for i in b.tolist()]) == list(range(8))
    # Persistent workers are kept, as torch's iterator is, whatever num_workers says since;
    # without workers (num_workers=0 set), as torch's, the loader runs on the caller's thread.
    kept = coload.DataLoader(_WhoMade(4), batch_size=1, num_workers=1, persistent_workers=True,
                             prefetch_factor=3)
    assert [b[1].tolist() for b in kept] == [[0]] * 4
    kept.num_workers = 2
    assert [b[1].tolist() for b in kept] == [[0]] * 4
    kept.num_workers = 0
    assert [b[1].tolist() for b in kept] == [[-1]] * 4
    # torch's multiprocessing_context setter checks it at once; "fork" forks the next workers.
    with pytest.raises(ValueError, match="multiprocessing_context can only be used with "
                                         "multi-process loading"):
        kept.multiprocessing_context = "fork"
    kept.num_workers = 2  # workers again (new ones: torch would take up its first iterator's)
    assert {w for b in kept for w in b[1].tolist()} <= {0, 1}
    kept.multiprocessing_context = "fork"
    assert kept.executor == "processes"
    with pytest.raises(ValueError, match="must be 'fork', got 'spawn'"):
        kept.multiprocessing_context = "spawn"


def test_an_interrupt_after_going_back_to_an_earlier_state_is_kept_where_it_stopped():
    # A later epoch's stop, then a state of an earlier epoch loaded: the interrupt in that
    # epoch is where a state taken now resumes (the later stop once hid it: the next epoch).
    class Interrupted(IndexDataset):
        def __getitem__(self, i):
            if i == 2 and self.armed:
                self.armed = False
                raise KeyboardInterrupt
            return i

    dataset = Interrupted(8)
    dataset.armed = False
    loader = coload.DataLoader(dataset, batch_size=2)
    start = loader.state_dict()
    list(loader)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    loader.load_state_dict(start)
    dataset.armed = True
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    resumed = coload.DataLoader(dataset, batch_size=2)
    resumed.load_state_dict(loader.state_dict())
    assert [b.tolist() for b in resumed] == [[2, 3], [4, 5], [6, 7]]


def test_python_collate_fn_and_batch_size_none():
    loader = coload.DataLoader(IndexDataset(5), batch_size=2, collate_fn=lambda s: tuple(s))
    assert list(loader) == [(0, 1), (2, 3), (4,)]
    loader = coload.DataLoader(IndexDataset(3), batch_size=None)
    got = list(loader)
    assert got == [0, 1, 2] and len(loader) == 3
    loader = coload.DataLoader(IndexDataset(3), batch_size=None, collate_fn=lambda s: s * 10)
    assert list(loader) == [0, 10, 20]


def test_worker_init_fn_and_get_worker_info_on_threads():
    seen = []
    lock = threading.Lock()

    class WhoFetches(IndexDataset):
        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            own = coload.get_worker_info()
            return (i, info.id, info.num_workers, own.id, info.dataset is self)

    def init(worker_id):
        info = torch.utils.data.get_worker_info()
        with lock:
            seen.append((worker_id, info.id, info.num_workers))

    ds = WhoFetches(12)
    loader = coload.DataLoader(ds, batch_size=3, num_workers=2, worker_init_fn=init,
                               collate_fn=lambda s: s)
    rows = [row for b in loader for row in b]
    assert [r[0] for r in rows] == list(range(12))
    assert {r[1] for r in rows} <= {0, 1}
    assert all(r[2] == 2 and r[1] == r[3] and r[4] for r in rows)
    # Each worker that fetched ran worker_init_fn once, first, knowing itself. (coload runs it
    # before a worker's first fetch: a worker that fetched nothing may not have run it.)
    assert len(seen) == len({s[0] for s in seen})
    assert all(s[0] == s[1] and s[2] == 2 for s in seen)
    assert {r[1] for r in rows} <= {s[0] for s in seen}
    assert torch.utils.data.get_worker_info() is None  # the main thread is no worker


class Shards(IterableDataset):
    """Each worker streams its share, as PyTorch's users shard with get_worker_info()."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset(workers):
    loader = coload.DataLoader(Shards(10), batch_size=2, num_workers=workers)
    got = sorted(i for b in loader for i in b.tolist())
    assert got == list(range(10))
    if workers == 0:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_iterable_refuses_shuffle_and_samplers():
    with pytest.raises(ValueError, match="expected unspecified shuffle option, but got shuffle=True"):
        coload.DataLoader(Shards(4), shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified sampler"):
        coload.DataLoader(Shards(4), sampler=[0, 1])


@pytest.mark.parametrize("kwargs", [dict(batch_size=2, drop_last=1), dict(batch_size=0),
                                    dict(batch_size=True)])
def test_iterable_batch_size_and_drop_last_are_checked_as_torchs(kwargs):
    # Before, an IterableDataset's batch_size and drop_last were taken unchecked (torch checks
    # them through the BatchSampler it builds for any dataset).
    with pytest.raises(ValueError) as theirs:
        torch.utils.data.DataLoader(Shards(4), **kwargs)
    with pytest.raises(ValueError) as ours:
        coload.DataLoader(Shards(4), **kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("attr", ["batch_size", "batch_sampler", "sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_what_shapes_the_batches_cannot_be_set_after_init_as_in_torch(attr):
    # Before, coload took such an assignment and went on with the old value.
    theirs = torch.utils.data.DataLoader(IndexDataset(4), batch_size=2)
    ours = coload.DataLoader(IndexDataset(4), batch_size=2)
    with pytest.raises(ValueError) as expected:
        setattr(theirs, attr, getattr(theirs, attr))
    with pytest.raises(ValueError) as got:
        setattr(ours, attr, getattr(ours, attr))
    assert str(got.value) == str(expected.value) == (
        f"{attr} attribute should not be set after DataLoader is initialized")
    ours.num_workers = 2  # what torch lets change still can (before the first epoch here)
    assert [b.tolist() for b in ours] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_set_between_epochs_collates_the_next_epoch(workers):
    # Before, the collate of the first epoch stayed (torch's iterator takes collate_fn anew).
    loader = coload.DataLoader(IndexDataset(6), batch_size=3, num_workers=workers)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]
    loader.collate_fn = lambda samples: sum(int(s) for s in samples)
    assert list(loader) == [3, 12]


@pytest.mark.parametrize("kwargs,message", [
    ({"num_workers": -1}, "num_workers option should be non-negative"),
    ({"timeout": -1}, "timeout option should be non-negative"),
    ({"prefetch_factor": 2}, "prefetch_factor option could only be specified"),
    ({"persistent_workers": True}, "persistent_workers option needs num_workers > 0"),
    ({"shuffle": True, "sampler": [0]}, "sampler option is mutually exclusive with shuffle"),
    ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler option is mutually exclusive"),
    ({"batch_size": None, "drop_last": True}, "mutually exclusive with drop_last"),
    ({"executor": "fibers"}, "executor must be 'threads' or 'processes'"),
    ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip'"),
])
def test_bad_arguments_are_refused_with_torch_wording(kwargs, message):
    with pytest.raises(ValueError, match=message):
        coload.DataLoader(IndexDataset(4), **kwargs)


def test_persistent_workers_and_in_order_false_deliver_every_batch():
    loader = coload.DataLoader(IndexDataset(20), batch_size=3, num_workers=2,
                               persistent_workers=True, in_order=False, prefetch_factor=3)
    for _ in range(3):
        assert sorted(i for b in loader for i in b.tolist()) == list(range(20))


def test_break_then_new_epoch_starts_over():
    loader = coload.DataLoader(IndexDataset(10), batch_size=2, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert [b.tolist() for b in loader][0] == [0, 1]


def test_metrics_and_verdict():
    loader = coload.DataLoader(coload.TensorDataset(torch.arange(40)), batch_size=4,
                               num_workers=2)
    assert len(list(loader)) == 10
    m = loader.metrics()
    assert m["batches"] == 10 and m["samples"] == 40
    assert isinstance(loader.verdict(), str) and loader.verdict()


def test_auto_workers():
    loader = coload.DataLoader(coload.TensorDataset(torch.arange(64)), batch_size=8,
                               num_workers=2, auto_workers=True)
    assert torch.cat([b[0] for b in loader]).tolist() == list(range(64))


def test_processes_executor_over_native_dataset():
    x = torch.arange(30).reshape(15, 2)
    loader = coload.DataLoader(coload.TensorDataset(x), batch_size=4, num_workers=2,
                               executor="processes")
    assert torch.cat([b[0] for b in loader]).tolist() == x.tolist()


def test_pin_memory_without_cuda_gives_the_same_batches():
    x = torch.arange(10)
    for dataset in (coload.TensorDataset(x), IndexDataset(10)):
        loader = coload.DataLoader(dataset, batch_size=4, pin_memory=True)
        got = [b[0] if isinstance(b, list) else b for b in loader]
        assert torch.cat(got).tolist() == list(range(10))


def test_multiprocessing_context():
    x = torch.arange(9)
    loader = coload.DataLoader(coload.TensorDataset(x), batch_size=4, num_workers=1,
                               multiprocessing_context="fork")
    assert loader.executor == "processes"
    assert torch.cat([b[0] for b in loader]).tolist() == x.tolist()
    with pytest.raises(ValueError, match="must be 'fork', got 'spawn'"):
        coload.DataLoader(coload.TensorDataset(x), num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="num_workers > 0"):
        coload.DataLoader(coload.TensorDataset(x), multiprocessing_context="fork")


def test_collate_fn_refused_for_native_datasets():
    with pytest.raises(ValueError, match="collate_fn is not supported with TensorDataset"):
        coload.DataLoader(coload.TensorDataset(torch.arange(3)), collate_fn=list)
