"""DC2VR's intervention: the orthonormal matrices against torch's orthogonal
parametrization and by hand, the intervention against its formula by hand, the source
untrained through it, TorchScript."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hashrec.modules import Intervention, OrthonormalMatrix


def _set(matrix: OrthonormalMatrix, raw, base=None) -> None:
    with torch.no_grad():
        matrix.raw.copy_(torch.as_tensor(raw, dtype=torch.float32))
        matrix.base.copy_(torch.eye(matrix.base.shape[0]) if base is None else base)


@pytest.mark.parametrize("a,expected", [(1.0, [0.0, 1.0]), (2.0, [-0.6, 0.8]),
                                        (0.0, [1.0, 0.0])], ids=["a1", "a2", "a0"])
def test_one_reflection_by_hand(a, expected):
    # v = [1, a], tau = 2 / (1 + a^2); the weight is -(e_1 - tau v v_1) = [tau - 1, tau a].
    tall = OrthonormalMatrix(2, 1)
    _set(tall, [[0.0], [a]])
    torch.testing.assert_close(tall(), torch.tensor([expected]).t())
    wide = OrthonormalMatrix(1, 2)
    _set(wide, [[0.0], [a]])
    torch.testing.assert_close(wide(), torch.tensor([expected]))


def test_it_starts_at_the_first_columns_of_its_base():
    matrix = OrthonormalMatrix(6, 2)
    torch.testing.assert_close(matrix(), matrix.base[:, :2])
    torch.testing.assert_close(matrix.base.t() @ matrix.base, torch.eye(6))


@pytest.mark.parametrize("rows,cols", [(7, 3), (3, 5), (6, 1), (1, 4), (5, 4)],
                         ids=["tall", "wide", "one-column", "one-row", "tall-by-one"])
def test_weights_and_gradients_equal_torchs_orthogonal_parametrization(rows, cols):
    # TorchEasyRec's RotateLayer: an orthogonal_ init under
    # torch.nn.utils.parametrizations.orthogonal (Householder, trivialization).
    torch.manual_seed(3)
    holder = nn.Module()
    holder.weight = nn.Parameter(nn.init.orthogonal_(torch.empty(rows, cols)))
    nn.utils.parametrizations.orthogonal(holder)
    parametrization = holder.parametrizations.weight
    tall = parametrization.original if rows >= cols else parametrization.original.mT
    with torch.no_grad():  # train the reflections away from the start (not the diagonal)
        tall.add_(0.5 * torch.tril(torch.randn_like(tall), -1))
    matrix = OrthonormalMatrix(rows, cols)
    _set(matrix, torch.tril(tall.detach(), -1), parametrization[0].base)
    torch.testing.assert_close(matrix(), holder.weight)
    upstream = torch.randn(rows, cols)
    (holder.weight * upstream).sum().backward()
    (matrix() * upstream).sum().backward()
    grad = parametrization.original.grad
    grad = grad if rows >= cols else grad.mT
    torch.testing.assert_close(matrix.raw.grad, torch.tril(grad, -1))
    weight = matrix()
    gram = weight.t() @ weight if rows >= cols else weight @ weight.t()
    torch.testing.assert_close(gram, torch.eye(min(rows, cols)))


def test_the_intervention_by_hand():
    # W_b = e_1 (3 x 1), W_s = e_1 (2 x 1): out = x_b + (x_b[0] - x_s[0]) e_1.
    intervention = Intervention(3, 2, 1)
    _set(intervention.base_rotation, torch.zeros(3, 1))
    _set(intervention.source_rotation, torch.zeros(2, 1))
    base = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    source = torch.tensor([[5.0, 7.0], [0.5, 9.0]])
    torch.testing.assert_close(intervention(base, source),
                               torch.tensor([[-3.0, 2.0, 3.0], [0.5, -1.0, 0.0]]))


def test_the_intervention_against_its_formula():
    # out = x_b + (x_b W_b - x_s W_s) W_b^T: the part of x_b outside W_b's columns is
    # kept, the part inside becomes 2 x_b W_b - x_s W_s (TorchEasyRec's sign).
    torch.manual_seed(5)
    intervention = Intervention(6, 4, 3)
    with torch.no_grad():
        for matrix in (intervention.base_rotation, intervention.source_rotation):
            matrix.raw.normal_(std=0.5)
    base, source = torch.randn(5, 6), torch.randn(5, 4)
    w_b = intervention.base_rotation().detach()
    w_s = intervention.source_rotation().detach()
    out = intervention(base, source)
    torch.testing.assert_close(out, base + (base @ w_b - source @ w_s) @ w_b.t())
    torch.testing.assert_close(out @ w_b, 2 * base @ w_b - source @ w_s)
    outside = torch.eye(6) - w_b @ w_b.t()
    torch.testing.assert_close(out @ outside, base @ outside)


def test_the_source_is_not_trained_through_the_intervention():
    intervention = Intervention(5, 5, 2)
    base = torch.randn(4, 5, requires_grad=True)
    source = torch.randn(4, 5, requires_grad=True)
    intervention(base, source).square().sum().backward()
    assert source.grad is None
    assert base.grad.abs().sum() > 0
    assert intervention.source_rotation.raw.grad.abs().sum() > 0
    assert intervention.base_rotation.raw.grad.abs().sum() > 0


@pytest.mark.parametrize("args,message", [
    ((4, 3, 4), "low_rank_dim=4 over a base of width 4; allowed: 1 to 3"),
    ((4, 3, 0), "low_rank_dim=0 over a base of width 4"),
    ((4, 0, 2), "source_dim=0"),
], ids=["rank-of-base-width", "rank-0", "source-0"])
def test_option_errors(args, message):
    with pytest.raises(ValueError, match=message):
        Intervention(*args)


def test_scripted_equals_eager():
    torch.manual_seed(2)
    intervention = Intervention(6, 2, 3)  # a source narrower than the shared space
    with torch.no_grad():
        intervention.source_rotation.raw.normal_()
        intervention.base_rotation.raw.normal_()
    base, source = torch.randn(3, 6), torch.randn(3, 2)
    scripted = torch.jit.script(intervention)
    torch.testing.assert_close(scripted(base, source), intervention(base, source))
