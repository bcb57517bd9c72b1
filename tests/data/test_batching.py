import numpy as np
import pyarrow as pa
import pytest

from hashrec.data.batching import rebatch, shuffle_rebatch


def _chunks(sizes):
    start = 0
    for n in sizes:
        yield pa.table({"x": np.arange(start, start + n)})
        start += n


def _values(tables):
    return [v for t in tables for v in t.column("x").to_pylist()]


@pytest.mark.parametrize("sizes", [[5, 1, 9, 3], [16], [1] * 10, [3]], ids=str)
@pytest.mark.parametrize("drop", [False, True], ids=["keep", "drop"])
def test_rebatch_keeps_order_and_cuts_exact_batches(sizes, drop):
    total = sum(sizes)
    out = list(rebatch(_chunks(sizes), 4, drop))
    kept = total // 4 * 4 if drop else total
    assert _values(out) == list(range(kept))
    assert all(t.num_rows == 4 for t in out[:-1])
    if drop:
        assert all(t.num_rows == 4 for t in out)


@pytest.mark.parametrize("drop", [False, True], ids=["keep", "drop"])
def test_shuffle_rebatch_permutes_all_rows_deterministically(drop):
    sizes = [37, 11, 50, 2, 64]
    run = lambda seed: list(shuffle_rebatch(_chunks(sizes), 8, drop, 40,  # noqa: E731
                                            np.random.default_rng(seed)))
    out = run(1)
    values = _values(out)
    assert all(t.num_rows == 8 for t in (out if drop else out[:-1]))
    if drop:
        assert len(values) == sum(sizes) // 8 * 8 and len(set(values)) == len(values)
    else:
        assert sorted(values) == list(range(sum(sizes)))
    assert values != sorted(values)
    assert values == _values(run(1))
    assert values != _values(run(2))
