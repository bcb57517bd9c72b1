"""Training with data_type FP16 / BF16 tables: the trainer's run, its checkpoints, and a run
continued after the data_type changed."""

from __future__ import annotations

import logging

import pytest
import torch
from small_din import generate_data, small_loop

from hashrec.checkpoint import latest_checkpoint
from hashrec.checkpoint.layout import read_meta

DYNAMIC = ("user_id", "adgroup_id", "brand", "campaign_id", "customer", "cate_id")
# Every dynamic table of the fused storage 'deep' in float16 (the click sequence's
# sub-features read those tables in their data_type), a dense table in bfloat16.
HALF = {**{f"feature_configs[feature_name={name}].id_feature.data_type": "FP16"
           for name in DYNAMIC},
        "feature_configs[feature_name=cms_segid].id_feature.data_type": "BF16",
        "train_config.mixed_precision": "BF16"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate_data(out, seed=8)
    return out


def _dtypes(loop) -> dict[str, torch.dtype]:
    """Storage or dense table -> the dtype it keeps rows in."""
    embedding = loop.session.model.embedding
    out = {name: t.rows.dtype for name, t in embedding.dense_tables.items()}
    out.update({name: t.options.dtype for name, t in embedding.dynamic_tables().items()})
    return out


def _converted(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and "are converted to" in r.getMessage()]


def test_half_tables_train_save_and_continue_as_float32(data_dir, tmp_path, caplog):
    model_dir = tmp_path / "model"
    loop = small_loop(model_dir, edits=HALF)
    dtypes = _dtypes(loop)
    assert (dtypes["deep"], dtypes["cms_segid"], dtypes["age_level"]) == (
        torch.float16, torch.bfloat16, torch.float32)
    loop.run(str(data_dir))
    meta = read_meta(latest_checkpoint(str(model_dir)))
    assert meta["step"] == 4 and meta["tables"]["deep"]["dtype"] == "float16"
    dense = {d["table"]: d["dtype"] for d in meta["dense"]["model"]["dense_tables"].values()}
    assert dense["cms_segid"] == "bfloat16" and dense["age_level"] == "float32"

    # The run continued with every table in float32: the rows are converted.
    edits = {"train_config.mixed_precision": "BF16", "train_config.num_steps": 6}
    with caplog.at_level(logging.INFO):
        resumed = small_loop(model_dir, edits=edits, continue_train=True)
    assert set(_dtypes(resumed).values()) == {torch.float32}
    assert resumed.session.model.embedding.dynamic_tables()["deep"].size() > 0
    assert sorted(line.split(":")[0] for line in _converted(caplog)) == [
        "table 'cms_segid'", "table 'deep'"]
    resumed.run(str(data_dir))  # (a loss that is not finite stops a run with an error)
    meta = read_meta(latest_checkpoint(str(model_dir)))
    assert meta["step"] == 6 and meta["tables"]["deep"]["dtype"] == "float32"


def test_a_data_type_that_splits_a_fused_storage_restores_table_by_table(data_dir, tmp_path,
                                                                          caplog):
    """user_id leaves the fused storage for one of its own (float32 now): its rows come
    from the checkpoint's 'deep' storage, converted; the storage it left names it as
    restored elsewhere, not as skipped."""
    model_dir = tmp_path / "model"
    small_loop(model_dir, edits={**HALF, "train_config.num_steps": 2}).run(str(data_dir))
    saved = read_meta(latest_checkpoint(str(model_dir)))["tables"]
    assert "user_id" in saved["deep"]["tag_tables"] and "user_id" not in saved
    edits = {**HALF, "feature_configs[feature_name=user_id].id_feature.data_type": "FP32"}
    with caplog.at_level(logging.INFO):
        resumed = small_loop(model_dir, edits=edits, continue_train=True)
    tables = resumed.session.model.embedding.dynamic_tables()
    assert tables["user_id"].options.dtype == torch.float32 and tables["user_id"].size() > 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("restored into another storage: ['user_id']" in m for m in messages)
    assert not any("skipped" in m for m in messages)
    assert any("restored table by table" in m for m in messages)
