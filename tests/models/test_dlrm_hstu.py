"""dlrm_hstu on the model fakes: each candidate slot's labels (task bitmasks, padding),
the losses as masked means worked by hand (jrc_loss's sessions a row's candidates), the
metrics over a row's candidates alone,
the invariance of every candidate's output to padding, to the row's other candidates
(without contextual tokens, which read the whole row as in TorchEasyRec) and to a
history stored newest first, no host reads, and the config errors."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from host_reads import HostReads
from model_fakes import SEQ_LEN, SEQUENCES, FakeEmbedding, FakeFeatureSet, make_batch, model_config
from torch.nn import functional

from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.features.batch import Batch
from hashrec.models import ModelError, create_model
from hashrec.models.dlrm_hstu_net import FusionTower, item_mlp
from hashrec.models.hstu_towers import reverse_prefixes
from hashrec.models.losses import jrc_rows
from hashrec.train.evaluation import update_metrics
from hashrec.train.loop import scales_to_global_mean
from hashrec.train.metrics import build_metrics

# The click sequence's items are the history, its categories each row's candidates (up to
# 5); user_id and cate_id (4 wide each) two contextual tokens; raw sub-features of the
# click sequence give the history's actions and timestamps and the candidates' request
# times.
ACTIONS, STAMPS, QUERY = "click_seq__act", "click_seq__ts", "click_seq__qt"
GROUPS = """
feature_groups { group_name: "uih" feature_names: "click_seq__item_id"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "candidate" feature_names: "click_seq__cate_id"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "uih_action" feature_names: "click_seq__act"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "uih_timestamp" feature_names: "click_seq__ts"
                 group_type: JAGGED_SEQUENCE }
feature_groups { group_name: "candidate_timestamp" feature_names: "click_seq__qt"
                 group_type: JAGGED_SEQUENCE }
"""
CONTEXTUAL = """
feature_groups { group_name: "contextual" feature_names: ["user_id", "cate_id"]
                 group_type: DEEP }
"""
DLRM_HSTU = """
dlrm_hstu {
  hstu { stu { embedding_dim: 8 num_heads: 2 hidden_dim: 3 attention_dim: 4
               output_dropout_ratio: 0 }
         input_dropout_ratio: 0 attn_num_layers: 2
         positional_encoder { num_position_buckets: 16 num_time_buckets: 8
                              use_time_encoding: true }
         input_preprocessor { %(preprocessor)s {
             action_encoder { simple_action_encoder { action_embedding_dim: 2
                                                      action_weights: [1, 2] } }
             action_mlp { simple_mlp { hidden_dim: 4 } }
             content_encoder { slice_content_encoder {} }
             content_mlp { simple_mlp { hidden_dim: 4 } } } }
         output_postprocessor { timestamp_layernorm_postprocessor {
             time_duration_period_units: [3600] time_duration_units_per_period: [24] } } }
  fusion_mtl_tower { mlp { hidden_units: [8] }
    task_configs { task_name: "is_click" label_name: "act" task_bitmask: 1 }
    task_configs { task_name: "is_like" label_name: "act" task_bitmask: 2 weight: 0.5 }
    task_configs { task_name: "wt" label_name: "wt" losses { l2_loss {} }
                   metrics { mean_absolute_error {} } } }
  max_seq_len: 12 item_embedding_hidden_dim: 6 %(more)s
}
"""
ROWS = 4
COUNTS = [2, 5, 0, 1]
RAW = (ACTIONS, STAMPS, QUERY)


def _config(contextual: bool = True, preprocessor: str = "contextual_preprocessor",
            more: str = "") -> str:
    return (GROUPS + (CONTEXTUAL if contextual else "")
            + DLRM_HSTU % {"preprocessor": preprocessor, "more": more})


@dataclass
class RawFeatures(FakeFeatureSet):
    """The fakes, and the click sequence's raw sub-features (one value a position)."""

    def sequence_dense_features(self):
        return dict.fromkeys(RAW, 1)

    def sequence_names(self):
        return dict.fromkeys((*SEQUENCES, *RAW), "click_seq")

    @property
    def features(self):
        return {name: SimpleNamespace(sequence_length=SEQ_LEN) for name in RAW}


def _model(text: str | None = None, pad_noise: float = 0.0):
    torch.manual_seed(0)
    return create_model(model_config(text or _config()), RawFeatures(["act", "wt"]), None,
                        embedding=FakeEmbedding(pad_noise=pad_noise))


def _batch(seed: int = 1, counts=COUNTS, sequences=None) -> Batch:
    batch = make_batch(ROWS, seed=seed,
                       feature_lengths={"click_seq__cate_id": torch.tensor(counts)})
    if sequences is not None:
        batch = Batch(sequences, dense=batch.dense, batch_size=ROWS)
    gen = torch.Generator().manual_seed(seed)
    dense = {STAMPS: torch.cumsum(torch.rand(ROWS, SEQ_LEN, 1, generator=gen) * 1e4, dim=1),
             ACTIONS: torch.randint(0, 4, (ROWS, SEQ_LEN, 1), generator=gen).float()}
    # one request time a row, after its history
    dense[QUERY] = (dense[STAMPS][:, -1:] + 100).expand(-1, SEQ_LEN, -1).contiguous()
    labels = {"act": torch.randint(0, 4, (ROWS, SEQ_LEN), generator=gen).float(),
              "wt": torch.rand(ROWS, SEQ_LEN, generator=gen)}
    return Batch(batch.sparse, dense=batch.dense, labels=labels, batch_size=ROWS,
                 sequence_dense=dense)


def _with_candidates(batch: Batch, edit) -> Batch:
    """``batch`` with each row's candidate ids (a list) replaced by ``edit(row, ids)``."""
    parts = batch.sparse.to_dict()
    values, lengths = [], []
    for key in batch.sparse.keys():
        bags = parts[key]
        if key == "click_seq__cate_id":
            rows = list(torch.split(bags.values, bags.lengths.tolist()))
            rows = [torch.as_tensor(edit(i, row.tolist()), dtype=torch.int64)
                    for i, row in enumerate(rows)]
            values.append(torch.cat(rows))
            lengths.append(torch.tensor([len(r) for r in rows]))
        else:
            values.append(bags.values)
            lengths.append(bags.lengths)
    sparse = type(batch.sparse).from_lengths(batch.sparse.keys(), torch.cat(values),
                                             torch.cat(lengths))
    return Batch(sparse, dense=batch.dense, labels=batch.labels, batch_size=ROWS,
                 sequence_dense=batch.sequence_dense)


def _valid() -> torch.Tensor:
    return (torch.arange(SEQ_LEN).unsqueeze(0) < torch.tensor(COUNTS).unsqueeze(1)).reshape(-1)


def test_each_candidate_slot_has_its_tasks_labels_and_the_padding_weighs_nothing():
    model, batch = _model(), _batch()
    labels, weights = model.targets(batch)
    act = batch.labels["act"].reshape(-1).long()
    assert labels.shape == (ROWS * SEQ_LEN, 3)
    assert labels[:, 0].tolist() == ((act & 1) > 0).float().tolist()
    assert labels[:, 1].tolist() == ((act & 2) > 0).float().tolist()
    assert torch.equal(labels[:, 2], batch.labels["wt"].reshape(-1))
    assert torch.equal(weights, _valid().float().unsqueeze(1).expand(-1, 3))


def test_losses_are_each_tasks_mean_over_the_candidates_times_its_weight():
    model, batch = _model(), _batch()
    out = model(batch)
    assert out["probs_is_click"].shape == (ROWS * SEQ_LEN,)
    losses = model.loss(out, batch)
    labels, _ = model.targets(batch)
    valid = _valid()
    expected = {
        "binary_cross_entropy_is_click": functional.binary_cross_entropy_with_logits(
            out["logits_is_click"][valid], labels[valid, 0]),
        "binary_cross_entropy_is_like": 0.5 * functional.binary_cross_entropy_with_logits(
            out["logits_is_like"][valid], labels[valid, 1]),
        "l2_loss_wt": ((out["y_wt"][valid] - labels[valid, 2]) ** 2).mean()}
    assert set(losses) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(losses[name], value)


def test_jrc_loss_sessions_are_the_rows_candidates_and_padding_competes_with_none():
    text = _config().replace('task_bitmask: 2 weight: 0.5',
                             'task_bitmask: 2 weight: 0.5 num_class: 2 '
                             'losses { jrc_loss { session_name: "user_id" } }')
    model, batch = _model(text), _batch()
    out = model(batch)
    assert out["logits_is_like"].shape == (ROWS * SEQ_LEN, 2)
    labels, _, sessions = model.targets(batch)
    valid = _valid()
    users = batch.sparse["user_id"].values.repeat_interleave(SEQ_LEN)
    expected = 0.5 * jrc_rows(out["logits_is_like"][valid], labels[valid, 1], users[valid],
                              0.5).mean()
    torch.testing.assert_close(model.loss(out, batch)["jrc_loss_is_like"], expected)
    # the padding slots' sessions are their own, the candidates' those of their row's user
    assert sessions[~valid, 0].unique().numel() == int((~valid).sum())
    same = users[valid].unsqueeze(0) == users[valid].unsqueeze(1)
    numbers = sessions[valid, 0]
    assert torch.equal(numbers.unsqueeze(0) == numbers.unsqueeze(1), same)


def test_the_item_mlp_and_fusion_tower_by_hand():
    torch.manual_seed(0)
    items = item_mlp(3, 5, 4)
    candidates = torch.randn(2, 6, 3)
    first, swish, second, norm = items
    hidden = first(candidates)
    hidden = hidden * torch.sigmoid(swish.norm(hidden))
    expected = functional.layer_norm(second(hidden), [4], norm.weight, norm.bias, 1e-5)
    torch.testing.assert_close(items(candidates), expected)
    assert torch.all(first.bias == 0) and torch.all(second.bias == 0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.ReLU())
    tower = FusionTower(mlp, 7, 3)
    user, item = torch.randn(2, 6, 4), torch.randn(2, 6, 4)
    torch.testing.assert_close(tower(user, item), tower.linear(mlp(user * item)))
    assert tower(user, item).shape == (2, 6, 3) and torch.all(tower.linear.bias == 0)


def _pairwise_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    positive, negative = scores[labels > 0.5], scores[labels < 0.5]
    greater = (positive.unsqueeze(1) > negative.unsqueeze(0)).float()
    ties = (positive.unsqueeze(1) == negative.unsqueeze(0)).float()
    return float((greater + 0.5 * ties).mean())


def test_metrics_count_a_rows_candidates_alone():
    model, batch = _model(), _batch()
    model.eval()
    out = model(batch)
    valid = _valid()
    assert torch.equal(out["candidate_mask"], valid)
    metrics = {}
    for task in model.tasks:
        for name, metric in build_metrics(task.metric_configs, regression=task.regression
                                          ).items():
            metrics[name + task.suffix] = (task, metric)
    update_metrics(metrics.values(), out, batch)
    labels, _ = model.targets(batch)
    auc = metrics["auc_is_click"][1].compute()
    assert auc == pytest.approx(_pairwise_auc(out["probs_is_click"][valid],
                                              labels[valid, 0]), abs=0.02)
    mae = metrics["mean_absolute_error_wt"][1].compute()
    assert mae == pytest.approx(float((out["y_wt"][valid] - labels[valid, 2]).abs().mean()),
                                rel=1e-5)


def _logits(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(batch)["logits_is_click"].reshape(ROWS, SEQ_LEN)


@pytest.mark.parametrize("preprocessor", ["contextual_preprocessor",
                                          "contextual_interleave_preprocessor"])
def test_padding_changes_no_candidate(preprocessor):
    text = _config(preprocessor=preprocessor)
    clean = _logits(_model(text), _batch())
    noisy = _logits(_model(text, pad_noise=5.0), _batch())
    valid = _valid().reshape(ROWS, SEQ_LEN)
    torch.testing.assert_close(noisy[valid], clean[valid])
    # rows' last candidates left out (their slots padding): the others are as they were
    # (without contextual tokens, which read the whole row, as in TorchEasyRec)
    text = _config(contextual=False, preprocessor=preprocessor)
    clean = _logits(_model(text), _batch())
    fewer = _logits(_model(text), _with_candidates(_batch(), lambda row, ids: ids[:-1]))
    kept = (torch.arange(SEQ_LEN).unsqueeze(0) < torch.tensor([1, 4, 0, 0]).unsqueeze(1))
    torch.testing.assert_close(fewer[kept], clean[kept])


def test_a_candidate_reads_the_history_and_itself_not_the_other_candidates():
    # without contextual tokens (which read the whole row, the candidates too, as in
    # TorchEasyRec): another candidate of the row changed changes no other
    model = _model(_config(contextual=False))
    batch = _batch()
    before = _logits(model, batch)
    # row 1's candidate 3 another item
    changed = _with_candidates(batch, lambda row, ids: ids if row != 1 else
                               ids[:3] + [(ids[3] + 7) % 50] + ids[4:])
    after = _logits(model, changed)
    assert not torch.allclose(after[1, 3], before[1, 3])
    others = torch.ones(ROWS, SEQ_LEN, dtype=torch.bool)
    others[1, 3] = False
    torch.testing.assert_close(after[others], before[others])
    # the history does matter
    stamps = dict(batch.sequence_dense)
    stamps[ACTIONS] = 3.0 - stamps[ACTIONS]
    flipped = Batch(batch.sparse, dense=batch.dense, labels=batch.labels, batch_size=ROWS,
                    sequence_dense=stamps)
    assert not torch.allclose(_logits(model, flipped)[1], before[1])


def test_a_history_stored_newest_first_is_its_reverse():
    ascending = _model()
    descending = _model(_config(more="sequence_timestamp_is_ascending: false"))
    batch = _batch()
    inputs = ascending.dense_inputs(ascending.embedding(batch.sparse), batch)
    lengths = inputs[1]
    reversed_inputs = list(inputs)
    for i in (0, 3, 4, 5):
        reversed_inputs[i] = reverse_prefixes(inputs[i], lengths)
    ascending.eval()
    descending.eval()
    torch.testing.assert_close(descending.dense_from_inputs(*reversed_inputs),
                               ascending.dense_from_inputs(*inputs))


@pytest.mark.parametrize("preprocessor", ["contextual_preprocessor",
                                          "contextual_interleave_preprocessor"])
def test_the_dense_network_reads_nothing_on_the_host(preprocessor):
    model = _model(_config(preprocessor=preprocessor))
    shapes = []
    for seed, counts in ((1, COUNTS), (2, [5, 5, 1, 3])):
        batch = _batch(seed, counts)
        inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
        shapes.append([tuple(x.shape) for x in inputs])
        with HostReads() as reads:
            logits = model.dense_from_inputs(*inputs)
            losses = model.losses_from_logits(logits, *model.targets(batch))
            sum(losses.values()).backward()
        assert dict(reads.counts) == {}
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("change, match", [
    (lambda t: t.replace('group_name: "candidate"', 'group_name: "cand"'),
     "feature group 'candidate' is missing"),
    (lambda t: t.replace('group_name: "contextual" feature_names: ["user_id", "cate_id"]',
                         'group_name: "contextual" feature_names: ["user_id", "price"]'),
     r"are \[1, 4\] wide; each is a token"),
    (lambda t: t + 'feature_groups { group_name: "extra" feature_names: "price" '
                   'group_type: DEEP }',
     r"feature groups \['extra'\] are not read by dlrm_hstu"),
    (lambda t: t.replace('label_name: "wt"', 'label_name: "nope"'),
     "label_name 'nope' is not one of data_config.label_fields"),
    (lambda t: t.replace('feature_groups { group_name: "uih_timestamp" feature_names: '
                         '"click_seq__ts"\n                 group_type: JAGGED_SEQUENCE }', ''),
     "reads the feature group 'uih_timestamp', which is not defined"),
    (lambda t: t.replace("output_dropout_ratio: 0 }", "output_dropout_ratio: 0 "
                         "contextual_seq_len: 3 }"),
     "contextual_seq_len is 3, but the feature group 'contextual' gives 2"),
])
def test_model_config_errors_name_the_field(change, match):
    with pytest.raises(ModelError, match=match):
        _model(change(_config()))


def test_concatenated_contextual_features_are_one_token_of_any_widths():
    text = _config(more="concat_contextual_features: true").replace(
        'feature_names: ["user_id", "cate_id"]', 'feature_names: ["user_id", "price"]')
    model = _model(text)
    assert model.net.contextual == 1
    assert model(_batch())["probs_is_click"].shape == (ROWS * SEQ_LEN,)


@pytest.mark.parametrize("setting, scaled", [("", True),
                                             ("enable_global_average_loss: true", True),
                                             ("enable_global_average_loss: false", False)])
def test_the_global_average_loss_scales_the_ranks_losses(setting, scaled):
    model = _model(_config(more=setting))
    assert scales_to_global_mean(model, SimpleNamespace(is_distributed=True)) == scaled
    assert not scales_to_global_mean(model, SimpleNamespace(is_distributed=False))


def test_labels_of_one_value_a_row_are_refused():
    model, batch = _model(), _batch()
    batch.labels["act"] = batch.labels["act"][:, 0]
    with pytest.raises(ModelError, match="label 'act' holds one value a row"):
        model.targets(batch)


def _pipeline(model_text: str) -> str:
    return ('model_dir: "m"\ndata_config { dataset_type: ParquetDataset '
            'label_fields: ["act", "wt"] }\nmodel_config {\n' + model_text + "\n}")


@pytest.mark.parametrize("change, match", [
    (lambda t: t.replace("contextual_preprocessor {", "uih_preprocessor {").replace(
        "content_encoder { slice_content_encoder {} }", "").replace(
        "content_mlp { simple_mlp { hidden_dim: 4 } }", ""),
     "uih_preprocessor is not supported by dlrm_hstu"),
    (lambda t: t.replace("max_seq_len: 12", "max_seq_len: 0"),
     "dlrm_hstu.max_seq_len is 0"),
    (lambda t: t.replace("content_mlp { simple_mlp { hidden_dim: 4 } }",
                         "content_mlp { }"),
     "content_mlp sets no MLP"),
    (lambda t: t.replace("action_mlp { simple_mlp { hidden_dim: 4 } }", ""),
     "sets action_encoder without action_mlp"),
    (lambda t: t.replace("sla_k1: 0", "").replace("output_dropout_ratio: 0 }",
                                                  "output_dropout_ratio: 0 sla_k1: 4 }"),
     "sla_k1"),
    (lambda t: t.replace("contextual_preprocessor {",
                         "contextual_interleave_preprocessor {").replace(
        "action_mlp { simple_mlp { hidden_dim: 4 } }", "").replace(
        "action_encoder { simple_action_encoder { action_embedding_dim: 2\n"
        "                                                      action_weights: [1, 2] } }",
        ""),
     "enable_interleaving makes each position's actions a token"),
])
def test_config_errors_name_the_field(change, match):
    with pytest.raises(ConfigError, match=match):
        validate_pipeline_config(parse_pipeline_config(_pipeline(change(_config()))))


def test_the_config_validates():
    validate_pipeline_config(parse_pipeline_config(_pipeline(_config())))
