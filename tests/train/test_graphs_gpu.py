"""CUDA graphs of the dense network train like the eager dense network (GPU only)."""

from __future__ import annotations

import glob
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from model_kinds import FEATURES, MODELS, PEPNET_GROUPS, pipeline_text
from tdm_world import write_world
from test_dlrm_hstu_learns import _config as dlrm_hstu_config

from hashrec.config import apply_edit_config_json, load_pipeline_config, parse_pipeline_config
from hashrec.tools.gen_kuairand_data import generate as generate_kuairand
from hashrec.tools.gen_taobao_data import main as generate
from hashrec.train import checkpoints
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.session import build_session

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao.config")
STEPS = 6


def _losses(data: str, tmp_path, graphs: bool, precision: str, weighted: bool = False,
            base=None):
    """The first STEPS training losses of ``base`` (default: the example config)."""
    losses, loop = _train(data, tmp_path, graphs, precision, weighted, base)
    return losses, loop.dense_graphs.captured


def _train(data: str, tmp_path, graphs: bool, precision: str, weighted: bool = False,
           base=None):
    """(the first STEPS training losses, the loop) of ``base`` (see ``_losses``)."""
    edits = {"data_config.batch_size": 256, "data_config.num_workers": 0,
             "data_config.sample_weight_fields": ["w"] if weighted else [],
             "train_config.num_steps": STEPS, "eval_input_path": "",
             "train_config.mixed_precision": precision,
             "train_config.dense_cuda_graph": graphs,
             "model_dir": str(tmp_path / f"model_{graphs}_{precision}")}
    config = apply_edit_config_json(base or load_pipeline_config(CONFIG), edits)
    torch.manual_seed(0)
    session, loop, losses = _recording_loop(config)
    for step, batch in enumerate(session.loader(data, "train")):
        if step == STEPS:
            break
        loop.train_step(batch.to(session.device))
    return losses, loop


def _recording_loop(config):
    """(session, training loop, the list its steps' losses are appended to) of ``config``."""
    session = build_session(config)
    loop = TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())
    session.model.train()
    losses = []
    record = loop.progress.record
    loop.progress.record = lambda n, loss, parts=None: (losses.append(float(loss)),
                                                        record(n, loss, parts))
    return session, loop, losses


def test_graphed_dense_network_gives_the_train_metrics_of_eager(tmp_path):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    config = load_pipeline_config(CONFIG)
    for metric in ("auc", "accuracy", "mean_absolute_error"):
        train_metric = config.model_config.train_metrics.add(decay_rate=0.5, decay_step=2)
        getattr(train_metric, metric).SetInParent()
    _, eager = _train(data, tmp_path, False, "", base=config)
    _, graphed = _train(data, tmp_path, True, "", base=config)
    assert eager.dense_graphs.captured == 0 and graphed.dense_graphs.captured == 1
    values = eager.train_metrics.values()
    assert set(values) == {"auc", "accuracy", "mean_absolute_error"}
    assert graphed.train_metrics.values() == pytest.approx(values, rel=1e-4)


def _add_weights(data: str) -> None:
    """A sample weight column ``w`` (0 to 3) in every data file."""
    for path in glob.glob(os.path.join(data, "*.parquet")):
        table = pq.read_table(path)
        weights = np.random.default_rng(0).integers(0, 4, table.num_rows).astype(np.float32)
        pq.write_table(table.append_column("w", pa.array(weights)), path)


@pytest.mark.parametrize("precision, weighted", [("", False), ("BF16", False), ("", True)],
                         ids=["fp32", "bf16", "weighted"])
def test_graphed_dense_network_trains_like_eager(tmp_path, precision, weighted):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    if weighted:
        _add_weights(data)
    eager, none = _losses(data, tmp_path, False, precision, weighted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphed, captured = _losses(data, tmp_path, True, precision, weighted)
    assert none == 0 and captured == 1
    # The capture's warmup runs on a stream of its own, which torch warns about (once a
    # process) unless the capture turns that warning off.
    assert not [w for w in caught if "AccumulateGrad" in str(w.message)]
    tolerance = 1e-4 if precision == "" else 2e-2
    assert graphed == pytest.approx(eager, rel=tolerance)
    assert eager[-1] != eager[0]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_each_model_kind_trains_graphed_like_eager(kind, tmp_path):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    base = parse_pipeline_config(pipeline_text(kind, data, tmp_path / "model"))
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


def test_tdm_trains_graphed_like_eager(tmp_path):
    # tdm_sampler's rows: each of the 256 clicks of a batch, its 5 ancestors and 13
    # negatives; the same draws in both runs (the loader's seed)
    base = load_pipeline_config(write_world(tmp_path, train_rows=2048, eval_rows=64))
    data = str(tmp_path / "train.parquet")
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


MMOE = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  mmoe {
    expert_mlp { hidden_units: [16, 8] } gate_mlp { hidden_units: [8] } num_expert: 3
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  losses { l2_loss {} } task_space_indicator_label: "clk"
                  out_task_space_weight: 0.25 }
  }
}
"""
# DBMTL: a MaskNet, bottom MLP, MMoE experts, and the regression tower reading the ctr
# tower's output.
DBMTL = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dbmtl {
    mask_net { n_mask_blocks: 2 mask_block { reduction_ratio: 1 hidden_dim: 8 } }
    bottom_mlp { hidden_units: [16] } expert_mlp { hidden_units: [8] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  mlp { hidden_units: [8] } relation_tower_names: "ctr"
                  relation_mlp { hidden_units: [4] } losses { l2_loss {} } }
  }
}
"""
# DC2VR: bottom MLP, MMoE experts, and the regression tower intervened on by the ctr
# tower's output (the Householder reflections of its orthonormal matrices in the graph).
DC2VR = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dc2vr {
    bottom_mlp { hidden_units: [16] } expert_mlp { hidden_units: [8] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  mlp { hidden_units: [8] } intervention_tower_names: "ctr"
                  low_rank_dim: 4 losses { l2_loss {} } }
  }
}
"""
# PLE: two levels with shared experts; the first level's shared gate feeds the second.
PLE = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  ple {
    extraction_networks { network_name: "layer1" expert_num_per_task: 2 share_num: 2
                          task_expert_net { hidden_units: [16] }
                          share_expert_net { hidden_units: [16] } }
    extraction_networks { network_name: "layer2" expert_num_per_task: 1 share_num: 1
                          task_expert_net { hidden_units: [8] }
                          share_expert_net { hidden_units: [8] } }
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  losses { l2_loss {} } }
  }
}
"""
# SimpleMultiTask: a classifier and a regression tower over the DEEP group, row weights.
SIMPLE = """
model_config {
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  simple_multi_task {
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [16, 8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  mlp { hidden_units: [8] } losses { l2_loss {} } }
  }
}
"""
# PEPNet over model_kinds.PEPNET_GROUPS, row weights.
PEPNET = """
model_config {""" + PEPNET_GROUPS + """  pepnet {
    ppnet_hidden_units: [16, 8]
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] }
                  sample_weight_name: "w" }
    task_towers { tower_name: "score" label_name: "score" weight: 0.5
                  losses { l2_loss {} } }
  }
}
"""

# PEPNet's towers per domain over the level column (ids 0 to 2): the captured loss reads
# the rows' domain ids as a target.
PEPNET_DOMAINS = PEPNET.replace("pepnet {", 'pepnet {\n    domain_input_name: "level" '
                                'task_domain_num: 3')


def _mmoe(towers: str) -> str:
    """The model config of an MMoE of two experts with ``towers``."""
    return f"""
model_config {{
  feature_groups {{ group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }}
  mmoe {{
    expert_mlp {{ hidden_units: [16, 8] }} num_expert: 2
{towers}
  }}
}}
"""


# MMoE with a tower of three classes and a jrc_loss tower (two classes, sessions of the
# user_id feature, row weights): the captured loss reads the sessions as a target.
CLASSES = _mmoe("""    task_towers { tower_name: "level" label_name: "level" num_class: 3
                  losses { softmax_cross_entropy { label_smoothing: 0.1 } } }
    task_towers { tower_name: "jrc" label_name: "clk" num_class: 2 sample_weight_name: "w"
                  losses { jrc_loss { session_name: "user_id" alpha: 0.3 } } }""")


# MMoE with towers of several losses: binary cross entropy and focal loss on row weights,
# softmax cross entropy and jrc_loss on two classes (a weight column per loss).
SEVERAL = _mmoe("""    task_towers { tower_name: "ctr" label_name: "clk" sample_weight_name: "w"
                  losses { binary_cross_entropy {} } losses { binary_focal_loss {} } }
    task_towers { tower_name: "jrc" label_name: "clk" num_class: 2 weight: 0.5
                  losses { softmax_cross_entropy {} }
                  losses { jrc_loss { session_name: "user_id" } } }""")


def _multi_task_data(tmp_path, model: str):
    """(the data folder, the config of ``model``): generated rows with a sample weight
    ``w``, a ``score`` to regress and a ``level`` of three classes, as labels."""
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    _add_weights(data)
    for path in glob.glob(os.path.join(data, "*.parquet")):
        table = pq.read_table(path)
        rng = np.random.default_rng(1)
        score = rng.normal(2.0, 1.0, table.num_rows).astype(np.float32)
        level = rng.integers(0, 3, table.num_rows)
        pq.write_table(table.append_column("score", pa.array(score))
                       .append_column("level", pa.array(level)), path)
    text = f'model_dir: "{tmp_path}/model"\n{FEATURES}{model}'.replace(
        'label_fields: "clk"', 'label_fields: ["clk", "score", "level"]')
    return data, parse_pipeline_config(text)


@pytest.mark.parametrize("model", [MMOE, DBMTL, DC2VR, PLE, SIMPLE, PEPNET, PEPNET_DOMAINS,
                                   CLASSES, SEVERAL],
                         ids=["mmoe", "dbmtl", "dc2vr", "ple", "simple-multi-task", "pepnet",
                              "pepnet-domains", "classes", "several-losses"])
def test_multi_task_model_trains_graphed_like_eager(tmp_path, model):
    # (B, logits) logits, labels and row weights (sample weights; MMoE's score task also
    # in the click space), an l2_loss task weighted 0.5, towers of classes, through the
    # captured loss.
    data, base = _multi_task_data(tmp_path, model)
    eager, none = _losses(data, tmp_path, False, "", weighted=True, base=base)
    graphed, captured = _losses(data, tmp_path, True, "", weighted=True, base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


# The MMoE on Pareto-efficient loss weights, the score task's at least 0.2.
PARETO = MMOE.replace("weight: 0.5", "weight: 0.5 pareto_min_loss_weight: 0.2").rstrip()[:-1] \
    + "  use_pareto_loss_weight: true\n}\n"


@pytest.mark.parametrize("precision", ["", "FP16"], ids=["fp32", "fp16"])
def test_pareto_weights_are_solved_through_the_graph_like_eager(tmp_path, precision):
    # Each loss's gradient replays the captured backward; the weights stay on the device.
    data, base = _multi_task_data(tmp_path, PARETO)
    eager, eager_loop = _train(data, tmp_path, False, precision, weighted=True, base=base)
    graphed, graphed_loop = _train(data, tmp_path, True, precision, weighted=True, base=base)
    assert eager_loop.dense_graphs.captured == 0 and graphed_loop.dense_graphs.captured == 1
    tolerance = 1e-4 if precision == "" else 2e-2
    assert graphed == pytest.approx(eager, rel=tolerance)
    assert all(np.isfinite(graphed)) and eager[-1] != eager[0]
    sums = [{name: float(v) for name, v in loop.progress._weight_sums.items()}
            for loop in (eager_loop, graphed_loop)]
    assert set(sums[0]) == {"binary_cross_entropy_ctr", "l2_loss_score"}
    assert sum(sums[0].values()) == pytest.approx(STEPS, rel=1e-5)  # each step's sum to 1
    assert sums[1] == pytest.approx(sums[0], rel=tolerance)
    assert sums[0]["l2_loss_score"] >= 0.2 * STEPS - 1e-5


# DSSM: a user and an item tower; in-batch negatives or 32 sampled ones a batch.
DSSM = """
model_config {
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "item" group_type: DEEP
    feature_names: ["adgroup_id", "cate_id", "price"] }
  dssm { user_tower { input: "user" mlp { hidden_units: [16] } }
         item_tower { input: "item" mlp { hidden_units: [16] } }
         output_dim: 8 similarity: COSINE temperature: 0.2 %s }
  metrics { recall_at_k { top_k: 5 } }
  losses { softmax_cross_entropy {} }
}
"""


# MIND: the user group and the click sequence through the capsules, the item tower.
MIND = """
model_config {
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "hist" group_type: SEQUENCE
    feature_names: ["click_50_seq__adgroup_id", "click_50_seq__cate_id"] }
  feature_groups { group_name: "item" group_type: DEEP
    feature_names: ["adgroup_id", "cate_id", "price"] }
  mind { user_tower { input: "user" history_input: "hist"
                      user_mlp { hidden_units: [8] } hist_seq_mlp { hidden_units: [16, 8] }
                      capsule_config { max_k: 3 max_seq_len: 10 high_dim: 8 }
                      concat_mlp { hidden_units: [16] } }
         item_tower { input: "item" mlp { hidden_units: [16] } }
         output_dim: 8 simi_pow: 20 similarity: COSINE temperature: 0.2 %s }
  metrics { recall_at_k { top_k: 5 } }
  losses { softmax_cross_entropy {} }
}
"""


# DAT: DSSM's towers, each with its id's embedding (8 wide) as its augment vector; the
# AMM losses train beside the softmax loss.
DAT = """
model_config {
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "user_augment" group_type: DEEP feature_names: "user_id" }
  feature_groups { group_name: "item" group_type: DEEP
    feature_names: ["adgroup_id", "cate_id", "price"] }
  feature_groups { group_name: "item_augment" group_type: DEEP feature_names: "adgroup_id" }
  dat { user_tower { input: "user" augment_input: "user_augment" mlp { hidden_units: [16] } }
        item_tower { input: "item" augment_input: "item_augment" mlp { hidden_units: [16] } }
        output_dim: 8 similarity: COSINE temperature: 0.2 %s }
  metrics { recall_at_k { top_k: 5 } }
  losses { softmax_cross_entropy {} }
}
"""


# The match backbone: DSSM's towers as backbone blocks, each tower's MLP projected to 8.
MATCH_BACKBONE = """
model_config {
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "item" group_type: DEEP
    feature_names: ["adgroup_id", "cate_id", "price"] }
  match_backbone {
    backbone {
      blocks { name: "user" inputs { feature_group_name: "user" } input_layer {} }
      blocks { name: "item" inputs { feature_group_name: "item" } input_layer {} }
      blocks { name: "user_tower" inputs { block_name: "user" }
               module { class_name: "MLP" mlp { hidden_units: [16] } } }
      blocks { name: "item_tower" inputs { block_name: "item" }
               module { class_name: "MLP" mlp { hidden_units: [16] } } }
      output_blocks: "user_tower" output_blocks: "item_tower"
    }
    model_params { output_dim: 8 similarity: COSINE temperature: 0.2 %s }
  }
  metrics { recall_at_k { top_k: 5 } }
  losses { softmax_cross_entropy {} }
}
"""


@pytest.mark.parametrize("model, sampled", [(DSSM, False), (DSSM, True), (DSSM, "hard"),
                                            (MIND, False), (MIND, True), (DAT, False),
                                            (DAT, True), (MATCH_BACKBONE, False),
                                            (MATCH_BACKBONE, True)],
                         ids=["dssm-in-batch", "dssm-sampled", "dssm-hard", "mind-in-batch",
                              "mind-sampled", "dat-in-batch", "dat-sampled",
                              "match_backbone-in-batch", "match_backbone-sampled"])
def test_match_model_trains_graphed_like_eager(tmp_path, model, sampled):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    text = f'model_dir: "{tmp_path}/model"\n{FEATURES}' + model % (
        "" if sampled else "in_batch_negative: true")
    if sampled:
        rows = pq.read_table(glob.glob(os.path.join(data, "*.parquet"))[0]).to_pydict()
        sampler = _sampler(tmp_path, rows, sampled == "hard")
        text = text.replace('label_fields: "clk"', f'label_fields: "clk" {sampler}')
    base = parse_pipeline_config(text)
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


# HSTU match: the click sequence through two STU layers after three contextual tokens
# (user_id, cms_segid, pid), against a candidate sequence of each row's ad group (its
# column written here), the sampled ad groups filling that sequence's column; no dropout.
HSTU_MATCH = """
feature_configs { sequence_feature { sequence_name: "cand_seq" sequence_length: 1
  sequence_delim: "|"
  features { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id"
    embedding_dim: 8 } } } }
model_config {
  feature_groups { group_name: "uih" group_type: JAGGED_SEQUENCE
    feature_names: ["click_50_seq__adgroup_id", "click_50_seq__cate_id"] }
  feature_groups { group_name: "contextual" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "candidate" group_type: JAGGED_SEQUENCE
    feature_names: "cand_seq__adgroup_id" }
  hstu_match {
    user_tower { input: "uih" max_seq_len: 10
      hstu { stu { embedding_dim: 16 num_heads: 2 hidden_dim: 8 attention_dim: 8
                   output_dropout_ratio: 0 use_group_norm: true max_attn_len: 4 }
             input_dropout_ratio: 0 attn_num_layers: 2
             positional_encoder { num_position_buckets: 16 }
             input_preprocessor { uih_preprocessor {} }
             output_postprocessor { layernorm_postprocessor {} } } }
    item_tower { input: "candidate" mlp { hidden_units: [16] } }
    output_dim: 8 similarity: COSINE temperature: 0.2
  }
  metrics { recall_at_k { top_k: 5 } }
  losses { softmax_cross_entropy {} }
}
"""


@pytest.mark.parametrize("hard", [False, True], ids=["hstu_match-sampled", "hstu_match-hard"])
def test_hstu_match_trains_graphed_like_eager(tmp_path, hard):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    path = glob.glob(os.path.join(data, "*.parquet"))[0]
    table = pq.read_table(path)
    rows = table.to_pydict()
    pq.write_table(table.append_column("cand_seq__adgroup_id",
                                       pa.array([str(i) for i in rows["adgroup_id"]])), path)
    sampler = _sampler(tmp_path, rows, hard).replace(
        'item_id_field: "adgroup_id"', 'item_id_field: "cand_seq__adgroup_id"')
    text = f'model_dir: "{tmp_path}/model"\n{FEATURES}{HSTU_MATCH}'.replace(
        'label_fields: "clk"', f'label_fields: "clk" {sampler}')
    base = parse_pipeline_config(text)
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


@pytest.mark.parametrize("preprocessor", ["contextual_preprocessor",
                                          "contextual_interleave_preprocessor"])
def test_dlrm_hstu_trains_graphed_like_eager(tmp_path, preprocessor):
    # KuaiRand-like rows: each row's history and candidates through the target-aware STU
    # layers, a loss per task over the candidates (their padding weighs 0)
    data = str(tmp_path / "kuairand")
    generate_kuairand(data, 2048, seed=1, scale=0.0001, quiet=True)
    text = dlrm_hstu_config(tmp_path, data).replace("contextual_preprocessor {",
                                                    f"{preprocessor} {{")
    base = parse_pipeline_config(text)
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


def _sampler(tmp_path, rows: dict, hard: bool) -> str:
    """A negative sampler over the generated rows' ad groups (their item table written),
    or with ``hard`` ``_hard_sampler``: each batch's (B, 4) hard-negative mask differs,
    not its shape."""
    fields = ("adgroup_id", "cate_id", "price")
    items = {row[0]: ":".join(map(str, row)) for row in zip(*(rows[f] for f in fields))}
    pq.write_table(pa.table({"id": list(items), "weight": [1.0] * len(items),
                             "attrs": list(items.values())}), tmp_path / "items.parquet")
    attrs = " ".join(f'attr_fields: "{f}"' for f in fields)
    if hard:
        return _hard_sampler(tmp_path, rows, list(items), attrs)
    return (f'negative_sampler {{ input_path: "{tmp_path}/items.parquet" num_sample: 32 '
            f'{attrs} item_id_field: "adgroup_id" }}')


def _hard_sampler(tmp_path, rows: dict, items: list, attrs: str) -> str:
    """hard_negative_sampler_v2 over the generated rows: their clicks the positive edges,
    0 to 6 random items a user its hard edges."""
    rng = np.random.default_rng(0)
    users = sorted(set(rows["user_id"]))
    pq.write_table(pa.table({"id": users, "weight": [1.0] * len(users)}),
                   tmp_path / "users.parquet")
    pq.write_table(pa.table({"src_id": rows["user_id"], "dst_id": rows["adgroup_id"]}),
                   tmp_path / "positive.parquet")
    counts = rng.integers(0, 7, len(users))
    pq.write_table(pa.table({"src_id": np.repeat(users, counts),
                             "dst_id": rng.choice(items, int(counts.sum()))}),
                   tmp_path / "hard.parquet")
    return (f'hard_negative_sampler_v2 {{ user_input_path: "{tmp_path}/users.parquet" '
            f'item_input_path: "{tmp_path}/items.parquet" '
            f'pos_edge_input_path: "{tmp_path}/positive.parquet" '
            f'hard_neg_edge_input_path: "{tmp_path}/hard.parquet" num_sample: 32 '
            f'num_hard_sample: 4 {attrs} item_id_field: "adgroup_id" '
            f'user_id_field: "user_id" }}')


def test_capture_survives_pinned_allocations_on_another_thread():
    # The loader's pin-memory thread allocates pinned memory while the dense network
    # is captured; in the default ("global") capture mode that failed the capture
    # and killed the thread.
    import threading

    from hashrec.train.graphs import thread_local_capture

    stop = threading.Event()

    def pin():
        size = 1 << 20
        while not stop.is_set():
            size += 4096  # a new size every time: a fresh host allocation
            torch.empty(size, dtype=torch.uint8, pin_memory=True)

    layer = torch.nn.Linear(64, 64).cuda()
    sample = (torch.randn(32, 64, device="cuda", requires_grad=True),)
    thread = threading.Thread(target=pin)
    thread.start()
    try:
        with thread_local_capture():
            graphed = torch.cuda.make_graphed_callables(layer, sample, num_warmup_iters=3)
    finally:
        stop.set()
        thread.join()
    x = torch.randn(32, 64, device="cuda")
    torch.testing.assert_close(graphed(x), layer(x))
