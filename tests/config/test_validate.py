"""Known-but-unsupported kinds are rejected with names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hashrec.config import (
    ConfigError,
    apply_edit_config_json,
    load_pipeline_config,
    parse_pipeline_config,
    validate_pipeline_config,
)
from hashrec.features.feature_set import build_feature_set
from hashrec.models import create_model

TAOBAO_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_dynamicemb_taobao.config"
WUKONG_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_wukong_criteo.config"
PEPNET_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_pepnet_taobao.config"
ROCKET_CONFIG = (Path(__file__).parent / "testdata"
                 / "torcheasyrec_rocket_launching_criteo.config")


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
     "model_config sets no model; supported models: dat, dbmtl, dc2vr, dcn_v1, dcn_v2, deepfm, "
     "dlrm, dlrm_hstu, "
     "dssm, dssm_v2, hstu_match, mask_net, match_backbone, mind, mmoe, multi_task_backbone, "
     "multi_tower, "
     "multi_tower_din, "
     "pepnet, ple, rank_backbone, rocket_launching, "
     "simple_multi_task, tdm, wide_and_deep, wukong, xdeepfm$"),
    ("model_config { tdm { multiwindow_din { windows_len: [1] attn_mlp {} } final {} } }",
     r"model_config.tdm trains on the \(user, tree node\) rows of data_config.tdm_sampler"),
    ("data_config { dataset_type: ParquetDataset tdm_sampler { item_input_path: 'n' "
     "edge_input_path: 'e' predict_edge_input_path: 'p' item_id_field: 'i' } } "
     "model_config { multi_tower_din {} }",
     r"data_config.tdm_sampler makes a TDM's rows; model_config.multi_tower_din does not"),
    ("train_config { sparse_optimizer { lamb_optimizer { lr: 1 } } dense_optimizer { "
     "adam_optimizer { lr: 1 } } }", "lamb_optimizer is not supported"),
    ("data_config { dataset_type: KafkaDataset }", "KafkaDataset is not supported"),
    ("model_config { multi_tower_din {} losses {} }",
     r"model_config.losses\[0\] sets no loss; set one of binary_cross_entropy, "
     r"binary_focal_loss, softmax_cross_entropy, jrc_loss, l2_loss"),
    ("model_config { multi_tower_din {} metrics { auc {} } metrics { recall_at_k {} } }",
     r"model_config.metrics\[1\].recall_at_k is not supported here: it is a metric of "
     r"match \(retrieval\) models \(dssm, dssm_v2, mind, dat, match_backbone, hstu_match\), "
     r".* for a ranking model use auc"),
    ("model_config { dssm { user_tower { input: 'u' mlp {} } item_tower { input: 'i' mlp {} } "
     "output_dim: 4 } metrics { auc {} } }",
     r"model_config.metrics\[0\].auc is not supported for a match model; use recall_at_k"),
    ("model_config { dssm { user_tower { input: 'u' mlp {} } item_tower { input: 'i' mlp {} } "
     "output_dim: 4 } losses { binary_cross_entropy {} } }",
     r"model_config.losses lists binary_cross_entropy; a match model trains on one "
     r"softmax_cross_entropy"),
    ("model_config { dssm { user_tower { input: 'u' mlp {} } item_tower { input: 'i' mlp {} } "
     "output_dim: 4 } metrics { recall_at_k { top_k: 0 } } }",
     r"model_config.metrics\[0\].recall_at_k.top_k=0; allowed: 1 or more"),
    ("model_config { mmoe { expert_mlp { hidden_units: [4] } num_expert: 2 "
     "task_towers { tower_name: 'ctr' label_name: 'clk' metrics { recall_at_k {} } } } }",
     r"mmoe.task_towers\[0\].metrics\[0\].recall_at_k is not supported here: it is a metric of "
     r"match"),
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
], ids=["no-model", "tdm-without-sampler", "tdm-sampler-without-tdm", "sparse-optimizer",
        "dataset", "empty-loss", "recall-at-k",
        "dssm-auc", "dssm-bce", "dssm-recall-top-k-0",
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


# Model configs as TorchEasyRec's examples write them (pepnet_taobao,
# rocket_launching_criteo).
_GROUP = 'feature_groups { group_name: "all" feature_names: "u" group_type: DEEP }'
_TOWER = ('task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [8] } '
          'metrics { auc {} } losses { binary_cross_entropy {} } }')


def _model_config(model: str):
    return parse_pipeline_config(f'model_dir: "m"\nmodel_config {{ {_GROUP} {model} }}')


def test_pepnet_with_named_groups_passes_validation():
    validate_pipeline_config(_model_config(
        f'pepnet {{ main_group_name: "all" domain_group_name: "domain" epnet_hidden_unit: 128, '
        f'uia_group_name: "uia" ppnet_hidden_units: [512, 256] ppnet_dropout_ratio: [0.1, 0.1] '
        f'{_TOWER} }}'))


def test_pepnet_towers_per_domain_as_torcheasyrec_writes_them_pass_and_build():
    # TorchEasyRec's PEPNet documentation: domain_input_name names the domain feature,
    # whose column is a label field too; task_domain_num towers per task
    text = PEPNET_CONFIG.read_text(encoding="utf-8")
    text = text.replace('label_fields: "buy"', 'label_fields: "buy"\n    label_fields: '
                        '"occupation"')
    text = text.replace("pepnet {", "pepnet {\n        domain_input_name: 'occupation'\n"
                        "        task_domain_num: 3")
    config = apply_edit_config_json(parse_pipeline_config(text),
                                    {"data_config.dataset_type": "ParquetDataset"})
    assert config.model_config.pepnet.domain_input_name == "occupation"
    assert config.model_config.pepnet.task_domain_num == 3
    validate_pipeline_config(config)
    # the domain column is the occupation feature's input and a label (not refused as a
    # label read by a feature: it picks a tower, it is no target)
    features = build_feature_set(config)
    assert features.domain_label == ("occupation", 3)
    assert "occupation" in features.features and "occupation" in features.label_fields
    model = create_model(config.model_config, features, None, embedding=torch.nn.Identity())
    assert (model.domain_input, model.domains) == ("occupation", 3)
    assert [t.name for t in model.tasks] == ["ctr", "cvr"]
    assert [t.name for t in model.output_tasks] == ["ctr_0", "ctr_1", "ctr_2", "cvr_0",
                                                    "cvr_1", "cvr_2"]
    assert len(model.net.tasks["cvr"].tower.towers) == 3


def test_rocket_launching_inner_product_distillation_is_refused():
    text = ('rocket_launching { booster_mlp { hidden_units: [256, 128] } light_mlp { '
            'hidden_units: [96, 64] } feature_based_distillation: true %s } '
            'losses { binary_cross_entropy {} }')
    validate_pipeline_config(_model_config(text % ""))
    validate_pipeline_config(_model_config(
        text.replace("feature_based_distillation: true", "") % "feature_distillation_function: "
        "INNER_PRODUCT"))
    with pytest.raises(ConfigError) as err:
        validate_pipeline_config(_model_config(
            text % "feature_distillation_function: INNER_PRODUCT"))
    assert str(err.value).splitlines()[1:] == [
        "  model_config.rocket_launching.feature_distillation_function INNER_PRODUCT is not "
        "supported (TorchEasyRec computes the Euclidean distance for it, not an inner "
        "product); set EUCLID for that distance, or COSINE"]


def test_torcheasyrecs_rocket_launching_example_passes_validation_and_builds():
    # rocket_launching_criteo reads ODPS, the one thing HashRec refuses in it
    config = load_pipeline_config(ROCKET_CONFIG)
    with pytest.raises(ConfigError, match="data_config.dataset_type OdpsDataset"):
        validate_pipeline_config(config)
    config = apply_edit_config_json(config, {"data_config.dataset_type": "ParquetDataset"})
    validate_pipeline_config(config)
    model = create_model(config.model_config, build_feature_set(config), None,
                         embedding=torch.nn.Identity())
    # light 96, 64, 32 pair with the booster's 64 and 32; 96 has no booster layer
    assert model.similarity_pairs == [(1, 2), (2, 3)]
    assert model.eval_losses == ("binary_cross_entropy_light",)
    assert model.net.light.first_weight().shape == (96, 13 + 26 * 16)


def test_torcheasyrecs_pepnet_example_passes_validation_and_builds():
    # pepnet_taobao reads ODPS, the one thing HashRec refuses in it
    config = load_pipeline_config(PEPNET_CONFIG)
    with pytest.raises(ConfigError, match="data_config.dataset_type OdpsDataset"):
        validate_pipeline_config(config)
    config = apply_edit_config_json(config, {"data_config.dataset_type": "ParquetDataset"})
    validate_pipeline_config(config)
    # the model over the features' widths (an identity stands for the tables: no rows)
    model = create_model(config.model_config, build_feature_set(config), None,
                         embedding=torch.nn.Identity())
    assert [g.name for g in model.input_groups] == ["all", "domain", "uia"]
    assert [t.name for t in model.tasks] == ["ctr", "cvr"]
    assert model.tasks[1].task_space_label == "clk"
    # 16 features of 16 columns; EPNet's gate 16 + 256 -> 128 -> 256
    assert model.net.epnet.gate.hidden.weight.shape == (128, 16 + 256)
    assert [layer.linear.out_features for layer in model.net.tasks["cvr"].ppnet.layers] \
        == [512, 256]


def test_torcheasyrecs_wukong_example_passes_validation():
    # wukong_criteo reads ODPS, the one thing HashRec refuses in it (before, the model too)
    config = load_pipeline_config(WUKONG_CONFIG)
    with pytest.raises(ConfigError) as err:
        validate_pipeline_config(config)
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "data_config.dataset_type OdpsDataset is not supported; use ParquetDataset or "
        "CsvDataset (and local paths)"]
    validate_pipeline_config(
        apply_edit_config_json(config, {"data_config.dataset_type": "ParquetDataset"}))
    assert len(config.model_config.wukong.wukong_layers) == 2


_DLRM = ('model_config { feature_groups { group_name: "sparse" feature_names: "u" '
         'group_type: DEEP } dlrm { %s arch_with_sparse: true } }')


def test_dlrm_takes_the_names_torcheasyrecs_example_writes():
    # dlrm_criteo: bot_mlp and top_mlp, second names of dense_mlp and final
    validate_pipeline_config(parse_pipeline_config(
        'model_dir: "m"\n' + _DLRM % "bot_mlp { hidden_units: 16 } top_mlp { hidden_units: 32 }"))
    validate_pipeline_config(parse_pipeline_config(
        'model_dir: "m"\n' + _DLRM % "dense_mlp { hidden_units: 16 } final { hidden_units: 32 }"))


@pytest.mark.parametrize("fields, message", [
    ("dense_mlp { hidden_units: 4 } bot_mlp { hidden_units: 4 } final { hidden_units: 8 }",
     "model_config.dlrm sets both dense_mlp and bot_mlp, which is a second name of "
     r"dense_mlp \(TorchEasyRec's examples write it\); keep one"),
    ("final { hidden_units: 8 } top_mlp { hidden_units: 8 }",
     "model_config.dlrm sets both final and top_mlp"),
    ("dense_mlp { hidden_units: 4 }",
     r"model_config.dlrm.final \(or its second name top_mlp\) is not set; set it"),
], ids=["both-dense", "both-final", "no-final"])
def test_dlrm_refuses_a_name_with_its_second_name(fields, message):
    config = parse_pipeline_config('model_dir: "m"\n' + _DLRM % fields)
    with pytest.raises(ConfigError, match=message):
        validate_pipeline_config(config)


@pytest.mark.parametrize("feature, message", [
    ('raw_feature { feature_name: "p" expression: "item:p" '
     'normalizer: "method=expression,expr=lg(x+3)" }',
     r"feature 'p': normalizer 'method=expression,expr=lg\(x\+3\)': expression 'lg\(x\+3\)': "
     r"unknown function 'lg'"),
    ('raw_feature { feature_name: "p" expression: "item:p" normalizer: "method=zscore,mean=1" }',
     r"feature 'p': normalizer 'method=zscore,mean=1': zscore needs \['standard_deviation'\]"),
    ('raw_feature { feature_name: "p" expression: "item:p" normalizer: "method=box_cox" }',
     "feature 'p': normalizer 'method=box_cox': method must be one of"),
    ('raw_feature { feature_name: "p" expression: "item:p" '
     'normalizer: "method=minmax,min=1,max=1" }', r"feature 'p': .*bad max \(must be > min\)"),
    ('sequence_raw_feature { feature_name: "sp" expression: "user:sp" sequence_length: 3 '
     'normalizer: "method=expression,expr=x**2" }',
     r"feature 'sp': .*expression 'x\*\*2': unexpected '\*\*'"),
    ('sequence_feature { sequence_name: "s" sequence_length: 3 sequence_delim: ";" features { '
     'raw_feature { feature_name: "t" expression: "item:t" '
     'normalizer: "method=expression,expr=rnd()" } } }',
     "feature 's__t': .*function 'rnd' .* is not supported in a normalizer"),
], ids=["unknown-function", "zscore-missing", "method", "minmax", "sequence-raw",
        "sequence-sub-feature"])
def test_normalizer_problems_are_found_by_validation(feature, message):
    """Before a run reads any data, not only when the features are built."""
    config = parse_pipeline_config(f'model_dir: "m"\nfeature_configs {{ {feature} }}')
    with pytest.raises(ConfigError, match=f"does not support:\n  {message}"):
        validate_pipeline_config(config)


def test_every_bad_normalizer_is_listed_and_good_ones_pass():
    good = ('feature_configs { raw_feature { feature_name: "a" expression: "item:a" '
            'normalizer: "method=expression,expr=log(x+3)" } }\n'
            'feature_configs { raw_feature { feature_name: "b" expression: "item:b" '
            'normalizer: "method=log10,threshold=1e-10,default=0" } }\n')
    validate_pipeline_config(parse_pipeline_config(f'model_dir: "m"\n{good}'))
    bad = ('feature_configs { raw_feature { feature_name: "c" expression: "item:c" '
           'normalizer: "method=expression,expr=y" } }\n'
           'feature_configs { raw_feature { feature_name: "d" expression: "item:d" '
           'normalizer: "method=zscore" } }\n')
    with pytest.raises(ConfigError) as err:
        validate_pipeline_config(parse_pipeline_config(f'model_dir: "m"\n{good}{bad}'))
    assert [line.split(":")[0] for line in str(err.value).splitlines()[1:]] == [
        "  feature 'c'", "  feature 'd'"]


def test_train_eval_stops_at_a_bad_normalizer_before_reading_data(tmp_path, caplog):
    import logging

    from hashrec.train_eval import main

    config = tmp_path / "p.config"
    config.write_text(
        f'model_dir: "{tmp_path}/m"\ntrain_input_path: "{tmp_path}/missing.parquet"\n'
        f'eval_input_path: "{tmp_path}/missing.parquet"\n'
        'train_config { sparse_optimizer { sgd_optimizer { lr: 0.1 } '
        'constant_learning_rate {} } dense_optimizer { adam_optimizer { lr: 0.01 } '
        'constant_learning_rate {} } }\n'
        'data_config { batch_size: 8 dataset_type: ParquetDataset label_fields: "y" }\n'
        'feature_configs { raw_feature { feature_name: "p" expression: "item:p" '
        'normalizer: "method=expression,expr=log(x+3" } }\n'
        'model_config { feature_groups { group_name: "g" feature_names: "p" '
        'group_type: DEEP } multi_tower { towers { input: "g" mlp { hidden_units: [4] } } } '
        'losses { binary_cross_entropy {} } }\n', encoding="utf-8")
    with caplog.at_level(logging.ERROR):
        assert main(["--pipeline_config_path", str(config)]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "missing.parquet" not in errors[0]
    assert "feature 'p': normalizer 'method=expression,expr=log(x+3': expression " \
           "'log(x+3': it ends early: expected ')'" in errors[0]
    assert not (tmp_path / "m").exists()
