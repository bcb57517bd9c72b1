import pytest
import torch

from hashrec.embedding.jagged import JaggedError, KeyedJaggedTensor


def _kjt(weights=False):
    # a = [[1, 2], []], b = [[3], [4, 5]]
    w = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0]) if weights else None
    return KeyedJaggedTensor.from_lengths(["a", "b"], torch.tensor([1, 2, 3, 4, 5]),
                                          torch.tensor([2, 0, 1, 2]), w)


def test_from_lengths_slices_per_key():
    kjt = _kjt()
    assert kjt.keys() == ["a", "b"]
    assert kjt.stride() == 2
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 5]
    assert kjt.length_per_key() == [2, 3]
    b = kjt["b"]
    assert b.values.tolist() == [3, 4, 5]
    assert b.lengths.tolist() == [1, 2]
    assert b.offsets.tolist() == [0, 1, 3]
    a = kjt["a"]
    assert a.values.tolist() == [1, 2] and a.lengths.tolist() == [2, 0]


def test_from_offsets_equals_from_lengths():
    by_offsets = KeyedJaggedTensor.from_offsets(
        ["a", "b"], torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 2, 3, 5]))
    assert by_offsets.lengths().tolist() == [2, 0, 1, 2]
    for key in ("a", "b"):
        assert torch.equal(by_offsets[key].values, _kjt()[key].values)
        assert torch.equal(by_offsets[key].lengths, _kjt()[key].lengths)


def test_to_dict_keeps_weights_per_key():
    parts = _kjt(weights=True).to_dict()
    assert list(parts) == ["a", "b"]
    assert parts["a"].weights.tolist() == [0.5, 1.0]
    assert parts["b"].weights.tolist() == [2.0, 3.0, 4.0]


def test_to_device_round_trip():
    kjt = _kjt(weights=True).to("cpu")
    assert kjt.device == torch.device("cpu")
    assert kjt.values().tolist() == [1, 2, 3, 4, 5]
    assert kjt.weights().tolist() == [0.5, 1.0, 2.0, 3.0, 4.0]


def test_to_padded_truncates_and_pads():
    padded = _kjt()["b"].to_padded(max_length=1, pad_value=-1)
    assert padded.tolist() == [[3], [4]]
    padded = _kjt()["a"].to_padded(max_length=3, pad_value=-1)
    assert padded.tolist() == [[1, 2, -1], [-1, -1, -1]]


def test_concat_joins_keys_and_fills_missing_weights():
    left = KeyedJaggedTensor.from_lengths(["x"], torch.tensor([7]), torch.tensor([1, 0]))
    joined = KeyedJaggedTensor.concat([left, _kjt(weights=True)])
    assert joined.keys() == ["x", "a", "b"]
    assert joined["x"].weights.tolist() == [1.0]
    assert joined["b"].values.tolist() == [3, 4, 5]


@pytest.mark.parametrize("build, message", [
    (lambda: KeyedJaggedTensor.from_lengths(["a"], torch.tensor([1, 2]), torch.tensor([1])),
     "lengths sum to 1"),
    (lambda: KeyedJaggedTensor.from_lengths(["a", "b"], torch.tensor([1]), torch.tensor([1])),
     "not a multiple"),
    (lambda: KeyedJaggedTensor.from_lengths(["a", "a"], torch.tensor([1]),
                                            torch.tensor([1, 0])), "duplicate keys"),
    (lambda: KeyedJaggedTensor.from_lengths(["a"], torch.tensor([1]), torch.tensor([2, -1])),
     "non-negative"),
    (lambda: KeyedJaggedTensor.from_lengths(["a"], torch.tensor([[1]]), torch.tensor([1])),
     "values must be 1-D"),
    (lambda: KeyedJaggedTensor.from_lengths(["a"], torch.tensor([1]), torch.tensor([1]),
                                            torch.tensor([1.0, 2.0])), "weights shape"),
    (lambda: KeyedJaggedTensor.from_offsets(["a"], torch.tensor([1]), torch.tensor([])),
     "non-empty"),
], ids=["sum-mismatch", "ragged-keys", "duplicate-keys", "negative-length", "values-2d",
        "weights-shape", "empty-offsets"])
def test_validation_errors(build, message):
    with pytest.raises(JaggedError, match=message):
        build()


def test_missing_key_and_missing_weights_raise():
    kjt = _kjt()
    with pytest.raises(KeyError, match="'c'"):
        kjt["c"]
    with pytest.raises(JaggedError, match="no weights"):
        kjt.weights()


def test_unvalidated_layout_is_accepted_and_offsets_follow_lengths():
    # Trusted producers skip the checks: an inconsistent layout is not rejected ...
    KeyedJaggedTensor(["a"], torch.tensor([1, 2, 3]), torch.tensor([1, 1]), validate=False)
    # ... and a consistent one behaves like a validated one, offsets computed on demand.
    kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3, 4, 5]),
                            torch.tensor([2, 0, 1, 2]), validate=False)
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 5]
    assert kjt["b"].values.tolist() == [3, 4, 5]


def test_validation_still_checks_given_offsets():
    with pytest.raises(JaggedError, match="len\\(lengths\\) \\+ 1"):
        KeyedJaggedTensor(["a"], torch.tensor([1, 2]), torch.tensor([1, 1]),
                          offsets=torch.tensor([0, 2]))


def test_host_layout_gives_key_bounds_and_longest_bags():
    kjt = KeyedJaggedTensor.from_lengths(["a", "b"], torch.arange(6), torch.tensor([2, 0, 1, 3]))
    assert kjt.length_per_key() == [2, 4]
    assert (kjt["a"].max_bag, kjt["b"].max_bag) == (2, 3)
    assert kjt["b"].values.tolist() == [2, 3, 4, 5]


def test_host_layout_travels_with_to_and_matches_a_fresh_kjt():
    kjt = KeyedJaggedTensor.from_lengths(["a", "b"], torch.arange(5), torch.tensor([1, 1, 0, 3]))
    moved = kjt.to("cpu")
    assert moved._layout is not None and moved._layout == kjt._layout
    fresh = KeyedJaggedTensor(["a", "b"], moved.values(), moved.lengths())
    for key in ("a", "b"):
        assert moved[key].values.tolist() == fresh[key].values.tolist()
        assert moved[key].max_bag == fresh[key].max_bag


def test_empty_batch_layout():
    kjt = KeyedJaggedTensor.from_lengths(["a"], torch.zeros(0, dtype=torch.int64),
                                         torch.zeros(0, dtype=torch.int64))
    assert kjt.length_per_key() == [0]
    assert kjt["a"].values.numel() == 0


def test_host_layout_can_be_carried_to_an_equal_kjt():
    kjt = KeyedJaggedTensor.from_lengths(["a", "b"], torch.arange(6), torch.tensor([1, 2, 0, 3]))
    layout = kjt.host_layout()
    assert layout == ([0, 3, 6], [2, 3])
    other = KeyedJaggedTensor(["a", "b"], kjt.values(), kjt.lengths())
    other.set_host_layout(layout)
    assert other["b"].values.tolist() == [3, 4, 5] and other.length_per_key() == [3, 3]
    with pytest.raises(ValueError, match="needs 3 bounds and 2 longest"):
        other.set_host_layout(([0, 6], [3]))


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("lengths", [[2, 0, 1, 2, 0, 0], [0, 0, 0, 0, 0, 0], []])
def test_to_dict_equals_slicing_key_by_key(weights, lengths):
    keys = ["a", "b", "c"]
    n = sum(lengths)
    kjt = KeyedJaggedTensor.from_lengths(
        keys, torch.arange(n), torch.tensor(lengths, dtype=torch.int64),
        torch.rand(n) if weights else None)
    parts = kjt.to_dict()
    assert list(parts) == keys
    for key in keys:
        one, bulk = kjt[key], parts[key]
        for field in ("values", "lengths", "offsets", "weights"):
            a, b = getattr(one, field), getattr(bulk, field)
            assert (a is None and b is None) or torch.equal(a, b), (key, field)
        assert one.max_bag == bulk.max_bag


@pytest.mark.parametrize("keys,stride", [(1, 5), (3, 4), (4, 1), (5, 7)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_each_keys_offsets_start_at_zero_and_follow_its_lengths(keys, stride, dtype):
    g = torch.Generator().manual_seed(keys * 10 + stride)
    lengths = torch.randint(0, 4, (keys * stride,), generator=g).to(dtype)
    names = [f"k{i}" for i in range(keys)]
    kjt = KeyedJaggedTensor.from_lengths(names, torch.arange(int(lengths.sum())), lengths)
    for i, name in enumerate(names):
        mine = lengths[i * stride:(i + 1) * stride].to(torch.int64)
        want = torch.cat([torch.zeros(1, dtype=torch.int64), mine.cumsum(0)])
        assert kjt[name].offsets.dtype == torch.int64
        assert torch.equal(kjt[name].offsets, want)
