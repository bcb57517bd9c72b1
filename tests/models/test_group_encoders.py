"""DEEP feature groups with sequence encoders: their output is the group's features, then
each encoder's output in encoder order, for every model reading the group; build errors
name the group and the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import deep_input, sequence_input

SEQ = ('sequence_groups { group_name: "click" feature_names: ["item_id", "cate_id", '
       '"click_seq__item_id", "click_seq__cate_id"] }')
ENCODERS = """
  sequence_encoders { din_encoder { attn_mlp { hidden_units: [8] } } }
  sequence_encoders { pooling_encoder { pooling_type: "sum" } }
  sequence_encoders { simple_attention {} }
  sequence_encoders { multi_window_din_encoder { attn_mlp { hidden_units: [4] }
                                                 windows_len: [2, 3] } }"""
ALL = ('feature_groups { group_name: "all" group_type: DEEP '
       'feature_names: ["user_id", "price"] ' + SEQ + ENCODERS + ' }')
MULTI_TOWER = ALL + """
multi_tower { towers { input: "all" mlp { hidden_units: [4] } } }
losses { binary_cross_entropy {} }
"""
# the encoded group second among the groups an MMoE merges
MMOE = ('feature_groups { group_name: "user" group_type: DEEP feature_names: ["user_id"] }\n'
        + ALL + """
mmoe { expert_mlp { hidden_units: [4] } num_expert: 2
  task_towers { tower_name: "ctr" label_name: "clk" losses { binary_cross_entropy {} } } }
""")


def _expected_group(model, batch, name: str) -> torch.Tensor:
    """The group's features, then every encoder on its sequence group, concatenated."""
    embedded = model.embedding(batch.sparse)
    group = model.groups[name]
    plain = [f for f in group.features if not f.encoded]
    query, sequence, lengths = sequence_input(group.sequence_groups[0], embedded, batch)
    parts = [deep_input(type(group)(name, "DEEP", tuple(plain)), embedded, batch)]
    parts += [encoder(query, sequence, lengths)
              for encoder in model.sequence_encoders[name].encoders]
    return torch.cat(parts, dim=-1)


def test_the_encoders_outputs_follow_the_groups_features_in_encoder_order():
    model = fake_model(MULTI_TOWER)
    group = model.groups["all"]
    # user_id 4 + price 1; din 4 + sum 4 + simple 4 + multi-window (2 windows + query) 12
    assert [(f.name, f.dim) for f in group.features] == [
        ("user_id", 4), ("price", 1), ("all_seq_encoder_0", 8), ("all_seq_encoder_1", 8),
        ("all_seq_encoder_2", 8), ("all_seq_encoder_3", 24)]
    assert group.dim == 53 == model.towers["all"].layers[0].layers[0].in_features
    batch = make_batch(6, seed=3)
    inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
    # the plain features, then the sequence group's query, sequence and lengths
    assert [tuple(t.shape) for t in inputs] == [(6, 5), (6, 8), (6, 5, 8), (6,)]
    (got,) = model.groups_from_inputs([group], inputs)
    torch.testing.assert_close(got, _expected_group(model, batch, "all"))


def test_a_merged_group_keeps_each_groups_encoders_after_its_features():
    model = fake_model(MMOE)
    merged = model.input_groups[0]
    assert [f.name for f in merged.features] == [
        "user_id", "user_id", "price", "all_seq_encoder_0", "all_seq_encoder_1",
        "all_seq_encoder_2", "all_seq_encoder_3"]
    batch = make_batch(6, seed=4)
    embedded = model.embedding(batch.sparse)
    (got,) = model.groups_from_inputs(model.input_groups, model.dense_inputs(embedded, batch))
    expected = torch.cat([embedded.pooled["user_id"], _expected_group(model, batch, "all")], 1)
    torch.testing.assert_close(got, expected)


def test_the_encoders_train_with_the_model():
    model = fake_model(MULTI_TOWER)
    batch = make_batch(6, seed=5)
    model.loss(model(batch), batch)["binary_cross_entropy"].backward()
    encoders = dict(model.sequence_encoders["all"].named_parameters())
    # The DIN encoder's score bias shifts every position's score alike, which its softmax
    # cancels: its gradient is zero up to rounding (exactly zero on some builds).
    shift = encoders.pop("encoders.0.score.bias")
    torch.testing.assert_close(shift.grad, torch.zeros_like(shift), atol=1e-6, rtol=0)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoders.values())
    assert any(name.startswith("sequence_encoders.all.") for name in model.state_dict())


def test_a_pooling_encoder_reads_a_sequence_group_without_query_features():
    text = MULTI_TOWER.replace(SEQ + ENCODERS, 'sequence_groups { feature_names: '
                               '["click_seq__item_id"] } sequence_encoders { pooling_encoder {} }')
    model = fake_model(text)
    batch = make_batch(6, seed=6, lengths=[0, 1, 2, 3, 4, 5])
    embedded = model.embedding(batch.sparse)
    inputs = model.dense_inputs(embedded, batch)
    assert [tuple(t.shape) for t in inputs] == [(6, 5), (6, 5, 4), (6,)]
    (got,) = model.groups_from_inputs([model.groups["all"]], inputs)
    values, lengths = embedded.sequences["click_seq__item_id"]
    mean = values.sum(1) / lengths.clamp(min=1).unsqueeze(1)
    torch.testing.assert_close(got[:, 5:], mean)


@pytest.mark.parametrize("encoders, message", [
    ("sequence_encoders { din_encoder { attn_mlp { hidden_units: [4] } } }",
     r"feature group 'all' sequence_groups\[0\] \('all'\) needs query"),
    ("sequence_encoders { pooling_encoder {} }",
     r"feature group 'all' sequence_groups\[0\].*'nope' is not defined"),
], ids=["din-without-query", "unknown-feature"])
def test_sequence_group_errors_name_the_group(encoders, message):
    features = '"nope"' if "nope" in message else '"click_seq__item_id"'
    text = MULTI_TOWER.replace(SEQ + ENCODERS, f"sequence_groups {{ feature_names: "
                               f"[{features}] }} {encoders}")
    with pytest.raises(ModelError, match=message):
        fake_model(text)


def test_simple_attention_needs_a_query_as_wide_as_an_item():
    text = MULTI_TOWER.replace(ENCODERS, " sequence_encoders { simple_attention {} }").replace(
        '"item_id", "cate_id", "click', '"item_id", "click')
    with pytest.raises(ModelError, match=r"feature group 'all' sequence_encoders\[0\]"
                                         r".simple_attention: .*query_dim=4, sequence_dim=8"):
        fake_model(text)


# HSTU over a sequence group without query features (it reads none), then pooling over it;
# no dropout, so that a training forward repeats
HSTU_GROUP = """feature_groups { group_name: "all" group_type: DEEP
  feature_names: ["user_id", "price"]
  sequence_groups { feature_names: ["click_seq__item_id", "click_seq__cate_id"] }
  sequence_encoders { hstu_encoder { attn_dim: 4 linear_dim: 3 max_seq_length: 5
    num_heads: 2 num_blocks: 2 pos_dropout_rate: 0 linear_dropout_rate: 0 %s } }
  sequence_encoders { pooling_encoder {} } }"""
HSTU = (HSTU_GROUP % "") + """
multi_tower { towers { input: "all" mlp { hidden_units: [4] } } }
losses { binary_cross_entropy {} }
"""


def test_an_hstu_encoder_gives_its_last_valid_position_after_the_groups_features():
    model = fake_model(HSTU)
    group = model.groups["all"]
    assert [(f.name, f.dim) for f in group.features] == [
        ("user_id", 4), ("price", 1), ("all_seq_encoder_0", 8), ("all_seq_encoder_1", 8)]
    hstu = model.sequence_encoders["all"].encoders[0]
    assert (hstu.positions, len(hstu.blocks), hstu.blocks[0].num_heads) == (5 + 2 + 1, 2, 2)
    batch = make_batch(6, seed=7, lengths=[0, 1, 2, 3, 4, 5])
    embedded = model.embedding(batch.sparse)
    inputs = model.dense_inputs(embedded, batch)
    assert [tuple(t.shape) for t in inputs] == [(6, 5), (6, 5, 8), (6,)]  # no query
    (got,) = model.groups_from_inputs([group], inputs)
    torch.testing.assert_close(got, _expected_group(model, batch, "all"))
    assert torch.equal(got[0, 5:13], torch.zeros(8))  # the empty row
    norms = got[1:, 5:13].norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(5))


def test_an_hstu_encoder_trains_with_the_model():
    model = fake_model(HSTU)
    batch = make_batch(6, seed=8)
    model.loss(model(batch), batch)["binary_cross_entropy"].backward()
    hstu = dict(model.sequence_encoders["all"].encoders[0].named_parameters())
    assert len(hstu) == 1 + 2 * 3  # the positions; each block's uvqk, output weight, bias
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in hstu.values())


@pytest.mark.parametrize("fields, message", [
    ("sequence_dim: 4", r"hstu_encoder.sequence_dim is 4; the sequence group 'all' is 8 "
                        r"wide .*: set 8 or leave it out"),
    ("max_output_len: 0 max_seq_length: 2",
     r"hstu_encoder.max_seq_length is 2: with max_output_len 0 the position table holds 3 "
     r"positions, and the sequence group 'all' holds 5 .*; set max_seq_length to 4 or more"),
], ids=["sequence-dim", "too-short"])
def test_hstu_encoder_errors_name_the_field(fields, message):
    text = HSTU.replace("max_seq_length: 5", "") if "max_seq_length" in fields else HSTU
    text = text.replace("linear_dropout_rate: 0 ", f"linear_dropout_rate: 0 {fields} ")
    with pytest.raises(ModelError, match=r"feature group 'all' sequence_encoders\[0\]."
                                         + message):
        fake_model(text)
