"""The example configs of the match models and the configurable backbone train a few steps
on generated Taobao-like data, read from the paths they name (the generator's defaults);
the DSSM, DAT, match backbone and HSTU match examples' towers export and predict apart.
The dlrm_hstu example trains on generated KuaiRand-like data, exports and predicts each
row's candidates."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from hashrec import predict, train_eval
from hashrec.export.__main__ import main as export_main
from hashrec.tools.gen_kuairand_data import generate as generate_kuairand
from hashrec.tools.gen_taobao_data import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDITS = {"data_config.batch_size": 32, "data_config.num_workers": 0,
         "train_config.num_steps": 2}
SAMPLED = {"data_config.negative_sampler.num_sample": 16}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory holding data/taobao as the examples' comments generate it (small)."""
    work = tmp_path_factory.mktemp("examples")
    generate(str(work / "data" / "taobao"), 256, seed=4, scale=0.002, eval_rows=64,
             quiet=True, item_table=True)
    return work


def _train(workdir, monkeypatch, name: str, edits: dict) -> dict:
    """train_eval of ``examples/<name>`` in ``workdir`` (its relative paths read there);
    returns the last evaluation."""
    monkeypatch.chdir(workdir)
    config = os.path.join(ROOT, "examples", name)
    model_dir = workdir / name.replace(".config", "")
    assert train_eval.main(["--pipeline_config_path", config, "--model_dir", str(model_dir),
                            "--edit_config_json", json.dumps({**EDITS, **edits})]) == 0
    with open(model_dir / "eval_result.txt", encoding="utf-8") as f:
        result = json.loads(f.read().splitlines()[-1])
    assert result["step"] == 2 and result["num_examples"] == 64
    return result


@pytest.mark.parametrize("name, width", [("dssm", 64), ("dat", 32), ("match_backbone", 64),
                                         ("hstu_match", 64)])
def test_the_match_example_trains_and_its_towers_export_and_predict(workdir, monkeypatch,
                                                                     name, width):
    result = _train(workdir, monkeypatch, f"{name}_taobao_dynamicemb.config", SAMPLED)
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1
    assert result["softmax_cross_entropy"] > 0
    model_dir = workdir / f"{name}_taobao_dynamicemb"
    assert export_main(["--pipeline_config_path", str(model_dir / "pipeline.config"),
                       "--export_dir", f"export_{name}"]) == 0
    assert predict.main(["--scripted_model_path", f"export_{name}/user",
                         "--predict_input_path", "data/taobao/eval",
                         "--predict_output_path", f"{name}_users.parquet",
                         "--reserved_columns", "user_id"]) == 0
    assert predict.main(["--scripted_model_path", f"export_{name}/item",
                         "--predict_input_path", "data/taobao/items",
                         "--predict_output_path", f"{name}_items.parquet",
                         "--reserved_columns", "adgroup_id"]) == 0
    users, items = pq.read_table(f"{name}_users.parquet"), pq.read_table(f"{name}_items.parquet")
    assert users.column_names == ["user_tower_emb", "user_id"] and users.num_rows == 64
    catalog = pq.read_table("data/taobao/items").column("id")
    assert items.column("adgroup_id").equals(catalog)  # one embedding per item
    assert {len(e) for e in users.column("user_tower_emb").to_pylist()} == {width}
    assert {len(e) for e in items.column("item_tower_emb").to_pylist()} == {width}


def test_the_mind_example_trains_on_the_click_sequence(workdir, monkeypatch):
    result = _train(workdir, monkeypatch, "mind_taobao_dynamicemb.config", SAMPLED)
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1
    assert result["softmax_cross_entropy"] > 0


def test_the_dcn_backbone_example_trains(workdir, monkeypatch):
    result = _train(workdir, monkeypatch, "dcn_backbone_taobao_dynamicemb.config", {})
    assert 0 <= result["auc"] <= 1 and result["binary_cross_entropy"] > 0


def test_the_dlrm_hstu_example_trains_exports_and_predicts_each_candidate(workdir,
                                                                          monkeypatch):
    generate_kuairand(str(workdir / "data" / "kuairand"), 256, seed=4, scale=0.001,
                      eval_rows=64, quiet=True)
    result = _train(workdir, monkeypatch, "dlrm_hstu_kuairand_dynamicemb.config", {})
    assert 0 <= result["auc_is_click"] <= 1 and 0 <= result["grouped_auc_is_like"] <= 1
    assert result["binary_cross_entropy_is_follow"] > 0 and result["jrc_loss_is_like"] > 0
    assert result["l2_loss_watchtime"] > 0
    model_dir = workdir / "dlrm_hstu_kuairand_dynamicemb"
    assert export_main(["--pipeline_config_path", str(model_dir / "pipeline.config"),
                       "--export_dir", "export_dlrm_hstu"]) == 0
    assert predict.main(["--scripted_model_path", "export_dlrm_hstu",
                         "--predict_input_path", "data/kuairand/eval",
                         "--predict_output_path", "dlrm_hstu.parquet",
                         "--reserved_columns", "user_id"]) == 0
    predicted = pq.read_table("dlrm_hstu.parquet")
    assert predicted.num_rows == 64 and "probs_is_click" in predicted.column_names
    # a list a row: cand_seq's 8 candidate slots
    assert {len(p) for p in predicted.column("probs_is_click").to_pylist()} == {8}
    assert {len(p) for p in predicted.column("probs1_is_like").to_pylist()} == {8}
