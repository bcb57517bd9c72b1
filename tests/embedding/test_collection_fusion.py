"""Fused dynamic tables: one storage, separate key spaces, same results as unfused."""

import pytest
import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.table import AdmissionOptions, InitializerArgs, SparseAdam, SparseSGD, TableOptions
from hashrec.table.memory import estimate_table_bytes

DIM, NUM_IDS, BATCH = 4, 17, 6
FEATURES = [EmbeddingFeatureSpec("user", "user_t"), EmbeddingFeatureSpec("item", "item_t"),
            EmbeddingFeatureSpec("hist", "item_t", is_sequence=True, max_length=4)]
KEYS = [f.name for f in FEATURES]


SEEDED = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3)


def _options(capacity, initializer=SEEDED):
    return TableOptions(dim=DIM, max_capacity=capacity, bucket_capacity=16,
                        initializer=initializer)


def _collection(fused, optimizer, **kwargs):
    """Two dynamic tables, fused into one storage or not."""
    group = "deep" if fused else None
    tables = [EmbeddingTableSpec("user_t", DIM, dynamic=_options(128, **kwargs),
                                 fusion_group=group),
              EmbeddingTableSpec("item_t", DIM, dynamic=_options(256, **kwargs),
                                 fusion_group=group)]
    return EmbeddingCollection(tables, FEATURES, optimizer)


def _preload(collection, rows_by_table):
    """Gives both layouts the same starting rows for the same (table, key)."""
    tables = collection.dynamic_tables()
    for table, rows in rows_by_table.items():
        storage, tag = collection.table_locations()[table]
        tags = torch.full((NUM_IDS,), tag, dtype=torch.int32)
        tables[storage].load_state(torch.arange(NUM_IDS), tags, rows,
                                   torch.zeros(NUM_IDS, dtype=torch.int64))


def test_fused_tables_share_one_storage_and_its_memory():
    fused = _collection(True, SparseSGD(lr=0.1))
    unfused = _collection(False, SparseSGD(lr=0.1))
    assert list(fused.dynamic_tables()) == ["deep"]
    assert fused.table_locations() == {"user_t": ("deep", 0), "item_t": ("deep", 1)}
    storage = fused.dynamic_tables()["deep"]
    assert storage.options.max_capacity == 128 + 256
    assert fused.memory_bytes() == storage.memory_bytes()
    assert fused.memory_bytes() == unfused.memory_bytes()
    separate = sum(estimate_table_bytes(t.options)["gpu"]
                   for t in unfused.dynamic_tables().values())
    assert estimate_table_bytes(storage.options)["gpu"] == separate


def test_fused_tables_never_mix_keys(make_kjt):
    fused = _collection(True, SparseSGD(lr=0.1))
    same_ids = torch.tensor([7, 7, 9])
    kjt = make_kjt(KEYS, 1, 1, seed=0)
    kjt = type(kjt).from_lengths(KEYS, torch.cat([same_ids, same_ids, same_ids]),
                                 torch.tensor([3, 3, 3]))
    out = fused(kjt)
    assert not torch.allclose(out.pooled["user"], out.pooled["item"])
    stats = fused.stats()
    assert stats["tables"]["user_t"]["size"] == 2 and stats["tables"]["item_t"]["size"] == 2
    assert stats["storages"]["deep"]["size"] == 4
    assert fused.fused_table_sizes() == {"deep": {"user_t": 2, "item_t": 2}}
    assert _collection(False, SparseSGD(lr=0.1)).fused_table_sizes() == {}  # none fused
    (out.pooled["user"].sum() * 0).backward()  # graph is well formed with a zero gradient


@pytest.mark.parametrize("optimizer", [SparseSGD(lr=0.2), SparseAdam(lr=0.05)],
                         ids=["sgd", "adam"])
def test_fused_results_equal_unfused(optimizer, make_kjt):
    g = torch.Generator().manual_seed(1)
    rows = {name: torch.randn(NUM_IDS, DIM + optimizer.state_dim(DIM), generator=g)
            for name in ("user_t", "item_t")}
    for rows_t in rows.values():
        rows_t[:, DIM:] = 0.0
    # Seeded initializers hash the tag, so new keys start equal only under CONSTANT.
    constant = InitializerArgs(mode="CONSTANT", value=0.01)
    pair = [_collection(fused, optimizer, initializer=constant) for fused in (True, False)]
    for collection in pair:
        _preload(collection, rows)
    for step in range(4):
        kjt = make_kjt(KEYS, BATCH, NUM_IDS + 5, seed=step)  # some ids are new each step
        outs = [c(kjt) for c in pair]
        for name in outs[0].pooled:
            torch.testing.assert_close(outs[0].pooled[name], outs[1].pooled[name])
        torch.testing.assert_close(outs[0].sequences["hist"][0], outs[1].sequences["hist"][0])
        for out in outs:
            ((out.pooled["user"] ** 2).sum() + out.pooled["item"].sum()
             + out.sequences["hist"][0].pow(2).sum()).backward()
    fused_tables, unfused_tables = pair[0].stats()["tables"], pair[1].stats()["tables"]
    for name in ("user_t", "item_t"):
        assert fused_tables[name]["size"] == unfused_tables[name]["size"]


def test_ids_past_the_one_pass_sort_fall_back_for_good(make_kjt, monkeypatch):
    # Fused storages sort (tag, key) in one pass while the keys fit below the tag
    # bits, in int32 keys first; a batch with a key that does not (here 2 ** 40) is
    # sorted again in two passes, and later batches try int64 keys; after a batch that
    # does not fit those either (here a negative key), every batch sorts in two passes.
    # Results equal the unfused collection's.
    from hashrec.embedding import batching
    from hashrec.embedding.batching import COMPACT, NARROW

    tried = []
    sort_storage = batching._sort_storage

    def spy(*args):
        if len(args[0]) == 2:  # two logical tables: the fused storage, or the join
            tried.append(len(args) > 4 and args[4])
        return sort_storage(*args)

    monkeypatch.setattr(batching, "_sort_storage", spy)
    constant = InitializerArgs(mode="CONSTANT", value=0.01)
    pair = [_collection(fused, SparseSGD(lr=0.1), initializer=constant) for fused in (True, False)]
    for step in range(5):
        kjt = make_kjt(KEYS, BATCH, NUM_IDS, seed=step)
        if step in (1, 3):
            wide = kjt.values()[:1] + (1 << 40) if step == 1 else kjt.values()[:1] - 100
            kjt = type(kjt).from_lengths(KEYS, torch.cat([wide, kjt.values()[1:]]),
                                         kjt.lengths())
        outs = [c(kjt) for c in pair]
        for name in outs[0].pooled:
            torch.testing.assert_close(outs[0].pooled[name], outs[1].pooled[name])
        torch.testing.assert_close(outs[0].sequences["hist"][0], outs[1].sequences["hist"][0])
    # The unfused collection's two storages share their dedup (one join), which falls
    # back alike: per step, the fused collection's sorts then the join's. Steps 1 and 3
    # try, sort again; step 2 tries int64 keys; step 4 does not try.
    assert tried == [COMPACT, COMPACT] + [COMPACT, False] * 2 + [NARROW, NARROW] \
        + [NARROW, False] * 2 + [False, False]


def _admitting(fused, capacity, **kwargs):
    """``_collection`` with admission at 2 (a counter that holds every id) and
    ``capacity`` slots a table, in buckets of 16."""
    admission = AdmissionOptions(threshold=2, counter_capacity=256, counter_bucket_capacity=16)
    group = "deep" if fused else None
    tables = [EmbeddingTableSpec(name, DIM, fusion_group=group, dynamic=TableOptions(
        dim=DIM, max_capacity=capacity, bucket_capacity=16, initializer=SEEDED,
        admission=admission, check_mode="IGNORE", **kwargs)) for name in ("user_t", "item_t")]
    return EmbeddingCollection(tables, FEATURES, SparseSGD(lr=0.1))


def _train(collection, make_kjt, steps=3):
    for step in range(steps):
        out = collection(make_kjt(KEYS, BATCH, NUM_IDS, seed=step))
        (out.pooled["user"].sum() + out.sequences["hist"][0].sum()).backward()
    return collection.stats()


def test_fused_tables_count_their_own_admission_rejections(make_kjt):
    """With room for every id, each table's rejections are what it rejects unfused."""
    fused, unfused = (_train(_admitting(f, 128), make_kjt) for f in (True, False))
    storage = fused["storages"]["deep"]
    for name in ("user_t", "item_t"):
        rejected = unfused["tables"][name]["admission_rejected"]
        assert rejected == unfused["storages"][name]["admission_rejected"] > 0
        assert fused["tables"][name]["admission_rejected"] == rejected
        assert storage[f"admission_rejected/{name}"] == rejected
        assert fused["tables"][name]["refused"] == 0
    assert storage["admission_rejected"] == sum(
        fused["tables"][name]["admission_rejected"] for name in ("user_t", "item_t"))


def test_fused_tables_count_their_own_refused_inserts(make_kjt):
    """A full storage (one bucket of 16 for both tables) refuses keys of both tables: each
    table's refusals are its keys', and they add up to the storage's."""
    stats = _train(_admitting(True, 8, score_strategy="NO_EVICTION"), make_kjt, steps=4)
    refused = [stats["tables"][name]["refused"] for name in ("user_t", "item_t")]
    assert min(refused) > 0 and sum(refused) == stats["storages"]["deep"]["refused"]
