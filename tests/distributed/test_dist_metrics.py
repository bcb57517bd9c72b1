import contextlib
import logging

import pytest
import torch

from hashrec.distributed.metrics import (
    RankZeroLogger,
    all_reduce_scalars,
    auc_from_histograms,
    global_auc,
    mean_over_ranks,
    score_histograms,
)
from hashrec.distributed.process_group import DistContext, single_process_context


def _exact_auc(scores, labels):
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    wins = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    return float(wins.mean())


@pytest.mark.parametrize("n", [2, 17, 1000], ids=["n2", "n17", "n1000"])
def test_histogram_auc_matches_pairwise_auc(n):
    gen = torch.Generator().manual_seed(n)
    labels = torch.arange(n) % 2
    scores = (torch.rand(n, generator=gen) * 0.5 + 0.5 * labels * torch.rand(n, generator=gen))
    scores = (scores * 1000).round() / 1000  # on bin edges: histogram AUC is exact
    ctx = single_process_context("cpu")
    assert global_auc(scores, labels, ctx, num_bins=1000) == pytest.approx(
        _exact_auc(scores * 1000 // 1, labels), abs=1e-12)


def test_auc_degenerate_classes():
    pos, neg = score_histograms(torch.tensor([0.2, 0.9]), torch.tensor([1, 1]), num_bins=10)
    assert auc_from_histograms(pos, neg) == 0.5


def test_a_nan_score_is_an_error_naming_it():
    with pytest.raises(ValueError, match="1 of 3 scores are NaN"):
        score_histograms(torch.tensor([0.2, float("nan"), 0.9]), torch.tensor([1, 0, 1]))


def test_scalar_sums_without_process_group():
    ctx = single_process_context("cpu")
    assert all_reduce_scalars({"loss": 3.0, "n": 4}, ctx) == {"loss": 3.0, "n": 4.0}
    assert mean_over_ranks(3.0, 4, ctx) == 0.75
    assert mean_over_ranks(0.0, 0, ctx) == 0.0


def test_scalar_sums_keep_the_order_given():
    """The progress line and the evaluation's ids-found line list the tables in this order
    (the model's), under torchrun as in one process."""
    ctx = single_process_context("cpu")
    names = ["user_id\tsize", "adgroup_id\tsize", "cate_id\tsize"]
    assert list(all_reduce_scalars(dict.fromkeys(names, 1.0), ctx)) == names


def test_rank_zero_logger_is_silent_elsewhere(caplog):
    logger = logging.getLogger("hashrec.test.rank_zero")
    main, other = DistContext(), DistContext(rank=1, world_size=2, is_main=False)
    with caplog.at_level(logging.INFO, logger=logger.name):
        RankZeroLogger(logger, main).info("from main %d", 0)
        RankZeroLogger(logger, other).info("from rank %d", 1)
        RankZeroLogger(logger, other).error("failure on rank %d", 1)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["from main 0", "failure on rank 1"]


def _grouped_rows():
    gen = torch.Generator().manual_seed(3)
    probs = torch.rand(40, generator=gen)
    labels = torch.rand(40, generator=gen) < 0.5
    groups = torch.randint(0, 5, (40,), generator=gen)
    return probs, labels, groups


def scenario_grouped_auc(ctx):
    from hashrec.train.grouped_auc import GroupedAUC

    probs, labels, groups = _grouped_rows()
    mine = slice(0, 25) if ctx.rank == 0 else slice(25, 40)  # unequal shares
    metric = GroupedAUC("user_id")
    metric.update(probs[mine], labels[mine].float(), groups[mine])
    metric.sync()
    return metric.compute()


def test_grouped_auc_gathers_every_rank_rows(tmp_path):
    from dist_workers import run_world

    from hashrec.train.grouped_auc import grouped_auc

    (ranks,) = run_world({"gauc": scenario_grouped_auc}, 2, tmp_path).values()
    expected = grouped_auc(*_grouped_rows())
    assert ranks == [pytest.approx(expected, abs=1e-12)] * 2


def _class_rows():
    gen = torch.Generator().manual_seed(5)
    labels = torch.randint(0, 3, (50,), generator=gen)
    probs = torch.softmax(torch.randn(50, 3, generator=gen) + 2.0 * torch.nn.functional.one_hot(
        labels, 3), dim=-1)
    return probs, labels.float()


@contextlib.contextmanager
def _counted_all_reduces():
    """A list that gets an item per ``dist.all_reduce`` call inside the block."""
    import torch.distributed as dist

    calls = []
    reduce = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return reduce(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield calls
    finally:
        dist.all_reduce = reduce


def scenario_class_metrics(ctx):
    from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy

    probs, labels = _class_rows()
    mine = slice(0, 30) if ctx.rank == 0 else slice(30, 50)  # unequal shares
    results = []
    with _counted_all_reduces() as calls:
        for metric in (MulticlassBinnedAUC(3, 50, "weighted"), TopKAccuracy(3, 2)):
            metric.update(probs[mine], labels[mine])
            before = len(calls)
            metric.sync()
            results.append((metric.compute(), len(calls) - before))
    return results


def test_class_metrics_sum_every_rank_rows_in_one_all_reduce(tmp_path):
    from dist_workers import run_world

    from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy

    (ranks,) = run_world({"class": scenario_class_metrics}, 2, tmp_path).values()
    expected = []
    for metric in (MulticlassBinnedAUC(3, 50, "weighted"), TopKAccuracy(3, 2)):
        metric.update(*_class_rows())
        expected.append((pytest.approx(metric.compute(), abs=1e-12), 1))
    assert ranks == [expected] * 2


def _train_metric_task():
    from google.protobuf import text_format

    from hashrec.config import model_pb2
    from hashrec.models.tasks import Task

    configs = tuple(text_format.Parse(f"{metric} decay_rate: 0.5 decay_step: 2",
                                      model_pb2.TrainMetricConfig())
                    for metric in ("auc { thresholds: 20 }", "accuracy {}",
                                   "mean_squared_error {}"))
    return Task("", "clk", train_metric_configs=configs)


def _train_metric_steps():
    """Four steps of 12 rows: (probs, labels)."""
    gen = torch.Generator().manual_seed(7)
    labels = (torch.rand(4, 12, generator=gen) < 0.4).float()
    return torch.rand(4, 12, generator=gen) * 0.6 + 0.4 * labels, labels


def _run_train_metrics(rows: slice, reduce=None, steps=range(4), state=None, rank=0):
    from hashrec.train.train_metrics import TrainMetrics

    metrics = TrainMetrics([_train_metric_task()], reduce=reduce)
    if state is not None:
        metrics.load_state_dict(state, rank)
    probs, labels = _train_metric_steps()
    for step in steps:
        batch = type("Batch", (), {"labels": {"clk": labels[step, rows]}})()
        metrics.update({"probs": probs[step, rows]}, batch, step + 1)
    return metrics


def scenario_train_metrics(ctx):
    from hashrec.distributed.metrics import all_reduce_sum

    mine = slice(0, 7) if ctx.rank == 0 else slice(7, 12)  # unequal shares
    reduce = lambda t: all_reduce_sum(t, ctx)  # noqa: E731
    with _counted_all_reduces() as calls:
        values = _run_train_metrics(mine, reduce).values()
    # A checkpoint after step 3 (the window of step 3 pending), resumed on these ranks.
    state = _run_train_metrics(mine, reduce, range(3)).state_dict()
    resumed = _run_train_metrics(mine, reduce, range(3, 4), state, ctx.rank).values()
    return values, len(calls), state, resumed


def test_train_metrics_fold_every_ranks_window_in_one_all_reduce(tmp_path):
    """Also: the state a checkpoint keeps holds the ranks' windows summed, and a run
    resumed from it on two ranks or on one gets the uninterrupted run's values."""
    from dist_workers import run_world

    (ranks,) = run_world({"train": scenario_train_metrics}, 2, tmp_path).values()
    expected = _run_train_metrics(slice(0, 12)).values()
    assert set(expected) == {"auc", "accuracy", "mean_squared_error"}
    for values, calls, _, resumed in ranks:
        assert values == pytest.approx(expected, abs=1e-12)
        assert calls == 2  # one a fold: steps 2 and 4
        assert resumed == pytest.approx(expected, abs=1e-12)
    state = ranks[0][2]
    one = _run_train_metrics(slice(0, 12), steps=range(3)).state_dict()
    for name, saved in state["metrics"].items():
        for mine, theirs in zip(saved["window"] + saved["decayed"],
                                one["metrics"][name]["window"] + one["metrics"][name]["decayed"]):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    assert _run_train_metrics(slice(0, 12), steps=range(3, 4),
                              state=state).values() == pytest.approx(expected, abs=1e-12)
