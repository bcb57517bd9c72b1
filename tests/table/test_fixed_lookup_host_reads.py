"""What the fixed-size lookup (Triton backend) reads back on the host.

A dispatch mode (``SyncCounter``) counts the operations that read the device on
the host: lookups at max_capacity, evaluation, ``find``, the write calls,
``erase`` and checkpoint loading read nothing back; a lookup that may grow the
table reads one pair of counts. Without CUDA the kernels run interpreted on CPU
tensors.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from fixed_lookup_helpers import SyncCounter, backend, step_batches, table_options  # noqa: E402

from hashrec.table import HashTable, SparseAdam, TableOptions  # noqa: E402
from hashrec.table.options import InitializerArgs  # noqa: E402


def _syncs(options: TableOptions, train: bool, at_max: bool = True) -> collections.Counter:
    with backend(True):
        table = HashTable(options)
        batches = list(step_batches(False, steps=4))
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
    counts = _syncs(table_options("STEP", True, True, check_mode), train=True)
    assert sum(counts.values()) == want, dict(counts)


def test_lookup_below_max_capacity_reads_one_pair_of_counts():
    options = dataclasses.replace(table_options("LFU", True, False, "IGNORE"), max_capacity=4096)
    counts = _syncs(options, train=True, at_max=False)
    assert sum(counts.values()) <= 2, dict(counts)
    assert counts["tolist"] == 1, dict(counts)


def test_load_state_of_unique_keys_at_max_capacity_reads_nothing_back():
    """A checkpoint shard's rows (unique keys, full rows, scores) into a full-size table
    on the fixed-size path: no read of the device on the host."""
    with backend(True):
        table = HashTable(dataclasses.replace(table_options("LFU", False, True),
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
    counts = _syncs(table_options("STEP", True, True), train=False)
    assert sum(counts.values()) == 0, dict(counts)


@pytest.mark.parametrize("seeded", [False, True], ids=["constant", "key_seeded"])
def test_find_reads_nothing_back_and_matches_reference(seeded):
    """``HashTable.find`` on the fixed-size path (repeated and missing keys): one read
    of every row in a kernel, nothing read back on the host, the reference's values,
    founds and counters (a key-seeded eval initializer agrees value for value)."""
    eval_init = InitializerArgs(mode="UNIFORM", key_seed=5) if seeded else \
        InitializerArgs(mode="CONSTANT", value=0.25)
    options = dataclasses.replace(table_options("STEP", False, True), eval_initializer=eval_init)
    keys = torch.arange(0, 120, 2)
    probe = torch.cat([keys[::3], torch.arange(1, 40, 4), keys[:7]])  # misses and repeats
    runs = []
    for triton in (False, True):
        with backend(triton):
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
    options = dataclasses.replace(table_options("STEP", False, True), init_capacity=64)
    first = torch.arange(0, 120, 2)
    keys = torch.cat([first[::4], torch.arange(201, 260, 3), first[:9], first[::4]])
    runs = []
    for triton in (False, True):
        with backend(triton):
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
    with backend(True):
        table = HashTable(table_options("STEP", False, True))
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
