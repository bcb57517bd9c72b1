"""Loading, strict parsing and saving of pipeline configs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hashrec.config import (
    ConfigError,
    data_pb2,
    load_pipeline_config,
    parse_pipeline_config,
    save_pipeline_config,
)

TAOBAO_CONFIG = Path(__file__).parent / "testdata" / "torcheasyrec_dynamicemb_taobao.config"
EXAMPLES = Path(__file__).parents[2] / "examples"


def test_taobao_config_parses_verbatim(caplog):
    with caplog.at_level(logging.WARNING):
        config = load_pipeline_config(TAOBAO_CONFIG)
    user_id = config.feature_configs[0].id_feature
    assert user_id.dynamicemb.score_strategy == "LFU"
    assert user_id.dynamicemb.initializer_args.mode == "NORMAL"
    assert user_id.dynamicemb.initializer_args.std_dev == pytest.approx(0.05)
    assert user_id.dynamicemb.frequency_admission_strategy.threshold == 3
    assert user_id.dynamicemb.init_capacity_per_rank == 1024
    assert len(config.feature_configs) == 17
    seq = config.feature_configs[-1].sequence_feature
    assert (seq.sequence_name, seq.sequence_length, seq.sequence_delim) == (
        "click_50_seq", 100, "|")
    assert config.model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units == [256, 64]
    # adjacent string literals are joined by the text format, then split back into names
    deep = config.model_config.feature_groups[0].feature_names
    assert list(deep[:3]) == ["user_id", "cms_segid", "cms_group_id"]
    assert len(deep) == 16
    assert "adjacent strings" in caplog.text


@pytest.mark.parametrize("name, features", [("multi_tower_din_taobao.config", 16),
                                            ("multi_tower_din_taobao_dynamicemb.config", 16),
                                            ("wide_and_deep_taobao_dynamicemb.config", 16),
                                            ("dlrm_criteo_dynamicemb.config", 13),
                                            ("mmoe_taobao_dynamicemb.config", 16),
                                            ("dssm_taobao_dynamicemb.config", 10),
                                            ("mind_taobao_dynamicemb.config", 10),
                                            ("dat_taobao_dynamicemb.config", 10),
                                            ("match_backbone_taobao_dynamicemb.config", 10),
                                            ("hstu_match_taobao_dynamicemb.config", 10),
                                            ("dlrm_hstu_kuairand_dynamicemb.config", 6),
                                            ("dcn_backbone_taobao_dynamicemb.config", 16)])
def test_examples_parse(name, features):
    config = load_pipeline_config(EXAMPLES / name)
    assert config.data_config.dataset_type == data_pb2.ParquetDataset
    assert len(config.model_config.feature_groups[0].feature_names) == features


def test_every_example_is_tested():
    tested = {"multi_tower_din_taobao.config", "multi_tower_din_taobao_dynamicemb.config",
              "wide_and_deep_taobao_dynamicemb.config", "dlrm_criteo_dynamicemb.config",
              "mmoe_taobao_dynamicemb.config", "dssm_taobao_dynamicemb.config",
              "mind_taobao_dynamicemb.config", "dcn_backbone_taobao_dynamicemb.config",
              "dat_taobao_dynamicemb.config", "match_backbone_taobao_dynamicemb.config",
              "hstu_match_taobao_dynamicemb.config", "dlrm_hstu_kuairand_dynamicemb.config"}
    assert {p.name for p in EXAMPLES.glob("*.config")} == tested


def test_wide_and_deep_example_builds_its_wide_tables():
    from hashrec.train.session import build_session

    config = load_pipeline_config(EXAMPLES / "wide_and_deep_taobao_dynamicemb.config")
    session = build_session(config, device=torch.device("cpu"))
    tables = {t.name: t for t in session.feature_set.embedding_tables()}
    assert len(tables) == 2 * 16
    assert tables["user_id_wide"].is_dynamic and tables["user_id_wide"].dim == 4
    assert tables["price_wide"].num_rows == tables["price"].num_rows


def test_unknown_field_names_line_and_field(tmp_path):
    path = tmp_path / "bad.config"
    path.write_text('model_dir: "m"\ndata_config {\n  batch_size: 4\n  bach_size: 5\n}\n')
    with pytest.raises(ConfigError, match=r"bad.config:4: .*bach_size"):
        load_pipeline_config(path)


@pytest.mark.parametrize("line,error", [
    ("  lable_fields: \"clk\"", 'Message type "hashrec.protos.DataConfig" has no field named '
                                 '"lable_fields". Did you mean "label_fields"?'),
    ("  dataset_type: ParquetDatset", "'  dataset_type: ParquetDatset': Enum type "
                                      '"hashrec.protos.DatasetType" has no value named '
                                      'ParquetDatset. Did you mean "ParquetDataset"?'),
    ("  zzz: 1", 'Message type "hashrec.protos.DataConfig" has no field named "zzz".'),
], ids=["field", "enum-value", "nothing-close"])
def test_a_misspelt_name_suggests_the_closest(tmp_path, caplog, line, error):
    import logging

    from hashrec import train_eval

    path = tmp_path / "bad.config"
    path.write_text(f'model_dir: "m"\ndata_config {{\n  batch_size: 4\n{line}\n}}\n')
    with caplog.at_level(logging.ERROR):
        assert train_eval.main(["--pipeline_config_path", str(path)]) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"ConfigError: {path}:4: {error}"]


@pytest.mark.parametrize("model, kind", [
    ("ultra_hstu { }", "generative ranking model"),
])
def test_a_torcheasyrec_model_that_does_not_parse_says_it_is_not_implemented(model, kind):
    with pytest.raises(ConfigError) as err:
        parse_pipeline_config(f'model_dir: "m"\nmodel_config {{\n  {model}\n}}')
    name = model.split()[0]
    assert str(err.value) == (
        f'<string>:3: Message type "hashrec.protos.ModelConfig" has no field named "{name}". '
        f"It is TorchEasyRec's {kind} {name}, which HashRec does not implement; HashRec's "
        f"models: dat, dbmtl, dc2vr, dcn_v1, dcn_v2, deepfm, dlrm, dlrm_hstu, dssm, dssm_v2, "
        f"hstu_match, "
        f"mask_net, "
        f"match_backbone, mind, mmoe, multi_task_backbone, multi_tower, multi_tower_din, pepnet, ple, "
        f"rank_backbone, rocket_launching, simple_multi_task, tdm, wide_and_deep, wukong, "
        f"xdeepfm")


def test_the_older_backbone_schema_says_how_to_write_it_as_rank_backbone():
    # TorchEasyRec's top-level multi_tower_din_taobao_rankbackbone example: string inputs,
    # input_layer naming a class; TorchEasyRec's ModelConfig has no backbone field either
    with pytest.raises(ConfigError) as err:
        parse_pipeline_config('model_dir: "m"\nmodel_config {\n  backbone { blocks { '
                              'name: "a" inputs: "user" input_layer: "MLP" } }\n}')
    message = str(err.value)
    assert message.startswith('<string>:3: Message type "hashrec.protos.ModelConfig" has no '
                              'field named "backbone". It is the older schema')
    for part in ("does not accept either", "rank_backbone { backbone { blocks {",
                 "inputs { feature_group_name:", "in place of input_layer: 'MLP'"):
        assert part in message


_TOWER = 'tower_name: "ctr" label_name: "clk"'


@pytest.mark.parametrize("towers, kept", [
    (f"model_params {{ task_towers {{ {_TOWER} }} }}", 1),
    (f"model_params {{ task_towers {{ {_TOWER} }} }} task_towers {{ {_TOWER} }}", 1),
], ids=["model-params", "both-alike"])
def test_backbone_task_towers_are_read_from_model_params(towers, kept):
    # TorchEasyRec's multi_task_backbone lists its towers in model_params; HashRec reads
    # every multi-task model's task_towers
    config = parse_pipeline_config(
        f'model_dir: "m"\nmodel_config {{ multi_task_backbone {{ backbone {{ }} {towers} }} }}')
    model = config.model_config.multi_task_backbone
    assert [t.tower_name for t in model.task_towers] == ["ctr"] * kept
    assert not model.HasField("model_params")


def test_backbone_task_towers_set_twice_differently_are_refused():
    towers = (f"model_params {{ task_towers {{ {_TOWER} }} }} "
              'task_towers { tower_name: "cvr" label_name: "buy" }')
    with pytest.raises(ConfigError, match="task_towers and model_params.task_towers "
                                          "differently; keep one of the two"):
        parse_pipeline_config(
            f'model_dir: "m"\nmodel_config {{ multi_task_backbone {{ backbone {{ }} {towers} }} }}')


def test_bad_value_names_line():
    with pytest.raises(ConfigError, match=r"<string>:2: .*batch_size"):
        parse_pipeline_config('model_dir: "m"\ndata_config { batch_size: "many" }')


def test_evict_strategy_as_dynamicembs_enum_number_parses():
    # dynamicemb's proto types evict_strategy as an int; the number is kept as its text
    feature = ('feature_configs {{ id_feature {{ feature_name: "{0}" expression: "user:{0}"\n'
               '  embedding_dim: 4 dynamicemb {{ max_capacity: 10 evict_strategy: {1} }} }} }}\n')
    text = 'model_dir: "m"\n' + feature.format("u", "1") + feature.format("v", '"LRU"')
    config = parse_pipeline_config(text)
    evicts = [fc.id_feature.dynamicemb.evict_strategy for fc in config.feature_configs]
    assert evicts == ["1", "LRU"]
    # the lines after it keep their numbers in errors
    with pytest.raises(ConfigError, match=r"<string>:7: .*batch_size"):
        parse_pipeline_config(text + 'data_config {\n batch_size: "many" }')


def test_missing_required_field():
    with pytest.raises(ConfigError, match="model_dir"):
        parse_pipeline_config("data_config { batch_size: 4 }")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_pipeline_config(tmp_path / "nope.config")


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path):
    path = tmp_path / "latin1.config"
    path.write_bytes('model_dir: "m"\n# caf\xe9\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^cannot read pipeline config {path}: not UTF-8 "
                                          rf"text \(byte 0xe9 at offset 20\)"):
        load_pipeline_config(path)


def test_save_round_trip(tmp_path):
    config = load_pipeline_config(TAOBAO_CONFIG)
    save_pipeline_config(config, tmp_path / "sub" / "saved.config")
    assert load_pipeline_config(tmp_path / "sub" / "saved.config") == config


def test_save_under_a_file_names_the_path(tmp_path):
    (tmp_path / "model").write_text("a file where a folder is needed")
    with pytest.raises(ConfigError, match=r"cannot write pipeline config .*model/pipeline"
                                          r"\.config: .*check that its folder is a directory"):
        save_pipeline_config(load_pipeline_config(TAOBAO_CONFIG),
                             tmp_path / "model" / "pipeline.config")


def test_a_failed_save_keeps_the_file_that_was_there_whole(tmp_path, monkeypatch):
    """A full disk midway: the old config stays, no staging file is left, and the error
    says the disk is full (it said to check the folder's permissions)."""
    import errno
    import os

    path = tmp_path / "pipeline.config"
    path.write_text("the old config")
    real_fsync = os.fsync

    def full(fd):
        real_fsync(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ConfigError, match=r"cannot write pipeline config .*pipeline\.config: "
                                          r"No space left on device; free space on its disk$"):
        save_pipeline_config(load_pipeline_config(TAOBAO_CONFIG), path)
    assert path.read_text() == "the old config"
    assert os.listdir(tmp_path) == ["pipeline.config"]


def test_real_concatenation_is_kept_when_it_is_no_split():
    config = parse_pipeline_config(
        'model_dir: "m"\n'
        'feature_configs { raw_feature { feature_name: "ab" expression: "user:ab" } }\n'
        'feature_configs { raw_feature { feature_name: "a" expression: "user:a" } }\n'
        'feature_configs { raw_feature { feature_name: "b" expression: "user:b" } }\n'
        'model_config { feature_groups { group_name: "g" feature_names: "a" "b" '
        'group_type: DEEP } }')
    assert list(config.model_config.feature_groups[0].feature_names) == ["ab"]


# Defaults of fields whose TorchEasyRec defaults a config relies on when it leaves them out.
_TORCHEASYREC_DEFAULTS = [
    ("eval_config.log_step_count_steps", 10),
    ("eval_config.num_steps", 0),
    ("train_config.log_step_count_steps", 100),
    ("train_config.save_checkpoints_steps", 1000),
    ("train_config.keep_checkpoint_max", 0),
    ("train_config.use_tensorboard", True),
    ("data_config.batch_size", 1024),
    ("data_config.num_workers", 8),
    ("data_config.drop_remainder", False),
    ("data_config.shuffle", False),
    ("data_config.shuffle_buffer_size", 32),
    ("train_config.dense_optimizer.sgd_optimizer.momentum", pytest.approx(0.9)),
    ("train_config.dense_optimizer.adam_optimizer.beta2", pytest.approx(0.999)),
    ("train_config.dense_optimizer.adamw_optimizer.weight_decay", 0.0),
    ("train_config.dense_optimizer.exponential_decay_learning_rate.decay_factor",
     pytest.approx(0.95)),
    ("train_config.dense_optimizer.exponential_decay_learning_rate.staircase", True),
]


@pytest.mark.parametrize("path,expected", _TORCHEASYREC_DEFAULTS,
                         ids=[path for path, _ in _TORCHEASYREC_DEFAULTS])
def test_defaults_are_torcheasyrecs(path, expected):
    from hashrec.config.pipeline_pb2 import EasyRecConfig

    value = EasyRecConfig()
    for name in path.split("."):
        value = getattr(value, name)
    assert value == expected


def test_a_field_of_a_nested_message_says_where_it_belongs():
    """TorchEasyRec's configs once wrote MaskNet's settings straight under mask_net, where
    they now go in its mask_net_module: the error says so."""
    with pytest.raises(ConfigError) as err:
        parse_pipeline_config('model_dir: "m"\nmodel_config {\n  mask_net {\n'
                              '    n_mask_blocks: 3\n  }\n}')
    assert str(err.value) == (
        '<string>:4: Message type "hashrec.protos.MaskNet" has no field named '
        '"n_mask_blocks". It belongs inside mask_net_module: write mask_net_module { '
        'n_mask_blocks: ... }')
