"""The demo: its config edits fit the config it trains, and it prints every task's AUC."""

from __future__ import annotations

import os

import pytest

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.tools.demo import EXAMPLE_CONFIG, auc_summary, config_path, demo_edits, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQUENCE = "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length"


@pytest.mark.parametrize("name, sequence", [
    ("multi_tower_din_taobao_dynamicemb.config", True),
    ("mmoe_taobao_dynamicemb.config", False),
    ("dlrm_criteo_dynamicemb.config", False),
])
def test_the_edits_are_those_the_config_can_take(name, sequence):
    config = load_pipeline_config(os.path.join(ROOT, "examples", name))
    edits = demo_edits(512, 1, config)
    assert (SEQUENCE in edits) is sequence
    edited = apply_edit_config_json(config, edits)
    assert edited.data_config.batch_size == 512 and edited.train_config.num_epochs == 1


def test_auc_summary_names_each_task():
    assert auc_summary({"auc": 0.64412, "step": 3}) == "eval AUC 0.6441"
    assert auc_summary({"auc_ctr": 0.61, "auc_cvr": 0.655, "loss": 0.3}) == \
        "eval auc_ctr 0.6100, auc_cvr 0.6550"
    assert auc_summary({"mean_squared_error": 1.5}) == "no AUC in the evaluation"
    assert auc_summary({"recall@1": 0.15, "recall@5": 0.2612, "loss": 3.2}) == \
        "eval recall@1 0.1500, recall@5 0.2612"


def test_an_undefined_auc_reads_n_a():
    # eval_result.txt holds null for the AUC of rows of one class.
    assert auc_summary({"auc": None, "step": 2}) == \
        "eval AUC n/a (the evaluation rows hold one class)"
    assert auc_summary({"auc_ctr": 0.61, "auc_cvr": None}) == (
        "eval auc_ctr 0.6100, auc_cvr n/a (n/a: the evaluation rows hold one class of that "
        "task's label)")


def test_three_evaluation_rows_of_one_class_end_with_n_a(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["--work_dir", str(tmp_path / "demo"), "--num_rows", "200", "--eval_rows",
                 "3", "--num_epochs", "1"])
    assert code == 0
    (done,) = [line for line in capsys.readouterr().out.splitlines() if "[demo] done" in line]
    assert "eval AUC n/a (the evaluation rows hold one class) at step 1 on 3 rows" in done


@pytest.mark.parametrize("args, message", [
    (["--num_rows", "-5"], "argument --num_rows: must be >= 1, got -5"),
    (["--num_rows", "0"], "argument --num_rows: must be >= 1, got 0"),
    (["--eval_rows", "0"], "argument --eval_rows: must be >= 1, got 0"),
    (["--batch_size", "-1"], "argument --batch_size: must be >= 1, got -1"),
    (["--num_epochs", "0"], "argument --num_epochs: must be >= 1, got 0"),
    (["--scale", "0"], "argument --scale: must be > 0, got 0"),
], ids=["negative-rows", "no-rows", "no-eval-rows", "negative-batch", "no-epochs", "scale0"])
def test_bad_sizes_are_usage_errors_before_any_work(tmp_path, capsys, args, message):
    work = tmp_path / "demo"
    with pytest.raises(SystemExit) as stop:
        main(["--work_dir", str(work), *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not work.exists()


@pytest.mark.parametrize("below", [False, True], ids=["file", "below-a-file"])
def test_a_work_dir_that_cannot_be_a_directory_is_a_usage_error(tmp_path, capsys, below):
    (tmp_path / "afile").write_text("")
    work = tmp_path / "afile" / "demo" if below else tmp_path / "afile"
    with pytest.raises(SystemExit) as stop:
        main(["--work_dir", str(work)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"--work_dir '{work}' " in err and "name a directory" in err
    assert (tmp_path / "afile").read_text() == ""


def test_the_demo_trains_the_multi_task_example(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["--work_dir", str(tmp_path / "demo"), "--num_rows", "4000", "--eval_rows",
                 "1000", "--num_epochs", "1", "--config",
                 os.path.join("examples", "mmoe_taobao_dynamicemb.config")])
    assert code == 0
    done = [line for line in capsys.readouterr().out.splitlines() if "[demo] done" in line]
    assert len(done) == 1 and "auc_ctr" in done[0] and "auc_cvr" in done[0]


def test_the_demo_trains_a_match_example_on_the_generated_item_table(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["--work_dir", str(tmp_path / "demo"), "--num_rows", "200", "--eval_rows",
                 "50", "--batch_size", "64", "--num_epochs", "1", "--config",
                 os.path.join("examples", "dssm_taobao_dynamicemb.config")])
    assert code == 0
    assert (tmp_path / "demo" / "data" / "items" / "part-00000.parquet").exists()
    done = [line for line in capsys.readouterr().out.splitlines() if "[demo] done" in line]
    assert len(done) == 1 and "eval recall@1 " in done[0] and "on 50 rows" in done[0]


def test_the_default_config_is_found_outside_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_path(EXAMPLE_CONFIG) == os.path.join(ROOT, EXAMPLE_CONFIG)
    assert config_path("other.config") == "other.config"  # any other path as given
    (tmp_path / "examples").mkdir()
    (tmp_path / EXAMPLE_CONFIG).write_text("")  # the working directory's copy comes first
    assert config_path(EXAMPLE_CONFIG) == EXAMPLE_CONFIG


def test_an_unreadable_config_ends_the_demo_before_any_data_is_made(tmp_path, capsys):
    work = tmp_path / "demo"
    code = main(["--work_dir", str(work), "--config", str(tmp_path / "missing.config")])
    assert code == 1
    err = capsys.readouterr().err
    assert "[demo] error: cannot read pipeline config" in err and "missing.config" in err
    assert not work.exists()
