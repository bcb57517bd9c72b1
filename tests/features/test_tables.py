"""Tables: embedding_name sharing, dynamic options from DynamicEmbedding, fusion groups."""

from __future__ import annotations

import pytest

from hashrec.config import ConfigError
from hashrec.table.options import InitializerMode, ScoreStrategy


def _id(name: str, options: str) -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{name}" '
            f'{options} }} }}\n')


def test_embedding_name_shares_a_dense_table(feature_set):
    fs = feature_set(_id("a", 'embedding_dim: 4 num_buckets: 9 embedding_name: "t"')
                     + _id("b", 'embedding_dim: 4 num_buckets: 9 embedding_name: "t"'))
    (table,) = fs.embedding_tables()
    assert (table.name, table.num_rows, table.features) == ("t", 9, ("a", "b"))
    assert [f.table for f in fs.embedding_features()] == ["t", "t"]


def test_an_embedding_name_of_a_features_own_table_in_torcheasyrec_shares_it(feature_set):
    # TorchEasyRec names feature a's own table "a_emb": b names it and shares it
    fs = feature_set(_id("a", "embedding_dim: 4 num_buckets: 9")
                     + _id("b", 'embedding_dim: 4 num_buckets: 9 embedding_name: "a_emb"')
                     + _id("c", 'embedding_dim: 4 num_buckets: 9 embedding_name: "x_emb"'))
    assert [(t.name, t.features) for t in fs.embedding_tables()] == [("a", ("a", "b")),
                                                                      ("x_emb", ("c",))]


@pytest.mark.parametrize("b_options, message", [
    ('embedding_dim: 8 num_buckets: 9 embedding_name: "t"', "embedding_dim 4 and 8"),
    ('embedding_dim: 4 num_buckets: 3 embedding_name: "t"', "9 and 3 rows"),
    ('embedding_dim: 4 dynamicemb { max_capacity: 5 } embedding_name: "t"', "dense table"),
], ids=["dim", "rows", "dense-vs-dynamic"])
def test_inconsistent_sharing(feature_set, b_options, message):
    with pytest.raises(ConfigError, match=message):
        feature_set(_id("a", 'embedding_dim: 4 num_buckets: 9 embedding_name: "t"')
                    + _id("b", b_options))


def test_dynamic_options_from_dynamicemb(feature_set):
    fs = feature_set(_id("u", """embedding_dim: 8 dynamicemb {
        max_capacity: 4096 init_capacity_per_rank: 1024 bucket_capacity: 64
        cache_load_factor: 0.5 caching: true score_strategy: "LFU"
        initializer_args { mode: "NORMAL"; std_dev: 0.05 }
        eval_initializer_args { mode: "CONSTANT" value: 0.25 }
        frequency_admission_strategy { threshold: 3 counter_capacity: 512
            initializer_args { mode: "UNIFORM" lower: -0.1 upper: 0.1 } } }"""))
    opts = fs.embedding_tables()[0].dynamic
    assert (opts.dim, opts.max_capacity, opts.init_capacity, opts.bucket_capacity) == (8, 4096,
                                                                                     1024, 64)
    assert opts.score_strategy == ScoreStrategy.LFU
    assert (opts.cache_load_factor, opts.caching) == (0.5, True)
    assert opts.initializer.mode == InitializerMode.NORMAL
    assert opts.initializer.std_dev == pytest.approx(0.05)
    assert opts.eval_initializer.value == pytest.approx(0.25)
    assert opts.admission.threshold == 3 and opts.admission.counter_capacity == 512
    assert opts.admission.initializer.mode == InitializerMode.UNIFORM
    assert opts.optimizer is None


def test_dynamic_defaults(feature_set):
    fs = feature_set(_id("u", "embedding_dim: 8 dynamicemb { max_capacity: 100 }"))
    opts = fs.embedding_tables()[0].dynamic
    assert opts.initializer.mode == InitializerMode.UNIFORM
    assert opts.eval_initializer.mode == InitializerMode.CONSTANT
    assert opts.score_strategy == ScoreStrategy.STEP
    assert opts.admission is None and opts.init_capacity is None and opts.cache_load_factor == 1.0


def test_bad_dynamic_option_names_table(feature_set):
    with pytest.raises(ConfigError, match="table 'u'.*score_strategy"):
        feature_set(_id("u", 'embedding_dim: 8 dynamicemb { max_capacity: 10 '
                             'score_strategy: "OLDEST" }'))


def test_fusion_group_is_the_single_deep_group_else_the_sequence_group(feature_set):
    """A table's DEEP group decides; a table read in SEQUENCE groups only fuses there."""
    dyn = "embedding_dim: 4 dynamicemb { max_capacity: 10 }"
    model = ('model_config { feature_groups { group_name: "deep" feature_names: ["a", "b", "c"] '
             'group_type: DEEP } feature_groups { group_name: "deep2" feature_names: ["c"] '
             'group_type: DEEP } feature_groups { group_name: "seq" feature_names: ["a", "e", '
             '"f"] group_type: SEQUENCE } feature_groups { group_name: "seq2" feature_names: '
             '["g", "f"] group_type: SEQUENCE } }')
    fs = feature_set("".join(_id(name, dyn) for name in "abcdefg")
                     + _id("n", "embedding_dim: 4 num_buckets: 3"), model)
    groups = {t.name: t.fusion_group for t in fs.embedding_tables()}
    assert groups == {"a": "deep", "b": "deep", "c": None, "e": "seq", "f": None,
                      "g": "seq2"}
    assert fs.left_out == ("d", "n")  # in no group: no table at all


@pytest.mark.parametrize("options, strategy", [
    ('evict_strategy: "LFU"', ScoreStrategy.LFU),
    ('evict_strategy: "lru"', ScoreStrategy.STEP),
    ('evict_strategy: "LRU" score_strategy: "TIMESTAMP"', ScoreStrategy.TIMESTAMP),
    ('evict_strategy: "LFU" score_strategy: "LFU"', ScoreStrategy.LFU),
    ('evict_strategy: "EPOCH_LRU"', ScoreStrategy.STEP),
    # dynamicemb's proto stores the strategy as its enum number: 0 LRU, 1 LFU, 2 EPOCH_LRU
    ("evict_strategy: 0", ScoreStrategy.STEP),
    ("evict_strategy: 1", ScoreStrategy.LFU),
    ('evict_strategy:2 score_strategy: "TIMESTAMP"', ScoreStrategy.TIMESTAMP),
], ids=["lfu", "lru", "lru-timestamp", "both-lfu", "epoch-lru", "number-lru", "number-lfu",
        "number-epoch-lru"])
def test_evict_strategy_sets_the_scores(feature_set, options, strategy):
    fs = feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {options} }}"))
    assert fs.embedding_tables()[0].dynamic.score_strategy == strategy


@pytest.mark.parametrize("options, message", [
    ('evict_strategy: "LFU" score_strategy: "STEP"', "evict_strategy LFU and score_strategy "
     "STEP disagree"),
    ('evict_strategy: "LRU" score_strategy: "LFU"', "LRU eviction takes score_strategy STEP or "
     "TIMESTAMP"),
    ('evict_strategy: "EPOCH_LFU"', "evict_strategy 'EPOCH_LFU' is not supported"),
    ("evict_strategy: 3", r"evict_strategy '3' \(EPOCH_LFU\) is not supported; allowed: "
     r"LRU, EPOCH_LRU, LFU \(dynamicemb's numbers 0, 2, 1;"),
    ("evict_strategy: 9", "evict_strategy '9' is not supported"),
    ('evict_strategy: 1 score_strategy: "STEP"', "evict_strategy LFU and score_strategy "
     "STEP disagree"),
    ('score_strategy: "lru"', "score_strategy 'lru' is not supported; allowed: STEP, "
     r"TIMESTAMP, LFU, NO_EVICTION \(LRU is an evict_strategy, which picks score_strategy "
     'STEP or TIMESTAMP: set evict_strategy: "LRU" instead\\)'),
    ('score_strategy: "SIZE"', r"score_strategy 'SIZE' is not supported; allowed: STEP, "
     "TIMESTAMP, LFU, NO_EVICTION$"),
], ids=["lfu-step", "lru-lfu", "epoch", "number-epoch-lfu", "number-unknown", "number-lfu-step",
        "score-lru", "score-unknown"])
def test_evict_strategy_errors(feature_set, options, message):
    with pytest.raises(ConfigError, match=f"table 'u'.*{message}") as info:
        feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {options} }}"))
    assert str(info.value).count("table 'u'") == 1


@pytest.mark.parametrize("options, field, allowed", [
    ('score_strategy: "CUSTOMIZED"', "score_strategy", "STEP, TIMESTAMP, LFU, NO_EVICTION"),
    ('score_strategy: "customized"', "score_strategy", "STEP, TIMESTAMP, LFU, NO_EVICTION"),
    ('evict_strategy: "CUSTOMIZED"', "evict_strategy", "LRU, EPOCH_LRU, LFU"),
    ('evict_strategy: "CUSTOMIZED" score_strategy: "CUSTOMIZED"', "score_strategy",
     "STEP, TIMESTAMP, LFU, NO_EVICTION"),
], ids=["score", "score-lower-case", "evict", "both"])
def test_customized_scores_are_refused_in_configs(feature_set, options, field, allowed):
    # A config cannot pass the per-lookup scores CUSTOMIZED needs (the Python API can).
    with pytest.raises(ConfigError) as info:
        feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {options} }}"))
    message = str(info.value)
    assert message.startswith(f"table 'u': dynamicemb.{field} CUSTOMIZED is not available in "
                              f"a config")
    assert f"allowed: {allowed}" in message and "hashrec.table" in message


def test_errors_of_a_shared_table_name_its_features(feature_set):
    dyn = 'embedding_dim: 8 embedding_name: "t" dynamicemb { max_capacity: 100 ' \
          'score_strategy: "CUSTOMIZED" }'
    with pytest.raises(ConfigError, match=r"^table 't' \(features 'a', 'b'\): dynamicemb\."
                                          r"score_strategy CUSTOMIZED"):
        feature_set(_id("a", dyn) + _id("b", dyn))


@pytest.mark.parametrize("block", [
    "initializer_args", "eval_initializer_args",
    "frequency_admission_strategy.initializer_args",
], ids=["initializer", "eval", "admission"])
@pytest.mark.parametrize("args, message", [
    ('mode: "XAVIER"', "mode='XAVIER' is not valid; allowed: NORMAL, TRUNCATED_NORMAL"),
    ('mode: "UNIFORM" upper: -0.5', "lower=-0.1 > upper=-0.5, where lower=-0.1 is the default"),
    ("std_dev: -1", "std_dev=-1.0 is not valid"),
    ('mode: "TRUNCATED_NORMAL" lower: 0.5 upper: 0.5',
     "lower=0.5 is not valid; allowed: lower < upper (0.5) for TRUNCATED_NORMAL"),
], ids=["mode", "crossed-bound", "std-dev", "truncated-bounds"])
def test_initializer_errors_name_the_block(feature_set, block, args, message):
    nested = f"{block.replace('.', ' { threshold: 2 ')} {{ {args} }}" + (
        " }" if "." in block else "")
    with pytest.raises(ConfigError) as info:
        feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {nested} }}"))
    assert str(info.value).startswith(f"table 'u': dynamicemb.{block}: {message}")


@pytest.mark.parametrize("options, message", [
    ("max_capacity: 0", "dynamicemb.max_capacity=0 is not valid; allowed: an int >= 1"),
    ("max_capacity: 10 bucket_capacity: 0", "dynamicemb: bucket_capacity=0 is not valid"),
    ("max_capacity: 10 cache_load_factor: 1.5", "dynamicemb: cache_load_factor=1.5 is not "
     "valid; allowed: (0, 1]"),
], ids=["max-zero", "bucket", "cache-load-factor"])
def test_capacity_errors_use_the_config_names(feature_set, options, message):
    with pytest.raises(ConfigError) as info:
        feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ {options} }}"))
    assert str(info.value).startswith(f"table 'u': {message}")


def test_init_capacity_above_max_capacity_starts_at_max_capacity(feature_set, caplog):
    # A small table given the init_capacity_per_rank of the large ones (dynamicemb clamps).
    with caplog.at_level("INFO", logger="hashrec.features"):
        fs = feature_set(_id("u", "embedding_dim: 8 dynamicemb { max_capacity: 500 "
                                  "init_capacity_per_rank: 1024 }"))
    opts = fs.embedding_tables()[0].dynamic
    assert (opts.max_capacity, opts.init_capacity) == (500, 500)
    assert "init_capacity_per_rank=1024 is above max_capacity (500)" in caplog.text


def test_init_capacity_zero_reads_as_unset(feature_set, caplog):
    # TorchEasyRec passes a zero init_capacity_per_rank on as no initial capacity
    with caplog.at_level("INFO", logger="hashrec.features"):
        fs = feature_set(_id("u", "embedding_dim: 8 dynamicemb { max_capacity: 500 "
                                  "init_capacity_per_rank: 0 }"))
    assert fs.embedding_tables()[0].dynamic.init_capacity is None
    assert "init_capacity_per_rank=0 is read as unset" in caplog.text


@pytest.mark.parametrize("options, chosen", [
    ("", frozenset()),
    ("cache_load_factor: 1.0", {"cache_load_factor"}),
    ("caching: false", {"caching"}),
    ("cache_load_factor: 0.5 caching: true", {"cache_load_factor", "caching"}),
], ids=["none", "factor-one", "caching-false", "both"])
def test_storage_fields_the_config_sets_are_recorded(feature_set, options, chosen):
    fs = feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {options} }}"))
    assert fs.embedding_tables()[0].dynamic.set_by_user == chosen


@pytest.mark.parametrize("mode", ["NORMAL", "UNIFORM", "TRUNCATED_NORMAL"])
def test_a_random_eval_initializer_is_refused(feature_set, mode):
    # dynamicemb refuses it too: evaluation and export read a missing id as one value
    with pytest.raises(ConfigError, match=rf"^table 'u': dynamicemb\.eval_initializer_args\."
                                          rf"mode {mode} is not supported; allowed: CONSTANT"):
        feature_set(_id("u", f'embedding_dim: 8 dynamicemb {{ max_capacity: 100 '
                             f'eval_initializer_args {{ mode: "{mode}" }} }}'))


@pytest.mark.parametrize("block", [
    "initializer_args", "frequency_admission_strategy.initializer_args",
], ids=["initializer", "admission"])
@pytest.mark.parametrize("args, unread", [
    ('mode: "NORMAL" std_dev: 0.1 lower: -0.5 upper: 0.5', "lower, upper"),
    # bounds NORMAL does not read are not checked against each other or their defaults
    ('mode: "NORMAL" std_dev: 0.1 lower: 1.0', "lower"),
    ('mode: "CONSTANT" lower: 1.0 upper: 0.5', "lower, upper"),
    ('mode: "UNIFORM" mean: 1.0 std_dev: 0.1', "mean, std_dev"),
    ('mode: "CONSTANT" value: 0.5 std_dev: 0.1', "std_dev"),
    ('mode: "TRUNCATED_NORMAL" value: 0.5', "value"),
], ids=["normal-bounds", "normal-lower-past-default", "constant-crossed-bounds",
        "uniform-moments", "constant-std", "truncated-value"])
def test_initializer_fields_the_mode_does_not_read_are_named(feature_set, caplog, block, args,
                                                             unread):
    nested = f"{block.replace('.', ' { threshold: 2 ')} {{ {args} }}" + (
        " }" if "." in block else "")
    with caplog.at_level("WARNING", logger="hashrec.features"):
        feature_set(_id("u", f"embedding_dim: 8 dynamicemb {{ max_capacity: 100 {nested} }}"))
    assert f"table 'u': dynamicemb.{block}: mode " in caplog.text
    assert f"does not read {unread} (it reads" in caplog.text


def test_initializer_fields_the_mode_reads_draw_no_warning(feature_set, caplog):
    with caplog.at_level("WARNING", logger="hashrec.features"):
        feature_set(_id("u", 'embedding_dim: 8 dynamicemb { max_capacity: 100 '
                             'initializer_args { mode: "TRUNCATED_NORMAL" mean: 0.1 '
                             'std_dev: 0.1 lower: -0.2 upper: 0.3 } '
                             'eval_initializer_args { value: 0.5 } }'))
    assert "does not read" not in caplog.text


def test_a_debug_initializer_is_read_from_the_config(feature_set, caplog):
    with caplog.at_level("WARNING", logger="hashrec.features"):
        fs = feature_set(_id("u", 'embedding_dim: 8 dynamicemb { max_capacity: 100 '
                                  'initializer_args { mode: "DEBUG" std_dev: 0.1 } }'))
    assert fs.embedding_tables()[0].dynamic.initializer.mode == InitializerMode.DEBUG
    assert "mode DEBUG does not read std_dev (it reads none)" in caplog.text


def test_an_admission_threshold_of_zero_admits_as_one_does(feature_set):
    # dynamicemb admits a count >= threshold, so 0 (a uint64 of TorchEasyRec's) is accepted
    fs = feature_set(_id("u", "embedding_dim: 8 dynamicemb { max_capacity: 100 "
                              "frequency_admission_strategy { threshold: 0 } }"))
    assert fs.embedding_tables()[0].dynamic.admission.threshold == 0
