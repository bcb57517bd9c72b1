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


# Towers per domain, as TorchEasyRec writes them: the label field "dom" holds each row's
# domain, an id in [0, 3).
DOMAIN_LABELS = (*LABELS, "dom")
DOMAINS = CONFIG.replace("pepnet {", 'pepnet {\n  domain_input_name: "dom" task_domain_num: 3')
# Without the groups: the towers per domain over the main group alone.
DOMAINS_MAIN_ONLY = MAIN_ONLY.replace("pepnet {", 'pepnet { domain_input_name: "dom" '
                                      'task_domain_num: 3')


def _domain_model(text=DOMAINS):
    model = fake_model(text, labels=DOMAIN_LABELS)
    model.eval()  # no dropout
    return model


def _domain_batch(domains, seed=0):
    batch = make_batch(len(domains), seed=seed, more_labels=("buy",))
    batch.labels["dom"] = torch.tensor(domains, dtype=torch.float32)
    return batch


def _personalized(model, batch):
    """Each task's tower input, by hand (EPNet, then the task's PPNet)."""
    main, domain, uia = _groups(model, batch)
    personalized = main * _gate(model.net.epnet.gate, torch.cat([domain, main], dim=-1))
    out = {}
    for name, task in model.net.tasks.items():
        x, prior = personalized, torch.cat([uia, personalized], dim=-1)
        for layer in task.ppnet.layers:
            x = torch.relu(layer.linear(x)) * _gate(layer.gate, prior)
        out[name] = x
    return out


def test_towers_per_domain_outputs_and_the_rows_domain_by_hand():
    model = _domain_model()
    domains = [2, 0, 1, 1, 0, 2, 2]
    batch = _domain_batch(domains)
    out = model(batch)
    # every domain's outputs, named as TorchEasyRec names them, and each row's domain's
    # under the task's names
    assert set(out) == {f"{kind}_{task}_{k}" for task, kind in (("ctr", "logits"),
                                                                 ("ctr", "probs"),
                                                                 ("cvr", "logits"),
                                                                 ("cvr", "y"))
                        for k in range(3)} | {"logits_ctr", "probs_ctr", "logits_cvr", "y_cvr"}
    x = _personalized(model, batch)
    rows = torch.arange(len(domains))
    for name in ("ctr", "cvr"):
        towers = model.net.tasks[name].tower.towers
        assert len(towers) == 3
        by_hand = torch.stack([tower(x[name]).squeeze(-1) for tower in towers], dim=1)
        for k in range(3):
            torch.testing.assert_close(out[f"logits_{name}_{k}"], by_hand[:, k])
        torch.testing.assert_close(out[f"logits_{name}"], by_hand[rows, domains])
    torch.testing.assert_close(out["probs_ctr"], torch.sigmoid(out["logits_ctr"]))
    torch.testing.assert_close(out["probs_ctr_1"], torch.sigmoid(out["logits_ctr_1"]))
    torch.testing.assert_close(out["y_cvr_2"], out["logits_cvr_2"])


def test_a_domain_tower_is_trained_on_its_domains_rows_alone():
    # no row of domain 1: its towers get a zero gradient, and their outputs leave the
    # loss as it is; the loss is the mean over every row of its domain's loss
    model = _domain_model()
    domains = [0, 2, 2, 0, 0, 2]
    batch = _domain_batch(domains)
    out = model(batch)
    losses = model.loss(out, batch)
    assert list(losses) == ["binary_cross_entropy_ctr", "l2_loss_cvr"]
    rows = torch.arange(len(domains))
    p = torch.stack([out[f"probs_ctr_{k}"] for k in range(3)], dim=1)[rows, domains]
    y = torch.stack([out[f"y_cvr_{k}"] for k in range(3)], dim=1)[rows, domains]
    clk, buy = batch.labels["clk"], batch.labels["buy"]
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"],
                               -(clk * p.log() + (1 - clk) * (1 - p).log()).mean())
    torch.testing.assert_close(losses["l2_loss_cvr"], 0.5 * ((y - buy) ** 2).mean())
    sum(losses.values()).backward()
    for name in ("ctr", "cvr"):
        towers = model.net.tasks[name].tower.towers
        for k, tower in enumerate(towers):
            grads = [p.grad for p in tower.parameters()]
            if k == 1:
                assert all(g is None or not g.any() for g in grads)
            else:
                assert all(g is not None and g.any() for g in grads)
    with torch.no_grad():
        for name in ("ctr", "cvr"):
            model.net.tasks[name].tower.towers[1][-1].bias.add_(5.0)
    again = model.loss(model(batch), batch)
    for key in losses:
        torch.testing.assert_close(again[key], losses[key])


def test_towers_per_domain_losses_of_the_dense_network_as_the_graphs_run_it():
    # the CUDA graphs' module: the dense network's logits and the targets (ending with the
    # domain ids); no operator whose result the host reads, in the forward and backward
    from host_reads import HostReads

    from hashrec.train.graphs import _DenseLoss

    model = _domain_model()
    batch = _domain_batch([1, 0, 2, 2, 1])
    targets = model.targets(batch)
    assert model.target_count == len(targets) == 2
    assert targets[-1].dtype == torch.int64 and targets[-1].tolist() == [1, 0, 2, 2, 1]
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    with HostReads() as reads:
        logits, losses = _DenseLoss(model)(*inputs, *targets)
        losses.sum().backward()
    assert dict(reads.counts) == {}
    assert logits.shape == (5, 6)  # two tasks, three domains, one logit each
    expected = model.loss(model(batch), batch)
    torch.testing.assert_close(losses, torch.stack(list(expected.values())))


def test_towers_per_domain_with_the_main_group_alone_and_their_scripted_network():
    model = _domain_model(DOMAINS_MAIN_ONLY)
    batch = _domain_batch([0, 1, 2, 1])
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    scripted = torch.jit.script(model.net)
    torch.testing.assert_close(scripted(list(inputs)), model.net(list(inputs)))
    main, _, _ = _groups(model, batch)
    out = model(batch)
    tower = model.net.tasks["cvr"].tower.towers[2]
    torch.testing.assert_close(out["logits_cvr_2"], tower(main).squeeze(-1))


def test_a_batch_without_the_domain_label_gives_every_domains_outputs_alone():
    model = _domain_model()
    batch = make_batch(4, more_labels=("buy",))
    out = model(batch)
    assert "probs_ctr_0" in out and "probs_ctr" not in out
    with pytest.raises(ModelError, match=r"batch has no domain label 'dom' "
                                         r"\(pepnet.domain_input_name"):
        model.loss(out, batch)


@pytest.mark.parametrize("text, labels, message", [
    (DOMAINS.replace("task_domain_num: 3", "task_domain_num: 0"), DOMAIN_LABELS,
     r"pepnet.task_domain_num=0; allowed: 1 or more"),
    (DOMAINS.replace('domain_input_name: "dom"', ""), DOMAIN_LABELS,
     r"pepnet.task_domain_num=3 without domain_input_name"),
    (DOMAINS, LABELS, r"pepnet.domain_input_name 'dom' is not one of "
                      r"data_config.label_fields \(clk, buy\); add it there"),
    (DOMAINS.replace('domain_input_name: "dom"', 'domain_input_name: "buy"'), DOMAIN_LABELS,
     r"pepnet.domain_input_name 'buy' is the label of task_towers \['cvr'\]"),
    (DOMAINS.replace('"cvr"', '"ctr_1"'), DOMAIN_LABELS,
     r"\['ctr_1'\] are tower names too"),
], ids=["no-domains", "count-without-input", "not-a-label", "task-label", "name-clash"])
def test_towers_per_domain_config_errors_name_the_field(text, labels, message):
    with pytest.raises(ModelError, match=message):
        fake_model(text, labels=labels)


def test_one_domain_gives_each_task_one_tower_named_as_torcheasyrec_names_it():
    model = _domain_model(DOMAINS.replace("task_domain_num: 3", ""))
    assert model.domains == 1
    out = model(_domain_batch([0, 0, 0]))
    assert {"logits_ctr_0", "probs_ctr_0", "y_cvr_0", "probs_ctr"} <= set(out)
    torch.testing.assert_close(out["logits_ctr"], out["logits_ctr_0"])
