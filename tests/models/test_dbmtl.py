"""DBMTL on the fakes: one logit per task, relation towers wired into later tasks'
logits, per-task losses weighted into the total, config errors that name the tower."""

from __future__ import annotations

import logging

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import (
    check_one_logit_and_prediction_per_task,
    check_task_losses_and_gradients,
)
from torch import nn

from hashrec.models import DBMTL, ModelError
from hashrec.modules import MaskNet

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
# MMoE experts under the bottom and a gate MLP.
EXPERTS = CONFIG.replace("  task_towers", "  expert_mlp { hidden_units: [6] } num_expert: 2\n"
                         "  gate_mlp { hidden_units: [4] }\n  task_towers", 1)
# A parallel MaskNet before the bottom MLP; serial blocks with a top MLP before experts.
MASK_NET = CONFIG.replace("  bottom_mlp", "  mask_net { n_mask_blocks: 2 mask_block "
                          "{ reduction_ratio: 0.5 hidden_dim: 5 } }\n  bottom_mlp", 1)
MASK_NET_SERIAL = EXPERTS.replace("  bottom_mlp { hidden_units: [8] }\n", "").replace(
    "  expert_mlp", "  mask_net { n_mask_blocks: 3 use_parallel: false mask_block "
    "{ aggregation_dim: 4 hidden_dim: 6 } top_mlp { hidden_units: [7] } }\n  expert_mlp", 1)
VARIANTS = {"bottom": CONFIG, "experts": EXPERTS, "mask-net": MASK_NET,
            "mask-net-serial": MASK_NET_SERIAL}


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_one_logit_and_prediction_per_task(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    assert isinstance(model, DBMTL)
    check_one_logit_and_prediction_per_task(model)


@pytest.mark.parametrize("kind", ["experts", "mask-net", "mask-net-serial"])
def test_total_loss_is_the_weighted_sum_of_the_task_losses(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    check_task_losses_and_gradients(model)


@pytest.mark.parametrize("kind", ["mask-net", "mask-net-serial"])
def test_the_mask_net_reads_the_deep_groups_and_feeds_the_bottom(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    bottom = model.net.bottom
    mask_net = bottom[0] if kind == "mask-net" else bottom
    assert isinstance(mask_net, MaskNet)
    assert mask_net.norm.normalized_shape == (model.deep_group.dim,)
    if kind == "mask-net":  # two parallel blocks of 5 columns, then the bottom MLP
        assert [b.mask[0].out_features for b in mask_net.blocks] == \
            [model.deep_group.dim // 2] * 2
        assert bottom[1].first_weight().shape == (8, 10)
    else:  # the top MLP's 7 columns are every expert's input
        assert [b.hidden.in_features for b in mask_net.blocks] == \
            [model.deep_group.dim, 6, 6]
        assert model.net.experts[0].first_weight().shape == (6, 7)
    batch = make_batch(6, more_labels=("buy",))
    inputs = list(model.dense_inputs(model.embed(batch), batch))
    with torch.no_grad():
        before = model.net(inputs)
        mask_net.blocks[-1].mask[2].bias.add_(1.0)
        after = model.net(inputs)
    assert not torch.allclose(before, after)


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


@pytest.mark.parametrize("kind", ["bottom", "experts"])
def test_relation_towers_without_a_relation_mlp_are_not_read(kind, caplog):
    # TorchEasyRec's DBMTL reads relation_tower_names only through a relation_mlp.
    config = VARIANTS[kind].replace(" relation_mlp { hidden_units: [3] }", "")
    with caplog.at_level(logging.WARNING, logger="hashrec.models.dbmtl"):
        model = fake_model(config, labels=LABELS)
    assert "task_towers['cvr'].relation_tower_names ['ctr']: not read without " \
        "relation_mlp" in caplog.text
    assert model.net.tasks["cvr"].logit.in_features == 4  # cvr's own mlp
    batch = make_batch(6, more_labels=("buy",))
    before = model(batch)
    with torch.no_grad():
        for p in model.net.tasks["ctr"].parameters():
            p.add_(1.0)
    after = model(batch)
    torch.testing.assert_close(after["logits_cvr"], before["logits_cvr"])
    assert not torch.allclose(after["logits_ctr"], before["logits_ctr"])


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
    (MASK_NET.replace("n_mask_blocks: 2", "n_mask_blocks: 0"),
     "dbmtl.mask_net: n_mask_blocks=0; allowed: 1 or more"),
    (MASK_NET.replace("hidden_dim: 5", "hidden_dim: 0"),
     "dbmtl.mask_net: mask_block.hidden_dim=0"),
    (MASK_NET.replace("reduction_ratio: 0.5", "reduction_ratio: 0.01"),
     "dbmtl.mask_net: mask_block.reduction_ratio=0.01 over 13 input columns gives an "
     "aggregation width of 0"),
    (MASK_NET.replace("reduction_ratio: 0.5", "aggregation_dim: 0"),
     "dbmtl.mask_net: mask_block.aggregation_dim=0"),
    (MASK_NET_SERIAL.replace("top_mlp { hidden_units: [7] }", "top_mlp {}"),
     "dbmtl.mask_net.top_mlp: MLPOptions.hidden_units must name at least one layer"),
], ids=["unknown-relation", "self-relation", "later-relation", "relation-twice",
        "no-experts", "gate-without-experts", "unknown-label", "model-losses", "sequence",
        "module-dict-attribute", "mask-net-no-blocks", "mask-net-hidden-dim-0",
        "mask-net-small-ratio", "mask-net-aggregation-dim-0", "mask-net-empty-top-mlp"])
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
