"""zch_to_dynamicemb_convert: a trained ZCH model -> dynamicemb checkpoint, same predictions."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from migration_helpers import (
    NUM_ITEMS,
    NUM_USERS,
    batch_of,
    dynamicemb_block,
    session_of,
    write_config,
    write_data,
    zch_block,
)

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.tools.dynamicemb.errors import MigrationError
from hashrec.tools.dynamicemb.zch_to_dynamicemb_convert import build_parser, convert, main
from hashrec.train import train_and_evaluate

USERS = list(range(1000, 1000 + NUM_USERS + 2))
ITEMS = [5000 + i % (NUM_ITEMS + 1) for i in range(len(USERS))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A ZCH model (user_id: zch with evictions; item_id: dynamicemb) after training."""
    root = tmp_path_factory.mktemp("zch")
    data = write_data(str(root / "data" / "train.parquet"), rows=768)
    config = write_config(str(root / "zch.config"), zch_block(size=24, interval=3),
                          dynamicemb_block(), str(root / "m"), os.path.dirname(data))
    train_and_evaluate(load_pipeline_config(config))
    return root, config, latest_checkpoint(str(root / "m"))


def _predict(config: str, checkpoint: str, restore_optimizer: bool = True) -> torch.Tensor:
    session = session_of(config)
    restore_checkpoint(checkpoint, session.model, None, session.model.embedding.dynamic_tables(),
                       restore_optimizer=restore_optimizer)
    session.model.eval()
    with torch.no_grad():
        return session.model(batch_of(session, USERS, ITEMS, [i % 5 for i in ITEMS]))["probs"]


@pytest.mark.parametrize("world_size", [None, 2])
@pytest.mark.parametrize("strategy", ["LFU", "STEP"])
def test_converted_checkpoint_predicts_like_the_zch_model(trained, tmp_path, world_size,
                                                          strategy):
    root, source_config, source = trained
    target_config = write_config(str(tmp_path / "dyn.config"), dynamicemb_block(
        score_strategy=strategy), dynamicemb_block())
    args = ["--source_checkpoint_path", source, "--source_pipeline_config_path", source_config,
            "--target_pipeline_config_path", target_config, "--save_dir", str(tmp_path / "c")]
    if world_size:
        args += ["--world_size", str(world_size)]
    assert main(args) == 0
    converted = str(tmp_path / "c" / "model.ckpt-0")
    with open(os.path.join(converted, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["world_size"] == (world_size or 1)
    # Same options as item_id: user_id now fuses with it; otherwise a storage of its own.
    assert sorted(meta["tables"]) == (["deep"] if strategy == "LFU" else ["item_id", "user_id"])
    expected = _predict(source_config, source)
    torch.testing.assert_close(_predict(target_config, converted, False), expected)

    restored = session_of(source_config)
    restore_checkpoint(source, restored.model, None, restored.model.embedding.dynamic_tables())
    remapper = restored.model.embedding.zch_remappers["user_id"]
    keys, _, counts, last = remapper.assigned()
    target = session_of(target_config)
    tables = target.model.embedding.dynamic_tables()
    restore_checkpoint(converted, target.model, None, tables, restore_optimizer=False)
    storage, tag = target.model.embedding.table_locations()["user_id"]
    got = {}
    for k, tags, rows, scores in tables[storage].export_state(1000):
        for key, key_tag, row, score in zip(k.tolist(), tags.tolist(), rows, scores.tolist()):
            if key_tag == tag:
                got[key] = (row, score)
    assert sorted(got) == sorted(keys.tolist())
    want = dict(zip(keys.tolist(), (counts if strategy == "LFU" else last).tolist()))
    assert all(got[key][1] == want[key] for key in got)
    assert all(torch.all(row[4:] == 0) for row, _ in got.values())  # fresh Adagrad state


def test_converter_keeps_dense_and_non_zch_state(trained, tmp_path):
    _, source_config, source = trained
    target_config = write_config(str(tmp_path / "dyn.config"), dynamicemb_block(),
                                 dynamicemb_block())
    converted = convert(source, load_pipeline_config(source_config),
                        load_pipeline_config(target_config), str(tmp_path / "c"))
    src = session_of(source_config)
    restore_checkpoint(source, src.model, None, src.model.embedding.dynamic_tables())
    dst = session_of(target_config)
    restore_checkpoint(converted, dst.model, None, dst.model.embedding.dynamic_tables())
    src_state, dst_state = src.model.state_dict(), dst.model.state_dict()
    for key, value in dst_state.items():
        torch.testing.assert_close(value, src_state[key])
    src_rows = {int(k): r for k, _, rows, _ in src.model.embedding.dynamic_tables()["item_id"]
                .export_state(1000) for k, r in zip(k, rows)}
    dst_rows = {int(k): r for k, t, rows, _ in dst.model.embedding.dynamic_tables()["deep"]
                .export_state(1000) for k, tag, r in zip(k, t, rows) if tag == 1}
    assert src_rows.keys() == dst_rows.keys()
    assert all(torch.equal(src_rows[k], dst_rows[k]) for k in src_rows)  # with Adagrad state


def test_rows_are_written_in_the_targets_data_type(trained, tmp_path, caplog):
    _, source_config, source = trained
    target_config = write_config(str(tmp_path / "half.config"),
                                 dynamicemb_block() + ' data_type: "BF16"', dynamicemb_block(),
                                 cate='num_buckets: 5 data_type: "FP16"')
    with caplog.at_level(logging.INFO):
        converted = convert(source, load_pipeline_config(source_config),
                            load_pipeline_config(target_config), str(tmp_path / "c"))
    with open(os.path.join(converted, "meta.json"), encoding="utf-8") as f:
        tables = json.load(f)["tables"]
    assert {name: t["dtype"] for name, t in tables.items()} == {
        "user_id": "bfloat16", "item_id": "float32"}  # of other dtypes: not fused
    assert any("cate.rows" in r.getMessage() and "torch.float16" in r.getMessage()
               for r in caplog.records)
    src = session_of(source_config)
    restore_checkpoint(source, src.model, None, src.model.embedding.dynamic_tables())
    dst = session_of(target_config)
    restore_checkpoint(converted, dst.model, None, dst.model.embedding.dynamic_tables())
    cate = dst.model.embedding.dense_tables["cate"].rows
    assert cate.dtype == torch.float16
    assert torch.equal(cate, src.model.embedding.dense_tables["cate"].rows.half())
    keys, slots, _, _ = src.model.embedding.zch_remappers["user_id"].assigned()
    want = src.model.embedding.dense_tables["user_id"].rows[slots, :4].to(torch.bfloat16)
    got, found = dst.model.embedding.dynamic_tables()["user_id"].find(keys)
    assert bool(found.all()) and torch.equal(got, want.float())


def test_target_must_make_zch_tables_dynamic(trained, tmp_path):
    _, source_config, source = trained
    target_config = write_config(str(tmp_path / "t.config"), "num_buckets: 2000",
                                 dynamicemb_block())
    with pytest.raises(MigrationError, match="'user_id': zch in the source but not a "
                                             "dynamicemb table"):
        convert(source, load_pipeline_config(source_config), load_pipeline_config(target_config),
                str(tmp_path / "c"))
    assert not os.path.exists(tmp_path / "c" / "model.ckpt-0")


def test_swapped_configs_are_one_error_before_the_source_is_read(trained, tmp_path, capsys,
                                                                 caplog):
    root, source_config, source = trained
    target_config = write_config(str(tmp_path / "t.config"), dynamicemb_block(),
                                 dynamicemb_block())
    with caplog.at_level(logging.WARNING):
        assert main(["--source_checkpoint_path", source, "--source_pipeline_config_path",
                     target_config, "--target_pipeline_config_path", source_config,
                     "--save_dir", str(tmp_path / "c")]) == 1
    assert capsys.readouterr().err == (
        "error: the source config has no zch feature; nothing to convert "
        "(--source_pipeline_config_path is the config with zch, "
        "--target_pipeline_config_path the one with dynamicemb)\n")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not os.path.exists(tmp_path / "c")


def test_zch_model_exports_hash_maps_and_predicts_like_eval(trained, tmp_path):
    from hashrec.data import create_dataloader
    from hashrec.export import export_model
    from hashrec.export.loading import model_inputs

    root, config, source = trained
    export_model(load_pipeline_config(config), str(tmp_path / "e"), source)
    with open(tmp_path / "e" / "model-000000-of-000001.json", encoding="utf-8") as f:
        entries = json.load(f)
    assert entries["user_id"]["is_hashmap"]  # raw id -> its slot's row
    scripted = torch.jit.load(str(tmp_path / "e" / "scripted_model.pt"))
    session = session_of(config)
    restore_checkpoint(source, session.model, None, session.model.embedding.dynamic_tables())
    session.model.eval()
    batches = create_dataloader(session.config.data_config, session.feature_set,
                                str(root / "data"), "predict", batch_size=64)
    probs, expected = [], []
    with torch.no_grad():
        for batch in batches:
            probs.append(scripted(*model_inputs(batch, set()))["probs"])
            expected.append(session.model(batch)["probs"])
    torch.testing.assert_close(torch.cat(probs), torch.cat(expected), atol=1e-5, rtol=0)


def test_world_size_as_nnodes_times_nproc_is_multiplied():
    required = ["--source_checkpoint_path", "c", "--source_pipeline_config_path", "p1",
                "--target_pipeline_config_path", "p2", "--save_dir", "s"]
    assert build_parser().parse_args(required + ["--world_size", "2 * 4"]).world_size == 8
    assert build_parser().parse_args(required).world_size is None
