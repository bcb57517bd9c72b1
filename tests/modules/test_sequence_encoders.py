"""The sequence encoders against their formulas computed by hand, row by row and position
by position (padded positions hold noise, which must not count)."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules import (
    DINAttention,
    MLPOptions,
    MultiWindowDIN,
    SequencePooling,
    SimpleAttention,
)

LENGTHS = [0, 1, 3, 5]


def _inputs(query_dim: int, dim: int = 4, max_length: int = 5, seed: int = 0):
    """query (4, query_dim), sequence (4, max_length, dim) with noise past each row's length
    (LENGTHS clamped to max_length), lengths (4,)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(len(LENGTHS), query_dim, generator=gen)
    sequence = torch.randn(len(LENGTHS), max_length, dim, generator=gen)
    lengths = torch.tensor(LENGTHS).clamp(max=max_length)
    return query, sequence, lengths


def _softmax_pool(scores: list[torch.Tensor], items: list[torch.Tensor], dim: int):
    if not items:
        return torch.zeros(dim)
    weights = torch.softmax(torch.stack(scores), dim=0)
    return sum(w * k for w, k in zip(weights, items))


def test_simple_attention_is_a_softmax_of_dot_products_over_the_valid_positions():
    query, sequence, lengths = _inputs(4)
    got = SimpleAttention(4, 4)(query, sequence, lengths)
    for b, length in enumerate(lengths.tolist()):
        items = [sequence[b, t] for t in range(length)]
        scores = [torch.dot(k, query[b]) for k in items]
        torch.testing.assert_close(got[b], _softmax_pool(scores, items, 4))


def test_simple_attention_needs_a_query_as_wide_as_an_item():
    with pytest.raises(ValueError, match="query_dim=3, sequence_dim=4"):
        SimpleAttention(3, 4)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_pooling_sums_or_averages_the_valid_positions(pooling):
    query, sequence, lengths = _inputs(4)
    got = SequencePooling(4, pooling)(query, sequence, lengths)
    for b, length in enumerate(lengths.tolist()):
        total = sum((sequence[b, t] for t in range(length)), torch.zeros(4))
        expected = total / max(length, 1) if pooling == "mean" else total
        torch.testing.assert_close(got[b], expected)


def test_pooling_type_is_sum_or_mean():
    with pytest.raises(ValueError, match="pooling_type='max'; allowed: sum, mean"):
        SequencePooling(4, "max")


def test_din_encoder_is_a_softmax_of_the_attention_mlp_over_the_valid_positions():
    # a query narrower than an item is zero-padded
    query, sequence, lengths = _inputs(3)
    din = DINAttention(3, 4, MLPOptions(hidden_units=(6,)))
    got = din(query, sequence, lengths)
    for b, length in enumerate(lengths.tolist()):
        q = torch.cat([query[b], torch.zeros(1)])
        items = [sequence[b, t] for t in range(length)]
        scores = [din.score(din.mlp(torch.cat([q, k, q - k, q * k]).unsqueeze(0)))[0, 0]
                  for k in items]
        torch.testing.assert_close(got[b], _softmax_pool(scores, items, 4))


@pytest.mark.parametrize("max_length", [4, 8], ids=["shorter-than-windows",
                                                    "longer-than-windows"])
def test_multi_window_din_averages_attention_weighted_items_per_window(max_length):
    windows = (1, 2, 3)
    query, sequence, _ = _inputs(3, max_length=max_length)
    lengths = torch.tensor([0, 1, 3, max_length])
    torch.manual_seed(0)
    encoder = MultiWindowDIN(3, 4, windows, MLPOptions(hidden_units=(6,)))
    with torch.no_grad():
        encoder.activation.weight.fill_(0.3)  # a negative score is scaled, not cut
    got = encoder(query, sequence, lengths)
    assert got.shape == (4, 4 * (len(windows) + 1)) == (4, encoder.output_dim())
    for b, length in enumerate(lengths.tolist()):
        q = torch.cat([query[b], torch.zeros(1)])
        expected, start = [], 0
        for size in windows:
            total, count = torch.zeros(4), 0
            for t in range(start, min(start + size, length)):
                k = sequence[b, t]
                score = encoder.score(encoder.mlp(torch.cat([k, q * k, q]).unsqueeze(0)))
                a = score[0, 0] if score[0, 0] > 0 else 0.3 * score[0, 0]
                total, count = total + a * k, count + 1
            expected.append(total / max(count, 1))
            start += size
        torch.testing.assert_close(got[b], torch.cat(expected + [q]))


def test_multi_window_din_needs_windows():
    with pytest.raises(ValueError, match=r"windows_len=\[\]"):
        MultiWindowDIN(4, 4, (), MLPOptions(hidden_units=(4,)))
    with pytest.raises(ValueError, match="query_dim=5 must be in"):
        MultiWindowDIN(5, 4, (2,), MLPOptions(hidden_units=(4,)))


@pytest.mark.parametrize("encoder", [
    SimpleAttention(4, 4), SequencePooling(4, "mean"),
    MultiWindowDIN(4, 4, (2, 3), MLPOptions(hidden_units=(4,)))],
    ids=["simple_attention", "pooling", "multi_window_din"])
def test_encoders_script_and_read_nothing_on_the_host(encoder):
    from host_reads import HostReads

    query, sequence, lengths = _inputs(4)
    with HostReads() as reads:
        expected = encoder(query, sequence, lengths)
    assert dict(reads.counts) == {}
    torch.testing.assert_close(torch.jit.script(encoder)(query, sequence, lengths), expected)
