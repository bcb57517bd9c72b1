"""Checks shared by the multi-task model tests, on a model with a ``ctr`` task
(binary_cross_entropy, label ``clk``) and a ``cvr`` task (l2_loss weighted 0.5, label
``buy``)."""

from __future__ import annotations

import torch
from model_fakes import make_batch

LABELS = ("clk", "buy")
# The fakes' features as one DEEP group.
DEEP_GROUP = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }"""


def check_one_logit_and_prediction_per_task(model) -> None:
    """The forward gives each task's logit and prediction, (B,) each."""
    out = model(make_batch(6, more_labels=("buy",)))
    assert set(out) == {"logits_ctr", "probs_ctr", "logits_cvr", "y_cvr"}
    assert all(v.shape == (6,) for v in out.values())
    torch.testing.assert_close(out["probs_ctr"], torch.sigmoid(out["logits_ctr"]))
    torch.testing.assert_close(out["y_cvr"], out["logits_cvr"])


def check_task_losses_and_gradients(model) -> None:
    """The task losses (no sample weights) are the tasks' mean losses times their weights,
    and their sum reaches every parameter of the dense part."""
    batch = make_batch(6, more_labels=("buy",))
    out = model(batch)
    losses = model.loss(out, batch)
    assert list(losses) == ["binary_cross_entropy_ctr", "l2_loss_cvr"]
    p, clk, buy = out["probs_ctr"], batch.labels["clk"], batch.labels["buy"]
    bce = -(clk * p.log() + (1 - clk) * (1 - p).log())
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"], bce.mean())
    torch.testing.assert_close(losses["l2_loss_cvr"], 0.5 * ((out["y_cvr"] - buy) ** 2).mean())
    sum(losses.values()).backward()
    assert all(p.grad is not None for n, p in model.named_parameters()
               if not n.startswith("embedding"))
