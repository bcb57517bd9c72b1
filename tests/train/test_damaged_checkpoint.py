"""Integration: train_eval, eval and export on a model_dir whose latest checkpoint has a
truncated or corrupted file name that file and the complete checkpoint before it; a dump
or an export directory given as a checkpoint is named as what it is, and another model's
checkpoint given to fine-tune from is refused."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from hashrec import eval as eval_cli
from hashrec import train_eval
from hashrec.export import __main__ as export_cli
from hashrec.tools.gen_taobao_data import generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")
EDITS = {"eval_input_path": "", "data_config.batch_size": 256, "data_config.num_workers": 0,
         "train_config.num_steps": 4, "train_config.save_checkpoints_steps": 2,
         "train_config.incremental_dump_steps": 2,
         "train_config.log_step_count_steps": 100,
         "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 8,
         "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
         "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [8],
         "model_config.multi_tower_din.final.hidden_units": [4]}
SHARD = os.path.join("dynamicemb", "deep", "rank-00000-of-00001.bin")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model_dir holding model.ckpt-2 and model.ckpt-4, and the data it was trained on."""
    root = tmp_path_factory.mktemp("damaged")
    data = root / "data"
    generate(str(data), 1500, seed=5, scale=0.001, quiet=True)
    model_dir = root / "model"
    assert train_eval.main(_args(model_dir, data)) == 0
    assert _checkpoints(model_dir) == ["model.ckpt-2", "model.ckpt-4"]
    return model_dir, data


def _checkpoints(model_dir) -> list[str]:
    return sorted(n for n in os.listdir(model_dir) if n.startswith("model.ckpt"))


def _args(model_dir, data, *extra: str) -> list[str]:
    return ["--pipeline_config_path", CONFIG, "--model_dir", str(model_dir),
            "--train_input_path", str(data), *extra, "--edit_config_json", json.dumps(EDITS)]


def _damaged_copy(trained, tmp_path, how: str):
    model_dir = tmp_path / "model"
    shutil.copytree(trained[0], model_dir)
    if how == "truncated":
        with open(model_dir / "model.ckpt-4" / "model.pt", "r+b") as f:
            f.truncate(1000)
    else:  # a flipped byte in the dynamic table's shard
        with open(model_dir / "model.ckpt-4" / SHARD, "r+b") as f:
            byte = f.read(1)
            f.seek(0)
            f.write(bytes([byte[0] ^ 0xFF]))
    return model_dir


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_continue_train_names_the_checkpoint_to_resume_from(trained, tmp_path, caplog, how):
    model_dir = _damaged_copy(trained, tmp_path, how)
    with caplog.at_level(logging.ERROR):
        code = train_eval.main(_args(model_dir, trained[1], "--continue_train"))
    assert code == 1
    [message] = _errors(caplog)
    bad = "model.pt: 1000 bytes" if how == "truncated" else f"{SHARD}: checksum mismatch"
    assert bad in message
    assert message.endswith(
        f"model.ckpt-4 is damaged: restore the file from a copy, or move model.ckpt-4 out of "
        f"{model_dir} and run again with --continue_train to resume from model.ckpt-2, the "
        f"complete checkpoint before it")
    assert _checkpoints(model_dir) == ["model.ckpt-2", "model.ckpt-4"]


def test_eval_and_export_of_a_model_dir_name_the_checkpoint_before(trained, tmp_path, caplog):
    model_dir = _damaged_copy(trained, tmp_path, "corrupted")
    with caplog.at_level(logging.ERROR):
        assert eval_cli.main(["--pipeline_config_path", CONFIG, "--model_dir", str(model_dir),
                              "--eval_input_path", str(trained[1]),
                              "--edit_config_json", json.dumps(EDITS)]) == 1
        assert export_cli.main(["--pipeline_config_path", CONFIG, "--checkpoint_path",
                                str(model_dir), "--export_dir", str(tmp_path / "export"),
                                "--edit_config_json", json.dumps(EDITS)]) == 1
    hint = (f"model.ckpt-4 is damaged: restore the file from a copy, or pass --checkpoint_path "
            f"{model_dir / 'model.ckpt-2'} (the complete checkpoint before it)")
    assert [m.endswith(hint) for m in _errors(caplog)] == [True, True]
    assert not os.path.exists(tmp_path / "export")
    assert not os.path.exists(model_dir / "eval_result.txt")


def test_fine_tune_from_a_damaged_checkpoint_names_the_one_before(trained, tmp_path, caplog):
    source = _damaged_copy(trained, tmp_path, "truncated")
    with caplog.at_level(logging.ERROR):
        code = train_eval.main(_args(tmp_path / "new", trained[1],
                                     "--fine_tune_checkpoint", str(source)))
    assert code == 1
    [message] = _errors(caplog)
    assert message.endswith(
        f"model.ckpt-4 is damaged: restore the file from a copy, or pass "
        f"--fine_tune_checkpoint {source / 'model.ckpt-2'} (the complete checkpoint before it)")


def test_the_only_checkpoint_damaged_says_there_is_none_before(trained, tmp_path, caplog):
    model_dir = _damaged_copy(trained, tmp_path, "truncated")
    shutil.rmtree(model_dir / "model.ckpt-2")
    with caplog.at_level(logging.ERROR):
        assert train_eval.main(_args(model_dir, trained[1], "--continue_train")) == 1
    [message] = _errors(caplog)
    assert message.endswith(f"model.ckpt-4 is damaged: restore the file from a copy (there is "
                            f"no complete checkpoint before it in {model_dir})")


def test_a_dump_or_an_export_given_as_a_checkpoint_says_what_to_pass(trained, tmp_path,
                                                                     caplog):
    from hashrec.tools.apply_delta import main as apply_delta_main

    dumps = trained[0] / "incremental"
    applied = tmp_path / "applied"
    assert apply_delta_main(["--base", str(dumps / "dump-000000000002"), "--delta",
                             str(dumps / "dump-000000000004"), "--output", str(applied)]) == 0
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "scripted_model.pt").write_text("")
    paths = [dumps / "dump-000000000004", applied, tmp_path / "export"]
    with caplog.at_level(logging.ERROR):
        for path in paths:
            assert eval_cli.main(["--pipeline_config_path", CONFIG, "--checkpoint_path",
                                  str(path), "--model_dir", str(tmp_path / "m"),
                                  "--eval_input_path", str(trained[1]),
                                  "--edit_config_json", json.dumps(EDITS)]) == 1
    instead = "pass a model_dir or one of its model.ckpt-<step> directories"
    dump = ("is an incremental dump or an apply_delta output ({}): dynamic tables without the "
            f"dense model, not a checkpoint; {instead}")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"TrainError: {str(paths[0])!r} {dump.format('delta')}",
        f"TrainError: {str(paths[1])!r} {dump.format('full')}",
        f"TrainError: {str(paths[2])!r} holds no complete checkpoint (model.ckpt-<step>/); "
        f"{instead} (an export directory is not one)"]


def test_fine_tune_from_another_models_checkpoint_is_an_error(trained, tmp_path, caplog):
    """A checkpoint that holds nothing of the model (a DLRM one on Criteo-like data given
    to the DIN config) would train from scratch under the name of a fine-tune: refused,
    before anything is trained or written."""
    from hashrec.tools.gen_criteo_data import generate as generate_criteo

    generate_criteo(str(tmp_path / "criteo"), 300, quiet=True)
    dlrm = os.path.join(ROOT, "examples", "dlrm_criteo_dynamicemb.config")
    other = tmp_path / "other"
    assert train_eval.main([
        "--pipeline_config_path", dlrm, "--model_dir", str(other), "--train_input_path",
        str(tmp_path / "criteo"), "--edit_config_json", json.dumps({
            "eval_input_path": "", "data_config.batch_size": 64, "data_config.num_workers": 0,
            "train_config.num_steps": 1})]) == 0
    with caplog.at_level(logging.ERROR):
        code = train_eval.main(_args(tmp_path / "new", trained[1],
                                     "--fine_tune_checkpoint", str(other)))
    assert code == 1
    [message] = _errors(caplog)
    assert message == (
        f"CheckpointError: {other / 'model.ckpt-1'}: fine-tuning would restore nothing: the "
        f"checkpoint holds none of this model's layers or tables in the same shape under the "
        f"same names (a checkpoint of another model?); pass a checkpoint of this model, map "
        f"renamed parts with train_config.fine_tune_ckpt_param_map, or leave the fine-tune "
        f"checkpoint out to start fresh")
    assert _checkpoints(tmp_path / "new") == []
