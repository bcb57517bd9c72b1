"""The padded one-pass dedup sort (dedup_graphs): the same unique keys, order, groups and
summary as the unpadded sort, the same training through a collection, and on a GPU the
same again from captured replays."""

from __future__ import annotations

import pytest
import torch

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
    batching,
    dedup_graphs,
)
from hashrec.embedding.batching import FeatureIds, _sort_storage
from hashrec.table import InitializerArgs, SparseAdam, TableOptions

SPEC = EmbeddingFeatureSpec("f", "t")


def _features(sizes, high, seed, device="cpu"):
    """Per tag, features of random ids (several per tag; a tag may have none)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for tag_sizes in sizes:
        fs = []
        for n in tag_sizes:
            values = torch.randint(0, high, (n,), generator=g).to(device)
            fs.append(FeatureIds(SPEC, values, torch.zeros(2, dtype=torch.int64),
                                 torch.tensor([n])))
        out.append(fs)
    return out


def _padded(features_by_tag, row_ids, owners, owned, pad_to, seed=1, compact=False):
    """``padded_sort`` of the storage's ids, padding filled with junk."""
    tagged = batching._emit_order(features_by_tag)
    values = [f.values for _, f in tagged]
    n = sum(v.numel() for v in values)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-(1 << 62), 1 << 62, (pad_to,), generator=g)
    ids[:n] = torch.cat(values)
    num_tags = len(features_by_tag)
    bits = batching._ROW_BITS if row_ids else dedup_graphs.pad_bits(num_tags, compact)
    ends = torch.tensor([v.numel() for v in values]).cumsum(0)
    meta = torch.cat([ends, torch.tensor([tag << bits for tag, _ in tagged])])
    return n, dedup_graphs.padded_sort(ids, meta, num_tags, bits, row_ids, owners, owned)


CASES = [  # (row_ids, owners, owned, compact: int32 keys)
    (False, 0, None, False), (True, 0, None, False), (False, 3, None, False),
    (False, 2, (1, 3), False), (True, 2, None, False), (False, 0, None, True),
    (False, 2, (1, 3), True)]


@pytest.mark.parametrize("row_ids, owners, owned, compact", CASES)
def test_padded_sort_matches_the_unpadded_one_pass_sort(row_ids, owners, owned, compact):
    features = _features([[40, 7], [], [25], [60, 3, 9]], high=50, seed=3)
    level = 0 if row_ids else (batching.COMPACT if compact else batching.NARROW)
    want = _sort_storage(features, True, row_ids, owners, level, owned)
    n, got = _padded(features, row_ids, owners, owned, pad_to=200, compact=compact)
    for mine, ref in zip(got[:4], (want.sorted_ids, want.sorted_tags, want.order,
                                   want.group)):
        assert torch.equal(mine[:n], ref)
    assert torch.equal(got[4], want.summary)
    # The padding sorted last, into one group past the real ones, at the padding's tag.
    assert (got[1][n:] == len(features)).all()
    assert (got[3][n:] == got[3][n - 1] + 1).all()


@pytest.mark.parametrize("compact", [False, True], ids=["int64", "int32"])
def test_padded_sort_flags_ids_that_do_not_fit(compact):
    features = _features([[10], [10]], high=50, seed=4)
    num_tags = len(features)
    wide = 1 << dedup_graphs.pad_bits(num_tags, compact)  # one bit too wide
    features[1][0].values[3] = wide
    _, got = _padded(features, False, 0, None, pad_to=64, compact=compact)
    assert (got[4][num_tags:2 * num_tags] == -1).all()
    features[1][0].values[3] = -5
    _, got = _padded(features, True, 0, None, pad_to=64)
    assert (got[4][num_tags:2 * num_tags] == -1).all()


DIM, ROWS = 4, 20


def _collection():
    init = InitializerArgs(mode="UNIFORM", lower=-0.1, upper=0.1, key_seed=7)
    options = TableOptions(dim=DIM, max_capacity=256, bucket_capacity=32,
                           score_strategy="NO_EVICTION", initializer=init)
    tables = [EmbeddingTableSpec("a", DIM, dynamic=options, fusion_group="g"),
              EmbeddingTableSpec("b", DIM, dynamic=options, fusion_group="g"),
              EmbeddingTableSpec("c", DIM, num_rows=ROWS, initializer=InitializerArgs(
                  mode="NORMAL", std_dev=0.1, key_seed=3)),
              EmbeddingTableSpec("d", DIM, num_rows=ROWS, initializer=InitializerArgs(
                  mode="NORMAL", std_dev=0.1, key_seed=5))]
    features = [EmbeddingFeatureSpec("fa", "a"), EmbeddingFeatureSpec("fb", "b"),
                EmbeddingFeatureSpec("seq", "a", is_sequence=True, max_length=3),
                EmbeddingFeatureSpec("fc", "c", pooling="mean"),
                EmbeddingFeatureSpec("fd", "d")]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.05)), \
        [f.name for f in features]


def _kjt(keys, step):
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (len(keys) * 6,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys, values, lengths)


def _train(padded: bool, monkeypatch, steps: int = 6):
    graphs = dedup_graphs.DedupGraphs()
    with monkeypatch.context() as m:
        if padded:  # the padded sort on the CPU, never captured
            m.setattr(dedup_graphs, "enabled", lambda device: True)
            m.setattr(dedup_graphs, "graphs_for", lambda device: graphs)
        torch.manual_seed(0)
        collection, keys = _collection()
        kjts = [_kjt(keys, step) for step in range(steps)]
        collection.prepare(kjts[0])
        outputs = []
        for step, kjt in enumerate(kjts):
            if step + 1 < steps:
                collection.prepare(kjts[step + 1])
            out = collection(kjt)
            loss = sum((v * (1 + i)).sum() for i, v in enumerate(out.pooled.values())) + \
                sum((v ** 2).sum() for v, _ in out.sequences.values())
            loss.backward()
            outputs.append(loss.detach())
    rows = {name: sorted(zip(*[t.tolist() for t in next(table.export_state(1 << 12))[:3]
                                if t is not None]))
            for name, table in collection.dynamic_tables().items()}
    return torch.stack(outputs), rows, collection, graphs.sorts


def test_a_collection_trains_the_same_through_padded_sorts(monkeypatch):
    losses, rows, collection, sorts = _train(True, monkeypatch)
    ref_losses, ref_rows, ref_collection, _ = _train(False, monkeypatch)
    assert sorts > 0, "the padded sort never ran"
    torch.testing.assert_close(losses, ref_losses)
    assert rows.keys() == ref_rows.keys()
    for name in rows:
        assert [r[:-1] for r in rows[name]] == [r[:-1] for r in ref_rows[name]]
        torch.testing.assert_close(torch.tensor([r[-1] for r in rows[name]]),
                                   torch.tensor([r[-1] for r in ref_rows[name]]))
    for name, table in collection.dense_tables.items():
        torch.testing.assert_close(table.rows, ref_collection.dense_tables[name].rows)


def _sorted_both_ways(graphs, step: int, compact: bool, owners: int, level: int):
    """One batch of a fixed size class (another id count each step) sorted by ``graphs``
    and by the unpadded sort: (the padded outputs, the unpadded ones)."""
    features = _features([[3000 + 17 * step, 500], [2000], [800, 90]], high=5000,
                         seed=step, device="cuda")
    tagged = batching._emit_order(features)
    got = graphs.sort([f.values for _, f in tagged], [t for t, _ in tagged], len(features),
                      dedup_graphs.pad_bits(len(features), compact), False, owners, None)
    want = _sort_storage(features, True, False, owners, level, None)
    return got, (want.sorted_ids, want.sorted_tags, want.order, want.group, want.summary)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("compact", [False, True], ids=["int64", "int32"])
def test_captured_replays_sort_like_the_unpadded_sort(compact):
    graphs = dedup_graphs.DedupGraphs()
    level = batching.COMPACT if compact else batching.NARROW
    for step in range(6):  # the same size class, another count each time
        got, want = _sorted_both_ways(graphs, step, compact, 2, level)
        for mine, ref in zip(got, want):
            assert torch.equal(mine, ref)
    # Sharded (owners 2): one capture, its outputs copied out at every replay.
    assert graphs.captures == 1 and graphs.replays == 6 - dedup_graphs.CAPTURE_AFTER


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_replays_never_overwrite_outputs_still_held():
    graphs = dedup_graphs.DedupGraphs()
    held, wants = [], []
    for step in range(9):
        got, want = _sorted_both_ways(graphs, step, True, 0, batching.COMPACT)
        wants.append(want)
        if step < 6:  # held to the end: each capture's outputs stay in use
            held.append(got)
        else:  # dropped at once: the next sort may replay the same capture
            assert all(torch.equal(mine, ref) for mine, ref in zip(got, wants[-1]))
        del got
    for got, want in zip(held, wants):
        for mine, ref in zip(got, want):
            assert torch.equal(mine, ref)
    # Steps 2, 3 and 4 made the three captures; from step 5 on the outputs of all three
    # are held, so the sorts run uncaptured.
    assert graphs.captures == dedup_graphs.BUFFERS == 3
    assert graphs.replays == 3 and graphs.uncaptured == 4


def test_a_capture_is_free_once_no_tensor_but_its_own_uses_its_outputs():
    out = (torch.zeros(8), torch.zeros(4, dtype=torch.int64))
    capture = dedup_graphs._Capture(None, out)
    assert capture.free()
    view = out[0][:3]
    assert not capture.free()
    derived = view.reshape(3, 1)
    del view
    assert not capture.free()
    del derived
    assert capture.free()
    copy = out[1].clone()  # a copy holds memory of its own
    assert capture.free() and copy.numel() == 4


def test_size_classes_are_kept_up_to_a_count_and_an_ids_budget(monkeypatch):
    monkeypatch.setattr(dedup_graphs, "KEEP_IDS", 1000)
    graphs = dedup_graphs.DedupGraphs()

    def enter(*sizes):
        for size in sizes:
            graphs._entry((size, 3, 1, 8, False, 0, None, torch.device("cpu")))
        return [key[0] for key in graphs._classes]

    # Six classes of a varying batch, under the budget: all kept, a reuse moves one last.
    assert enter(64, 80, 96, 112, 128, 160) == [64, 80, 96, 112, 128, 160]
    assert enter(64) == [80, 96, 112, 128, 160, 64]
    # Past the budget the least recently used go, down to MIN_GRAPHS at the least.
    assert enter(400) == [96, 112, 128, 160, 64, 400]
    assert enter(600) == [160, 64, 400, 600]
    assert enter(5000) == [64, 400, 600, 5000]
    # Small classes: MAX_GRAPHS of them at most.
    graphs = dedup_graphs.DedupGraphs()
    assert enter(*range(1, 21)) == list(range(21 - dedup_graphs.MAX_GRAPHS, 21))


def _wide_kjt(keys, step, big):
    """``_kjt`` with ``big`` among the first dynamic feature's ids."""
    kjt = _kjt(keys, step)
    values = kjt.values().clone()
    lengths = kjt.lengths()
    if int(lengths[0]):
        values[0] = big
    return KeyedJaggedTensor(keys, values, lengths)


@pytest.mark.parametrize("bigs,want", [
    ([5, 1 << 40, 7, 1 << 62, 9], [(0, 0), (1, 0), (1, 0), (1, 1), (1, 1)]),
    ([5, -2, 7, 8], [(0, 0), (0, 1), (0, 1), (0, 1)])], ids=["int64-then-two", "negative"])
def test_ids_past_the_int32_keys_move_a_storage_to_int64_keys_then_two_passes(monkeypatch,
                                                                            caplog, bigs,
                                                                            want):
    """A fused storage's dedup tries int32 one-pass keys, then int64 ones once an id did
    not fit (when the batch's ids fit those), then two passes once one did not fit those;
    a negative id goes to two passes at once. Training is the same as with two passes
    all along."""
    def run(one_pass=None):
        torch.manual_seed(0)
        collection, keys = _collection()
        if one_pass is not None:
            monkeypatch.setattr(collection, "_one_pass", one_pass)
        losses, levels = [], []
        for step, big in enumerate(bigs):
            out = collection(_wide_kjt(keys, step, big))
            loss = sum((v * (1 + i)).sum() for i, v in enumerate(out.pooled.values()))
            loss.backward()
            losses.append(loss.detach())
            levels.append((len(collection._long_ids), len(collection._wide_ids)))
        return torch.stack(losses), levels

    with caplog.at_level("INFO", logger="hashrec.embedding"):
        losses, levels = run()
    assert levels == want
    moves = [r.getMessage() for r in caplog.records if "dedup sort's" in r.getMessage()]
    assert len(moves) == sum(want[-1]) and "two passes" in moves[-1]
    assert ("sorting int64 keys" in moves[0]) == (want[-1][0] == 1)
    two_pass, _ = run(lambda name: 0)
    torch.testing.assert_close(losses, two_pass)
