"""A dynamic table without admission or eviction trains like a dense table."""

import pytest
import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.embedding.zch import ZchOptions
from hashrec.table import (
    SparseAdagrad,
    SparseAdam,
    SparseRowWiseAdagrad,
    SparseSGD,
    TableError,
    TableOptions,
)

NUM_IDS, DIM, BATCH = 23, 6, 5
FEATURES = [
    EmbeddingFeatureSpec("f_sum", "t"),
    EmbeddingFeatureSpec("f_mean", "t", pooling="mean"),
    EmbeddingFeatureSpec("f_weighted", "t", weighted=True),
    EmbeddingFeatureSpec("f_seq", "t", is_sequence=True, max_length=3),
]
KEYS = [f.name for f in FEATURES]
OPTIMIZERS = {
    "sgd": SparseSGD(lr=0.3),
    "adagrad": SparseAdagrad(lr=0.2, initial_accumulator_value=0.1),
    "rowwise_adagrad": SparseRowWiseAdagrad(lr=0.2),
    "adam": SparseAdam(lr=0.05),
}


def _pair(optimizer):
    torch.manual_seed(0)
    dense = EmbeddingCollection([EmbeddingTableSpec("t", DIM, num_rows=NUM_IDS)], FEATURES,
                                optimizer)
    options = TableOptions(dim=DIM, max_capacity=256, bucket_capacity=32,
                           score_strategy="NO_EVICTION", check_mode="ERROR")
    dynamic = EmbeddingCollection([EmbeddingTableSpec("t", DIM, dynamic=options)], FEATURES,
                                  optimizer)
    rows = dense.dense_tables["t"].rows
    dynamic.dynamic_tables()["t"].load_state(torch.arange(NUM_IDS), None, rows.clone(),
                                             torch.zeros(NUM_IDS, dtype=torch.int64))
    return dense, dynamic


def _loss(out, step):
    g = torch.Generator().manual_seed(100 + step)
    loss = 0.0
    for name in sorted(out.pooled):
        t = out.pooled[name]
        loss = loss + (t * torch.randn(t.shape, generator=g)).sum() + 0.5 * (t ** 2).sum()
    for name in sorted(out.sequences):
        t = out.sequences[name][0]
        loss = loss + (t * torch.randn(t.shape, generator=g)).sum() + 0.5 * (t ** 2).sum()
    return loss


def _dynamic_rows(collection):
    keys, _, rows, _ = next(collection.dynamic_tables()["t"].export_state(1 << 20))
    return rows[torch.argsort(keys)]


@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_dynamic_trains_like_dense(optimizer, make_kjt):
    dense, dynamic = _pair(optimizer)
    for step in range(5):
        kjt = make_kjt(KEYS, BATCH, NUM_IDS, seed=step, weighted=True)
        outs = [c(kjt) for c in (dense, dynamic)]
        for name in outs[0].pooled:
            torch.testing.assert_close(outs[1].pooled[name], outs[0].pooled[name])
            assert not torch.isnan(outs[0].pooled[name]).any()
        for name in outs[0].sequences:
            torch.testing.assert_close(outs[1].sequences[name][0], outs[0].sequences[name][0])
        for out in outs:
            _loss(out, step).backward()
    dense_rows = dense.dense_tables["t"].rows
    assert not torch.allclose(dense_rows, _pair(optimizer)[0].dense_tables["t"].rows)
    torch.testing.assert_close(_dynamic_rows(dynamic), dense_rows, rtol=1e-5, atol=1e-6)
    storage = dynamic.stats()["storages"]["t"]
    assert (storage["size"], storage["evictions"], storage["refused"]) == (NUM_IDS, 0, 0)


def test_learning_rate_override_applies_to_every_table(make_kjt):
    dense, dynamic = _pair(SparseSGD(lr=0.5))
    before = dense.dense_tables["t"].rows.clone()
    for collection in (dense, dynamic):
        collection.set_learning_rate(0.0)
        _loss(collection(make_kjt(KEYS, BATCH, NUM_IDS, seed=1, weighted=True)), 0).backward()
    torch.testing.assert_close(dense.dense_tables["t"].rows, before)
    torch.testing.assert_close(_dynamic_rows(dynamic), before)


def test_backward_twice_applies_the_update_twice(make_kjt):
    dense, _ = _pair(SparseSGD(lr=0.1))
    table = dense.dense_tables["t"]
    before = table.rows.clone()
    out = dense(make_kjt(KEYS, BATCH, NUM_IDS, seed=3, weighted=True))
    loss = out.pooled["f_sum"].sum()
    loss.backward(retain_graph=True)
    once = table.rows - before
    loss.backward()
    torch.testing.assert_close(table.rows - before, 2 * once)
    assert once.abs().sum() > 0


def test_frozen_table_is_not_updated(make_kjt):
    table = EmbeddingTableSpec("t", DIM, num_rows=NUM_IDS, trainable=False)
    collection = EmbeddingCollection([table], FEATURES[:1], SparseSGD(lr=1.0))
    before = collection.dense_tables["t"].rows.clone()
    out = collection(make_kjt(KEYS[:1], BATCH, NUM_IDS, seed=0, weighted=True))
    assert not out.pooled["f_sum"].requires_grad
    torch.testing.assert_close(collection.dense_tables["t"].rows, before)


def test_collection_has_no_parameters_and_dense_state_round_trips(make_kjt):
    dense, _ = _pair(SparseAdam(lr=0.05))
    assert list(dense.parameters()) == []
    for step in range(2):
        _loss(dense(make_kjt(KEYS, BATCH, NUM_IDS, seed=step, weighted=True)), step).backward()
    state = dense.state_dict()
    assert set(state) == {"dense_tables.t.rows", "dense_tables.t.step_count"}
    assert state["dense_tables.t.rows"].shape == (NUM_IDS, DIM + 2 * DIM)
    restored, _ = _pair(SparseAdam(lr=0.05))
    restored.load_state_dict(state)
    assert restored.dense_tables["t"].step == 2
    kjt = make_kjt(KEYS, BATCH, NUM_IDS, seed=9, weighted=True)
    for collection in (dense, restored):
        _loss(collection(kjt), 9).backward()
    torch.testing.assert_close(restored.dense_tables["t"].rows, dense.dense_tables["t"].rows)


def test_prepared_dedup_gives_the_same_training(make_kjt):
    """prepare(next batch) before each forward changes nothing; a forward of another
    batch than the prepared one ignores what was prepared."""
    _, plain = _pair(SparseAdam(lr=0.05))
    _, ahead = _pair(SparseAdam(lr=0.05))
    kjts = [make_kjt(KEYS, BATCH, NUM_IDS, seed=step, weighted=True) for step in range(5)]
    fed = list(kjts)
    fed[2] = make_kjt(KEYS, BATCH, NUM_IDS, seed=99, weighted=True)  # kjts[2] is prepared
    ahead.prepare(kjts[0])
    for step, kjt in enumerate(fed):
        out_plain, out_ahead = plain(kjt), ahead(kjt)
        if step + 1 < len(kjts):
            ahead.prepare(kjts[step + 1])
        for name in out_plain.pooled:
            torch.testing.assert_close(out_ahead.pooled[name], out_plain.pooled[name])
        for name in out_plain.sequences:
            torch.testing.assert_close(out_ahead.sequences[name][0], out_plain.sequences[name][0])
        for out in (out_plain, out_ahead):
            _loss(out, step).backward()
    torch.testing.assert_close(_dynamic_rows(ahead), _dynamic_rows(plain))


def test_backward_after_the_table_grew_refuses_the_stale_slots(make_kjt):
    """Two training forwards, then the first one's backward: the second lookup grew the
    table (moving every slot), so the first one's slots are refused, not applied to
    whichever keys hold them now."""
    options = TableOptions(dim=DIM, max_capacity=4096, init_capacity=32, bucket_capacity=32,
                           score_strategy="NO_EVICTION")
    collection = EmbeddingCollection([EmbeddingTableSpec("t", DIM, dynamic=options)],
                                     FEATURES[:1], SparseSGD(lr=0.1))
    table = collection.dynamic_tables()["t"]
    first = collection(make_kjt(KEYS[:1], BATCH, 8, seed=0))
    capacity = table.capacity()
    second = collection(make_kjt(KEYS[:1], 256, 100_000, seed=1))
    assert table.capacity() > capacity
    before = _dynamic_rows(collection).clone()
    with pytest.raises(TableError, match="stale"):
        first.pooled["f_sum"].sum().backward()
    torch.testing.assert_close(_dynamic_rows(collection), before)
    second.pooled["f_sum"].sum().backward()  # the latest lookup's slots still apply
    assert not torch.equal(_dynamic_rows(collection), before)


def test_frozen_dynamic_table_is_read_as_in_evaluation(make_kjt):
    """Training lookups of a frozen dynamic table neither insert the keys it lacks nor
    touch the rows, keys and scores it holds; its missing keys read the eval initializer
    (zeros by default), as in evaluation."""
    options = TableOptions(dim=DIM, max_capacity=256, bucket_capacity=32,
                           score_strategy="STEP")
    collection = EmbeddingCollection(
        [EmbeddingTableSpec("t", DIM, dynamic=options, trainable=False)], FEATURES,
        SparseSGD(lr=1.0))
    table = collection.dynamic_tables()["t"]
    known = torch.arange(0, NUM_IDS, 2)
    rows = torch.randn(known.numel(), DIM)
    table.load_state(known, None, rows, torch.full((known.numel(),), 7))
    before = list(table.export_state(1 << 20))
    kjt = make_kjt(KEYS, BATCH, NUM_IDS, seed=0, weighted=True)
    collection.train()
    out = collection(kjt)
    collection.eval()
    with torch.no_grad():
        evaluated = collection(kjt)
    for name in out.pooled:
        assert not out.pooled[name].requires_grad
        torch.testing.assert_close(out.pooled[name], evaluated.pooled[name])
    after = list(table.export_state(1 << 20))
    assert len(after) == len(before) == 1
    for was, now in zip(before[0], after[0]):
        if was is not None:
            torch.testing.assert_close(now, was)
    assert table.size() == known.numel() and table.step == 0  # its STEP clock too


def test_frozen_zch_table_assigns_no_slots_in_training(make_kjt):
    """A frozen ZCH table's remapper keeps its state in training: no new ids, no counts."""
    table = EmbeddingTableSpec("t", DIM, num_rows=8, zch=ZchOptions(8, 1, "LFU", 1.0),
                               trainable=False)
    collection = EmbeddingCollection([table], FEATURES[:1], SparseSGD(lr=1.0))
    remapper = collection.zch_remappers["t"]
    before = {name: b.clone() for name, b in remapper.state_dict().items()}
    collection.train()
    collection(make_kjt(KEYS[:1], BATCH, NUM_IDS, seed=0, weighted=True))
    for name, buffer in remapper.state_dict().items():
        torch.testing.assert_close(buffer, before[name], msg=name)


def test_stats_give_a_zch_tables_counters_as_a_dynamic_tables(make_kjt):
    """``stats()`` of a ZCH table: its storage's counters are its remapper's (ints, as a
    dynamic table's), with the hit rate; its table's size is the rows held."""
    table = EmbeddingTableSpec("t", DIM, num_rows=8, zch=ZchOptions(8, 1, "LFU", 1.0))
    collection = EmbeddingCollection([table], FEATURES[:1], SparseSGD(lr=1.0))
    for step in range(3):  # 23 ids for 8 rows: some wait, evictions at every step
        collection(make_kjt(KEYS[:1], BATCH, NUM_IDS, seed=step)).pooled["f_sum"].sum().backward()
    counters = collection.zch_remappers["t"].counters()
    stats = collection.stats()
    storage = stats["storages"]["t"]
    for name, value in counters.items():
        assert storage[name] == value and type(storage[name]) is type(
            1.0 if name == "load_factor" else 1), name
    assert 0 < storage["size"] <= 8 and storage["without_row"] > 0
    assert storage["hit_rate"] == counters["hits"] / counters["lookups"] > 0
    assert stats["tables"]["t"]["size"] == storage["size"]
