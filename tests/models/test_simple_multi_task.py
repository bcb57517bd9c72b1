"""SimpleMultiTask on the fakes: each task's tower reads the DEEP groups, per-task
losses weighted into the total, config errors that name the tower."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import (
    DEEP_GROUP,
    LABELS,
    check_one_logit_and_prediction_per_task,
    check_task_losses_and_gradients,
)

from hashrec.models import ModelError, SimpleMultiTask

CONFIG = DEEP_GROUP + """
simple_multi_task {
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8, 4] } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 losses { l2_loss {} } }
}
"""


def _model(text=CONFIG):
    return fake_model(text, labels=LABELS)


def test_one_logit_and_prediction_per_task():
    model = _model()
    assert type(model) is SimpleMultiTask
    check_one_logit_and_prediction_per_task(model)


def test_task_losses_and_gradients():
    check_task_losses_and_gradients(_model())


def test_each_tower_reads_the_deep_groups():
    model = _model()
    model.eval()
    batch = make_batch(5, more_labels=("buy",))
    embedded = model.embedding(batch.sparse)
    x = torch.cat([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")]
                  + [batch.dense["price"]], dim=-1)
    ctr, cvr = model.net.towers["ctr"], model.net.towers["cvr"]
    # ctr: its MLP, then the linear layer; cvr (no mlp): the linear layer alone
    expected_ctr = ctr[1](ctr[0](x)).squeeze(-1)
    expected_cvr = (x @ cvr[1].weight.T + cvr[1].bias).squeeze(-1)
    out = model(batch)
    torch.testing.assert_close(out["logits_ctr"], expected_ctr)
    torch.testing.assert_close(out["logits_cvr"], expected_cvr)


def test_a_task_of_classes_has_a_logit_per_class():
    model = _model(CONFIG.replace("losses { l2_loss {} }",
                                  "num_class: 3 losses { softmax_cross_entropy {} }"))
    out = model(make_batch(4, more_labels=("buy",)))
    assert out["logits_cvr"].shape == out["probs_cvr"].shape == (4, 3)
    assert out["logits_ctr"].shape == (4,)


@pytest.mark.parametrize("text, message", [
    (CONFIG[:CONFIG.index("  task_towers")] + "}\n", "simple_multi_task has no task_towers"),
    (CONFIG.replace('label_name: "buy"', 'label_name: "pay"'),
     r"simple_multi_task.task_towers\['cvr'\].label_name 'pay' is not one of"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
    (CONFIG.replace("hidden_units: [8, 4]", "hidden_units: [8, 0]"),
     r"simple_multi_task.task_towers\['ctr'\].mlp"),
    (CONFIG + "losses { binary_cross_entropy {} }\n",
     "set losses on each of simple_multi_task.task_towers"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "simple_multi_task reads DEEP feature groups only"),
], ids=["no-tasks", "unknown-label", "module-dict-attribute", "bad-mlp", "model-losses",
        "sequence-group"])
def test_config_errors_name_the_tower(text, message):
    with pytest.raises(ModelError, match=message):
        _model(text)
