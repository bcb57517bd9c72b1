"""The fixed-size training lookup (Triton backend) against the reference path.

Without CUDA the Triton kernels run under ``TRITON_INTERPRET=1`` on CPU tensors,
selected by ``HASHREC_FORCE_TRITON=1``; the same table options then run through
the reference ops, and both must give the same slots, values, stats, stored
entries and admission counters, step after step (admission, growth, eviction,
refusal, every score strategy but the wall clock). A dispatch mode counts the
operations that read the device on the host.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from functools import partial

import pytest
import torch
from host_reads import HostReads

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table import HashTable, SparseAdagrad, SparseAdam, TableOptions  # noqa: E402
from hashrec.table.ops import dispatch  # noqa: E402
from hashrec.table.options import AdmissionOptions, InitializerArgs  # noqa: E402

SyncCounter = partial(HostReads, tolist=True)


@contextlib.contextmanager
def _backend(triton: bool):
    if triton and torch.cuda.is_available():
        pytest.skip("runs the kernels interpreted on CPU tensors (CPU-only hosts)")
    dispatch._forced.cache_clear()
    os.environ["HASHREC_FORCE_TRITON"] = "1" if triton else "0"
    try:
        yield
    finally:
        os.environ.pop("HASHREC_FORCE_TRITON", None)
        dispatch._forced.cache_clear()


def _options(strategy: str, admission: bool, full: bool, check_mode: str = "IGNORE"):
    return TableOptions(
        dim=3, max_capacity=64 if full else 256, init_capacity=32, bucket_capacity=8,
        score_strategy=strategy, check_mode=check_mode, seed=1,
        initializer=InitializerArgs(mode="UNIFORM", key_seed=3),
        admission=AdmissionOptions(threshold=2, counter_capacity=48,
                                   counter_bucket_capacity=8) if admission else None)


def _batches(tagged: bool, steps: int = 4):
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        keys = torch.randint(0, 160, (60,), generator=gen)
        tags = torch.randint(0, 2, (60,), generator=gen, dtype=torch.int32) if tagged else None
        pairs = torch.unique(keys * 2 + (tags if tagged else 0))
        keys = pairs // 2
        tags = (pairs % 2).to(torch.int32) if tagged else None
        counts = torch.randint(1, 3, keys.shape, generator=gen)
        yield keys, tags, counts, torch.randint(0, 9, keys.shape, generator=gen)


def _run(options: TableOptions, triton: bool, tagged: bool, mark_state: bool = False,
         call: str = "lookup") -> list:
    """Lookups of ``_batches``; ``mark_state`` sets the looked-up rows' optimizer state to
    7 after each but the last, as training would change it (a slot the last insert takes
    must get its initial state back, which the export then shows). Other ``call``s take
    each batch with its keys repeated: ``find_or_insert`` (founds in place of slots),
    ``insert_or_assign`` and ``load_state`` (each repeat its own row; a find after each,
    in place of slots and values); with ``mark_state`` every slot's state is then set."""
    out = []
    with _backend(triton):
        table = HashTable(options)
        assert table._fixed_path() is triton
        batches = list(_batches(tagged))
        for step, (keys, tags, counts, scores) in enumerate(batches):
            table.advance_step()
            custom = scores if options.score_strategy.value == "CUSTOMIZED" else None
            if call != "lookup":
                out.append(_write_call(table, call, keys, tags, counts, custom, scores))
                if mark_state and step < len(batches) - 1:  # every slot, stored or empty
                    table.storage.values[:, options.dim:] = 7.0
                continue
            res = table.lookup(keys, tags, train=True, counts=counts, scores=custom)
            out.append((res.slots, res.values))
            if mark_state and step < len(batches) - 1:
                table.storage.values[res.slots[res.slots >= 0], options.dim:] = 7.0
        state = {(k, t): (r.tolist(), s) for keys, tags, rows, scores in table.export_state(512)
                 for k, t, r, s in zip(keys.tolist(), tags.tolist(), rows, scores.tolist())}
        counters = table.admission_state()
        out.append((table.stats(), state, sorted(zip(*(c.tolist() for c in counters)))))
    return out


def _write_call(table: HashTable, call: str, keys, tags, counts, custom, scores):
    """One write call of a batch (CPU tensors, moved to the table's device) with its keys
    repeated; returns a find of the keys after it (find_or_insert: its own outcome)."""
    many = torch.arange(keys.numel()).repeat_interleave(counts)
    keys, tags = keys[many], None if tags is None else tags[many]
    scores, custom = scores[many], None if custom is None else custom[many]
    rows = torch.arange(keys.numel() * table.row_dim, dtype=torch.float32).view(
        keys.numel(), table.row_dim) / 7 - keys[:, None] % 5
    on = table.device
    keys, tags, rows = keys.to(on), None if tags is None else tags.to(on), rows.to(on)
    if call == "find_or_insert":
        values, found = table.find_or_insert(
            keys, None if custom is None else (custom - many % 2).to(on), tags)
        return found, values
    if call == "insert_or_assign":
        table.insert_or_assign(keys, rows[:, :table.dim],
                               None if custom is None else custom.to(on), tags)
    else:
        table.load_state(keys, tags, rows, (scores + many % 3).to(on))
    values, found = table.find(keys, tags)
    return found, values


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("full", [False, True], ids=["growing", "evicting"])
@pytest.mark.parametrize("admission", [False, True], ids=["no_admission", "admission"])
@pytest.mark.parametrize("strategy", ["STEP", "LFU", "CUSTOMIZED", "NO_EVICTION"])
def test_fixed_lookup_matches_reference(strategy, admission, full, tagged):
    options = _options(strategy, admission, full)
    want, got = _run(options, False, tagged), _run(options, True, tagged)
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
    options = dataclasses.replace(_options(strategy, True, full), optimizer=SparseAdam(lr=0.1))
    want = _run(options, False, True, True, call=call)
    got = _run(options, True, True, True, call=call)
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
    options = dataclasses.replace(_options("LFU", True, full), optimizer=SparseAdam(lr=0.1))
    for device in ("cpu", "cuda"):
        table = HashTable(dataclasses.replace(options, device=device))
        assert table._fixed_path() is (device == "cuda")
        run = []
        for keys, tags, counts, scores in _batches(True):
            table.advance_step()
            found, values = _write_call(table, call, keys, tags, counts, None, scores)
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
    """TRUNCATED_NORMAL (values computed outside the kernel) for new rows, a hashed
    UNIFORM admission initializer for keys not admitted, optimizer state columns (one
    state vector, or Adam's two, which the kernel writes in two tiles)."""
    options = dataclasses.replace(
        _options("LFU", True, True),
        initializer=InitializerArgs(mode="TRUNCATED_NORMAL", std_dev=0.3, key_seed=5),
        optimizer=optimizer,
        admission=AdmissionOptions(threshold=2, counter_capacity=48, counter_bucket_capacity=8,
                                   initializer=InitializerArgs(mode="UNIFORM", lower=-1.0,
                                                               upper=1.0, key_seed=9)))
    want, got = _run(options, False, True, True), _run(options, True, True, True)
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
        _options("LFU", True, True),
        admission=AdmissionOptions(threshold=2, counter_capacity=1024,
                                   counter_bucket_capacity=512))
    want, got = _run(options, False, True), _run(options, True, True)
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
    keys = torch.arange(2000)
    drawn = []
    for _ in range(2):
        with _backend(True):
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


def test_refused_inserts_raise_with_check_mode_error():
    options = _options("NO_EVICTION", False, True, check_mode="ERROR")
    with _backend(True):
        table = HashTable(options)
        with pytest.raises(Exception, match="inserts refused"):
            for keys, tags, counts, _ in _batches(False, steps=8):
                table.lookup(keys, tags, train=True, counts=counts)


def _syncs(options: TableOptions, train: bool, at_max: bool = True) -> collections.Counter:
    with _backend(True):
        table = HashTable(options)
        batches = list(_batches(False, steps=4))
        for keys, _, counts, _ in batches[:-1]:
            table.advance_step()
            table.lookup(keys, train=True, counts=counts)
        keys, _, counts, _ = batches[-1]
        with SyncCounter() as mode:
            table.lookup(keys, train=train, counts=counts)
        assert (table.capacity() >= options.max_capacity) is at_max
        return mode.counts


# WARNING reads the refused count at most once a minute (here: on an earlier lookup).
@pytest.mark.parametrize("check_mode,want", [("IGNORE", 0), ("WARNING", 0)])
def test_lookup_at_max_capacity_reads_at_most_the_refused_count(check_mode, want):
    counts = _syncs(_options("STEP", True, True, check_mode), train=True)
    assert sum(counts.values()) == want, dict(counts)


def test_lookup_below_max_capacity_reads_one_pair_of_counts():
    options = dataclasses.replace(_options("LFU", True, False, "IGNORE"), max_capacity=4096)
    counts = _syncs(options, train=True, at_max=False)
    assert sum(counts.values()) <= 2, dict(counts)
    assert counts["tolist"] == 1, dict(counts)


def test_load_state_of_unique_keys_at_max_capacity_reads_nothing_back():
    """A checkpoint shard's rows (unique keys, full rows, scores) into a full-size table
    on the fixed-size path: no read of the device on the host."""
    with _backend(True):
        table = HashTable(dataclasses.replace(_options("LFU", False, True),
                                              init_capacity=64, optimizer=SparseAdam(lr=0.1)))
        assert table.capacity() >= 64
        first = torch.arange(0, 300, 3)
        table.load_state(first, None, torch.zeros(100, table.row_dim), torch.zeros_like(first),
                         assume_unique=True)
        keys = first + 1
        rows = torch.randn(keys.numel(), table.row_dim)
        scores = torch.arange(keys.numel()) + 1
        with SyncCounter() as mode:
            table.load_state(keys, None, rows, scores, assume_unique=True)
        assert sum(mode.counts.values()) == 0, dict(mode.counts)
        assert table.stats()["evictions"] > 0  # the table was full: new rows replaced old
        got = {k: (r.tolist(), s) for ks, _, rs, ss in table.export_state(512)
               for k, r, s in zip(ks.tolist(), rs, ss.tolist())}
        for k, row, score in zip(keys.tolist(), rows, scores.tolist()):
            if k in got:
                assert got[k] == (row.tolist(), score)


def test_eval_lookup_reads_nothing_back():
    counts = _syncs(_options("STEP", True, True), train=False)
    assert sum(counts.values()) == 0, dict(counts)


@pytest.mark.parametrize("seeded", [False, True], ids=["constant", "key_seeded"])
def test_find_reads_nothing_back_and_matches_reference(seeded):
    """``HashTable.find`` on the fixed-size path (repeated and missing keys): one read
    of every row in a kernel, nothing read back on the host, the reference's values,
    founds and counters (a key-seeded eval initializer agrees value for value)."""
    eval_init = InitializerArgs(mode="UNIFORM", key_seed=5) if seeded else \
        InitializerArgs(mode="CONSTANT", value=0.25)
    options = dataclasses.replace(_options("STEP", False, True), eval_initializer=eval_init)
    keys = torch.arange(0, 120, 2)
    probe = torch.cat([keys[::3], torch.arange(1, 40, 4), keys[:7]])  # misses and repeats
    runs = []
    for triton in (False, True):
        with _backend(triton):
            table = HashTable(options)
            table.insert_or_assign(keys, torch.randn(keys.numel(), 3,
                                                     generator=torch.Generator().manual_seed(2)))
            with SyncCounter() as mode:
                values, found = table.find(probe)
            if triton:
                assert sum(mode.counts.values()) == 0, dict(mode.counts)
            stats = table.stats()
            runs.append((values, found, stats["lookups"], stats["hits"]))
    (w_values, w_found, *w_counts), (g_values, g_found, *g_counts) = runs
    assert torch.equal(g_found, w_found) and not bool(w_found.all()) and bool(w_found.any())
    torch.testing.assert_close(g_values, w_values)
    assert g_counts == w_counts == [probe.numel(), int(w_found.sum())]


@pytest.mark.parametrize("call", ["find_or_insert", "insert_or_assign"])
def test_write_calls_at_max_capacity_read_nothing_back(call):
    """``HashTable.find_or_insert`` / ``insert_or_assign`` of repeated keys into a table
    at max_capacity on the fixed-size path: deduplicated in fixed sizes and inserted
    (evicting) without a read of the device on the host; the same outcome as the
    reference path's."""
    options = dataclasses.replace(_options("STEP", False, True), init_capacity=64)
    first = torch.arange(0, 120, 2)
    keys = torch.cat([first[::4], torch.arange(201, 260, 3), first[:9], first[::4]])
    runs = []
    for triton in (False, True):
        with _backend(triton):
            table = HashTable(options)
            table.insert_or_assign(first, torch.ones(first.numel(), 3))
            table.advance_step()
            rows = torch.arange(keys.numel() * 3, dtype=torch.float32).view(-1, 3)
            with SyncCounter() as mode:
                if call == "find_or_insert":
                    values, found = table.find_or_insert(keys)
                else:
                    table.insert_or_assign(keys, rows)
            if triton:
                assert sum(mode.counts.values()) == 0, dict(mode.counts)
            if call == "insert_or_assign":
                values, found = table.find(keys)
            state = sorted((k, s) for ks, _, _, ss in table.export_state(512)
                           for k, s in zip(ks.tolist(), ss.tolist()))
            runs.append((values, found, table.stats(), state))
    (w_values, w_found, w_stats, w_state), (g_values, g_found, g_stats, g_state) = runs
    assert torch.equal(g_found, w_found)
    torch.testing.assert_close(g_values, w_values)
    assert g_stats == w_stats and g_state == w_state
    assert w_stats["evictions"] > 0 and w_stats["inserts"] > 0


def test_erase_on_the_triton_backend_reads_nothing_back():
    with _backend(True):
        table = HashTable(_options("STEP", False, True))
        keys = torch.arange(0, 40, 2)
        table.insert_or_assign(keys, torch.ones(keys.numel(), 3))
        with SyncCounter() as mode:
            table.erase(torch.arange(0, 20))  # half of them absent
        assert sum(mode.counts.values()) == 0, dict(mode.counts)
        assert table.contains(keys).tolist() == [False] * 10 + [True] * 10


def test_sync_counter_sees_boolean_indexing():
    x = torch.arange(5)
    with SyncCounter() as mode:
        x[x > 2].tolist()
    assert mode.counts["aten.index(bool mask)"] == 1 and mode.counts["tolist"] == 1


def test_warning_mode_reads_and_reports_refusals_once_a_minute(caplog, monkeypatch):
    import logging
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    options = _options("NO_EVICTION", False, True, check_mode="WARNING")
    with _backend(True), caplog.at_level(logging.WARNING):
        table = HashTable(options)
        batches = list(_batches(False, steps=6))
        for i, (keys, _, counts, _) in enumerate(batches):
            table.advance_step()
            table.lookup(keys, train=True, counts=counts)
            clock[0] += 1.0 if i < 4 else 61.0
    refused = table.stats()["refused"]
    reported = [int(r.getMessage().split(": ")[1].split()[0]) for r in caplog.records
                if "inserts refused" in r.getMessage()]
    assert refused > 0 and 1 <= len(reported) <= 2
    # Every refusal is in stats and in a warning, or still waiting to be read.
    unread = table._refused_unread
    assert sum(reported) + (0 if unread is None else int(unread)) == refused


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_empty_lookup_matches_reference(train):
    options = _options("LFU", True, False)
    out = []
    for triton in (False, True):
        with _backend(triton):
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
    options = dataclasses.replace(_options("LFU", True, True), init_capacity=64)  # no growth
    constant = InitializerArgs(mode="CONSTANT", value=0.5)
    options = dataclasses.replace(
        options, eval_initializer=constant,
        admission=dataclasses.replace(options.admission, initializer=constant))
    gen = torch.Generator().manual_seed(11)
    with _backend(triton):
        masked, plain = HashTable(options), HashTable(options)
        for keys, tags, counts, _ in _batches(True, steps=5):
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


@pytest.mark.parametrize("guard", [None, True, False], ids=["unguarded", "inserting", "no_insert"])
def test_protect_hits_sets_the_maximum_only_when_the_call_inserts(guard):
    from hashrec.table.ops.insert.train import SCORE_LFU, protect_hits
    from hashrec.table.storage import TableStorage

    device = "cuda" if torch.cuda.is_available() else "cpu"
    storage = TableStorage.empty(4, 8, 3, device=device)
    storage.scores.copy_(torch.arange(32, device=device) * 10)
    before = storage.scores.clone()
    slots = torch.tensor([3, -1, 5, 30], device=device)
    counts = torch.tensor([1, 4, 2, 7], device=device)
    flag = None if guard is None else torch.tensor(guard, device=device)
    scores = protect_hits(storage, slots, counts, None, SCORE_LFU, guard=flag)
    # LFU: a hit's stored score plus its count; a miss's count alone. Without an insert
    # nothing reads the returned scores, and they are not written.
    new = [31, 4, 52, 307]
    if guard is not False:
        assert scores.tolist() == new
    # The hits' stored scores: the maximum ahead of an insert, else the new scores.
    want = before.clone()
    want[[3, 5, 30]] = torch.iinfo(torch.int64).max if guard is not False else \
        torch.tensor(new, device=device)[[0, 2, 3]]
    assert torch.equal(storage.scores, want)


def test_mask_counts_add_to_the_totals_in_place():
    from hashrec.table.ops.insert.train import add_mask_counts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    masks = [(torch.rand(9000, generator=gen) < p).to(device) for p in (0.0, 0.3, 0.7, 1.0)]
    totals = torch.tensor([1, 2, 3, 4, 5], device=device)
    add_mask_counts(totals, masks, torch.tensor(6, device=device))
    want = [1 + 0, 2 + int(masks[1].sum()), 3 + int(masks[2].sum()), 4 + 9000, 5 + 6]
    assert totals.tolist() == want
    add_mask_counts(totals[:1], masks[3:])
    assert totals[0].item() == 9001
    with pytest.raises(ValueError, match="entries"):
        add_mask_counts(totals, masks)
    with pytest.raises(ValueError, match="masks"):
        add_mask_counts(torch.zeros(7, dtype=torch.int64), masks * 2)


@pytest.mark.parametrize("masked", [False, True], ids=["count", "count_and_active"])
def test_found_masks_split_a_find_over_the_keys_that_take_part(masked):
    from hashrec.table.ops.insert.train import found_masks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    slots = torch.tensor([4, -1, 7, -1, 9, -1, 2], device=device)
    active = torch.tensor([1, 1, 0, 1, 1, 1, 1], dtype=torch.bool, device=device) \
        if masked else None
    count = torch.tensor([5], device=device)  # keys 5 and 6 are padding
    got, hit, pending, live, any_pending = found_masks(slots.clone(), active, count)
    want_live = [True, True, not masked, True, True, False, False]
    assert live.tolist() == want_live
    assert got.tolist() == [s if ok else -1 for s, ok in zip(slots.tolist(), want_live)]
    assert hit.tolist() == [ok and s >= 0 for s, ok in zip(slots.tolist(), want_live)]
    assert pending.tolist() == [ok and s < 0 for s, ok in zip(slots.tolist(), want_live)]
    assert any_pending.item()
    none = found_masks(slots.clone(), None, torch.tensor([1], device=device))
    assert not none[4].item() and none[2].tolist() == [False] * 7



@pytest.mark.parametrize("triton", [False, True], ids=["reference", "fixed"])
def test_stats_count_every_key_of_find_or_insert(triton):
    with _backend(triton):
        table = HashTable(_options("STEP", False, False))
        table.find_or_insert(torch.tensor([1, 1, 2]))
        table.find_or_insert(torch.tensor([1, 3, 1, 1]))
        stats = table.stats()
    assert (stats["lookups"], stats["hits"]) == (7, 3)


def test_refusals_after_a_read_that_found_none_are_warned_about_without_delay(caplog,
                                                                          monkeypatch):
    """A WARNING read at max_capacity that finds no refusal starts no once-a-minute
    window: the next refusals are seen (in a copy that never waits for the device) and
    warned about within the minute, and reading reads nothing more back per lookup."""
    import logging
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    options = dataclasses.replace(_options("NO_EVICTION", False, True, check_mode="WARNING"),
                                  init_capacity=64)
    with _backend(True), caplog.at_level(logging.WARNING):
        table = HashTable(options)
        table.lookup(torch.arange(4))  # at max_capacity, nothing refused: a read of 0
        clock[0] += 10.0
        with SyncCounter() as mode:
            table.lookup(torch.arange(4, 8))  # still nothing refused
        assert sum(mode.counts.values()) == 0, dict(mode.counts)
        clock[0] += 10.0
        table.lookup(torch.arange(100, 200))  # refuses
    refused = table.stats()["refused"]
    assert refused > 0 and f"{refused} inserts refused" in caplog.text
