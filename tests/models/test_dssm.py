"""DSSM's similarities, loss and recall@k against hand computations, and its config
errors."""

from __future__ import annotations

import math

import pytest
import torch

from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.models.losses import match_loss
from hashrec.models.match import MatchTower, batch_similarity, pair_similarity
from hashrec.modules import MLP, MLPOptions
from hashrec.train.metrics import RecallAtK

USER = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
# the batch's two items, then one sampled negative
ITEM = torch.tensor([[3.0, 1.0], [1.0, 1.0], [-1.0, 4.0]])


def test_in_batch_similarity_is_every_user_against_every_item():
    expected = torch.tensor([[3.0, 1.0, -1.0], [2.0, 2.0, 8.0]])
    torch.testing.assert_close(batch_similarity(USER, ITEM, True), expected)


def test_sampled_similarity_is_the_rows_item_then_the_negatives():
    expected = torch.tensor([[3.0, -1.0], [2.0, 8.0]])
    torch.testing.assert_close(batch_similarity(USER, ITEM, False), expected)
    torch.testing.assert_close(pair_similarity(USER, ITEM[:2]), torch.tensor([3.0, 2.0]))


def _cross_entropy(row: list[float], positive: int) -> float:
    return -row[positive] + math.log(sum(math.exp(v) for v in row))


@pytest.mark.parametrize("positive", ["diagonal", "first"])
def test_match_loss_is_the_softmax_cross_entropy_of_each_rows_positive(positive):
    sim = torch.tensor([[3.0, 1.0, -1.0], [2.0, 2.0, 8.0]])
    rows = [_cross_entropy(sim[i].tolist(), i if positive == "diagonal" else 0)
            for i in range(2)]
    assert match_loss(sim, positive).item() == pytest.approx(sum(rows) / 2, rel=1e-6)
    weights = torch.tensor([1.0, 3.0])
    assert match_loss(sim, positive, weights).item() == pytest.approx(
        (rows[0] + 3 * rows[1]) / 4, rel=1e-6)


def test_cosine_tower_rows_have_unit_norm_and_output_dim_columns():
    tower = MatchTower(MLP(4, MLPOptions(hidden_units=(6,))), 3, cosine=True)
    out = tower(torch.randn(5, 4))
    assert out.shape == (5, 3)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5))
    assert MatchTower(MLP(4, MLPOptions(hidden_units=(6,))), 0, cosine=False).dim == 6


def test_recall_at_k_counts_rows_whose_positive_is_in_the_top_k():
    sim = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.1], [0.1, 0.2, 0.7]])
    # diagonal positives: row 0 ranks 1st, row 1 1st, row 2 1st
    one = RecallAtK(1)
    one.update(sim, "diagonal")
    assert one.compute() == pytest.approx(1.0)
    # column 0 positives: row 0 1st, row 1 2nd, row 2 3rd
    for k, expected in ((1, 1 / 3), (2, 2 / 3), (5, 1.0)):
        recall = RecallAtK(k)
        recall.update(sim, "first")
        assert recall.compute() == pytest.approx(expected)
    streamed = RecallAtK(1)
    streamed.update(sim[:1], "first")
    streamed.update(sim[1:], "first")
    assert streamed.compute() == pytest.approx(1 / 3)


_DSSM = """model_config {
  feature_groups { group_name: "user" feature_names: "u" group_type: DEEP }
  feature_groups { group_name: "item" feature_names: "i" group_type: DEEP }
  dssm { user_tower { input: "user" mlp { hidden_units: [4] } }
         item_tower { input: "item" mlp { hidden_units: [4] } } output_dim: 2 %s }
}
feature_configs { id_feature { feature_name: "u" expression: "user:u" num_buckets: 5
  embedding_dim: 4 } }
feature_configs { id_feature { feature_name: "i" expression: "item:i" num_buckets: 5
  embedding_dim: 4 } }
data_config { dataset_type: ParquetDataset label_fields: "clk" %s }
"""


def test_a_match_model_without_negatives_is_refused_naming_the_fields():
    config = parse_pipeline_config('model_dir: "m"\n' + _DSSM % ("", ""))
    with pytest.raises(ConfigError, match="model_config.dssm has no negatives: set "
                                          "in_batch_negative: true .* or "
                                          "data_config.negative_sampler"):
        validate_pipeline_config(config)
    validate_pipeline_config(parse_pipeline_config(
        'model_dir: "m"\n' + _DSSM % ("in_batch_negative: true", "")))


def test_a_negative_sampler_of_a_ranking_model_is_refused():
    text = ('model_dir: "m"\nmodel_config { feature_groups { group_name: "g" feature_names: '
            '"u" group_type: DEEP } multi_tower { towers { input: "g" mlp { '
            'hidden_units: [4] } } } }\n'
            'feature_configs { id_feature { feature_name: "u" expression: "user:u" '
            'num_buckets: 5 embedding_dim: 4 } }\n'
            'data_config { dataset_type: ParquetDataset label_fields: "clk" negative_sampler '
            '{ input_path: "x" num_sample: 2 attr_fields: "i" item_id_field: "i" } }')
    with pytest.raises(ConfigError, match="data_config.negative_sampler feeds a match "
                                          "model's item tower; model_config.multi_tower "
                                          "does not read it"):
        validate_pipeline_config(parse_pipeline_config(text))
