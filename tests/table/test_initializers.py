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


def _truncated_mean(mean: float, std: float, lower: float | None, upper: float | None) -> float:
    """Mean of a normal (mean, std) cut at [lower, upper] (None: not cut on that side)."""
    def pdf(z):
        return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    def cdf(z):
        return 0.5 * math.erfc(-z / math.sqrt(2))

    a = -math.inf if lower is None else (lower - mean) / std
    b = math.inf if upper is None else (upper - mean) / std
    pa, pb = (0.0 if a == -math.inf else pdf(a)), (0.0 if b == math.inf else pdf(b))
    if a > 0:  # the upper tail: the CDF's complement keeps its precision
        mass = cdf(-a) - cdf(-b)
    else:
        mass = cdf(b) - cdf(a)
    return mean + std * (pa - pb) / mass


@pytest.mark.parametrize("key_seed", [None, 11], ids=["random", "per-key"])
@pytest.mark.parametrize("lower, upper", [
    (-0.25, 0.5),  # inside mean -+ 2 std on the left, outside on the right
    (0.5, None),  # one-sided at the mean: a half normal
    (None, -0.5),  # one-sided 3 std below the mean: the lower tail only
    (1.5, None),  # 7 std above the mean: far in the upper tail
], ids=["both", "lower-at-mean", "upper-only", "far-tail"])
def test_truncated_normal_cuts_at_the_bounds_set(key_seed, lower, upper):
    mean, std = 0.1, 0.2
    drawn = _draw("TRUNCATED_NORMAL", key_seed, mean=mean, std_dev=std, lower=lower,
                  upper=upper).double()
    assert bool(drawn.isfinite().all())
    if lower is not None:
        assert float(drawn.min()) >= lower
    if upper is not None:
        assert float(drawn.max()) <= upper
    want = _truncated_mean(mean, std, lower, upper)
    assert float(drawn.mean()) == pytest.approx(want, abs=0.005 * std)
    if upper is None and lower <= mean:  # the open side is not cut at mean + 2 std
        assert float(drawn.max()) > mean + 3 * std


def test_truncated_normal_without_bounds_cuts_at_two_std():
    drawn = _draw("TRUNCATED_NORMAL", 5, mean=0.5, std_dev=0.1).double()
    assert float(drawn.min()) >= 0.3 - 1e-6 and float(drawn.max()) <= 0.7 + 1e-6
    assert float(drawn.min()) < 0.31 and float(drawn.max()) > 0.69
    assert float(drawn.mean()) == pytest.approx(0.5, abs=0.001)


def test_truncated_normal_of_zero_std_draws_the_mean_within_the_bounds():
    assert bool((_draw("TRUNCATED_NORMAL", mean=0.5, std_dev=0.0, upper=0.25) == 0.25).all())
    assert bool((_draw("TRUNCATED_NORMAL", mean=0.5, std_dev=0.0, lower=0.0) == 0.5).all())


@pytest.mark.parametrize("lower, upper", [(0.5, 0.5), (0.5, -0.5)], ids=["equal", "crossed"])
def test_truncated_normal_bounds_must_leave_an_interval(lower, upper):
    with pytest.raises(ValueError, match=rf"^lower={lower} is not valid; allowed: lower < "
                                         rf"upper \({upper}\) for TRUNCATED_NORMAL"):
        InitializerArgs(mode="TRUNCATED_NORMAL", lower=lower, upper=upper)
    InitializerArgs(mode="UNIFORM", lower=0.5, upper=0.5)  # a constant draw, allowed


def test_debug_rows_are_the_key_modulo_100000_as_uint64():
    # dynamicemb's DEBUG initializer: key % 100000 with the key read as uint64
    keys = torch.tensor([0, 99_999, 100_000, 123_456_789, -1, -100_000, -(2 ** 63), 2 ** 63 - 1])
    args = InitializerArgs(mode="DEBUG").resolved(4, 1000)
    values = initial_values(args, keys, None, 4, torch.float32)
    want = torch.tensor([(k + 2 ** 64) % 100_000 if k < 0 else k % 100_000
                         for k in keys.tolist()], dtype=torch.float32)
    assert torch.equal(values, want[:, None].expand(8, 4))
    assert want.tolist()[4:7] == [51615.0, 51616.0, 75808.0]
    table = HashTable(TableOptions(dim=4, max_capacity=128, initializer=args))
    rows, founds = table.find_or_insert(keys)
    assert not bool(founds.any()) and torch.equal(rows, values)
