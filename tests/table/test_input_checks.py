"""HASHREC_CHECK_INPUTS=1: the Triton path checks its inputs' values as the CPU reference
path always does (here the Triton path runs interpreted on CPU tensors)."""

from __future__ import annotations

import os

import pytest
import torch
from host_reads import forced_triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table import HashTable, SparseAdagrad, TableOptions  # noqa: E402
from hashrec.table.lookup_graphs import graphs_enabled  # noqa: E402


def _table() -> HashTable:
    return HashTable(TableOptions(dim=2, max_capacity=64, bucket_capacity=16,
                                  optimizer=SparseAdagrad()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreted Triton path")
def test_the_triton_path_checks_values_only_when_asked(monkeypatch):
    with forced_triton():
        unchecked = _table()
        unchecked.lookup(torch.tensor([7, 7, 8]))  # not checked: the counters go wrong
        monkeypatch.setenv("HASHREC_CHECK_INPUTS", "1")
        table = _table()
        with pytest.raises(ValueError, match="1 repeated"):
            table.lookup(torch.tensor([7, 7, 8]))
        with pytest.raises(ValueError, match="counts must be >= 1"):
            table.lookup(torch.tensor([7, 8]), counts=torch.tensor([1, 0]))
        result = table.lookup(torch.tensor([7, 8]))
        with pytest.raises(ValueError, match="slots must be < capacity"):
            table.apply_gradients(torch.tensor([table.capacity()]), torch.ones(1, 2))
        table.apply_gradients(result.slots, torch.ones(2, 2), version=result.version)


def test_checked_lookups_are_not_captured(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert graphs_enabled(torch.device("cuda"))
    monkeypatch.setenv("HASHREC_CHECK_INPUTS", "1")
    assert not graphs_enabled(torch.device("cuda"))


def test_other_settings_are_refused(monkeypatch):
    from hashrec.table.validation import input_checks_forced

    monkeypatch.setenv("HASHREC_CHECK_INPUTS", "true")
    with pytest.raises(ValueError, match="HASHREC_CHECK_INPUTS='true': expected 0 or 1"):
        input_checks_forced()
    monkeypatch.setenv("HASHREC_CHECK_INPUTS", "0")
    assert not input_checks_forced()
