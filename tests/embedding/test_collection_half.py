"""Tables storing float16 / bfloat16 rows on the CPU reference path.

Their lookups return float32 to the model, and a sparse update computes in float32 and
stores the result rounded to the table's dtype: from the same rows, one step of a half
collection leaves exactly the rows a float32 collection reaches, rounded.
"""

from __future__ import annotations

import pytest
import torch
from half_tables import (
    HALF,
    KEYS,
    OPTIMIZERS,
    batch,
    half_collection,
    linear_loss,
    preload,
    start_rows,
    table_rows,
)


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_one_step_stores_the_float32_step_rounded(optimizer, dtype, make_kjt):
    rows = start_rows(optimizer, dtype)
    half, full = half_collection(dtype, optimizer), half_collection(torch.float32, optimizer)
    for collection in (half, full):
        preload(collection, rows)
    kjt = batch(make_kjt, 0)
    outs = [c(kjt) for c in (half, full)]
    for name in KEYS[:-1]:
        assert outs[0].pooled[name].dtype == torch.float32
        assert torch.equal(outs[0].pooled[name], outs[1].pooled[name]), name
    assert outs[0].sequences["h"][0].dtype == torch.float32
    for out in outs:
        linear_loss(out).backward()
    got, want = table_rows(half), table_rows(full)
    for name, stored in got.items():
        assert stored.dtype == dtype
        assert torch.equal(stored, want[name].to(dtype)), name
        assert not torch.equal(stored, rows[name]), f"{name} was not updated"


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
def test_new_rows_start_from_the_float32_draw_rounded(dtype, make_kjt):
    half = half_collection(dtype, OPTIMIZERS["adam"])
    full = half_collection(torch.float32, OPTIMIZERS["adam"])
    kjt = batch(make_kjt, 1)
    with torch.no_grad():
        half(kjt), full(kjt)
    got, want = table_rows(half), table_rows(full)
    assert got.keys() == want.keys()
    for name, stored in got.items():
        assert stored.shape[0] > 0 and torch.equal(stored, want[name].to(dtype)), name
