"""HSTU match's queries, similarities, loss and recall against hand computations (every
positive of a row a query of the row's user against the shared negatives; a row's padded
candidates weigh nothing), its towers' inputs, descending histories, hard negatives, a
DEEP candidate group, sample weights, the scripted towers, and its config errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from model_fakes import (
    SEQ_LEN,
    SEQUENCES,
    FakeEmbedding,
    FakeFeatureSet,
    make_batch,
    model_config,
)

from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.config.unused import ignored_field_notes
from hashrec.features.batch import Batch
from hashrec.models import ModelError, create_model
from hashrec.models.hstu_towers import candidate_similarity, reverse_prefixes
from hashrec.models.losses import match_loss
from hashrec.train.metrics import RecallAtK

# The click sequence's items are the history, its categories each row's candidates (up to
# 5 positives), user_id and cate_id (4 wide each) two contextual tokens.
GROUPS = """
feature_groups { group_name: "uih" feature_names: "click_seq__item_id"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "contextual" feature_names: ["user_id", "cate_id"]
                 group_type: DEEP }
feature_groups { group_name: "candidate" feature_names: "click_seq__cate_id"
                 group_type: JAGGED_SEQUENCE }
"""
HSTU = """
hstu_match {
  user_tower { input: "uih" max_seq_len: 5
    hstu { stu { embedding_dim: 8 num_heads: 2 hidden_dim: 3 attention_dim: 4
                 output_dropout_ratio: 0 }
           input_dropout_ratio: 0 attn_num_layers: 2
           positional_encoder { num_position_buckets: 8 }
           input_preprocessor { uih_preprocessor {} }
           output_postprocessor { l2norm_postprocessor {} } } }
  item_tower { input: "candidate" mlp { hidden_units: [8] activation: "" } }
  similarity: COSINE temperature: 0.05 %s
}
losses { softmax_cross_entropy {} }
metrics { recall_at_k { top_k: 1 } }
"""
CONFIG = GROUPS + HSTU
ROWS, SAMPLED = 4, 3
# The history's timestamps and action bits: raw sub-features of the click sequence.
STAMPS, ACTIONS = "click_seq__ts", "click_seq__act"


@dataclass
class HistoryFeatures(FakeFeatureSet):
    """The fakes, and the click sequence's timestamps and actions (raw, one value)."""

    def sequence_dense_features(self):
        return {STAMPS: 1, ACTIONS: 1}

    def sequence_names(self):
        return dict.fromkeys((*SEQUENCES, STAMPS, ACTIONS), "click_seq")

    @property
    def features(self):
        return {name: SimpleNamespace(sequence_length=SEQ_LEN) for name in (STAMPS, ACTIONS)}


def _model(text: str, weights: tuple[str, ...] = (), pad_noise: float = 0.0):
    torch.manual_seed(0)
    features = HistoryFeatures(["clk"], sample_weight_fields=weights)
    return create_model(model_config(text), features, None,
                        embedding=FakeEmbedding(pad_noise=pad_noise))


def _batch(sampled: int = SAMPLED, seed: int = 1, hard=None, weights=None) -> Batch:
    # the rows' positives: 2, all 5, none, 1; a sampled row holds its item
    candidates = torch.tensor([2, 5, 0, 1] + [1] * sampled)
    batch = make_batch(ROWS + sampled, seed=seed,
                       feature_lengths={"click_seq__cate_id": candidates})
    gen = torch.Generator().manual_seed(seed)
    stamps = torch.cumsum(torch.rand(ROWS + sampled, SEQ_LEN, 1, generator=gen) * 1e4, dim=1)
    actions = torch.randint(0, 4, (ROWS + sampled, SEQ_LEN, 1), generator=gen).float()
    labels = {k: v[:ROWS] for k, v in batch.labels.items()}
    if weights is not None:
        labels["w"] = torch.tensor(weights)
    return Batch(batch.sparse, dense=batch.dense, labels=labels, batch_size=ROWS,
                 sequence_dense={STAMPS: stamps, ACTIONS: actions}, negatives=sampled,
                 hard_negatives=hard)


def test_a_query_is_a_positive_of_the_row_against_the_shared_negatives():
    # two users, two candidate positions (row 1's second is padding), three negatives
    user = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    positives = torch.tensor([[[3.0, 1.0], [0.5, 0.5]], [[1.0, 1.0], [9.0, 9.0]]])
    negatives = torch.tensor([[1.0, 2.0], [-1.0, 0.0], [0.0, 0.0]])
    out = candidate_similarity(user, positives, negatives, torch.zeros(0, dtype=torch.bool),
                               False)
    assert out.tolist() == [[3.0, 1.0, -1.0, 0.0], [0.5, 1.0, -1.0, 0.0],
                            [2.0, 4.0, 0.0, 0.0], [18.0, 4.0, 0.0, 0.0]]
    # the loss: each valid query's cross entropy of its column 0, averaged (row 1's
    # padding weighs 0)
    weights = torch.tensor([1.0, 1.0, 1.0, 0.0])
    logsumexp = torch.logsumexp(out, dim=1)
    expected = ((logsumexp - out[:, 0]) * weights).sum() / 3
    torch.testing.assert_close(match_loss(out, "first", weights), expected)
    # hard negatives: row 0 has one filled slot of two, row 1 none
    hard = torch.tensor([[True, False], [False, False]])
    slots = torch.tensor([[2.0, 0.0], [5.0, 5.0], [1.0, 1.0], [7.0, 7.0]])
    out = candidate_similarity(user, positives, torch.cat([negatives, slots]), hard, True)
    inf = float("-inf")
    assert out.tolist() == [[3.0, 1.0, -1.0, 0.0, 2.0, inf], [0.5, 1.0, -1.0, 0.0, 2.0, inf],
                            [2.0, 4.0, 0.0, 0.0, inf, inf], [18.0, 4.0, 0.0, 0.0, inf, inf]]


def test_recall_counts_the_queries_that_are_positives():
    recall = RecallAtK(1)
    similarity = torch.tensor([[3.0, 1.0], [0.0, 1.0], [5.0, 9.0]])
    recall.update(similarity, "first", torch.tensor([True, True, False]))
    assert recall.compute() == 0.5  # row 2 (a miss) is padding


def _by_hand(model, batch):
    """The towers' inputs taken from the fakes here, through the model's towers: (users
    (B, D), positives (B, K, D), negatives (N, D))."""
    out = model.embedding(batch.sparse)
    history, lengths = out.sequences["click_seq__item_id"]
    contextual = torch.cat([out.pooled["user_id"], out.pooled["cate_id"]], dim=1)
    zeros = torch.zeros(ROWS, SEQ_LEN)
    user = model.user_tower(history[:ROWS], lengths[:ROWS], contextual[:ROWS], zeros, zeros,
                            zeros)
    candidates, _ = out.sequences["click_seq__cate_id"]
    return user, model.item_tower(candidates[:ROWS]), model.item_tower(candidates[ROWS:, 0])


def test_similarities_and_loss_of_the_towers_by_hand():
    model = _model(CONFIG % "")
    batch = _batch()
    user, positives, negatives = _by_hand(model, batch)
    lengths = batch.sparse["click_seq__cate_id"].lengths[:ROWS]
    expected = []
    for b in range(ROWS):
        for j in range(SEQ_LEN):
            expected.append(torch.cat([(user[b] * positives[b, j]).sum().view(1),
                                       negatives @ user[b]]) / 0.05)
    expected = torch.stack(expected)
    mask = (torch.arange(SEQ_LEN) < lengths.unsqueeze(1)).reshape(-1)
    out = model(batch)
    torch.testing.assert_close(out["similarity"], expected)
    assert torch.equal(out["query_mask"], mask) and 0 < mask.sum() < mask.numel()
    loss = model.loss(out, batch)["softmax_cross_entropy"]
    torch.testing.assert_close(loss, match_loss(expected[mask], "first"))
    labels, weights = model.targets(batch)
    assert torch.equal(weights, mask.float()) and not labels.any()
    # the user is the row's last history position (contextual tokens before it)
    encoded, full = model.user_tower.encode(
        *_by_hand_inputs(model, batch))
    assert full.tolist() == (batch.sparse["click_seq__item_id"].lengths[:ROWS] + 2).tolist()
    norm = torch.nn.functional.normalize
    for b in range(ROWS):
        last = encoded[b, int(full[b]) - 1]
        torch.testing.assert_close(user[b], norm(last, dim=0, eps=1e-6))


def _by_hand_inputs(model, batch):
    out = model.embedding(batch.sparse)
    history, lengths = out.sequences["click_seq__item_id"]
    contextual = torch.cat([out.pooled["user_id"], out.pooled["cate_id"]], dim=1)
    zeros = torch.zeros(ROWS, SEQ_LEN)
    return history[:ROWS], lengths[:ROWS], contextual[:ROWS], zeros, zeros, zeros


def test_the_padding_of_histories_and_candidates_changes_nothing():
    quiet, noisy = _model(CONFIG % ""), _model(CONFIG % "", pad_noise=3.0)
    batch = _batch()
    a, b = quiet(batch), noisy(batch)
    mask = a["query_mask"]
    torch.testing.assert_close(a["similarity"][mask], b["similarity"][mask])
    assert not torch.allclose(a["similarity"][~mask], b["similarity"][~mask])
    torch.testing.assert_close(quiet.loss(a, batch), noisy.loss(b, batch))


def test_descending_histories_read_as_their_reverse():
    ascending = _model(CONFIG % "")
    descending = _model(CONFIG % "sequence_timestamp_is_ascending: false")
    descending.load_state_dict(ascending.state_dict())
    inputs = _by_hand_inputs(ascending, _batch())
    history, lengths = inputs[0], inputs[1]
    reversed_history = reverse_prefixes(history, lengths)
    for b in range(ROWS):
        n = int(lengths[b])
        torch.testing.assert_close(reversed_history[b, :n], history[b, :n].flip(0))
    torch.testing.assert_close(descending.user_tower(reversed_history, *inputs[1:]),
                               ascending.user_tower(*inputs))
    assert not torch.allclose(ascending.user_tower(reversed_history, *inputs[1:]),
                              ascending.user_tower(*inputs))


def test_hard_negatives_follow_the_shared_ones_for_each_query_of_their_row():
    model = _model(CONFIG % "")
    hard = torch.tensor([[True, False], [True, True], [False, False], [False, True]])
    batch = _batch(sampled=3 + ROWS * 2, hard=hard)
    out = model(batch)["similarity"]
    assert out.shape == (ROWS * SEQ_LEN, 1 + 3 + 2)
    user, _, negatives = _by_hand(model, batch)
    slots = (negatives[3:].reshape(ROWS, 2, -1) * user.unsqueeze(1)).sum(-1) / 0.05
    for b in range(ROWS):
        for j in range(SEQ_LEN):
            row = out[b * SEQ_LEN + j, 4:]
            torch.testing.assert_close(row[hard[b]], slots[b][hard[b]])
            assert torch.isinf(row[~hard[b]]).all()


# The candidate group a DEEP group: each row's item, one positive a row.
DEEP_CANDIDATE = CONFIG.replace(
    'group_name: "candidate" feature_names: "click_seq__cate_id"\n'
    '                 group_type: JAGGED_SEQUENCE',
    'group_name: "candidate" feature_names: "item_id" group_type: DEEP')


def test_a_deep_candidate_group_is_one_positive_a_row():
    model = _model(DEEP_CANDIDATE % "")
    batch = _batch()
    user, _, _ = _by_hand(model, batch)
    item = model.item_tower(model.embedding(batch.sparse).pooled["item_id"])
    expected = torch.cat([(user * item[:ROWS]).sum(-1, keepdim=True), user @ item[ROWS:].t()],
                         dim=1) / 0.05
    out = model(batch)
    torch.testing.assert_close(out["similarity"], expected)
    assert out["query_mask"].all() and out["query_mask"].shape == (ROWS,)


def test_a_rows_sample_weight_weighs_each_of_its_queries():
    model = _model(CONFIG % "", weights=("w",))
    batch = _batch(weights=[1.0, 2.0, 0.0, 0.5])
    out = model(batch)
    _, weights = model.targets(batch)
    expected = out["query_mask"].float() * torch.tensor([1.0, 2.0, 0.0, 0.5]).repeat_interleave(
        SEQ_LEN)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(model.loss(out, batch)["softmax_cross_entropy"],
                               match_loss(out["similarity"], "first", expected))


# Each position's actions (bits 1 and 2, through a simple MLP), time-gap buckets and the
# timestamps' hour of day after the STU layers: the groups uih_action and uih_timestamp.
WITH_TIME = (GROUPS + """
feature_groups { group_name: "uih_action" feature_names: "click_seq__act"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "uih_timestamp" feature_names: "click_seq__ts"
                 group_type: JAGGED_SEQUENCE }
""" + HSTU).replace("positional_encoder { num_position_buckets: 8 }",
                    "positional_encoder { num_position_buckets: 8 num_time_buckets: 16 "
                    "use_time_encoding: true }").replace(
    "uih_preprocessor {}", "uih_preprocessor { action_encoder { simple_action_encoder { "
    "action_embedding_dim: 2 action_weights: [1, 2] } } action_mlp { parameterized_mlp { "
    "hidden_dim: 4 } } }").replace(
    "l2norm_postprocessor {}", "timestamp_layernorm_postprocessor { "
    "time_duration_period_units: [3600] time_duration_units_per_period: [24] }")


def test_the_actions_and_timestamps_reach_the_user_tower_and_its_export_form():
    model = _model(WITH_TIME % "").eval()  # no dropout of the contextual features
    batch = _batch()
    out = model(batch)
    inputs = list(_by_hand_inputs(model, batch))
    inputs[3] = batch.sequence_dense[ACTIONS][:ROWS, :, 0]
    inputs[5] = batch.sequence_dense[STAMPS][:ROWS, :, 0]
    user = model.user_tower(*inputs)
    _, positives, negatives = _by_hand(model, batch)
    expected = torch.cat([(user.unsqueeze(1) * positives).sum(-1).unsqueeze(-1),
                          (user @ negatives.t()).unsqueeze(1).expand(-1, SEQ_LEN, -1)],
                         dim=-1).reshape(ROWS * SEQ_LEN, -1) / 0.05
    torch.testing.assert_close(out["similarity"], expected)
    for changed in (3, 5):  # other actions, other timestamps: other users
        other = list(inputs)
        other[changed] = inputs[changed].flip(1)
        assert not torch.allclose(model.user_tower(*other), user)
    scripted = torch.jit.script(model.user_tower)
    torch.testing.assert_close(scripted(*inputs), user)
    candidates = model.embedding(batch.sparse).sequences["click_seq__cate_id"][0]
    torch.testing.assert_close(torch.jit.script(model.item_tower)(candidates),
                               model.item_tower(candidates))


@pytest.mark.parametrize("change, message", [
    (('input: "uih"', 'input: "contextual"'),
     r"hstu_match.user_tower.input: feature group 'contextual' is DEEP, expected "
     r"JAGGED_SEQUENCE"),
    (('feature_names: ["user_id", "cate_id"]', 'feature_names: ["user_id", "price"]'),
     r"the features of feature group 'contextual' are \[1, 4\] wide"),
    (("mlp { hidden_units: [8] activation: \"\" }", "mlp { hidden_units: [6] }"),
     r"hstu_match: output_dim 0 .* 8 \(user\) and 6 \(item\)"),
    (("temperature: 0.05", "temperature: 0.05 in_batch_negative: true"),
     r"hstu_match.in_batch_negative is not supported"),
    (("num_heads: 2", "num_heads: 0"), r"hstu_match.user_tower.hstu: num_heads=0"),
])
def test_model_config_errors_name_the_field(change, message):
    with pytest.raises(ModelError, match=message):
        _model((CONFIG % "").replace(*change))


def test_group_errors_name_the_group():
    extra = 'feature_groups { group_name: "other" feature_names: "item_id" group_type: DEEP }'
    with pytest.raises(ModelError, match=r"feature groups \['other'\] feed no tower"):
        _model(extra + CONFIG % "")
    with pytest.raises(ModelError, match=r"reads the feature group 'uih_timestamp', which is "
                                         r"not defined"):
        _model(CONFIG.replace("num_position_buckets: 8", "num_position_buckets: 8 "
                              "num_time_buckets: 4 use_time_encoding: true") % "")
    wrong = WITH_TIME.replace('feature_names: "click_seq__act"',
                              'feature_names: "click_seq__item_id"')
    with pytest.raises(ModelError, match=r"feature group 'uih_action' must hold one raw "
                                         r"sequence feature"):
        _model(wrong % "")
    with pytest.raises(ModelError, match=r"stu.contextual_seq_len is 3, but the feature group "
                                         r"'contextual' gives 2"):
        _model((CONFIG % "").replace("output_dropout_ratio: 0",
                                     "output_dropout_ratio: 0 contextual_seq_len: 3"))
    pooled = CONFIG.replace('feature_names: "click_seq__item_id"',
                            'feature_names: ["click_seq__item_id", "user_id"]')
    with pytest.raises(ModelError, match=r"JAGGED_SEQUENCE feature group 'uih' holds features "
                                         r"that are not sequences \['user_id'\]"):
        _model(pooled % "")
    both = CONFIG.replace('input: "candidate"', 'input: "uih"').replace(
        'group_name: "candidate" feature_names: "click_seq__cate_id"',
        'group_name: "uih_timestamp" feature_names: "click_seq__ts"')
    with pytest.raises(ModelError, match="the user and item towers read one feature group"):
        _model(both % "")


def _pipeline(data: str = "negative_sampler { input_path: 'i' num_sample: 2 "
              "attr_fields: 'video_id' item_id_field: 'cand_seq__video_id' }") -> str:
    """A pipeline config of CONFIG with ``data`` in its data_config."""
    return (f'model_dir: "m"\ndata_config {{ dataset_type: ParquetDataset {data} }}\n'
            f"model_config {{ {GROUPS} {HSTU % ''} }}")


@pytest.mark.parametrize("change, message", [
    (("temperature: 0.05", "temperature: 0.05 in_batch_negative: true"),
     "model_config.hstu_match.in_batch_negative is not supported"),
    (("max_seq_len: 5", ""), "model_config.hstu_match.user_tower.max_seq_len is 0; set it"),
    (("uih_preprocessor {}", "contextual_preprocessor { content_encoder { "
      "slice_content_encoder {} } content_mlp { simple_mlp { hidden_dim: 4 } } }"),
     "hstu.input_preprocessor.contextual_preprocessor is not supported by hstu_match"),
    (("uih_preprocessor {}", "uih_preprocessor { action_encoder { simple_action_encoder { "
      "action_embedding_dim: 2 action_weights: 1 } } }"),
     "uih_preprocessor sets action_encoder without action_mlp"),
    (("uih_preprocessor {}", "uih_preprocessor { action_encoder { simple_action_encoder { "
      "action_embedding_dim: 2 watchtime_to_action_thresholds: 3 } } action_mlp { "
      "simple_mlp { hidden_dim: 2 } } }"), "simple_action_encoder.action_weights is empty"),
    (("num_position_buckets: 8", "num_position_buckets: 8 time_bucket_fn: 'cube'"),
     "positional_encoder.time_bucket_fn 'cube'; allowed: sqrt, log"),
    (("num_position_buckets: 8", "num_position_buckets: 8 use_time_encoding: true"),
     "positional_encoder.num_time_buckets is 0; use_time_encoding needs 1 or more"),
    (("output_dropout_ratio: 0", "output_dropout_ratio: 1"),
     "hstu.stu.output_dropout_ratio is 1.0; it must be in [0, 1)"),
    (("attn_num_layers: 2", "attn_num_layers: 0"), "hstu.attn_num_layers is 0"),
    (("output_dropout_ratio: 0", "output_dropout_ratio: 0 sla_k1: 4"),
     "model_config.hstu_match.user_tower.hstu.stu.sla_k1 is not supported"),
    (("attn_num_layers: 2", "attn_num_layers: 2 attn_truncation_tail_len: 3"),
     "model_config.hstu_match.user_tower.hstu.attn_truncation_tail_len is not supported"),
    (("attn_num_layers: 2", "attn_num_layers: 2 name: 'uih_click'"),
     "model_config.hstu_match.user_tower.hstu.name is not supported"),
    (("metrics { recall_at_k { top_k: 1 } }", "metrics { auc {} }"),
     "model_config.metrics[0].auc is not supported for a match model; use recall_at_k"),
])
def test_config_errors_name_the_field(change, message):
    config = parse_pipeline_config(_pipeline().replace(*change))
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_pipeline_config(config)


def test_a_config_without_a_sampler_is_refused_and_kernel_flags_are_noted():
    with pytest.raises(ConfigError, match="model_config.hstu_match has no negatives: set "
                                          "data_config.negative_sampler"):
        validate_pipeline_config(parse_pipeline_config(_pipeline(data="")))
    config = parse_pipeline_config(_pipeline().replace(
        "output_dropout_ratio: 0", "output_dropout_ratio: 0 recompute_uvqk: false"))
    validate_pipeline_config(config)
    assert "model_config.hstu_match.user_tower.hstu.stu.recompute_uvqk" in \
        ignored_field_notes(config)
