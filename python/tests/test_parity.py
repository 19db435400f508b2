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


class _Seeds(IndexDataset):
    """Sample i: (i, the worker's id, the worker's seed) as torch's get_worker_info() tells it."""

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return (i, info.id, info.seed)


def _worker_seeds(loader_cls, n_epochs=3, **kwargs):
    loader = loader_cls(_Seeds(12), batch_size=3, num_workers=2, collate_fn=lambda s: s, **kwargs)
    out = []
    for _ in range(n_epochs):
        seeds = {}
        for batch in loader:
            for _, worker, seed in batch:
                assert seeds.setdefault(worker, seed) == seed  # one seed a worker an epoch
        out.append(seeds)
    return out


@pytest.mark.parametrize("executor", ["threads", "processes"])
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_seeds_are_torchs(executor, persistent):
    # Before, the workers' seeds came from a base seed the native loader drew from its own
    # generator: not torch's, whatever the generator or torch.manual_seed said.
    def run(loader_cls, **kwargs):
        return _worker_seeds(loader_cls, persistent_workers=persistent,
                             generator=torch.Generator().manual_seed(7), **kwargs)
    def same(ours, theirs):
        # A worker thread takes whichever batch is next, so one may serve a whole epoch: the
        # workers seen have torch's seeds for their ids.
        assert len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            assert o and o.items() <= t.items()
    ours = run(coload.DataLoader, executor=executor)
    theirs = run(torch.utils.data.DataLoader)
    same(ours, theirs)
    bases = [e[0] for e in theirs]
    assert theirs[0] == {0: bases[0], 1: bases[0] + 1}
    assert len(set(bases)) == (1 if persistent else 3)  # drawn once, or each epoch

    torch.manual_seed(11)  # the global generator, when the loader has none
    ours = _worker_seeds(coload.DataLoader, n_epochs=2, executor=executor)
    torch.manual_seed(11)
    same(ours, _worker_seeds(torch.utils.data.DataLoader, n_epochs=2))


def test_iter_with_workers_draws_the_shuffles_seed_before_it_returns():
    # torch's iterator with workers takes its first index lists within iter(): RandomSampler
    # without a generator draws its seed from the global generator there. Before, coload's
    # driver drew it later, so the caller's own draws right after iter() raced it (the order
    # and the caller's numbers changed from run to run).
    torch.manual_seed(0)
    theirs = torch.utils.data.DataLoader(IndexDataset(10), batch_size=5, shuffle=True,
                                         num_workers=2)
    it = iter(theirs)
    expected = (torch.randint(1000, (4,)).tolist(), [b.tolist() for b in it])
    for round in range(20):
        torch.manual_seed(0)
        ours = coload.DataLoader(IndexDataset(10), batch_size=5, shuffle=True, num_workers=2)
        it = iter(ours)
        got = (torch.randint(1000, (4,)).tolist(), [b.tolist() for b in it])
        assert got == expected, round


def test_iter_with_workers_takes_torchs_prefetch_of_index_lists():
    # torch takes prefetch_factor x num_workers index lists within iter(): a batch sampler that
    # draws from the global generator for each batch makes those draws before iter() returns.
    class Drawing(torch.utils.data.Sampler):
        def __init__(self):
            pass

        def __len__(self):
            return 4

        def __iter__(self):
            for b in range(4):
                yield [2 * b + int(torch.randint(2, ()))]

    def run(cls):
        torch.manual_seed(5)
        it = iter(cls(IndexDataset(8), batch_sampler=Drawing(), num_workers=2))
        return torch.randint(1000, (4,)).tolist(), [b.tolist() for b in it]

    expected = run(torch.utils.data.DataLoader)
    for round in range(10):
        assert run(coload.DataLoader) == expected, round


def _first_base_seed(seed):
    return int(torch.empty((), dtype=torch.int64).random_(
        generator=torch.Generator().manual_seed(seed)).item())


def test_a_sampler_that_fails_in_iter_leaves_persistent_workers_to_draw_the_base_seed_again():
    # torch never made the iterator whose sampler raised: the next iter() draws a base seed
    # anew. Before, coload kept the failed call's seed for its persistent workers.
    class FailsOnce(torch.utils.data.Sampler):
        def __init__(self):
            self.calls = 0

        def __len__(self):
            return 4

        def __iter__(self):
            self.calls += 1
            if self.calls == 1:
                raise KeyError("not yet")
            return iter(range(4))

    class Seeds(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return info.seed - info.id  # the base seed (coload's threads take batches as
            # they come free, so which workers fetched them varies)

    def run(cls):
        loader = cls(Seeds(), batch_size=2, sampler=FailsOnce(), num_workers=2,
                     persistent_workers=True, generator=torch.Generator().manual_seed(1))
        with pytest.raises(KeyError, match="not yet"):
            iter(loader)
        return {int(s) for b in loader for s in b}

    theirs = run(torch.utils.data.DataLoader)
    assert len(theirs) == 1
    assert run(coload.DataLoader) == theirs
    # The seed of the failed iter(): what coload's workers had before.
    assert theirs != {_first_base_seed(1)}


def test_a_later_iter_stops_the_earlier_iterator_which_then_raises():
    # Before, epochs started back to back could hand the later epoch's index iterator to the
    # earlier (stopped) one, the later failing with "'NoneType' object is not iterable"; and an
    # earlier iterator went on with the later epoch's batches.
    loader = coload.DataLoader(IndexDataset(20), batch_size=4, num_workers=2,
                               sampler=torch.utils.data.SequentialSampler(range(20)))
    expected = [[i, i + 1, i + 2, i + 3] for i in range(0, 20, 4)]
    stale = []
    for round in range(40):
        it = iter(loader)
        if round % 3 == 0:
            assert next(it).tolist() == expected[0]
        stale.append(it)
    assert [b.tolist() for b in stale.pop()] == expected[1:]  # the last had given its first
    for it in stale[-3:]:
        with pytest.raises(RuntimeError, match="stopped by a later iter"):
            next(it)
    assert [b.tolist() for b in loader] == expected


class _NoLen(torch.utils.data.Dataset):
    """A map-style dataset without __len__: torch's loader takes it where a sampler names the
    indices."""

    def __getitem__(self, i):
        if i >= 100:
            raise IndexError(f"index {i} out of range")
        return i * 10


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_without_len_is_loaded_through_a_sampler(workers):
    # Before, the native loader took len(dataset) when it was made: TypeError at the first iter().
    def kwargs():
        return dict(sampler=[5, 99, 0, 42, 7], batch_size=2)
    ours = coload.DataLoader(_NoLen(), num_workers=workers, **kwargs())
    theirs = torch.utils.data.DataLoader(_NoLen(), **kwargs())
    got = [b.tolist() for b in ours]
    assert got == [b.tolist() for b in theirs] == [[50, 990], [0, 420], [70]]
    assert len(ours) == len(theirs) == 3
    beyond = coload.DataLoader(_NoLen(), sampler=[1, 100], batch_size=1, num_workers=workers)
    it = iter(beyond)
    assert next(it).tolist() == [10]
    with pytest.raises(Exception, match="index 100 out of range"):
        next(it)
    without_sampler = coload.DataLoader(_NoLen(), batch_size=2, num_workers=workers)
    with pytest.raises(TypeError):  # as torch's SequentialSampler, at the first iter()
        list(without_sampler)
