"""grouped_auc: the mean per-group AUC, its checks, and its place in evaluation."""

from __future__ import annotations

import logging
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from google.protobuf import text_format

from hashrec.config import load_pipeline_config, parse_pipeline_config, validate_pipeline_config
from hashrec.config.validate import SUPPORTED_METRICS
from hashrec.train import metrics
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import evaluate
from hashrec.train.grouped_auc import GroupedAUC, grouped_auc
from hashrec.train.session import build_session


def _pairwise(probs, labels, groups) -> float:
    """Mean over groups with both classes of the share of (positive, negative) pairs
    ordered right, ties 1/2."""
    aucs = []
    for group in set(groups):
        pos = [p for p, y, g in zip(probs, labels, groups) if g == group and y]
        neg = [p for p, y, g in zip(probs, labels, groups) if g == group and not y]
        if pos and neg:
            wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
            aucs.append(wins / (len(pos) * len(neg)))
    return sum(aucs) / len(aucs) if aucs else float("nan")


@pytest.mark.parametrize("seed", range(6))
def test_grouped_auc_is_the_mean_of_pairwise_aucs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    probs = rng.choice([0.1, 0.25, 0.5, 0.9, *rng.random(4)], n).tolist()  # ties
    labels = (rng.random(n) < 0.4).tolist()
    groups = rng.integers(-3, 6, n).tolist()
    got = grouped_auc(torch.tensor(probs), torch.tensor(labels), torch.tensor(groups))
    want = _pairwise(probs, labels, groups)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def test_groups_of_one_class_do_not_count():
    probs = torch.tensor([0.9, 0.1, 0.3, 0.2, 0.8])
    labels = torch.tensor([True, False, True, True, False])
    groups = torch.tensor([7, 7, 8, 8, 9])  # group 8: positives only; 9: one negative
    assert grouped_auc(probs, labels, groups) == 1.0
    assert math.isnan(grouped_auc(probs[2:4], labels[2:4], groups[2:4]))
    metric = GroupedAUC("user_id")
    assert math.isnan(metric.compute())
    metric.update(probs[:2], labels[:2].float(), groups[:2])
    metric.update(probs[2:], labels[2:].float(), groups[2:])
    metric.sync()  # no process group: a no-op
    assert metric.compute() == 1.0


def test_the_config_layer_allows_every_metric_the_trainer_builds():
    assert SUPPORTED_METRICS == metrics.SUPPORTED_METRICS
    config = load_pipeline_config("examples/multi_tower_din_taobao.config")
    text_format.Merge('model_config { metrics { accuracy {} } metrics { grouped_auc { '
                      'grouping_key: "user_id" } } }', config)
    validate_pipeline_config(config)


CONFIG = """
model_dir: "{model_dir}"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
}}
data_config {{ batch_size: 16 dataset_type: ParquetDataset label_fields: "clk" num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 num_buckets: 50 }} }}
feature_configs {{ id_feature {{ feature_name: "tags" expression: "item:tags"
  embedding_dim: 4 num_buckets: 50 separator: "|" }} }}
feature_configs {{ id_feature {{ feature_name: "session" expression: "user:session"
  embedding_dim: 4 num_buckets: 50 }} }}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "tags"] group_type: DEEP }}
  multi_tower_din {{ towers {{ input: "deep" mlp {{ hidden_units: [4] }} }} }}
  metrics {{ auc {{}} }}
  metrics {{ grouped_auc {{ grouping_key: "{key}" }} }}
}}
"""


def _session(tmp_path, key: str):
    config = parse_pipeline_config(CONFIG.format(model_dir=tmp_path / "m", key=key))
    return build_session(config, device=torch.device("cpu"))


def _write(path, tags) -> pa.Table:
    rng = np.random.default_rng(0)
    n = len(tags)
    table = pa.table({"user_id": rng.integers(0, 6, n), "tags": pa.array(tags),
                      "session": rng.integers(0, 4, n), "clk": rng.integers(0, 2, n)})
    pq.write_table(table, path)
    return table


def _evaluated(session, table: pa.Table, path, key: str,
               prediction: str = "probs") -> tuple[dict, float]:
    """The evaluation result on ``path`` (holding ``table``) and the grouped AUC of the
    model's ``prediction`` on those rows grouped by feature ``key``."""
    result = evaluate(session, str(path), step=0)
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        probs = session.model(batch)[prediction]
    return result, grouped_auc(probs, batch.labels["clk"] > 0.5, batch.sparse[key].values)


def test_evaluation_reports_grouped_auc_by_the_key_feature(tmp_path):
    session = _session(tmp_path, "user_id")
    table = _write(tmp_path / "eval.parquet", [f"{i % 7}|{i % 5}" for i in range(70)])
    result, expected = _evaluated(session, table, tmp_path / "eval.parquet", "user_id")
    assert result["grouped_auc"] == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= result["grouped_auc"] <= 1.0 and result["auc"] != result["grouped_auc"]


def test_grouping_key_must_be_an_id_feature(tmp_path):
    with pytest.raises(TrainError, match="grouping_key 'nope' is not an id feature"):
        _session(tmp_path, "nope")


def test_rows_of_several_ids_or_none_group_by_the_first_or_zero(tmp_path, caplog):
    # TorchEasyRec groups by the key's bags padded to one column: first id, 0 if empty.
    session = _session(tmp_path, "tags")
    tags = ["1|2", "3", "", "0", "3|1", "", "2|2", "1"] * 6
    table = _write(tmp_path / "eval.parquet", tags)
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        result = evaluate(session, str(tmp_path / "eval.parquet"), step=0)
    assert "rows are grouped by their first id" in caplog.text
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        probs = session.model(batch)["probs"]
    bags = batch.sparse["tags"]
    first, at = [], 0
    for n in bags.lengths.tolist():
        first.append(int(bags.values[at]) if n else 0)
        at += n
    assert first[:8] == [1, 3, 0, 0, 3, 0, 2, 1]
    expected = grouped_auc(probs, batch.labels["clk"] > 0.5, torch.tensor(first))
    assert result["grouped_auc"] == pytest.approx(expected, abs=1e-12)


def test_a_grouping_key_in_no_feature_group_is_read_but_not_embedded(tmp_path):
    session = _session(tmp_path, "session")
    assert "session" in session.feature_set.features
    assert "session" not in session.model.embedding.table_locations()
    table = _write(tmp_path / "eval.parquet", [f"{i % 7}" for i in range(40)])
    result, expected = _evaluated(session, table, tmp_path / "eval.parquet", "session")
    assert result["grouped_auc"] == pytest.approx(expected, abs=1e-12)


def test_a_metric_listed_twice_is_refused(tmp_path):
    text = CONFIG.format(model_dir=tmp_path / "m", key="user_id").replace(
        "metrics { auc {} }", "metrics { auc {} } metrics { auc {} }")
    with pytest.raises(TrainError, match="lists auc more than once"):
        build_session(parse_pipeline_config(text), device=torch.device("cpu"))


def test_binary_metrics_on_a_regression_model_are_warned_about(tmp_path, caplog):
    text = CONFIG.format(model_dir=tmp_path / "m", key="user_id").replace(
        "multi_tower_din {", "losses { l2_loss {} } multi_tower_din {")
    with caplog.at_level("WARNING", logger="hashrec.train"):
        build_session(parse_pipeline_config(text), device=torch.device("cpu"))
    assert "auc, grouped_auc on a regression model (l2_loss)" in caplog.text


def _mmoe_session(tmp_path, key: str):
    """The session of CONFIG's features as an MMoE whose ctr task reports grouped_auc
    by ``key``."""
    text = CONFIG.format(model_dir=tmp_path / "m", key=key)
    text = text[:text.index("  multi_tower_din")] + """  mmoe {
    expert_mlp { hidden_units: [4] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" metrics { auc {} }
                  metrics { grouped_auc { grouping_key: "KEY" } } }
  }
}
""".replace("KEY", key)
    return build_session(parse_pipeline_config(text), device=torch.device("cpu"))


def test_a_task_towers_grouping_key_in_no_feature_group_is_read(tmp_path):
    session = _mmoe_session(tmp_path, "session")
    assert "session" in session.feature_set.features
    table = _write(tmp_path / "eval.parquet", [f"{i % 7}" for i in range(40)])
    result, expected = _evaluated(session, table, tmp_path / "eval.parquet", "session",
                                  "probs_ctr")
    assert result["grouped_auc_ctr"] == pytest.approx(expected, abs=1e-12)


def test_a_task_towers_bad_grouping_key_is_refused_naming_the_tower(tmp_path):
    with pytest.raises(TrainError, match=r"^mmoe.task_towers\['ctr'\].metrics: grouped_auc "
                                         r"grouping_key 'nope' is not an id feature"):
        _mmoe_session(tmp_path, "nope")
