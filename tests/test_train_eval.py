"""Integration: the train_eval and eval command lines on small generated Taobao-like data."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.tools.gen_taobao_data import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")

pytestmark = pytest.mark.slow

EDITS = {
    "data_config.batch_size": 512,
    "data_config.num_workers": 0,
    "train_config.num_epochs": 2,
    "train_config.save_checkpoints_steps": 20,
    "train_config.keep_checkpoint_max": 2,
    "train_config.log_step_count_steps": 10,
    "train_config.incremental_dump_steps": 20,
    "train_config.sparse_optimizer.adagrad_optimizer.lr": 0.05,
    "train_config.dense_optimizer.adam_optimizer.lr": 0.003,
    "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 20,
    "model_config.multi_tower_din.towers[0].mlp.hidden_units": [64, 32],
    "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [32],
    "model_config.multi_tower_din.final.hidden_units": [16],
}


def run(module: str, *args: str, edits: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, *args]
    if edits is not None:
        cmd += ["--edit_config_json", json.dumps(edits)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), 20000, seed=3, scale=0.001, eval_rows=5000, quiet=True)
    return out


def train_args(data_dir, model_dir, *extra):
    return ("--pipeline_config_path", CONFIG, "--model_dir", str(model_dir),
            "--train_input_path", str(data_dir / "train"),
            "--eval_input_path", str(data_dir / "eval"), *extra)


def eval_results(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "eval_result.txt"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def checkpoint_steps(model_dir) -> list[int]:
    return sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(f"{model_dir}/model.ckpt-*"))


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run") / "model"
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir), edits=EDITS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model_dir, proc


def test_train_eval_writes_checkpoints_config_and_results(trained):
    model_dir, proc = trained
    steps = checkpoint_steps(model_dir)
    # 20000 rows / 512 = 39 full batches (+1 partial) per epoch, 2 epochs; keep_checkpoint_max 2.
    assert len(steps) == 2 and steps[-1] >= 78
    for step in steps:
        assert os.path.isfile(os.path.join(model_dir, f"model.ckpt-{step}", "meta.json"))
    assert os.path.isfile(os.path.join(model_dir, "pipeline.config"))
    results = eval_results(model_dir)
    assert [r["step"] for r in results][-1] == steps[-1]
    assert all({"auc", "step", "loss"} <= set(r) for r in results)
    assert results[-1]["checkpoint"] == os.path.join(model_dir, f"model.ckpt-{steps[-1]}")
    assert "samples/s" in proc.stderr and "load" in proc.stderr


def _table_contents(root: str) -> dict[str, dict[tuple[int, int], list[float]]]:
    """{table: {(key, tag): row}} of every shard under ``root/dynamicemb``."""
    from hashrec.checkpoint.shard_file import ShardReader

    out: dict[str, dict] = {}
    for header in glob.glob(os.path.join(root, "dynamicemb", "*", "rank-*.json")):
        table = out.setdefault(os.path.basename(os.path.dirname(header)), {})
        for chunk in ShardReader(header[:-len(".json")]).iter_chunks("rows"):
            for key, tag, row in zip(chunk["keys"].tolist(), chunk["tags"].tolist(),
                                     chunk["rows"].tolist()):
                table[(key, tag)] = row
    return out


def test_incremental_dumps_rebuild_the_checkpointed_tables(trained, tmp_path):
    model_dir, _ = trained
    dumps = sorted(glob.glob(f"{model_dir}/incremental/dump-*"))
    steps = [int(os.path.basename(d).split("-")[1]) for d in dumps]
    assert steps == list(range(20, 20 * len(steps) + 1, 20)) and len(steps) >= 3
    kinds = [json.load(open(os.path.join(d, "meta.json")))["kind"] for d in dumps]
    assert kinds == ["full"] + ["delta"] * (len(dumps) - 1)
    out = tmp_path / "applied"
    proc = run("hashrec.tools.apply_delta", "--base", dumps[0],
               *[arg for d in dumps[1:] for arg in ("--delta", d)], "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Full dump + deltas equal the checkpoint of the last dump's step (kept: it is one of
    # the two newest, as checkpoints and dumps both fall every 20 steps).
    checkpoint = os.path.join(model_dir, f"model.ckpt-{steps[-1]}")
    applied = _table_contents(str(out))
    assert applied and all(applied.values())
    assert applied == _table_contents(checkpoint)


def test_planted_signal_is_learned(trained):
    model_dir, _ = trained
    # The planted click model gives about 0.66 here; a model that learned nothing gives 0.5.
    assert eval_results(model_dir)[-1]["auc"] > 0.6


def test_refuses_to_overwrite_checkpoints(trained, data_dir):
    model_dir, _ = trained
    before = checkpoint_steps(model_dir)
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir), edits=EDITS)
    assert proc.returncode != 0
    assert "--continue_train" in proc.stderr
    assert checkpoint_steps(model_dir) == before


def test_model_dir_that_is_a_file_is_one_error_line(data_dir, tmp_path):
    target = tmp_path / "model"
    target.write_text("mine")
    proc = run("hashrec.train_eval", *train_args(data_dir, target), edits=EDITS)
    assert proc.returncode == 1
    assert f"TrainError: model_dir {str(target)!r} is a file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert target.read_text() == "mine"


def test_eval_restores_the_checkpoint_exactly(trained):
    model_dir, _ = trained
    last = eval_results(model_dir)[-1]
    proc = run("hashrec.eval", "--pipeline_config_path", str(model_dir / "pipeline.config"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = eval_results(model_dir)[-1]
    assert again["step"] == last["step"]
    assert again["auc"] == pytest.approx(last["auc"], abs=1e-9)
    assert again["loss"] == pytest.approx(last["loss"], rel=1e-5)


def test_eval_result_filename_keeps_another_evaluation_out_of_eval_result(trained):
    # eval_result.txt picks the best checkpoint and tells --continue_train what was
    # evaluated: an evaluation of other input goes to a file of its own (TorchEasyRec's
    # --eval_result_filename).
    model_dir, _ = trained
    before = (model_dir / "eval_result.txt").read_text()
    proc = run("hashrec.eval", "--pipeline_config_path", str(model_dir / "pipeline.config"),
               "--eval_result_filename", "holdout/eval_result_b.txt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (model_dir / "eval_result.txt").read_text() == before
    lines = (model_dir / "holdout" / "eval_result_b.txt").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == checkpoint_steps(model_dir)[-1]


def test_eval_into_an_unwritable_result_file_is_one_error_line(trained, tmp_path):
    model_dir, _ = trained
    (tmp_path / "eval_result.txt").mkdir()  # cannot be appended to, even by root
    proc = run("hashrec.eval", "--pipeline_config_path", str(model_dir / "pipeline.config"),
               "--model_dir", str(tmp_path), "--checkpoint_path", str(model_dir))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"TrainError: cannot append the evaluation result of step {checkpoint_steps(model_dir)[-1]}"
        f" to {tmp_path / 'eval_result.txt'}: Is a directory; the result is in the log line "
        f"above")
    assert "INFO hashrec.train: eval at step" in proc.stderr


def test_train_eval_into_an_unwritable_result_file_keeps_the_checkpoint(data_dir, tmp_path):
    model_dir = tmp_path / "model"
    (model_dir / "eval_result.txt").mkdir(parents=True)
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir),
               edits={**EDITS, "train_config.num_steps": 20})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"Is a directory; the result is in the log line above; the checkpoint "
        f"{model_dir / 'model.ckpt-20'} is saved (--continue_train resumes from it)")
    assert checkpoint_steps(model_dir) == [20]


def test_continue_train_resumes_from_latest(trained, data_dir):
    model_dir, _ = trained
    latest = checkpoint_steps(model_dir)[-1]
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir, "--continue_train"),
               edits={**EDITS, "train_config.num_epochs": 3, "train_config.num_steps": latest + 10})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"continuing from {model_dir}/model.ckpt-{latest} (step {latest})" in proc.stderr
    steps = checkpoint_steps(model_dir)
    assert steps[-1] == latest + 10 and len(steps) == 2
    assert eval_results(model_dir)[-1]["step"] == steps[-1]


def test_failed_continue_leaves_the_model_dirs_config(trained, data_dir):
    model_dir, _ = trained
    config = (model_dir / "pipeline.config").read_text()
    before = checkpoint_steps(model_dir)
    edits = {**EDITS, "feature_configs[feature_name=cms_segid].id_feature.embedding_dim": 8}
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir, "--continue_train"),
               edits=edits)
    assert proc.returncode == 1 and "CheckpointError" in proc.stderr
    assert (model_dir / "pipeline.config").read_text() == config
    assert checkpoint_steps(model_dir) == before


def test_a_missing_eval_input_is_found_before_training(data_dir, tmp_path):
    model_dir = tmp_path / "model"
    args = [arg if arg != str(data_dir / "eval") else str(tmp_path / "no_eval")
            for arg in train_args(data_dir, model_dir)]
    proc = run("hashrec.train_eval", *args, edits=EDITS)
    assert proc.returncode == 1 and "no_eval" in proc.stderr
    assert "Traceback" not in proc.stderr and checkpoint_steps(model_dir) == []


def test_eval_without_an_eval_input_names_the_setting(tmp_path, caplog):
    import logging

    from hashrec.eval import main

    with caplog.at_level(logging.ERROR):
        code = main(["--pipeline_config_path", CONFIG, "--model_dir", str(tmp_path),
                     "--edit_config_json", '{"eval_input_path": ""}'])
    assert code == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "TrainError: no eval input: set eval_input_path in the config or pass "
        "--eval_input_path"]


@pytest.mark.parametrize("module", ["hashrec.train_eval", "hashrec.eval"])
def test_help(module):
    proc = run(module, "--help")
    assert proc.returncode == 0 and "--pipeline_config_path" in proc.stdout


def _swapped_config(model_dir, out) -> str:
    """The run's pipeline.config with the brand and campaign_id feature blocks swapped
    (both share the fused dynamic storage, so their tags swap)."""
    from google.protobuf import text_format

    from hashrec.config import load_pipeline_config

    config = load_pipeline_config(str(model_dir / "pipeline.config"))
    features = list(config.feature_configs)
    names = [f.id_feature.feature_name for f in features]
    i, j = names.index("brand"), names.index("campaign_id")
    features[i], features[j] = features[j], features[i]
    del config.feature_configs[:]
    config.feature_configs.extend(features)
    path = str(out / "swapped.config")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(config))
    return path


def test_reordered_feature_configs_evaluate_the_same(trained, tmp_path):
    model_dir, _ = trained
    last = eval_results(model_dir)[-1]
    proc = run("hashrec.eval", "--pipeline_config_path", _swapped_config(model_dir, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = eval_results(model_dir)[-1]
    assert again["step"] == last["step"]
    assert again["auc"] == pytest.approx(last["auc"], abs=1e-9)
    assert again["loss"] == pytest.approx(last["loss"], rel=1e-5)


def test_continue_with_another_sparse_optimizer_without_its_state(trained, data_dir, tmp_path):
    source, _ = trained
    model_dir = tmp_path / "model"
    shutil.copytree(source, model_dir)
    latest = checkpoint_steps(model_dir)[-1]
    edits = {**EDITS, "train_config.num_epochs": 3, "train_config.num_steps": latest + 5,
             "train_config.sparse_optimizer.adam_optimizer.lr": 0.001}
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir, "--continue_train"),
               edits=edits)
    assert proc.returncode != 0 and "--ignore_restore_optimizer" in proc.stderr
    proc = run("hashrec.train_eval", *train_args(data_dir, model_dir, "--continue_train",
                                                 "--ignore_restore_optimizer"), edits=edits)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checkpoint_steps(model_dir)[-1] == latest + 5


@pytest.fixture(scope="module")
def small_parts(tmp_path_factory):
    """Two small train files and one eval file (from ``generate``)."""
    out = tmp_path_factory.mktemp("small")
    generate(str(out), 1200, num_files=2, seed=5, scale=0.001, eval_rows=300, quiet=True)
    return out


SMALL_EDITS = {**EDITS, "data_config.batch_size": 128, "data_config.num_workers": 2,
               "train_config.num_epochs": 1, "train_config.num_steps": 4}


def small_run(small_parts, train_path, model_dir) -> subprocess.CompletedProcess:
    return run("hashrec.train_eval", "--pipeline_config_path", CONFIG, "--model_dir",
               str(model_dir), "--train_input_path", str(train_path), "--eval_input_path",
               str(small_parts / "eval"), edits=SMALL_EDITS)


def test_files_without_rows_are_skipped(small_parts, tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    parts = sorted((small_parts / "train").glob("*.parquet"))
    empty = pq.read_table(parts[0]).slice(0, 0)
    for i, name in enumerate(["part-0", "part-1-empty", "part-2", "part-3-empty"]):
        target = train / f"{name}.parquet"
        if name.endswith("empty"):
            pq.write_table(empty, target)
        else:
            shutil.copy(parts[i // 2], target)
    proc = small_run(small_parts, train, tmp_path / "model")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipping 2 of 4 input files that have no rows" in proc.stderr
    assert checkpoint_steps(tmp_path / "model") == [4]


def test_a_bad_value_read_in_a_worker_is_one_clear_error(small_parts, tmp_path):
    table = pq.read_table(sorted((small_parts / "train").glob("*.parquet"))[0])
    clk = table.column("clk").to_pylist()
    clk[300] = 2  # in the third batch of 128 rows
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("clk"), "clk",
                                    pa.array(clk, pa.int64())), bad)
    proc = small_run(small_parts, bad, tmp_path / "model")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].endswith(f"DataError: {bad}: label column 'clk' row 300: value 2 is not in "
                              f"[0, 1]; binary_cross_entropy trains on labels in [0, 1] (0/1, "
                              f"or a soft label such as a rate; fix the data or choose another "
                              f"label column)")
