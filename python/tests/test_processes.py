"""Python datasets in worker processes (executor="processes"): forked as torch forks its workers,
the dataset, collate_fn and worker_init_fn run in the child with the GIL, the batch comes back
through coload's shared-memory slots; errors, deaths and leaks."""
import gc
import os
import signal
import time

import pytest
import torch
from torch.utils.data import IterableDataset

import coload
from conftest import IndexDataset, fd_count, settled_task_count, task_count


def children_of_self():
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


@pytest.fixture(autouse=True)
def collect_loaders():
    # A loader kept by a cycle (an exception's traceback holds the frame that holds it) would
    # close whenever the collector runs, in a later test that counts threads: closed here.
    yield
    gc.collect()


def wait_for_no_children(before, seconds=10):
    # Observed until they are gone (reaped), up to a deadline; never slept on as a sync.
    deadline = time.monotonic() + seconds
    while children_of_self() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return children_of_self() - before


class Records(torch.utils.data.Dataset):
    """A sample says which process made it and holds a tensor, a string and a nested tuple."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((2, 3), float(i)), "i": i, "name": f"s{i}",
                "pair": (torch.tensor([i, -i], dtype=torch.int16), i * 0.5)}


def as_plain(batch):
    return {"x": batch["x"].tolist(), "i": batch["i"].tolist(), "name": list(batch["name"]),
            "pair": (batch["pair"][0].tolist(), batch["pair"][1].tolist())}


def test_map_style_batches_equal_num_workers_0_and_torch():
    def run(make):
        out = []
        for epoch in range(2):
            out.append([as_plain(b) for b in make()])
        return out

    def coload_loader(**kw):
        loader = coload.DataLoader(Records(23), batch_size=4, shuffle=True,
                                   generator=torch.Generator().manual_seed(7), **kw)
        return lambda: loader
    processes = run(coload_loader(num_workers=2, executor="processes"))
    inline = run(coload_loader(num_workers=0))
    torch_loader = torch.utils.data.DataLoader(Records(23), batch_size=4, shuffle=True,
                                               generator=torch.Generator().manual_seed(7),
                                               num_workers=2)
    reference = run(lambda: torch_loader)
    assert processes == inline == reference
    assert processes[0] != processes[1]  # two epochs, two orders
    assert len(processes[0]) == 6 and processes[0][-1]["x"][0] == [[processes[0][-1]["i"][0]] * 3] * 2


class WhoAmI(IndexDataset):
    """(index, pid, what worker_init_fn left in this process, torch's and coload's worker info,
    torch's initial seed)."""

    tag = None

    def __getitem__(self, i):
        theirs = torch.utils.data.get_worker_info()
        ours = coload.get_worker_info()
        return (i, os.getpid(), WhoAmI.tag, theirs.id, theirs.num_workers, ours.id,
                type(ours.dataset).__name__, ours.seed, torch.initial_seed())


def tag_worker(worker_id):
    info = torch.utils.data.get_worker_info()
    assert info is not None and info.id == worker_id
    WhoAmI.tag = f"init{worker_id}:{os.getpid()}"


def test_samples_are_made_in_child_processes_with_worker_init_fn_and_worker_info():
    before = children_of_self()
    loader = coload.DataLoader(WhoAmI(12), batch_size=3, num_workers=2, executor="processes",
                               worker_init_fn=tag_worker, collate_fn=lambda s: s)
    rows = [row for batch in loader for row in batch]
    assert [r[0] for r in rows] == list(range(12))
    pids = {r[1] for r in rows}
    assert len(pids) == 2 and os.getpid() not in pids
    for i, pid, tag, theirs_id, theirs_n, ours_id, ds_type, seed, initial in rows:
        assert tag == f"init{ours_id}:{pid}"  # worker_init_fn ran in this very process
        assert theirs_id == ours_id and theirs_n == 2 and ds_type == "WhoAmI"
        assert initial == seed  # torch seeded per worker, as torch's workers are
    assert WhoAmI.tag is None  # nothing ran in the parent
    assert len({r[7] for r in rows}) == 2
    del loader
    assert wait_for_no_children(before) == set()


def test_persistent_workers_keep_their_processes_others_fork_anew():
    def pids_per_epoch(persistent):
        loader = coload.DataLoader(WhoAmI(8), batch_size=2, num_workers=2, executor="processes",
                                   persistent_workers=persistent, collate_fn=lambda s: s)
        return [{r[1] for b in loader for r in b} for _ in range(2)]
    first, second = pids_per_epoch(True)
    assert first == second and len(first) == 2
    first, second = pids_per_epoch(False)
    assert not first & second


class Shards(IterableDataset):
    """Yields its range split between workers by torch's get_worker_info(), as torch's docs
    show, tagged with the pid that made each value."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            lo, hi = self.start, self.end
        else:
            per = -(-(self.end - self.start) // info.num_workers)
            lo = self.start + info.id * per
            hi = min(lo + per, self.end)
        return iter([(v, os.getpid()) for v in range(lo, hi)])


def test_iterable_dataset_shards_per_worker_as_torch():
    got = [b for b in coload.DataLoader(Shards(3, 20), batch_size=3, num_workers=2,
                                        executor="processes")]
    reference = [b for b in torch.utils.data.DataLoader(Shards(3, 20), batch_size=3,
                                                        num_workers=2)]
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in reference]
    assert sorted(v for b in got for v in b[0].tolist()) == list(range(3, 20))
    assert len({p for b in got for p in b[1].tolist()}) == 2
    assert os.getpid() not in {p for b in got for p in b[1].tolist()}


class Fails(IndexDataset):
    def __getitem__(self, i):
        if i == 6:
            raise KeyError(f"no sample {i} here")
        return i


def test_python_exception_in_child_is_sample_error_with_its_traceback():
    before = children_of_self()
    loader = coload.DataLoader(Fails(10), batch_size=4, num_workers=2, executor="processes")
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(coload.SampleError) as info:
        next(it)
    e = info.value
    assert e.batch == 1 and e.index == 6 and e.worker_id in (0, 1)
    assert e.pid > 0 and e.pid != os.getpid()
    assert e.original_type == "KeyError"
    assert isinstance(e, KeyError)  # a built-in type, known by its name: `except KeyError:`
    message = str(e)
    assert message.startswith(f"Caught KeyError in DataLoader worker {e.worker_id} (pid {e.pid}) "
                              "while fetching sample 6 of batch 1.\n"
                              "Original Traceback (most recent call last):\n")
    # The child's own traceback: this file, the dataset's method, the line that raised.
    assert f'File "{__file__}"' in e.traceback and "in __getitem__" in e.traceback
    assert 'raise KeyError(f"no sample {i} here")' in e.traceback
    assert e.traceback.rstrip().endswith("KeyError: 'no sample 6 here'")
    assert e.traceback in message
    assert next(it).tolist() == [8, 9]  # the epoch goes on, as with worker threads
    del it, loader
    assert wait_for_no_children(before) == set()


def test_collate_and_worker_init_errors_in_child():
    def collate(samples):
        raise ValueError("cannot collate")
    with pytest.raises(coload.SampleError) as info:
        list(coload.DataLoader(IndexDataset(4), batch_size=2, num_workers=1,
                               executor="processes", collate_fn=collate))
    assert info.value.index == -1 and info.value.original_type == "ValueError"
    assert isinstance(info.value, ValueError)
    assert "in collate" in info.value.traceback and "cannot collate" in str(info.value)

    def bad_init(worker_id):
        raise RuntimeError(f"init of {worker_id} failed")
    with pytest.raises(coload.SampleError, match="init of 0 failed") as info:
        list(coload.DataLoader(IndexDataset(4), batch_size=2, num_workers=1,
                               executor="processes", worker_init_fn=bad_init))
    assert "in bad_init" in info.value.traceback


class DiesAt(IndexDataset):
    def __getitem__(self, i):
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_child_killed_by_a_signal_is_worker_died():
    before = children_of_self()
    loader = coload.DataLoader(DiesAt(12), batch_size=2, num_workers=2, executor="processes")
    with pytest.raises(coload.WorkerDied) as info:
        list(loader)
    e = info.value
    assert e.signal == signal.SIGKILL and e.pid > 0 and e.pid != os.getpid()
    assert e.batch == 2 and e.worker_id in (0, 1) and f"pid {e.pid}" in str(e)
    del loader
    assert wait_for_no_children(before) == set()


def test_batch_size_none_and_a_python_collate_fn():
    loader = coload.DataLoader(Records(5), batch_size=None, num_workers=2, executor="processes")
    got = list(loader)
    assert [b["i"] for b in got] == list(range(5)) and got[3]["x"].tolist() == [[3.0] * 3] * 2
    loader = coload.DataLoader(IndexDataset(7), batch_size=3, num_workers=2, executor="processes",
                               collate_fn=lambda s: {"sum": sum(s), "items": s})
    assert list(loader) == [{"sum": 3, "items": [0, 1, 2]}, {"sum": 12, "items": [3, 4, 5]},
                            {"sum": 6, "items": [6]}]


def test_loaders_dropped_mid_epoch_leave_no_child_thread_or_fd():
    def cycle(i):
        loader = coload.DataLoader(Records(64), batch_size=4, num_workers=2, shuffle=True,
                                   executor="processes",
                                   generator=torch.Generator().manual_seed(i))
        it = iter(loader)
        next(it)
        next(it)

    cycle(0)
    before, tasks, fds = children_of_self(), settled_task_count(), fd_count()
    for i in range(30):
        cycle(i)
    assert wait_for_no_children(before) == set()  # every child reaped
    deadline = time.monotonic() + 10
    while (task_count(), fd_count()) != (tasks, fds) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (task_count(), fd_count()) == (tasks, fds)


class _Garbage:
    """A cycle the parent has dropped; its finaliser writes the pid of the process that runs it."""

    def __init__(self, fd):
        self.fd = fd
        self.me = self

    def __del__(self):
        os.write(self.fd, b"%d\n" % os.getpid())


class _Collecting(IndexDataset):
    def __getitem__(self, i):
        gc.collect()  # the worker's collector, as any allocation may run it
        return i


def test_a_worker_never_finalises_the_parents_garbage():
    # A child's collector once finalised the cycles it inherited: a dropped batch's slot lease
    # then took a mutex that another of the parent's threads had held at the fork, and the worker
    # hung. What a child inherits is frozen there: only the parent collects it.
    r, w = os.pipe()
    os.set_blocking(r, False)
    gc.disable()  # the garbage waits for the fork, as it did when the collector had not yet run
    try:
        _Garbage(w)
        loader = coload.DataLoader(_Collecting(4), batch_size=2, num_workers=2,
                                   executor="processes")
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    finally:
        gc.enable()
    gc.collect()
    pids = os.read(r, 4096).split()
    os.close(r)
    os.close(w)
    assert pids == [b"%d" % os.getpid()]
