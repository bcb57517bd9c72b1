"""dlrm_hstu's inputs to the STU layers by hand: the target-aware attention mask (each
candidate reads the contextual tokens, the history and itself), the candidates' shared
position, packing candidates after a row's history, the three content encoders, and the
contextual and interleave preprocessors (a candidate's actions one learned vector; its
token in training and in evaluation)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hashrec.modules.hstu_inputs import ActionEncoder
from hashrec.modules.hstu_ranking import ContentEncoder, TargetPreprocessor, pack
from hashrec.modules.stu import PositionalEncoder, stu_mask


def _rows(mask: torch.Tensor) -> list[list[int]]:
    """Each position's readable positions."""
    return [[m for m in range(mask.shape[1]) if mask[n, m]] for n in range(mask.shape[0])]


def test_targets_read_the_history_and_themselves_never_each_other():
    # one contextual token, two history positions, two targets
    mask = stu_mask(torch.tensor([5]), 5, contextual=1, num_targets=torch.tensor([2]))[0]
    assert _rows(mask) == [[0, 1, 2, 3, 4],  # the contextual token reads the whole row
                           [0, 1], [0, 1, 2],  # the history: causal, no target
                           [0, 1, 2, 3], [0, 1, 2, 4]]  # a target: the history and itself


def test_targets_without_contextual_tokens_with_padding_and_a_window():
    # row 0: 2 history + 2 targets; row 1: 2 history + 1 target, then padding
    mask = stu_mask(torch.tensor([4, 3]), 4, num_targets=torch.tensor([2, 1]))
    assert _rows(mask[0]) == [[0], [0, 1], [0, 1, 2], [0, 1, 3]]
    assert _rows(mask[1]) == [[0], [0, 1], [0, 1, 2], []]
    # a target is one position after the history: within 1 it reads the last one alone
    window = stu_mask(torch.tensor([4]), 4, max_attn_len=1, num_targets=torch.tensor([2]))
    assert _rows(window[0]) == [[0], [0, 1], [1, 2], [1, 3]]


def test_without_targets_the_mask_is_the_causal_one():
    lengths = torch.tensor([4, 2])
    assert torch.equal(stu_mask(lengths, 4, 1, 2), stu_mask(lengths, 4, 1, 2, None))
    causal = stu_mask(lengths, 4, num_targets=torch.tensor([0, 0]))
    assert torch.equal(causal, stu_mask(lengths, 4))


def test_targets_share_the_position_after_the_history():
    encoder = PositionalEncoder(2, 16)
    with torch.no_grad():
        encoder.position.copy_(torch.arange(16.0).unsqueeze(1).expand(16, 2))
    x = torch.zeros(1, 5, 2)
    out = encoder(x, torch.tensor([5]), torch.zeros(1, 5), torch.tensor([2]))
    assert out[0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 3.0]
    # with time encoding positions count back from the history's end, targets at 0
    timed = PositionalEncoder(2, 16, 4, use_time_encoding=True)
    with torch.no_grad():
        timed.position.copy_(torch.arange(16.0).unsqueeze(1).expand(16, 2))
        timed.time.zero_()
    out = timed(x, torch.tensor([5]), torch.zeros(1, 5), torch.tensor([2]))
    assert out[0, :, 0].tolist() == [3.0, 2.0, 1.0, 0.0, 0.0]


def test_pack_puts_a_rows_candidates_right_after_its_history():
    history = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    targets = torch.tensor([[5.0, 9.0], [6.0, 7.0]])
    out = pack(history, torch.tensor([2, 1]), targets, torch.tensor([1, 2]))
    assert out.shape == (2, 5)
    assert out[0, :3].tolist() == [1.0, 2.0, 5.0] and out[1, :3].tolist() == [3.0, 6.0, 7.0]
    wide = pack(history.unsqueeze(-1).expand(-1, -1, 2), torch.tensor([2, 1]),
                targets.unsqueeze(-1).expand(-1, -1, 2), torch.tensor([1, 2]))
    assert torch.equal(wide[..., 1], out)


def test_content_encoders_make_history_and_candidates_one_width():
    history, targets = torch.randn(2, 3, 4), torch.randn(2, 2, 6)
    h, t = ContentEncoder("slice_content_encoder", 4, 6)(history, targets)
    assert torch.equal(h, history) and torch.equal(t, targets[..., :4])
    pad = ContentEncoder("pad_content_encoder", 4, 6)
    h, t = pad(history, targets)
    assert torch.equal(h[..., :4], history) and torch.equal(t, targets)
    assert torch.equal(h[..., 4:], pad.padding.expand(2, 3, 2))
    mlp = ContentEncoder("mlp_content_encoder", 4, 6, nn.Linear(4, 5), nn.Linear(6, 5), 5)
    h, t = mlp(history, targets)
    assert torch.equal(h, mlp.history_mlp(history)) and torch.equal(t, mlp.target_mlp(targets))
    assert mlp.output_dim == 5 and pad.output_dim == 6
    with pytest.raises(ValueError, match="slice_content_encoder takes a candidate's first 6"):
        ContentEncoder("slice_content_encoder", 6, 4)
    with pytest.raises(ValueError, match="pad_content_encoder pads the history"):
        ContentEncoder("pad_content_encoder", 4, 4)


class Passthrough(nn.Module):
    """A contextualized MLP stand-in: the sequence as it is."""

    def forward(self, sequence: torch.Tensor, contextual: torch.Tensor) -> torch.Tensor:
        return sequence


def _inputs():
    """One row: 2 history positions (width 4), 2 candidates (of 3 slots), 2 contextual
    features of width 3, actions 1 and 2, timestamps."""
    return dict(history=torch.randn(1, 3, 4), lengths=torch.tensor([2]),
                targets=torch.randn(1, 3, 4), counts=torch.tensor([2]),
                contextual=torch.randn(1, 6), actions=torch.tensor([[1, 2, 0]]),
                watchtimes=torch.zeros(1, 3), timestamps=torch.tensor([[10.0, 20.0, 0.0]]),
                target_timestamps=torch.tensor([[30.0, 40.0, 0.0]]))


def test_the_contextual_preprocessor_places_context_history_and_candidates():
    torch.manual_seed(0)
    actions = ActionEncoder(2, [1, 2], [], [])
    prep = TargetPreprocessor(ContentEncoder("slice_content_encoder", 4, 4), Passthrough(), 4,
                              2, 3, actions, Passthrough())
    inputs = _inputs()
    x, total, times, targets, position = prep(**inputs)
    assert total.tolist() == [6] and targets.tolist() == [2] and position.tolist() == [[4, 5, 6]]
    assert times[0, :6].tolist() == [0.0, 0.0, 10.0, 20.0, 30.0, 40.0]
    context = torch.einsum("ci,cio->co", inputs["contextual"].reshape(2, 3),
                           prep.contextual_weights) + prep.contextual_bias
    torch.testing.assert_close(x[0, :2], context)
    bits = actions(inputs["actions"], inputs["watchtimes"])[0]
    torch.testing.assert_close(x[0, 2:4], inputs["history"][0, :2] + bits[:2])
    # a candidate's actions are the learned vector, whatever the batch says of them
    torch.testing.assert_close(x[0, 4:6], inputs["targets"][0, :2] + prep.target_action[0])


def test_interleaving_gives_each_position_two_tokens_and_a_candidate_one_in_evaluation():
    torch.manual_seed(0)
    actions = ActionEncoder(2, [1, 2], [], [])
    prep = TargetPreprocessor(ContentEncoder("slice_content_encoder", 4, 4), Passthrough(), 4,
                              0, 0, actions, Passthrough(), interleave=True)
    inputs = _inputs()
    bits = actions(inputs["actions"], inputs["watchtimes"])[0]
    x, total, times, targets, position = prep(**inputs)
    assert total.tolist() == [8] and targets.tolist() == [4]
    assert position.tolist() == [[4, 6, 8]]  # a candidate's content token
    torch.testing.assert_close(x[0, 0], inputs["history"][0, 0])
    torch.testing.assert_close(x[0, 1], bits[0])
    torch.testing.assert_close(x[0, 4], inputs["targets"][0, 0])
    torch.testing.assert_close(x[0, 5], prep.target_action[0, 0])
    assert times[0, :8].tolist() == [10.0, 10.0, 20.0, 20.0, 30.0, 30.0, 40.0, 40.0]
    prep.eval()
    x, total, times, targets, position = prep(**inputs)
    assert total.tolist() == [6] and targets.tolist() == [2] and position.tolist()[0][:2] == [4, 5]
    torch.testing.assert_close(x[0, 4:6], inputs["targets"][0, :2])
    assert times[0, :6].tolist() == [10.0, 10.0, 20.0, 20.0, 30.0, 40.0]


def test_interleaving_needs_actions():
    with pytest.raises(ValueError, match="interleaving makes each position's actions a token"):
        TargetPreprocessor(ContentEncoder("slice_content_encoder", 4, 4), Passthrough(), 4,
                           interleave=True)


def test_the_preprocessor_is_scriptable():
    actions = ActionEncoder(2, [1, 2], [], [])
    prep = TargetPreprocessor(ContentEncoder("slice_content_encoder", 4, 4), Passthrough(), 4,
                              2, 3, actions, Passthrough(), interleave=True).eval()
    scripted = torch.jit.script(prep)
    inputs = _inputs()
    for eager, compiled in zip(prep(**inputs), scripted(**inputs)):
        torch.testing.assert_close(eager, compiled)
