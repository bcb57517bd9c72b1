"""Storages of one row width joined (one dedup, one pooling) give the same outputs,
gradients and table updates as storages apart, whatever the features: bags with
weights or mean pooling, empty bags, sequences, dense tables and several dynamic
storages."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hashrec.embedding import (  # noqa: E402
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    joint,
)
from hashrec.table import InitializerArgs, SparseAdam, TableOptions  # noqa: E402
from hashrec.table.ops import dispatch  # noqa: E402

DIM, BATCH, STEPS = 4, 6, 4
FEATURES = [
    EmbeddingFeatureSpec("user", "user_t"),
    EmbeddingFeatureSpec("item", "item_t", pooling="mean"),
    EmbeddingFeatureSpec("hist", "item_t", is_sequence=True, max_length=3),
    EmbeddingFeatureSpec("cat", "cat_t", weighted=True),
    EmbeddingFeatureSpec("city", "city_t", pooling="mean"),
    EmbeddingFeatureSpec("wide", "wide_t"),  # another row width: never joined with the rest
]
KEYS = [f.name for f in FEATURES]


def _collection(device: str) -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3)
    dynamic = lambda capacity: TableOptions(dim=DIM, max_capacity=capacity,  # noqa: E731
                                            bucket_capacity=16, initializer=init)
    tables = [
        EmbeddingTableSpec("user_t", DIM, dynamic=dynamic(64)),
        EmbeddingTableSpec("item_t", DIM, dynamic=dynamic(128)),
        EmbeddingTableSpec("cat_t", DIM, num_rows=9, initializer=init),
        EmbeddingTableSpec("city_t", DIM, num_rows=13, initializer=init),
        EmbeddingTableSpec("wide_t", 2 * DIM, num_rows=9, initializer=init),
    ]
    torch.manual_seed(0)
    return EmbeddingCollection(tables, FEATURES, SparseAdam(lr=0.05), device)


def _batch(step: int, make_kjt, device: str):
    kjt = make_kjt(KEYS, BATCH, 9, seed=step, weighted=True)
    return type(kjt).from_lengths(KEYS, kjt.values(), kjt.lengths(), kjt.weights()).to(device)


def _run(make_kjt, monkeypatch, enabled: str, prepare: bool, device: str):
    monkeypatch.setenv(joint.ENV, enabled)
    collection = _collection(device)
    outputs = []
    for step in range(STEPS):
        kjt = _batch(step, make_kjt, device)
        if prepare:
            collection.prepare(kjt)
        out = collection(kjt)
        # Outputs by name: the order of the output dicts follows the joins.
        loss = sum((out.pooled[name] * (i + 1)).pow(2).sum()
                   for i, name in enumerate(sorted(out.pooled))) + \
            sum(out.sequences[name][0].sum() for name in sorted(out.sequences))
        loss.backward()
        outputs.append({**out.pooled, **{k: v for k, (v, _) in out.sequences.items()}})
    tables = {}
    for name, table in collection.dynamic_tables().items():
        keys, _, rows, scores = (torch.cat(p) for p in zip(*table.export_state(1 << 10)))
        order = torch.argsort(keys)
        tables[name] = (keys[order], rows[order], scores[order])
    dense = {name: t.rows.clone() for name, t in collection.dense_tables.items()}
    return outputs, tables, dense, collection.stats()["tables"], collection


@pytest.fixture(params=["reference", "triton"])
def kernels(request, monkeypatch):
    """The device to run on: the CPU with the reference ops, or the Triton kernels (on
    CUDA when there is a GPU, else interpreted on the CPU)."""
    device = "cpu"
    if request.param == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
        if torch.cuda.is_available():
            device = "cuda"
        else:
            monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    yield device
    dispatch._forced.cache_clear()


@pytest.mark.parametrize("prepare", [False, True], ids=["in_forward", "prepared"])
def test_joined_storages_equal_storages_apart(make_kjt, monkeypatch, kernels, prepare):
    apart = _run(make_kjt, monkeypatch, "0", prepare, kernels)
    joined = _run(make_kjt, monkeypatch, "1", prepare, kernels)
    storages = [s.name for s in joined[4]._read_storages()]
    joins = joined[4]._joins(joined[4]._read_storages())
    assert any(len(j) > 1 for j in joins) and any(len(j) == 1 for j in joins), (storages, joins)
    for step, (want, got) in enumerate(zip(apart[0], joined[0])):
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name], got[name]), (step, name)
    for name, (keys, rows, scores) in apart[1].items():
        assert torch.equal(keys, joined[1][name][0]) and torch.equal(scores, joined[1][name][2])
        assert torch.equal(rows, joined[1][name][1]), name
    for name, rows in apart[2].items():
        assert torch.equal(rows, joined[2][name]), name
    assert apart[3] == joined[3]
