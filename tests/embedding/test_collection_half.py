"""Tables storing float16 / bfloat16 rows on the CPU reference path.

Their lookups return float32 to the model, and a sparse update computes in float32 and
stores the result rounded to the table's dtype: from the same rows, one step of a half
collection leaves exactly the rows a float32 collection reaches, rounded. Optimizer state
is stored in the table's dtype too, so float16 loses squared gradients below its range
(warned of when the collection is built).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

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

from hashrec.embedding.dense_table import DenseTable
from hashrec.table import InitializerArgs
from hashrec.table.optim import float16_state_floor


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


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad", "adam"])
def test_float16_squared_gradient_state_is_lost_below_the_floor_it_warns_of(name, caplog):
    """The hazard of FP16 with these optimizers, measured: squared-gradient state that
    starts at 0 stays 0 from gradients under ``float16_state_floor``, not above it."""
    optimizer = OPTIMIZERS[name]
    floor = float16_state_floor(optimizer)
    for scale, kept in ((0.9, False), (1.1, True)):
        table = DenseTable("t", 1, 4, optimizer, InitializerArgs(mode="CONSTANT", value=0.0),
                           dtype=torch.float16)
        table.advance_step()
        table.apply_gradients(torch.tensor([0]), torch.full((1, 4), scale * floor))
        squares = table.rows[0, -1]  # the accumulator, or Adam's last second moment
        assert bool(squares > 0) is kept, scale
    with caplog.at_level(logging.WARNING):
        half_collection(torch.float16, optimizer)
    warned = sorted(r.getMessage().split(" keeps")[0] for r in caplog.records
                    if r.levelno == logging.WARNING and "float16" in r.getMessage())
    assert warned == ["storage 'brand'", "storage 'cate'", "storage 'g'", "storage 'user'"]


def test_no_warning_for_bfloat16_or_stateless_float16(caplog):
    assert float16_state_floor(OPTIMIZERS["sgd"]) is None
    # An accumulator starting at a float16 value above 0 never rounds back to 0.
    for name in ("adagrad", "rowwise_adagrad"):
        kept = dataclasses.replace(OPTIMIZERS[name], initial_accumulator_value=0.1)
        assert float16_state_floor(kept) is None
        tiny = dataclasses.replace(OPTIMIZERS[name], initial_accumulator_value=2.0 ** -26)
        assert torch.tensor(2.0 ** -26, dtype=torch.float16) == 0
        assert float16_state_floor(tiny) is not None
    with caplog.at_level(logging.WARNING):
        half_collection(torch.bfloat16, OPTIMIZERS["adam"])
        half_collection(torch.float16, OPTIMIZERS["sgd"])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _float16_warnings(ctx) -> list[str]:
    """The float16-state warnings of building the half collection on this rank."""
    from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep(logging.WARNING)
    logging.getLogger("hashrec").addHandler(keep)
    try:
        EmbeddingCollection([EmbeddingTableSpec("cate", 4, num_rows=8, dtype=torch.float16)],
                            [EmbeddingFeatureSpec("c", "cate")], OPTIMIZERS["adam"], "cpu",
                            dist=ctx)
    finally:
        logging.getLogger("hashrec").removeHandler(keep)
    return [m for m in seen if "float16" in m]


def test_float16_state_warning_comes_from_rank_0_alone(tmp_path):
    """Every rank builds the same storages: the warning is logged once, not per rank."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "distributed"))
    from dist_workers import run_world

    warned = run_world({"build": _float16_warnings}, 2, tmp_path)["build"]
    assert [len(w) for w in warned] == [1, 0], warned
