"""MIND's capsule routing and label-aware attention against hand-written loops, its
model on the fakes and its config errors."""

from __future__ import annotations

import math

import pytest
import torch
from model_fakes import fake_model, make_batch

from hashrec.features.batch import Batch
from hashrec.models import ModelError
from hashrec.models.match import label_aware_attention
from hashrec.modules.capsule import CapsuleLayer, interest_mask, squash

# MIND over the fakes: user features, the click sequence, the item's tables.
CONFIG = """
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "hist" feature_names: ["click_seq__item_id",
                 "click_seq__cate_id"] group_type: SEQUENCE }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
mind { user_tower { input: "user" history_input: "hist" user_mlp { hidden_units: [8, 6] }
                    hist_seq_mlp { hidden_units: [8, 5] }
                    capsule_config { max_k: 3 max_seq_len: 4 high_dim: 5 num_iters: 2
                                     squash_pow: 0.5 }
                    concat_mlp { hidden_units: [7] } }
       item_tower { input: "item" mlp { hidden_units: [6] } }
       output_dim: 4 simi_pow: 20 temperature: 0.5 %s }
losses { softmax_cross_entropy {} }
"""


def _squash_by_hand(vector: list[float], power: float) -> list[float]:
    square = sum(v * v for v in vector)
    if square == 0:
        return [0.0] * len(vector)
    scale = (square / (1 + square)) ** power / math.sqrt(square)
    return [scale * v for v in vector]


def _route_by_hand(layer: CapsuleLayer, sequence: torch.Tensor, length: int
                   ) -> list[list[float]]:
    """One user's routing, loop by loop in plain Python (the module docstring's steps)."""
    steps, keep = layer.max_seq_len, min(length, layer.max_seq_len)
    count = layer.max_k if layer.const_caps_num else \
        math.ceil(min(max(math.log2(length) if length else -math.inf, 1.0), layer.max_k))
    w = layer.bilinear.tolist()
    low = []
    for s in range(steps):
        e = sequence[s].tolist() if s < min(keep, sequence.shape[0]) else \
            [0.0] * sequence.shape[1]
        u = [sum(e[i] * w[i][h] for i in range(len(e))) for h in range(len(w[0]))]
        norm = math.sqrt(sum(x * x for x in u))
        low.append([x / max(norm, 1e-12) for x in u] if s < keep else [0.0] * len(u))
    b = layer.initial_logits.tolist()
    caps = []
    for _ in range(layer.num_iters):
        weights = []
        for s in range(steps):
            exps = [math.exp(b[s][k]) if k < count else 0.0 for k in range(layer.max_k)]
            weights.append([x / sum(exps) * (s < keep) for x in exps])
        caps = [_squash_by_hand([sum(weights[s][k] * low[s][h] for s in range(steps))
                                 for h in range(len(low[0]))], layer.squash_pow)
                for k in range(layer.max_k)]
        b = [[b[s][k] + layer.scale * sum(c * u for c, u in zip(caps[k], low[s]))
              for k in range(layer.max_k)] for s in range(steps)]
    return [caps[k] if k < count else [0.0] * len(low[0]) for k in range(layer.max_k)]


@pytest.mark.parametrize("constant", [False, True], ids=["adaptive", "const-caps"])
def test_capsule_routing_matches_the_hand_written_loop(constant):
    torch.manual_seed(3)
    layer = CapsuleLayer(3, max_k=3, max_seq_len=6, high_dim=2, num_iters=3,
                         routing_logits_scale=2.0, squash_pow=0.5, const_caps_num=constant)
    # L = 7 > max_seq_len (cut); lengths 0, 1, 2, 5, 7 (counts 1, 1, 1, 3, 3)
    sequence = torch.randn(5, 7, 3)
    lengths = torch.tensor([0, 1, 2, 5, 7])
    interests, mask = layer(sequence, lengths)
    assert interests.shape == (5, 3, 2)
    for row in range(5):
        expected = _route_by_hand(layer, sequence[row], int(lengths[row]))
        torch.testing.assert_close(interests[row], torch.tensor(expected), atol=1e-5,
                                   rtol=1e-4)
    counts = [3] * 5 if constant else [1, 1, 1, 3, 3]
    assert mask.sum(dim=1).tolist() == counts


def test_interest_count_grows_with_log2_of_the_length():
    lengths = torch.tensor([0, 1, 2, 3, 4, 5, 8, 9, 1000])
    counts = interest_mask(lengths, 4, False).sum(dim=1).tolist()
    assert counts == [1, 1, 1, 2, 2, 3, 3, 4, 4]
    assert interest_mask(lengths, 4, True).all()


def test_short_sequences_are_zero_padded_and_padding_is_ignored():
    torch.manual_seed(0)
    layer = CapsuleLayer(2, max_k=2, max_seq_len=5, high_dim=3)
    short = torch.randn(2, 3, 2)
    noisy = torch.cat([short, torch.randn(2, 4, 2)], dim=1)  # noise after the lengths
    lengths = torch.tensor([3, 2])
    torch.testing.assert_close(layer(short, lengths)[0], layer(noisy, lengths)[0])


def test_squash_scales_to_the_squashed_length_and_keeps_zero():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    out = squash(x, 2.0)
    torch.testing.assert_close(out[0], torch.tensor([3.0, 4.0]) * (25 / 26) ** 2 / 5)
    torch.testing.assert_close(out[1], torch.zeros(2))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_label_aware_attention_by_hand():
    interests = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
                              [[1.0, 1.0], [2.0, -1.0], [5.0, 5.0]]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    item = torch.tensor([[0.5, 0.25], [1.0, 0.0]])
    out = label_aware_attention(interests, mask, item, 2.0)
    for row in range(2):
        scores = [2.0 * float(interests[row, k] @ item[row]) for k in range(2)]
        weights = [math.exp(s) / sum(math.exp(t) for t in scores) for s in scores]
        expected = sum(w * interests[row, k] for k, w in enumerate(weights))
        torch.testing.assert_close(out[row], expected)  # the masked [5, 5] takes no part


@pytest.mark.parametrize("negatives", ["in_batch_negative: true", ""],
                         ids=["in-batch", "sampled"])
def test_model_similarity_is_the_attended_interests_against_the_items(negatives):
    model = fake_model(CONFIG % negatives)
    model.eval()
    sampled = 0 if negatives else 2
    batch = make_batch(4 + sampled, seed=1, lengths=[0, 2, 4, 5] + [0] * sampled)
    if sampled:
        batch = Batch(batch.sparse, dense=batch.dense,
                      labels={k: v[:4] for k, v in batch.labels.items()}, batch_size=4,
                      negatives=sampled)
    similarity = model(batch)["similarity"]
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    interests, mask, item = model.embeddings(*inputs)
    assert interests.shape == (4, 3, 4) and item.shape == (4 + sampled, 4)
    assert mask.sum(dim=1).tolist() == [1, 1, 2, 3]
    torch.testing.assert_close(interests.norm(dim=-1), mask.float())  # COSINE, zero beyond
    user = torch.nn.functional.normalize(
        label_aware_attention(interests, mask, item[:4], 20.0), dim=-1)
    expected = user @ item.t() / 0.5
    if sampled:
        expected = torch.cat([(user * item[:4]).sum(-1, keepdim=True) / 0.5,
                              expected[:, 4:]], dim=1)
    torch.testing.assert_close(similarity, expected)
    loss = model.loss({"similarity": similarity}, batch)["softmax_cross_entropy"]
    assert torch.isfinite(loss)


@pytest.mark.parametrize("change, message", [
    (('history_input: "hist"', 'history_input: "item"'),
     r"mind.user_tower.history_input: feature group 'item' is DEEP, expected SEQUENCE"),
    (("max_k: 3", "max_k: 0"), r"mind.user_tower.capsule_config.max_k=0; allowed: 1"),
    (("num_iters: 2", "num_iters: 0"), r"capsule_config.num_iters=0"),
    (("squash_pow: 0.5", "squash_pow: 0.5 routing_init_method: 'uniform'"),
     r"capsule_config.routing_init_method='uniform'; allowed: 'normal', 'zeros'"),
    (("output_dim: 4", "output_dim: 0"), r"mind: output_dim 0 .* 7 \(user\) and 6"),
    (("user_mlp { hidden_units: [8, 6] }", "user_mlp { }"),
     r"mind.user_tower.user_mlp: MLPOptions.hidden_units"),
    (('"click_seq__item_id",', '"click_seq__item_id", "cate_id",'),
     r"the SEQUENCE group 'hist' holds non-sequence features \['cate_id'\]"),
])
def test_config_errors_name_the_field(change, message):
    text = (CONFIG % "in_batch_negative: true").replace(*change)
    if "cate_id\"," in change[1]:
        text = text.replace('["item_id", "cate_id"]', '["item_id"]')
    with pytest.raises(ModelError, match=message):
        fake_model(text)


def test_a_group_read_twice_is_refused():
    text = (CONFIG % "").replace('item_tower { input: "item"', 'item_tower { input: "user"')
    with pytest.raises(ModelError, match=r"mind: the towers read the feature group\(s\) "
                                         r"\['user'\] more than once"):
        fake_model(text)
