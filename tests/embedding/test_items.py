"""Multi-value sequences (hashrec/embedding/items.py): an item's ids pooled, then padded."""

import pytest
import torch
from host_reads import HostReads

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingError,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.embedding.items import pad_items
from hashrec.embedding.specs import items_key
from hashrec.table import InitializerArgs, SparseSGD, TableOptions

DIM = 4
# rows of items, each item a list of ids: row 0 = [(1, 2), (3)], row 1 = [], row 2 = [(2, 2, 5)]
ROWS = [[[1, 2], [3]], [], [[2, 2, 5]]]


def _kjt(rows=ROWS, key="s"):
    ids = [i for row in rows for item in row for i in item]
    per_row = [sum(len(item) for item in row) for row in rows]
    sizes = [len(item) for row in rows for item in row]
    items = [len(row) for row in rows]
    return KeyedJaggedTensor.from_lengths([key, items_key(key)],
                                          torch.tensor(ids + sizes, dtype=torch.int64),
                                          torch.tensor(per_row + items))


def _collection(pooling, dynamic=False, max_length=3):
    if dynamic:
        options = TableOptions(dim=DIM, max_capacity=64, bucket_capacity=16,
                               initializer=InitializerArgs(mode="NORMAL", std_dev=0.1,
                                                           key_seed=1))
        table = EmbeddingTableSpec("t", DIM, dynamic=options)
    else:
        table = EmbeddingTableSpec("t", DIM, num_rows=8)
    spec = EmbeddingFeatureSpec("s", "t", pooling, is_sequence=True, max_length=max_length,
                                multi_value=True)
    return EmbeddingCollection([table], [spec], SparseSGD(lr=1.0))


def _rows(collection, keys):
    if collection.dynamic_tables():
        table = collection.dynamic_tables()["t"]
        return table.find(torch.tensor(keys))[0]
    return collection.dense_tables["t"].rows[:, :DIM].detach()[torch.tensor(keys)]


def _expected(collection, pooling, max_length=3):
    want = torch.zeros(len(ROWS), max_length, DIM)
    for b, row in enumerate(ROWS):
        for i, item in enumerate(row[:max_length]):
            vectors = _rows(collection, item)
            want[b, i] = vectors.mean(0) if pooling == "mean" else vectors.sum(0)
    return want


@pytest.mark.parametrize("dynamic", [False, True], ids=["dense", "dynamic"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_an_item_is_the_pooling_of_its_ids(pooling, dynamic):
    collection = _collection(pooling, dynamic)
    collection.eval()  # a dynamic table must hold the ids first: train once
    if dynamic:
        collection.train()
        collection(_kjt())
        collection.eval()
    value, lengths = collection(_kjt()).sequences["s"]
    assert value.shape == (3, 3, DIM)
    assert lengths.tolist() == [2, 0, 1]
    torch.testing.assert_close(value, _expected(collection, pooling))


def test_gradients_reach_every_id_of_an_item():
    collection = _collection("mean")
    before = collection.dense_tables["t"].rows[:, :DIM].detach().clone()
    value, _ = collection(_kjt()).sequences["s"]
    value.sum().backward()  # SGD lr 1: each row moves by minus its gradient
    moved = before - collection.dense_tables["t"].rows[:, :DIM].detach()
    # id 2: 1/2 (item (1, 2)) + 2/3 (twice in item (2, 2, 5)); ids 1 and 3: 1/2 and 1
    want = {1: 0.5, 2: 0.5 + 2 / 3, 3: 1.0, 5: 1 / 3, 0: 0.0, 4: 0.0}
    for key, weight in want.items():
        torch.testing.assert_close(moved[key], torch.full((DIM,), weight))


def test_items_past_max_length_are_dropped():
    collection = _collection("sum", max_length=1)
    value, lengths = collection(_kjt()).sequences["s"]
    assert value.shape == (3, 1, DIM) and lengths.tolist() == [1, 0, 1]
    torch.testing.assert_close(value, _expected(collection, "sum", max_length=1))


def test_the_item_sizes_key_is_required():
    collection = _collection("sum")
    kjt = KeyedJaggedTensor.from_lengths(["s"], torch.tensor([1, 2]), torch.tensor([2, 0, 0]))
    with pytest.raises(EmbeddingError, match=r"lacks features \['s#items'\]"):
        collection(kjt)


def test_padding_reads_nothing_on_the_host():
    pooled = torch.arange(12.0).view(4, 3)
    with HostReads() as reads:
        padded, lengths = pad_items(pooled, torch.tensor([3, 0, 1]), 2)
    assert not reads.counts
    assert lengths.tolist() == [2, 0, 1]
    assert padded.tolist() == [[[0, 1, 2], [3, 4, 5]], [[0, 0, 0], [0, 0, 0]],
                               [[9, 10, 11], [0, 0, 0]]]
