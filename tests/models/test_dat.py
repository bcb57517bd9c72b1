"""DAT's towers, similarities and adaptive-mimic (AMM) losses against hand computations,
where its gradients go, and its config errors."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch

from hashrec.config import parse_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.features.batch import Batch
from hashrec.models import ModelError
from hashrec.models.losses import amm_loss, match_loss
from hashrec.models.match import amm_rows

# DAT over the fakes: each tower's augment vector is its id's embedding (4 wide, as the
# towers' output_dim), the id also among the tower's features, as in TorchEasyRec's docs.
CONFIG = """
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "user_augment" feature_names: ["user_id"] group_type: DEEP }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
feature_groups { group_name: "item_augment" feature_names: ["item_id"] group_type: DEEP }
dat { user_tower { input: "user" augment_input: "user_augment" mlp { hidden_units: [8] } }
      item_tower { input: "item" augment_input: "item_augment" mlp { hidden_units: [6] } }
      output_dim: 4 similarity: COSINE temperature: 0.5 amm_u_weight: 0.3
      amm_i_weight: 0.7 %s }
losses { softmax_cross_entropy {} }
"""
ROWS, SAMPLED = 4, 2


def test_amm_rows_are_the_squared_distance_of_the_normalized_augment_vector():
    augment = torch.tensor([[3.0, 4.0], [0.0, -2.0]])
    target = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    # normalized: [0.6, 0.8] and [0, -1]
    expected = [(0.6 - 1) ** 2 + 0.8 ** 2, 0.5 ** 2 + 1.5 ** 2]
    torch.testing.assert_close(amm_rows(augment, target), torch.tensor(expected))


def test_amm_loss_is_a_weighted_sum_over_rows_or_a_weighted_mean_with_sample_weights():
    rows = torch.tensor([1.0, 2.0, 4.0])
    # unweighted: TorchEasyRec's sum over the rows, not their mean
    assert amm_loss(rows, 0.5).item() == pytest.approx(0.5 * 7.0)
    weights = torch.tensor([1.0, 0.0, 3.0])
    assert amm_loss(rows, 0.5, weights).item() == pytest.approx(0.5 * (1 + 12) / 4)
    assert amm_loss(rows, 0.5, torch.zeros(3)).item() == 0.0


def test_amm_rows_train_the_augment_vector_alone():
    augment = torch.tensor([[3.0, 4.0]], requires_grad=True)
    target = torch.tensor([[1.0, 0.0]], requires_grad=True)
    amm_rows(augment, target).sum().backward()
    assert augment.grad.abs().sum() > 0 and target.grad is None


def _batch(sampled: int, seed: int = 1, weights: bool = False) -> Batch:
    batch = make_batch(ROWS + sampled, seed=seed)
    labels = {k: v[:ROWS] for k, v in batch.labels.items()}
    if weights:
        labels["w"] = torch.tensor([1.0, 2.0, 0.0, 0.5])
    return Batch(batch.sparse, dense=batch.dense, labels=labels, batch_size=ROWS,
                 negatives=sampled)


def _by_hand(model, batch):
    """Each tower's embeddings from its groups' embeddings, computed here: (user (B, D),
    item (B + N, D), user augment (B, D), item augment (B + N, D))."""
    out = model.embedding(batch.sparse)
    pooled, price = out.pooled, batch.dense["price"]
    user_augment = pooled["user_id"][:ROWS]
    item_augment = pooled["item_id"]
    user = torch.cat([pooled["user_id"], price], dim=1)[:ROWS]
    item = torch.cat([pooled["item_id"], pooled["cate_id"]], dim=1)
    norm = torch.nn.functional.normalize
    user = norm(model.user_tower.output(model.user_tower.mlp(
        torch.cat([user, user_augment], dim=1))), dim=1)
    item = norm(model.item_tower.output(model.item_tower.mlp(
        torch.cat([item, item_augment], dim=1))), dim=1)
    return user, item, user_augment, item_augment


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("negatives", ["in_batch_negative: true", ""],
                         ids=["in-batch", "sampled"])
def test_losses_are_the_softmax_and_amm_losses_of_the_hand_computed_towers(negatives,
                                                                          weighted):
    model = fake_model(CONFIG % negatives, weights=("w",) if weighted else ())
    sampled = 0 if negatives else SAMPLED
    batch = _batch(sampled, weights=weighted)
    user, item, user_augment, item_augment = _by_hand(model, batch)
    if sampled:
        similarity = torch.cat([(user * item[:ROWS]).sum(-1, keepdim=True),
                                user @ item[ROWS:].t()], dim=1) / 0.5
    else:
        similarity = user @ item.t() / 0.5
    weights = batch.labels["w"] if weighted else None
    u_rows = ((user_augment / user_augment.norm(dim=1, keepdim=True) - item[:ROWS]) ** 2
              ).sum(dim=1)
    i_rows = ((item_augment[:ROWS] / item_augment[:ROWS].norm(dim=1, keepdim=True) - user)
              ** 2).sum(dim=1)
    if weighted:
        expected_u = 0.3 * (u_rows * weights).sum() / weights.sum()
        expected_i = 0.7 * (i_rows * weights).sum() / weights.sum()
    else:
        expected_u, expected_i = 0.3 * u_rows.sum(), 0.7 * i_rows.sum()

    model.train()
    out = model(batch)
    torch.testing.assert_close(out["similarity"], similarity)
    losses = model.loss(out, batch)
    assert list(losses) == ["softmax_cross_entropy", "amm_loss_u", "amm_loss_i"]
    assert model.losses == tuple(losses)
    torch.testing.assert_close(losses["softmax_cross_entropy"],
                               match_loss(similarity, "first" if sampled else "diagonal",
                                          weights))
    torch.testing.assert_close(losses["amm_loss_u"], expected_u)
    torch.testing.assert_close(losses["amm_loss_i"], expected_i)

    model.eval()
    out = model(batch)
    assert list(out) == ["similarity"]
    torch.testing.assert_close(out["similarity"], similarity)
    assert list(model.loss(out, batch)) == list(model.eval_losses) == ["softmax_cross_entropy"]


def test_amm_losses_train_the_augment_vectors_and_the_softmax_loss_trains_them_too():
    """TorchEasyRec's gradients: the AMM losses reach the augment vectors alone (the
    towers' embeddings are detached there), the softmax loss reaches them through their
    tower's MLP."""
    model = fake_model(CONFIG % "in_batch_negative: true")
    batch = _batch(0)
    inputs = [t.detach().requires_grad_() for t in
              model.dense_inputs(model.embedding(batch.sparse), batch)]
    user, user_augment, item, item_augment = inputs
    targets = model.targets(batch)
    losses = model.losses_from_logits(model.dense_from_inputs(*inputs), *targets)
    dense = [p for m in model.dense_modules() for p in m.parameters()]
    amm = losses["amm_loss_u"] + losses["amm_loss_i"]
    grads = torch.autograd.grad(amm, [*inputs, *dense], allow_unused=True)
    assert grads[1].abs().sum() > 0 and grads[3].abs().sum() > 0  # the augment vectors
    assert all(g is None or g.abs().sum() == 0 for g in (grads[0], grads[2], *grads[4:]))
    softmax = model.losses_from_logits(model.dense_from_inputs(*inputs), *targets)
    grads = torch.autograd.grad(softmax["softmax_cross_entropy"], inputs)
    assert all(g.abs().sum() > 0 for g in grads)


def test_the_dense_network_packs_the_amm_terms_after_the_similarities_in_training():
    model = fake_model(CONFIG % "")
    batch = _batch(SAMPLED)
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    assert model.dense_from_inputs(*inputs).shape == (ROWS, 1 + SAMPLED + 2)
    model.eval()
    assert model.dense_from_inputs(*inputs).shape == (ROWS, 1 + SAMPLED)


@pytest.mark.parametrize("change, message", [
    (('augment_input: "user_augment"', 'augment_input: "nope"'),
     r"dat.user_tower.augment_input: input 'nope' is not a feature group"),
    (('group_name: "item_augment" feature_names: ["item_id"] group_type: DEEP',
      'group_name: "item_augment" feature_names: ["item_id"] group_type: WIDE'),
     r"dat.item_tower.augment_input: feature group 'item_augment' is WIDE, expected DEEP"),
    (('group_name: "user_augment" feature_names: ["user_id"]',
      'group_name: "user_augment" feature_names: ["user_id", "price"]'),
     r"dat.user_tower.augment_input: the feature group 'user_augment' is 5 wide, but the "
     r"AMM loss .* 4 wide"),
    (("amm_u_weight: 0.3", "amm_u_weight: -1"), r"dat.amm_u_weight=-1.0; allowed"),
    (('augment_input: "item_augment"', 'augment_input: "item"'),
     r"dat: the towers read the feature group\(s\) \['item'\] more than once"),
    (("output_dim: 4", "output_dim: 0"), r"dat: output_dim 0 .* 8 \(user\) and 6"),
])
def test_config_errors_name_the_field(change, message):
    text = (CONFIG % "in_batch_negative: true").replace(*change)
    with pytest.raises(ModelError, match=message):
        fake_model(text, wide=("item_id",) if "WIDE" in change[1] else ())


def test_a_config_without_augment_input_is_refused_naming_the_field():
    text = (CONFIG % "in_batch_negative: true").replace(' augment_input: "user_augment"', "")
    with pytest.raises(ConfigError, match=r"required fields are not set: "
                                          r"model_config.dat.user_tower.augment_input"):
        parse_pipeline_config(f'model_dir: "m"\nmodel_config {{ {text} }}')


def test_amm_weights_default_to_torcheasyrecs_half():
    text = (CONFIG % "in_batch_negative: true").replace("amm_u_weight: 0.3", "") \
        .replace("amm_i_weight: 0.7", "")
    model = fake_model(text)
    assert model.amm_u_weight == model.amm_i_weight == 0.5
