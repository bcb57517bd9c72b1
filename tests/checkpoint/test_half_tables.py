"""Tables storing float16 / bfloat16 rows (a feature's data_type) in checkpoints and dumps.

A checkpoint writes a table's rows in the table's dtype and names it in meta.json (and in
each shard's header). Restoring into a table of another dtype (the data_type changed
since the save) converts the rows, with one INFO line per table; so does a dense table's
state. Incremental dumps keep the dtype; a delta and a base of different dtypes are
refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from checkpoint_helpers import assert_same, snapshot, table_options, train_steps, trained_table
from torch import nn

from hashrec.checkpoint import (
    CheckpointError,
    IncrementalDumper,
    apply_deltas,
    restore_checkpoint,
    save_checkpoint,
)
from hashrec.checkpoint.layout import read_meta
from hashrec.checkpoint.restore import open_table_shards
from hashrec.embedding.dense_table import DenseTable
from hashrec.table import HashTable, SparseAdagrad

CONVERSIONS = [(torch.float32, torch.float16), (torch.float16, torch.float32),
               (torch.bfloat16, torch.float16)]
CONVERSION_IDS = ["fp32-to-fp16", "fp16-to-fp32", "bf16-to-fp16"]


def _saved_rows(path: str, name: str = "t") -> list[torch.Tensor]:
    meta = read_meta(path)
    return [chunk["rows"] for reader in open_table_shards(path, meta, name)
            for chunk in reader.iter_chunks("rows")]


def _conversions(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and "are converted to" in r.getMessage()]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_half_table_is_written_in_its_dtype_and_restored_exactly(tmp_path, dtype, caplog):
    table = trained_table(options=table_options(dtype=dtype))
    path = save_checkpoint(str(tmp_path), 8, None, None, {"t": table}, chunk_rows=7)
    assert read_meta(path)["tables"]["t"]["dtype"] == str(dtype).removeprefix("torch.")
    rows = _saved_rows(path)
    assert rows and all(chunk.dtype == dtype for chunk in rows)
    restored = HashTable(table_options(dtype=dtype))
    with caplog.at_level(logging.INFO):
        restore_checkpoint(path, None, None, {"t": restored})
    assert_same(snapshot(restored), snapshot(table))
    assert _conversions(caplog) == []


@pytest.mark.parametrize("saved, wanted", CONVERSIONS, ids=CONVERSION_IDS)
def test_a_table_of_another_dtype_converts_the_rows_with_an_info_line(tmp_path, saved, wanted,
                                                                       caplog):
    table = trained_table(options=table_options(dtype=saved))
    path = save_checkpoint(str(tmp_path), 8, None, None, {"t": table}, chunk_rows=7)
    restored = HashTable(table_options(dtype=wanted))
    with caplog.at_level(logging.INFO):
        restore_checkpoint(path, None, None, {"t": restored})
    got, want = snapshot(restored), snapshot(table)
    assert got["rows"].dtype == wanted
    assert torch.equal(got["rows"], want["rows"].to(wanted))
    for field in ("keys", "tags", "scores", "counter_keys", "counts"):
        assert torch.equal(got[field], want[field]), field
    (line,) = _conversions(caplog)
    assert f"table 't': rows saved as {str(saved)[6:]} are converted to {str(wanted)[6:]}" \
        in line


class _Model(nn.Module):
    """A dense table where a model keeps it (``embedding.dense_tables``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.embedding = nn.Module()
        self.embedding.dense_tables = nn.ModuleDict(
            {"cms_segid": DenseTable("cms_segid", 10, 4, SparseAdagrad(lr=0.1), dtype=dtype)})

    @property
    def rows(self) -> torch.Tensor:
        return self.embedding.dense_tables["cms_segid"].rows


@pytest.mark.parametrize("saved, wanted", CONVERSIONS, ids=CONVERSION_IDS)
def test_dense_tables_record_their_dtype_and_convert_on_restore(tmp_path, saved, wanted,
                                                                caplog):
    model = _Model(saved)
    model.embedding.dense_tables["cms_segid"].apply_gradients(torch.tensor([1, 3]),
                                                               torch.ones(2, 4))
    path = save_checkpoint(str(tmp_path), 5, model, None, {})
    (described,) = read_meta(path)["dense"]["model"]["dense_tables"].values()
    assert described["dtype"] == str(saved).removeprefix("torch.")
    for restore_optimizer in (True, False):
        restored = _Model(wanted)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            restore_checkpoint(path, restored, None, {}, restore_optimizer=restore_optimizer)
        assert restored.rows.dtype == wanted
        assert torch.equal(restored.rows[:, :4], model.rows[:, :4].to(wanted))
        assert len(_conversions(caplog)) == 1 and "'cms_segid'" in _conversions(caplog)[0]
    assert torch.equal(restored.rows[:, 4:], torch.zeros(10, 4, dtype=wanted))


def _dumps(tmp_path, dtype: torch.dtype) -> tuple[HashTable, list[str]]:
    table = HashTable(table_options(max_capacity=96, dtype=dtype))
    dumper = IncrementalDumper(str(tmp_path / "dumps"), {"t": table}, interval_steps=2,
                               chunk_rows=10)
    paths = []
    for step in range(1, 8):
        train_steps(table, step, step, tagged=True)
        path = dumper.maybe_dump(step)
        if path is not None:
            paths.append(path)
    return table, paths


def test_half_dumps_and_deltas_rebuild_the_table(tmp_path):
    table, paths = _dumps(tmp_path, torch.float16)
    assert [read_meta(p)["kind"] for p in paths] == ["full", "delta", "delta", "delta"]
    assert all(read_meta(p)["tables"]["t"]["dtype"] == "float16" for p in paths)
    assert all(chunk.dtype == torch.float16 for p in paths for chunk in _saved_rows(p))
    out = str(tmp_path / "applied")
    apply_deltas(paths[0], paths[1:], out, chunk_rows=7)
    restored = HashTable(table_options(max_capacity=96, dtype=torch.float16))
    restore_checkpoint(out, None, None, {"t": restored})
    got, want = snapshot(restored), snapshot(table)  # the last dump is of the last step
    for field in ("keys", "tags", "rows", "scores"):  # (admission counters are not dumped)
        assert torch.equal(got[field], want[field]), field


def test_a_delta_of_another_dtype_than_its_base_is_refused(tmp_path):
    _, paths = _dumps(tmp_path, torch.float16)
    delta = str(tmp_path / "delta-fp32")
    shutil.copytree(paths[1], delta)
    meta_path = os.path.join(delta, "meta.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    meta["tables"]["t"]["dtype"] = "float32"
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match="table 't' has dtype float32, the base has "
                                              "float16; its features' data_type changed"):
        apply_deltas(paths[0], [delta], str(tmp_path / "out"))
