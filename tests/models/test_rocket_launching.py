"""RocketLaunching on the fakes: the light network alone in eval mode (outputs ``_light``),
both networks in training; the training losses (each loss of both networks, the hint,
the feature distillation) against their formulas by hand; which parts each loss trains;
config errors that name the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from torch.nn import functional as F

from hashrec.models import ModelError, RocketLaunching

DEEP = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }"""
# light layers 6, 4 pair with the booster's 6 (its second) and 4 (its third)
CONFIG = DEEP + """
rocket_launching {
  share_mlp { hidden_units: [8] }
  booster_mlp { hidden_units: [8, 6, 4] }
  light_mlp { hidden_units: [6, 4] }
  feature_based_distillation: true
}
losses { binary_cross_entropy {} }
metrics { auc {} }
"""
EUCLID = CONFIG.replace("feature_based_distillation: true",
                        "feature_based_distillation: true feature_distillation_function: EUCLID")
NO_DISTILLATION = CONFIG.replace("feature_based_distillation: true", "")


def _model(text=CONFIG, weights=()):
    return fake_model(text, weights=weights)


def _features(model, batch):
    embedded = model.embedding(batch.sparse)
    return torch.cat([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")]
                     + [batch.dense["price"]], dim=-1)


def _hidden(mlp, x):
    outs = []
    for layer in mlp.layers:
        x = layer(x)
        outs.append(x)
    return outs


def test_eval_runs_the_light_network_alone():
    model = _model()
    assert type(model) is RocketLaunching
    model.eval()
    batch = make_batch(5)
    net = model.net
    shared = net.share(_features(model, batch))
    expected = net.light_out(net.light(shared)).squeeze(-1)
    out = model(batch)
    assert set(out) == {"logits_light", "probs_light"}
    torch.testing.assert_close(out["logits_light"], expected)
    torch.testing.assert_close(out["probs_light"], torch.sigmoid(expected))
    assert model.eval_losses == ("binary_cross_entropy_light",)
    assert list(model.loss(out, batch)) == ["binary_cross_entropy_light"]


def test_training_gives_the_booster_outputs_too():
    model = _model(NO_DISTILLATION)
    batch = make_batch(5)
    out = model(batch)
    assert set(out) == {"logits_light", "probs_light", "logits_booster", "probs_booster"}
    net = model.net
    shared = net.share(_features(model, batch))
    torch.testing.assert_close(out["logits_booster"],
                               net.booster_out(net.booster(shared)).squeeze(-1))


@pytest.mark.parametrize("text, cosine", [(CONFIG, True), (EUCLID, False)],
                         ids=["cosine", "euclid"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "sample-weights"])
def test_training_losses_by_hand(text, cosine, weighted):
    model = _model(text, weights=("w",) if weighted else ())
    batch = make_batch(6)
    w = torch.tensor([1.0, 0.0, 2.0, 1.0, 3.0, 0.5]) if weighted else torch.ones(6)
    if weighted:
        batch.labels["w"] = w
    logits = model.dense_forward(model.embedding(batch.sparse), batch)
    losses = model.losses_from_logits(logits, *model.targets(batch))
    assert list(losses) == list(model.losses) == [
        "binary_cross_entropy_booster", "binary_cross_entropy_light", "similarity_0",
        "similarity_1", "hint_l2_loss"]
    net, clk = model.net, batch.labels["clk"]
    shared = net.share(_features(model, batch))
    light_hidden, booster_hidden = _hidden(net.light, shared), _hidden(net.booster, shared)
    light = net.light_out(light_hidden[-1]).squeeze(-1)
    booster = net.booster_out(booster_hidden[-1]).squeeze(-1)

    def mean(rows):
        return (w * rows).sum() / w.sum()

    for name, z in (("light", light), ("booster", booster)):
        p = torch.sigmoid(z)
        bce = -(clk * p.log() + (1 - clk) * (1 - p).log())
        torch.testing.assert_close(losses[f"binary_cross_entropy_{name}"], mean(bce))
    torch.testing.assert_close(losses["hint_l2_loss"], mean((light - booster) ** 2))
    for k, (i, j) in enumerate([(0, 1), (1, 2)]):
        a, b = light_hidden[i], booster_hidden[j]
        if cosine:
            expected = -0.1 * mean(F.cosine_similarity(a, b, dim=1))
        else:  # TorchEasyRec's: sqrt(sum over rows of w / mean(w) * |a - b|^2)
            expected = torch.sqrt((w / w.mean() * ((a - b) ** 2).sum(dim=1)).sum())
        torch.testing.assert_close(losses[f"similarity_{k}"], expected)


def _grads(model, names):
    model.zero_grad()
    batch = make_batch(6)
    logits = model.dense_forward(model.embedding(batch.sparse), batch)
    losses = model.losses_from_logits(logits, *model.targets(batch))
    sum(losses[n] for n in names).backward()
    return {prefix: any(p.grad is not None and p.grad.abs().sum() > 0
                        for n, p in model.named_parameters() if n.startswith(prefix))
            for prefix in ("embedding", "net.share", "net.booster", "net.light")}


def test_the_light_network_learns_from_labels_and_booster_without_training_them():
    model = _model()
    light_terms = ["binary_cross_entropy_light", "hint_l2_loss", "similarity_0",
                   "similarity_1"]
    assert _grads(model, light_terms) == {"embedding": False, "net.share": False,
                                          "net.booster": False, "net.light": True}
    assert _grads(model, ["binary_cross_entropy_booster"]) == {
        "embedding": True, "net.share": True, "net.booster": True, "net.light": False}


def test_classes_give_each_network_its_logits():
    text = CONFIG.replace("losses { binary_cross_entropy {} }",
                          "num_class: 3 losses { softmax_cross_entropy {} }") \
        .replace("metrics { auc {} }", "metrics { multiclass_auc {} }")
    model = _model(text)
    batch = make_batch(4)
    batch.labels["clk"] = torch.tensor([0.0, 2.0, 1.0, 2.0])
    logits = model.dense_forward(model.embedding(batch.sparse), batch)
    assert logits.shape == (4, 3 + 3 + 2)
    out = model.predictions(logits)
    assert out["logits_light"].shape == out["probs_booster"].shape == (4, 3)
    losses = model.losses_from_logits(logits, *model.targets(batch))
    torch.testing.assert_close(losses["hint_l2_loss"],
                               ((logits[:, :3] - logits[:, 3:6]) ** 2).mean())
    model.eval()
    assert model(batch)["logits_light"].shape == (4, 3)


def test_train_metrics_read_the_light_network():
    from hashrec.train.train_metrics import TrainMetrics

    model = _model(CONFIG + "train_metrics { auc {} decay_step: 1 }")
    batch = make_batch(8)
    clk = torch.tensor([0.0, 1.0] * 4)
    batch.labels["clk"] = clk
    # a train-mode output whose light logits rank every row right, the booster's wrong
    packed = torch.stack([4 * clk - 2, 2 - 4 * clk, torch.zeros(8), torch.zeros(8)], dim=1)
    metrics = TrainMetrics(model.tasks)
    metrics.update(model.predictions(packed), batch, 1)
    assert metrics.values() == {"auc_light": pytest.approx(1.0)}


def test_loss_of_training_predictions_is_refused():
    model = _model()
    batch = make_batch(3)
    with pytest.raises(ModelError, match="training losses read the dense network's output"):
        model.loss(model(batch), batch)


@pytest.mark.parametrize("text, message", [
    (CONFIG.replace("light_mlp { hidden_units: [6, 4] }", "light_mlp { hidden_units: [5] }"),
     r"rocket_launching.feature_based_distillation pairs each light_mlp hidden layer .* "
     r"none matches \(light_mlp \[5\], booster_mlp \[8, 6, 4\]\)"),
    (CONFIG.replace("booster_mlp { hidden_units: [8, 6, 4] }",
                    "booster_mlp { hidden_units: [8, 0] }"), "rocket_launching.booster_mlp"),
    (CONFIG.replace("share_mlp { hidden_units: [8] }",
                    'share_mlp { hidden_units: [8] activation: "nn.Nope" }'),
     "rocket_launching.share_mlp"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "rocket_launching reads DEEP feature groups only"),
], ids=["no-width-in-common", "bad-booster", "bad-share", "sequence-group"])
def test_config_errors_name_the_field(text, message):
    with pytest.raises(ModelError, match=message):
        _model(text)
