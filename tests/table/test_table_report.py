"""A table's counts by tag (``TableOptions.tag_names``): admission rejections and refused
inserts of each table fused into it, on the CPU reference path, the fixed-size (Triton)
path and its padded captured form, the kernels interpreted on CPU tensors where there is
no GPU."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from fixed_lookup_helpers import backend, step_batches, table_options  # noqa: E402

from hashrec.table import HashTable, TableOptions  # noqa: E402
from hashrec.table.lookup_graphs import LookupGraphs  # noqa: E402
from hashrec.table.options import AdmissionOptions  # noqa: E402

NAMES = ("user_id", "cate_id")
COUNTERS = ("admission_rejected", "refused")


def _by_tag(stats: dict) -> dict[str, list[int]]:
    return {c: [stats[f"{c}/{name}"] for name in NAMES] for c in COUNTERS}


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "triton"])
def test_rejections_and_refusals_are_counted_by_tag(triton):
    """One bucket of 4 slots, admission at 2: the counts by tag, worked out by hand."""
    options = TableOptions(dim=2, max_capacity=4, bucket_capacity=4, tag_names=NAMES,
                           score_strategy="NO_EVICTION", check_mode="IGNORE",
                           admission=AdmissionOptions(threshold=2, counter_capacity=16,
                                                      counter_bucket_capacity=16))
    calls = [([1, 2, 3], [0, 0, 1], [1, 1, 1]),  # all three wait: rejected 2 + 1
             ([1, 2, 3], [0, 0, 1], [1, 1, 1]),  # all three admitted and stored
             ([4, 5, 7], [1, 1, 0], [2, 2, 1])]  # 4, 5 admitted, one refused; 7 waits
    with backend(triton):
        table = HashTable(options)
        assert table._fixed_path() is triton
        table._lookup_graphs = False
        for keys, tags, counts in calls:
            table.advance_step()
            table.lookup(torch.tensor(keys), torch.tensor(tags, dtype=torch.int32),
                         counts=torch.tensor(counts))
        stats = table.stats()
    assert _by_tag(stats) == {"admission_rejected": [3, 1], "refused": [0, 1]}
    assert (stats["admission_rejected"], stats["refused"]) == (4, 1)


def _run(form: str, device: str = "cpu") -> dict:
    """Training lookups, find_or_insert and insert_or_assign calls of tagged batches on a
    table that fills and refuses: its stats. ``form``: reference, triton (the fixed-size
    path, uncaptured), padded (its captured form without capture) or captured (CUDA)."""
    options = dataclasses.replace(table_options("NO_EVICTION", True, True), tag_names=NAMES,
                                  device=device)
    context = contextlib.nullcontext() if device != "cpu" else backend(form != "reference")
    with context:
        table = HashTable(options)
        table._lookup_graphs = False if form in ("reference", "triton") else LookupGraphs(
            table, capture=form == "captured")
        for keys, tags, counts, _ in step_batches(True, steps=5):
            keys, tags, counts = keys.to(device), tags.to(device), counts.to(device)
            table.advance_step()
            table.lookup(keys, tags, train=True, counts=counts)
            table.find_or_insert(keys[:8] + 500, tags=tags[:8])  # new keys: rejected, refused
            table.insert_or_assign(keys[:6] + 900, torch.ones(6, 3, device=device),
                                   tags=tags[:6])  # refused
        if table._lookup_graphs:
            assert table._lookup_graphs.replays >= 2
        return table.stats()


def test_counts_by_tag_agree_on_every_path_and_sum_to_the_totals(monkeypatch):
    monkeypatch.setattr("hashrec.table.lookup_graphs.MIN_STEP", 16)  # interpreted: small
    runs = {form: _run(form) for form in ("reference", "triton", "padded")}
    want = _by_tag(runs["reference"])
    for counter, per_tag in want.items():
        assert min(per_tag) > 0 and sum(per_tag) == runs["reference"][counter], counter
    for form in ("triton", "padded"):
        assert _by_tag(runs[form]) == want, form
    untagged = HashTable(table_options("NO_EVICTION", True, True)).stats()
    assert not [key for key in untagged if "/" in key]  # no tag_names: no counts by tag


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_lookups_count_by_tag_as_the_reference(monkeypatch):
    monkeypatch.setattr("hashrec.table.lookup_graphs.MIN_STEP", 16)
    assert _by_tag(_run("captured", "cuda")) == _by_tag(_run("reference"))
