"""500 loaders created and dropped mid-epoch leave nothing behind: threads, fds, memory."""
import gc
import resource

import torch

import coload
from conftest import IndexDataset, fd_count, task_count


def rss_kib():
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
    gc.collect()
    tasks, fds, rss = task_count(), fd_count(), rss_kib()
    for i in range(500):
        cycle(i)
    gc.collect()
    assert task_count() == tasks
    assert fd_count() == fds
    grown = rss_kib() - rss
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB over 500 loaders"
