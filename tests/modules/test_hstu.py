"""HSTU blocks and TorchEasyRec's hstu_encoder against the formulas computed position by
position with loops (padded positions hold noise, which must not count); padding further,
later positions and the host change nothing."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from hashrec.modules import HSTUBlock, HSTUEncoder, sequence_mask

LENGTHS = [0, 1, 3, 5]


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    mean = x.mean()
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean() + 1e-6)


def _block_by_hand(block: HSTUBlock, x: torch.Tensor, length: int,
                   positions: int) -> torch.Tensor:
    """One row's block output (L, D) at its valid positions, by loops (eval mode)."""
    heads, da, dl = block.num_heads, block.attn_dim, block.linear_dim
    projected = []
    for n in range(length):
        p = _layer_norm(x[n]) @ block.uvqk
        projected.append(functional.silu(p) if block.silu else p)
    out = x.clone()
    for n in range(length):
        u = projected[n][:heads * dl]
        attended = []
        for h in range(heads):
            q = projected[n][2 * heads * dl + h * da:2 * heads * dl + (h + 1) * da]
            total = torch.zeros(dl)
            for m in range(n + 1):  # causal: itself and the positions before it
                k = projected[m][2 * heads * dl + heads * da + h * da:][:da]
                v = projected[m][heads * dl + h * dl:heads * dl + (h + 1) * dl]
                total = total + functional.silu(torch.dot(q, k)) / positions * v
            attended.append(total)
        gated = u * _layer_norm(torch.cat(attended))
        out[n] = x[n] + block.output.weight @ gated + block.output.bias
    return out


def _encoder_by_hand(encoder: HSTUEncoder, sequence: torch.Tensor, length: int):
    """One row's output (D,): its last valid position after the blocks, L2-normalized."""
    dim = encoder.sequence_dim
    if length == 0:
        return torch.zeros(dim)
    x = torch.stack([sequence[t] * dim ** 0.5 + encoder.position.weight[t]
                     for t in range(length)])
    for block in encoder.blocks:
        x = _block_by_hand(block, x, length, encoder.positions)
    last = x[length - 1]
    return last / torch.linalg.norm(last).clamp(min=1e-6)


def _inputs(dim: int = 4, max_length: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    sequence = torch.randn(len(LENGTHS), max_length, dim, generator=gen)
    return sequence, torch.tensor(LENGTHS).clamp(max=max_length)


def _encoder(activation: str = "silu", **options) -> HSTUEncoder:
    torch.manual_seed(0)
    encoder = HSTUEncoder(4, 3, 2, max_seq_length=6, num_heads=2, num_blocks=2,
                          linear_activation=activation, **options)
    with torch.no_grad():  # larger than their init, so that every term shows
        for block in encoder.blocks:
            block.uvqk.normal_(0.0, 0.5)
            block.output.bias.normal_(0.0, 0.5)
    return encoder.eval()


@pytest.mark.parametrize("activation", ["silu", "none"])
def test_a_block_is_causal_pointwise_silu_attention_divided_by_the_positions(activation):
    block = _encoder(activation).blocks[0]
    x, lengths = _inputs()
    steps = torch.arange(5)
    got = block(x, steps.unsqueeze(1) >= steps.unsqueeze(0), 9.0)
    for b, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b, :length], _block_by_hand(block, x[b], length, 9)[
            :length])


@pytest.mark.parametrize("activation", ["silu", "none"])
def test_the_encoder_gives_each_rows_last_valid_position_normalized(activation):
    encoder = _encoder(activation)
    sequence, lengths = _inputs()
    got = encoder(sequence, sequence, lengths)
    assert got.shape == (4, 4) and encoder.positions == 6 + 2 + 1
    for b, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b], _encoder_by_hand(encoder, sequence[b], length))


def test_padding_a_sequence_further_changes_nothing():
    encoder = _encoder()
    sequence, lengths = _inputs()
    noise = torch.randn(4, 4, 4, generator=torch.Generator().manual_seed(1))
    longer = torch.cat([sequence, noise], dim=1)  # 9 positions: the table's size
    torch.testing.assert_close(encoder(longer, longer, lengths),
                               encoder(sequence, sequence, lengths))
    torch.testing.assert_close(encoder.encode(longer, lengths)[:, :5],
                               encoder.encode(sequence, lengths))
    assert torch.equal(encoder.encode(longer, lengths)[:, 5:], torch.zeros(4, 4, 4))


def test_padding_holding_nan_changes_nothing():
    encoder = _encoder()
    sequence, lengths = _inputs()
    poisoned = sequence.clone()
    poisoned[sequence_mask(lengths, 5).logical_not()] = float("nan")
    torch.testing.assert_close(encoder(poisoned, poisoned, lengths),
                               encoder(sequence, sequence, lengths))


def test_a_position_reads_only_itself_and_the_positions_before_it():
    encoder = _encoder()
    sequence, _ = _inputs()
    full = torch.full((4,), 5)
    encoded = encoder.encode(sequence, full)
    changed = sequence.clone()
    changed[:, 3:] = torch.randn(4, 2, 4)
    again = encoder.encode(changed, full)
    torch.testing.assert_close(again[:, :3], encoded[:, :3])
    assert not torch.allclose(again[:, 3:], encoded[:, 3:])
    # a row cut to t positions gives what position t - 1 of the whole row gives
    for t in range(1, 6):
        cut = encoder(sequence, sequence, torch.full((4,), t))
        torch.testing.assert_close(cut, encoded[:, t - 1])


def test_an_empty_row_gives_zeros_and_finite_gradients():
    encoder = _encoder(pos_dropout_rate=0.0, linear_dropout_rate=0.0).train()
    sequence, lengths = _inputs()
    sequence.requires_grad_(True)
    out = encoder(sequence, sequence, lengths)
    assert torch.equal(out[0], torch.zeros(4))
    out.sum().backward()
    grads = [p.grad for p in encoder.parameters()] + [sequence.grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert torch.equal(sequence.grad[0], torch.zeros(5, 4))  # the empty row's noise
    assert torch.equal(sequence.grad[2, 3:], torch.zeros(2, 4))  # padding past length 3


def test_dropout_applies_in_training_only():
    encoder = _encoder(pos_dropout_rate=0.5, linear_dropout_rate=0.5)
    sequence, lengths = _inputs()
    evaluated = encoder(sequence, sequence, lengths)
    torch.testing.assert_close(encoder(sequence, sequence, lengths), evaluated)
    encoder.train()
    torch.manual_seed(3)
    assert not torch.allclose(encoder(sequence, sequence, lengths), evaluated)


def test_a_sequence_longer_than_the_position_table_is_refused():
    encoder = _encoder()
    sequence = torch.randn(2, 10, 4)
    with pytest.raises(ValueError, match="sequences of 10 positions; the position table "
                                         "holds 9"):
        encoder(sequence, sequence, torch.tensor([1, 2]))


@pytest.mark.parametrize("options, message", [
    (dict(attn_dim=0), "attn_dim=0; it must be 1 or more"),
    (dict(max_seq_length=0), "max_seq_length=0; it must be 1 or more"),
    (dict(num_blocks=0), "num_blocks=0; it must be 1 or more"),
    (dict(max_output_len=-1), "max_output_len=-1; it must be 0 or more"),
    (dict(pos_dropout_rate=1.0), r"pos_dropout_rate=1.0; it must be in \[0, 1\)"),
    (dict(linear_activation="relu"), "linear_activation='relu'; allowed: silu, none"),
], ids=["attn-dim", "max-seq-length", "blocks", "output-len", "dropout", "activation"])
def test_bad_options_name_the_argument(options, message):
    arguments = dict(sequence_dim=4, attn_dim=2, linear_dim=2, max_seq_length=4)
    with pytest.raises(ValueError, match=message):
        HSTUEncoder(**{**arguments, **options})


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_encoder_scripts_and_reads_nothing_on_the_host(mode):
    from host_reads import HostReads

    encoder = _encoder(pos_dropout_rate=0.0, linear_dropout_rate=0.0).train(mode == "train")
    sequence, lengths = _inputs()
    sequence.requires_grad_(True)
    with HostReads() as reads:
        expected = encoder(sequence, sequence, lengths)
        expected.sum().backward()
    assert dict(reads.counts) == {}
    scripted = torch.jit.script(encoder)
    torch.testing.assert_close(scripted(sequence, sequence, lengths), expected)
