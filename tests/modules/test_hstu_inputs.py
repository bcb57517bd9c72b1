"""The inputs of an HSTU user tower: TorchEasyRec's action encoder, contextualized MLPs and
the UIH preprocessor against hand computations; TorchScript gives the eager results."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from hashrec.modules.hstu_inputs import (
    ActionEncoder,
    ParameterizedContextualizedMLP,
    SimpleContextualizedMLP,
    UIHPreprocessor,
    contextualized_mlp,
)


def test_each_set_action_bit_gives_its_embedding_and_watch_times_set_more_bits():
    torch.manual_seed(0)
    encoder = ActionEncoder(2, [1, 2, 4], watchtime_thresholds=[30, 60],
                            watchtime_weights=[8, 16])
    table = encoder.table.detach()
    actions = torch.tensor([[5, 0, 2]])  # bits 1 and 4; none; 2
    watched = torch.tensor([[10.0, 61.0, 30.0]])  # none; 8 and 16; 8
    out = encoder(actions, watched)
    zero = torch.zeros(2)
    expected = [[table[0], zero, table[2], zero, zero],
                [zero, zero, zero, table[3], table[4]],
                [zero, table[1], zero, table[3], zero]]
    torch.testing.assert_close(out[0], torch.stack([torch.cat(e) for e in expected]))
    assert encoder.output_dim == 10
    # a repeated bit is set once (OR), not added
    twice = ActionEncoder(1, [1], watchtime_thresholds=[10, 20], watchtime_weights=[2, 2])
    out = twice(torch.tensor([[0]]), torch.tensor([[25.0]]))
    torch.testing.assert_close(out[0, 0], torch.cat([torch.zeros(1), twice.table[1],
                                                      twice.table[2]]).detach())


def _swish_norm(x: torch.Tensor, norm) -> torch.Tensor:
    return x * torch.sigmoid(norm(x))


def test_the_simple_mlp_is_linear_swish_layer_norm_linear_layer_norm():
    torch.manual_seed(0)
    mlp = contextualized_mlp("simple_mlp", 3, 4, 5)
    assert isinstance(mlp, SimpleContextualizedMLP)
    x = torch.randn(2, 6, 3)
    first, swish, second, norm = mlp.mlp
    hidden = x @ first.weight.t() + first.bias
    hidden = hidden * torch.sigmoid(functional.layer_norm(hidden, [5], swish.norm.weight,
                                                          swish.norm.bias, 1e-5))
    expected = functional.layer_norm(hidden @ second.weight.t() + second.bias, [4],
                                     norm.weight, norm.bias, 1e-5)
    torch.testing.assert_close(mlp(x, torch.zeros(2, 0)), expected)
    assert first.bias.abs().sum() == 0  # xavier weights, zero bias


def test_the_parameterized_mlp_gives_each_row_its_own_matrix_and_bias():
    torch.manual_seed(0)
    mlp = contextualized_mlp("parameterized_mlp", 3, 2, 4, contextual_dim=5,
                             contextual_dropout_ratio=0.5).eval()
    assert isinstance(mlp, ParameterizedContextualizedMLP)
    x, context = torch.randn(2, 6, 3), torch.randn(2, 5)
    out = mlp(x, context)
    for b in range(2):
        shared = mlp.compress(context[b])
        weights = functional.layer_norm(mlp.raw_weights(shared).reshape(3, 2), [3, 2],
                                        mlp.weights_norm.weight, mlp.weights_norm.bias)
        first, swish, second = mlp.bias
        bias = second(_swish_norm(first(shared), swish.norm))
        torch.testing.assert_close(out[b], x[b] @ weights + bias)
    mlp.train()  # the contextual features' dropout in training alone
    assert not torch.allclose(mlp(x, context), out)
    with pytest.raises(ValueError, match="contextual"):
        contextualized_mlp("parameterized_mlp", 3, 2, 4)
    with pytest.raises(ValueError, match="kind='wide_mlp'"):
        contextualized_mlp("wide_mlp", 3, 2, 4)


def test_the_preprocessor_projects_the_history_adds_actions_and_puts_contextual_tokens_first():
    torch.manual_seed(0)
    actions = ActionEncoder(2, [1, 2], [], [])
    action_mlp = contextualized_mlp("simple_mlp", 4, 6, 3)
    pre = UIHPreprocessor(5, 6, contextual_count=2, contextual_dim=3, actions=actions,
                          action_mlp=action_mlp)
    history, lengths = torch.randn(2, 4, 5), torch.tensor([4, 1])
    contextual = torch.randn(2, 6)
    bits = torch.tensor([[1, 2, 3, 0], [2, 0, 0, 0]])
    stamps = torch.rand(2, 4) * 100
    tokens, out_lengths, out_stamps = pre(history, lengths, contextual, bits,
                                          torch.zeros(2, 4), stamps)
    assert tokens.shape == (2, 6, 6) and out_lengths.tolist() == [6, 3]
    torch.testing.assert_close(out_stamps, torch.cat([torch.zeros(2, 2), stamps], dim=1))
    for b in range(2):
        for c in range(2):
            expected = contextual[b, 3 * c:3 * c + 3] @ pre.contextual_weights[c] \
                + pre.contextual_bias[c]
            torch.testing.assert_close(tokens[b, c], expected)
        content = pre.content(history[b])
        added = action_mlp(actions(bits[b:b + 1], torch.zeros(1, 4)), contextual[b:b + 1])
        torch.testing.assert_close(tokens[b, 2:], content + added[0])
    plain = UIHPreprocessor(5, 6)
    tokens, out_lengths, out_stamps = plain(history, lengths, torch.zeros(2, 0), bits,
                                            torch.zeros(2, 4), stamps)
    torch.testing.assert_close(tokens, plain.content(history))
    assert out_lengths is lengths and out_stamps is stamps
    scripted = torch.jit.script(pre)
    for got, want in zip(scripted(history, lengths, contextual, bits, torch.zeros(2, 4), stamps),
                         pre(history, lengths, contextual, bits, torch.zeros(2, 4), stamps)):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="both, or neither"):
        UIHPreprocessor(5, 6, actions=actions)
