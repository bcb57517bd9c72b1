"""DBMTL on the fakes: one logit per task, relation towers wired into later tasks'
logits, per-task losses weighted into the total, config errors that name the tower."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import (
    check_one_logit_and_prediction_per_task,
    check_task_losses_and_gradients,
)
from torch import nn

from hashrec.models import DBMTL, ModelError

LABELS = ("clk", "buy")
CONFIG = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
dbmtl {
  bottom_mlp { hidden_units: [8] }
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] }
                metrics { auc {} } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 mlp { hidden_units: [4] }
                relation_tower_names: "ctr" relation_mlp { hidden_units: [3] }
                losses { l2_loss {} } metrics { mean_squared_error {} } }
}
"""
# MMoE experts under the bottom, a gate MLP, and a relation without a relation_mlp.
EXPERTS = CONFIG.replace("  task_towers", "  expert_mlp { hidden_units: [6] } num_expert: 2\n"
                         "  gate_mlp { hidden_units: [4] }\n  task_towers", 1) \
    .replace(" relation_mlp { hidden_units: [3] }", "")
VARIANTS = {"bottom": CONFIG, "experts": EXPERTS}


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_one_logit_and_prediction_per_task(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    assert isinstance(model, DBMTL)
    check_one_logit_and_prediction_per_task(model)


def test_total_loss_is_the_weighted_sum_of_the_task_losses():
    model = fake_model(EXPERTS, labels=LABELS)
    check_task_losses_and_gradients(model)


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_a_tasks_logit_reads_its_relation_towers_output(kind):
    # Perturbing ctr's tower output moves cvr's logit; cvr's loss trains ctr's tower.
    model = fake_model(VARIANTS[kind], labels=LABELS)
    batch = make_batch(6, more_labels=("buy",))
    before = model(batch)
    tower = model.net.tasks["ctr"].task_input.tower
    with torch.no_grad():
        next(m for m in tower.modules() if isinstance(m, nn.Linear)).bias.add_(1.0)
    after = model(batch)
    assert not torch.allclose(before["logits_cvr"], after["logits_cvr"])
    model.zero_grad()
    model.loss(model(batch), batch)["l2_loss_cvr"].backward()
    ctr = model.net.tasks["ctr"]
    assert sum(p.grad.abs().sum() for p in ctr.task_input.tower.parameters()) > 0
    grad = ctr.logit.weight.grad
    assert grad is None or not grad.any()  # ctr's logit is not cvr's input


def test_without_relations_a_tasks_logit_ignores_the_other_towers():
    model = fake_model(CONFIG.replace('relation_tower_names: "ctr" ', ""), labels=LABELS)
    batch = make_batch(6, more_labels=("buy",))
    before = model(batch)
    with torch.no_grad():
        model.net.tasks["ctr"].logit.bias.add_(1.0)
        for p in model.net.tasks["ctr"].task_input.parameters():
            p.add_(1.0)
    torch.testing.assert_close(model(batch)["logits_cvr"], before["logits_cvr"])


def test_missing_label_name_reads_the_label_field_of_the_towers_position():
    model = fake_model(CONFIG.replace(' label_name: "buy"', ""), labels=LABELS)
    assert [task.label_name for task in model.tasks] == ["clk", "buy"]


@pytest.mark.parametrize("text,message", [
    (CONFIG.replace('relation_tower_names: "ctr"', 'relation_tower_names: "ctx"'),
     "task_towers['cvr'].relation_tower_names: 'ctx' is not an earlier task"),
    (CONFIG.replace('relation_tower_names: "ctr"', 'relation_tower_names: "cvr"'),
     "task_towers['cvr'].relation_tower_names: 'cvr' is the task itself"),
    (CONFIG.replace('metrics { auc {} }', 'metrics { auc {} } relation_tower_names: "cvr"'),
     "task_towers['ctr'].relation_tower_names: 'cvr' is not an earlier task"),
    (CONFIG.replace('relation_tower_names: "ctr"', 'relation_tower_names: ["ctr", "ctr"]'),
     "task_towers['cvr'].relation_tower_names: 'ctr' is named twice"),
    (EXPERTS.replace("num_expert: 2", "num_expert: 0"), "dbmtl.num_expert=0"),
    (CONFIG.replace("  task_towers", "  gate_mlp { hidden_units: [4] }\n  task_towers", 1),
     "dbmtl.gate_mlp is set without dbmtl.expert_mlp"),
    (CONFIG.replace('label_name: "buy"', 'label_name: "pay"'),
     "task_towers['cvr'].label_name 'pay' is not one of data_config.label_fields"),
    (CONFIG + "losses { l2_loss {} }\n", "set losses on each of dbmtl.task_towers"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "dbmtl reads DEEP feature groups only"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
], ids=["unknown-relation", "self-relation", "later-relation", "relation-twice",
        "no-experts", "gate-without-experts", "unknown-label", "model-losses", "sequence",
        "module-dict-attribute"])
def test_config_errors(text, message):
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace("(", r"\(")):
        fake_model(text, labels=LABELS)


def test_fine_tune_restores_each_task_by_tower_name(tmp_path):
    from hashrec.checkpoint import restore_fine_tune, save_checkpoint

    # A new first task: ctr and cvr, now second and third, keep their own modules.
    new = ('  task_towers { tower_name: "pay" label_name: "buy" }\n  task_towers '
           '{ tower_name: "ctr"')
    saved = fake_model(CONFIG, labels=LABELS)
    path = save_checkpoint(str(tmp_path), 1, saved, None, {})
    model = fake_model(CONFIG.replace('  task_towers { tower_name: "ctr"', new), labels=LABELS)
    restore_fine_tune(path, model, {})
    batch = make_batch(6, more_labels=("buy",))
    for name in ("logits_ctr", "y_cvr"):
        torch.testing.assert_close(model(batch)[name], saved(batch)[name])


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_the_scripted_network_equals_the_eager_one(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS).eval()
    batch = make_batch(6, more_labels=("buy",))
    inputs = list(model.dense_inputs(model.embed(batch), batch))
    scripted = torch.jit.script(model.net)
    torch.testing.assert_close(scripted(inputs), model.net(inputs))


def test_a_tower_without_label_name_checks_its_positions_label_is_binary():
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set

    config = parse_pipeline_config('''
model_dir: "m"
data_config { dataset_type: ParquetDataset label_fields: ["minutes", "clk"] }
feature_configs { id_feature { feature_name: "u" expression: "user:u" embedding_dim: 4
  num_buckets: 10 } }
model_config {
  feature_groups { group_name: "all" feature_names: ["u"] group_type: DEEP }
  dbmtl { task_towers { tower_name: "time" losses { l2_loss {} } }
          task_towers { tower_name: "ctr" } }
}''')
    assert build_feature_set(config).binary_labels == {"clk"}
