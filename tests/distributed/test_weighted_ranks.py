"""Sample weights on 2 gloo ranks: the ranks train on the global weighted-mean loss.

Each rank's loss is its rows' weighted mean; the trainer scales it by
world * W_r / W (``WeightedLossScale``) before the gradients are averaged over ranks.
Rank r takes rows [r * B, (r + 1) * B) of each global batch of 2 * B rows, the second
rank's weights several times the first's: with the scale the two ranks must equal one
process trained on the global batches' weighted mean (head and table rows), without
it they must not. With two tasks (weights (B, 2), the second task's own weights, as a
task space gives them) each task's loss is scaled by its own factor.
"""

from __future__ import annotations

import pytest
import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import all_reduce_gradients
from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.models.rank_model import task_loss
from hashrec.table import InitializerArgs, SparseSGD
from hashrec.train.distributed import WeightedLossScale

WORLD, ROWS, STEPS, DIM = 2, 8, 5, 4


def _global_batch(step: int, tasks: int = 1
                  ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """ids (n,), labels and weights (n,), or (n, tasks) with several tasks."""
    g = torch.Generator().manual_seed(300 + step)
    n = WORLD * ROWS
    ids = torch.randint(0, 12, (n,), generator=g)
    labels = torch.randint(0, 2, (n, tasks), generator=g).float()
    weights = torch.randint(0, 4, (n, tasks), generator=g).float()
    weights[ROWS:, 0] *= 5  # the second rank's rows weigh more for the first task ...
    weights[:ROWS, 1:] *= 3  # ... and less for the others
    return (ids.tolist(), labels, weights) if tasks > 1 else \
        (ids.tolist(), labels[:, 0], weights[:, 0])


def _losses(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> dict:
    if labels.dim() == 1:
        return {"loss": task_loss("binary_cross_entropy", logits[:, 0], labels, weights)}
    return {f"loss_{i}": task_loss("binary_cross_entropy", logits[:, i], labels[:, i],
                                   weights[:, i]) for i in range(labels.shape[1])}


def _train(ctx=None, scaled: bool = True, tasks: int = 1) -> dict:
    device = ctx.device if ctx is not None else torch.device("cpu")
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3)
    collection = EmbeddingCollection([EmbeddingTableSpec("t", DIM, num_rows=12,
                                                         initializer=init)],
                                     [EmbeddingFeatureSpec("u", "t")], SparseSGD(lr=0.5),
                                     device, dist=ctx)
    torch.manual_seed(0)
    head = torch.nn.Linear(DIM, tasks).to(device)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    rows = slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS) if ctx is not None else slice(None)
    scale = WeightedLossScale(ctx) if ctx is not None and scaled else None
    for step in range(STEPS):
        ids, labels, weights = _global_batch(step, tasks)
        ids = ids[rows]
        kjt = KeyedJaggedTensor.from_lengths(["u"], torch.tensor(ids, dtype=torch.int64),
                                             torch.ones(len(ids), dtype=torch.int64))
        weights = weights[rows].to(device)
        if scale is not None:
            scale.start(weights)
        optimizer.zero_grad()
        logits = head(collection(kjt.to(device)).pooled["u"])
        losses = _losses(logits, labels[rows].to(device), weights)
        if scale is not None:
            losses = scale.scale(losses)
        sum(losses.values()).backward()
        if ctx is not None:
            all_reduce_gradients(list(head.parameters()), ctx)
        optimizer.step()
    state = {k: v.cpu().clone() for k, v in collection.state_dict().items()
             if v.dtype.is_floating_point}
    return {"state": state, "head": [p.detach().cpu().clone() for p in head.parameters()]}


def scenario_scaled(ctx):
    return _train(ctx, scaled=True)


def scenario_unscaled(ctx):
    return _train(ctx, scaled=False)


def scenario_two_tasks_scaled(ctx):
    return _train(ctx, scaled=True, tasks=2)


def scenario_two_tasks_unscaled(ctx):
    return _train(ctx, scaled=False, tasks=2)


def _close(a: dict, b: dict, atol: float = 1e-6) -> bool:
    return all(torch.allclose(x, y, atol=atol, rtol=1e-5)
               for x, y in zip(a["head"], b["head"])) and a["state"].keys() == \
        b["state"].keys() and all(torch.allclose(a["state"][k], b["state"][k], atol=atol,
                                                 rtol=1e-5) for k in a["state"])


def _check(worlds: dict, atol: float = 1e-6, tasks: int = 1) -> None:
    for ranks in worlds.values():
        for r in ranks:
            if isinstance(r, Exception):
                raise r
    reference = _train(tasks=tasks)
    assert reference["state"]
    for r in worlds["scaled"]:
        assert _close(r, reference, atol)
    assert not any(_close(r, reference, atol) for r in worlds["unscaled"])


def test_ranks_train_on_the_global_weighted_mean(tmp_path):
    _check(run_world({"scaled": scenario_scaled, "unscaled": scenario_unscaled}, WORLD,
                     tmp_path))


def test_each_task_is_scaled_to_its_global_weighted_mean(tmp_path):
    _check(run_world({"scaled": scenario_two_tasks_scaled,
                      "unscaled": scenario_two_tasks_unscaled}, WORLD, tmp_path), tasks=2)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_train_on_the_global_weighted_mean(tmp_path):
    """Two ranks on two GPUs (NCCL): the weights' sum reduced on the side stream."""
    _check(run_world({"scaled": scenario_scaled, "unscaled": scenario_unscaled}, WORLD,
                     tmp_path, cuda=True), atol=1e-5)


def scenario_one_rank_scale(ctx):
    scale = WeightedLossScale(ctx)
    scale.start(torch.tensor([0.0, 1.5, 2.5], device=ctx.device))
    loss = torch.tensor(3.0, device=ctx.device, requires_grad=True)
    scaled = scale.scale({"loss": loss})["loss"]
    scaled.backward()
    return float(scaled), float(loss.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_gpu_rank_reduces_the_weights_aside(tmp_path):
    """One NCCL rank: the side stream's all-reduce reaches the scale (a factor of 1)."""
    result = run_world({"one": scenario_one_rank_scale}, 1, tmp_path, cuda=True)["one"][0]
    if isinstance(result, Exception):
        raise result
    assert result == (3.0, 1.0)
