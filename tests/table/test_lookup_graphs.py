"""Captured training lookups (``hashrec.table.lookup_graphs``) against the eager lookup.

On CPU the padded lookup runs without capture (``capture=False``) under the
interpreter: the same input buffers, padding, device-side seeds and clock as a
replay. On the GPU (``gpu`` marker) the lookups are captured and replayed. Either
way a table must give what its eager twin gives, bit for bit: slots, values,
stats, stored entries, admission counters, seed sequence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch
from host_reads import forced_triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table import HashTable, SparseAdagrad, TableOptions  # noqa: E402
from hashrec.table.lookup_graphs import (  # noqa: E402
    ASSIGN,
    FIND_OR_INSERT,
    MIN_STEP,
    LookupGraphs,
    graphs_enabled,
    padded_size,
)
from hashrec.table.options import AdmissionOptions, InitializerArgs  # noqa: E402

HASHED = InitializerArgs(mode="UNIFORM", key_seed=3)
RANDOM = InitializerArgs(mode="NORMAL", std_dev=0.2)


# Tests without capture run on the GPU where there is one (compiled kernels), else on
# the CPU with the kernels interpreted.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _options(strategy: str, initializer: InitializerArgs, scale: int = 1,
             device: str = DEVICE) -> TableOptions:
    """A table that reaches max_capacity in its first lookups, then evicts."""
    admission_init = InitializerArgs(mode="UNIFORM", lower=-1.0, upper=1.0,
                                     key_seed=None if initializer is RANDOM else 9)
    return TableOptions(
        dim=4, max_capacity=64 * scale, init_capacity=32 * scale, bucket_capacity=8,
        score_strategy=strategy, check_mode="IGNORE", seed=1, initializer=initializer,
        optimizer=SparseAdagrad(lr=0.1, initial_accumulator_value=0.25), device=device,
        admission=AdmissionOptions(threshold=2, counter_capacity=48 * scale,
                                   counter_bucket_capacity=8, initializer=admission_init))


def _batches(steps: int, keys_per_batch: int, key_range: int, tagged: bool, masked: bool,
             device: str):
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        keys = torch.randint(0, key_range, (keys_per_batch,), generator=gen)
        tags = torch.randint(0, 2, keys.shape, generator=gen, dtype=torch.int32)
        pairs = torch.unique(keys * 2 + (tags if tagged else 0))
        keys = pairs // 2
        tags = (pairs % 2).to(torch.int32) if tagged else None
        counts = torch.randint(1, 3, keys.shape, generator=gen)
        scores = torch.randint(0, 9, keys.shape, generator=gen)
        active = torch.rand(keys.shape, generator=gen) < 0.8 if masked else None
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        yield to(keys), to(tags), to(counts), to(scores), to(active)


def _state(table: HashTable) -> tuple:
    stored = {(k, t): (r.tolist(), s) for keys, tags, rows, scores in table.export_state(4096)
              for k, t, r, s in zip(keys.tolist(), tags.tolist(), rows, scores.tolist())}
    counters = sorted(zip(*(c.tolist() for c in table.admission_state())))
    return table.stats(), stored, counters, table._kernel_seed()


def _compare(options: TableOptions, capture: bool, tagged: bool = False, masked: bool = False,
             steps: int = 8, keys_per_batch: int = 60, key_range: int = 160,
             cycle: int = 0) -> LookupGraphs:
    """Runs a table with LookupGraphs and its eager twin on the same batches (with
    ``cycle``, the first ``cycle`` batches over and over); asserts they agree at every
    step and at the end."""
    on_gpu = str(options.device).startswith("cuda")
    context = contextlib.nullcontext() if capture or on_gpu else forced_triton()
    with context:
        eager, padded = HashTable(options), HashTable(options)
        eager._lookup_graphs = False
        padded._lookup_graphs = graphs = LookupGraphs(padded, capture=capture)
        custom = options.score_strategy.value == "CUSTOMIZED"
        batches = list(_batches(cycle or steps, keys_per_batch, key_range, tagged, masked,
                                str(options.device)))
        for step in range(steps):
            keys, tags, counts, scores, active = batches[step % len(batches)]
            looked = []
            for table in (eager, padded):
                table.advance_step()
                looked.append(table.lookup(keys, tags, train=True, counts=counts,
                                           scores=scores if custom else None, active=active))
            (want, got) = looked
            assert torch.equal(got.slots, want.slots), f"step {step}"
            assert torch.equal(got.values, want.values), f"step {step}"
        assert _state(padded) == _state(eager)
    return graphs


def _compare_calls(options: TableOptions, capture: bool, tagged: bool, steps: int = 8,
                   keys_per_batch: int = 60, key_range: int = 160) -> LookupGraphs:
    """``_compare`` for the public write calls, each step a ``find_or_insert`` and an
    ``insert_or_assign`` of batches with repeated keys (their forms of the captured
    lookup: the unique count stays on the device)."""
    on_gpu = str(options.device).startswith("cuda")
    context = contextlib.nullcontext() if capture or on_gpu else forced_triton()
    gen = torch.Generator().manual_seed(11)
    with context:
        eager, padded = HashTable(options), HashTable(options)
        eager._lookup_graphs = False
        padded._lookup_graphs = graphs = LookupGraphs(padded, capture=capture)
        custom = options.score_strategy.value == "CUSTOMIZED"

        def batch():
            keys = torch.randint(0, key_range, (keys_per_batch,), generator=gen)
            tags = torch.randint(0, 2, keys.shape, generator=gen,
                                 dtype=torch.int32) if tagged else None
            scores = torch.randint(0, 9, keys.shape, generator=gen) if custom else None
            rows = torch.randn(keys.numel(), options.dim, generator=gen)
            return [None if t is None else t.to(options.device)
                    for t in (keys, tags, scores, rows)]

        for step in range(steps):
            (keys, tags, scores, _), (akeys, atags, ascores, arows) = batch(), batch()
            called = []
            for table in (eager, padded):
                table.advance_step()
                called.append(table.find_or_insert(keys, scores, tags))
                table.insert_or_assign(akeys, arows, ascores, atags)
            (want_values, want_found), (got_values, got_found) = called
            assert torch.equal(got_values, want_values), f"step {step}"
            assert torch.equal(got_found, want_found), f"step {step}"
        assert _state(padded) == _state(eager)
    return graphs


@pytest.fixture
def small_classes(monkeypatch):
    """Size classes of 16 keys: the interpreter runs a program per padded key."""
    monkeypatch.setattr("hashrec.table.lookup_graphs.MIN_STEP", 16)


# Every pair of strategy, initializer and tagging (with the active mask) once: each
# strategy with both initializers and both taggings, each initializer with both taggings
# (the interpreter runs a program per padded key, so not the whole product).
PAIRWISE = [(strategy, init, tagged) for strategy, pairs in [
    ("STEP", [("hashed", False), ("random", True)]),
    ("LFU", [("hashed", True), ("random", False)]),
    ("CUSTOMIZED", [("hashed", False), ("random", True)]),
    ("NO_EVICTION", [("hashed", True), ("random", False)])] for init, tagged in pairs]


@pytest.mark.parametrize("strategy,initializer,tagged", [
    pytest.param(strategy, {"hashed": HASHED, "random": RANDOM}[init], tagged,
                 id=f"{strategy}-{init}-{'tagged_active_mask' if tagged else 'untagged'}")
    for strategy, init, tagged in PAIRWISE])
def test_padded_lookup_equals_eager(small_classes, strategy, initializer, tagged):
    masked = tagged
    graphs = _compare(_options(strategy, initializer), capture=False, tagged=tagged,
                      masked=masked)
    # The table is at max_capacity from the second lookup on; each size class is
    # padded from its second lookup on.
    assert graphs.replays >= 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_padded_lookup_of_half_rows_equals_eager(small_classes, dtype):
    """Rows stored in a feature's data_type: the padded lookup reads and initializes them
    as the eager one does, and returns them as float32."""
    options = dataclasses.replace(_options("LFU", HASHED), dtype=dtype)
    graphs = _compare(options, capture=False, tagged=True, masked=True, steps=5)
    assert graphs.replays >= 2


# With a kernel-computed initializer, at max_capacity and at most MAX_KEYS keys, the
# third and fourth lookups would be padded (``test_padded_lookup_equals_eager``): four
# steps show it where the table is at max_capacity. Below it, eight: the growing table
# then takes launch variants of its own (sizes that are multiples of 16).
def test_no_padded_lookup_below_max_capacity_or_for_computed_initializers(small_classes):
    options = dataclasses.replace(_options("LFU", HASHED), max_capacity=4096)
    assert _compare(options, capture=False).replays == 0
    options = _options("LFU", InitializerArgs(mode="TRUNCATED_NORMAL", std_dev=0.3))
    assert _compare(options, capture=False, steps=4).replays == 0


def test_no_padded_lookup_above_max_keys(small_classes, monkeypatch):
    monkeypatch.setattr("hashrec.table.lookup_graphs.MAX_KEYS", 32)
    assert _compare(_options("LFU", HASHED), capture=False, steps=4).replays == 0


def test_size_classes():
    for n in [1, 5, 1023, 1024, 1025, 30_000, 65_536, 65_537, 400_001, 3_000_000]:
        size = padded_size(n)
        assert n <= size <= n + max(MIN_STEP, n // 8)
        assert padded_size(size) == size
    sizes = {padded_size(n) for n in range(300_000, 320_000)}
    assert len(sizes) <= 2


def test_graphs_only_on_cuda(monkeypatch):
    assert not graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv("HASHREC_LOOKUP_GRAPHS", "0")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not graphs_enabled(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("initializer", [HASHED, RANDOM], ids=["hashed", "random"])
@pytest.mark.parametrize("strategy", ["STEP", "LFU", "CUSTOMIZED", "NO_EVICTION"])
def test_replayed_lookup_equals_eager_on_gpu(strategy, initializer):
    graphs = _compare(_options(strategy, initializer, scale=512, device="cuda"), capture=True,
                      tagged=True, masked=strategy == "LFU", steps=12, keys_per_batch=20_000,
                      key_range=120_000)
    assert graphs.replays >= 6
    assert all(entry.graph is not None for entry in graphs._lookups.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_replayed_lookup_of_half_rows_equals_eager_on_gpu(dtype):
    options = dataclasses.replace(_options("LFU", RANDOM, scale=512, device="cuda"), dtype=dtype)
    graphs = _compare(options, capture=True, tagged=True, masked=True, steps=12,
                      keys_per_batch=20_000, key_range=120_000)
    assert graphs.replays >= 6
    assert all(entry.graph is not None for entry in graphs._lookups.values())


@pytest.mark.parametrize("strategy,initializer,tagged", [
    pytest.param("STEP", HASHED, True, id="STEP-hashed-tagged"),
    pytest.param("LFU", RANDOM, False, id="LFU-random"),
    pytest.param("CUSTOMIZED", RANDOM, True, id="CUSTOMIZED-random-tagged"),
    pytest.param("NO_EVICTION", HASHED, False, id="NO_EVICTION-hashed")])
def test_padded_write_calls_equal_eager(small_classes, strategy, initializer, tagged):
    graphs = _compare_calls(_options(strategy, initializer), capture=False, tagged=tagged)
    assert graphs.replays >= 6
    assert {key[-1] for key in graphs._lookups} == {FIND_OR_INSERT, ASSIGN}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("strategy", ["STEP", "LFU", "CUSTOMIZED", "NO_EVICTION"])
def test_replayed_write_calls_equal_eager_on_gpu(strategy):
    graphs = _compare_calls(_options(strategy, RANDOM, scale=512, device="cuda"),
                            capture=True, tagged=strategy != "LFU", steps=10,
                            keys_per_batch=30_000, key_range=120_000)
    assert graphs.replays >= 12
    assert all(entry.graph is not None for entry in graphs._lookups.values())


@pytest.mark.parametrize("strategy", ["STEP", "LFU", "NO_EVICTION"])
def test_padded_lookups_of_found_keys_equal_eager(small_classes, strategy):
    # Two batches over and over, into a table that holds them all from the start: from
    # the third step on the padded lookups find (or do not admit) every key, so the hits
    # take their new scores at once instead of being protected and restored.
    options = _options(strategy, HASHED)
    options = dataclasses.replace(options, init_capacity=options.max_capacity)
    graphs = _compare(options, capture=False, tagged=True, masked=strategy == "LFU", steps=8,
                      keys_per_batch=20, key_range=20, cycle=2)
    assert graphs.replays >= 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_new_storage_drops_the_graphs_on_gpu():
    table = HashTable(_options("LFU", HASHED, scale=512, device="cuda"))
    batches = list(_batches(5, 20_000, 120_000, False, False, "cuda"))
    for keys, _, counts, _, _ in batches[:4]:
        table.lookup(keys, train=True, counts=counts)
    graphs = table._lookup_graphs
    assert isinstance(graphs, LookupGraphs) and graphs.replays > 0 and graphs._lookups
    replays = graphs.replays
    table._rehash(table.storage.num_buckets)  # a new storage of the same size
    keys, _, counts, _, _ = batches[4]
    table.lookup(keys, train=True, counts=counts)
    assert graphs.replays == replays and not graphs._lookups


def test_a_dropped_table_frees_its_lookups_without_the_cycle_collector(small_classes):
    import gc
    import weakref

    options = _options("LFU", HASHED)
    with forced_triton():
        table = HashTable(options)
        table._lookup_graphs = LookupGraphs(table, capture=False)
        for keys, tags, counts, _, _ in _batches(3, 60, 160, False, False, DEVICE):
            table.lookup(keys, tags, train=True, counts=counts)
    graphs = weakref.ref(table._lookup_graphs)
    assert graphs().replays > 0
    enabled = gc.isenabled()
    gc.disable()
    try:
        del table
        assert graphs() is None
    finally:
        if enabled:
            gc.enable()


def test_size_classes_that_displace_each_other_stop_being_captured(small_classes, monkeypatch):
    monkeypatch.setattr("hashrec.table.lookup_graphs.MAX_GRAPHS", 1)
    monkeypatch.setattr("hashrec.table.lookup_graphs.MAX_CAPTURES", 2)
    gen = torch.Generator().manual_seed(5)
    with forced_triton():
        eager, padded = HashTable(_options("LFU", HASHED)), HashTable(_options("LFU", HASHED))
        eager._lookup_graphs = False
        padded._lookup_graphs = graphs = LookupGraphs(padded, capture=False)
        for size in [20, 40, 60] * 4:  # classes 32, 48 and 64
            keys = torch.randperm(160, generator=gen)[:size].to(DEVICE)
            want, got = (t.lookup(keys, train=True) for t in (eager, padded))
            assert torch.equal(got.slots, want.slots) and torch.equal(got.values, want.values)
        assert _state(padded) == _state(eager)
    assert graphs.captures == 2 and len(graphs._lookups) == 1
    assert 0 < graphs.replays < 8  # of 12 lookups: the displaced classes stay eager


def _refusal_warnings(caplog) -> list[int]:
    return [int(r.getMessage().split(": ")[1].split()[0]) for r in caplog.records
            if "inserts refused" in r.getMessage()]


def test_padded_lookup_counts_refusals_on_the_device_and_warns_once_a_minute(
        small_classes, caplog, monkeypatch):
    import logging
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    options = dataclasses.replace(_options("NO_EVICTION", HASHED), check_mode="WARNING")
    with forced_triton(), caplog.at_level(logging.WARNING):
        table = HashTable(options)
        table._lookup_graphs = graphs = LookupGraphs(table, capture=False)
        for step, (keys, tags, counts, _, _) in enumerate(
                _batches(10, 60, 400, False, False, DEVICE)):
            table.advance_step()
            table.lookup(keys, tags, train=True, counts=counts)
            clock[0] += 1.0 if step < 6 else 61.0
        assert graphs.replays >= 3
        reported = _refusal_warnings(caplog)
        unannounced = table._refused_unannounced + sum(
            int(t[-1]) for names, t in table._device_totals.items() if names[-1] == "refused")
        refused = table.stats()["refused"]
    # The replays left their refusals in the device totals: read once a minute, each
    # one in a warning or still waiting for the next.
    assert refused > 0 and 2 <= len(reported) <= 5
    assert sum(reported) + unannounced == refused
    assert all(not t.any() for t in table._device_totals.values())  # stats() zeroed them


def test_padded_lookup_raises_on_refusals_under_check_mode_error(small_classes):
    from hashrec.table.errors import TableFullError

    options = dataclasses.replace(_options("NO_EVICTION", HASHED), check_mode="ERROR")
    with forced_triton():
        table = HashTable(options)
        table._lookup_graphs = graphs = LookupGraphs(table, capture=False)
        # At max_capacity from the second lookup on; few keys: nothing refused yet.
        for keys, tags, counts, _, _ in _batches(8, 30, 40, False, False, DEVICE):
            table.advance_step()
            table.lookup(keys, tags, train=True, counts=counts)
        assert graphs.replays >= 1 and table.stats()["refused"] == 0
        replays = graphs.replays
        with pytest.raises(TableFullError, match="inserts refused"):
            for keys, tags, counts, _, _ in _batches(10, 30, 400, False, False, DEVICE):
                table.advance_step()
                table.lookup(keys, tags, train=True, counts=counts)
    assert graphs.replays > replays  # raised by a padded lookup, not an eager one
