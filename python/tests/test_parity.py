"""The same index batches as torch.utils.data.DataLoader, epoch after epoch, for each sampler
given a generator (the base-seed draw and RandomSampler's extra randperm included)."""
import pytest
import torch
from torch.utils.data import (BatchSampler, RandomSampler, SubsetRandomSampler,
                              WeightedRandomSampler)

import coload
from conftest import IndexDataset

SEEDS = [0, 1, 1234, 2**40]
EPOCHS = 3


def epochs(loader_cls, make_kwargs, dataset, n_epochs=EPOCHS):
    loader = loader_cls(dataset, **make_kwargs())
    out = [[b.tolist() for b in loader] for _ in range(n_epochs)]
    assert all(len(e) == len(loader) for e in out)
    return out


def both(dataset_n, make_kwargs, workers=0):
    def coload_kwargs():
        return dict(make_kwargs(), num_workers=workers)
    ours = epochs(coload.DataLoader, coload_kwargs, IndexDataset(dataset_n))
    theirs = epochs(torch.utils.data.DataLoader, make_kwargs, IndexDataset(dataset_n))
    return ours, theirs


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_with_generator(seed, workers):
    ours, theirs = both(37, lambda: dict(batch_size=5, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed)), workers)
    assert ours == theirs
    assert ours[0] != ours[1]  # a new order each epoch


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffle_with_global_generator(seed):
    torch.manual_seed(seed)
    ours = epochs(coload.DataLoader, lambda: dict(batch_size=4, shuffle=True), IndexDataset(19))
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    theirs = epochs(torch.utils.data.DataLoader, lambda: dict(batch_size=4, shuffle=True),
                    IndexDataset(19))
    assert ours == theirs
    assert torch.equal(after_ours, torch.rand(3))  # the same draws from the global generator


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("replacement,num_samples", [(False, None), (True, None), (True, 50),
                                                     (False, 45)])
def test_random_sampler(seed, replacement, num_samples):
    def kwargs():
        g = torch.Generator().manual_seed(seed)
        return dict(batch_size=6, generator=g,
                    sampler=RandomSampler(range(23), replacement=replacement,
                                          num_samples=num_samples, generator=g))
    ours, theirs = both(23, kwargs)
    assert ours == theirs


@pytest.mark.parametrize("seed", SEEDS)
def test_subset_random_sampler(seed):
    def kwargs():
        g = torch.Generator().manual_seed(seed)
        return dict(batch_size=3, sampler=SubsetRandomSampler([1, 4, 9, 16, 25, 36, 49], g),
                    generator=g)
    ours, theirs = both(50, kwargs, workers=2)
    assert ours == theirs


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_random_sampler(seed, replacement):
    def kwargs():
        g = torch.Generator().manual_seed(seed)
        w = [0.1, 0.5, 2.0, 1.0, 0.0, 3.0, 0.7, 0.2]
        return dict(batch_size=4, generator=g, drop_last=True,
                    sampler=WeightedRandomSampler(w, 7, replacement=replacement, generator=g))
    ours, theirs = both(8, kwargs)
    assert ours == theirs


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_batch_sampler_and_persistent_workers(seed):
    def kwargs():
        g = torch.Generator().manual_seed(seed)
        return dict(batch_sampler=BatchSampler(RandomSampler(range(17), generator=g), 4, False),
                    generator=g)
    ours, theirs = both(17, kwargs, workers=2)
    assert ours == theirs

    def persistent():
        return dict(batch_size=3, shuffle=True, num_workers=2, persistent_workers=True,
                    generator=torch.Generator().manual_seed(seed))
    ours = epochs(coload.DataLoader, persistent, IndexDataset(14))
    theirs = epochs(torch.utils.data.DataLoader, persistent, IndexDataset(14))
    assert ours == theirs


def test_seed_is_generator_manual_seed():
    ours = epochs(coload.DataLoader, lambda: dict(batch_size=4, shuffle=True, seed=99),
                  IndexDataset(21))
    theirs = epochs(torch.utils.data.DataLoader,
                    lambda: dict(batch_size=4, shuffle=True,
                                 generator=torch.Generator().manual_seed(99)), IndexDataset(21))
    assert ours == theirs


def test_native_dataset_shuffle_parity():
    x = torch.arange(31)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    ours = coload.DataLoader(coload.TensorDataset(x), batch_size=4, shuffle=True, generator=g1,
                             num_workers=2)
    theirs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4,
                                         shuffle=True, generator=g2)
    for _ in range(EPOCHS):
        assert [b[0].tolist() for b in ours] == [b[0].tolist() for b in theirs]


class _OddIndices(torch.utils.data.Sampler):
    """A sampler without __len__, as torch allows."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(1, self.n, 2))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [2, None])
def test_a_sampler_without_len_is_iterated_and_len_is_a_type_error(workers, batch_size):
    # Before, the loader took len() of its BatchSampler, which asks the sampler's: the first
    # iter() raised TypeError where torch's iterates.
    def kwargs():
        return dict(sampler=_OddIndices(10), batch_size=batch_size)
    ours = coload.DataLoader(IndexDataset(10), num_workers=workers, **kwargs())
    theirs = torch.utils.data.DataLoader(IndexDataset(10), **kwargs())
    def listed(loader):  # batch_size=None: each batch is the sample itself, an int
        return [b.tolist() if isinstance(b, torch.Tensor) else b for b in loader]
    got = listed(ours)
    assert got == listed(theirs)
    assert got == ([[1, 3], [5, 7], [9]] if batch_size else [1, 3, 5, 7, 9])
    assert listed(ours) == got  # a second epoch
    for loader in (ours, theirs):
        with pytest.raises(TypeError):
            len(loader)
