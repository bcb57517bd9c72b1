import pytest
import torch

from hashrec.modules import DINAttention, MLPOptions, sequence_mask


def _attention(normalizer="softmax", query_dim=4, sequence_dim=4):
    torch.manual_seed(0)
    return DINAttention(query_dim, sequence_dim, MLPOptions(hidden_units=(8, 4)), normalizer)


def test_sequence_mask():
    mask = sequence_mask(torch.tensor([0, 2, 3]), 3)
    assert mask.tolist() == [[False] * 3, [True, True, False], [True] * 3]


@pytest.mark.parametrize("normalizer", ["softmax", "none"])
def test_padded_positions_do_not_matter(normalizer):
    att = _attention(normalizer)
    query = torch.randn(3, 4)
    seq = torch.randn(3, 5, 4)
    lengths = torch.tensor([5, 2, 0])
    out = att(query, seq, lengths)
    seq2 = seq.clone()
    seq2[1, 2:] = torch.randn(3, 4) * 100
    seq2[2] = torch.randn(5, 4)
    out2 = att(query, seq2, lengths)
    assert out.shape == (3, 4)
    assert torch.allclose(out, out2, atol=1e-6)
    assert torch.equal(out[2], torch.zeros(4))


def test_softmax_weights_sum_to_one_on_valid_rows():
    att = _attention("softmax")
    weights = att.attention_weights(torch.randn(3, 4), torch.randn(3, 6, 4),
                                    torch.tensor([6, 1, 0]))
    assert torch.allclose(weights.sum(-1), torch.tensor([1.0, 1.0, 0.0]), atol=1e-6)
    assert float(weights[1, 0]) == pytest.approx(1.0)


def test_output_matches_manual_weighting():
    att = _attention("none")
    query, seq, lengths = torch.randn(2, 4), torch.randn(2, 3, 4), torch.tensor([3, 2])
    weights = att.attention_weights(query, seq, lengths)
    expected = (weights.unsqueeze(-1) * seq).sum(1)
    assert torch.allclose(att(query, seq, lengths), expected, atol=1e-6)


def test_narrow_query_is_padded_and_gradients_flow():
    att = _attention(query_dim=2, sequence_dim=6)
    query = torch.randn(4, 2, requires_grad=True)
    seq = torch.randn(4, 3, 6, requires_grad=True)
    out = att(query, seq, torch.tensor([3, 1, 2, 3]))
    assert out.shape == (4, 6)
    out.sum().backward()
    assert query.grad.abs().sum() > 0 and seq.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs,match", [
    ({"query_dim": 8, "sequence_dim": 4}, "query_dim"),
    ({"query_dim": 4, "sequence_dim": 4, "normalizer": "sigmoid"}, "normalizer"),
], ids=["wide-query", "normalizer"])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DINAttention(attn_mlp=MLPOptions(hidden_units=(4,)), **kwargs)


@pytest.mark.parametrize("use_bn", [False, True], ids=["plain", "batch-norm"])
def test_factored_first_layer_equals_the_concatenated_input(use_bn):
    torch.manual_seed(0)
    att = DINAttention(5, 5, MLPOptions(hidden_units=(8, 4), use_bn=use_bn)).double().eval()
    query, seq = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 7, 5, dtype=torch.float64)
    q = query.unsqueeze(1).expand(-1, 7, -1)
    features = torch.cat([q, seq, q - seq, q * seq], -1)
    first = torch.nn.functional.linear(features, att.mlp.first_weight(), att.mlp.first_bias())
    torch.testing.assert_close(att._first_layer(query, seq), first)
    scores = att.score(att.mlp(features)).squeeze(-1)
    expected = torch.softmax(scores.masked_fill(~sequence_mask(torch.tensor([7, 2, 0]), 7),
                                                float("-inf")), -1).nan_to_num(0.0)
    torch.testing.assert_close(att.attention_weights(query, seq, torch.tensor([7, 2, 0])),
                               expected)


@pytest.mark.parametrize("normalizer", ["softmax", "none"])
@pytest.mark.parametrize("query_dim", [5, 3], ids=["query", "narrow-query"])
def test_packed_positions_score_as_the_padded_ones(normalizer, query_dim):
    torch.manual_seed(0)
    att = DINAttention(query_dim, 5, MLPOptions(hidden_units=(8, 4), dropout_ratio=0.0),
                       normalizer).double()
    assert att.packs
    query = torch.randn(4, query_dim, dtype=torch.float64, requires_grad=True)
    seq = torch.randn(4, 6, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 2, 0, 1])
    results = []
    for packs in (True, False):
        att.packs = packs
        att.zero_grad()
        out = att(query, seq, lengths)
        grads = torch.autograd.grad(out.square().sum(), [query, seq, *att.parameters()])
        results.append((out, grads))
    torch.testing.assert_close(results[0][0], results[1][0])
    for packed, padded in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(packed, padded)
    assert torch.equal(results[0][0][2], torch.zeros(5, dtype=torch.float64))


def test_packed_scores_leave_the_padded_positions_out_of_the_mlp(monkeypatch):
    att = _attention()
    seen = []
    forward = att.score.forward
    monkeypatch.setattr(att.score, "forward", lambda x: seen.append(x.shape[0]) or forward(x))
    att(torch.randn(3, 4), torch.randn(3, 5, 4), torch.tensor([5, 2, 0]))
    assert seen == [7]


@pytest.mark.parametrize("options", [MLPOptions(hidden_units=(8,), use_bn=True),
                                     MLPOptions(hidden_units=(8,), activation="nn.Dice")],
                         ids=["batch-norm", "dice"])
def test_an_mlp_with_batch_statistics_runs_padded(options):
    assert not DINAttention(4, 4, options).packs
