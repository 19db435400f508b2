"""Errors arrive as Python's: classes, what the message names, the dataset's traceback; Ctrl-C."""
import os
import pickle
import signal
import subprocess
import threading
import time
import traceback

import pytest
import torch

import coload
from conftest import IndexDataset, settled_task_count, task_count


class Fails(IndexDataset):
    def __getitem__(self, i):
        if i == 6:
            raise KeyError(f"no sample {i} here")
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_sample_error_names_worker_batch_sample_and_keeps_traceback(workers):
    loader = coload.DataLoader(Fails(10), batch_size=4, num_workers=workers)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(coload.SampleError) as info:
        next(it)
    e = info.value
    assert isinstance(e, RuntimeError)
    assert e.batch == 1 and e.index == 6
    assert (e.worker_id in (0, 1)) if workers else e.worker_id == -1
    assert e.pid == -1
    message = str(e)
    assert "6" in message and "no sample 6 here" in message
    assert isinstance(e.__cause__, KeyError)
    # Also a KeyError, as torch raises the worker's KeyError again: `except KeyError:` holds.
    assert isinstance(e, KeyError) and not isinstance(e, ValueError)
    frames = traceback.extract_tb(e.__cause__.__traceback__)
    assert frames[-1].name == "__getitem__" and frames[-1].filename == __file__
    # The epoch goes on after the failed batch, as torch's does not (it re-raises); coload
    # delivers the batches after it.
    assert next(it).tolist() == [8, 9]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_error_is_also_of_the_datasets_exception_type(workers):
    class Raises(IndexDataset):
        def __init__(self, n, error):
            super().__init__(n)
            self.error = error

        def __getitem__(self, i):
            if i == 2:
                raise self.error
            return i

    def error_of(error):
        loader = coload.DataLoader(Raises(4, error), batch_size=2, num_workers=workers)
        with pytest.raises(coload.SampleError) as info:
            list(loader)
        return info.value

    e = error_of(FileNotFoundError(2, "no such file", "x.jpg"))  # OSError's own layout
    assert isinstance(e, FileNotFoundError) and isinstance(e, RuntimeError)
    assert "no such file" in str(e) and e.index == 2
    # One class per type, kept; pickled and loaded, the same class with the same attributes.
    assert type(error_of(FileNotFoundError(2, "again"))) is type(e)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is type(e) and str(again) == str(e) and again.index == 2
    plain = pickle.loads(pickle.dumps(coload.SampleError("plain")))
    assert type(plain) is coload.SampleError and str(plain) == "plain"
    # A StopIteration stays a plain SampleError: raised from next(), it would end the loop.
    e = error_of(StopIteration("done"))
    assert type(e) is coload.SampleError and isinstance(e.__cause__, StopIteration)

    # A type whose constructor wants more than a message, or that refuses an attribute the
    # error carries: a plain SampleError, never an error of its own.
    class Guarded(Exception):
        @property
        def index(self):
            return None

    for error in (ExceptionGroup("group", [ValueError("v")]), Guarded("guarded")):
        e = error_of(error)
        assert type(e) is coload.SampleError and type(e.__cause__) is type(error)
    # A type defined in a function is not kept, and pickles as a plain SampleError.
    class Local(ValueError):
        pass

    e = error_of(Local("local"))
    assert isinstance(e, Local)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is coload.SampleError and str(again) == str(e) and again.index == 2


def test_on_error_skip_leaves_the_sample_out():
    loader = coload.DataLoader(Fails(10), batch_size=4, on_error="skip")
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 7], [8, 9]]
    assert loader.skipped() == 1


def test_collate_error_is_a_sample_error_with_no_index():
    def collate(samples):
        raise ValueError("cannot collate")
    with pytest.raises(coload.SampleError, match="cannot collate") as info:
        list(coload.DataLoader(IndexDataset(4), batch_size=2, collate_fn=collate))
    assert info.value.index == -1 and isinstance(info.value.__cause__, ValueError)


def test_timeout_error():
    release = threading.Event()

    class Slow(IndexDataset):
        def __getitem__(self, i):
            if i == 2:
                release.wait(10)
            return i

    loader = coload.DataLoader(Slow(4), batch_size=2, num_workers=1, timeout=0.2)
    it = iter(loader)
    try:  # the worker let go even when an assertion fails: the next test counts threads
        assert next(it).tolist() == [0, 1]
        t0 = time.monotonic()
        with pytest.raises(coload.TimeoutError) as info:
            next(it)
        assert time.monotonic() - t0 < 10  # 0.2 s asked; generous for a loaded 2-core machine
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, RuntimeError)
        assert info.value.batch == 1 and "0.2" in str(info.value)
    finally:
        release.set()


def test_bad_index_from_a_sampler_names_it():
    loader = coload.DataLoader(coload.TensorDataset(torch.arange(5)), sampler=[0, 7],
                               batch_size=2)
    with pytest.raises(IndexError, match="the batch_sampler gave index 7 in batch 0, outside the "
                       "dataset's 5 samples"):
        list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_key_from_a_sampler_is_refused_by_name(workers):
    # torch's fetcher hands any key to __getitem__; coload's indices are integers (they travel
    # to its workers and into its state): a key is named with its batch, after the batches
    # before it.
    loader = coload.DataLoader(list(range(5)), sampler=[0, 1, 2, "x"], batch_size=2,
                               num_workers=workers)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(TypeError, match=r"the batch_sampler gave 'x' \(str\) in batch 1, which "
                                        "is not a 64-bit integer index"):
        next(it)
    with pytest.raises(TypeError, match=r"gave 1180591620717411303424 \(int\) in batch 0"):
        next(iter(coload.DataLoader(list(range(5)), sampler=[2**70], num_workers=workers)))


def test_keyboard_interrupt_stops_the_epoch_and_leaves_no_thread():
    before = settled_task_count()
    release = threading.Event()

    class Stuck(IndexDataset):
        def __getitem__(self, i):
            if i >= 4:
                release.wait(20)
            return i

    loader = coload.DataLoader(Stuck(100), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    # A real SIGINT from another process, as Ctrl-C sends it, to Python's own handler: a shell
    # without job control starts a background command (CI's) with SIGINT ignored, and Python
    # then installs no handler, so Ctrl-C could not reach any loop (this hung CI twice).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -INT {os.getpid()}"])
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()  # the workers let go even when an assertion fails
    assert time.monotonic() - t0 < 10  # promptly (signals are checked every 50 ms; 2 cores may be busy)
    assert killer.wait() == 0
    del it, loader
    deadline = time.monotonic() + 10
    while task_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)  # the threads' exit is observed, not waited for with a fixed sleep
    assert task_count() == before, os.listdir("/proc/self/task")


def test_folder_errors_are_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        coload.vision.ImageFolder(tmp_path / "missing")
    with pytest.raises(ValueError, match="classic"):
        coload.vision.ImageFolder(tmp_path, recipe="no-such-recipe")


def children_of_self():
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


class WaitsOnPipe(IndexDataset):
    """Samples 0 and 1 come at once; each later one first reads a byte from a pipe that the test
    fills only after its kill, so both workers hold a batch when one of them is killed."""

    def __init__(self, n, fd):
        super().__init__(n)
        self.fd = fd

    def __getitem__(self, i):
        if i >= 2:
            os.read(self.fd, 1)
        return i


def test_worker_process_killed_is_worker_died():
    import signal
    before = children_of_self()
    # NOTE: the victim is killed holding a batch (its samples wait on the pipe), so the error
    # names that batch. A worker killed idle fails the next batch asked for instead (since
    # session 21; before, it was absorbed, and on a loaded machine this case once ended its
    # epoch without an error): tests/exec/process_pool_test.cpp checks that path.
    r, w = os.pipe()
    loader = coload.DataLoader(WaitsOnPipe(4000, r), batch_size=1, num_workers=2,
                               executor="processes")
    it = iter(loader)
    next(it)
    workers = children_of_self() - before
    assert len(workers) == 2
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    os.write(w, b"x" * 4000)  # the survivor goes on; the victim read nothing more
    with pytest.raises(coload.WorkerDied) as info:
        for _ in it:
            pass
    os.close(r)
    os.close(w)
    e = info.value
    assert e.pid == victim and e.signal == signal.SIGKILL and e.worker_id in (0, 1)
    assert str(victim) in str(e)
    del it, loader
    deadline = time.monotonic() + 10
    while children_of_self() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children_of_self() - before == set()  # no child left behind
