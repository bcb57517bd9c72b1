"""PLE on the fakes: one logit per task, per-task losses weighted into the total, gates
that mix the right experts, config errors that name the level or the tower."""

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
from torch import nn

from hashrec.models import PLE, ModelError

CONFIG = DEEP_GROUP + """
ple {
  extraction_networks { network_name: "layer1" expert_num_per_task: 2 share_num: 2
                        task_expert_net { hidden_units: [8, 6] }
                        share_expert_net { hidden_units: [6] } }
  extraction_networks { network_name: "layer2" expert_num_per_task: 1 share_num: 3
                        task_expert_net { hidden_units: [4] }
                        share_expert_net { hidden_units: [5, 4] } }
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] }
                metrics { auc {} } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5
                losses { l2_loss {} } metrics { mean_squared_error {} } }
}
"""
# One level without shared experts, one expert per task: no gate has a choice.
NO_SHARED = DEEP_GROUP + """
ple {
  extraction_networks { network_name: "only" expert_num_per_task: 1
                        task_expert_net { hidden_units: [4] } }
  task_towers { tower_name: "ctr" label_name: "clk" }
  task_towers { tower_name: "cvr" label_name: "buy" losses { l2_loss {} } }
}
"""


def test_one_logit_and_prediction_per_task():
    model = fake_model(CONFIG, labels=LABELS)
    assert isinstance(model, PLE)
    check_one_logit_and_prediction_per_task(model)


def test_total_loss_is_the_weighted_sum_of_the_task_losses():
    model = fake_model(CONFIG, labels=LABELS)
    # Every expert and gate trains, the first level's shared gate included.
    check_task_losses_and_gradients(model)


def test_gate_widths_count_the_experts_they_mix():
    levels = fake_model(CONFIG, labels=LABELS).net.levels
    assert [task.gate.out_features for task in levels[0].tasks.values()] == [4, 4]
    assert levels[0].shared_gate.out_features == 2 * 2 + 2
    assert [task.gate.out_features for task in levels[1].tasks.values()] == [4, 4]
    assert not levels[1].has_shared_gate
    assert list(levels[1].tasks) == ["ctr", "cvr"]


def test_without_shared_experts_a_task_reads_its_single_expert():
    model = fake_model(NO_SHARED, labels=LABELS)
    batch = make_batch(6, more_labels=("buy",))
    features = model.dense_inputs(model.embed(batch), batch)[0]
    level = model.net.levels[0]
    assert not level.has_shared_gate and len(level.shared_experts) == 0
    for task in level.tasks.values():
        nn.init.normal_(task.gate.weight)  # any scores: the softmax over one expert is 1
    for name, tower in model.net.towers.items():
        expected = tower(level.tasks[name].experts[0](features)).squeeze(-1)
        torch.testing.assert_close(model(batch)[f"logits_{name}"], expected)


def test_a_tasks_gate_mixes_its_own_and_the_shared_experts_only():
    model = fake_model(CONFIG, labels=LABELS)
    level = model.net.levels[1]
    features = [torch.randn(5, 6), torch.randn(5, 6)]
    shared = torch.randn(5, 6)
    shared_out = [expert(shared) for expert in level.shared_experts]
    # The ctr gate picks its 4th expert (the last shared one); cvr's its own.
    gates = {"ctr": 3, "cvr": 0}
    for name, pick in gates.items():
        gate = level.tasks[name].gate
        nn.init.zeros_(gate.weight)
        with torch.no_grad():
            gate.bias.copy_(torch.full((4,), -1e4))
            gate.bias[pick] = 0.0
    outputs, _ = level(features, shared)
    torch.testing.assert_close(outputs[0], shared_out[2])
    torch.testing.assert_close(outputs[1], level.tasks["cvr"].experts[0](features[1]))


def test_the_shared_gate_mixes_every_expert_of_its_level():
    model = fake_model(CONFIG, labels=LABELS)
    level, width = model.net.levels[0], model.deep_group.dim
    features = [torch.randn(5, width), torch.randn(5, width)]
    shared = torch.randn(5, width)
    nn.init.zeros_(level.shared_gate.weight)
    nn.init.zeros_(level.shared_gate.bias)  # equal weights over the 6 experts
    _, mixed = level(features, shared)
    experts = [expert(x) for task, x in zip(level.tasks.values(), features)
               for expert in task.experts]
    experts += [expert(shared) for expert in level.shared_experts]
    assert len(experts) == 6
    torch.testing.assert_close(mixed, torch.stack(experts).mean(dim=0))


def _net(name: str, extra: str = "", per_task: int = 1) -> str:
    return (f'  extraction_networks {{ network_name: "{name}" expert_num_per_task: {per_task} '
            f'task_expert_net {{ hidden_units: [4] }} {extra}}}\n')


def _with_networks(*networks: str) -> str:
    start = CONFIG.index("  extraction_networks")
    return CONFIG[:start] + "".join(networks) + CONFIG[CONFIG.index("  task_towers"):]


@pytest.mark.parametrize("text,message", [
    (_with_networks(), "ple has no extraction_networks"),
    (_with_networks(_net("a", per_task=0)),
     "ple.extraction_networks['a'].expert_num_per_task=0; allowed: 1 or more"),
    (_with_networks(_net("a", "share_num: 2 share_expert_net { hidden_units: [5] } ")),
     "ple.extraction_networks['a']: share_expert_net's output width 5 differs from "
     "task_expert_net's 4"),
    (_with_networks(_net("a", "share_num: 1 ")),
     "ple.extraction_networks['a'].share_num=1 without share_expert_net"),
    (_with_networks(_net("a"), _net("a")), "ple.extraction_networks['a'] is defined twice"),
    (_with_networks(_net("")), "a level has an empty network_name"),
    (CONFIG.replace('label_name: "buy"', 'label_name: "pay"'),
     "task_towers['cvr'].label_name 'pay' is not one of data_config.label_fields"),
    (CONFIG[:CONFIG.index("  task_towers")] + "}\n", "ple has no task_towers"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "DEEP feature groups only"),
], ids=["no-levels", "no-task-experts", "expert-widths", "shared-without-net", "level-twice",
        "empty-level-name", "unknown-label", "no-tasks", "module-dict-attribute", "sequence"])
def test_config_errors(text, message):
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace("(", r"\(")):
        fake_model(text, labels=LABELS)


def test_shared_experts_after_a_level_without_them_read_its_shared_gate():
    # Level 1 has no shared experts, level 2 has: level 1's shared gate mixes the task
    # experts into level 2's shared input.
    text = _with_networks(_net("a"), _net("b", "share_num: 1 share_expert_net "
                                                "{ hidden_units: [4] } "))
    model = fake_model(text, labels=LABELS)
    first, second = model.net.levels
    assert first.has_shared_gate and first.shared_gate.out_features == 2
    assert second.shared_experts[0].output_dim() == 4 and not second.has_shared_gate
    batch = make_batch(6, more_labels=("buy",))
    out = model(batch)
    sum(model.loss(out, batch).values()).backward()
    assert first.shared_gate.weight.grad is not None
