"""Refused inserts on the fixed-size lookup (Triton backend): ``check_mode`` ERROR
raises; WARNING reads the refused count at most once a minute and reports every
refusal. Without CUDA the kernels run interpreted on CPU tensors.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from fixed_lookup_helpers import SyncCounter, backend, step_batches, table_options  # noqa: E402

from hashrec.table import HashTable  # noqa: E402


def test_refused_inserts_raise_with_check_mode_error():
    options = table_options("NO_EVICTION", False, True, check_mode="ERROR")
    with backend(True):
        table = HashTable(options)
        with pytest.raises(Exception, match="inserts refused"):
            for keys, tags, counts, _ in step_batches(False, steps=8):
                table.lookup(keys, tags, train=True, counts=counts)


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "triton"])
@pytest.mark.parametrize("operation", ["insert_or_assign", "load_state"])
def test_refusal_error_comes_after_the_stored_keys_rows(triton, operation):
    """A write that stores some keys and refuses others raises with the stored keys
    holding their own rows, never the rows of the keys they evicted."""
    from hashrec.table import TableFullError, TableOptions

    with backend(triton):
        table = HashTable(TableOptions(dim=2, max_capacity=4, bucket_capacity=4,
                                       check_mode="ERROR"))
        table.insert_or_assign(torch.arange(10, 14), torch.arange(10, 14.0).repeat(2, 1).T)
        table.advance_step()
        keys, rows = torch.arange(1, 6), torch.arange(10.0).reshape(5, 2)
        with pytest.raises(TableFullError, match=f"1 inserts refused.*in {operation}"):
            if operation == "insert_or_assign":
                table.insert_or_assign(keys, rows)
            else:
                table.load_state(keys, None, rows, torch.full((5,), 100, dtype=torch.int64))
        values, found = table.find(keys)
    assert found.tolist() == [True] * 4 + [False]
    assert torch.equal(values[:4], rows[:4])


def test_a_write_that_fails_leaves_no_refusal_for_the_next(monkeypatch):
    from hashrec.table import TableFullError, TableOptions

    table = HashTable(TableOptions(dim=2, max_capacity=4, bucket_capacity=4,
                                   check_mode="ERROR"))
    table.insert_or_assign(torch.arange(10, 14), torch.zeros(4, 2))
    table.advance_step()
    monkeypatch.setattr(table, "_write_assigned", lambda *a: (_ for _ in ()).throw(
        MemoryError("out of memory")))
    with pytest.raises(MemoryError):  # refuses one key, then fails writing the rows
        table.insert_or_assign(torch.arange(1, 6), torch.ones(5, 2))
    monkeypatch.undo()
    try:
        table.insert_or_assign(table.export_batch(1).__next__()[0], torch.ones(1, 2))
    except TableFullError as e:
        pytest.fail(f"a refusal of the failed call was raised by the next one: {e}")


def test_warning_mode_reads_and_reports_refusals_once_a_minute(caplog, monkeypatch):
    import logging
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    options = table_options("NO_EVICTION", False, True, check_mode="WARNING")
    with backend(True), caplog.at_level(logging.WARNING):
        table = HashTable(options)
        batches = list(step_batches(False, steps=6))
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


def test_refusals_after_a_read_that_found_none_are_warned_about_without_delay(caplog,
                                                                          monkeypatch):
    """A WARNING read at max_capacity that finds no refusal starts no once-a-minute
    window: the next refusals are seen (in a copy that never waits for the device) and
    warned about within the minute, and reading reads nothing more back per lookup."""
    import logging
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    options = dataclasses.replace(table_options("NO_EVICTION", False, True, check_mode="WARNING"),
                                  init_capacity=64)
    with backend(True), caplog.at_level(logging.WARNING):
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
