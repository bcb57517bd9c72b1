"""DC2VR on the fakes: one logit per task, the logits against the model's parts, an
intervened tower reading earlier towers without training them, per-task losses weighted
into the total, config errors that name the tower and the field."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import (
    check_one_logit_and_prediction_per_task,
    check_task_losses_and_gradients,
)

from hashrec.models import DC2VR, ModelError
from hashrec.modules import Intervention

LABELS = ("clk", "buy")
CONFIG = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
dc2vr {
  bottom_mlp { hidden_units: [8] }
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] }
                metrics { auc {} } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 mlp { hidden_units: [5] }
                intervention_tower_names: "ctr" low_rank_dim: 2
                losses { l2_loss {} } metrics { mean_squared_error {} } }
}
"""
# MMoE experts under the bottom and a gate MLP.
EXPERTS = CONFIG.replace("  task_towers", "  expert_mlp { hidden_units: [6] } num_expert: 2\n"
                         "  gate_mlp { hidden_units: [4] }\n  task_towers", 1)
# Neither bottom nor tower MLPs: both towers' nets are the DEEP group itself.
BARE = CONFIG.replace("  bottom_mlp { hidden_units: [8] }\n", "").replace(
    ' mlp { hidden_units: [4] }', "").replace(' mlp { hidden_units: [5] }', "")
VARIANTS = {"bottom": CONFIG, "experts": EXPERTS, "bare": BARE}


def _batch():
    return make_batch(6, more_labels=("buy",))


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_one_logit_and_prediction_per_task(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    assert isinstance(model, DC2VR)
    check_one_logit_and_prediction_per_task(model)


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_total_loss_is_the_weighted_sum_of_the_task_losses(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS)
    check_task_losses_and_gradients(model)


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_the_logits_against_the_models_parts(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS).eval()
    batch = _batch()
    (features,) = model.dense_inputs(model.embed(batch), batch)
    net = model.net
    tasks = net.tasks
    with torch.no_grad():
        shared = net.bottom(features)
        if kind == "experts":
            experts = torch.stack([expert(shared) for expert in net.experts], dim=1)
            inputs = {}
            for name in ("ctr", "cvr"):
                gate = torch.softmax(tasks[name].task_input.gate(shared), dim=-1)
                inputs[name] = (gate.unsqueeze(-1) * experts).sum(dim=1)
        else:
            inputs = {"ctr": shared, "cvr": shared}
        ctr = tasks["ctr"].task_input.tower(inputs["ctr"])
        cvr = tasks["cvr"].task_input.tower(inputs["cvr"])
        intervention = tasks["cvr"].intervention
        w_b = intervention.base_rotation()
        w_s = intervention.source_rotation()
        cvr = cvr + (cvr @ w_b - ctr @ w_s) @ w_b.t()
        out = model(batch)
    if kind == "bare":
        assert ctr.shape == cvr.shape == (6, model.deep_group.dim)
    assert w_b.shape == (cvr.shape[1], 2) and w_s.shape == (ctr.shape[1], 2)
    torch.testing.assert_close(out["logits_ctr"], tasks["ctr"].logit(ctr).squeeze(-1))
    torch.testing.assert_close(out["y_cvr"], tasks["cvr"].logit(cvr).squeeze(-1))


def test_the_intervention_moves_the_logit_and_trains_only_its_own_tower():
    # Perturbing ctr's tower moves cvr's logit; cvr's loss does not train ctr's tower
    # (the source is not trained through the intervention) but trains both rotations.
    model = fake_model(EXPERTS, labels=LABELS)
    batch = _batch()
    before = model(batch)
    ctr = model.net.tasks["ctr"]
    with torch.no_grad():
        for p in ctr.task_input.tower.parameters():
            p.add_(0.5)
    after = model(batch)
    assert not torch.allclose(before["logits_cvr"], after["logits_cvr"])
    model.zero_grad()
    model.loss(after, batch)["l2_loss_cvr"].backward()
    assert all(p.grad is None or not p.grad.any() for p in ctr.parameters())
    intervention = model.net.tasks["cvr"].intervention
    assert intervention.base_rotation.raw.grad.abs().sum() > 0
    assert intervention.source_rotation.raw.grad.abs().sum() > 0


def test_a_later_tower_reads_the_intervened_output_and_the_sources_mean():
    # pay reads cvr (intervened by ctr) and ctr, averaged; its logit moves with ctr's
    # tower, through both.
    config = CONFIG.replace("mlp { hidden_units: [5] }", "mlp { hidden_units: [4] }").replace(
        "}\n}\n", '}\n  task_towers { tower_name: "pay" label_name: "buy" '
        'mlp { hidden_units: [3] } intervention_tower_names: ["cvr", "ctr"] '
        'low_rank_dim: 2 }\n}\n')
    model = fake_model(config, labels=LABELS).eval()
    batch = _batch()
    (features,) = model.dense_inputs(model.embed(batch), batch)
    tasks = model.net.tasks
    with torch.no_grad():
        shared = model.net.bottom(features)
        ctr = tasks["ctr"].task_input.tower(shared)
        cvr = tasks["cvr"].intervention(tasks["cvr"].task_input.tower(shared), ctr)
        pay = tasks["pay"].intervention(tasks["pay"].task_input.tower(shared),
                                        (cvr + ctr) / 2)
        out = model(batch)
    assert isinstance(tasks["cvr"].intervention, Intervention)
    assert tasks["pay"].intervention.source_rotation.raw.shape == (4, 2)
    torch.testing.assert_close(out["logits_pay"], tasks["pay"].logit(pay).squeeze(-1))


def test_towers_without_low_rank_dim_output_their_own_net(caplog):
    # TorchEasyRec's DC2VR reads intervention_tower_names only with low_rank_dim.
    config = CONFIG.replace(" low_rank_dim: 2", "")
    with caplog.at_level(logging.WARNING, logger="hashrec.models.dc2vr"):
        model = fake_model(config, labels=LABELS)
    assert "task_towers['cvr'].intervention_tower_names ['ctr']: not read without " \
        "low_rank_dim" in caplog.text
    batch = _batch()
    before = model(batch)
    with torch.no_grad():
        for p in model.net.tasks["ctr"].parameters():
            p.add_(1.0)
    after = model(batch)
    torch.testing.assert_close(after["y_cvr"], before["y_cvr"])
    assert not torch.allclose(after["logits_ctr"], before["logits_ctr"])


def test_a_towers_dropout_ratio_is_noted_and_not_applied(caplog):
    config = CONFIG.replace("low_rank_dim: 2", "low_rank_dim: 2 dropout_ratio: 0.5")
    with caplog.at_level(logging.WARNING, logger="hashrec.models.dc2vr"):
        model = fake_model(config, labels=LABELS)
    assert "task_towers['cvr'].dropout_ratio=0.5: noted and not used" in caplog.text
    batch = _batch()
    model.train()
    torch.testing.assert_close(model(batch)["y_cvr"], model(batch)["y_cvr"])


def test_missing_label_name_reads_the_label_field_of_the_towers_position():
    model = fake_model(CONFIG.replace(' label_name: "buy"', ""), labels=LABELS)
    assert [task.label_name for task in model.tasks] == ["clk", "buy"]


WIDE_SOURCES = CONFIG.replace("}\n}\n", '}\n  task_towers { tower_name: "pay" '
                              'label_name: "buy" mlp { hidden_units: [3] } '
                              'intervention_tower_names: ["cvr", "ctr"] low_rank_dim: 2 }\n}\n')


@pytest.mark.parametrize("text,message", [
    (CONFIG.replace('intervention_tower_names: "ctr"', 'intervention_tower_names: "ctx"'),
     "task_towers['cvr'].intervention_tower_names: 'ctx' is not an earlier task"),
    (CONFIG.replace('intervention_tower_names: "ctr"', 'intervention_tower_names: "cvr"'),
     "task_towers['cvr'].intervention_tower_names: 'cvr' is the task itself"),
    (CONFIG.replace('metrics { auc {} }',
                    'metrics { auc {} } intervention_tower_names: "cvr" low_rank_dim: 2'),
     "task_towers['ctr'].intervention_tower_names: 'cvr' is not an earlier task"),
    (CONFIG.replace('intervention_tower_names: "ctr"',
                    'intervention_tower_names: ["ctr", "ctr"]'),
     "task_towers['cvr'].intervention_tower_names: 'ctr' is named twice"),
    (CONFIG.replace('intervention_tower_names: "ctr" ', ""),
     "task_towers['cvr'].low_rank_dim=2 is set without intervention_tower_names"),
    (CONFIG.replace("low_rank_dim: 2", "low_rank_dim: 5"),
     "task_towers['cvr'].low_rank_dim=5; allowed: 1 to 4, below the tower's width 5"),
    (CONFIG.replace("low_rank_dim: 2", "low_rank_dim: 0"),
     "task_towers['cvr'].low_rank_dim=0; allowed: 1 to 4"),
    (WIDE_SOURCES, "task_towers['pay'].intervention_tower_names: towers of different "
     "widths (cvr 5, ctr 4)"),
    (EXPERTS.replace("num_expert: 2", "num_expert: 0"), "dc2vr.num_expert=0"),
    (CONFIG.replace("  task_towers", "  gate_mlp { hidden_units: [4] }\n  task_towers", 1),
     "dc2vr.gate_mlp is set without dc2vr.expert_mlp"),
    (CONFIG.replace('label_name: "buy"', 'label_name: "pay"'),
     "task_towers['cvr'].label_name 'pay' is not one of data_config.label_fields"),
    (CONFIG + "losses { l2_loss {} }\n", "set losses on each of dc2vr.task_towers"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "dc2vr reads DEEP feature groups only"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
], ids=["unknown-tower", "itself", "later-tower", "named-twice", "rank-without-towers",
        "rank-of-tower-width", "rank-0", "sources-of-two-widths", "no-experts",
        "gate-without-experts", "unknown-label", "model-losses", "sequence",
        "module-dict-attribute"])
def test_config_errors(text, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        fake_model(text, labels=LABELS)


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_the_scripted_network_equals_the_eager_one(kind):
    model = fake_model(VARIANTS[kind], labels=LABELS).eval()
    batch = _batch()
    inputs = list(model.dense_inputs(model.embed(batch), batch))
    scripted = torch.jit.script(model.net)
    torch.testing.assert_close(scripted(inputs), model.net(inputs))


def test_fine_tune_restores_each_task_by_tower_name(tmp_path):
    from hashrec.checkpoint import restore_fine_tune, save_checkpoint

    # A new first task: ctr and cvr, now second and third, keep their own modules.
    new = ('  task_towers { tower_name: "pay" label_name: "buy" }\n  task_towers '
           '{ tower_name: "ctr"')
    saved = fake_model(CONFIG, labels=LABELS)
    path = save_checkpoint(str(tmp_path), 1, saved, None, {})
    model = fake_model(CONFIG.replace('  task_towers { tower_name: "ctr"', new), labels=LABELS)
    restore_fine_tune(path, model, {})
    batch = _batch()
    for name in ("logits_ctr", "y_cvr"):
        torch.testing.assert_close(model(batch)[name], saved(batch)[name])
