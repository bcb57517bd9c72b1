"""The fixed-size training lookup (Triton backend) against the reference path.

Without CUDA the Triton kernels run under ``TRITON_INTERPRET=1`` on CPU tensors,
selected by ``HASHREC_FORCE_TRITON=1``; the same table options then run through
the reference ops, and both must give the same slots, values, stats, stored
entries and admission counters, step after step (admission, growth, eviction,
refusal, every score strategy but the wall clock). What the fixed path reads
back on the host is in ``test_fixed_lookup_host_reads.py``; how it reports
refused inserts in ``test_fixed_lookup_refusals.py``.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from fixed_lookup_helpers import (  # noqa: E402
    SyncCounter,
    backend,
    run_batches,
    step_batches,
    table_options,
    write_call,
)

from hashrec.table import HashTable, SparseAdagrad, SparseAdam, TableOptions  # noqa: E402
from hashrec.table.options import AdmissionOptions, InitializerArgs  # noqa: E402

# Every combination of any three of strategy, admission, full and tagging, not all four:
# each strategy growing and evicting, each of those with and without admission, its
# taggings paired with admission one way when growing and the other when evicting (and
# the other way round for the next strategy).
MATCH_CASES = [pytest.param(strategy, admission, full, tagged, id="-".join([
    strategy, "admission" if admission else "no_admission", "evicting" if full else "growing",
    "tagged" if tagged else "untagged"]))
    for i, strategy in enumerate(["STEP", "LFU", "CUSTOMIZED", "NO_EVICTION"])
    for full in (False, True) for admission in (False, True)
    for tagged in [admission == ((i + full) % 2 == 0)]]


@pytest.mark.parametrize("strategy,admission,full,tagged", MATCH_CASES)
def test_fixed_lookup_matches_reference(strategy, admission, full, tagged):
    options = table_options(strategy, admission, full)
    want, got = run_batches(options, False, tagged), run_batches(options, True, tagged)
    for step, ((w_slots, w_values), (g_slots, g_values)) in enumerate(zip(want[:-1], got[:-1])):
        assert torch.equal(g_slots, w_slots), f"step {step}"
        torch.testing.assert_close(g_values, w_values, msg=f"step {step}")
    (w_stats, w_state, w_counters), (g_stats, g_state, g_counters) = want[-1], got[-1]
    assert g_stats == w_stats
    assert g_state == w_state
    assert g_counters == w_counters
    if full and strategy != "NO_EVICTION":
        assert w_stats["evictions"] > 0
    if full and strategy == "NO_EVICTION":
        assert w_stats["refused"] > 0
    if not full:
        assert w_stats["growths"] > 0


# (call, score strategy, full): each call grows once and evicts (or refuses) under the
# others.
WRITE_CASES = [("find_or_insert", "STEP", False), ("find_or_insert", "LFU", True),
               ("find_or_insert", "CUSTOMIZED", True), ("find_or_insert", "NO_EVICTION", True),
               ("insert_or_assign", "STEP", True), ("insert_or_assign", "LFU", False),
               ("insert_or_assign", "CUSTOMIZED", True),
               ("insert_or_assign", "NO_EVICTION", True), ("load_state", "LFU", True),
               ("load_state", "CUSTOMIZED", False), ("load_state", "NO_EVICTION", True)]


@pytest.mark.parametrize("call,strategy,full", WRITE_CASES)
def test_write_calls_on_the_fixed_path_match_reference(call, strategy, full):
    """``HashTable.find_or_insert`` (admission), ``insert_or_assign`` and ``load_state``
    (an optimizer's state columns) of repeated keys take the fixed-size path on the
    Triton backend: the same founds, values, stats, entries and counters."""
    options = dataclasses.replace(table_options(strategy, True, full), optimizer=SparseAdam(lr=0.1))
    want = run_batches(options, False, True, True, call=call)
    got = run_batches(options, True, True, True, call=call)
    for step, ((w_found, w_values), (g_found, g_values)) in enumerate(zip(want[:-1], got[:-1])):
        assert torch.equal(g_found, w_found), f"step {step}"
        torch.testing.assert_close(g_values, w_values, msg=f"step {step}")
    assert got[-1] == want[-1]
    stats = want[-1][0]
    assert stats["hits"] > 0 and stats["inserts"] > 0
    assert stats["admission_rejected"] > 0 if call == "find_or_insert" else True
    if full:
        assert stats["evictions" if strategy != "NO_EVICTION" else "refused"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("full", [False, True], ids=["growing", "evicting"])
@pytest.mark.parametrize("call", ["find_or_insert", "insert_or_assign", "load_state"])
def test_write_calls_on_cuda_match_the_cpu_reference(call, full):
    """The same through a CUDA table (compiled kernels) against a CPU one."""
    runs = []
    options = dataclasses.replace(table_options("LFU", True, full), optimizer=SparseAdam(lr=0.1))
    for device in ("cpu", "cuda"):
        table = HashTable(dataclasses.replace(options, device=device))
        assert table._fixed_path() is (device == "cuda")
        run = []
        for keys, tags, counts, scores in step_batches(True):
            table.advance_step()
            found, values = write_call(table, call, keys, tags, counts, None, scores)
            run.append((found.cpu(), values.cpu()))
        state = {(k, t): (r.tolist(), s) for keys, tags, rows, scores in table.export_state(512)
                 for k, t, r, s in zip(keys.tolist(), tags.tolist(), rows.cpu(),
                                       scores.tolist())}
        runs.append((run, table.stats(), state))
    (want, w_stats, w_state), (got, g_stats, g_state) = runs
    for (w_found, w_values), (g_found, g_values) in zip(want, got):
        assert torch.equal(g_found, w_found)
        torch.testing.assert_close(g_values, w_values)
    assert g_stats == w_stats and g_state == w_state


@pytest.mark.parametrize("optimizer", [SparseAdagrad(lr=0.1, initial_accumulator_value=0.25),
                                       SparseAdam(lr=0.1)], ids=["adagrad", "adam"])
def test_computed_and_hashed_initializers_and_optimizer_state_match_reference(optimizer):
    """TRUNCATED_NORMAL cut at bounds of its own (values computed outside the kernel) for
    new rows, a hashed UNIFORM admission initializer for keys not admitted, optimizer
    state columns (one state vector, or Adam's two, which the kernel writes in two tiles)."""
    options = dataclasses.replace(
        table_options("LFU", True, True),
        initializer=InitializerArgs(mode="TRUNCATED_NORMAL", std_dev=0.3, lower=-0.1,
                                    key_seed=5),
        optimizer=optimizer,
        admission=AdmissionOptions(threshold=2, counter_capacity=48, counter_bucket_capacity=8,
                                   initializer=InitializerArgs(mode="UNIFORM", lower=-1.0,
                                                               upper=1.0, key_seed=9)))
    want, got = run_batches(options, False, True, True), run_batches(options, True, True, True)
    for step, ((w_slots, w_values), (g_slots, g_values)) in enumerate(zip(want[:-1], got[:-1])):
        assert torch.equal(g_slots, w_slots), f"step {step}"
        assert torch.equal(g_values, w_values), f"step {step}"
        assert (w_slots < 0).any() and (w_values[w_slots < 0] != 0).all()
    assert got[-1] == want[-1]
    assert got[-1][0]["evictions"] > 0  # slots of marked rows were taken again


@pytest.mark.parametrize("masks", [1, 0], ids=["segments", "tile"])
def test_wide_counter_buckets_match_reference(monkeypatch, masks):
    """512-slot counter buckets: the probes read them as 128-slot segments from masks, or
    (MASK_PROBE off) as a tile of the whole line at fewer keys a program (probe_block)."""
    from hashrec.table.ops.find import triton as find_tt
    monkeypatch.setattr(find_tt, "MASK_PROBE", masks)
    options = dataclasses.replace(
        table_options("LFU", True, True),
        admission=AdmissionOptions(threshold=2, counter_capacity=1024,
                                   counter_bucket_capacity=512))
    want, got = run_batches(options, False, True), run_batches(options, True, True)
    for (w_slots, w_values), (g_slots, g_values) in zip(want[:-1], got[:-1]):
        assert torch.equal(g_slots, w_slots)
        torch.testing.assert_close(g_values, w_values)
    assert got[-1] == want[-1]


@pytest.mark.parametrize("mode", ["NORMAL", "UNIFORM"])
def test_random_initializers_draw_in_the_kernel(mode):
    """Seeded, reproducible, stored as read, with the configured distribution."""
    init = InitializerArgs(mode=mode, mean=0.5, std_dev=0.2, lower=-0.3, upper=0.1)
    options = TableOptions(dim=16, max_capacity=8192, init_capacity=8192, bucket_capacity=32,
                           score_strategy="LFU", seed=3, initializer=init,
                           optimizer=SparseAdagrad(lr=0.1, initial_accumulator_value=0.25))
    keys = torch.arange(1000)  # 16,000 draws: the means within 0.002 (one sigma)
    drawn = []
    for _ in range(2):
        with backend(True):
            table = HashTable(options)
            table.advance_step()
            first = table.lookup(keys, train=True).values
            table.advance_step()
            again = table.lookup(keys, train=True).values
            stored = {k: r for ks, _, rows, _ in table.export_state(4096)
                      for k, r in zip(ks.tolist(), rows)}
        assert torch.equal(again, first)
        assert torch.equal(torch.stack([stored[k] for k in keys.tolist()])[:, :16], first)
        drawn.append(first)
    assert torch.equal(drawn[0], drawn[1])
    values = drawn[0]
    assert values.unique().numel() > 0.99 * values.numel()
    if mode == "NORMAL":
        assert abs(values.mean().item() - 0.5) < 0.01 and abs(values.std().item() - 0.2) < 0.01
    else:
        assert values.min() >= -0.3 and values.max() <= 0.1
        assert abs(values.mean().item() + 0.1) < 0.01


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_empty_lookup_matches_reference(train):
    options = table_options("LFU", True, False)
    out = []
    for triton in (False, True):
        with backend(triton):
            table = HashTable(options)
            table.advance_step()
            result = table.lookup(torch.empty(0, dtype=torch.int64), train=train)
            out.append((result.slots.shape, result.values.shape, table.stats()))
    assert out[0] == out[1] == ((0,), (0, 3), out[0][2])
    assert out[0][2]["lookups"] == 0


def _with_repeats(keys, tags, counts, gen):
    """The batch's keys plus repeats of some of them: (keys, tags, counts, active) where
    only the first occurrence of a key is active (and the inactive ones count 0)."""
    extra = torch.randint(0, keys.numel(), (keys.numel() // 2,), generator=gen)
    order = torch.randperm(keys.numel() + extra.numel(), generator=gen)
    source = torch.cat([torch.arange(keys.numel()), extra])[order]
    first = torch.zeros(keys.numel(), dtype=torch.bool)
    active = torch.zeros(source.numel(), dtype=torch.bool)
    for i, s in enumerate(source.tolist()):
        if not first[s]:
            first[s], active[i] = True, True
    return keys[source], None if tags is None else tags[source], \
        torch.where(active, counts[source], 0), active, source


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "fixed"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_active_mask_equals_looking_up_the_active_keys(triton, train):
    """Keys with repeats masked inactive read as the lookup of the active ones alone:
    slot -1 and zero rows where inactive; the same table contents and counters. Keys not
    admitted (train) and missing keys (eval) read a nonzero constant, so an inactive key
    reading as a missing one would show."""
    options = dataclasses.replace(table_options("LFU", True, True), init_capacity=64)  # no growth
    constant = InitializerArgs(mode="CONSTANT", value=0.5)
    options = dataclasses.replace(
        options, eval_initializer=constant,
        admission=dataclasses.replace(options.admission, initializer=constant))
    gen = torch.Generator().manual_seed(11)
    with backend(triton):
        masked, plain = HashTable(options), HashTable(options)
        for keys, tags, counts, _ in step_batches(True, steps=5):
            for table in (masked, plain):
                table.advance_step()
            want = plain.lookup(keys, tags, train=train, counts=counts)
            many, many_tags, many_counts, active, source = _with_repeats(keys, tags, counts, gen)
            with SyncCounter() as syncs:
                got = masked.lookup(many, many_tags, train=train,
                                    counts=many_counts, active=active)
            if triton:  # nothing read back: no compaction by the mask
                assert not syncs.counts, syncs.counts
            assert torch.equal(got.slots[~active], torch.full_like(got.slots[~active], -1))
            assert not got.values[~active].any()
            position = torch.empty(keys.numel(), dtype=torch.int64).scatter_(
                0, source[active], active.nonzero()[:, 0])
            assert torch.equal(got.slots[position], want.slots)
            torch.testing.assert_close(got.values[position], want.values)
        assert masked.stats() == plain.stats()
        export = [{(k, t): r.tolist() for ks, ts, rows, _ in table.export_state(512)
                   for k, t, r in zip(ks.tolist(), ts.tolist(), rows)} for table in (masked, plain)]
        assert export[0] == export[1]


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "fixed"])
def test_stats_count_every_key_of_find_or_insert(triton):
    with backend(triton):
        table = HashTable(table_options("STEP", False, False))
        table.find_or_insert(torch.tensor([1, 1, 2]))
        table.find_or_insert(torch.tensor([1, 3, 1, 1]))
        stats = table.stats()
    assert (stats["lookups"], stats["hits"]) == (7, 3)


def _bucket_mates(count: int, num_buckets: tuple[int, ...]) -> torch.Tensor:
    """``count`` keys that share one bucket at every one of ``num_buckets``."""
    from hashrec.table.hashing import bucket_of, mix64

    keys = torch.arange(10_000)
    same = torch.ones_like(keys, dtype=torch.bool)
    for n in num_buckets:
        buckets = bucket_of(mix64(keys), n)
        same &= buckets == buckets[0]
    return keys[same][:count]


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "fixed"])
@pytest.mark.parametrize("call", ["lookup", "find_or_insert", "insert_or_assign"])
def test_keys_placed_before_a_growth_are_not_evicted_by_the_same_call(triton, call):
    """Two keys fill their bucket, the third overflows it, the table grows to its
    max_capacity and the third still finds the bucket full: it is refused, rather
    than evicting a key the call placed (which kept its slot: two keys on one row)."""
    keys = _bucket_mates(3, (2, 4))
    options = TableOptions(dim=2, max_capacity=8, init_capacity=4, bucket_capacity=2,
                           initializer=InitializerArgs(mode="CONSTANT", value=1.0))
    with backend(triton):
        table = HashTable(options)
        table.advance_step()
        if call == "lookup":
            slots = table.lookup(keys).slots
        elif call == "find_or_insert":
            table.find_or_insert(keys)
        else:
            table.insert_or_assign(keys, torch.ones(3, 2))
        if call != "lookup":
            slots = table.lookup(keys, train=False).slots
        stats = table.stats()
    assert slots.tolist()[:2] == [0, 1] and slots[2] == -1
    assert (stats["inserts"], stats["refused"], stats["evictions"]) == (2, 1, 0)
    assert table.contains(keys).tolist() == [True, True, False]
    # The protected score is gone: the placed keys hold this step's.
    assert table.storage.scores[slots[:2]].tolist() == [1, 1]


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "fixed"])
def test_lfu_admission_scores_the_count_and_a_refused_key_keeps_counting(triton):
    """An admitted key's LFU score is its count over every lookup (not the admitting
    batch's alone), and a key the full table refuses keeps its count, so a key seen
    often enough gets in: it used to restart from zero and never beat the bucket."""
    options = TableOptions(dim=2, max_capacity=4, bucket_capacity=4, score_strategy="LFU",
                           admission=AdmissionOptions(threshold=3), check_mode="IGNORE")
    with backend(triton):
        table = HashTable(options)
        table.lookup(torch.arange(4), counts=torch.full((4,), 5))  # scores 5: the bucket
        assert table.stats()["inserts"] == 4
        outcomes = []
        for _ in range(6):
            table.advance_step()
            outcomes.append(int(table.lookup(torch.tensor([99])).slots[0]) >= 0)
        stats = table.stats()
        keys, scores = [], []
        for k, _, _, s in table.export_state(16):
            keys += k.tolist()
            scores += s.tolist()
    # Counted 1, 2; 3 and 4 refused (scores below 5); 5 ties the lowest and evicts it.
    assert outcomes == [False, False, False, False, True, True]
    assert (stats["admission_rejected"], stats["refused"], stats["evictions"]) == (2, 2, 1)
    assert dict(zip(keys, scores))[99] == 6  # five counted, one more as a hit


def test_debug_rows_on_the_fixed_path_tell_their_keys():
    """DEBUG rows (each column the key mod 100000, as uint64) are the reference's on the
    Triton path, negative keys and the admission initializer's rows included."""
    debug = InitializerArgs(mode="DEBUG")
    options = dataclasses.replace(
        table_options("STEP", True, False), initializer=debug,
        admission=AdmissionOptions(threshold=2, counter_capacity=48, counter_bucket_capacity=8,
                                   initializer=debug))
    keys = torch.tensor([-1, 7, 100_003, -(2 ** 63), 2 ** 63 - 1])
    rows = []
    for triton in (False, True):
        with backend(triton):
            table = HashTable(options)
            assert table._fixed_path() is triton
            for stored in (False, True):  # counted (admission's rows), then admitted
                table.advance_step()
                result = table.lookup(keys)
                assert bool((result.slots >= 0).all()) is stored
                rows.append(result.values)
    want = torch.tensor([51615.0, 7.0, 3.0, 75808.0, 75807.0])[:, None].expand(5, 3)
    for values in rows:
        torch.testing.assert_close(values, want)


@pytest.mark.parametrize("threshold", [0, 1])
def test_admission_thresholds_zero_and_one_admit_at_first_sight(threshold):
    options = dataclasses.replace(
        table_options("STEP", True, False),
        admission=AdmissionOptions(threshold=threshold, counter_capacity=48,
                                   counter_bucket_capacity=8))
    keys = torch.tensor([-5, 3, 11, 2 ** 40])
    for triton in (False, True):
        with backend(triton):
            table = HashTable(options)
            table.advance_step()
            assert bool((table.lookup(keys).slots >= 0).all()), f"triton={triton}"
            assert table.stats()["admission_rejected"] == 0
