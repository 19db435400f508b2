"""state_dict()/load_state_dict(): exact mid-epoch resume into a fresh loader."""
import threading

import pytest
import torch

import coload
from conftest import IndexDataset


def make(dataset_factory, seed_state):
    g = torch.Generator().manual_seed(seed_state)
    return coload.DataLoader(dataset_factory(), batch_size=3, shuffle=True, generator=g,
                             num_workers=2)


@pytest.mark.parametrize("stop_after", [0, 1, 4])
@pytest.mark.parametrize("native", [False, True])
def test_resume_mid_epoch_matches_uninterrupted_run(stop_after, native):
    def dataset():
        return coload.TensorDataset(torch.arange(20)) if native else IndexDataset(20)

    def rows(b):
        return b[0].tolist() if native else b.tolist()

    reference = make(dataset, 7)
    full = [[rows(b) for b in reference] for _ in range(3)]

    first = make(dataset, 7)
    assert [rows(b) for b in first] == full[0]
    assert [rows(b) for b in first] == full[1]
    it = iter(first)
    taken = [rows(next(it)) for _ in range(stop_after)]
    state = first.state_dict()
    del it, first

    resumed = make(dataset, 12345)  # another generator state: load_state_dict sets it
    resumed.load_state_dict(state)
    rest = [rows(b) for b in resumed]
    assert taken + rest == full[2]
    assert [rows(b) for b in resumed] == [rows(b) for b in make_after(dataset, 7, 3)]


def make_after(dataset, seed_state, epochs_before):
    loader = make(dataset, seed_state)
    for _ in range(epochs_before):
        for _ in loader:
            pass
    return loader


def test_state_between_epochs_resumes_the_next_epoch():
    a = make(lambda: IndexDataset(10), 3)
    epoch0 = [b.tolist() for b in a]
    state = a.state_dict()
    epoch1 = [b.tolist() for b in a]
    b = make(lambda: IndexDataset(10), 0)
    b.load_state_dict(state)
    assert [x.tolist() for x in b] == epoch1 != epoch0


def test_state_of_another_dataset_size_is_refused():
    state = make(lambda: IndexDataset(10), 3).state_dict()
    other = make(lambda: IndexDataset(11), 3)
    with pytest.raises(ValueError, match="dataset size"):
        other.load_state_dict(state)


@pytest.mark.parametrize("stop_epoch,stop_after", [(0, 2), (1, 2), (1, 0)])
def test_persistent_workers_resume_exactly(stop_epoch, stop_after):
    # Before, a state saved in the first epoch said the base seed had been drawn: the resumed
    # epoch drew it no more, and its shuffle came from another point of the generator.
    def loader(seed_state):
        return coload.DataLoader(IndexDataset(20), batch_size=3, shuffle=True, num_workers=2,
                                 persistent_workers=True,
                                 generator=torch.Generator().manual_seed(seed_state))
    reference = loader(7)
    full = [[b.tolist() for b in reference] for _ in range(3)]
    theirs = torch.utils.data.DataLoader(IndexDataset(20), batch_size=3, shuffle=True,
                                         num_workers=2, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(7))
    assert full == [[b.tolist() for b in theirs] for _ in range(3)]

    first = loader(7)
    for _ in range(stop_epoch):
        assert [b.tolist() for b in first] == full[_]
    it = iter(first)
    taken = [next(it).tolist() for _ in range(stop_after)]
    state = first.state_dict()
    del it, first
    resumed = loader(12345)
    resumed.load_state_dict(state)
    assert taken + [b.tolist() for b in resumed] == full[stop_epoch]
    for e in range(stop_epoch + 1, 3):
        assert [b.tolist() for b in resumed] == full[e]




def test_load_state_dict_replaces_the_epoch_in_progress_on_the_same_loader():
    # Before, load_state_dict raised "while an epoch is in progress" after any break out of an
    # epoch (the C++ loader takes a state once the epoch is stopped). As torchdata's
    # StatefulDataLoader, it now stops that epoch and the state decides the next.
    reference = make(lambda: IndexDataset(20), 7)
    full = [[b.tolist() for b in reference] for _ in range(2)]
    assert len(full[0]) == 7

    loader = make(lambda: IndexDataset(20), 7)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == full[0][:2]
    state = loader.state_dict()
    assert [next(it).tolist() for _ in range(2)] == full[0][2:4]
    loader.load_state_dict(state)  # while `it` is still held
    with pytest.raises(RuntimeError, match=r"stopped by a later iter\(\) or load_state_dict\(\)"):
        next(it)
    assert [b.tolist() for b in loader] == full[0][2:]
    assert [b.tolist() for b in loader] == full[1]

    # A range-for broken off, then its own state loaded again: the epoch from where it was.
    loader = make(lambda: IndexDataset(20), 7)
    for i, b in enumerate(loader):
        if i == 3:
            state = loader.state_dict()
        if i == 5:
            break
    loader.load_state_dict(state)
    assert [b.tolist() for b in loader] == full[0][4:]
    assert [b.tolist() for b in loader] == full[1]

    # A state refused leaves the epoch it would have replaced as state_dict() describes it.
    other = make(lambda: IndexDataset(11), 7).state_dict()
    loader = make(lambda: IndexDataset(20), 7)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == full[0][:2]
    before = loader.state_dict()
    with pytest.raises(ValueError, match="dataset size"):
        loader.load_state_dict(other)
    after = loader.state_dict()
    assert after["native"] == before["native"]
    assert torch.equal(after["rng"], before["rng"])
    assert after["iterated"] == before["iterated"]
    loader = make(lambda: IndexDataset(20), 0)
    loader.load_state_dict(after)
    assert [b.tolist() for b in loader] == full[0][2:]

    # A state that is not one is refused before the epoch in progress is stopped for it.
    loader = make(lambda: IndexDataset(20), 7)
    it = iter(loader)
    assert next(it).tolist() == full[0][0]
    good = loader.state_dict()
    with pytest.raises(ValueError, match="state without rng"):
        loader.load_state_dict({k: v for k, v in good.items() if k != "rng"})
    with pytest.raises(RuntimeError):
        loader.load_state_dict(dict(good, rng=torch.zeros(3, dtype=torch.uint8)))
    assert [b.tolist() for b in it] == full[0][1:]


def test_iter_after_a_break_waits_for_the_stopped_epochs_index_iterator():
    # The index iterator's call past its last batch runs on the driver, and torch's
    # RandomSampler draws its trailing permutation there. iter() right after a break reads the
    # generator (the state's "rng") and draws the base seed, so it must wait for that call.
    # This sampler's call waits (at most 0.5 s) for iter() to return, then draws: before the
    # fix iter() read the generator before that draw; now the call ends by its timeout, first.
    g = torch.Generator().manual_seed(3)
    in_tail = threading.Event()
    returned = threading.Event()
    ends = []

    class HeldTail(torch.utils.data.Sampler):
        def __init__(self):
            pass

        def __len__(self):
            return 16

        def __iter__(self):
            yield from range(16)
            in_tail.set()
            returned.wait(0.5)
            torch.randperm(8, generator=g)
            ends.append(("after iter()" if returned.is_set() else "first", g.get_state()))

    # iter() takes the first 6 index lists itself (prefetch_factor x num_workers, as torch's);
    # the driver takes the other 2 and reaches the call past the last once 3 batches are
    # consumed (the in-flight bound is 6).
    loader = coload.DataLoader(coload.TensorDataset(torch.arange(16)), batch_size=2,
                               sampler=HeldTail(), num_workers=2, prefetch_factor=3, generator=g)
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert in_tail.wait(60)
    it = iter(loader)  # stops the first epoch, while its driver is inside the sampler
    returned.set()
    rng = loader.state_dict()["rng"]
    assert [b[0].tolist() for b in it] == [[2 * i, 2 * i + 1] for i in range(8)]
    assert [end for end, _ in ends] == ["first", "after iter()"]  # and the next epoch's own
    assert torch.equal(rng, ends[0][1])  # the state the new epoch's draws began from
