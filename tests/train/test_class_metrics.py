"""The metrics of a task of classes against torchmetrics (TorchEasyRec's multiclass_auc is
``torchmetrics.AUROC(task="multiclass", thresholds, average)``, its accuracy of classes
``torchmetrics.Accuracy(task="multiclass", top_k)``), the default metric by num_class, and
the metrics that do not fit a task's classes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from google.protobuf import text_format
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_auroc

from hashrec.config import model_pb2
from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy
from hashrec.train.errors import TrainError
from hashrec.train.metrics import Accuracy, BinnedAUC, build_metrics, check_metrics


def _rows(n: int, classes: int, seed: int, absent: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    if absent is not None:
        labels[labels == absent] = (absent + 1) % classes
    # Probabilities that lean to the label, some landing on thresholds exactly.
    logits = torch.randn(n, classes, generator=gen) + 1.5 * torch.nn.functional.one_hot(
        labels, classes)
    probs = torch.softmax(logits, dim=-1)
    probs[:5] = torch.tensor([0.5, 0.25, 0.25] + [0.0] * (classes - 3))
    return probs, labels


@pytest.mark.parametrize("classes, thresholds, average, absent", [
    (3, 200, "macro", None), (4, 7, "weighted", None), (5, 3, "macro", 2),
    (4, 50, "weighted", 0)], ids=["c3-t200-macro", "c4-t7-weighted", "c5-t3-macro-absent",
                                  "c4-t50-weighted-absent"])
def test_multiclass_auc_is_torchmetrics_multiclass_auroc(classes, thresholds, average, absent):
    probs, labels = _rows(600, classes, classes + thresholds, absent)
    metric = MulticlassBinnedAUC(classes, thresholds, average)
    for start in range(0, 600, 128):  # streamed in batches
        metric.update(probs[start:start + 128], labels[start:start + 128].float())
    each = multiclass_auroc(probs, labels, classes, average="none", thresholds=thresholds)
    present = torch.arange(classes) != absent
    torch.testing.assert_close(metric.class_aucs()[present], each[present].double(),
                               atol=1e-6, rtol=0)
    if average == "weighted" or absent is None:
        expected = float(multiclass_auroc(probs, labels, classes, average=average,
                                          thresholds=thresholds))
    else:
        # torchmetrics gives a class without rows an AUC of 0 and averages it in; here it
        # has none and stays out of the average.
        assert each[absent] == 0
        expected = float(each[present].mean())
    assert metric.compute() == pytest.approx(expected, abs=1e-6)
    if absent is not None:
        assert math.isnan(metric.class_aucs()[absent])


def test_multiclass_auc_of_one_class_present_is_nan():
    metric = MulticlassBinnedAUC(3, 20)
    metric.update(torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]]), torch.tensor([1.0, 1.0]))
    assert math.isnan(metric.compute())


def test_multiclass_auc_state_is_fixed_and_one_tensor():
    metric = MulticlassBinnedAUC(3, 10)
    before = metric.state.shape
    metric.update(*_rows(1000, 3, 0))
    assert metric.state.shape == before == (3 * 2 * 10 + 1,)


@pytest.mark.parametrize("metric", [MulticlassBinnedAUC(3, 20), TopKAccuracy(3, 2)],
                         ids=["multiclass-auc", "top-k-accuracy"])
def test_a_prediction_that_is_not_finite_makes_it_nan(metric):
    probs, labels = _rows(20, 3, 1)
    probs[7, 1] = float("nan")
    metric.update(probs, labels.float())
    assert math.isnan(metric.compute())


@pytest.mark.parametrize("classes, top_k", [(3, 1), (5, 2), (5, 5), (2, 1)])
def test_top_k_accuracy_is_torchmetrics_multiclass_accuracy(classes, top_k):
    probs, labels = _rows(500, classes if classes > 2 else 3, classes * 10 + top_k)
    if classes == 2:
        probs, labels = torch.softmax(probs[:, :2] * 3, dim=-1), labels.clamp(max=1)
    probs[10:20] = 1.0 / classes  # ties: the first of the highest, as argmax and topk
    metric = TopKAccuracy(classes, top_k)
    metric.update(probs[:250], labels[:250].float())
    metric.update(probs[250:], labels[250:].float())
    expected = float(multiclass_accuracy(probs, labels, classes, average="micro",
                                         top_k=top_k))
    assert metric.compute() == pytest.approx(expected, abs=1e-6)  # float32 there


def test_bad_options_are_refused():
    with pytest.raises(TrainError, match=r"average='micro'; allowed: macro, weighted"):
        MulticlassBinnedAUC(3, 200, "micro")
    with pytest.raises(TrainError, match=r"top_k=4 of 3 classes; allowed: 1 to 3"):
        TopKAccuracy(3, 4)


def _configs(text: str):
    return text_format.Parse(text, model_pb2.ModelConfig()).metrics


def test_default_metric_by_num_class():
    # TorchEasyRec reports only the losses when no metric is set; HashRec's default is an
    # AUC: auc of one probability a row (probs1 with two classes), multiclass_auc above.
    assert isinstance(build_metrics([], num_class=1)["auc"], BinnedAUC)
    assert set(build_metrics([], num_class=2)) == {"auc"}
    default = build_metrics([], num_class=4)["multiclass_auc"]
    assert (default.num_classes, default.num_bins, default.average) == (4, 200, "macro")
    assert set(build_metrics([], regression=True)) == {"mean_squared_error"}


def test_accuracy_of_classes_is_the_top_k_accuracy():
    configs = _configs("metrics { accuracy { top_k: 2 threshold: 0.9 } } "
                       "metrics { multiclass_auc { thresholds: 16 average: 'weighted' } }")
    metrics = build_metrics(configs, num_class=3)
    assert isinstance(metrics["accuracy"], TopKAccuracy) and metrics["accuracy"].top_k == 2
    assert metrics["multiclass_auc"].num_bins == 16
    assert isinstance(build_metrics(configs[:1], num_class=1)["accuracy"], Accuracy)


def _check(metrics: str, num_class: int, loss: str = "softmax_cross_entropy {}") -> None:
    config = text_format.Parse(
        f'multi_tower {{}} num_class: {num_class} losses {{ {loss} }} {metrics}',
        model_pb2.ModelConfig())
    check_metrics(config, SimpleNamespace(label_fields=["y"], sample_weight_fields=(),
                                          id_features=lambda: ["user_id"]))


@pytest.mark.parametrize("metrics, num_class, loss, message", [
    ("metrics { auc {} }", 3, "softmax_cross_entropy {}",
     r"auc reads one probability a row; the task has 3 classes: use multiclass_auc"),
    ("metrics { grouped_auc { grouping_key: 'user_id' } }", 4, "softmax_cross_entropy {}",
     r"grouped_auc reads one probability a row"),
    ("metrics { multiclass_auc {} }", 1, "binary_cross_entropy {}",
     r"multiclass_auc needs a task of classes"),
    ("metrics { mean_squared_error {} }", 3, "softmax_cross_entropy {}",
     r"mean_squared_error compares a value y with the label"),
    ("metrics { accuracy { top_k: 2 } }", 1, "binary_cross_entropy {}",
     r"accuracy.top_k=2: the task has one logit"),
    ("metrics { accuracy { top_k: 4 } }", 3, "softmax_cross_entropy {}",
     r"accuracy.top_k=4; allowed: 1 to num_class \(3\)"),
], ids=["auc-3", "grouped-auc-4", "multiclass-auc-1", "mse-3", "top-k-binary", "top-k-4of3"])
def test_metrics_that_do_not_fit_the_classes_are_refused(metrics, num_class, loss, message):
    with pytest.raises(TrainError, match=r"model_config.metrics: " + message):
        _check(metrics, num_class, loss)


def test_two_classes_take_auc_and_grouped_auc():
    _check("metrics { auc {} } metrics { grouped_auc { grouping_key: 'user_id' } } "
           "metrics { accuracy { top_k: 2 } }", 2, "jrc_loss { session_name: 'user_id' }")


def test_a_jrc_session_name_that_is_no_id_feature_is_refused():
    with pytest.raises(TrainError, match=r"model_config.losses: jrc_loss session_name "
                                         r"'price' is not an id feature; it must name one "
                                         r"of feature_configs' features that give ids \(id "
                                         r"features, or raw features with boundaries: "
                                         r"user_id\), whose first id"):
        _check("", 2, "jrc_loss { session_name: 'price' }")
