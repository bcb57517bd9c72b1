"""--edit_config_json overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from hashrec.config import ConfigError, apply_edit_config_json, data_pb2, load_pipeline_config

TAOBAO_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_dynamicemb_taobao.config"


@pytest.fixture(scope="module")
def config():
    return load_pipeline_config(TAOBAO_CONFIG)


def test_brief_example(config):
    edited = apply_edit_config_json(config, '{"feature_configs[0].id_feature.embedding_dim": "8",'
                                            ' "train_config.num_steps": 5,'
                                            ' "data_config.batch_size": 64}')
    assert edited.feature_configs[0].id_feature.embedding_dim == 8
    assert edited.train_config.num_steps == 5
    assert edited.data_config.batch_size == 64
    assert config.data_config.batch_size == 8192  # the input is not mutated


def test_enum_float_bool_string(config):
    edited = apply_edit_config_json(config, {
        "data_config.dataset_type": "ParquetDataset",
        "feature_configs[-1].sequence_feature.sequence_length": 10,
        "train_config.sparse_optimizer.adagrad_optimizer.lr": "0.5",
        "data_config.shuffle": "true",
        "model_dir": "elsewhere",
    })
    assert edited.data_config.dataset_type == data_pb2.ParquetDataset
    assert edited.feature_configs[-1].sequence_feature.sequence_length == 10
    assert edited.train_config.sparse_optimizer.adagrad_optimizer.lr == pytest.approx(0.5)
    assert edited.data_config.shuffle is True
    assert edited.model_dir == "elsewhere"


def test_selectors(config):
    edited = apply_edit_config_json(config, {
        "feature_configs[feature_name=cms_segid].id_feature.num_buckets": 200,
        "feature_configs[:].id_feature.embedding_dim": 4,
        "model_config.feature_groups[group_name=seq].feature_names": "a,b",
    })
    dims = {fc.id_feature.embedding_dim for fc in edited.feature_configs if fc.HasField("id_feature")}
    assert dims == {4}
    assert edited.feature_configs[6].id_feature.num_buckets == 200
    assert list(edited.model_config.feature_groups[1].feature_names) == ["a", "b"]


def test_wildcard_keeps_each_elements_oneof_member(config):
    edited = apply_edit_config_json(
        config, {"feature_configs[:].sequence_feature.sequence_length": 20})
    kinds = [fc.WhichOneof("feature") for fc in edited.feature_configs]
    assert kinds == [fc.WhichOneof("feature") for fc in config.feature_configs]
    assert edited.feature_configs[-1].sequence_feature.sequence_length == 20
    with pytest.raises(ConfigError, match="no selected element"):
        apply_edit_config_json(config, {"feature_configs[:].combo_feature.embedding_dim": 4})


def test_an_index_into_another_oneof_member_warns_of_what_it_replaces(config, caplog):
    import logging

    kind = config.feature_configs[0].WhichOneof("feature")
    assert kind == "id_feature"
    with caplog.at_level(logging.WARNING, logger="hashrec.config"):
        edited = apply_edit_config_json(
            config, {"feature_configs[0].raw_feature.embedding_dim": 8,
                     "feature_configs[0].raw_feature.boundaries": [1, 2]})
    assert edited.feature_configs[0].WhichOneof("feature") == "raw_feature"
    name = config.feature_configs[0].id_feature.feature_name
    assert [r.getMessage() for r in caplog.records] == [
        "edit_config_json path 'feature_configs[0].raw_feature.embedding_dim': sets "
        "raw_feature of FeatureConfig, which replaces its id_feature (one oneof 'feature' "
        f"holds either); the replaced id_feature had feature_name {name!r}"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hashrec.config"):
        apply_edit_config_json(config, {"feature_configs[0].id_feature.embedding_dim": 8,
                                        "train_config.sparse_optimizer.adagrad_optimizer.lr": 1})
    assert caplog.records == []


def test_message_and_list_values(config):
    edited = apply_edit_config_json(config, {
        "model_config.multi_tower_din.final": {"hidden_units": [8, 4]},
        "feature_configs[-2].raw_feature.boundaries": [1, 2, 3],
    })
    assert list(edited.model_config.multi_tower_din.final.hidden_units) == [8, 4]
    assert list(edited.feature_configs[-2].raw_feature.boundaries) == [1, 2, 3]


@pytest.mark.parametrize("edit, message", [
    ('{"data_config.bach_size": 1}', "has no field 'bach_size'"),
    ('{"feature_configs[99].id_feature.embedding_dim": 1}', "out of range"),
    ('{"feature_configs.id_feature.embedding_dim": 1}', "is repeated"),
    ('{"data_config.batch_size": "lots"}', "cannot set 'batch_size'"),
    ('{"data_config.batch_size": 1.5}', "cannot set 'batch_size'"),
    ('{"data_config.dataset_type": "HiveDataset"}', "one of"),
    ('{"data_config.shuffle": "maybe"}', "cannot set 'shuffle'"),
    ('{"feature_configs[feature_name=nope].id_feature.embedding_dim": 1}', "no element"),
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
], ids=["unknown-field", "index-range", "repeated-no-index", "int-text", "int-fraction",
        "enum-name", "bool-text", "selector-miss", "bad-json", "not-object"])
def test_errors(config, edit, message):
    with pytest.raises(ConfigError, match=message):
        apply_edit_config_json(config, edit)


@pytest.mark.parametrize("edit, message", [
    ({"train_config.num_steps": -1},
     r"'train_config.num_steps': -1 is out of range .*uint32 integer from 0 to 4294967295"),
    ({"data_config.batch_size": -5}, r"'data_config.batch_size': -5 is out of range"),
    ({"data_config.batch_size": 99999999999999},
     r"'data_config.batch_size': 99999999999999 is out of range .*0 to 4294967295"),
    ({"feature_configs[0].id_feature.dynamicemb.max_capacity": -1},
     r"'feature_configs\[0\].id_feature.dynamicemb.max_capacity': -1 is out of range "
     r".*uint64 integer"),
    ({"model_config.multi_tower_din.final.hidden_units": [8, -4]},
     r"'model_config.multi_tower_din.final.hidden_units': -4 is out of range"),
    ({"model_config.multi_tower_din.final.hidden_units[0]": "-4"}, r"'-4' is out of range"),
    ({"train_config.sparse_optimizer.adagrad_optimizer.lr": 1e300},
     r"1e\+300 is out of range for 'lr'; allowed: a float"),
], ids=["uint32-negative", "batch-negative", "uint32-too-large", "uint64-negative",
        "repeated-negative", "element-negative", "float32-overflow"])
def test_out_of_range_numbers_name_path_value_and_range(config, edit, message):
    with pytest.raises(ConfigError, match=message):
        apply_edit_config_json(config, edit)


@pytest.mark.parametrize("path, kind", [
    ("data_config.batch_size", "uint32 integer"),
    ("train_config.sparse_optimizer.adagrad_optimizer.lr", "a float"),
    ("data_config.dataset_type", r"one of \["),
], ids=["int", "float", "enum"])
def test_a_boolean_does_not_set_a_number(config, path, kind):
    with pytest.raises(ConfigError, match=rf"'{path}': .* is not a boolean field; give .*"
                                          rf"{kind}.*not true"):
        apply_edit_config_json(config, {path: True})
    edited = apply_edit_config_json(config, {"data_config.shuffle": True,
                                             "data_config.drop_remainder": False})
    assert edited.data_config.shuffle is True and edited.data_config.drop_remainder is False
