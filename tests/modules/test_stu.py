"""TorchEasyRec's STU layer, its attention mask, positional encoder and output
postprocessors against their formulas computed row by row and position by position
(padded positions hold noise, which must not count); TorchScript gives the eager
results."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional

from hashrec.modules.stu import OutputPostprocessor, PositionalEncoder, STULayer, stu_mask

LENGTHS = [0, 1, 3, 6]
LENGTH = 6


def _norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    mean = x.mean()
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean() + 1e-6) * weight + bias


def _reads(n: int, m: int, contextual: int, window: int) -> bool:
    """Whether position n reads position m (both within the row), as TorchEasyRec's
    attention mask has it, written out case by case."""
    if n < contextual:  # a contextual token reads the whole row
        return True
    if m < contextual:  # the contextual tokens are one position before the history
        return window == 0 or n - contextual + 1 <= window
    return m <= n and (window == 0 or n - m <= window)


def _layer_by_hand(layer: STULayer, x: torch.Tensor, length: int, contextual: int,
                   window: int) -> torch.Tensor:
    """One row's layer output at its valid positions (length, D), by loops (eval)."""
    heads, hidden, attention = layer.num_heads, layer.hidden_dim, layer.attention_dim
    rows = []
    for n in range(length):
        normed = _norm(x[n], layer.input_norm_weight, layer.input_norm_bias)
        rows.append(normed @ layer.uvqk_weight + layer.uvqk_bias)
    out = []
    for n in range(length):
        u = functional.silu(rows[n][:heads * hidden])
        parts = []
        for h in range(heads):
            q = rows[n][2 * heads * hidden + h * attention:][:attention]
            total = torch.zeros(hidden)
            for m in range(length):
                if not _reads(n, m, contextual, window):
                    continue
                k = rows[m][2 * heads * hidden + heads * attention + h * attention:][:attention]
                v = rows[m][heads * hidden + h * hidden:][:hidden]
                total = total + functional.silu(layer.alpha * torch.dot(q, k)) \
                    / layer.scaling * v
            parts.append(total)
        attended = torch.cat(parts)
        if layer.use_group_norm:
            normed = torch.cat([_norm(parts[h], layer.output_norm_weight[h],
                                      layer.output_norm_bias[h]) for h in range(heads)])
        else:
            normed = _norm(attended, layer.output_norm_weight, layer.output_norm_bias)
        y = torch.cat([u, attended, u * normed])
        out.append(x[n] + y @ layer.output_weight)
    return torch.stack(out) if out else torch.zeros(0, x.shape[1])


def _layer(group_norm: bool = False, alpha: float = 0.0) -> STULayer:
    torch.manual_seed(0)
    layer = STULayer(8, 2, 3, 4, output_dropout_ratio=0.5, attn_alpha=alpha,
                     use_group_norm=group_norm, scaling_seqlen=7)
    with torch.no_grad():  # away from their init (ones, zeros), so that every term shows
        for p in (layer.uvqk_bias, layer.input_norm_weight, layer.input_norm_bias,
                  layer.output_norm_weight, layer.output_norm_bias):
            p.add_(torch.randn(p.shape) * 0.5)
    return layer.eval()


def _inputs(noise: float = 1.0, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(len(LENGTHS), LENGTH, 8, generator=torch.Generator().manual_seed(seed))
    lengths = torch.tensor(LENGTHS)
    padding = torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)
    return x.masked_fill(padding.unsqueeze(-1), noise), lengths


@pytest.mark.parametrize("group_norm, alpha, contextual, window", [
    (False, 0.0, 0, 0), (True, 0.0, 0, 0), (False, 0.7, 2, 0), (False, 0.0, 0, 2),
    (True, 0.0, 2, 1)], ids=["layer-norm", "group-norm", "alpha-contextual", "window",
                             "group-norm-contextual-window"])
def test_a_layer_is_silu_attention_over_the_positions_the_mask_allows(group_norm, alpha,
                                                                      contextual, window):
    layer = _layer(group_norm, alpha)
    x, lengths = _inputs(noise=5.0)  # the padding's noise must not count
    allowed = stu_mask(lengths, LENGTH, contextual, window)
    with torch.no_grad():
        out = layer(x, allowed)
    for row, length in enumerate(LENGTHS):
        expected = _layer_by_hand(layer, x[row], length, contextual, window)
        torch.testing.assert_close(out[row, :length], expected, rtol=1e-5, atol=1e-5)
    assert layer.alpha == (alpha if alpha else 1 / math.sqrt(4))


def test_the_mask_reads_itself_and_earlier_positions_and_contextual_tokens_read_all():
    allowed = stu_mask(torch.tensor([5]), 6, contextual=2, max_attn_len=2)[0]
    expected = torch.tensor([[_reads(n, m, 2, 2) and n < 5 and m < 5 for m in range(6)]
                             for n in range(6)])
    assert torch.equal(allowed, expected)
    # row 2 (the first history item) reads the two tokens and itself; row 4 (the third)
    # reads the items at most 2 back (positions 2 to 4) but not the tokens, 3 back
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    assert allowed[4].tolist() == [False, False, True, True, True, False]
    assert allowed[0].tolist() == [True] * 5 + [False]


def test_padding_further_and_later_positions_change_nothing_before_them():
    layer = _layer()
    x, lengths = _inputs()
    with torch.no_grad():
        out = layer(x, stu_mask(lengths, LENGTH))
        longer = torch.cat([x, torch.randn(len(LENGTHS), 3, 8)], dim=1)
        padded = layer(longer, stu_mask(lengths, LENGTH + 3))
        cut = layer(x[:, :3], stu_mask(lengths.clamp(max=3), 3))
    for row, length in enumerate(LENGTHS):
        torch.testing.assert_close(padded[row, :length], out[row, :length])
        torch.testing.assert_close(cut[row, :min(length, 3)], out[row, :min(length, 3)])


def test_dropout_acts_in_training_alone():
    layer = _layer()
    x, lengths = _inputs()
    allowed = stu_mask(lengths, LENGTH)
    with torch.no_grad():
        evaluated = layer(x, allowed)
        layer.train()
        trained = layer(x, allowed)
    assert not torch.allclose(trained[3], evaluated[3])


def test_positions_count_forward_without_time_and_back_from_the_end_with_it():
    torch.manual_seed(0)
    plain = PositionalEncoder(4, num_position_buckets=4)
    x = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 2])
    timestamps = torch.zeros(2, 6)
    out = plain(x, lengths, timestamps)
    for row, length in enumerate([6, 2]):
        for i in range(length):  # position i, at most the last of the 4 buckets
            torch.testing.assert_close(out[row, i], x[row, i] * 2 + plain.position[min(i, 3)])
    timed = PositionalEncoder(4, num_position_buckets=8, num_time_buckets=5,
                              use_time_encoding=True, contextual_seq_len=2,
                              time_bucket_fn="sqrt", time_bucket_increments=60.0)
    # two contextual tokens (timestamp 0), then four history items
    stamps = torch.tensor([[0.0, 0.0, 1000.0, 3400.0, 3700.0, 4000.0, 0.0]])
    x = torch.randn(1, 7, 4)
    out = timed(x, torch.tensor([6]), stamps)
    gaps = [4000.0, 4000.0, 3000.0, 600.0, 300.0, 0.0]  # to the last, 4000
    for i in range(6):
        position = i if i < 2 else min(6 - i + 2, 7)
        bucket = min(int(math.sqrt(max(gaps[i], 1e-6) / 60.0)), 5)
        expected = x[0, i] * 2 + timed.position[position] + timed.time[bucket]
        torch.testing.assert_close(out[0, i], expected)
    # the contextual tokens' gap (4000 s) is bucket 8, clamped to the last, 5
    assert min(int(math.sqrt(4000 / 60)), 5) == 5


def _backward_nodes(out: torch.Tensor) -> set[str]:
    """The names of the autograd nodes ``out`` was computed through."""
    seen, todo, names = set(), [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_table_reads_and_head_norms_avoid_the_slow_backwards():
    """The positional encoder's rows go through an embedding's backward, not indexing's
    (whose accumulation of many reads of one row, as every slot of timestamp 0 makes, took
    60x as long on a GPU), and the group norm a head is a LayerNorm, not group_norm (3.5x;
    benchmarks/results/stu_ops_gpu_h100.md)."""
    encoder = PositionalEncoder(4, num_position_buckets=8, num_time_buckets=5,
                                use_time_encoding=True, contextual_seq_len=2)
    stamps = torch.tensor([[0.0, 0.0, 1000.0, 3400.0, 0.0]])
    names = _backward_nodes(encoder(torch.randn(1, 5, 4), torch.tensor([4]), stamps))
    assert "EmbeddingBackward0" in names and "IndexBackward0" not in names, names
    plain = PositionalEncoder(4, num_position_buckets=4)
    names = _backward_nodes(plain(torch.randn(1, 5, 4), torch.tensor([4]), stamps))
    assert "EmbeddingBackward0" in names and "IndexBackward0" not in names, names
    layer = _layer(group_norm=True)
    x, lengths = _inputs()
    names = _backward_nodes(layer(x, stu_mask(lengths, x.shape[1])))
    assert "NativeLayerNormBackward0" in names, names
    assert not any("GroupNorm" in name for name in names), names


def test_log_time_buckets():
    torch.manual_seed(0)
    timed = PositionalEncoder(2, 4, num_time_buckets=9, use_time_encoding=True,
                              time_bucket_fn="log", time_bucket_increments=1.0)
    stamps = torch.tensor([[0.0, 990.0, 1000.0]])
    x = torch.zeros(1, 3, 2)
    out = timed(x, torch.tensor([3]), stamps)
    # gaps 1000, 10, 0 -> log 6.9, 2.3, log(1e-6) < 0 -> buckets 6, 2, 0
    for i, bucket in enumerate([6, 2, 0]):
        torch.testing.assert_close(out[0, i], timed.position[3 - i] + timed.time[bucket])


def test_postprocessors():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    stamps = torch.tensor([[0.0, 3700.0, 90000.0], [7200.0, 0.0, 1.0]])
    l2 = OutputPostprocessor("l2norm_postprocessor", 4, [], [])
    torch.testing.assert_close(l2(x, stamps), x / x.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(l2(torch.zeros(1, 1, 4), stamps[:1, :1]), torch.zeros(1, 1, 4))
    norm = OutputPostprocessor("layernorm_postprocessor", 4, [], [])
    torch.testing.assert_close(norm(x, stamps), functional.layer_norm(x, [4], eps=1e-5))
    timed = OutputPostprocessor("timestamp_layernorm_postprocessor", 4, [3600, 86400],
                                [24, 7])
    out = timed(x, stamps)
    for b in range(2):
        for i in range(3):
            t = float(stamps[b, i])
            angles = [(t // 3600 % 24) / 24 * 2 * 3.14, (t // 86400 % 7) / 7 * 2 * 3.14]
            circle = [f(a) for a in angles for f in (math.cos, math.sin)]
            combined = timed.combiner(torch.cat([x[b, i], torch.tensor(circle)]))
            torch.testing.assert_close(out[b, i], functional.layer_norm(combined, [4],
                                                                        eps=1e-5))


def test_scripted_modules_give_the_eager_results():
    layer = _layer(group_norm=True)
    x, lengths = _inputs()
    allowed = stu_mask(lengths, LENGTH, 1, 2)
    torch.testing.assert_close(torch.jit.script(layer)(x, allowed), layer(x, allowed))
    timed = PositionalEncoder(8, 8, 4, True, 1)
    stamps = torch.rand(len(LENGTHS), LENGTH) * 1e4
    torch.testing.assert_close(torch.jit.script(timed)(x, lengths, stamps),
                               timed(x, lengths, stamps))
    post = OutputPostprocessor("timestamp_layernorm_postprocessor", 8, [60], [60])
    torch.testing.assert_close(torch.jit.script(post)(x, stamps), post(x, stamps))


@pytest.mark.parametrize("options, message", [
    ({"num_heads": 0}, "num_heads=0"), ({"scaling_seqlen": 0}, "scaling_seqlen=0"),
    ({"output_dropout_ratio": 1.0}, "output_dropout_ratio=1.0")])
def test_layer_options_out_of_range(options, message):
    with pytest.raises(ValueError, match=message):
        STULayer(**{"embedding_dim": 4, "num_heads": 1, "hidden_dim": 2, "attention_dim": 2,
                    "scaling_seqlen": 4, **options})
