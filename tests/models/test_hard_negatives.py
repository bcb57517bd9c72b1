"""A match model's similarity and loss with hard negatives against hand computations:
(B, 1 + N + H), each row against its own hard negatives, -inf in empty slots that take
no probability and no label-smoothing share, and DSSM's output on such a batch."""

from __future__ import annotations

import math

import pytest
import torch
from model_fakes import fake_model, make_batch
from test_dense_inputs import DSSM

from hashrec.features.batch import Batch
from hashrec.models.losses import match_loss
from hashrec.models.match import batch_similarity
from hashrec.train.metrics import RecallAtK


def _hand(user, item, hard, in_batch):
    """The similarity matrix, one number at a time."""
    rows, slots = hard.shape
    shared = item.shape[0] - rows * slots
    out = []
    for i in range(rows):
        dot = lambda j, i=i: float((user[i] * item[j]).sum())  # noqa: E731
        row = [dot(j) for j in range(shared)] if in_batch else \
            [dot(i)] + [dot(j) for j in range(rows, shared)]
        for s in range(slots):
            row.append(dot(shared + i * slots + s) if hard[i, s] else -math.inf)
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("in_batch", [False, True], ids=["sampled", "in-batch"])
def test_each_row_scores_its_own_hard_negatives(in_batch):
    gen = torch.Generator().manual_seed(0)
    rows, negatives, slots = 3, 2, 2
    user = torch.randn(rows, 4, generator=gen)
    item = torch.randn(rows + negatives + rows * slots, 4, generator=gen)
    hard = torch.tensor([[True, True], [True, False], [False, False]])
    got = batch_similarity(user, item, in_batch, hard)
    width = (rows + negatives if in_batch else 1 + negatives) + slots
    assert got.shape == (rows, width)
    torch.testing.assert_close(got, _hand(user, item, hard, in_batch))


def test_the_loss_and_recall_leave_empty_slots_out():
    similarity = torch.tensor([[2.0, 1.0, 0.5, -math.inf],
                               [0.0, 1.0, -math.inf, -math.inf]], requires_grad=True)
    for smoothing in (0.0, 0.2):
        loss = match_loss(similarity, "first", None, smoothing)
        expected = 0.0
        for row, valid in ((similarity[0, :3], 3), (similarity[1, :2], 2)):
            log_p = torch.log_softmax(row.detach(), dim=0)
            expected += -(1 - smoothing) * log_p[0] - smoothing * log_p.sum() / valid
        torch.testing.assert_close(loss, expected / 2)
        (grad,) = torch.autograd.grad(loss, similarity)
        assert torch.isfinite(grad).all() and grad[0, 3] == 0 and (grad[1, 2:] == 0).all()
    recall = RecallAtK(top_k=3)
    recall.update(similarity, "first")  # row 1's positive ranks 2nd of its 2 candidates
    assert recall.compute() == 1.0


def test_dssm_scores_a_batch_with_hard_negatives():
    model = fake_model(DSSM % "", (), ("clk",))
    rows, negatives, slots = 4, 3, 2
    batch = make_batch(rows + negatives + rows * slots, seed=3)
    hard = torch.tensor([[True, False], [True, True], [False, False], [True, False]])
    batch = Batch(batch.sparse, dense=batch.dense,
                  labels={"clk": batch.labels["clk"][:rows]}, batch_size=rows,
                  negatives=negatives + rows * slots, hard_negatives=hard)
    similarity = model(batch)["similarity"]
    assert similarity.shape == (rows, 1 + negatives + slots)
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    assert inputs[-1] is hard
    user, item = (t.detach() for t in model.embeddings(*inputs[:-1]))
    torch.testing.assert_close(similarity, _hand(user, item, hard, False).to(user.dtype)
                               / model.temperature)
    assert torch.isinf(similarity[2, -2:]).all() and torch.isfinite(similarity[:, :-2]).all()
    losses = model.loss(model(batch), batch)
    assert losses and all(torch.isfinite(v) for v in losses.values())
