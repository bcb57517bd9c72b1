"""EmbeddingCollection: modes, admission, sequences, sharing, statistics and errors."""

import pytest
import torch

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingError,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import AdmissionOptions, InitializerArgs, SparseSGD, TableOptions

DIM = 4


def _dynamic(name="t", fusion_group=None, **kwargs):
    options = TableOptions(dim=DIM, max_capacity=64, bucket_capacity=16,
                           initializer=InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=1),
                           eval_initializer=InitializerArgs(mode="CONSTANT", value=0.5),
                           **kwargs)
    return EmbeddingTableSpec(name, DIM, dynamic=options, fusion_group=fusion_group)


def _kjt(bags_by_key):
    keys = list(bags_by_key)
    values = [v for bags in bags_by_key.values() for bag in bags for v in bag]
    lengths = [len(bag) for bags in bags_by_key.values() for bag in bags]
    return KeyedJaggedTensor.from_lengths(keys, torch.tensor(values, dtype=torch.int64),
                                          torch.tensor(lengths))


def test_eval_never_inserts_and_reads_eval_initializer():
    collection = EmbeddingCollection([_dynamic()], [EmbeddingFeatureSpec("f", "t")],
                                     SparseSGD(lr=0.1))
    table = collection.dynamic_tables()["t"]
    trained = collection(_kjt({"f": [[1, 2], [2]]})).pooled["f"]
    step, size = table.step, table.size()
    collection.eval()
    out = collection(_kjt({"f": [[1, 2], [2], [8, 9], []]})).pooled["f"]
    assert (table.step, table.size()) == (step, size) == (1, 2)
    torch.testing.assert_close(out[:2], trained.detach())
    torch.testing.assert_close(out[2], torch.full((DIM,), 1.0))  # two misses read as 0.5
    assert not out[3].any()
    assert collection.stats()["storages"]["t"]["inserts"] == 2


def test_admission_gates_rows_through_the_layer():
    collection = EmbeddingCollection(
        [_dynamic(admission=AdmissionOptions(threshold=3))],
        [EmbeddingFeatureSpec("f", "t")], SparseSGD(lr=1.0))
    table = collection.dynamic_tables()["t"]
    out = collection(_kjt({"f": [[5, 5], [6]]})).pooled["f"]
    assert table.size() == 0
    assert not out.any()  # not admitted: the admission initializer (0)
    out.sum().backward()  # pending keys receive no update
    assert table.size() == 0
    out = collection(_kjt({"f": [[5], [6]]})).pooled["f"]  # 5 reaches 3 occurrences
    assert table.contains(torch.tensor([5, 6])).tolist() == [True, False]
    assert out[0].abs().sum() > 0 and not out[1].any()
    stats = collection.stats()
    assert stats["storages"]["t"]["admission_rejected"] == 3
    assert stats["tables"]["t"]["stored"] == 1 and stats["tables"]["t"]["unique_ids"] == 4


def test_sequence_outputs_padded_masked_and_truncated():
    features = [EmbeddingFeatureSpec("hist", "t", is_sequence=True, max_length=3),
                EmbeddingFeatureSpec("q", "t")]
    collection = EmbeddingCollection([_dynamic()], features, SparseSGD(lr=1.0))
    out = collection(_kjt({"hist": [[1, 2, 3, 4, 5], [], [2]], "q": [[1], [], [2]]}))
    padded, lengths = out.sequences["hist"]
    assert padded.shape == (3, 3, DIM) and lengths.tolist() == [3, 0, 1]
    table = collection.dynamic_tables()["t"]
    assert table.contains(torch.tensor([1, 2, 3, 4, 5])).tolist() == [True] * 3 + [False] * 2
    values, _ = table.find(torch.tensor([1, 2, 3]))
    torch.testing.assert_close(padded[0], values)
    torch.testing.assert_close(padded[2, 0], values[1])
    assert not padded[1].any() and not padded[2, 1:].any()
    torch.testing.assert_close(out.pooled["q"][0], values[0])
    before = values.clone()
    padded.sum().backward()
    after, _ = table.find(torch.tensor([1, 2, 3]))
    # SGD lr 1 with gradient 1 per occurrence: id 2 appears twice in the sequences.
    torch.testing.assert_close(before - after, torch.tensor([[1.0], [2.0], [1.0]]).expand(3, DIM))


def test_shared_table_is_looked_up_once_per_step(monkeypatch):
    features = [EmbeddingFeatureSpec("user_a", "shared"), EmbeddingFeatureSpec("user_b", "shared"),
                EmbeddingFeatureSpec("seq__user", "shared", is_sequence=True, max_length=2)]
    collection = EmbeddingCollection([_dynamic("shared")], features, SparseSGD(lr=0.1))
    table = collection.dynamic_tables()["shared"]
    calls = []
    original = table.lookup
    monkeypatch.setattr(table, "lookup", lambda *a, **k: calls.append(a[0]) or original(*a, **k))
    collection(_kjt({"user_a": [[1, 2]], "user_b": [[2, 3]], "seq__user": [[3, 4]]}))
    assert len(calls) == 1 and calls[0].tolist() == [1, 2, 3, 4]
    stats = collection.stats()
    assert stats["tables"]["shared"]["lookups"] == 1
    assert stats["tables"]["shared"]["ids"] == 6
    assert stats["storages"]["shared"]["lookups"] == 4  # unique keys, counted by the table


def test_mixed_dense_and_dynamic_with_mean_and_weighted_pooling():
    tables = [EmbeddingTableSpec("d", DIM, num_rows=5,
                                 initializer=InitializerArgs(mode="CONSTANT", value=1.0)),
              _dynamic()]
    features = [EmbeddingFeatureSpec("dm", "d", pooling="mean"),
                EmbeddingFeatureSpec("dw", "d", weighted=True), EmbeddingFeatureSpec("f", "t")]
    collection = EmbeddingCollection(tables, features, SparseSGD(lr=0.1))
    kjt = KeyedJaggedTensor.from_lengths(
        ["dm", "dw", "f"], torch.tensor([0, 4, 1, 2, 3, 7]), torch.tensor([2, 0, 1, 2, 0, 1]),
        torch.tensor([9.0, 9.0, 2.0, 0.5, 0.25, 9.0]))
    out = collection(kjt)
    torch.testing.assert_close(out.pooled["dm"], torch.tensor([[1.0] * DIM, [0.0] * DIM]))
    torch.testing.assert_close(out.pooled["dw"], torch.tensor([[2.0] * DIM, [0.75] * DIM]))
    assert out.pooled["f"].shape == (2, DIM) and not out.pooled["f"][0].any()
    assert list(collection.dynamic_tables()) == ["t"]


def test_a_spec_with_a_key_reads_another_features_ids():
    # A WIDE group's feature: its ids are embedded by its own table and by a second one.
    tables = [EmbeddingTableSpec("d", DIM, num_rows=5,
                                 initializer=InitializerArgs(mode="CONSTANT", value=1.0)),
              _dynamic("d_wide")]
    features = [EmbeddingFeatureSpec("f", "d"),
                EmbeddingFeatureSpec("f@wide", "d_wide", weighted=True, key="f")]
    collection = EmbeddingCollection(tables, features, SparseSGD(lr=0.5))
    kjt = KeyedJaggedTensor.from_lengths(["f"], torch.tensor([1, 2, 3]), torch.tensor([2, 1]),
                                         torch.tensor([1.0, 2.0, 0.5]))
    out = collection(kjt)
    assert set(out.pooled) == {"f", "f@wide"}
    torch.testing.assert_close(out.pooled["f"], torch.full((2, DIM), 2.0).index_fill(
        0, torch.tensor([1]), 1.0))
    wide = collection.dynamic_tables()["d_wide"]
    assert wide.size() == 3 and wide.contains(torch.tensor([1, 2, 3])).all()
    rows, _ = wide.find(torch.tensor([1, 2, 3]))
    torch.testing.assert_close(out.pooled["f@wide"],
                               torch.stack([rows[0] + 2 * rows[1], 0.5 * rows[2]]))
    out.pooled["f@wide"].sum().backward()  # trains d_wide only
    moved, _ = wide.find(torch.tensor([1]))
    torch.testing.assert_close(moved[0], rows[0] - 0.5)
    assert (collection.dense_tables["d"].rows[:, :DIM] == 1.0).all()
    with pytest.raises(EmbeddingError, match=r"lacks features \['f'\]"):
        collection(_kjt({"g": [[1]]}))


@pytest.mark.parametrize("build, message", [
    (lambda: EmbeddingCollection([_dynamic()], [EmbeddingFeatureSpec("f", "nope")],
                                 SparseSGD()), "unknown table 'nope'"),
    (lambda: EmbeddingCollection([_dynamic(), _dynamic()], [], SparseSGD()),
     "duplicate table names"),
    (lambda: EmbeddingCollection([_dynamic()], [EmbeddingFeatureSpec("f", "t",
                                                                     is_sequence=True)],
                                 SparseSGD()), "max_length must be > 0"),
    (lambda: EmbeddingCollection([_dynamic()], [], "adagrad"), "sparse_optimizer"),
], ids=["unknown-table", "duplicate-table", "sequence-length", "bad-optimizer"])
def test_bad_configuration_raises(build, message):
    with pytest.raises(EmbeddingError, match=message):
        build()


def test_a_fused_storage_named_like_a_table_takes_another_name():
    """Group 'g' fuses a and b while a table is named 'g' (and a group 'g_fused' exists)."""
    tables = [_dynamic("a", "g"), _dynamic("b", "g"), _dynamic("g"),
              _dynamic("c", "g_fused"), _dynamic("d", "g_fused")]
    collection = EmbeddingCollection(tables, [], SparseSGD())
    assert collection.table_locations() == {
        "a": ("g_fused", 0), "b": ("g_fused", 1), "g": ("g", 0),
        "c": ("g_fused_fused", 0), "d": ("g_fused_fused", 1)}


def test_bad_batches_name_the_feature():
    tables = [EmbeddingTableSpec("d", DIM, num_rows=5), _dynamic()]
    features = [EmbeddingFeatureSpec("gender", "d"), EmbeddingFeatureSpec("w", "t",
                                                                          weighted=True)]
    collection = EmbeddingCollection(tables, features, SparseSGD())
    with pytest.raises(EmbeddingError, match=r"lacks features \['w'\]"):
        collection(_kjt({"gender": [[1]]}))
    with pytest.raises(EmbeddingError, match="'w' is weighted"):
        collection(_kjt({"gender": [[1]], "w": [[1]]}))
    plain = EmbeddingCollection(tables, [EmbeddingFeatureSpec("gender", "d"),
                                         EmbeddingFeatureSpec("w", "t")], SparseSGD())
    with pytest.raises(EmbeddingError, match=r"feature 'gender': ids \[5, -1\] are outside"):
        plain(_kjt({"gender": [[5, -1]], "w": [[1]]}))
    assert plain.dynamic_tables()["t"].size() == 0  # nothing was inserted before the error


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_a_batch_refused_for_its_ids_takes_no_step(prepared):
    """The step clocks (STEP scores, Adam's bias correction) stay where they were."""
    tables = [EmbeddingTableSpec("d", DIM, num_rows=5), _dynamic()]
    features = [EmbeddingFeatureSpec("gender", "d"), EmbeddingFeatureSpec("w", "t")]
    collection = EmbeddingCollection(tables, features, SparseSGD())
    dense, dynamic = collection.dense_tables["d"], collection.dynamic_tables()["t"]
    for ids, refused, steps in (([5], True, 0), ([4], False, 1), ([-1], True, 1),
                                ([0], False, 2)):
        kjt = _kjt({"gender": [ids], "w": [[1]]})
        if prepared:
            collection.prepare(kjt)
        if refused:
            with pytest.raises(EmbeddingError, match="are outside"):
                collection(kjt)
        else:
            collection(kjt)
        assert (dense.step, dynamic.step) == (steps, steps)


def test_empty_batches_give_empty_or_zero_outputs():
    features = [EmbeddingFeatureSpec("f", "t", pooling="mean"),
                EmbeddingFeatureSpec("s", "t", is_sequence=True, max_length=2)]
    collection = EmbeddingCollection([_dynamic()], features, SparseSGD(lr=0.1))
    for lengths, batch in (([0, 0, 0, 0], 2), ([], 0)):
        kjt = KeyedJaggedTensor.from_lengths(["f", "s"], torch.tensor([], dtype=torch.int64),
                                             torch.tensor(lengths, dtype=torch.int64))
        out = collection(kjt)
        assert out.pooled["f"].shape == (batch, DIM) and not out.pooled["f"].any()
        assert out.sequences["s"][0].shape == (batch, 2, DIM)
        (out.pooled["f"].sum() + out.sequences["s"][0].sum()).backward()
    assert collection.dynamic_tables()["t"].size() == 0


def test_stored_counts_of_fused_and_dense_tables_over_steps():
    # Fused dynamic tables a and b (admission: a key is stored from its third
    # occurrence), a dense pair grouped into one storage; b has no ids in step 1.
    admit = AdmissionOptions(threshold=3)
    tables = [_dynamic("a", fusion_group="g", admission=admit),
              _dynamic("b", fusion_group="g", admission=admit),
              EmbeddingTableSpec("d1", DIM, num_rows=10), EmbeddingTableSpec("d2", DIM, num_rows=5)]
    features = [EmbeddingFeatureSpec("fa", "a"), EmbeddingFeatureSpec("fb", "b"),
                EmbeddingFeatureSpec("f1", "d1"), EmbeddingFeatureSpec("f2", "d2")]
    collection = EmbeddingCollection(tables, features, SparseSGD(lr=0.1))
    dense = {"f1": [[1, 2], [2]], "f2": [[4], [0, 4]]}
    collection(_kjt({"fa": [[7, 7, 7], [8]], "fb": [[], []], **dense}))
    collection(_kjt({"fa": [[7], [8, 8]], "fb": [[3, 3, 3], [9]], **dense}))
    stats = collection.stats()["tables"]
    # a: step 1 stores 7 (3 occurrences), step 2 stores 7 (hit) and 8 (third occurrence).
    assert (stats["a"]["stored"], stats["a"]["unique_ids"], stats["a"]["lookups"]) == (3, 4, 2)
    assert (stats["b"]["stored"], stats["b"]["unique_ids"], stats["b"]["lookups"]) == (1, 2, 2)
    assert (stats["d1"]["stored"], stats["d1"]["unique_ids"]) == (4, 4)
    assert (stats["d2"]["stored"], stats["d2"]["unique_ids"]) == (4, 4)


@pytest.mark.parametrize("big", [1 << 40, -3], ids=["int64-keys", "two-passes"])
def test_a_batch_prepared_before_its_sort_widened_logs_the_move_once(caplog, big):
    """Ids past a fused storage's int32 one-pass keys move it to wider keys; the next
    batch, prepared before that with the narrow keys, repeats the move without a line."""
    collection = EmbeddingCollection([_dynamic("a", "g"), _dynamic("b", "g")],
                                     [EmbeddingFeatureSpec("fa", "a"),
                                      EmbeddingFeatureSpec("fb", "b")], SparseSGD(lr=0.1))
    batches = [_kjt({"fa": [[big, 1]], "fb": [[2]]}), _kjt({"fa": [[big + 1]], "fb": [[3]]})]
    with caplog.at_level("INFO", logger="hashrec.embedding"):
        collection.prepare(batches[0])
        collection.prepare(batches[1])
        for batch in batches:
            collection(batch)
    moves = [r.getMessage() for r in caplog.records if "dedup sort's" in r.getMessage()]
    assert len(moves) == 1, moves
    assert ("sorting int64 keys" if big > 0 else "two passes") in moves[0]
