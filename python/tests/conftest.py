"""Shared fixtures of the Python package's tests (run by tools/ci/python.sh and tools/test)."""
import gc
import os
import time

import pytest
import torch

torch.set_num_threads(1)  # 2 cores, shared: torch's intra-op threads only oversubscribe them


class IndexDataset(torch.utils.data.Dataset):
    """Sample i is i: batches show exactly which indices were fetched."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def task_count():
    return len(os.listdir("/proc/self/task"))


def settled_task_count(seconds=10):
    """The task count once no coload thread is left: one that let go of an earlier test's loader
    (a loader finalised on its own worker is released from a detached thread, named as that
    worker) may still be ending, and counted into a baseline it then leaves. Observed until
    gone, up to a deadline; never slept on as a sync."""
    def coload_threads():
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # ended since listed
                pass
        return [n for n in names if n.startswith("coload")]

    gc.collect()  # loaders an earlier test left in cycles (a traceback's frames) close now
    deadline = time.monotonic() + seconds
    while coload_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert coload_threads() == [], "coload threads outlived their loaders"
    return task_count()


def fd_count():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def index_dataset():
    return IndexDataset
