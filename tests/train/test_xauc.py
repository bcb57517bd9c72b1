"""XAUC and grouped XAUC against pair counts spelled out."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from google.protobuf import text_format

from hashrec.config.pipeline_pb2 import EasyRecConfig
from hashrec.train.metrics import build_metrics
from hashrec.train.xauc import XAUC, GroupedXAUC, _pair_positions


def ordered_share(preds, labels) -> float:
    """Share over all pairs of those ordered alike (ties count 0)."""
    pairs = list(itertools.combinations(range(len(preds)), 2))
    return sum((labels[i] - labels[j]) * (preds[i] - preds[j]) > 0 for i, j in pairs) / len(pairs)


@pytest.mark.parametrize("rows", [2, 3, 14, 101])
def test_pair_numbers_enumerate_each_pair_once(rows):
    k = torch.arange(rows * (rows - 1) // 2)
    i, j = _pair_positions(k)
    assert sorted(zip(i.tolist(), j.tolist())) == list(itertools.combinations(range(rows), 2))


def test_pair_numbers_of_a_huge_group_stay_exact():
    j = torch.tensor([3_000_000, 4_000_001, 123_456_789])
    last = j * (j - 1) // 2 + j - 1  # the last pair (j - 1, j) of each j
    i, jj = _pair_positions(torch.cat([j * (j - 1) // 2, last]))
    assert jj.tolist() == j.tolist() * 2
    assert i.tolist() == [0, 0, 0, *(j - 1).tolist()]


def test_every_pair_when_the_draws_reach_their_number():
    torch.manual_seed(0)
    preds, labels = torch.rand(23), torch.randint(0, 4, (23,)).float()
    metric = XAUC(max_pairs=23 * 22 // 2)
    metric.update(preds[:10], labels[:10])
    metric.update(preds[10:], labels[10:])
    metric.sync()
    assert metric.compute() == pytest.approx(ordered_share(preds.tolist(), labels.tolist()))


def test_drawn_pairs_estimate_the_share_reproducibly():
    torch.manual_seed(1)
    labels = torch.rand(400)
    preds = labels + 0.3 * torch.randn(400)
    exact = ordered_share(preds.tolist(), labels.tolist())
    values = []
    for _ in range(2):
        metric = XAUC(sample_ratio=0.5)  # 39900 of 79800 pairs
        metric.update(preds, labels)
        values.append(metric.compute())
    assert values[0] == values[1]
    assert values[0] == pytest.approx(exact, abs=0.02)
    assert XAUC(sample_ratio=1e-6).draws(400) == 1  # at least one pair


def test_in_batch_averages_the_batches():
    batches = [([0.1, 0.5, 0.3], [1.0, 3.0, 2.0]), ([0.2, 0.1], [1.0, 2.0]), ([0.9], [1.0])]
    metric = XAUC(in_batch=True)
    for preds, labels in batches:
        metric.update(torch.tensor(preds), torch.tensor(labels))
    metric.sync()
    assert metric.compute() == pytest.approx((1.0 + 0.0) / 2)  # the one-row batch has no pair


def test_equal_labels_count_as_not_ordered():
    metric = XAUC(max_pairs=3)
    metric.update(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, 1.0, 2.0]))
    assert metric.compute() == pytest.approx(2 / 3)


def test_grouped_xauc_weighs_groups_by_rows():
    preds = torch.tensor([0.1, 0.2, 0.3, 0.9, 0.8, 0.5, 0.4])
    labels = torch.tensor([1.0, 2.0, 3.0, 1.0, 2.0, 5.0, 1.0])
    groups = torch.tensor([7, 7, 7, 3, 3, 9, 5])  # groups 9 and 5 have one row each
    metric = GroupedXAUC("user", max_pairs_per_group=3)
    metric.update(preds[:4], labels[:4], groups[:4])
    metric.update(preds[4:], labels[4:], groups[4:])
    metric.sync()
    assert metric.compute() == pytest.approx((3 * 1.0 + 2 * 0.0) / 5)


def test_grouped_xauc_draws_pairs_of_large_groups():
    torch.manual_seed(2)
    labels = torch.rand(300)
    preds = labels + 0.2 * torch.randn(300)
    groups = torch.arange(300) % 3
    metric = GroupedXAUC("user", max_pairs_per_group=20000)  # 4950 pairs a group: every one
    metric.update(preds, labels, groups)
    exact = sum(ordered_share(preds[groups == g].tolist(), labels[groups == g].tolist())
                for g in range(3)) / 3
    assert metric.compute() == pytest.approx(exact)
    sampled = GroupedXAUC("user", max_pairs_per_group=3000)
    sampled.update(preds, labels, groups)
    assert sampled.compute() == pytest.approx(exact, abs=0.03)


def test_undefined_results_say_why():
    metric = GroupedXAUC("user")
    metric.update(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 2.0]), torch.tensor([1, 2]))
    assert math.isnan(metric.compute())
    assert "no group of 'user' holds two rows" in metric.undefined_reason()
    single = XAUC()
    single.update(torch.tensor([0.5]), torch.tensor([1.0]))
    assert math.isnan(single.compute())
    assert single.undefined_reason() == "the evaluation has 1 rows"
    with pytest.raises(ValueError, match="sample_ratio=0"):
        XAUC(sample_ratio=0)


def test_the_config_builds_both():
    config = text_format.Parse(
        'model_config { metrics { xauc { max_pairs: 50 in_batch: true } } '
        'metrics { grouped_xauc { grouping_key: "user" max_pairs_per_group: 7 } } }',
        EasyRecConfig())
    metrics = build_metrics(config.model_config.metrics)
    assert isinstance(metrics["xauc"], XAUC) and metrics["xauc"].in_batch
    assert metrics["xauc"].max_pairs == 50
    assert metrics["grouped_xauc"].max_pairs_per_group == 7
    assert metrics["grouped_xauc"].grouping_key == "user"


def test_evaluation_reports_xauc_and_grouped_xauc_of_a_key_feature_outside_the_groups(
        tmp_path):
    from hashrec.config import parse_pipeline_config
    from hashrec.train.evaluation import evaluate
    from hashrec.train.session import build_session
    from tests.train.test_grouped_auc import CONFIG, _write

    text = CONFIG.format(model_dir=tmp_path / "m", key="session").replace(
        "metrics { grouped_auc",
        'metrics { xauc { max_pairs: 100000 } } metrics { grouped_xauc')
    session = build_session(parse_pipeline_config(text), device=torch.device("cpu"))
    assert "session" not in session.model.embedding.table_locations()
    table = _write(tmp_path / "eval.parquet", [f"{i % 7}" for i in range(40)])
    result = evaluate(session, str(tmp_path / "eval.parquet"), step=0)
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        probs = session.model(batch)["probs"].tolist()
    labels = batch.labels["clk"].tolist()
    groups = batch.sparse["session"].values.tolist()
    assert result["xauc"] == pytest.approx(ordered_share(probs, labels))
    shares = [(ordered_share([p for p, g in zip(probs, groups) if g == k],
                             [y for y, g in zip(labels, groups) if g == k]), groups.count(k))
              for k in set(groups) if groups.count(k) > 1]
    expected = sum(s * n for s, n in shares) / sum(n for _, n in shares)
    assert result["grouped_xauc"] == pytest.approx(expected)
