"""Shared fixtures of the Python package's tests (run by tools/ci/python.sh and tools/test)."""
import os

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


def fd_count():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def index_dataset():
    return IndexDataset
