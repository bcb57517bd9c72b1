"""Scripted lookups equal the eval-mode HashTable and EmbeddingCollection they replace."""

from __future__ import annotations

import pytest
import torch

from hashrec.embedding import KeyedJaggedTensor
from hashrec.embedding.collection import EmbeddingCollection
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.export.scripted import EmbeddingLookup, FeatureLayout, TableLookup
from hashrec.export.tables import dynamic_table_views
from hashrec.table import HashTable, InitializerArgs, TableOptions
from hashrec.table.optim import SparseAdagrad


def sorted_table(view) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.cat([k for k, _ in view.chunks(16)])
    values = torch.cat([v for _, v in view.chunks(16)])
    order = keys.argsort()
    return keys[order], values[order]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("missing", [0.0, 0.5], ids=["missing0", "missing0.5"])
def test_hashmap_lookup_matches_eval_hash_table(missing, dtype):
    options = TableOptions(dim=4, max_capacity=512, bucket_capacity=16, dtype=dtype,
                           eval_initializer=InitializerArgs(mode="CONSTANT", value=missing))
    table = HashTable(options)
    stored = torch.unique(torch.randint(-(2**62), 2**62, (300,), dtype=torch.int64))
    table.insert_or_assign(stored, torch.randn(stored.numel(), 4))
    views = dynamic_table_views(_Single(table))
    keys, values = sorted_table(views[0])
    assert views[0].dtype == dtype and values.dtype == dtype  # exported as stored
    lookup = TableLookup("t", values, keys, views[0].missing_value())
    assert lookup.values.dtype == dtype  # kept at its size
    queries = torch.cat([stored[::3], torch.randint(-(2**62), 2**62, (50,)),
                         torch.tensor([-(2**63), 2**63 - 1, 0])])
    expected = table.lookup(torch.unique(queries), train=False).values
    unique = torch.unique(queries)
    torch.testing.assert_close(lookup(unique), expected, atol=0, rtol=0)
    torch.testing.assert_close(torch.jit.script(lookup)(unique), expected, atol=0, rtol=0)


class _Single:
    """An embedding-collection-like holder of one unfused table."""

    def __init__(self, table: HashTable) -> None:
        self.table = table

    def dynamic_tables(self):
        return {"t": self.table}

    def table_locations(self):
        return {"t": ("t", 0)}


def test_empty_hashmap_reads_missing_value():
    lookup = torch.jit.script(TableLookup("t", torch.empty(0, 3),
                                          torch.empty(0, dtype=torch.int64), 0.25))
    assert torch.equal(lookup(torch.tensor([1, 2])), torch.full((2, 3), 0.25))


def test_dense_lookup_rejects_ids_outside_the_table():
    lookup = torch.jit.script(TableLookup("small", torch.randn(4, 2)))
    assert lookup(torch.tensor([3, 0])).shape == (2, 2)
    half = torch.randn(4, 2).to(torch.bfloat16)
    rows = torch.jit.script(TableLookup("half", half))(torch.tensor([3, 0]))
    assert rows.dtype == torch.float32 and torch.equal(rows, half[[3, 0]].float())
    with pytest.raises((RuntimeError, torch.jit.Error), match="table small: ids outside"):
        lookup(torch.tensor([4]))


def collection() -> EmbeddingCollection:
    dynamic = TableOptions(dim=4, max_capacity=256, bucket_capacity=16,
                           initializer=InitializerArgs(mode="NORMAL", std_dev=0.1))
    tables = [EmbeddingTableSpec("a", 4, dynamic=dynamic, fusion_group="g"),
              EmbeddingTableSpec("b", 4, dynamic=dynamic, fusion_group="g"),
              EmbeddingTableSpec("d", 4, num_rows=10)]
    features = [EmbeddingFeatureSpec("fa", "a"),
                EmbeddingFeatureSpec("fb", "b", pooling="mean"),
                EmbeddingFeatureSpec("seq", "a", is_sequence=True, max_length=3),
                EmbeddingFeatureSpec("fd", "d", weighted=True)]
    return EmbeddingCollection(tables, features, SparseAdagrad(lr=0.1))


def random_kjt(batch: int, generator: torch.Generator) -> KeyedJaggedTensor:
    lengths = torch.randint(0, 5, (4 * batch,), generator=generator)
    ids = torch.randint(0, 40, (int(lengths.sum()),), generator=generator)
    start = int(lengths[:3 * batch].sum())
    ids[start:] %= 10
    weights = torch.rand(ids.numel(), generator=generator)
    return KeyedJaggedTensor(["fa", "fb", "seq", "fd"], ids, lengths, weights)


def test_embedding_lookup_matches_eval_collection_with_fused_tables():
    generator = torch.Generator().manual_seed(0)
    ec = collection()
    ec.train()
    with torch.no_grad():
        ec(random_kjt(16, generator))
    ec.eval()
    views = dynamic_table_views(ec)
    assert [(v.name, v.tag) for v in views] == [("a", 0), ("b", 1)]
    tables = [TableLookup(v.name, *reversed(sorted_table(v)), v.missing_value())
              for v in views]
    tables.append(TableLookup("d", ec.dense_tables["d"].rows[:, :4]))
    layouts = [FeatureLayout("fa", "a"), FeatureLayout("fb", "b", mean=True),
               FeatureLayout("seq", "a", is_sequence=True, max_length=3),
               FeatureLayout("fd", "d", weighted=True)]
    lookup = torch.jit.script(EmbeddingLookup(tables, layouts))
    kjt = random_kjt(9, generator)
    with torch.no_grad():
        expected = ec(kjt)
    bags = kjt.to_dict()
    pooled, sequences, lengths = lookup({k: b.values for k, b in bags.items()},
                                        {k: b.lengths for k, b in bags.items()},
                                        {"fd": bags["fd"].weights})
    assert set(pooled) == {"fa", "fb", "fd"}
    for name in pooled:
        torch.testing.assert_close(pooled[name], expected.pooled[name], atol=1e-6, rtol=0)
    padded, seq_lengths = expected.sequences["seq"]
    torch.testing.assert_close(sequences["seq"], padded, atol=0, rtol=0)
    assert torch.equal(lengths["seq"], seq_lengths)
