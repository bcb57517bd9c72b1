"""Pareto-efficient loss weights: the solver against closed forms and hand-worked cases, its
least weights, degenerate Gram matrices, and the per-loss gradients of a step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hashrec.train.pareto import (
    ParetoLossWeights,
    gram_matrix,
    pareto_weights,
    project_to_simplex,
    solve_spd,
)


def _two_task_closed_form(g1: np.ndarray, g2: np.ndarray, least=(0.0, 0.0)) -> float:
    """w_1 of the least-norm point w_1 g1 + (1 - w_1) g2 of the segment, w_1 bounded to
    [least_1, 1 - least_2]."""
    diff = g1 - g2
    unbounded = float(np.dot(g2 - g1, g2) / np.dot(diff, diff))
    return min(max(unbounded, least[0]), 1 - least[1])


@pytest.mark.parametrize("g1, g2, least", [
    ([1.0, 0.0, 2.0], [-1.0, 1.0, 0.5], (0.0, 0.0)),      # between the two
    ([3.0, 0.0], [0.0, 1.0], (0.0, 0.0)),                 # orthogonal: 1 / 10 on the long one
    ([1.0, 1.0], [2.0, 2.5], (0.0, 0.0)),                 # g1 is the least-norm point: w_1 = 1
    ([3.0, 0.0], [0.0, 1.0], (0.3, 0.0)),                 # the least weight binds
    ([1.0, 1.0], [2.0, 2.5], (0.1, 0.25)),                # the other's least weight binds
    ([1.0, -2.0, 0.5, 4.0], [-0.5, 1.0, 3.0, 0.0], (0.2, 0.2)),
], ids=["between", "orthogonal", "first-is-least", "least-binds", "other-least-binds",
        "four-dims"])
def test_two_losses_match_the_closed_form(g1, g2, least):
    rows = torch.tensor([g1, g2], dtype=torch.float32)
    weights = pareto_weights(gram_matrix(rows), torch.tensor(least))
    expected = _two_task_closed_form(np.array(g1), np.array(g2), least)
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, torch.tensor([expected, 1 - expected]),
                               atol=1e-5, rtol=0)


def test_orthogonal_gradients_by_hand():
    # Orthogonal gradients of squared norms 1, 4, 4: w proportional to 1 / |g|^2 is
    # (4, 1, 1) / 6; least weights (0, 0.25, 0.25) leave 0.5 to project (2/3, -1/12, -1/12)
    # onto: theta = 1/6, so (0.5, 0, 0), plus the least weights.
    gram = torch.diag(torch.tensor([1.0, 4.0, 4.0]))
    torch.testing.assert_close(pareto_weights(gram, torch.zeros(3)),
                               torch.tensor([4 / 6, 1 / 6, 1 / 6]), atol=1e-6, rtol=0)
    torch.testing.assert_close(pareto_weights(gram, torch.tensor([0.0, 0.25, 0.25])),
                               torch.tensor([0.5, 0.25, 0.25]), atol=1e-6, rtol=0)


def _kkt_then_projection(gram: np.ndarray, least: np.ndarray) -> np.ndarray:
    """The two stages written another way: the equality-constrained problem's KKT system
    [[A, 1], [1^T, 0]] [h; lambda] = [-A c; 1 - sum c] solved by least squares (h = w - c),
    then the projection onto {x >= 0, sum x = 1 - sum c} by bisection on its threshold."""
    k = len(least)
    kkt = np.block([[gram, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
    rhs = np.concatenate([-gram @ least, [1 - least.sum()]])
    shifted = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:k]
    low, high = shifted.min() - 1, shifted.max()
    for _ in range(200):
        theta = (low + high) / 2
        low, high = (theta, high) if np.maximum(shifted - theta, 0).sum() > 1 - least.sum() \
            else (low, theta)
    return least + np.maximum(shifted - low, 0)


@pytest.mark.parametrize("k, seed", [(3, 0), (4, 1), (5, 2), (7, 3)],
                         ids=["k3", "k4", "k5", "k7"])
def test_matches_the_kkt_system_and_a_projection_by_bisection(k, seed):
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(k, 40))
    rows[1] += rows[0]  # correlated tasks
    least = rng.uniform(0, 0.8 / k, size=k)
    gram = rows @ rows.T
    expected = _kkt_then_projection(gram, least)
    got = pareto_weights(torch.tensor(gram, dtype=torch.float32), torch.tensor(least))
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-5)
    assert got.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert (got.numpy() >= least - 1e-6).all()


@pytest.mark.parametrize("gram, least, expected", [
    (torch.ones(2, 2), (0.0, 0.0), (0.5, 0.5)),                # parallel: any split, equal
    (torch.zeros(3, 3), (0.1, 0.0, 0.0), (1 / 3, 1 / 3, 1 / 3)),  # no gradient at all
    (torch.full((2, 2), float("nan")), (0.0, 0.0), (0.5, 0.5)),  # an overflow
    (torch.tensor([[1.0, float("inf")], [float("inf"), 4.0]]), (0.0, 0.6), (0.4, 0.6)),
    (torch.diag(torch.tensor([1.0, 0.0])), (0.0, 0.0), (0.0, 1.0)),  # a zero gradient wins
    (torch.tensor([[2.0]]), (0.3,), (1.0,)),                   # one loss
], ids=["parallel", "zero", "nan", "inf-least", "zero-gradient", "one-loss"])
def test_degenerate_gram_matrices_give_finite_weights(gram, least, expected):
    weights = pareto_weights(gram, torch.tensor(least))
    torch.testing.assert_close(weights, torch.tensor(expected), atol=1e-5, rtol=0)


def test_project_to_simplex():
    torch.testing.assert_close(project_to_simplex(torch.tensor([0.3, 0.2]), 1.0),
                               torch.tensor([0.55, 0.45]))
    torch.testing.assert_close(project_to_simplex(torch.tensor([5.0, 5.0, -3.0]), 1.0),
                               torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(project_to_simplex(torch.tensor([1.0, -1.0]), 0.4),
                               torch.tensor([0.4, 0.0]))
    inside = torch.tensor([0.1, 0.6, 0.3])  # on the simplex: unchanged
    torch.testing.assert_close(project_to_simplex(inside, 1.0), inside)


def test_solve_spd():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(6, 6))
    matrix = torch.tensor(a @ a.T + 6 * np.eye(6))
    rhs = torch.tensor(rng.normal(size=6))
    torch.testing.assert_close(solve_spd(matrix, rhs), torch.linalg.solve(matrix, rhs))


class _TwoHeads(torch.nn.Module):
    """A shared linear layer and a head per loss over it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = torch.nn.Linear(4, 3)
        self.heads = torch.nn.ModuleList([torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)])

    def losses(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.shared(inputs))
        return {f"l2_{i}": ((head(hidden).squeeze(-1) - i) ** 2).mean()
                for i, head in enumerate(self.heads)}


def _flat_gradient(loss, params) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params)])


def test_a_step_weighs_its_losses_by_the_solved_weights():
    model = _TwoHeads()
    params = list(model.parameters())
    # the embedding's stand-in: its backward must run once, in the step's own backward
    embedded = torch.randn(16, 4, requires_grad=True)
    calls = []
    embedded.register_hook(lambda grad: calls.append(grad))
    losses = model.losses(embedded * 1.0)
    pareto = ParetoLossWeights(tuple(losses), (0.1, 0.1), params)
    rows = pareto.gradients(list(losses.values()))
    expected_rows = torch.stack([_flat_gradient(loss, params) for loss in losses.values()])
    torch.testing.assert_close(rows, expected_rows)
    # each head's parameters have a gradient from their own loss alone
    assert rows[0, -4:].abs().sum() == 0 and rows[1, -8:-4].abs().sum() == 0

    total, weights = pareto.weigh(losses)
    assert calls == []  # no per-loss pass reached the embedding
    g = expected_rows.double().numpy()
    w1 = _two_task_closed_form(g[0], g[1], (0.1, 0.1))
    torch.testing.assert_close(weights, torch.tensor([w1, 1 - w1]), atol=1e-5, rtol=0)
    assert not weights.requires_grad
    torch.testing.assert_close(total, weights[0] * losses["l2_0"] + weights[1] * losses["l2_1"])
    total.backward()
    assert len(calls) == 1
    got = torch.cat([p.grad.reshape(-1) for p in params])
    torch.testing.assert_close(got, weights[0] * expected_rows[0] + weights[1] * expected_rows[1])


class _OnceBackward(torch.autograd.Function):
    """Identity whose backward runs once per forward, as a replayed CUDA graph's captured
    backward can (its activations' memory is reused while it runs): a second backward of
    one forward fails."""

    @staticmethod
    def forward(ctx, x):
        ctx.state = {"spent": False}
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.state["spent"]:
            raise RuntimeError("a second backward of one forward")
        ctx.state["spent"] = True
        return grad


def test_a_backward_once_per_forward_takes_a_new_forward_for_each_loss():
    model = _TwoHeads()
    params = list(model.parameters())
    inputs = torch.randn(16, 4)
    pareto = ParetoLossWeights(("l2_0", "l2_1"), (0.1, 0.1), params)
    expected_total, expected = pareto.weigh(model.losses(inputs))
    expected_total.backward()
    expected_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None

    forwards = []

    def forward():  # model.losses with the once-backward between the two layers
        forwards.append(1)
        hidden = torch.relu(_OnceBackward.apply(model.shared(inputs)))
        return {f"l2_{i}": ((head(hidden).squeeze(-1) - i) ** 2).mean()
                for i, head in enumerate(model.heads)}

    with pytest.raises(RuntimeError, match="a second backward"):
        pareto.weigh(forward())  # one forward for every backward: fails
    forwards.clear()
    total, weights = pareto.weigh(forward(), forward)
    assert len(forwards) == 3  # the step's, one more for the second loss, one for the step
    assert torch.equal(weights, expected)
    torch.testing.assert_close(total, expected_total)
    total.backward()
    for p, want in zip(params, expected_grads):
        torch.testing.assert_close(p.grad, want)


def test_scaled_losses_give_the_same_weights_and_repeat_exactly():
    model = _TwoHeads()
    losses = model.losses(torch.randn(16, 4))
    params = list(model.parameters())
    plain = ParetoLossWeights(tuple(losses), (0.0, 0.0), params)
    scaled = ParetoLossWeights(tuple(losses), (0.0, 0.0), params, lambda loss: loss * 65536.0)
    values = list(losses.values())
    torch.testing.assert_close(scaled.weights(values), plain.weights(values), atol=1e-6, rtol=0)
    assert torch.equal(plain.weights(values), plain.weights(values))


def test_one_least_weight_per_loss():
    with pytest.raises(ValueError, match="3 least weights for 2 losses"):
        ParetoLossWeights(("a", "b"), (0.1, 0.1, 0.1), [])


def test_the_weights_are_solved_without_host_reads():
    from host_reads import HostReads

    model = _TwoHeads()
    losses = model.losses(torch.randn(16, 4))
    pareto = ParetoLossWeights(tuple(losses), (0.1, 0.2), list(model.parameters()))
    with HostReads(tolist=True) as reads:
        pareto.weigh(losses)
    assert not reads.counts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_step_solves_without_syncing_like_the_cpu_and_repeats_exactly():
    model = _TwoHeads()
    inputs = torch.randn(64, 4)
    losses = model.losses(inputs)
    on_cpu = ParetoLossWeights(tuple(losses), (0.1, 0.2), list(model.parameters()))
    expected = on_cpu.weigh(losses)[1]
    model.cuda()
    losses = model.losses(inputs.cuda())
    pareto = ParetoLossWeights(tuple(losses), (0.1, 0.2), list(model.parameters()))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        first = pareto.weigh(losses)[1]
        second = pareto.weigh(losses)[1]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first, second)
    torch.testing.assert_close(first.cpu(), expected, atol=1e-5, rtol=0)
