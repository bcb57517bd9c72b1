"""Reject configs that parse but ask for something HashRec does not run.

TorchEasyRec configs may name feature kinds, datasets, optimizers and models
that HashRec does not implement. They load (so tools can read them), and
:func:`validate_pipeline_config` turns them into one :class:`ConfigError`
naming every offending feature or field.
"""

from __future__ import annotations

from hashrec.config.aliases import alias_problems
from hashrec.config.dlrm_hstu import dlrm_hstu_problems
from hashrec.config.errors import ConfigError
from hashrec.config.fg_mode import RAW, fg_input, fg_input_setting
from hashrec.config.hstu_match import hstu_match_problems
from hashrec.config.match_params import match_params
from hashrec.config.normalizer import Normalizer
from hashrec.config.pipeline_pb2 import EasyRecConfig
from hashrec.config.sequence_groups import sequence_encoder_problems
from hashrec.config.unused import unused_field_problems

SUPPORTED_FEATURE_KINDS = ("id_feature", "raw_feature", "combo_feature", "sequence_feature",
                           "sequence_id_feature", "sequence_raw_feature")
SUPPORTED_SEQUENCE_SUB_KINDS = ("id_feature", "raw_feature")
# Kinds only a feature generation computes: read from encoded input, refused for raw input
# (hashrec.features.generated, which the config layer does not import, lists them too;
# tests/features/test_generated.py keeps the two equal).
GENERATED_KINDS = ("lookup_feature", "match_feature", "expr_feature", "overlap_feature",
                   "kv_dot_product", "bool_mask_feature", "combine_feature", "custom_feature")
SUPPORTED_DATASETS = ("ParquetDataset", "CsvDataset")
SUPPORTED_SPARSE_OPTIMIZERS = ("sgd_optimizer", "adagrad_optimizer", "adam_optimizer",
                               "rowwise_adagrad_optimizer")
# The models hashrec.models.registry builds (tests/models/test_registry.py keeps the two
# equal; the config layer must not import the models above it).
SUPPORTED_MODELS = ("dat", "dbmtl", "dc2vr", "dcn_v1", "dcn_v2", "deepfm", "dlrm",
                    "dlrm_hstu", "dssm", "dssm_v2", "hstu_match", "mask_net", "match_backbone",
                    "mind", "mmoe", "multi_task_backbone", "multi_tower", "multi_tower_din", "pepnet", "ple",
                    "rank_backbone", "rocket_launching", "simple_multi_task", "tdm",
                    "wide_and_deep", "wukong", "xdeepfm")
# The models whose config lists task_towers (hashrec.models.tasks.MULTI_TASK_MODELS;
# tests/models/test_registry.py keeps the two equal).
MULTI_TASK_MODELS = ("simple_multi_task", "mmoe", "dbmtl", "ple", "pepnet",
                     "multi_task_backbone", "dc2vr")
# The match (retrieval) models (hashrec.models.tasks.MATCH_MODELS; tests/models/
# test_registry.py keeps the two equal): softmax_cross_entropy and recall_at_k only.
MATCH_MODELS = ("dssm", "dssm_v2", "mind", "dat", "match_backbone", "hstu_match")
# The data_config samplers of a match model's negatives.
MATCH_SAMPLERS = ("negative_sampler", "negative_sampler_v2", "hard_negative_sampler",
                  "hard_negative_sampler_v2")
# The losses hashrec.models.losses computes (tests/config/test_validate.py keeps the two
# equal).
SUPPORTED_LOSSES = ("binary_cross_entropy", "binary_focal_loss", "softmax_cross_entropy",
                    "jrc_loss", "l2_loss")
# The metrics hashrec.train.metrics builds (tests/config/test_validate.py keeps the two
# equal).
SUPPORTED_METRICS = ("auc", "accuracy", "mean_squared_error", "mean_absolute_error",
                     "grouped_auc", "multiclass_auc", "xauc", "grouped_xauc")
# multiclass_auc's averages (TorchEasyRec documents these two).
MULTICLASS_AUC_AVERAGES = ("macro", "weighted")


def feature_problems(config: EasyRecConfig) -> list[str]:
    """One message per feature config whose kind (or an option of it) is not supported."""
    problems = []
    data_config = config.data_config if config.HasField("data_config") else None
    raw = fg_input(data_config) == RAW
    for i, fc in enumerate(config.feature_configs):
        kind = fc.WhichOneof("feature")
        if kind is None:
            problems.append(f"feature_configs[{i}] sets no feature kind")
            continue
        sub = getattr(fc, kind)
        if kind in GENERATED_KINDS and raw:
            problems.append(f"feature {sub.feature_name!r} (feature_configs[{i}]): {kind} is "
                            f"computed by a feature generation, which HashRec does not run "
                            f"for it; read the generation's output, whose column "
                            f"{sub.feature_name!r} holds it, with data_config.fg_mode "
                            f"FG_NONE (or FG_BUCKETIZE)")
            continue
        if kind not in SUPPORTED_FEATURE_KINDS and kind not in GENERATED_KINDS:
            problems.append(f"feature {sub.feature_name!r} (feature_configs[{i}]): {kind} is not "
                            f"supported; supported kinds: {', '.join(SUPPORTED_FEATURE_KINDS)}"
                            f", and under fg_mode FG_NONE or FG_BUCKETIZE "
                            f"{', '.join(GENERATED_KINDS)}")
            continue
        if kind == "sequence_feature":
            for j, seq_fc in enumerate(sub.features):
                seq_kind = seq_fc.WhichOneof("feature")
                name = getattr(seq_fc, seq_kind).feature_name if seq_kind else f"features[{j}]"
                if seq_kind not in SUPPORTED_SEQUENCE_SUB_KINDS:
                    problems.append(
                        f"feature {sub.sequence_name}__{name} (feature_configs[{i}]): sequence "
                        f"sub-feature kind {seq_kind} is not supported; supported: "
                        f"{', '.join(SUPPORTED_SEQUENCE_SUB_KINDS)}")
                else:
                    full = f"{sub.sequence_name}__{name}"
                    problems += _option_problems(full, getattr(seq_fc, seq_kind))
                    if raw:
                        problems += _expression_problems(
                            full, i, getattr(seq_fc, seq_kind), data_config)
        else:
            problems += _option_problems(sub.feature_name, sub)
            if raw:
                problems += _expression_problems(sub.feature_name, i, sub, data_config)
    return problems


def _expression_problems(name: str, index: int, sub, data_config) -> list[str]:
    """Raw input reads a feature from the column its expression names: a feature config
    without one (encoded input's configs leave it out) cannot be read."""
    if sub.DESCRIPTOR.name == "ComboFeature":  # expression is repeated there
        if len(sub.expression):
            return []
        example = "expression: [\"user:a\", \"item:b\"], the inputs crossed"
    elif sub.HasField("expression"):
        return []
    else:
        example = f"expression: \"user:{sub.feature_name}\""
    return [f"feature {name!r} (feature_configs[{index}]) sets no expression, which names "
            f"the input column that raw input ({fg_input_setting(data_config)}) reads it "
            f"from; add one, e.g. {example}, or read input a feature generation encoded, "
            f"which holds the feature in the column named after it, with data_config.fg_mode "
            f"FG_NONE"]


def _option_problems(name: str, sub) -> list[str]:
    fields = sub.DESCRIPTOR.fields_by_name
    problems = []
    if "vocab_file" in fields and sub.HasField("vocab_file"):
        problems.append(f"feature {name!r}: vocab_file is not supported; use vocab_list or "
                        f"vocab_dict")
    for dense_emb in ("autodis", "mlp"):
        if dense_emb in fields and sub.HasField(dense_emb):
            problems.append(f"feature {name!r}: the {dense_emb} embedding of a raw value is not "
                            f"supported (HashRec embeds a raw value through boundaries: "
                            f"bucketized into len(boundaries) + 1 ids of an embedding_dim "
                            f"table); remove {dense_emb}, and set boundaries to embed the "
                            f"value or leave them out to feed it to the towers as it is")
    if sub.DESCRIPTOR.name == "RawFeature" and sub.normalizer:
        try:  # checked here, before any data is read, not only when features are built
            Normalizer.parse(sub.normalizer, name)
        except ConfigError as err:
            problems.append(str(err))
    return problems


def pipeline_problems(config: EasyRecConfig) -> list[str]:
    """Everything :func:`validate_pipeline_config` would report, as messages."""
    problems = []
    if config.HasField("data_config"):
        problems += _data_problems(config.data_config)
    if config.HasField("train_config"):
        sparse = config.train_config.sparse_optimizer.WhichOneof("optimizer")
        if sparse is not None and sparse not in SUPPORTED_SPARSE_OPTIMIZERS:
            problems.append(f"train_config.sparse_optimizer.{sparse} is not supported; "
                            f"supported: {', '.join(SUPPORTED_SPARSE_OPTIMIZERS)}")
    problems += feature_problems(config)
    if config.HasField("model_config"):
        problems += _model_problems(config.model_config)
    return problems + _negative_problems(config) + unused_field_problems(config)


def _negative_problems(config: EasyRecConfig) -> list[str]:
    """A match model needs negatives (in-batch, or a sampler: negative_sampler,
    negative_sampler_v2, hard_negative_sampler or hard_negative_sampler_v2); a sampler
    feeds a match model's item tower only."""
    model = config.model_config.WhichOneof("model")
    sampler = config.data_config.WhichOneof("sampler")
    sampled = sampler in MATCH_SAMPLERS
    tree = config.data_config.HasField("tdm_sampler")
    if (model == "tdm") != tree and model is not None:
        return ["model_config.tdm trains on the (user, tree node) rows of "
                "data_config.tdm_sampler: set both, or neither" if model == "tdm" else
                f"data_config.tdm_sampler makes a TDM's rows; model_config.{model} does not "
                f"read them: remove it, or set model_config.tdm"]
    if model == "hstu_match" and not sampled:
        return [f"model_config.hstu_match has no negatives: set data_config.negative_sampler "
                f"(or another of {', '.join(MATCH_SAMPLERS[1:])}); as in TorchEasyRec, it "
                f"takes no in-batch negatives"]
    if model in MATCH_MODELS:
        if not sampled and not match_params(config.model_config).in_batch_negative:
            where = "model_params." if model == "match_backbone" else ""
            return [f"model_config.{model} has no negatives: set {where}in_batch_negative: true "
                    f"(the batch's other items) or data_config.negative_sampler (or another "
                    f"of {', '.join(MATCH_SAMPLERS[1:])})"]
    elif sampled and model is not None:
        return [f"data_config.{sampler} feeds a match model's item tower; "
                f"model_config.{model} does not read it: remove it"]
    return []


def _data_problems(data_config) -> list[str]:
    problems = []
    dataset = data_config.DESCRIPTOR.fields_by_name["dataset_type"].enum_type \
        .values_by_number[data_config.dataset_type].name
    if dataset not in SUPPORTED_DATASETS:
        problems.append(f"data_config.dataset_type {dataset} is not supported; use "
                        f"{' or '.join(SUPPORTED_DATASETS)} (and local paths)")
    if data_config.batch_size < 1:
        problems.append(f"data_config.batch_size is {data_config.batch_size}; allowed: 1 or "
                        f"more rows per batch (leave it out for the default 1024)")
    return problems


def _model_problems(model_config) -> list[str]:
    problems = []
    model = model_config.WhichOneof("model")
    if model is None:
        problems.append(f"model_config sets no model; supported models: "
                        f"{', '.join(SUPPORTED_MODELS)}")
    elif model not in SUPPORTED_MODELS:
        problems.append(f"model_config.{model} is not supported; supported models: "
                        f"{', '.join(SUPPORTED_MODELS)}")
    if model is not None:
        problems += alias_problems(f"model_config.{model}", getattr(model_config, model))
    if model == "rocket_launching":
        problems += _rocket_problems(model_config.rocket_launching)
    places = [("model_config", model_config)]
    if model in MULTI_TASK_MODELS:
        places += [(f"{model}.task_towers[{i}]", tower)
                   for i, tower in enumerate(getattr(model_config, model).task_towers)]
    if model == "hstu_match":
        problems += hstu_match_problems(model_config)
    if model == "dlrm_hstu":
        problems += dlrm_hstu_problems(model_config)
        places += [(f"dlrm_hstu.fusion_mtl_tower.task_configs[{i}]", task) for i, task
                   in enumerate(model_config.dlrm_hstu.fusion_mtl_tower.task_configs)]
    if model in MATCH_MODELS:
        problems += _match_problems(model_config)
    else:
        for where, config in places:
            problems += _loss_metric_problems(where, config)
    return problems + sequence_encoder_problems(model_config)


def _rocket_problems(config) -> list[str]:
    """RocketLaunching's feature distillation by INNER_PRODUCT, which TorchEasyRec computes
    as the Euclidean distance (its code tells COSINE from the rest alone)."""
    function = config.DESCRIPTOR.fields_by_name["feature_distillation_function"] \
        .enum_type.values_by_number[config.feature_distillation_function].name
    if config.feature_based_distillation and function == "INNER_PRODUCT":
        return ["model_config.rocket_launching.feature_distillation_function INNER_PRODUCT is "
                "not supported (TorchEasyRec computes the Euclidean distance for it, not an "
                "inner product); set EUCLID for that distance, or COSINE"]
    return []


def _match_problems(model_config) -> list[str]:
    """A match model trains on softmax_cross_entropy alone and reports recall_at_k alone,
    as TorchEasyRec's."""
    problems = []
    kinds = [loss.WhichOneof("loss") for loss in model_config.losses]
    if kinds not in ([], ["softmax_cross_entropy"]):
        problems.append(f"model_config.losses lists {', '.join(map(str, kinds))}; a match "
                        f"model trains on one softmax_cross_entropy (its positive item "
                        f"against the negatives): list that one, or none")
    for i, metric in enumerate(model_config.metrics):
        kind = metric.WhichOneof("metric")
        if kind != "recall_at_k":
            problems.append(f"model_config.metrics[{i}].{kind} is not supported for a match "
                            f"model; use recall_at_k {{ top_k }}")
        elif metric.recall_at_k.top_k < 1:
            problems.append(f"model_config.metrics[{i}].recall_at_k.top_k="
                            f"{metric.recall_at_k.top_k}; allowed: 1 or more (default 5)")
    if len(model_config.train_metrics):
        problems.append("model_config.train_metrics is set on a match model; its batches "
                        "have no such metrics: remove it")
    return problems


def _loss_metric_problems(where: str, config) -> list[str]:
    """Unsupported kinds among ``config.losses`` and ``config.metrics``."""
    problems = []
    for i, loss in enumerate(config.losses):
        kind = loss.WhichOneof("loss")
        if kind is None:
            problems.append(f"{where}.losses[{i}] sets no loss; set one of "
                            f"{', '.join(SUPPORTED_LOSSES)}")
        elif kind not in SUPPORTED_LOSSES:
            problems.append(f"{where}.losses[{i}].{kind} is not supported; supported: "
                            f"{', '.join(SUPPORTED_LOSSES)}")
    for i, metric in enumerate(config.metrics):
        problems += _metric_problems(f"{where}.metrics[{i}]", metric)
    return problems


def _metric_problems(where: str, metric) -> list[str]:
    """Why ``metric`` cannot run (whether it fits the task's classes is checked when the
    model is built, hashrec.train.metrics.check_metrics)."""
    kind = metric.WhichOneof("metric")
    if kind is None:
        return [f"{where} sets no metric; set one of {', '.join(SUPPORTED_METRICS)}"]
    if kind == "recall_at_k":
        # TorchEasyRec computes it on the similarities of a match model's user and item
        # towers; its ranking models refuse it too.
        return [f"{where}.recall_at_k is not supported here: it is a metric of match "
                f"(retrieval) models ({', '.join(MATCH_MODELS)}), which rank items by user-item "
                f"similarity; for a ranking model use auc, grouped_auc or, for classes, "
                f"accuracy with top_k"]
    if kind not in SUPPORTED_METRICS:
        return [f"{where}.{kind} is not supported; supported: {', '.join(SUPPORTED_METRICS)}"]
    options = getattr(metric, kind)
    # Checked here, not only at the first evaluation after training to a save.
    if kind in ("auc", "multiclass_auc") and options.thresholds < 2:
        return [f"{where}.{kind}.thresholds={options.thresholds}; allowed: 2 or more "
                f"(default 200)"]
    if kind == "multiclass_auc" and options.average not in MULTICLASS_AUC_AVERAGES:
        return [f"{where}.multiclass_auc.average={options.average!r}; allowed: "
                f"{', '.join(MULTICLASS_AUC_AVERAGES)}"]
    if kind == "accuracy" and options.top_k < 1:
        return [f"{where}.accuracy.top_k={options.top_k}; allowed: 1 or more (default 1)"]
    if kind == "xauc" and not 0 < options.sample_ratio <= 1:
        return [f"{where}.xauc.sample_ratio={options.sample_ratio:g}; allowed: above 0, at "
                f"most 1 (default 0.001; or set max_pairs)"]
    if kind == "grouped_xauc" and options.max_pairs_per_group < 1:
        return [f"{where}.grouped_xauc.max_pairs_per_group={options.max_pairs_per_group}; "
                f"allowed: 1 or more (default 100)"]
    return []


def validate_pipeline_config(config: EasyRecConfig) -> None:
    """Raise :class:`ConfigError` listing every unsupported kind or option in ``config``."""
    problems = pipeline_problems(config)
    if problems:
        raise ConfigError("pipeline config uses what HashRec does not support:\n  "
                          + "\n  ".join(problems))
