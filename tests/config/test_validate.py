"""Known-but-unsupported kinds are rejected with names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hashrec.config import (
    ConfigError,
    apply_edit_config_json,
    load_pipeline_config,
    parse_pipeline_config,
    validate_pipeline_config,
)

TAOBAO_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_dynamicemb_taobao.config"


def test_taobao_config_needs_a_supported_dataset():
    config = load_pipeline_config(TAOBAO_CONFIG)
    with pytest.raises(ConfigError, match="OdpsDataset is not supported"):
        validate_pipeline_config(config)
    validate_pipeline_config(
        apply_edit_config_json(config, {"data_config.dataset_type": "ParquetDataset"}))


@pytest.mark.parametrize("feature, message", [
    ('lookup_feature { feature_name: "lk" map: "item:m" key: "user:k" }', "'lk'.*lookup_feature"),
    ('match_feature { feature_name: "mt" nested_map: "a" pkey: "b" skey: "c" }',
     "'mt'.*match_feature"),
    ('expr_feature { feature_name: "ex" expression: "a+b" }', "'ex'.*expr_feature"),
    ('custom_feature { feature_name: "cu" operator_name: "op" }', "'cu'.*custom_feature"),
    ('sequence_feature { sequence_name: "s" sequence_length: 3 sequence_delim: ";" features { '
     'combo_feature { feature_name: "c" expression: ["a", "b"] } } }',
     "s__c.*combo_feature is not supported"),
], ids=["lookup", "match", "expr", "custom", "sequence-combo"])
def test_unsupported_features(feature, message):
    config = parse_pipeline_config(f'model_dir: "m"\nfeature_configs {{ {feature} }}')
    with pytest.raises(ConfigError, match=message + ".*"):
        validate_pipeline_config(config)


def test_generated_kinds_are_accepted_for_encoded_input_only():
    text = ('model_dir: "m"\nfeature_configs { lookup_feature { feature_name: "lk" '
            'map: "item:m" key: "user:k" } }\n')
    for mode in ("FG_NONE", "FG_BUCKETIZE"):
        validate_pipeline_config(parse_pipeline_config(
            f"{text}data_config {{ dataset_type: ParquetDataset fg_mode: {mode} }}"))
    with pytest.raises(ConfigError, match="'lk'.*computed by a feature generation.*FG_NONE"):
        validate_pipeline_config(parse_pipeline_config(
            f"{text}data_config {{ dataset_type: ParquetDataset fg_mode: FG_DAG }}"))
    tokenize = ('model_dir: "m"\ndata_config { dataset_type: ParquetDataset fg_mode: FG_NONE }'
                '\nfeature_configs { tokenize_feature { feature_name: "tk" expression: "a" } }')
    with pytest.raises(ConfigError, match="'tk'.*tokenize_feature is not supported.*under "
                                          "fg_mode FG_NONE.*lookup_feature"):
        validate_pipeline_config(parse_pipeline_config(tokenize))


@pytest.mark.parametrize("text, message", [
    ("model_config { losses { binary_cross_entropy {} } }",
     "model_config sets no model; supported models: dbmtl, dcn_v1, dcn_v2, deepfm, dlrm, "
     "mask_net, mmoe, multi_tower, multi_tower_din, ple, simple_multi_task, wide_and_deep, "
     "xdeepfm$"),
    ("train_config { sparse_optimizer { lamb_optimizer { lr: 1 } } dense_optimizer { "
     "adam_optimizer { lr: 1 } } }", "lamb_optimizer is not supported"),
    ("data_config { dataset_type: KafkaDataset }", "KafkaDataset is not supported"),
    ("model_config { multi_tower_din {} losses {} }",
     r"model_config.losses\[0\] sets no loss; set one of binary_cross_entropy, "
     r"binary_focal_loss, softmax_cross_entropy, jrc_loss, l2_loss"),
    ("model_config { multi_tower_din {} metrics { auc {} } metrics { recall_at_k {} } }",
     r"model_config.metrics\[1\].recall_at_k is not supported: it is a metric of "
     r"TorchEasyRec's match \(retrieval\) models, .* HashRec has ranking models only"),
    ("model_config { mmoe { expert_mlp { hidden_units: [4] } num_expert: 2 "
     "task_towers { tower_name: 'ctr' label_name: 'clk' metrics { recall_at_k {} } } } }",
     r"mmoe.task_towers\[0\].metrics\[0\].recall_at_k is not supported: it is a metric of "
     r"TorchEasyRec's match"),
    ("model_config { simple_multi_task { task_towers { tower_name: 'ctr' label_name: 'clk' "
     "losses { } } } }", r"simple_multi_task.task_towers\[0\].losses\[0\] sets no loss"),
    ("model_config { multi_tower_din {} metrics { multiclass_auc { average: 'micro' } } }",
     r"model_config.metrics\[0\].multiclass_auc.average='micro'; allowed: macro, weighted"),
    ("model_config { multi_tower_din {} metrics { multiclass_auc { thresholds: 1 } } }",
     r"model_config.metrics\[0\].multiclass_auc.thresholds=1; allowed: 2 or more"),
    ("model_config { multi_tower_din {} metrics {} }",
     r"model_config.metrics\[0\] sets no metric; set one of auc, "),
    ("model_config { multi_tower_din {} metrics { accuracy { top_k: 0 } } }",
     r"model_config.metrics\[0\].accuracy.top_k=0; allowed: 1 or more"),
    ("model_config { multi_tower_din {} metrics { auc { thresholds: 1 } } }",
     r"model_config.metrics\[0\].auc.thresholds=1; allowed: 2 or more \(default 200\)"),
    ("model_config { multi_tower_din {} metrics { xauc { sample_ratio: 0 } } }",
     r"model_config.metrics\[0\].xauc.sample_ratio=0; allowed: above 0, at most 1"),
    ("model_config { multi_tower_din {} metrics { grouped_xauc { grouping_key: 'u' "
     "max_pairs_per_group: 0 } } }",
     r"model_config.metrics\[0\].grouped_xauc.max_pairs_per_group=0; allowed: 1 or more"),
    ('feature_configs { raw_feature { feature_name: "price" expression: "item:price" '
     'embedding_dim: 8 autodis { num_channels: 3 temperature: 0.1 keep_prob: 0.8 } } }',
     r"feature 'price': the autodis embedding of a raw value is not supported .*boundaries"),
    ('feature_configs { raw_feature { feature_name: "price" expression: "item:price" '
     'embedding_dim: 8 mlp {} } }',
     r"feature 'price': the mlp embedding of a raw value is not supported"),
], ids=["no-model", "sparse-optimizer", "dataset", "empty-loss", "recall-at-k",
        "task-recall-at-k", "simple-multi-task-empty-loss", "multiclass-auc-average",
        "multiclass-auc-thresholds", "empty-metric", "accuracy-top-k-0", "auc-thresholds",
        "xauc-sample-ratio", "grouped-xauc-pairs", "autodis", "mlp-embedding"])
def test_unsupported_fields(text, message):
    config = parse_pipeline_config(f'model_dir: "m"\n{text}')
    with pytest.raises(ConfigError, match=message):
        validate_pipeline_config(config)


def test_the_losses_and_metrics_listed_are_those_built():
    from hashrec.config import validate
    from hashrec.models.losses import LOSSES
    from hashrec.train.metrics import SUPPORTED_METRICS as BUILT

    assert validate.SUPPORTED_LOSSES == LOSSES
    assert validate.SUPPORTED_METRICS == BUILT


@pytest.mark.parametrize("loss", ["binary_focal_loss { gamma: 1 alpha: 0.25 }",
                                  "softmax_cross_entropy { label_smoothing: 0.1 }",
                                  "jrc_loss { session_name: 'u' alpha: 0.3 }"])
def test_torcheasyrec_losses_are_accepted(loss):
    config = parse_pipeline_config(f'model_dir: "m"\nmodel_config {{ multi_tower_din {{}} '
                                   f'losses {{ {loss} }} metrics {{ accuracy {{ top_k: 3 }} }} '
                                   f'metrics {{ multiclass_auc {{ average: "weighted" }} }} }}')
    validate_pipeline_config(config)


def test_accuracy_top_k_of_one_is_accepted():
    config = parse_pipeline_config('model_dir: "m"\nmodel_config { multi_tower_din {} '
                                   'metrics { accuracy { threshold: 0.4 top_k: 1 } } }')
    validate_pipeline_config(config)



def test_zero_batch_size_is_rejected_naming_the_field():
    config = apply_edit_config_json(load_pipeline_config(TAOBAO_CONFIG),
                                    {"data_config.dataset_type": "ParquetDataset"})
    validate_pipeline_config(config)
    zero = apply_edit_config_json(config, {"data_config.batch_size": 0})
    with pytest.raises(ConfigError, match=r"data_config.batch_size is 0; allowed: 1 or more"):
        validate_pipeline_config(zero)
