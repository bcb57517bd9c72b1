"""The losses against their formulas computed by hand, row by row in float64 (TorchEasyRec's
definitions: a focal factor the gradient does not flow through, torch's label smoothing,
JRC's in-session softmax), and their mean over a batch."""

from __future__ import annotations

import math

import pytest
import torch

from hashrec.models.losses import LossSpec, loss_rows, session_index, task_loss

LOGITS = [1.5, -0.3, 0.0, 2.2, -1.7]
LABELS = [1.0, 0.0, 1.0, 0.0, 1.0]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _bce(z: float, y: float) -> float:
    p = _sigmoid(z)
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


@pytest.mark.parametrize("gamma, alpha", [(2.0, 0.25), (0.0, 0.5), (1.5, 0.8)],
                         ids=["g2-a0.25", "g0-a0.5", "g1.5-a0.8"])
def test_focal_loss_is_the_bce_times_the_focal_factor(gamma, alpha):
    logits = torch.tensor(LOGITS, requires_grad=True)
    rows = loss_rows(LossSpec("binary_focal_loss", gamma=gamma, alpha=alpha), logits,
                     torch.tensor(LABELS))
    factors = []
    for i, (z, y) in enumerate(zip(LOGITS, LABELS)):
        p = _sigmoid(z)
        factor = alpha * y * (1 - p) ** gamma + (1 - alpha) * (1 - y) * p ** gamma
        factors.append(factor)
        assert rows[i].item() == pytest.approx(factor * _bce(z, y), rel=1e-5)
    # The factor is a constant to the gradient: d/dz = factor * (p - y), as TorchEasyRec
    # detaches it.
    rows.sum().backward()
    expected = [f * (_sigmoid(z) - y) for f, z, y in zip(factors, LOGITS, LABELS)]
    assert logits.grad.tolist() == pytest.approx(expected, rel=1e-5)


def test_focal_loss_of_gamma_0_alpha_half_is_half_the_bce():
    logits, labels = torch.tensor(LOGITS), torch.tensor(LABELS)
    focal = task_loss(LossSpec("binary_focal_loss", gamma=0.0, alpha=0.5), logits, labels)
    bce = task_loss("binary_cross_entropy", logits, labels)
    torch.testing.assert_close(focal, 0.5 * bce)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_softmax_cross_entropy_smooths_the_target_over_the_classes(smoothing):
    logits = [[2.0, -1.0, 0.5], [0.1, 0.2, 0.3], [-3.0, 4.0, 0.0]]
    labels = [0.0, 2.0, 1.0]
    rows = loss_rows(LossSpec("softmax_cross_entropy", label_smoothing=smoothing),
                     torch.tensor(logits), torch.tensor(labels))
    for i, (z, y) in enumerate(zip(logits, labels)):
        log_norm = math.log(sum(math.exp(v) for v in z))
        log_p = [v - log_norm for v in z]
        # target q = (1 - e) one_hot(y) + e / C
        q = [(1 - smoothing) * (c == int(y)) + smoothing / 3 for c in range(3)]
        assert rows[i].item() == pytest.approx(-sum(qc * lp for qc, lp in zip(q, log_p)),
                                               rel=1e-5)


def _jrc_by_hand(logits, labels, sessions, alpha):
    """Each row: alpha * its cross entropy + (1 - alpha) * minus the log of its softmax
    among itself and the rows of its session of the other label, on its label's logit."""
    rows = []
    for z, y, s in zip(logits, labels, sessions):
        k = int(y)
        ce = -(z[k] - math.log(math.exp(z[0]) + math.exp(z[1])))
        rivals = [logits[j][k] for j in range(len(labels))
                  if sessions[j] == s and labels[j] != y]
        ranking = -(z[k] - math.log(math.exp(z[k]) + sum(math.exp(r) for r in rivals)))
        rows.append(alpha * ce + (1 - alpha) * ranking)
    return rows


JRC_LOGITS = [[0.3, 1.2], [-0.5, 0.4], [1.1, -0.2], [0.0, 0.0], [2.0, -1.0], [-0.7, 0.9],
              [0.2, 0.6], [1.5, 0.5], [0.4, -0.4]]
JRC_LABELS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
# Sessions interleaved and unsorted: 7 and 9 hold both labels, 3 positives only, -5
# negatives only, 42 one row.
JRC_SESSIONS = [7, 7, 3, 9, -5, 3, 9, -5, 42]


@pytest.mark.parametrize("alpha", [0.5, 0.0, 1.0, 0.3])
def test_jrc_loss_is_calibration_plus_ranking_within_sessions(alpha):
    rows = loss_rows(LossSpec("jrc_loss", alpha=alpha, session_name="s"),
                     torch.tensor(JRC_LOGITS), torch.tensor(JRC_LABELS),
                     torch.tensor(JRC_SESSIONS))
    expected = _jrc_by_hand(JRC_LOGITS, JRC_LABELS, JRC_SESSIONS, alpha)
    assert rows.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_jrc_loss_without_rivals_is_the_cross_entropy_with_finite_gradients():
    # Every session holds one label only: the ranking terms are 0.
    logits = torch.tensor(JRC_LOGITS, requires_grad=True)
    sessions = torch.tensor([int(y) for y in JRC_LABELS])
    loss = task_loss(LossSpec("jrc_loss", alpha=0.4, session_name="s"), logits,
                     torch.tensor(JRC_LABELS), sessions=sessions)
    ce = torch.nn.functional.cross_entropy(logits.detach(), torch.tensor(JRC_LABELS).long())
    torch.testing.assert_close(loss.detach(), 0.4 * ce)
    loss.backward()
    assert torch.isfinite(logits.grad).all()


def test_jrc_loss_gradient_matches_the_hand_formula():
    # d(ranking of a positive i)/d(z_i1) = softmax weight of i among its rivals - 1.
    logits = torch.tensor([[0.0, 1.0], [0.0, 0.5], [0.0, -0.5]], requires_grad=True)
    labels = torch.tensor([1.0, 0.0, 0.0])
    rows = loss_rows(LossSpec("jrc_loss", alpha=0.0, session_name="s"), logits, labels,
                     torch.tensor([1, 1, 1]))
    rows[0].backward()
    weights = torch.softmax(torch.tensor([1.0, 0.5, -0.5]), 0)
    torch.testing.assert_close(logits.grad[:, 1], weights - torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(logits.grad[:, 0], torch.zeros(3))


def test_session_index_numbers_equal_ids_alike():
    ids = torch.tensor([5, -2, 5, 9, -2, 5, 100])
    index = session_index(ids)
    assert index.min() >= 0 and index.max() < len(ids)
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (index[i] == index[j]) == (ids[i] == ids[j])


@pytest.mark.parametrize("spec", [LossSpec("binary_focal_loss", 2.0, 0.25),
                                  LossSpec("softmax_cross_entropy", label_smoothing=0.2),
                                  LossSpec("jrc_loss", alpha=0.7, session_name="s")],
                         ids=["focal", "softmax", "jrc"])
def test_row_weights_give_the_weighted_mean(spec):
    two = spec.name != "binary_focal_loss"
    logits = torch.tensor(JRC_LOGITS) if two else torch.tensor(JRC_LOGITS)[:, 1]
    labels, sessions = torch.tensor(JRC_LABELS), torch.tensor(JRC_SESSIONS)
    weights = torch.tensor([1.0, 0.0, 2.0, 0.5, 1.0, 3.0, 0.0, 1.0, 0.25])
    rows = loss_rows(spec, logits, labels, sessions)
    torch.testing.assert_close(task_loss(spec, logits, labels, weights, sessions),
                               (rows * weights).sum() / weights.sum())
    torch.testing.assert_close(task_loss(spec, logits, labels, sessions=sessions), rows.mean())
    assert task_loss(spec, logits, labels, torch.zeros(9), sessions).item() == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "binary_focal_loss", "alpha": 1.0}, r"alpha=1.0; allowed: a number in \(0, 1\)"),
    ({"name": "binary_focal_loss", "gamma": -1.0}, r"gamma=-1.0; allowed: a number >= 0"),
    ({"name": "softmax_cross_entropy", "label_smoothing": 1.5}, r"label_smoothing=1.5"),
    ({"name": "jrc_loss"}, r"session_name is empty"),
    ({"name": "jrc_loss", "session_name": "s", "alpha": float("nan")}, r"alpha=nan"),
    ({"name": "hinge"}, r"LossSpec.name='hinge'; allowed: binary_cross_entropy"),
], ids=["focal-alpha", "focal-gamma", "smoothing", "jrc-session", "jrc-alpha", "name"])
def test_bad_loss_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LossSpec(**kwargs)
