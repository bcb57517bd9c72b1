import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hashrec.table import (
    AdmissionOptions,
    HashTable,
    InitializerArgs,
    SparseAdagrad,
    TableError,
    TableFullError,
    TableOptions,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
KEYS = st.one_of(st.sampled_from([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1]),
                 st.integers(INT64_MIN, INT64_MAX), st.integers(-40, 40))
BATCH = st.lists(st.tuples(KEYS, st.integers(0, 1)), min_size=0, max_size=24)
OPS = st.lists(st.tuples(st.sampled_from(["find", "find_or_insert", "insert_or_assign",
                                          "erase", "export"]), BATCH), max_size=12)


def _tensors(batch, fused):
    keys = torch.tensor([k for k, _ in batch], dtype=torch.int64)
    tags = torch.tensor([t for _, t in batch], dtype=torch.int32) if fused else None
    return keys, tags


def _ident(batch, fused):
    return [(k, t if fused else 0) for k, t in batch]


def _apply(table, model, op, batch, fused, seed):
    keys, tags = _tensors(batch, fused)
    idents = _ident(batch, fused)
    if op == "find":
        values, founds = table.find(keys, tags=tags)
        for i, ident in enumerate(idents):
            assert bool(founds[i]) == (ident in model)
            expected = model.get(ident, torch.zeros(4))
            assert torch.equal(values[i], expected)
    elif op == "find_or_insert":
        values, founds = table.find_or_insert(keys, tags=tags)
        for i, ident in enumerate(idents):
            assert bool(founds[i]) == (ident in model)
        for i, ident in enumerate(idents):
            model.setdefault(ident, values[i].clone())
            assert torch.equal(values[i], model[ident])
    elif op == "insert_or_assign":
        values = torch.randn(len(batch), 4, generator=torch.Generator().manual_seed(seed))
        table.insert_or_assign(keys, values, tags=tags)
        for i, ident in enumerate(idents):
            model[ident] = values[i].clone()
    elif op == "erase":
        table.erase(keys, tags=tags)
        for ident in idents:
            model.pop(ident, None)
    else:
        exported = {}
        for slot_keys, slot_values, _ in table.export_batch(37):
            for k, v in zip(slot_keys.tolist(), slot_values):
                exported[k] = v
        assert len(exported) <= len(model)
        if not fused:
            assert set(exported) == {k for k, _ in model}
            for (k, _), v in model.items():
                assert torch.equal(exported[k], v)
    assert table.size() == len(model)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused-tags"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_matches_dict_model(fused, ops):
    table = HashTable(TableOptions(dim=4, max_capacity=1024, init_capacity=32,
                                   bucket_capacity=16, check_mode="ERROR"))
    model = {}
    for seed, (op, batch) in enumerate(ops):
        _apply(table, model, op, batch, fused, seed)


def test_tags_separate_key_spaces():
    table = HashTable(TableOptions(dim=2, max_capacity=64))
    keys = torch.tensor([7, 7])
    table.insert_or_assign(keys, torch.tensor([[1.0, 1.0], [2.0, 2.0]]),
                           tags=torch.tensor([0, 3], dtype=torch.int32))
    values, founds = table.find(torch.tensor([7, 7, 7]),
                                tags=torch.tensor([3, 0, 1], dtype=torch.int32))
    assert founds.tolist() == [True, True, False]
    assert values[:, 0].tolist() == [2.0, 1.0, 0.0]
    assert [batch[0].tolist() for batch in table.export_batch(64, tag=3)] == [[7]]


def test_growth_doubles_and_loses_nothing():
    table = HashTable(TableOptions(dim=3, max_capacity=8192, init_capacity=256,
                                   bucket_capacity=32, score_strategy="LFU"))
    assert table.capacity() == 256
    keys = torch.randint(INT64_MIN, INT64_MAX, (3000,), generator=torch.Generator().manual_seed(1))
    values = torch.randn(3000, 3)
    capacities = []
    for start in range(0, 3000, 500):
        table.insert_or_assign(keys[start:start + 500], values[start:start + 500])
        capacities.append(table.capacity())
        assert table.load_factor() <= 0.75
    assert capacities == sorted(capacities) and capacities[-1] >= 4096
    assert all(c in (256, 512, 1024, 2048, 4096, 8192) for c in capacities)
    assert table.stats()["growths"] >= 3
    assert table.stats()["evictions"] == 0 and table.stats()["refused"] == 0
    found_values, founds = table.find(keys)
    assert bool(founds.all())
    assert torch.equal(found_values, values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_growth_keeps_scores_and_optimizer_state(dtype):
    opts = TableOptions(dim=2, max_capacity=1024, init_capacity=64, bucket_capacity=16,
                        score_strategy="CUSTOMIZED", optimizer=SparseAdagrad(lr=0.1),
                        dtype=dtype)
    table = HashTable(opts)
    keys = torch.arange(40)
    rows = torch.randn(40, opts.row_dim).to(dtype)
    table.load_state(keys, None, rows, torch.arange(40) * 3)
    table.insert_or_assign(torch.arange(100, 700), torch.zeros(600, 2),
                           scores=torch.zeros(600, dtype=torch.int64))
    assert table.capacity() == 1024
    state = {k: (r, s) for batch in table.export_state(128)
             for k, r, s in zip(batch[0].tolist(), batch[2], batch[3].tolist())}
    for i in range(40):
        assert torch.equal(state[i][0], rows[i]) and state[i][1] == 3 * i


def test_no_eviction_refuses_exactly_past_capacity(caplog):
    table = HashTable(TableOptions(dim=2, max_capacity=64, bucket_capacity=64,
                                   score_strategy="NO_EVICTION", check_mode="WARNING"))
    keys = torch.arange(100, dtype=torch.int64) * 7919
    with caplog.at_level(logging.WARNING):
        values, founds = table.find_or_insert(keys)
    assert "36 inserts refused" in caplog.text
    assert "find_or_insert read as the eval initializer (CONSTANT 0);" in caplog.text
    assert table.size() == 64 and table.stats()["refused"] == 36
    assert table.stats()["evictions"] == 0
    stored = table.contains(keys)
    assert int(stored.sum()) == 64
    assert bool((values[~stored] == 0).all())  # refused keys read as the initializer (0)
    table.advance_step()
    table.find_or_insert(keys[~stored])
    assert table.stats()["refused"] == 72 and table.size() == 64


def test_a_rank_shards_refusal_names_the_whole_tables_max_capacity(caplog):
    from hashrec.distributed.storage_estimate import per_rank_options

    # The config's max_capacity 128 over 2 ranks: each rank's shard holds 64
    whole = TableOptions(dim=2, max_capacity=128, bucket_capacity=64,
                         score_strategy="NO_EVICTION", name="campaign_id")
    table = HashTable(per_rank_options(whole, 2))
    with caplog.at_level(logging.WARNING):
        table.find_or_insert(torch.arange(100, dtype=torch.int64) * 7919)
    assert ("their buckets are full at max_capacity=64 (this rank's shard of the table's "
            "max_capacity 128 over all ranks)") in caplog.text
    assert per_rank_options(whole, 1).whole_max_capacity is None  # a whole table
    with pytest.raises(ValueError, match="whole_max_capacity=32 is not valid"):
        TableOptions(dim=2, max_capacity=64, whole_max_capacity=32)


def test_a_refusal_names_the_admission_initializer_its_keys_read():
    admission = AdmissionOptions(threshold=1, initializer=InitializerArgs(mode="CONSTANT",
                                                                         value=0.5))
    table = HashTable(TableOptions(dim=2, max_capacity=64, bucket_capacity=64,
                                   score_strategy="NO_EVICTION", check_mode="ERROR",
                                   admission=admission))
    with pytest.raises(TableFullError, match=r"in find_or_insert, the refused keys read as "
                                             r"the admission initializer \(CONSTANT 0.5\)"):
        table.find_or_insert(torch.arange(100, dtype=torch.int64) * 7919)


def test_refusal_warnings_are_rate_limited_and_keep_the_count(caplog, monkeypatch):
    import hashrec.table.hash_table as module
    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    table = HashTable(TableOptions(dim=2, max_capacity=64, bucket_capacity=64,
                                   score_strategy="NO_EVICTION", check_mode="WARNING"))
    keys = torch.arange(100, dtype=torch.int64) * 7919
    with caplog.at_level(logging.WARNING):
        table.find_or_insert(keys)  # 36 refused: warned
        clock[0] += 10.0
        table.find_or_insert(keys + 1)  # 100 refused, within the minute: not yet
        assert caplog.text.count("inserts refused") == 1
        clock[0] += 60.0
        table.find_or_insert(keys[:1] + 2)  # 1 more: the warning carries all 101
    assert caplog.text.count("inserts refused") == 2 and "101 inserts refused" in caplog.text
    assert table.stats()["refused"] == 137


def test_check_mode_error_raises_table_full():
    table = HashTable(TableOptions(dim=2, max_capacity=4, bucket_capacity=4,
                                   score_strategy="NO_EVICTION", check_mode="ERROR"))
    with pytest.raises(TableFullError, match="1 inserts refused"):
        table.find_or_insert(torch.arange(5))
    assert issubclass(TableFullError, TableError)


@pytest.mark.parametrize("strategy", ["LFU", "STEP", "CUSTOMIZED"])
def test_eviction_conserves_and_keeps_top_scores(strategy):
    """Hot keys are accessed every round (LFU, STEP) or scored high (CUSTOMIZED)."""
    table = HashTable(TableOptions(dim=2, max_capacity=512, bucket_capacity=16,
                                   score_strategy=strategy, check_mode="IGNORE"))
    gen = torch.Generator().manual_seed(7)
    hot = torch.randint(0, 2**40, (200,), generator=gen)
    inserted = set()
    for round_ in range(20):
        table.advance_step()
        cold = torch.randint(2**41, 2**50, (300,), generator=gen)
        batch = torch.cat([hot, cold])
        scores = None
        if strategy == "CUSTOMIZED":
            scores = torch.cat([torch.full((200,), 1000 + round_), torch.full((300,), round_)])
        before = set(batch[~table.contains(batch)].tolist())
        table.find_or_insert(batch, scores=scores)
        inserted |= before & set(batch[table.contains(batch)].tolist())
    stats = table.stats()
    assert stats["inserts"] - stats["evictions"] == table.size()
    kept = {k for batch in table.export_batch(512) for k in batch[0].tolist()}
    assert kept <= inserted
    survived = float(table.contains(hot).float().mean())
    assert survived > 0.95
    assert table.size() <= 512


def test_same_call_hits_are_not_evicted():
    table = HashTable(TableOptions(dim=1, max_capacity=4, bucket_capacity=4,
                                   score_strategy="STEP"))
    table.find_or_insert(torch.arange(4))
    table.advance_step()
    table.find_or_insert(torch.tensor([0, 1, 2, 3, 10, 11]))
    assert table.contains(torch.arange(4)).all()
    assert table.stats()["refused"] == 2


def test_lfu_counts_duplicates():
    table = HashTable(TableOptions(dim=1, max_capacity=64, score_strategy="LFU"))
    table.find_or_insert(torch.tensor([5, 5, 5, 9]))
    table.find_or_insert(torch.tensor([5, 9]))
    scores = dict(zip(*(t.tolist() for t in next(table.export_batch(64))[::2])))
    assert scores == {5: 4, 9: 2}


def test_eval_lookup_is_read_only():
    table = HashTable(TableOptions(dim=2, max_capacity=64,
                                   eval_initializer=InitializerArgs(mode="CONSTANT", value=0.5)))
    result = table.lookup(torch.tensor([1, 2]), train=False)
    assert result.slots.tolist() == [-1, -1]
    assert bool((result.values == 0.5).all()) and table.size() == 0


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_find_reads_a_repeated_missing_key_as_one_random_value(tagged):
    table = HashTable(TableOptions(dim=3, max_capacity=64, seed=1, eval_initializer=(
        InitializerArgs(mode="NORMAL", std_dev=1.0))))
    table.insert_or_assign(torch.tensor([7]), torch.ones(1, 3),
                           tags=torch.tensor([0], dtype=torch.int32) if tagged else None)
    keys = torch.tensor([1, 1, 2, 7, 1, 7])
    tags = torch.zeros(6, dtype=torch.int32) if tagged else None
    values, founds = table.find(keys, tags=tags)
    assert founds.tolist() == [False, False, False, True, False, True]
    assert torch.equal(values[0], values[1]) and torch.equal(values[0], values[4])
    assert not torch.equal(values[0], values[2]) and bool((values[3] == 1).all())
    assert (table.stats()["lookups"], table.stats()["hits"]) == (6, 2)


def test_admission_through_lookup():
    opts = TableOptions(dim=2, max_capacity=64, admission=AdmissionOptions(
        threshold=3, initializer=InitializerArgs(mode="CONSTANT", value=-1.0)))
    table = HashTable(opts)
    first = table.lookup(torch.tensor([4, 8]), counts=torch.tensor([2, 1]))
    assert first.slots.tolist() == [-1, -1] and bool((first.values == -1).all())
    second = table.lookup(torch.tensor([4, 8]))
    assert second.slots[0] >= 0 and second.slots[1] == -1
    assert table.stats()["admission_rejected"] == 3
    keys, _, counts = table.admission_state()
    assert keys.tolist() == [8] and counts.tolist() == [2]


def test_apply_gradients_updates_rows():
    table = HashTable(TableOptions(dim=2, max_capacity=64, optimizer=SparseAdagrad(lr=0.5),
                                   initializer=InitializerArgs(mode="CONSTANT", value=1.0)))
    result = table.lookup(torch.tensor([3]))
    table.apply_gradients(result.slots, torch.tensor([[1.0, -2.0]]))
    values, _ = table.find(torch.tensor([3]))
    assert torch.allclose(values, torch.tensor([[0.5, 1.5]]))
    with pytest.raises(TableError, match="no optimizer"):
        HashTable(TableOptions(dim=2, max_capacity=8)).apply_gradients(
            result.slots, torch.zeros(1, 2))


def test_admission_state_roundtrip_and_memory():
    opts = TableOptions(dim=2, max_capacity=64, admission=AdmissionOptions(threshold=5))
    table = HashTable(opts)
    table.lookup(torch.tensor([1, 2, 3]), counts=torch.tensor([1, 2, 3]))
    other = HashTable(opts)
    other.load_admission_state(*table.admission_state())
    assert other.lookup(torch.tensor([3]), counts=torch.tensor([2])).slots[0] >= 0
    assert other.memory_bytes()["host"] > 0 and other.memory_bytes()["gpu"] == 0


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda t: t.find(torch.tensor([1, 2], dtype=torch.int32)), "keys"),
        (lambda t: t.find(torch.tensor([[1, 2]])), "keys"),
        (lambda t: t.find([1, 2]), "keys"),
        (lambda t: t.insert_or_assign(torch.tensor([1]), torch.zeros(1, 5)), "values"),
        (lambda t: t.insert_or_assign(torch.tensor([1]), torch.zeros(2, 4)), "values"),
        (lambda t: t.insert_or_assign(torch.tensor([1]), torch.zeros(4)), "values"),
        (lambda t: t.find(torch.tensor([1]), tags=torch.tensor([1])), "tags"),
        (lambda t: t.find_or_insert(torch.tensor([1]), scores=torch.tensor([1])), "scores"),
        (lambda t: t.lookup(torch.tensor([1]), counts=torch.tensor([1, 1])), "counts"),
        (lambda t: t.load_state(torch.tensor([1]), None, torch.zeros(1, 4),
                                torch.tensor([0])), "rows"),
        (lambda t: list(t.export_batch(0)), "batch_size"),
    ],
    ids=["int32-keys", "2d-keys", "list-keys", "dim-mismatch", "rows-mismatch", "1d-values",
         "tag-dtype", "scores-not-customized", "counts-length", "row-dim", "batch-size"],
)
def test_bad_input_names_the_field(call, field):
    table = HashTable(TableOptions(dim=4, max_capacity=64, optimizer=SparseAdagrad(),
                                   name="user_id"))
    with pytest.raises(ValueError, match=field) as info:
        call(table)
    if field != "batch_size":
        assert "user_id" in str(info.value)


def test_customized_requires_scores():
    table = HashTable(TableOptions(dim=1, max_capacity=8, score_strategy="CUSTOMIZED"))
    with pytest.raises(ValueError, match="scores=None"):
        table.find_or_insert(torch.tensor([1]))


def test_timestamp_scores_follow_the_wall_clock():
    table = HashTable(TableOptions(dim=1, max_capacity=64, score_strategy="TIMESTAMP"))
    table.find_or_insert(torch.tensor([1, 2]))
    first = dict(zip(*(t.tolist() for t in next(table.export_batch(64))[::2])))
    table.find_or_insert(torch.tensor([2]))
    second = dict(zip(*(t.tolist() for t in next(table.export_batch(64))[::2])))
    assert second[1] == first[1] and second[2] >= first[2] > 1_600_000_000_000_000


def test_step_scores_follow_the_step_clock():
    table = HashTable(TableOptions(dim=1, max_capacity=64, score_strategy="STEP"))
    table.advance_step()
    table.find_or_insert(torch.tensor([1, 2]))
    table.advance_step()
    table.lookup(torch.tensor([2]))
    table.find(torch.tensor([1]))  # find is read-only: no score change
    scores = dict(zip(*(t.tolist() for t in next(table.export_batch(64))[::2])))
    assert scores == {1: 1, 2: 2}


def _state_of(table):
    out = {}
    for keys, tags, rows, scores in table.export_state(256):
        for k, t, r, s in zip(keys.tolist(), tags.tolist(), rows, scores.tolist()):
            out[(k, t)] = (r.tolist(), s)
    return out


@pytest.mark.parametrize("assume_unique", [False, True], ids=["dedup", "assume_unique"])
def test_load_state_of_unique_keys_same_with_or_without_dedup(assume_unique):
    opts = TableOptions(dim=3, max_capacity=256, init_capacity=32, bucket_capacity=16,
                        score_strategy="CUSTOMIZED", optimizer=SparseAdagrad(lr=0.1))
    gen = torch.Generator().manual_seed(5)
    keys = torch.randperm(1000, generator=gen)[:200] - 500
    tags = torch.randint(0, 2, (200,), generator=gen, dtype=torch.int32)
    rows = torch.randn(200, opts.row_dim, generator=gen)
    scores = torch.randint(0, 50, (200,), generator=gen)
    table = HashTable(opts)
    table.insert_or_assign(keys[:20], torch.zeros(20, 3), scores=torch.zeros(20).long(),
                           tags=tags[:20])  # some hits: assigned in place
    table.load_state(keys, tags, rows, scores, assume_unique=assume_unique)
    want = {(k, t): (r.tolist(), s) for k, t, r, s in
            zip(keys.tolist(), tags.tolist(), rows, scores.tolist())}
    assert _state_of(table) == want


def test_load_state_last_duplicate_wins_across_tags():
    opts = TableOptions(dim=2, max_capacity=64, bucket_capacity=16, score_strategy="CUSTOMIZED")
    table = HashTable(opts)
    keys = torch.tensor([4, 4, 4, 9])
    tags = torch.tensor([1, 2, 1, 1], dtype=torch.int32)
    rows = torch.arange(8, dtype=torch.float32).view(4, 2)
    table.load_state(keys, tags, rows, torch.tensor([10, 20, 30, 40]))
    assert _state_of(table) == {(4, 1): ([4.0, 5.0], 30), (4, 2): ([2.0, 3.0], 20),
                                (9, 1): ([6.0, 7.0], 40)}


@pytest.mark.parametrize("max_capacity, init, start", [
    (10_000_000, 1_000_000, 1_000_064), (8192, 256, 256), (1536, 200, 256), (1280, 128, 128),
    (128_000, 100_000, 128_000), (1270 * 128, 100 * 128, 100 * 128)],
    ids=["decimal-10m", "pow2", "three-times-pow2", "five-times-pow2", "near-max", "prime"])
def test_init_capacity_starts_at_init_and_doubles_to_max(max_capacity, init, start):
    from hashrec.table.capacity import initial_buckets, next_buckets

    opts = TableOptions(dim=1, max_capacity=max_capacity, init_capacity=init)
    initial, max_buckets = initial_buckets(opts)
    assert initial * 128 == start
    counts = [initial]
    while counts[-1] < max_buckets:
        counts.append(next_buckets(counts[-1], max_buckets))
    assert counts[-1] == max_buckets
    steps = [b / a for a, b in zip(counts, counts[1:])]
    assert all(step == 2 for step in steps[:-1])  # doublings, then one last growth
    assert not steps or 1.5 <= steps[-1] <= 3


def test_growth_of_a_decimal_max_capacity_keeps_every_entry():
    table = HashTable(TableOptions(dim=2, max_capacity=2000, init_capacity=200,
                                   bucket_capacity=20, check_mode="ERROR"))
    keys = torch.randint(INT64_MIN, INT64_MAX, (720,), generator=torch.Generator().manual_seed(3))
    values = torch.randn(720, 2)
    capacities = [table.capacity()]
    for start in range(0, 720, 60):
        table.insert_or_assign(keys[start:start + 60], values[start:start + 60])
        capacities.append(table.capacity())
    assert sorted(set(capacities)) == [200, 400, 800, 2000]  # 10 buckets, x2, x2, then 2.5x
    assert table.stats()["evictions"] == 0
    found_values, founds = table.find(keys)
    assert bool(founds.all()) and torch.equal(found_values, values)


def test_values_that_require_grad_are_copied_in_detached():
    table = HashTable(TableOptions(dim=2, max_capacity=64, optimizer=SparseAdagrad()))
    param = torch.nn.Parameter(torch.ones(2, 2))
    table.insert_or_assign(torch.tensor([1, 2]), param)
    table.load_state(torch.tensor([3]), None, torch.ones(1, 4, requires_grad=True),
                     torch.tensor([0]))
    slots = table.lookup(torch.tensor([1])).slots
    table.apply_gradients(slots, torch.ones(1, 2, requires_grad=True))
    assert not table.storage.values.requires_grad
    values, _ = table.find(torch.tensor([1, 2, 3]))
    assert values.grad_fn is None and not values.requires_grad


def test_stats_count_every_key_of_find_and_find_or_insert():
    table = HashTable(TableOptions(dim=2, max_capacity=64))
    table.find_or_insert(torch.tensor([1, 1, 2]))
    assert (table.stats()["lookups"], table.stats()["hits"]) == (3, 0)
    table.find_or_insert(torch.tensor([1, 1, 3]))
    assert (table.stats()["lookups"], table.stats()["hits"]) == (6, 2)
    table.find(torch.tensor([1, 1, 4]))
    assert (table.stats()["lookups"], table.stats()["hits"]) == (9, 4)


@pytest.mark.parametrize("strategy", ["STEP", "LFU"])
def test_inserts_less_evictions_and_erased_keys_are_the_size(strategy):
    table = HashTable(TableOptions(dim=2, max_capacity=128, bucket_capacity=16,
                                   init_capacity=32, score_strategy=strategy))
    gen = torch.Generator().manual_seed(3)
    for i in range(24):
        keys = torch.randint(0, 400, (60,), generator=gen)
        if i % 3 == 0:
            table.find_or_insert(keys)
        elif i % 3 == 1:
            unique = torch.unique(keys)
            table.insert_or_assign(unique, torch.ones(unique.numel(), 2))
        else:
            before = table.size()
            table.erase(torch.cat([keys[:20], keys[:5]]))  # repeats erase one key once
            assert table.stats()["erased"] >= before - table.size() > 0
        stats = table.stats()
        assert stats["inserts"] - stats["evictions"] - stats["erased"] == stats["size"]
    assert table.stats()["evictions"] > 0


def test_load_state_of_another_row_width_explains_row_dim():
    table = HashTable(TableOptions(dim=4, max_capacity=64, optimizer=SparseAdagrad(),
                                   name="user_id"))
    with pytest.raises(ValueError) as info:
        table.load_state(torch.tensor([1]), None, torch.zeros(1, 5), torch.tensor([0]))
    message = str(info.value)
    assert "row_dim=8" in message and "dim 4 + 4 optimizer state columns" in message
    assert "SparseAdagrad" in message and "export_state" in message


def test_export_batch_refuses_to_go_on_after_a_growth():
    table = HashTable(TableOptions(dim=2, max_capacity=4096, init_capacity=64,
                                   bucket_capacity=16))
    table.insert_or_assign(torch.arange(40), torch.zeros(40, 2))
    batches = table.export_batch(8)
    next(batches)
    table.insert_or_assign(torch.arange(100, 400), torch.zeros(300, 2))  # grows
    with pytest.raises(TableError, match="grew while being exported"):
        list(batches)
    assert sum(k.numel() for k, _, _ in table.export_batch(8)) == 340


@pytest.mark.parametrize("device", ["cpu:0", torch.device("cpu", 0)])
def test_indexed_cpu_device_takes_cpu_tensors(device):
    table = HashTable(TableOptions(dim=2, max_capacity=64, device=device))
    values, found = table.find_or_insert(torch.tensor([1, 2]))
    assert values.device == torch.device("cpu") and found.tolist() == [False, False]
    assert table.contains(torch.tensor([1, 3])).tolist() == [True, False]


def test_device_this_torch_cannot_use_raises_table_error():
    with pytest.raises(TableError, match="'t': device='meta' is not usable"):
        HashTable(TableOptions(dim=2, max_capacity=64, device="meta", name="t"))
    if not torch.cuda.is_available():
        with pytest.raises(TableError, match="device='cuda' is not usable.*available: cpu"):
            HashTable(TableOptions(dim=2, max_capacity=64, device="cuda", name="t"))


def test_uniform_bound_crossing_the_default_names_where_it_came_from():
    opts = TableOptions(dim=2, max_capacity=256, initializer=InitializerArgs(lower=0.5))
    with pytest.raises(ValueError, match=r"upper=0.0625 is the default \+sqrt\(1 / "
                                         r"max_capacity\) for max_capacity=256"):
        HashTable(opts)


@pytest.mark.parametrize("strategy, operation, reason, effect", [
    ("NO_EVICTION", "find_or_insert", "NO_EVICTION never evicts", "are not stored"),
    ("NO_EVICTION", "load_state", "NO_EVICTION never evicts", "rows were not loaded"),
    ("CUSTOMIZED", "insert_or_assign", "scores higher than the incoming key",
     "values were not stored"),
], ids=["no-eviction-find-or-insert", "no-eviction-load-state", "customized-assign"])
def test_refusal_errors_name_the_reason_and_what_the_operation_lost(strategy, operation,
                                                                     reason, effect):
    table = HashTable(TableOptions(dim=2, max_capacity=4, bucket_capacity=4,
                                   score_strategy=strategy, check_mode="ERROR"))
    scores = torch.arange(5, 0, -1) if strategy == "CUSTOMIZED" else None
    keys = torch.arange(5)
    with pytest.raises(TableFullError) as info:
        if operation == "find_or_insert":
            table.find_or_insert(keys, scores=scores)
        elif operation == "load_state":
            table.load_state(keys, None, torch.zeros(5, 2), torch.arange(5, 0, -1))
        else:
            table.insert_or_assign(keys, torch.zeros(5, 2), scores=scores)
    message = str(info.value)
    assert reason in message and f"in {operation}" in message and effect in message
    assert "initializer" not in message or operation == "find_or_insert"
