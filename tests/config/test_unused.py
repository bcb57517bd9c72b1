"""Config fields HashRec parses but does not act on: refused when they would change the
model, noted when they would not."""

from __future__ import annotations

import re

import pytest
from google.protobuf import text_format

from hashrec.config import load_pipeline_config
from hashrec.config.unused import fg_mode_note, ignored_field_notes, unused_field_problems

EXAMPLE = "examples/multi_tower_din_taobao_dynamicemb.config"


def example_with(text: str):
    """The example config with ``text`` merged in (repeated fields appended)."""
    return text_format.Merge(text, load_pipeline_config(EXAMPLE))


@pytest.mark.parametrize("text, message", [
    ("train_config { gradient_accumulation_steps: 4 }",
     "train_config.gradient_accumulation_steps is not supported"),
    ('feature_configs { sequence_feature { sequence_name: "s" features { id_feature { '
     'feature_name: "i" use_mask: true } } } }', "feature 's__i'.*use_mask"),
    ('train_config { grad_clipping { clipping_type: "norm" enable_global_grad_clip: true } }',
     "train_config.grad_clipping.enable_global_grad_clip is not supported"),
    ('model_config { feature_groups { group_name: "g" embedding_name_suffix: "_x" } }',
     r"model_config.feature_groups\[\d+\].embedding_name_suffix is not supported"),
    ("data_config { sample_mask_prob: 0.1 }", "data_config.sample_mask_prob is not supported"),
    ("data_config { min_batch_size: 32 }",
     "data_config.min_batch_size is not supported.*drop_remainder"),
    ('data_config { input_fields_str: "a:INT64;b:STRING" }',
     "data_config.input_fields_str is not supported.*input_fields"),
    ('data_config { sample_cost_field: "cost" }', "data_config.sample_cost_field"),
    ('eval_config { evaluator_type: "best" }', "eval_config.evaluator_type is not supported"),
    ("eval_config { eval_online: true }", "eval_config.eval_online is not supported"),
    ("export_config { export_format: HF }", "export_config.export_format is not supported"),
    ("train_config { dense_optimizer { ema { decay: 0.99 } } }",
     "train_config.dense_optimizer.ema is not supported.*without a moving average"),
    ("model_config { variational_dropout { regularization_lambda: 0.01 } }",
     "model_config.variational_dropout is not supported.*dropout_ratio"),
    ("train_config { save_checkpoints_timestamp_interval: 3600 }",
     "train_config.save_checkpoints_timestamp_interval is not supported.*no event time"),
    ("train_config { save_checkpoints_timestamps: [1700000000] }",
     "train_config.save_checkpoints_timestamps is not supported"),
    ("train_config { delta_embedding_dump_config { dump_interval_steps: 100 } }",
     "train_config.delta_embedding_dump_config is not supported.*incremental_dump_steps"),
], ids=["accumulation", "sequence-mask", "global-clip",
        "name-suffix", "sample-mask", "min-batch", "fields-str", "cost", "best-evaluator",
        "eval-online", "hf-export", "ema",
        "variational-dropout", "timestamp-interval", "timestamps",
        "delta-dump"])
def test_fields_that_would_change_the_model_are_refused(text, message):
    problems = unused_field_problems(example_with(text))
    assert len(problems) == 1
    assert re.search(message, problems[0]), problems


def test_defaults_and_harmless_values_pass():
    text = ("train_config { gradient_accumulation_steps: 1 }\n"
            "train_config { grad_clipping { enable_global_grad_clip: false } }\n"
            'train_config { fine_tune_ckpt_param_map: "map.txt" }\n'
            'feature_configs { raw_feature { feature_name: "p" use_mask: false } }\n'
            "model_config { use_pareto_loss_weight: false }\n"
            'eval_config { evaluator_type: "latest" eval_online: false }\n'
            "data_config { sample_mask_prob: 0 min_batch_size: 0 }\n"
            "export_config { export_format: TORCHSCRIPT }")
    assert unused_field_problems(example_with(text)) == []
    assert unused_field_problems(load_pipeline_config(EXAMPLE)) == []


def test_ignored_fields_are_noted():
    assert ignored_field_notes(load_pipeline_config(EXAMPLE)) == []  # fg_mode: FG_DAG
    notes = ignored_field_notes(example_with(
        'train_config { is_profiling: true tensorboard_summaries: "loss" }\n'
        'data_config { fg_mode: FG_NONE fg_threads: 4 fg_encoded_multival_sep: "," }'))
    # encoded input (FG_NONE) reads its separator
    assert notes == ["train_config.is_profiling", "train_config.tensorboard_summaries",
                     "data_config.fg_threads"]
    notes = ignored_field_notes(example_with('export_config { mixed_precision: "BF16" }'))
    assert notes == ["export_config.mixed_precision"]  # the export runs in float32


def test_train_metrics_are_no_longer_refused():
    config = example_with(
        "model_config { train_metrics { auc {} decay_rate: 0.9 decay_step: 100 } }")
    assert config.model_config.train_metrics[0].decay_step == 100
    assert unused_field_problems(config) == []
    towers = example_with("model_config { mmoe { task_towers { tower_name: 'ctr' "
                          "label_name: 'clk' train_metrics { auc {} } } } }")
    assert unused_field_problems(towers) == []
    assert ignored_field_notes(towers) == []


def test_rocket_launchings_l2_regularization_is_noted():
    # TorchEasyRec parses it and reads it nowhere
    text = ("model_config { rocket_launching { booster_mlp { hidden_units: [8] } "
            "light_mlp { hidden_units: [4] } %s } }")
    assert ignored_field_notes(example_with(text % "")) == []
    assert ignored_field_notes(example_with(text % "l2_regularization: 0.01")) == [
        "model_config.rocket_launching.l2_regularization"]


def test_an_hstu_encoders_unapplied_fields_are_noted():
    # TorchEasyRec's HSTU encoder reads them and applies neither (no attention dropout; no
    # timestamps for the time buckets' bias): such a config trains the same model here
    text = ('model_config { feature_groups { group_name: "g" feature_names: ["s__i"] '
            'sequence_groups { feature_names: ["s__i"] } sequence_encoders { hstu_encoder { '
            'attn_dim: 8 linear_dim: 8 max_seq_length: 5 %s } } } }')
    config = example_with(text % "attn_dropout_rate: 0.1 time_bucket_size: 64")
    assert unused_field_problems(config) == []
    group = len(config.model_config.feature_groups) - 1
    where = f"model_config.feature_groups[{group}].sequence_encoders[0].hstu_encoder"
    assert ignored_field_notes(config) == [f"{where}.attn_dropout_rate",
                                           f"{where}.time_bucket_size"]
    assert ignored_field_notes(example_with(text % "attn_dropout_rate: 0")) == []


def test_decay_of_an_evaluation_metric_is_noted():
    notes = ignored_field_notes(example_with(
        "model_config { metrics { auc {} step_decay_rate: 0.5 } }\n"
        "train_config { save_checkpoints_timestamp_quorum: 1.0 }"))
    metric = len(load_pipeline_config(EXAMPLE).model_config.metrics)
    assert notes == ["train_config.save_checkpoints_timestamp_quorum",
                     f"model_config.metrics[{metric}].step_decay_rate"]


def test_settings_of_torcheasyrecs_planner_and_odps_reader_are_noted():
    notes = ignored_field_notes(example_with(
        'train_config { global_embedding_constraints { sharding_types: "row_wise" } }\n'
        'feature_configs { id_feature { feature_name: "f" embedding_constraints { '
        'compute_kernels: "fused" } } }\n'
        'data_config { is_orderby_partition: true odps_data_quota_name: "q" in_order: false '
        'odps_data_compression: "ZSTD" force_base_data_group: true }\n'
        "export_config { cudnn_allow_tf32: false cuda_matmul_allow_tf32: true }\n"
        "model_config { kernel: TRITON }"))
    assert notes == [
        "train_config.global_embedding_constraints",
        "data_config.is_orderby_partition", "data_config.odps_data_quota_name",
        "data_config.odps_data_compression", "data_config.in_order",
        "data_config.force_base_data_group", "export_config.cudnn_allow_tf32",
        "export_config.cuda_matmul_allow_tf32", "model_config.kernel",
        f"embedding_constraints of feature 'f' (feature_configs[{_last_feature()}])"]


def _last_feature() -> int:
    return len(load_pipeline_config(EXAMPLE).feature_configs)


def test_the_fields_of_the_other_input_mode_are_noted():
    # raw input (FG_DAG) reads neither the encoded input's separator nor its defaults
    notes = ignored_field_notes(example_with(
        'data_config { fg_encoded_multival_sep: "," }\n'
        'feature_configs { id_feature { feature_name: "i" expression: "item:i" embedding_dim: 4 '
        'num_buckets: 8 fg_encoded_default_value: "0" } }'))
    assert notes == ["data_config.fg_encoded_multival_sep (the input is raw)",
                     "fg_encoded_default_value of feature 'i' (feature_configs[17]) (the "
                     "input is raw)"]
    assert unused_field_problems(example_with(
        'feature_configs { id_feature { feature_name: "i" fg_encoded_default_value: "0" } }'
        "\ndata_config { fg_mode: FG_NONE }")) == []


@pytest.mark.parametrize("mode, note", [
    ("FG_NONE", "default_value of feature 'i' (feature_configs[17]) (the input is encoded: "
                "fg_encoded_default_value fills its missing cells)"),
    ("FG_BUCKETIZE", "fg_encoded_default_value of feature 'i' (feature_configs[17]) "
                     "(FG_BUCKETIZE fills missing cells with default_value)"),
], ids=["none", "bucketize"])
def test_the_default_an_encoded_input_does_not_read_is_noted(mode, note):
    # FG_NONE fills a missing cell with fg_encoded_default_value, FG_BUCKETIZE with
    # default_value: the other one changes nothing
    notes = ignored_field_notes(example_with(
        f'data_config {{ fg_mode: {mode} }}\n'
        'feature_configs { id_feature { feature_name: "i" expression: "item:i" embedding_dim: 4 '
        'num_buckets: 8 default_value: "1" fg_encoded_default_value: "0" } }'))
    assert notes == [note]


@pytest.mark.parametrize("text, said, what", [
    ("data_config { fg_mode: FG_NONE }", "fg_mode is FG_NONE", "as the generation bucketized"),
    ("data_config { fg_mode: FG_BUCKETIZE }", "fg_mode is FG_BUCKETIZE", "bucketized here"),
    ("data_config { fg_encoded: true }", "fg_encoded is true", "as the generation bucketized"),
    ("data_config { fg_mode: FG_NORMAL }", None, None),
    ("data_config { fg_encoded: false }", None, None),
    # fg_encoded decides where set, as in TorchEasyRec
    ("data_config { fg_mode: FG_DAG fg_encoded: true }", "fg_encoded is true",
     "as the generation bucketized"),
    ("data_config { fg_mode: FG_NONE fg_encoded: false }", None, None),
], ids=["none", "bucketize", "encoded", "normal", "not-encoded", "dag-encoded", "none-raw"])
def test_encoded_input_is_said_how_it_is_read(text, said, what):
    config = example_with(text)
    config.data_config.ClearField("fg_mode")
    note = fg_mode_note(text_format.Merge(text, config))
    if said is None:
        assert note is None
    else:
        assert said in note and what in note
        assert "reads the column named as the feature" in note
        assert "a sequence's items split on its sequence_delim" in note
        default = "default_value" if "bucketized here" in what else "fg_encoded_default_value"
        assert f"missing cells as {default}" in note
    assert fg_mode_note(load_pipeline_config(EXAMPLE)) is None


def test_a_shuffle_buffer_without_shuffle_is_noted():
    assert ignored_field_notes(example_with("data_config { shuffle_buffer_size: 64 }")) == [
        "data_config.shuffle_buffer_size (shuffle is false)"]
    shuffled = example_with("data_config { shuffle: true shuffle_buffer_size: 64 }")
    assert ignored_field_notes(shuffled) == []


def test_tf32_switches_are_not_noted_as_ignored():
    # The trainer applies them on a GPU (hashrec.train.precision.apply_tf32).
    config = example_with("train_config { cudnn_allow_tf32: false "
                          "cuda_matmul_allow_tf32: true }")
    assert ignored_field_notes(config) == []


def test_fields_of_feature_generation_are_noted():
    config = example_with(
        'feature_configs { id_feature { feature_name: "i" expression: "item:i" embedding_dim: 4 '
        'num_buckets: 8 value_dim: 1 fg_value_type: "int64" stub_type: true } }\n'
        'feature_configs { combo_feature { feature_name: "c" expression: ["user:a", "item:b"] '
        'embedding_dim: 4 hash_bucket_size: 8 value_dim: 1 } }\n'
        'feature_configs { raw_feature { feature_name: "r" expression: "item:r" value_dim: 3 '
        'stub_type: true } }\n'
        'feature_configs { sequence_id_feature { feature_name: "q" expression: "user:q" '
        'embedding_dim: 4 num_buckets: 8 stub_type: true value_dim: 1 } }\n'
        'feature_configs { sequence_feature { sequence_name: "s" sequence_length: 5 '
        'sequence_delim: ";" sequence_pk: "user:clk_seq" features { id_feature { '
        'feature_name: "b" expression: "item:b" embedding_dim: 4 num_buckets: 8 '
        'value_dim: 1 } } } }\n'
        "train_config { sparse_optimizer { rowwise_adagrad_optimizer { lr: 0.1 "
        "weight_decay_mode: DECOUPLE } } }")
    first = len(load_pipeline_config(EXAMPLE).feature_configs)
    notes = ignored_field_notes(config)
    assert notes == [
        "train_config.sparse_optimizer.rowwise_adagrad_optimizer.weight_decay_mode",
        f"feature_configs[{first + 4}].sequence_feature.sequence_pk",
        f"value_dim of feature 'i' (feature_configs[{first}])",
        f"fg_value_type of feature 'i' (feature_configs[{first}])",
        f"stub_type of feature 'i' (feature_configs[{first}])",
        f"value_dim of feature 'c' (feature_configs[{first + 1}])",
        f"stub_type of feature 'r' (feature_configs[{first + 2}])",  # its value_dim is read
        f"stub_type of feature 'q' (feature_configs[{first + 3}])"]  # sequences read value_dim
    assert unused_field_problems(config) == []


def test_embedding_fields_of_a_raw_feature_without_boundaries_are_noted():
    # a raw feature has an embedding only with boundaries: without, these set nothing
    fields = 'embedding_dim: 8 embedding_name: "e" pooling: "mean" trainable: false'
    config = example_with(
        f'feature_configs {{ raw_feature {{ feature_name: "r" expression: "item:r" {fields} }} }}'
        f'\nfeature_configs {{ raw_feature {{ feature_name: "b" expression: "item:b" '
        f'boundaries: [1, 2] {fields} }} }}\n'
        'feature_configs { raw_feature { feature_name: "d" expression: "item:d" '
        'pooling: "sum" trainable: true } }')
    first = len(load_pipeline_config(EXAMPLE).feature_configs)
    assert ignored_field_notes(config) == [
        f"{name} of feature 'r' (feature_configs[{first}]) (no boundaries, so no embedding)"
        for name in ("embedding_dim", "embedding_name", "pooling", "trainable")]


def test_feature_generation_fields_at_their_defaults_are_not_noted():
    assert ignored_field_notes(example_with(
        'feature_configs { id_feature { feature_name: "i" expression: "item:i" embedding_dim: 4 '
        'num_buckets: 8 value_dim: 0 stub_type: false } }\n'
        "train_config { sparse_optimizer { rowwise_adagrad_optimizer { lr: 0.1 "
        "weight_decay_mode: NONE } } }")) == []


@pytest.mark.parametrize("text, phrase", [
    ("train_config { is_profiling: true }", "is_profiling (it changes nothing"),
    ("train_config { is_profiling: true }\ndata_config { fg_threads: 2 }",
     "fg_threads (they change nothing"),
], ids=["one", "two"])
def test_the_commands_log_ignored_fields_and_encoded_input(tmp_path, caplog, text, phrase):
    import argparse
    import logging

    from hashrec.train.cli import load_effective_config

    path = tmp_path / "pipeline.config"
    config = example_with(text + "\ndata_config { fg_mode: FG_NONE }")
    path.write_text(text_format.MessageToString(config))
    args = argparse.Namespace(pipeline_config_path=str(path), edit_config_json=None)
    with caplog.at_level(logging.INFO, logger="hashrec"):
        load_effective_config(args, {})
    assert phrase in caplog.text and "fg_mode is FG_NONE" in caplog.text


def test_torcheasyrec_fields_hashrec_runs_or_notes_pass_validation():
    from hashrec.config import validate_pipeline_config

    config = example_with("""
train_config { dense_optimizer {
  cosine_annealing_learning_rate { T_max: 1000 warmup_size: 10 }
  param_optimizers { adam_optimizer { lr: 0.01 } regex_pattern: "towers.*"
    param_learning_rate { linear_decay_learning_rate { total_size: 100 } } }
  part_optimizers { adam_optimizer { lr: 0.02 } regex_pattern: "final.*" } }
  global_embedding_constraints { sharding_types: "row_wise" } }
model_config { use_pareto_loss_weight: false kernel: PYTORCH }
""")
    validate_pipeline_config(config)
    dense = config.train_config.dense_optimizer
    assert dense.WhichOneof("learning_rate") == "cosine_annealing_learning_rate"
    assert [p.regex_pattern for p in dense.param_optimizers] == ["towers.*"]
