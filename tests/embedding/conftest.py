import pytest
import torch

from hashrec.embedding import KeyedJaggedTensor


def random_kjt(keys, batch, num_ids, seed, max_bag=4, weighted=False):
    """Bags of ids in [0, num_ids) with duplicates, empty bags and mixed sizes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_bag + 1, (len(keys) * batch,), generator=g)
    lengths[0] = 0  # always one empty bag
    lengths[1] = max_bag  # and one full one
    values = torch.randint(0, num_ids, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths(keys, values, lengths, weights)


@pytest.fixture
def make_kjt():
    return random_kjt
