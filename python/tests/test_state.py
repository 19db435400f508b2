"""state_dict()/load_state_dict(): exact mid-epoch resume into a fresh loader."""
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
