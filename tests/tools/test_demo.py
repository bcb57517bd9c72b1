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


def test_the_demo_trains_the_multi_task_example(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["--work_dir", str(tmp_path / "demo"), "--num_rows", "4000", "--eval_rows",
                 "1000", "--num_epochs", "1", "--config",
                 os.path.join("examples", "mmoe_taobao_dynamicemb.config")])
    assert code == 0
    done = [line for line in capsys.readouterr().out.splitlines() if "[demo] done" in line]
    assert len(done) == 1 and "auc_ctr" in done[0] and "auc_cvr" in done[0]


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
