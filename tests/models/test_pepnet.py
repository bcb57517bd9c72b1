"""PEPNet on the fakes: EPNet over the main group gated by the domain group, a PPNet
tower per task gated by the uia group, the task towers; the groups by name or by
TorchEasyRec's default names; config errors that name the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import (
    LABELS,
    check_one_logit_and_prediction_per_task,
    check_task_losses_and_gradients,
)

from hashrec.models import ModelError, PEPNet

GROUPS = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
feature_groups { group_name: "domain" feature_names: ["cate_id"] group_type: DEEP }
feature_groups { group_name: "uia" feature_names: ["user_id", "item_id"] group_type: DEEP }
"""
TOWERS = """
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] } }
  task_towers { tower_name: "cvr" label_name: "buy" weight: 0.5 losses { l2_loss {} } }
"""
# The groups named, as TorchEasyRec's example writes them.
CONFIG = GROUPS + f"""
pepnet {{
  main_group_name: "all" domain_group_name: "domain" uia_group_name: "uia"
  epnet_hidden_unit: 6 epnet_gamma: 2.0
  ppnet_hidden_units: [8, 6] ppnet_dropout_ratio: [0.1] ppnet_gamma: 1.5
  {TOWERS}
}}
"""
# The groups found by their default names, EPNet's hidden width the main group's.
DEFAULT_NAMES = GROUPS + f"pepnet {{ ppnet_hidden_units: [8] {TOWERS} }}"
# The main group alone: the task towers over it (a SimpleMultiTask).
MAIN_ONLY = GROUPS.split("feature_groups")[0] + "feature_groups" + \
    GROUPS.split("feature_groups")[1] + f"pepnet {{ {TOWERS} }}"


def _model(text=CONFIG):
    return fake_model(text, labels=LABELS)


def test_one_logit_and_prediction_per_task():
    model = _model()
    assert type(model) is PEPNet
    check_one_logit_and_prediction_per_task(model)


def test_task_losses_and_gradients():
    check_task_losses_and_gradients(_model())


def _groups(model, batch):
    embedded = model.embedding(batch.sparse)
    main = torch.cat([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")]
                     + [batch.dense["price"]], dim=-1)
    return main, embedded.pooled["cate_id"], \
        torch.cat([embedded.pooled["user_id"], embedded.pooled["item_id"]], dim=-1)


def _gate(gate, x):
    return gate.gamma * torch.sigmoid(gate.output(torch.relu(gate.hidden(x))))


@pytest.mark.parametrize("text", [CONFIG, DEFAULT_NAMES], ids=["named", "default-names"])
def test_logits_are_the_personalized_towers_by_hand(text):
    model = _model(text)
    model.eval()
    batch = make_batch(5, more_labels=("buy",))
    main, domain, uia = _groups(model, batch)
    net = model.net
    personalized = main * _gate(net.epnet.gate, torch.cat([domain, main], dim=-1))
    out = model(batch)
    for name in ("ctr", "cvr"):
        task = net.tasks[name]
        x = personalized
        prior = torch.cat([uia, personalized], dim=-1)
        for layer in task.ppnet.layers:
            x = torch.relu(layer.linear(x)) * _gate(layer.gate, prior)
        torch.testing.assert_close(out[f"logits_{name}"], task.tower(x).squeeze(-1))


def test_default_names_and_widths():
    model = _model(DEFAULT_NAMES)
    assert [g.name for g in model.input_groups] == ["all", "domain", "uia"]
    # EPNet's gate: [domain 4, main 13] -> main's width 13 hidden -> 13
    assert model.net.epnet.gate.hidden.weight.shape == (13, 17)
    assert model.net.tasks["ctr"].ppnet.layers[0].gate.hidden.in_features == 8 + 13
    assert model.net.epnet.gate.gamma == 2.0


def test_main_group_alone_feeds_the_task_towers():
    model = _model(MAIN_ONLY)
    model.eval()
    batch = make_batch(4, more_labels=("buy",))
    main, _, _ = _groups(model, batch)
    assert not model.net.has_domain and not model.net.has_uia
    out = model(batch)
    cvr = model.net.tasks["cvr"].tower
    torch.testing.assert_close(out["logits_cvr"], cvr(main).squeeze(-1))


def test_gates_give_the_main_embeddings_no_gradient_of_their_own():
    # With gamma's gates held constant, the main embeddings' gradient flows only through
    # the product main * gate, never through the gates' inputs (eval: no dropout).
    model = _model()
    model.eval()
    batch = make_batch(6, more_labels=("buy",))
    main, domain, uia = (t.detach().requires_grad_() for t in _groups(model, batch))
    logits = model.net([main, domain, uia])
    logits.sum().backward()
    gate = _gate(model.net.epnet.gate, torch.cat([domain, main], dim=-1)).detach()
    main2 = main.detach().requires_grad_()
    personalized = main2 * gate
    total = sum(task.tower(task.ppnet.layers[1](task.ppnet.layers[0](
        personalized, torch.cat([uia, personalized.detach()], -1)),
        torch.cat([uia, personalized.detach()], -1))).sum()
        for task in model.net.tasks.values())
    total.backward()
    torch.testing.assert_close(main.grad, main2.grad)


@pytest.mark.parametrize("text, message", [
    (CONFIG.replace('main_group_name: "all"', 'main_group_name: "main"'),
     r"pepnet.main_group_name: input 'main' is not a feature group"),
    (CONFIG.replace('domain_group_name: "domain"', 'domain_group_name: "dom"'),
     r"pepnet.domain_group_name: input 'dom' is not a feature group"),
    (CONFIG.replace("ppnet_hidden_units: [8, 6]", ""),
     r"pepnet.ppnet_hidden_units=\[\]; the uia group's PPNet needs"),
    (CONFIG.replace("ppnet_dropout_ratio: [0.1]", "ppnet_dropout_ratio: [0.1, 0.2, 0.3]"),
     r"pepnet.ppnet_dropout_ratio=\[0.1, 0.2, 0.3\]; allowed: none, one for every layer or "
     r"one per layer \(2\)"),
    (CONFIG.replace("ppnet_dropout_ratio: [0.1]", "ppnet_dropout_ratio: [1.0]"),
     r"pepnet.ppnet_dropout_ratio=\[1.0\]"),
    (CONFIG.replace("ppnet_gamma: 1.5", "ppnet_gamma: 0"), r"pepnet.ppnet_gamma=0.0"),
    (CONFIG.replace("epnet_gamma: 2.0", "epnet_gamma: -1"), r"pepnet.epnet_gamma=-1.0"),
    (CONFIG.replace("epnet_hidden_unit: 6", "epnet_hidden_unit: 0"),
     r"pepnet.epnet_hidden_unit=0"),
    (CONFIG.replace("ppnet_gamma: 1.5", 'ppnet_activation: "nn.Swish"'),
     r"pepnet.ppnet_activation: activation='nn.Swish' is not supported"),
    (CONFIG.replace('uia_group_name: "uia"', 'uia_group_name: "all"'),
     r"feature groups \['uia'\] are none of them"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG.replace('domain_group_name: "domain"',
                                               'domain_group_name: "seq"'),
     r"pepnet.domain_group_name: feature group 'seq' is SEQUENCE, expected DEEP"),
    (CONFIG.replace('"cvr"', '"keys"'), "tower_name 'keys' cannot name the task's module"),
    (CONFIG + "losses { binary_cross_entropy {} }\n",
     "set losses on each of pepnet.task_towers"),
], ids=["no-main-group", "unknown-domain-group", "no-ppnet-units", "dropout-count",
        "dropout-range", "ppnet-gamma", "epnet-gamma", "epnet-hidden", "activation",
        "unread-group", "sequence-domain", "module-name", "model-losses"])
def test_config_errors_name_the_field(text, message):
    with pytest.raises(ModelError, match=message):
        _model(text)


def test_ppnet_and_epnet_options_without_their_groups_are_warned_of(caplog):
    text = MAIN_ONLY.replace("pepnet {", "pepnet { epnet_hidden_unit: 4 "
                             "ppnet_hidden_units: [4]")
    with caplog.at_level("WARNING", logger="hashrec.models.pepnet"):
        model = _model(text)
    assert not model.net.has_domain and not model.net.has_uia
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "epnet_hidden_unit is set but there is no domain group" in messages
    assert "ppnet_hidden_units is set but there is no uia group" in messages
