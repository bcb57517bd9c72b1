"""A DEEP group's sequence_groups and sequence_encoders: TorchEasyRec's defaults, and
errors naming the field of every misuse."""

from __future__ import annotations

import pytest

from hashrec.config import ConfigError, parse_pipeline_config, validate_pipeline_config
from hashrec.config.sequence_groups import (
    encoder_input,
    group_feature_names,
    sequence_encoder_problems,
    sequence_group_names,
)

DIN = "din_encoder { attn_mlp { hidden_units: [8] } }"


def _group(body: str, group_type: str = "DEEP"):
    config = parse_pipeline_config(
        f'model_dir: "m"\nmodel_config {{ feature_groups {{ group_name: "all" '
        f'feature_names: ["u", "i"] group_type: {group_type} {body} }} }}')
    return config.model_config


def test_a_lone_sequence_group_takes_the_groups_name_and_its_encoders_read_it():
    model_config = _group(f'sequence_groups {{ feature_names: ["i", "s__i"] }} '
                          f'sequence_encoders {{ {DIN} }}')
    group = model_config.feature_groups[0]
    assert sequence_group_names(group) == ["all"]
    assert encoder_input(group, group.sequence_encoders[0]) == "all"
    assert group_feature_names(group) == ["u", "i", "s__i"]
    assert sequence_encoder_problems(model_config) == []
    assert not group.sequence_groups[0].group_name  # the config is not mutated


@pytest.mark.parametrize("body, message", [
    (f"sequence_encoders {{ {DIN} }}",
     r"feature_groups\[0\] \('all'\).sequence_encoders: the group has no sequence_groups"),
    ('sequence_groups { feature_names: ["s__i"] }',
     r"feature_groups\[0\] \('all'\).sequence_groups: no sequence_encoders reads them"),
    (f'sequence_groups {{ group_name: "a" feature_names: ["s__i"] }} '
     f'sequence_groups {{ group_name: "b" feature_names: ["s__i"] }} '
     f'sequence_encoders {{ {DIN} }}',
     r"sequence_encoders\[0\].din_encoder.input is not set; with several sequence groups "
     r"name the one it reads \(a, b\)"),
    (f'sequence_groups {{ feature_names: ["s__i"] }} sequence_groups {{ group_name: "b" '
     f'feature_names: ["s__i"] }} sequence_encoders {{ {DIN} }}',
     r"sequence_groups\[0\] has no group_name"),
    ('sequence_groups { feature_names: ["s__i"] } '
     'sequence_encoders { pooling_encoder { input: "x" } }',
     r"sequence_encoders\[0\].pooling_encoder.input 'x' is not a sequence group"),
    ('sequence_groups { feature_names: ["s__i"] } '
     'sequence_encoders { pooling_encoder { pooling_type: "max" } }',
     r"sequence_encoders\[0\].pooling_encoder.pooling_type 'max'; allowed: sum, mean"),
    ('sequence_groups { feature_names: ["s__i"] } sequence_encoders { '
     'multi_window_din_encoder { attn_mlp { hidden_units: 4 } } }',
     r"sequence_encoders\[0\].multi_window_din_encoder.windows_len \[\]"),
    ('sequence_groups { feature_names: ["s__i"] } sequence_encoders { }',
     r"sequence_encoders\[0\] sets no encoder"),
    ('sequence_groups { group_name: "a" feature_names: ["s__i"] } '
     'sequence_groups { group_name: "b" feature_names: ["s__i"] } '
     'sequence_encoders { din_encoder { input: "a" attn_mlp { hidden_units: 4 } } }',
     r"sequence_groups 'b': no sequence encoder reads it"),
], ids=["no-groups", "no-encoders", "no-input", "unnamed", "unknown-input", "pooling-type",
        "no-windows", "empty", "unread"])
def test_misuse_is_a_config_error_naming_the_field(body, message):
    config = parse_pipeline_config(
        f'model_dir: "m"\nmodel_config {{ feature_groups {{ group_name: "all" '
        f'feature_names: ["u"] group_type: DEEP {body} }} multi_tower {{ towers {{ '
        f'input: "all" mlp {{ hidden_units: 4 }} }} }} }}')
    with pytest.raises(ConfigError, match=message):
        validate_pipeline_config(config)


def test_sequence_encoders_belong_to_a_deep_group():
    model_config = _group(f'sequence_groups {{ feature_names: ["s__i"] }} '
                          f'sequence_encoders {{ {DIN} }}', "SEQUENCE")
    assert sequence_encoder_problems(model_config) == [
        "model_config.feature_groups[0] ('all'): sequence_groups and sequence_encoders "
        "belong to a DEEP group (as in TorchEasyRec); set group_type: DEEP or move them"]


HSTU = 'sequence_groups { feature_names: ["s__i"] } sequence_encoders { hstu_encoder { %s } }'
HSTU_NEEDS = "attn_dim: 8 linear_dim: 8 max_seq_length: 50"


def test_an_hstu_encoder_with_its_sizes_is_valid_and_reads_no_query():
    model_config = _group(HSTU % f'{HSTU_NEEDS} sequence_dim: 16 num_heads: 1 '
                                 f'num_blocks: 2 linear_activation: "none" '
                                 f'normalization: "hstu_rel_bias" max_output_len: 10')
    assert sequence_encoder_problems(model_config) == []


@pytest.mark.parametrize("fields, message", [
    ("", r"hstu_encoder.max_seq_length is not set; set it to 1 or more \(it sizes the "
         r"position embeddings\)"),
    ("attn_dim: 8 max_seq_length: 5", r"hstu_encoder.linear_dim is not set"),
    ("linear_dim: 8 max_seq_length: 5 attn_dim: 0", r"hstu_encoder.attn_dim is 0; set it"),
    (f"{HSTU_NEEDS} num_heads: 0", r"hstu_encoder.num_heads is 0; it must be 1 or more"),
    (f"{HSTU_NEEDS} num_blocks: 0", r"hstu_encoder.num_blocks is 0; it must be 1 or more"),
    (f"{HSTU_NEEDS} max_output_len: -1", r"hstu_encoder.max_output_len is -1; it must be 0"),
    (f"{HSTU_NEEDS} pos_dropout_rate: 1", r"hstu_encoder.pos_dropout_rate is 1; it must be"
                                           r" in \[0, 1\)"),
    (f"{HSTU_NEEDS} linear_dropout_rate: -0.5", r"hstu_encoder.linear_dropout_rate is -0.5"),
    (f'{HSTU_NEEDS} normalization: "softmax_rel_bias"',
     r"hstu_encoder.normalization 'softmax_rel_bias'; allowed: rel_bias, hstu_rel_bias"),
    (f'{HSTU_NEEDS} linear_config: "uv"', r"hstu_encoder.linear_config 'uv'; allowed: uvqk"),
    (f'{HSTU_NEEDS} linear_activation: "relu"',
     r"hstu_encoder.linear_activation 'relu'; allowed: silu, none"),
], ids=["no-max-seq-length", "no-linear-dim", "attn-dim-0", "heads", "blocks", "output-len",
        "pos-dropout", "linear-dropout", "softmax",
        "linear-config", "activation"])
def test_hstu_encoder_misuse_is_a_config_error_naming_the_field(fields, message):
    config = parse_pipeline_config(
        f'model_dir: "m"\nmodel_config {{ feature_groups {{ group_name: "all" '
        f'feature_names: ["u"] group_type: DEEP {HSTU % fields} }} multi_tower {{ towers {{ '
        f'input: "all" mlp {{ hidden_units: 4 }} }} }} }}')
    with pytest.raises(ConfigError, match=r"sequence_encoders\[0\]." + message):
        validate_pipeline_config(config)
