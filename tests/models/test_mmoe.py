"""MMoE on the fakes: one logit per task, per-task losses weighted into the total,
config errors that name the tower."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import check_one_logit_and_prediction_per_task

from hashrec.models import MMoE, ModelError

LABELS = ("clk", "buy")
CONFIG = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
mmoe {
  expert_mlp { hidden_units: [8, 4] }
  gate_mlp { hidden_units: [4] }
  num_expert: 3
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] }
                metrics { auc {} } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5
                losses { l2_loss {} } metrics { mean_squared_error {} } }
}
"""


def test_one_logit_and_prediction_per_task():
    model = fake_model(CONFIG, labels=LABELS)
    assert isinstance(model, MMoE)
    check_one_logit_and_prediction_per_task(model)


def _model_and_batch(weighted: bool):
    """CONFIG's model and a batch with both labels (and sample weights ``w`` if
    ``weighted``)."""
    # Each tower names its weight column (a tower naming none weighs its rows 1).
    config = CONFIG.replace('label_name: "clk"', 'label_name: "clk" sample_weight_name: "w"') \
        .replace('weight: 0.5', 'weight: 0.5 sample_weight_name: "w"') if weighted else CONFIG
    model = fake_model(config, labels=LABELS, weights=("w",) if weighted else ())
    batch = make_batch(6, more_labels=("buy",))
    if weighted:
        batch.labels["w"] = torch.tensor([1.0, 0.0, 2.0, 1.0, 3.0, 0.5])
    return model, batch


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "sample-weights"])
def test_total_loss_is_the_weighted_sum_of_the_task_losses(weighted):
    model, batch = _model_and_batch(weighted)
    out = model(batch)
    losses = model.loss(out, batch)
    assert list(losses) == ["binary_cross_entropy_ctr", "l2_loss_cvr"]
    w = batch.labels["w"] if weighted else torch.ones(6)
    p, clk, buy = out["probs_ctr"], batch.labels["clk"], batch.labels["buy"]
    bce = -(clk * p.log() + (1 - clk) * (1 - p).log())
    l2 = (out["y_cvr"] - buy) ** 2
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"], (w * bce).sum() / w.sum())
    torch.testing.assert_close(losses["l2_loss_cvr"], 0.5 * (w * l2).sum() / w.sum())
    sum(losses.values()).backward()
    assert all(p.grad is not None for n, p in model.named_parameters()
               if not n.startswith("embedding"))


def test_each_task_trains_on_its_own_label():
    model = fake_model(CONFIG, labels=LABELS)
    batch = make_batch(6, more_labels=("buy",))
    out = model(batch)
    before = model.loss(out, batch)
    batch.labels["buy"] = 1 - batch.labels["buy"]
    after = model.loss(out, batch)
    assert before["binary_cross_entropy_ctr"] == after["binary_cross_entropy_ctr"]
    assert before["l2_loss_cvr"] != after["l2_loss_cvr"]


@pytest.mark.parametrize("text,message", [
    (CONFIG.replace('label_name: "buy"', 'label_name: "pay"'),
     "task_towers['cvr'].label_name 'pay' is not one of data_config.label_fields"),
    (CONFIG[:CONFIG.index("  task_towers")] + "}\n", "mmoe has no task_towers"),
    (CONFIG.replace('"cvr"', '"ctr"'), "task_towers['ctr'] is defined twice"),
    (CONFIG + "metrics { auc {} }\n", "set metrics on each of mmoe.task_towers"),
    (CONFIG.replace("losses { l2_loss {} }", "losses { l2_loss {} } num_class: 2"),
     "task_towers['cvr'].num_class=2"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "DEEP feature groups only"),
    (CONFIG.replace('"cvr"', '"cvr.v2"'), "task_towers['cvr.v2'].tower_name 'cvr.v2' cannot "
     "name the task's module"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
    (CONFIG.replace("weight: 0.5", "weight: -1"),
     "task_towers['cvr'].weight=-1.0; the task loss's weight must be a finite number >= 0"),
], ids=["unknown-label", "no-tasks", "tower-twice", "model-metrics", "num-class", "sequence",
        "dot-in-tower-name", "module-dict-attribute", "negative-weight"])
def test_config_errors(text, message):
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace("(", r"\(")):
        fake_model(text, labels=LABELS)


def test_binary_cross_entropy_tasks_check_their_labels_are_0_or_1():
    import pyarrow as pa

    from hashrec.config import parse_pipeline_config
    from hashrec.features import FeatureError, build_feature_set

    config = parse_pipeline_config('''
model_dir: "m"
data_config { dataset_type: ParquetDataset label_fields: ["clk", "minutes"] }
feature_configs { id_feature { feature_name: "u" expression: "user:u" embedding_dim: 4
  num_buckets: 10 } }
model_config {
  feature_groups { group_name: "all" feature_names: ["u"] group_type: DEEP }
  mmoe { expert_mlp { hidden_units: [4] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" losses { binary_cross_entropy {} } }
    task_towers { tower_name: "time" label_name: "minutes" losses { l2_loss {} } } }
}''')
    features = build_feature_set(config)
    assert features.binary_labels == {"clk"}
    table = pa.table({"u": [1, 2], "clk": [1, 0], "minutes": [3.5, 7.0]})
    assert features.parse(table).labels["minutes"].tolist() == [3.5, 7.0]
    with pytest.raises(FeatureError, match=r"label column 'clk' row 1: value 2 is not in \[0, 1\]"):
        features.parse(table.set_column(1, "clk", pa.array([1, 2])))


def test_fine_tune_restores_each_tasks_gate_and_tower_by_tower_name(tmp_path):
    from hashrec.checkpoint import restore_fine_tune, save_checkpoint

    ctr = CONFIG[CONFIG.index('  task_towers { tower_name: "ctr"'):
                 CONFIG.index('  task_towers { tower_name: "cvr"')]
    saved = fake_model(CONFIG, labels=LABELS)
    path = save_checkpoint(str(tmp_path), 1, saved, None, {})
    # The ctr task removed: cvr, now the first task, keeps its own gate and tower.
    model = fake_model(CONFIG.replace(ctr, ""), labels=LABELS)
    restore_fine_tune(path, model, {})
    batch = make_batch(6, more_labels=("buy",))
    torch.testing.assert_close(model(batch)["y_cvr"], saved(batch)["y_cvr"])


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "sample-weights"])
def test_the_graphed_loss_module_gives_the_models_losses(weighted):
    # What a CUDA graph captures (hashrec.train.graphs), run eagerly on the CPU: the
    # dense network's (B, tasks) logits and the task losses from (B, tasks) labels.
    from hashrec.train.graphs import _DenseLoss

    model, batch = _model_and_batch(weighted)
    embedded = model.embed(batch)
    logits, losses = _DenseLoss(model)(*model.dense_inputs(embedded, batch),
                                       *model.targets(batch))
    out = model(batch)
    torch.testing.assert_close(logits, torch.stack([out["logits_ctr"], out["logits_cvr"]], -1))
    torch.testing.assert_close(losses, torch.stack(list(model.loss(out, batch).values())))
