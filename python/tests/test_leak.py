"""500 loaders created and dropped mid-epoch leave nothing behind: threads, fds, memory."""
import copy
import ctypes
import gc
import time
import resource
import threading
import weakref

import pytest

import torch

import coload
from conftest import IndexDataset, fd_count, settled_task_count, task_count


try:
    # Under ASan (python/tests/sanitized.sh preloads its runtime) freed blocks wait in its
    # quarantine (256 MiB by default), so RSS grows by design: the allocator's own count of live
    # bytes is then the measure of what stayed.
    _live_bytes = ctypes.CDLL(None).__sanitizer_get_current_allocated_bytes
    _live_bytes.restype = ctypes.c_size_t
except AttributeError:
    _live_bytes = None


def rss_kib():
    """Resident KiB, or under ASan the KiB its allocator holds live."""
    if _live_bytes is not None:
        return _live_bytes() // 1024
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def cycle(i):
    dataset = coload.TensorDataset(torch.arange(64)) if i % 2 else IndexDataset(64)
    loader = coload.DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True,
                               generator=torch.Generator().manual_seed(i))
    it = iter(loader)
    next(it)
    next(it)
    # dropped mid-epoch, batches in flight


def test_500_loaders_dropped_mid_epoch():
    for i in range(20):  # warm up allocators and caches
        cycle(i)
    tasks, fds, rss = settled_task_count(), fd_count(), rss_kib()
    for i in range(500):
        cycle(i)
    gc.collect()
    # A joined thread can stay listed in /proc/self/task for a moment after pthread_join
    # returns: the counts are observed until they are back, up to a deadline, never slept on.
    deadline = time.monotonic() + 10
    while (task_count(), fd_count()) != (tasks, fds) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert task_count() == tasks
    assert fd_count() == fds
    grown = rss_kib() - rss
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB over 500 loaders"


class _Trainer:
    """Holds its loader, whose collate_fn and worker_init_fn are its own bound methods: a cycle
    (as a training class often makes one) that Python's collector must be able to break."""

    def __init__(self, executor):
        self.inits = 0
        self.loader = coload.DataLoader(IndexDataset(32), batch_size=4, num_workers=2,
                                        collate_fn=self.collate, worker_init_fn=self.init,
                                        executor=executor)
        self.first = next(iter(self.loader))  # mid-epoch: workers running

    def collate(self, samples):
        return torch.tensor(samples) * 10

    def init(self, worker_id):
        self.inits += 1


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_loader_in_a_cycle_through_its_collate_fn_is_collected(executor):
    # A first fork ends the thread of OpenBLAS (numpy's, which torch 2.x imports), whose at-fork
    # handler shuts its threads down until its next call: forked once before the baseline.
    assert len(list(coload.DataLoader(IndexDataset(4), num_workers=1, executor=executor))) == 4
    tasks, fds = settled_task_count(), fd_count()
    trainers = []
    for _ in range(5):
        t = _Trainer(executor)
        assert t.first.tolist() == [0, 10, 20, 30]  # the bound collate ran
        trainers.append(weakref.ref(t))
        del t
    # Before, the loader held the bound methods from C++, where the collector could not see
    # them: every trainer, its loader and its two workers stayed. A worker still inside a
    # trainer's collate (its prefetch) holds that trainer until the call returns: collected
    # again until each is gone, up to a deadline.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gc.collect()
        if [r() for r in trainers] == [None] * 5 and (task_count(), fd_count()) == (tasks, fds):
            break
        time.sleep(0.05)
    assert [r() for r in trainers] == [None] * 5
    assert (task_count(), fd_count()) == (tasks, fds)


def test_a_copy_outlives_its_original_and_worker_init_fn_may_be_unset():
    # The native loader calls back through a weak reference to its DataLoader: a copy, which
    # shared the original's, failed once the original was gone; a copy now makes its own.
    inits = []
    loader = coload.DataLoader(IndexDataset(8), batch_size=4, num_workers=2,
                               collate_fn=lambda b: b, worker_init_fn=inits.append)
    assert next(iter(loader)) == [0, 1, 2, 3]
    copied = copy.copy(loader)
    del loader
    gc.collect()
    assert list(copied) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Set to None after use, it is not called (as torch's reads it for each epoch's workers);
    # the call through the weak reference raised "'NoneType' object is not callable".
    assert inits
    called = len(inits)
    copied.worker_init_fn = None
    assert list(copied) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(inits) == called


def test_a_loader_collected_on_its_own_worker_lets_go_at_once(capfd):
    # Python's collector runs on whichever thread allocates: here a worker, inside the dataset,
    # collects the trainer's cycle and so finalizes the very loader it fetches for. Closing it
    # there waited for that worker's own fetch: 2 s, then a warning of a stuck fetch.
    release = threading.Event()

    class Collecting(IndexDataset):
        def __getitem__(self, i):
            if i == 2:  # in flight once batch 0 is taken (two batches ahead, one worker)
                release.wait(10)
                gc.collect()
            return i

    class Trainer:
        def __init__(self):
            self.loader = coload.DataLoader(Collecting(64), batch_size=1, num_workers=1,
                                            collate_fn=self.collate)

        def collate(self, samples):
            return samples[0]

    tasks = settled_task_count()
    t = Trainer()
    it = iter(t.loader)
    assert next(it) == 0
    gone = weakref.ref(t)
    del it, t
    release.set()
    deadline = time.monotonic() + 10
    while (gone() is not None or task_count() != tasks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone() is None
    assert task_count() == tasks
    assert "DataLoader destroyed while its fetches had not ended" not in capfd.readouterr().err


EXIT_SCRIPT = """
import sys, time, torch, coload
class D(torch.utils.data.Dataset):
    def __len__(self): return 1000
    def __getitem__(self, i):
        time.sleep(0.001); return i
loader = coload.DataLoader(D(), batch_size=4, num_workers=2, shuffle=True)
it = iter(loader); next(it)
native = coload.DataLoader(coload.TensorDataset(torch.arange(1000)), batch_size=4, num_workers=2)
it2 = iter(native); next(it2)
print("end", flush=True)
sys.exit(int(sys.argv[1]))
"""


def test_exit_with_loaders_mid_epoch_is_clean():
    # Worker threads that wanted the GIL while the interpreter finalized used to abort the
    # process (a reference dropped without the GIL): loaders are closed at exit.
    import subprocess
    import sys
    for code in (0, 3):
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", EXIT_SCRIPT, str(code)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == code, r.stderr[-2000:]
        assert r.stdout == "end\n" and "terminate" not in r.stderr


def test_closed_loader_refuses_its_iterator():
    loader = coload.DataLoader(IndexDataset(8), batch_size=2, num_workers=1)
    it = iter(loader)
    next(it)
    native = loader._native
    loader.close()
    import pytest
    with pytest.raises(RuntimeError, match="the loader was closed"):
        native.next()
    assert [b.tolist() for b in loader][0] == [0, 1]  # used again: new workers
