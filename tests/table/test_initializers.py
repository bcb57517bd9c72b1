import math

import pytest
import torch

from hashrec.table import HashTable, InitializerArgs, TableError, TableOptions
from hashrec.table.initializers import initial_values

N, DIM = 40000, 16
KEYS = torch.arange(N, dtype=torch.int64) * 7 - 12345


def _draw(mode, key_seed=None, **kwargs):
    args = InitializerArgs(mode=mode, key_seed=key_seed, **kwargs).resolved(DIM, 10000)
    return initial_values(args, KEYS, None, DIM, torch.float32,
                          torch.Generator().manual_seed(0))


@pytest.mark.parametrize("key_seed", [None, 11], ids=["random", "per-key"])
def test_statistics_of_each_mode(key_seed):
    uniform = _draw("UNIFORM", key_seed)
    assert float(uniform.min()) >= -0.01 and float(uniform.max()) <= 0.01
    assert float(uniform.std()) == pytest.approx(0.02 / math.sqrt(12), rel=0.02)
    normal = _draw("NORMAL", key_seed, mean=1.0)
    assert float(normal.mean()) == pytest.approx(1.0, abs=0.01)
    assert float(normal.std()) == pytest.approx(math.sqrt(1 / DIM), rel=0.02)
    truncated = _draw("TRUNCATED_NORMAL", key_seed, std_dev=0.1)
    assert float(truncated.abs().max()) <= 0.2 + 1e-6
    assert float(truncated.std()) == pytest.approx(0.1 * 0.8796, rel=0.02)
    constant = _draw("CONSTANT", key_seed, value=0.25)
    assert bool((constant == 0.25).all())


def test_columns_are_uncorrelated_with_per_key_seed():
    values = _draw("NORMAL", 3).double()
    corr = torch.corrcoef(values.T)
    off_diagonal = corr - torch.eye(DIM, dtype=torch.float64)
    assert float(off_diagonal.abs().max()) < 0.03


def test_per_key_initialization_ignores_batch_order_and_table():
    opts = TableOptions(dim=8, max_capacity=4096, initializer=InitializerArgs(
        mode="NORMAL", key_seed=42))
    first, second = HashTable(opts), HashTable(opts)
    keys = torch.randint(-(2**63), 2**63 - 1, (500,), generator=torch.Generator().manual_seed(2))
    a, _ = first.find_or_insert(keys)
    permutation = torch.randperm(500)
    second.find_or_insert(keys[permutation[:100]])
    b, _ = second.find_or_insert(keys[permutation])
    assert torch.equal(a[permutation], b)
    other_seed = HashTable(TableOptions(dim=8, max_capacity=4096, initializer=InitializerArgs(
        mode="NORMAL", key_seed=43)))
    c, _ = other_seed.find_or_insert(keys)
    assert not torch.equal(a, c)


def test_random_state_puts_back_the_tables_own_draws():
    opts = TableOptions(dim=8, max_capacity=4096, seed=5,
                        initializer=InitializerArgs(mode="NORMAL"))
    table = HashTable(opts)
    table.find_or_insert(torch.arange(10))
    state = table.random_state()
    first, _ = table.find_or_insert(torch.arange(100, 120))
    resumed = HashTable(opts)
    resumed.set_random_state(state)
    again, _ = resumed.find_or_insert(torch.arange(100, 120))
    assert torch.equal(first, again)
    fresh, _ = HashTable(opts).find_or_insert(torch.arange(100, 120))
    assert not torch.equal(first, fresh)
    shared = HashTable(TableOptions(dim=8, max_capacity=4096))
    assert shared.random_state() is None
    with pytest.raises(TableError, match="no generator of its own"):
        shared.set_random_state(state)
