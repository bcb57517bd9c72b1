"""Bag features of a lone dynamic storage read stored rows from the table by slot.

A lone storage: the only one of its row width (storages of one width are joined).

On the Triton path such a storage's lookup leaves the rows of keys it held before
the call out (``stored_rows=False``), and pooling reads them from the table's
values by slot (``TableRows``). Here those rows of the lookup are overwritten with
NaN before pooling, so any reader of them shows; training, admission (keys that
read an initializer), eviction and evaluation must still match the reference path.
Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.embedding import (  # noqa: E402
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    collection,
)
from hashrec.table import HashTable, InitializerArgs, SparseAdam, TableOptions  # noqa: E402
from hashrec.table.ops import dispatch  # noqa: E402
from hashrec.table.options import AdmissionOptions  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIM, NUM_IDS = 8, 60
FEATURES = [EmbeddingFeatureSpec("u", "user", pooling="mean"),
            EmbeddingFeatureSpec("u2", "user"), EmbeddingFeatureSpec("i2", "item"),
            EmbeddingFeatureSpec("i", "item", weighted=True),
            EmbeddingFeatureSpec("s", "solo")]


def _options(dim: int = DIM, device: str = DEVICE, **extra) -> TableOptions:
    return TableOptions(dim=dim, max_capacity=64, bucket_capacity=16, device=device,
                        initializer=InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3),
                        **extra)


def _collection(device: str) -> EmbeddingCollection:
    admitted = AdmissionOptions(threshold=2, initializer=InitializerArgs(
        mode="CONSTANT", value=0.25))
    tables = [EmbeddingTableSpec(name, DIM, fusion_group="g", dynamic=_options(device=device))
              for name in ("user", "item")]
    # another width: storages of one width are deduplicated and emitted together
    # (``hashrec.embedding.joint``), and those read every row from their lookups
    tables.append(EmbeddingTableSpec("solo", 4, dynamic=_options(
        4, device, admission=admitted,
        eval_initializer=InitializerArgs(mode="CONSTANT", value=-0.5))))
    return EmbeddingCollection(tables, FEATURES, SparseAdam(lr=0.05), device)


def _run(make_kjt, monkeypatch, device: str, force: bool) -> tuple[list[dict], int]:
    """Pooled outputs of 4 training steps and one evaluation on ``device`` (the CPU:
    Triton ops with ``force``, else the reference); how many lookups left stored rows
    out (their rows NaN before pooling)."""
    dispatch._forced.cache_clear()
    if device == "cpu":
        monkeypatch.setenv("HASHREC_FORCE_TRITON", "1" if force else "0")
    real, slotted = collection.lookup_rows, []

    def lookup_rows(storage, keys, tags, counts, train, stored_rows=True):
        rows, slots = real(storage, keys, tags, counts, train, stored_rows)
        if not stored_rows:
            slotted.append(storage.name)
            rows.data[slots >= 0] = float("nan")
        return rows, slots

    monkeypatch.setattr(collection, "lookup_rows", lookup_rows)
    try:
        ec, outputs = _collection(device), []
        for step in range(5):
            if step == 4:
                ec.eval()
            kjt = make_kjt([f.name for f in FEATURES], 24, NUM_IDS, seed=step, weighted=True)
            out = ec(kjt.to(device))
            outputs.append({k: v.detach().cpu() for k, v in out.pooled.items()})
            if ec.training:
                sum((t ** 2).sum() for t in out.pooled.values()).backward()
        return outputs, len(slotted)
    finally:
        monkeypatch.delenv("HASHREC_FORCE_TRITON", raising=False)
        dispatch._forced.cache_clear()


def test_bags_read_stored_rows_by_slot_like_the_reference(make_kjt, monkeypatch):
    """The Triton path (CUDA, or the interpreter on a CPU-only host) against the
    reference on the CPU."""
    reference, unslotted = _run(make_kjt, monkeypatch, "cpu", force=False)
    triton_path, slotted = _run(make_kjt, monkeypatch, DEVICE, force=True)
    assert unslotted == 0
    assert slotted == 2 * 5  # both storages, every step
    for step, (want, got) in enumerate(zip(reference, triton_path)):
        for name in want:
            assert torch.isfinite(got[name]).all(), (step, name)
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5,
                                       msg=f"step {step} feature {name}")


def test_a_sequence_feature_keeps_its_storage_rows(make_kjt, monkeypatch):
    """A storage with a sequence feature reads every row from its lookup."""
    monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    calls = []
    real = collection.lookup_rows
    monkeypatch.setattr(collection, "lookup_rows", lambda *a: calls.append(a[-1]) or real(*a))
    try:
        ec = EmbeddingCollection(
            [EmbeddingTableSpec("t", DIM, dynamic=_options())],
            [EmbeddingFeatureSpec("a", "t"),
             EmbeddingFeatureSpec("h", "t", is_sequence=True, max_length=3)],
            SparseAdam(lr=0.05), DEVICE)
        ec(make_kjt(["a", "h"], 8, NUM_IDS, seed=0).to(DEVICE))
    finally:
        dispatch._forced.cache_clear()
    assert calls == [True]


def test_lookup_without_stored_rows_keeps_the_other_rows(monkeypatch):
    """``stored_rows=False``: the same slots, and the same rows for keys placed by the
    call, read as the admission initializer, or inactive."""
    monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    try:
        opts = _options(admission=AdmissionOptions(threshold=2))
        tables = [HashTable(opts), HashTable(opts)]
        g = torch.Generator().manual_seed(1)
        for step in range(4):
            keys = torch.randperm(NUM_IDS, generator=g)[:40].to(DEVICE)
            counts = torch.randint(1, 3, (40,), generator=g).to(DEVICE)
            active = (torch.rand(40, generator=g) < 0.9).to(DEVICE)
            before = tables[0].find(keys)[1]
            full, part = (t.lookup(keys, counts=counts, active=active, stored_rows=flag)
                          for t, flag in zip(tables, (True, False)))
            assert torch.equal(full.slots, part.slots)
            other = ~before
            assert other.any() and before.any() or step == 0
            torch.testing.assert_close(part.values[other], full.values[other], rtol=0, atol=0)
    finally:
        dispatch._forced.cache_clear()


def _one_id_steps(monkeypatch, force: bool) -> tuple[list[dict], int]:
    """Pooled outputs of 3 training steps of single-valued features (one id a sample,
    as the data loader's batches say on the host), and how often the backward searched
    the bags for gradient rows."""
    from hashrec.embedding import KeyedJaggedTensor, emit

    dispatch._forced.cache_clear()
    monkeypatch.setenv("HASHREC_FORCE_TRITON", "1" if force else "0")
    searched = []
    real = emit._gradient_rows
    monkeypatch.setattr(emit, "_gradient_rows", lambda *a: searched.append(1) or real(*a))
    names, batch = ["u", "i"], 12
    device = DEVICE if force else "cpu"
    try:
        tables = [EmbeddingTableSpec(t, DIM, fusion_group="g", dynamic=_options(device=device))
                  for t in ("user", "item")]
        ec = EmbeddingCollection(
            tables, [EmbeddingFeatureSpec(n, t) for n, t in zip(names, ("user", "item"))],
            SparseAdam(lr=0.05), device)
        g, outputs = torch.Generator().manual_seed(5), []
        for _ in range(3):
            kjt = KeyedJaggedTensor.from_lengths(
                names, torch.randint(0, NUM_IDS, (2 * batch,), generator=g),
                torch.ones(2 * batch, dtype=torch.int64))
            kjt.host_layout()  # summarized on the CPU, as a loader worker does
            out = ec(kjt.to(device))
            outputs.append({k: v.detach().cpu() for k, v in out.pooled.items()})
            sum((t ** 2).sum() for t in out.pooled.values()).backward()
        return outputs, len(searched)
    finally:
        monkeypatch.delenv("HASHREC_FORCE_TRITON", raising=False)
        dispatch._forced.cache_clear()


def test_single_valued_features_skip_the_bag_search(monkeypatch):
    """Bags of one id whose host layout says so train like the reference without a
    search of the bags for their gradient rows."""
    reference, _ = _one_id_steps(monkeypatch, force=False)
    triton_path, searched = _one_id_steps(monkeypatch, force=True)
    assert searched == 0
    for step, (want, got) in enumerate(zip(reference, triton_path)):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5,
                                       msg=f"step {step} feature {name}")
