"""Test helpers: a collection whose tables store rows in one dtype, preloaded alike.

Its storages cover every way a half table is read and updated: a dynamic table alone in
its join whose features are all bags ("user": on the Triton path its pooling reads the
rows from the table by slot), two dynamic tables fused into one storage ("item",
"query") and two dense tables grouped into one matrix ("cate", "brand"), those four
joined by their row width, with sum, mean, weighted and sequence features.
"""

from __future__ import annotations

import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.table import (
    InitializerArgs,
    SparseAdagrad,
    SparseAdam,
    SparseRowWiseAdagrad,
    SparseSGD,
    TableOptions,
)

NUM_IDS, BATCH = 30, 6
FEATURES = [EmbeddingFeatureSpec("u", "user"), EmbeddingFeatureSpec("um", "user", pooling="mean"),
            EmbeddingFeatureSpec("i", "item", weighted=True), EmbeddingFeatureSpec("q", "query"),
            EmbeddingFeatureSpec("c", "cate", pooling="mean"), EmbeddingFeatureSpec("b", "brand"),
            EmbeddingFeatureSpec("h", "item", is_sequence=True, max_length=3)]
KEYS = [f.name for f in FEATURES]
DIMS = {"user": 8, "item": 4, "query": 4, "cate": 4, "brand": 4}
OPTIMIZERS = {
    "sgd": SparseSGD(lr=0.3),
    "adagrad": SparseAdagrad(lr=0.2),
    "rowwise_adagrad": SparseRowWiseAdagrad(lr=0.2),
    "adam": SparseAdam(lr=0.05, weight_decay=0.01),
}
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
SEEDED = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=5)


def half_collection(dtype: torch.dtype, optimizer, device="cpu") -> EmbeddingCollection:
    """The collection of the module docstring, every table storing ``dtype`` rows."""
    def dynamic(name, group):
        return EmbeddingTableSpec(name, DIMS[name], fusion_group=group, dynamic=TableOptions(
            dim=DIMS[name], max_capacity=128, bucket_capacity=16, initializer=SEEDED,
            dtype=dtype))

    tables = [dynamic("user", None), dynamic("item", "g"), dynamic("query", "g"),
              *[EmbeddingTableSpec(name, DIMS[name], num_rows=NUM_IDS, initializer=SEEDED,
                                   dtype=dtype) for name in ("cate", "brand")]]
    return EmbeddingCollection(tables, FEATURES, optimizer, device)


def start_rows(optimizer, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per table, NUM_IDS full rows representable in ``dtype``: random embeddings and
    positive optimizer state (accumulators and second moments must be >= 0)."""
    g = torch.Generator().manual_seed(17)
    rows = {}
    for name, dim in DIMS.items():
        emb = torch.randn(NUM_IDS, dim, generator=g) * 0.3
        state = torch.rand(NUM_IDS, optimizer.state_dim(dim), generator=g) * 0.5
        rows[name] = torch.cat([emb, state], 1).to(dtype)
    return rows


def preload(collection: EmbeddingCollection, rows: dict[str, torch.Tensor]) -> None:
    """Ids [0, NUM_IDS) of every table hold ``rows`` (converted to the table's dtype)."""
    dynamic = collection.dynamic_tables()
    for name, table_rows in rows.items():
        storage, tag = collection.table_locations()[name]
        if storage in dynamic:
            table = dynamic[storage]
            table.load_state(torch.arange(NUM_IDS, device=table.device),
                             torch.full((NUM_IDS,), tag, dtype=torch.int32, device=table.device),
                             table_rows.to(table.device),
                             torch.zeros(NUM_IDS, dtype=torch.int64, device=table.device))
        else:
            collection.dense_tables[name].rows.copy_(table_rows)


def table_rows(collection: EmbeddingCollection) -> dict[str, torch.Tensor]:
    """Per logical table, its stored full rows on the CPU, ordered by key."""
    out = {name: t.rows.detach().cpu().clone() for name, t in collection.dense_tables.items()}
    dynamic = collection.dynamic_tables()
    for name, (storage, tag) in collection.table_locations().items():
        if storage in dynamic:
            parts = [(k[t == tag], r[t == tag])
                     for k, t, r, _ in dynamic[storage].export_state(1 << 20)]
            keys = torch.cat([k for k, _ in parts]).cpu()
            out[name] = torch.cat([r for _, r in parts]).cpu()[torch.argsort(keys)]
    return out


def batch(make_kjt, step: int, device="cpu"):
    """A training batch of ids in [0, NUM_IDS) (all preloaded); ``make_kjt`` is the
    fixture of that name."""
    return make_kjt(KEYS, BATCH, NUM_IDS, seed=step, weighted=True).to(device)


def linear_loss(out) -> torch.Tensor:
    """A loss whose gradient does not depend on the rows: both paths of a comparison then
    update from the same float32 gradients (up to the order of their sums)."""
    g = torch.Generator().manual_seed(3)
    loss = 0.0
    for name in sorted(out.pooled):
        t = out.pooled[name]
        loss = loss + (t * torch.randn(t.shape, generator=g).to(t.device)).sum()
    for name in sorted(out.sequences):
        t = out.sequences[name][0]
        loss = loss + (t * torch.randn(t.shape, generator=g).to(t.device)).sum()
    return loss
