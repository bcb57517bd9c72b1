"""Ids deduplicated ahead of the forward (``EmbeddingCollection.prepare``) train the same."""

import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.embedding.zch import ZchOptions
from hashrec.table import InitializerArgs, SparseAdam, TableOptions

DIM, NUM_IDS = 8, 50
FEATURES = [EmbeddingFeatureSpec("d", "dense"), EmbeddingFeatureSpec("u", "user", pooling="mean"),
            EmbeddingFeatureSpec("i", "item", weighted=True),
            EmbeddingFeatureSpec("h", "item", is_sequence=True, max_length=3),
            EmbeddingFeatureSpec("z", "zch")]


def _collection():
    seeded = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=5)
    dynamic = [EmbeddingTableSpec(name, DIM, fusion_group="g", dynamic=TableOptions(
        dim=DIM, max_capacity=512, bucket_capacity=32, initializer=seeded))
        for name in ("user", "item")]
    dense = EmbeddingTableSpec("dense", DIM, num_rows=NUM_IDS, initializer=seeded)
    zch = EmbeddingTableSpec("zch", DIM, num_rows=16, initializer=seeded,
                             zch=ZchOptions(zch_size=16, eviction_interval=2))
    return EmbeddingCollection([dense, zch, *dynamic], FEATURES, SparseAdam(lr=0.05), "cpu")


def _train_step(collection, kjt):
    out = collection(kjt)
    loss = sum((t ** 2).sum() for t in out.pooled.values()) + out.sequences["h"][0].sum()
    loss.backward()
    return out


def test_prepared_forward_equals_plain_forward(make_kjt):
    plain, ahead = _collection(), _collection()
    for step in range(4):
        kjt = make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=step, weighted=True)
        twin = make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=step, weighted=True)
        ahead.prepare(twin)
        assert twin.prepared is not None and "zch" not in twin.prepared.batches
        assert set(twin.prepared.batches) and all(
            isinstance(t, torch.Tensor) for t in twin.tensors())
        got, want = _train_step(ahead, twin), _train_step(plain, kjt)
        assert twin.prepared is None  # used once, then dropped
        for name in want.pooled:
            torch.testing.assert_close(got.pooled[name], want.pooled[name])
        torch.testing.assert_close(got.sequences["h"][0], want.sequences["h"][0])
    assert ahead.stats()["tables"] == plain.stats()["tables"]


def test_ids_prepared_by_another_collection_are_ignored(make_kjt):
    first, second = _collection(), _collection()
    kjt = make_kjt([f.name for f in FEATURES], 8, NUM_IDS, seed=0, weighted=True)
    twin = make_kjt([f.name for f in FEATURES], 8, NUM_IDS, seed=0, weighted=True)
    first.prepare(kjt)
    torch.testing.assert_close(second(kjt).pooled["u"], _collection()(twin).pooled["u"])
