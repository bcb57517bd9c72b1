import math
import warnings

import pytest
import torch

from hashrec.train.class_metrics import MulticlassBinnedAUC
from hashrec.train.metrics import (
    Accuracy,
    BinnedAUC,
    MeanAbsoluteError,
    MeanSquaredError,
    build_metrics,
)


def exact_auc(probs, labels):
    """Mann-Whitney over all pairs (ties count 1/2)."""
    pos = [p for p, y in zip(probs, labels) if y == 1]
    neg = [p for p, y in zip(probs, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binned_auc_matches_exact_when_bins_separate_scores(seed):
    gen = torch.Generator().manual_seed(seed)
    n = 300
    # Distinct scores between thresholds: with 1001 (a step of 1/1000) every score has
    # its own bin.
    probs = (torch.randperm(1000, generator=gen)[:n].double() + 0.5) / 1000
    labels = (torch.rand(n, generator=gen, dtype=torch.float64) < probs).double()
    auc = BinnedAUC(1001)
    for chunk in range(0, n, 64):
        auc.update(probs[chunk:chunk + 64], labels[chunk:chunk + 64])
    assert auc.compute() == pytest.approx(exact_auc(probs.tolist(), labels.tolist()), abs=1e-12)


def test_binned_auc_ties_in_a_bin_count_half():
    auc = BinnedAUC(10)
    auc.update(torch.tensor([0.51, 0.55, 0.9, 0.1]), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    # pos {0.51, 0.9} vs neg {0.55, 0.1}: 0.51 shares a bin with 0.55 -> 1/2.
    assert auc.compute() == pytest.approx((0.5 + 1 + 1 + 1) / 4)


@pytest.mark.parametrize("thresholds", [2, 3, 7, 200])
def test_binned_auc_is_torchmetrics_auroc_at_as_many_thresholds(thresholds):
    # TorchEasyRec's auc is torchmetrics' binary AUROC at `thresholds` thresholds
    # linspace(0, 1, thresholds): thresholds=3 ties 0.6 with 0.8 (both in [0.5, 1)).
    from torchmetrics.functional.classification import binary_auroc

    gen = torch.Generator().manual_seed(thresholds)
    probs = torch.cat([torch.tensor([0.6, 0.8, 0.3, 0.55]), torch.rand(500, generator=gen)])
    labels = torch.cat([torch.tensor([0, 1, 0, 1]),
                        (torch.rand(500, generator=gen) < probs[4:]).long()])
    auc = BinnedAUC(thresholds)
    auc.update(probs, labels)
    expected = float(binary_auroc(probs, labels, thresholds=thresholds))
    assert auc.compute() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("thresholds", [200, 1000])
def test_binned_auc_probabilities_on_the_thresholds_are_torchmetrics_auroc(thresholds):
    # A probability equal to a threshold is called positive by it; k / (n - 1) times
    # (n - 1) rounds below k for some k, which would put it one bin short.
    from torchmetrics.functional.classification import binary_auroc

    steps = torch.linspace(0, 1, thresholds)
    # positives on the thresholds, each negative between the threshold below and its own
    probs = torch.cat([steps[1:], (steps[1:] + steps[:-1]) / 2])
    labels = torch.cat([torch.ones(thresholds - 1), torch.zeros(thresholds - 1)]).long()
    auc = BinnedAUC(thresholds)
    auc.update(probs, labels)
    expected = float(binary_auroc(probs, labels, thresholds=thresholds))
    assert auc.compute() == pytest.approx(expected, abs=1e-6)  # torchmetrics: float32


def test_binned_auc_a_probability_of_one_is_above_the_last_step():
    auc = BinnedAUC(3)  # thresholds 0, 0.5, 1
    auc.update(torch.tensor([1.0, 0.9, 0.6, 0.8]), torch.tensor([1, 0, 1, 0]))
    # 1.0 alone reaches the last threshold; 0.9, 0.6 and 0.8 tie.
    assert auc.compute() == pytest.approx((1 + 1 + 0.5 + 0.5) / 4)


def test_binned_auc_close_to_exact_on_continuous_scores():
    gen = torch.Generator().manual_seed(7)
    probs = torch.rand(2000, generator=gen)
    labels = (torch.rand(2000, generator=gen) < probs).float()
    auc = BinnedAUC(200)
    auc.update(probs, labels)
    assert auc.compute() == pytest.approx(exact_auc(probs.tolist(), labels.tolist()), abs=2e-3)


def test_binned_auc_perfect_inverse_and_degenerate():
    auc = BinnedAUC(100)
    auc.update(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([1, 1, 0, 0]))
    assert auc.compute() == 1.0
    inverse = BinnedAUC(100)
    inverse.update(torch.tensor([0.9, 0.1]), torch.tensor([0, 1]))
    assert inverse.compute() == 0.0
    one_class = BinnedAUC(100)
    one_class.update(torch.tensor([0.3, 0.4]), torch.tensor([1, 1]))
    assert one_class.compute() != one_class.compute()  # NaN


def test_binned_auc_memory_is_fixed():
    auc = BinnedAUC(50)
    for _ in range(5):
        auc.update(torch.rand(1000), torch.randint(0, 2, (1000,)))
    assert auc.positives.numel() == 50 and float(auc.positives.sum() + auc.negatives.sum()) == 5000


def test_mean_metrics():
    probs, labels = torch.tensor([0.9, 0.2, 0.6]), torch.tensor([1.0, 1.0, 0.0])
    acc, mse, mae = Accuracy(), MeanSquaredError(), MeanAbsoluteError()
    for m in (acc, mse, mae):
        m.update(probs[:2], labels[:2])
        m.update(probs[2:], labels[2:])
    assert acc.compute() == pytest.approx(1 / 3)
    assert mse.compute() == pytest.approx((0.01 + 0.64 + 0.36) / 3)
    assert mae.compute() == pytest.approx((0.1 + 0.8 + 0.6) / 3)


@pytest.mark.parametrize("metric", [BinnedAUC, Accuracy, MeanSquaredError, "grouped_auc"])
def test_a_prediction_that_is_not_finite_makes_the_metric_nan(metric):
    # one NaN among good predictions (a diverged evaluation) must not read as a score
    probs, labels = torch.tensor([float("nan"), 0.9, 0.2, 0.7]), torch.tensor([1., 1., 0., 0.])
    if metric == "grouped_auc":
        from hashrec.train.grouped_auc import grouped_auc

        assert math.isnan(grouped_auc(probs, labels > 0.5, torch.zeros(4, dtype=torch.long)))
        return
    m = metric()
    m.update(probs[2:], labels[2:])
    m.update(probs[:2], labels[:2])
    assert math.isnan(m.compute())
    if metric is BinnedAUC:
        assert m.undefined_reason() == "1 predictions were NaN or infinite"


def test_build_metrics_default_and_thresholds():
    from google.protobuf import text_format

    from hashrec.config import model_pb2

    config = text_format.Parse("metrics { auc { thresholds: 64 } } metrics { accuracy {} }",
                               model_pb2.ModelConfig())
    metrics = build_metrics(config.metrics)
    assert set(metrics) == {"auc", "accuracy"} and metrics["auc"].num_bins == 64
    assert set(build_metrics([])) == {"auc"}


@pytest.mark.parametrize("metric", [BinnedAUC(), MulticlassBinnedAUC(2, 200, "macro")],
                         ids=["auc", "multiclass_auc"])
def test_strided_probabilities_bin_without_a_torch_warning(metric):
    # A two-class task's auc reads probs1 = probs[:, 1], a strided view: binning it as is
    # made torch warn (searchsorted's non-contiguous input) in every evaluation's log.
    probs = torch.softmax(torch.randn(64, 4), dim=1)
    strided = probs[:, 1] if isinstance(metric, BinnedAUC) else probs[:, ::2]
    labels = (torch.arange(64) % 2).double()
    torch.set_warn_always(True)  # torch warns once a process; a test before may have
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metric.update(strided, labels)
    finally:
        torch.set_warn_always(False)
    assert math.isfinite(metric.compute())
