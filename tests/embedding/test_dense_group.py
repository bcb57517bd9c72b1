"""Dense tables of one row layout read as one storage (DenseGroup)."""

import io

import pytest
import torch

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingError,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import SparseAdam, SparseSGD


def _kjt(bags_by_key):
    values = [v for bags in bags_by_key.values() for bag in bags for v in bag]
    lengths = [len(bag) for bags in bags_by_key.values() for bag in bags]
    return KeyedJaggedTensor.from_lengths(list(bags_by_key), torch.tensor(values),
                                          torch.tensor(lengths))


def _collection(optimizer, dims=(4, 4, 4), dtypes=(None, None, None)):
    tables = [EmbeddingTableSpec(f"t{i}", dim, num_rows=5 + i, dtype=dtype)
              for i, (dim, dtype) in enumerate(zip(dims, dtypes))]
    features = [EmbeddingFeatureSpec(f"f{i}", f"t{i}", pooling="mean" if i else "sum")
                for i in range(len(dims))]
    return EmbeddingCollection(tables, features, optimizer)


BATCHES = [{"f0": [[0, 1], [4]], "f1": [[5], [0, 0]], "f2": [[6, 1], []]},
           {"f0": [[2], [2, 3]], "f1": [[1], [5]], "f2": [[0], [6]]}]


def _train(collection):
    for bags in BATCHES:
        out = collection(_kjt(bags))
        sum(((i + 1) * v).sum() for i, v in enumerate(out.pooled.values())).backward()
    return {name: t.rows.clone() for name, t in collection.dense_tables.items()}


@pytest.mark.parametrize("optimizer", [SparseSGD(lr=0.1), SparseAdam(lr=0.1)],
                         ids=["sgd", "adam"])
def test_grouped_tables_train_like_separate_ones(optimizer):
    grouped = _collection(optimizer)
    assert len(grouped._units) == 1
    separate = _collection(optimizer)
    separate._units = list(separate._storages)  # one storage per table
    separate.load_state_dict(grouped.state_dict())
    got, want = _train(grouped), _train(separate)
    for name in want:
        torch.testing.assert_close(got[name], want[name])


def test_rows_are_views_but_state_dict_is_standalone():
    collection = _collection(SparseSGD(lr=0.1))
    state = collection.state_dict()
    rows = [collection.dense_tables[f"t{i}"].rows for i in range(3)]
    assert rows[0].untyped_storage().data_ptr() == rows[1].untyped_storage().data_ptr()
    for i in range(3):
        saved = state[f"dense_tables.t{i}.rows"]
        assert saved.untyped_storage().nbytes() == saved.numel() * saved.element_size()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    loaded["dense_tables.t1.rows"].fill_(3.0)
    collection.load_state_dict(loaded)
    out = collection(_kjt({"f0": [[0]], "f1": [[2]], "f2": [[0]]})).pooled
    assert (out["f1"] == 3.0).all()


def test_only_matching_layouts_are_grouped():
    collection = _collection(SparseSGD(lr=0.1), dims=(4, 8, 4))
    names = sorted(s.name for s in collection._units)
    assert names == ["dense_group:t0,t2", "t1"]
    collection = _collection(SparseSGD(lr=0.1), dtypes=(torch.float16, None, torch.float16))
    names = sorted(s.name for s in collection._units)
    assert names == ["dense_group:t0,t2", "t1"]  # a row dtype of its own


def test_half_tables_group_in_a_half_matrix_and_train_like_separate_ones():
    half = (torch.bfloat16,) * 3
    grouped = _collection(SparseAdam(lr=0.1), dtypes=half)
    (unit,) = grouped._units
    assert unit.table.rows.dtype == torch.bfloat16
    separate = _collection(SparseAdam(lr=0.1), dtypes=half)
    separate._units = list(separate._storages)
    separate.load_state_dict(grouped.state_dict())
    got, want = _train(grouped), _train(separate)
    for name in want:
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], want[name])


def test_bad_id_in_a_grouped_table_names_it():
    collection = _collection(SparseSGD(lr=0.1))
    before = {name: t.rows.clone() for name, t in collection.dense_tables.items()}
    with pytest.raises(EmbeddingError, match=r"feature 'f2': ids \[7\] are outside \[0, 7\) "
                                             r"of table 't2'"):
        collection(_kjt({"f0": [[4]], "f1": [[5]], "f2": [[7]]}))
    for name, rows in before.items():
        assert torch.equal(collection.dense_tables[name].rows, rows)


@pytest.mark.parametrize("bad", [1 << 41, -3])
def test_huge_or_negative_id_in_a_grouped_table_names_it(bad):
    collection = _collection(SparseSGD(lr=0.1))
    with pytest.raises(EmbeddingError, match=rf"feature 'f1': ids \[{bad}\] are outside"):
        collection(_kjt({"f0": [[4]], "f1": [[bad]], "f2": [[1]]}))


def test_a_replaced_member_is_joined_again():
    collection = _collection(SparseSGD(lr=0.1))
    state = {k: v.clone() for k, v in collection.state_dict().items()}
    state["dense_tables.t1.rows"].fill_(2.0)
    collection.load_state_dict(state, assign=True)  # new tensors, not views any more
    out = collection(_kjt({"f0": [[0]], "f1": [[2]], "f2": [[0]]}))
    assert (out.pooled["f1"] == 2.0).all()
    out.pooled["f1"].sum().backward()
    rows = collection.dense_tables["t1"].rows
    assert rows[2, 0] < 2.0 and rows[3, 0] == 2.0  # the update reached the member
