"""dedup_storages + emit_storage against per-feature pooling with autograd."""

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hashrec.embedding import EmbeddingFeatureSpec  # noqa: E402
from hashrec.embedding.batching import (  # noqa: E402
    COMPACT,
    NARROW,
    FeatureIds,
    dedup_storages,
    pooling_kind,
)
from hashrec.embedding.emit import emit_storage  # noqa: E402
from hashrec.embedding.pooling import gather_sequences, pool_bags  # noqa: E402


def _feature(spec, lengths, high, gen, weighted=False):
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.randint(-high, high, (int(offsets[-1]),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    return FeatureIds(spec, values, offsets, lengths, weights)


def _storage(gen):
    """Two logical tables (tags): a mean bag and a sequence on tag 0, a weighted bag on 1."""
    mean = EmbeddingFeatureSpec("m", "a", pooling="mean")
    seq = EmbeddingFeatureSpec("s", "a", is_sequence=True, max_length=4)
    weighted = EmbeddingFeatureSpec("w", "b", weighted=True)
    return [[_feature(mean, [2, 0, 3, 1], 5, gen), _feature(seq, [4, 1, 0, 3], 5, gen)],
            [_feature(weighted, [1, 3, 2, 2], 4, gen, weighted=True)]]


def test_dedup_keys_are_unique_per_tag_and_inverse_points_at_them():
    gen = torch.Generator().manual_seed(0)
    by_tag = _storage(gen)
    (batch,) = dedup_storages([(by_tag, True)])
    assert batch.unique_per_table == [len(set(torch.cat([f.values for f in fs]).tolist()))
                                      for fs in by_tag]
    pairs = list(zip(batch.tags.tolist(), batch.keys.tolist()))
    assert pairs == sorted(set(pairs))
    for tag, fs in enumerate(by_tag):
        for f in fs:
            assert (batch.keys[f.inverse] == f.values).all() and (batch.tags[f.inverse] == tag).all()
    assert batch.counts.tolist() == torch.bincount(batch.inverse).tolist()
    grouped = batch.inverse[batch.order]
    assert (grouped[1:] >= grouped[:-1]).all()
    assert batch.key_ranges == [(int(v.min()), int(v.max()))
                                for v in (torch.cat([f.values for f in fs]) for fs in by_tag)]


def _row_storage(seed):
    """``_storage`` with non-negative ids (rows of dense tables)."""
    by_tag = _storage(torch.Generator().manual_seed(seed))
    for fs in by_tag:
        for f in fs:
            f.values = f.values.abs()
    return by_tag


def test_row_id_sort_equals_the_general_sort():
    # Ids of dense tables sort as tag << 40 | id in one pass; the batch is the same.
    by_tag = _row_storage(3)
    general, rows = (dedup_storages([(by_tag, True, flag)])[0] for flag in (False, True))
    for name in ("keys", "tags", "counts", "inverse", "order", "row_start"):
        assert torch.equal(getattr(general, name), getattr(rows, name)), name
    assert (general.unique_per_table, general.key_ranges) == (rows.unique_per_table,
                                                              rows.key_ranges)


def test_row_ids_out_of_range_read_as_negative_lows():
    by_tag = _row_storage(4)
    by_tag[1][0].values[0] = 1 << 45
    (batch,) = dedup_storages([(by_tag, True, True)])
    assert all(low == -1 for low, _ in batch.key_ranges)


def test_sharded_dedup_counts_the_keys_each_rank_owns():
    from hashrec.table.hashing import owner_of

    by_tag = _storage(torch.Generator().manual_seed(5))
    (batch,) = dedup_storages([(by_tag, True, False, 3)])
    want = torch.bincount(owner_of(batch.keys, 3), minlength=3).tolist()
    assert batch.owner_counts == want and sum(want) == batch.keys.numel()
    (plain,) = dedup_storages([(by_tag, True)])
    assert plain.owner_counts is None and torch.equal(plain.keys, batch.keys)


def _many(gen):
    """Three logical tables read by runs of bag features of each pooling kind, with
    sequences between them in tag order."""
    def bag(name, table, **kwargs):
        return _feature(EmbeddingFeatureSpec(name, table, **kwargs), [1, 2, 0, 3], 6, gen,
                        weighted=kwargs.get("weighted", False))

    def seq(name, table, length):
        spec = EmbeddingFeatureSpec(name, table, is_sequence=True, max_length=length)
        return _feature(spec, [3, 1, 2, 0], 6, gen)

    return [[bag("a1", "a"), bag("a2", "a", pooling="mean"), bag("a3", "a", weighted=True),
             seq("s3", "a", 2)],
            [seq("s", "b", 3), bag("b1", "b"), bag("b2", "b", pooling="mean")],
            [bag("c1", "c"), seq("s2", "c", 3), bag("c2", "c", weighted=True), bag("c3", "c")]]


@pytest.mark.parametrize("layout", ["fused", "one-table", "runs"])
def test_emit_matches_per_feature_autograd(layout):
    gen = torch.Generator().manual_seed(1)
    fused = layout != "one-table"
    by_tag = {"fused": lambda: _storage(gen), "one-table": lambda: [_storage(gen)[0]],
              "runs": lambda: _many(gen)}[layout]()
    (batch,) = dedup_storages([(by_tag, fused)])
    kinds = [pooling_kind(f) for f in batch.features]
    assert kinds == sorted(kinds)  # runs of one kind lie next to each other
    rows = torch.randn(batch.keys.numel(), 3, generator=gen, requires_grad=True)
    outs = emit_storage(rows, batch)
    grads = [torch.randn(o.shape, generator=gen) for o in outs]
    torch.autograd.backward(outs, grads)
    expected_rows = rows.detach().clone().requires_grad_(True)
    expected = []
    for f in batch.features:
        if f.spec.is_sequence:
            expected.append(gather_sequences(expected_rows, f.inverse, f.offsets, f.spec.max_length))
        else:
            expected.append(pool_bags(expected_rows, f.inverse, f.offsets, f.weights,
                                      f.spec.pooling == "mean"))
    torch.autograd.backward(expected, grads)
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(rows.grad, expected_rows.grad)


def test_storage_without_ids():
    spec = EmbeddingFeatureSpec("f", "t")
    empty = FeatureIds(spec, torch.empty(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64),
                       torch.zeros(2, dtype=torch.int64))
    (batch,) = dedup_storages([([[empty]], False)])
    assert batch.keys.numel() == 0 and batch.key_ranges == [None] and batch.unique_per_table == [0]
    (out,) = emit_storage(torch.zeros(0, 3, requires_grad=True), batch)
    assert out.shape == (2, 3) and not out.any()


_FIELDS = ("keys", "tags", "counts", "inverse", "order", "row_start")


@pytest.mark.parametrize("level", [NARROW, COMPACT], ids=["int64", "int32"])
@pytest.mark.parametrize("owners", [0, 3])
def test_narrow_key_sort_equals_the_two_pass_sort(owners, level):
    by_tag = _row_storage(6)
    two, one = (dedup_storages([(by_tag, True, False, owners, narrow)])[0]
                for narrow in (0, level))
    for name in _FIELDS:
        assert torch.equal(getattr(two, name), getattr(one, name)), name
    assert (two.unique_per_table, two.key_ranges, two.owner_counts) == \
        (one.unique_per_table, one.key_ranges, one.owner_counts)
    assert not one.wide_ids


@pytest.mark.parametrize("level,wide", [(NARROW, -3), (NARROW, 1 << 62), (COMPACT, -3),
                                        (COMPACT, 1 << 30), (COMPACT, 1 << 40)])
def test_ids_outside_the_narrow_range_sort_again_in_two_passes(level, wide):
    """An id past the one-pass key's range (30 bits for two tables in an int32, 62 in an
    int64) is sorted again in two passes, and the batch names the level that failed."""
    by_tag = _row_storage(7)
    by_tag[1][0].values[2] = wide
    two, one = (dedup_storages([(by_tag, True, False, 0, narrow)])[0]
                for narrow in (0, level))
    assert one.wide_ids == level and not two.wide_ids
    for name in _FIELDS:
        assert torch.equal(getattr(two, name), getattr(one, name)), name
    assert two.key_ranges == one.key_ranges and wide in one.keys.tolist()


def test_batches_of_one_layout_share_their_tag_array():
    from hashrec.embedding import batching

    by_tag = _row_storage(8)
    tagged = batching._emit_order(by_tag)
    n = sum(f.values.numel() for _, f in tagged)
    first, again = (batching._tag_of(tagged, n, torch.device("cpu"), 40) for _ in range(2))
    assert first is again
    want = torch.cat([torch.full((f.values.numel(),), tag << 40) for tag, f in tagged])
    assert torch.equal(first, want)


def _views_of_one_buffer(shapes, how, gen):
    """Output gradients of ``shapes`` as views of one buffer: row blocks one after the
    other, column slices of one (B, columns) gradient (what a concatenation of the
    outputs hands back), blocks starting off the row grid, or one value expanded (what
    the gradient of a sum hands back)."""
    sizes = [torch.Size(s).numel() for s in shapes]
    if how == "columns":
        batch = shapes[0][0]
        buffer = torch.randn(batch, sum(sizes) // batch, generator=gen)
        out, col = [], 0
        for shape, size in zip(shapes, sizes):
            out.append(buffer[:, col:col + size // batch].view(shape))
            col += size // batch
        return out
    if how == "expanded":
        value = torch.randn(1, generator=gen)
        return [value.view([1] * len(shape)).expand(shape) for shape in shapes]
    skew = 1 if how == "skewed" else 0
    flat = torch.randn(sum(sizes) + skew, generator=gen)[skew:]
    return [block.view(shape) for block, shape in zip(flat.split(sizes), shapes)]


@contextlib.contextmanager
def _kernels(kernels: str, monkeypatch):
    """Runs the ops of ``kernels``: "reference", or "triton" (interpreted; CPU hosts)."""
    from hashrec.table.ops import dispatch

    if kernels == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
        if torch.cuda.is_available():
            pytest.skip("the interpreted kernels run on CPU hosts")
        monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    try:
        yield
    finally:
        dispatch._forced.cache_clear()


@pytest.mark.parametrize("how", ["rows", "columns", "skewed", "expanded"])
@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_gradients_read_in_place_from_one_buffer(how, kernels, monkeypatch):
    """Output gradients that are views of one buffer are read where they lie; the rows'
    gradients equal those from separate tensors bit for bit."""
    from hashrec.embedding.emit import _shared_rows

    with _kernels(kernels, monkeypatch):
        gen = torch.Generator().manual_seed(4)
        (batch,) = dedup_storages([(_storage(gen), True)])
        rows = torch.randn(batch.keys.numel(), 4, generator=gen, requires_grad=True)
        outs = emit_storage(rows, batch)
        shared = _views_of_one_buffer([o.shape for o in outs], how, gen)
        assert (_shared_rows(tuple(shared)) is None) == (how in ("skewed", "expanded"))
        torch.autograd.backward(outs, shared)
        in_place = rows.grad.clone()
        rows.grad = None
        outs = emit_storage(rows, batch)
        torch.autograd.backward(outs, [g.clone() for g in shared])
        assert torch.equal(in_place, rows.grad)


def _one_id_bags(gen, max_bag):
    """Two sum-pooled features of one id a bag over two tags, ``max_bag`` as the host
    knows it (None: unknown)."""
    specs = [EmbeddingFeatureSpec("x", "a"), EmbeddingFeatureSpec("y", "b")]
    out = []
    for spec, bags in zip(specs, (6, 9)):
        f = _feature(spec, [1] * bags, 4, gen)
        f.max_bag = max_bag
        out.append([f])
    return out


def test_rows_are_positions_only_where_every_bag_holds_one_id():
    from hashrec.embedding.emit import _concatenated_layout, _rows_are_positions

    gen = torch.Generator().manual_seed(8)
    features = [fs[0] for fs in _one_id_bags(gen, 1)]
    layout = _concatenated_layout(features)
    assert _rows_are_positions(features, layout)
    assert not _rows_are_positions(features, layout[::-1])  # rows not at the positions
    features[1].max_bag = None  # the host does not know the longest bag
    assert not _rows_are_positions(features, layout)
    features[1].max_bag = 2
    assert not _rows_are_positions(features, layout)
    two = _feature(EmbeddingFeatureSpec("z", "a"), [2, 0, 1], 4, gen)  # as many ids as bags
    two.max_bag = 2
    assert not _rows_are_positions([two], _concatenated_layout([two]))
    seq = _feature(EmbeddingFeatureSpec("s", "a", is_sequence=True, max_length=1), [1, 1], 4,
                   gen)
    seq.max_bag = 1
    assert not _rows_are_positions([seq], _concatenated_layout([seq]))


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_one_id_bags_reduce_like_the_general_path(kernels, monkeypatch):
    """Bags of one id whose host layout says so pool without reading offsets and read
    their gradient rows at their positions (no search of the bags); outputs and the rows'
    gradients equal the general path's."""
    with _kernels(kernels, monkeypatch):
        grads, outputs = [], []
        for max_bag in (1, None):
            gen = torch.Generator().manual_seed(9)
            (batch,) = dedup_storages([(_one_id_bags(gen, max_bag), True)])
            rows = torch.randn(batch.keys.numel(), 4, generator=gen, requires_grad=True)
            outs = emit_storage(rows, batch)
            outputs.append([o.detach() for o in outs])
            torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen) for o in outs])
            grads.append(rows.grad)
        assert torch.equal(grads[0], grads[1])
        assert all(torch.equal(a, b) for a, b in zip(*outputs))
        assert grads[0].abs().sum() > 0
