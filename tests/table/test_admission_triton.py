"""The admission counters' Triton count (``AdmissionCounter.count_masked``) against the
reference count (``AdmissionCounter.count``), the kernels interpreted on CPU tensors."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table.admission import AdmissionCounter  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="runs the kernels interpreted on CPU tensors")


@pytest.mark.parametrize("masks", [1, 0], ids=["segments", "tile"])
@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_triton_count_matches_reference_in_wide_buckets(monkeypatch, masks, tagged):
    """The Triton count (``count_masked``) against the reference count in 512-slot counter
    buckets whose counters fill every 128-slot segment: the same admissions, counters and
    evictions, whether the probe reads the buckets by segments or as one tile."""
    monkeypatch.setattr(find_tt, "MASK_PROBE", masks)
    gen = torch.Generator().manual_seed(7)
    cpu = torch.device("cpu")
    keys = torch.randint(-2**62, 2**62, (1200,), generator=gen).unique()[:1100]
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    tags = torch.randint(0, 3, (1100,), dtype=torch.int32, generator=gen) if tagged else None
    want = AdmissionCounter(6, capacity=1024, bucket_capacity=512, device=cpu)
    first = torch.randint(1, 3, (900,), generator=gen)
    # The reference ops (CPU tensors): 900 counters, every segment of both buckets in use.
    want.count(keys[:900], None if tags is None else tags[:900], first)
    got = AdmissionCounter(6, capacity=1024, bucket_capacity=512, device=cpu)
    for name in ("keys", "tags", "digests", "scores"):
        getattr(got.storage, name).copy_(getattr(want.storage, name))
    got.storage.tagged = want.storage.tagged
    slots = got.storage.digests.nonzero().squeeze(1)
    assert int(slots.max()) >= 384 + 512  # the last segment of the second bucket
    pick = torch.cat([torch.randperm(900, generator=gen)[:300], torch.arange(900, 1100)])
    pick = pick[torch.randperm(pick.numel(), generator=gen)]
    batch, batch_tags = keys[pick], None if tags is None else tags[pick]
    counts = torch.randint(1, 5, (pick.numel(),), generator=gen)
    expected, expected_totals = want.count(batch, batch_tags, counts)
    admitted, totals, evicted = got.count_masked(batch, batch_tags, counts,  # Triton
                                                 torch.ones_like(batch, dtype=torch.bool))
    assert torch.equal(admitted, expected) and bool(expected.any())
    assert torch.equal(totals, expected_totals)
    assert int(evicted.sum()) == want.evictions > 0

    def state(counter):
        k, t, c = counter.state()
        return sorted(zip(k.tolist(), t.tolist(), c.tolist()))
    assert state(got) == state(want)
