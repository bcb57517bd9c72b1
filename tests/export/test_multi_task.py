"""Integration: SimpleMultiTask, MMoE, DBMTL, DC2VR, PLE and PEPNet (also with towers per
domain) with two labels through train_eval, export and predict.

Generated Taobao-like data has its second label ``buy`` replaced by a denser one (a
clicked row under a price bought), so that 300 evaluation rows hold enough of them; the
model trains one epoch with the train_eval command line, its evaluation result holds
every task's metrics, and the exported model's per-task predictions equal
the restored eager model's.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from export_helpers import run as run_module
from model_kinds import FEATURES, PEPNET_GROUPS

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.export.errors import ExportError
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.tools.gen_taobao_data import generate
from hashrec.train.session import build_session

pytestmark = pytest.mark.slow

MODEL = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  mmoe {
    expert_mlp { hidden_units: [16, 8] }
    num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 metrics { auc {} }
                  metrics { accuracy {} } }
  }
}
"""
# DBMTL with MMoE experts; cvr reads ctr's tower output.
DBMTL = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dbmtl {
    bottom_mlp { hidden_units: [16] }
    expert_mlp { hidden_units: [8] }
    num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 mlp { hidden_units: [8] }
                  relation_tower_names: "ctr" relation_mlp { hidden_units: [4] }
                  metrics { auc {} } metrics { accuracy {} } }
  }
}
"""
# DBMTL with a parallel MaskNet before its bottom MLP.
DBMTL_MASK_NET = DBMTL.replace("    bottom_mlp", "    mask_net { n_mask_blocks: 2 mask_block "
                               "{ reduction_ratio: 0.5 hidden_dim: 8 } }\n    bottom_mlp", 1)
# DC2VR with MMoE experts; cvr's tower is intervened on by ctr's output (as in
# TorchEasyRec's test, ctr sets no low_rank_dim).
DC2VR = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dc2vr {
    bottom_mlp { hidden_units: [16] }
    expert_mlp { hidden_units: [8] }
    num_expert: 2
    gate_mlp { hidden_units: [4] }
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5
                  intervention_tower_names: "ctr" low_rank_dim: 2
                  metrics { auc {} } metrics { accuracy {} } }
  }
}
"""
# PLE: two levels, shared experts in both (the first level's shared gate feeds the second).
PLE = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  ple {
    extraction_networks { network_name: "layer1" expert_num_per_task: 2 share_num: 1
                          task_expert_net { hidden_units: [16] }
                          share_expert_net { hidden_units: [16] } }
    extraction_networks { network_name: "layer2" expert_num_per_task: 1 share_num: 2
                          task_expert_net { hidden_units: [8] }
                          share_expert_net { hidden_units: [8] } }
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 metrics { auc {} }
                  metrics { accuracy {} } }
  }
}
"""
# SimpleMultiTask: each tower reads the DEEP group itself.
SIMPLE = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  simple_multi_task {
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [16, 8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 mlp { hidden_units: [8] }
                  metrics { auc {} } metrics { accuracy {} } }
  }
}
"""
# PEPNet over model_kinds.PEPNET_GROUPS.
PEPNET = """
model_config {""" + PEPNET_GROUPS + """  pepnet {
    epnet_hidden_unit: 16
    ppnet_hidden_units: [16, 8]
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 metrics { auc {} }
                  metrics { accuracy {} } }
  }
}
"""

# MMoE trained on its Pareto-efficient loss weights: the export is the model's, as without.
MMOE_PARETO = MODEL.replace("weight: 0.5 metrics", "weight: 0.5 pareto_min_loss_weight: 0.2 "
                            "metrics").rstrip()[:-1] + "  use_pareto_loss_weight: true\n}\n"


# PEPNet's towers per domain as TorchEasyRec's documentation writes them: the domain is
# the occupation column (0 or 1 in the generated data), a label field besides the input
# of the domain group's feature; the training batches' metric reads the rows' domains too.
PEPNET_DOMAINS = """
feature_configs { id_feature { feature_name: "occupation" expression: "user:occupation"
  num_buckets: 3 embedding_dim: 4 } }
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  feature_groups { group_name: "domain" group_type: DEEP feature_names: ["occupation"] }
  feature_groups { group_name: "uia" group_type: DEEP feature_names: ["user_id", "adgroup_id"] }
  pepnet {
    domain_input_name: "occupation"
    task_domain_num: 2
    ppnet_hidden_units: [16, 8]
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  metrics { auc {} } train_metrics { auc {} } }
    task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 metrics { auc {} } }
  }
}
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao2")
    generate(str(out), 600, seed=4, scale=0.01, eval_rows=300, quiet=True)
    for part in ("train", "eval"):
        path = out / part / "part-00000.parquet"
        table = pq.read_table(path)
        cheap = pc.less(pc.cast(table["price"], pa.float64()), 100.0)
        buy = pc.and_(pc.cast(table["clk"], pa.bool_()), cheap)
        pq.write_table(table.set_column(table.schema.get_field_index("buy"), "buy",
                                        pc.cast(buy, table["clk"].type)), path)
    return out


def _train_eval(data_dir, tmp_path, model: str, labels: str = '["clk", "buy"]'):
    """Trains ``model`` one epoch with the train_eval command line: (the config's path,
    the last evaluation's result)."""
    text = (f'train_input_path: "{data_dir}/train"\neval_input_path: "{data_dir}/eval"\n'
            f'model_dir: "{tmp_path}/model"\n{FEATURES}{model}')
    text = text.replace('label_fields: "clk"', f'label_fields: {labels}')
    config_path = str(tmp_path / "pipeline.config")
    with open(config_path, "w", encoding="utf-8") as f:
        f.write(text)
    proc = run_module("hashrec.train_eval", "--pipeline_config_path", config_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "model" / "eval_result.txt", encoding="utf-8") as f:
        return config_path, json.loads(f.readlines()[-1])


def _restored_outputs(config, checkpoint, eval_dir) -> list[dict]:
    """The restored eager model's outputs of every evaluation batch."""
    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(checkpoint, session.model, None,
                       session.model.embedding.dynamic_tables(), restore_optimizer=False)
    session.model.eval()
    with torch.no_grad():
        return [session.model(batch) for batch in session.loader(str(eval_dir), "eval")]


@pytest.mark.parametrize("model", [MODEL, DBMTL, DBMTL_MASK_NET, DC2VR, PLE, SIMPLE, PEPNET,
                                   MMOE_PARETO],
                         ids=["mmoe", "dbmtl", "dbmtl-mask-net", "dc2vr", "ple",
                              "simple-multi-task", "pepnet", "mmoe-pareto"])
def test_trains_evaluates_exports_and_predicts(data_dir, tmp_path, model):
    config_path, result = _train_eval(data_dir, tmp_path, model)
    assert {"step", "loss", "num_examples", "auc_ctr", "auc_cvr", "accuracy_cvr"} \
        <= set(result)
    assert "auc" not in result and result["num_examples"] == 300

    config = load_pipeline_config(config_path)
    checkpoint = latest_checkpoint(str(tmp_path / "model"))
    export_model(config, str(tmp_path / "export"), checkpoint)
    predict(str(tmp_path / "export"), str(data_dir / "eval"), str(tmp_path / "pred.parquet"))
    written = pq.read_table(tmp_path / "pred.parquet")
    assert written.column_names == ["logits_ctr", "logits_cvr", "probs_ctr", "probs_cvr"]
    _check_reserved_columns(data_dir, tmp_path)

    outs = _restored_outputs(config, checkpoint, data_dir / "eval")
    for name in written.column_names:
        expected = torch.cat([out[name] for out in outs]).float()
        got = torch.from_numpy(written[name].to_numpy())
        assert got.shape == expected.shape == (300,)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_pepnet_towers_per_domain_train_evaluate_export_and_predict(data_dir, tmp_path):
    config_path, result = _train_eval(data_dir, tmp_path, PEPNET_DOMAINS,
                                      '["clk", "buy", "occupation"]')
    # the tasks' metrics and losses, each row read through its domain's tower
    assert {"step", "loss", "num_examples", "auc_ctr", "auc_cvr", "binary_cross_entropy_ctr",
            "binary_cross_entropy_cvr"} <= set(result)
    assert result["num_examples"] == 300 and 0 <= result["auc_ctr"] <= 1
    config = load_pipeline_config(config_path)
    checkpoint = latest_checkpoint(str(tmp_path / "model"))
    export_model(config, str(tmp_path / "export"), checkpoint)
    predict(str(tmp_path / "export"), str(data_dir / "eval"), str(tmp_path / "pred.parquet"))
    written = pq.read_table(tmp_path / "pred.parquet")
    # every domain's outputs, as TorchEasyRec's export gives them
    assert written.column_names == [f"{kind}_{task}_{k}" for kind in ("logits", "probs")
                                    for task in ("ctr", "cvr") for k in (0, 1)]
    outs = _restored_outputs(config, checkpoint, data_dir / "eval")
    for name in written.column_names:
        expected = torch.cat([out[name] for out in outs]).float()
        torch.testing.assert_close(torch.from_numpy(written[name].to_numpy()), expected,
                                   atol=1e-5, rtol=0)
    # the eager model's task outputs (what the metrics read) are the rows' domains'
    domains = torch.tensor(pq.read_table(data_dir / "eval")["occupation"].to_pylist())
    assert set(domains.tolist()) == {0, 1}
    picked = torch.cat([out["probs_ctr"] for out in outs])
    by_domain = torch.stack([torch.from_numpy(written[f"probs_ctr_{k}"].to_numpy())
                             for k in (0, 1)], dim=1)
    torch.testing.assert_close(picked, by_domain[torch.arange(300), domains], atol=1e-5,
                               rtol=0)


def _check_reserved_columns(data_dir, tmp_path):
    """The reserved columns may not be named like one of the model's prediction columns;
    a single-task model's names (probs, y, logits) are free."""
    table = pq.read_table(data_dir / "eval" / "part-00000.parquet")
    table = table.append_column("probs", table["clk"]).append_column("y", table["buy"])
    pq.write_table(table, tmp_path / "input.parquet")
    predict(str(tmp_path / "export"), str(tmp_path / "input.parquet"),
            str(tmp_path / "kept.parquet"), reserved_columns=("probs", "y"))
    kept = pq.read_table(tmp_path / "kept.parquet")
    assert kept.column_names[-3:] == ["probs_cvr", "probs", "y"]
    assert kept["probs"].equals(table["clk"]) and kept["y"].equals(table["buy"])
    with pytest.raises(ExportError, match="collide with the prediction columns"):
        predict(str(tmp_path / "export"), str(tmp_path / "input.parquet"),
                str(tmp_path / "clash.parquet"), reserved_columns=("logits_cvr",))
