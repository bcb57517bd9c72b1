"""TorchEasyRec config fields that HashRec parses but does not act on.

A config that sets one of them to something other than its default would train
another model than its author meant without a word, so
:func:`unused_field_problems` reports it (``validate_pipeline_config`` refuses the
config). Fields whose absence changes nothing the model learns (profiling,
summaries, feature generation's settings) are only warned
about, once per config (:func:`ignored_field_notes`).
"""

from __future__ import annotations

from hashrec.config.fg_mode import ENCODED, RAW, fg_input, fg_input_setting

_NO_EVENT_TIME = ("its input is files, whose rows carry no event time: save_checkpoints_steps "
                  "or save_checkpoints_epochs set when checkpoints are saved")
# Per message: field -> (what counts as set to something HashRec does not do, why).
_REFUSED = {
    "TrainConfig": {
        "gradient_accumulation_steps": (lambda v: v > 1, "each step applies its own gradients"),
        "save_checkpoints_timestamp_interval": (lambda v: v > 0, _NO_EVENT_TIME),
        "save_checkpoints_timestamps": (bool, _NO_EVENT_TIME),
        "delta_embedding_dump_config": (
            lambda v: True, "HashRec's dumps of changed rows are train_config."
            "incremental_dump_steps: every N steps <model_dir>/incremental/dump-<step> holds "
            "the dynamic tables' rows changed and keys evicted since the previous dump, applied "
            "with python -m hashrec.tools.apply_delta; set that instead"),
    },
    "FeatureGroupConfig": {
        "embedding_name_suffix": (bool, "features share a table by embedding_name alone: "
                                  "give the group's features embedding_names of their own"),
    },
    "ModelConfig": {
        "variational_dropout": (lambda v: True, "a feature group's embeddings reach the "
                                "towers without learned dropout; set dropout_ratio on the "
                                "MLPs instead"),
    },
    "DataConfig": {
        "sample_mask_prob": (lambda v: v > 0, "no samples are masked"),
        "negative_sample_mask_prob": (lambda v: v > 0, "there is no negative sampling"),
        "sample_cost_field": (bool, "a batch holds batch_size rows"),
        "batch_cost_size": (lambda v: v > 0, "a batch holds batch_size rows"),
        "input_fields_str": (bool, "write the columns as input_fields { input_name: ... "
                             "input_type: ... } instead"),
        "min_batch_size": (lambda v: v > 0, "drop_remainder: true drops a short last "
                           "training batch"),
    },
    "EvalConfig": {
        "evaluator_type": (lambda v: v != "latest", "each saved checkpoint is evaluated; "
                           "export_config.exporter_type picks the one to export"),
        "eval_online": (bool, "evaluation reads eval_input_path"),
    },
    "ExportConfig": {
        "export_format": (bool, "export writes safetensors and a scripted model "
                          "(TORCHSCRIPT)"),
    },
    "DenseOptimizer": {
        "ema": (lambda v: True, "the dense parameters are evaluated and exported as "
                "trained, without a moving average"),
    },
    "STU": {
        "sla_k1": (lambda v: v > 0, "each position reads every position before it, or "
                   "max_attn_len of them"),
        "sla_k2": (lambda v: v > 0, "each position reads every position before it, or "
                   "max_attn_len of them"),
    },
    "HSTU": {
        "attn_truncation_split_layer": (lambda v: v > 0, "every layer reads the whole "
                                        "history"),
        "attn_truncation_tail_len": (lambda v: v > 0, "every layer reads the whole history"),
        "name": (bool, "hstu_match's user tower and dlrm_hstu are one channel, reading the "
                 "groups uih_action, uih_watchtime and uih_timestamp"),
    },
    "GradClipping": {
        "enable_global_grad_clip": (bool, "the clipping norm is the dense gradients' after "
                                    "their all-reduce; sparse rows are updated inside the "
                                    "backward, unclipped"),
    },
}
_FEATURE_REFUSED = {
    "use_mask": (bool, "no feature masking"),
    "sequence_fields": (bool, "declare sequences as sequence features"),
    "asset_dir": (bool, "no feature assets are read"),
}
_IGNORED = {
    # global_embedding_constraints: HashRec's planner shards dynamic tables row-wise and
    # keeps the others whole on every rank, whatever the constraints.
    # save_checkpoints_timestamp_quorum: of the timestamp checkpoints, refused above.
    "TrainConfig": ("is_profiling", "tensorboard_summaries", "global_embedding_constraints",
                    "save_checkpoints_timestamp_quorum"),
    # A decay rate on an evaluation metric, which is not decayed (the train metrics'
    # is TrainMetricConfig.decay_rate).
    "MetricConfig": ("step_decay_rate",),
    # HashRec's loader turns the input columns into features itself: it runs no threads
    # of a feature generation; it reads local files (no ODPS settings), in order, and has
    # no negative samplers' data groups.
    "DataConfig": ("fg_threads", "is_orderby_partition", "odps_data_quota_name",
                   "odps_data_compression", "in_order", "force_base_data_group"),
    "ExportConfig": ("mixed_precision", "cudnn_allow_tf32", "cuda_matmul_allow_tf32"),
    # TorchEasyRec's choice of kernels; HashRec's compute the same.
    "ModelConfig": ("kernel",),
    # Parsed by TorchEasyRec's RocketLaunching and read by none of its code.
    "RocketLaunching": ("l2_regularization",),
    # Read by TorchEasyRec's HSTU encoder and applied nowhere there: the attention's
    # dropout, and the time buckets of a relative bias that is given no timestamps.
    "HSTUEncoder": ("attn_dropout_rate", "time_bucket_size"),
    # How TorchEasyRec's STU kernels save memory and time; the values are the same.
    "STU": ("recompute_normed_x", "recompute_uvqk", "recompute_y", "sort_by_length"),
    # Feature generation's join key of a sequence; the columns are read as they are.
    "SequenceFeature": ("sequence_pk",),
    # The mode of a weight decay that must be 0 (optimizers.py refuses any other).
    "FusedRowWiseAdagradOptimizer": ("weight_decay_mode",),
}
# Per feature message: fields of feature generation (the output layout of an id column,
# its value type, intermediate-only features), which HashRec does not run: a feature's
# values are its input column's.
# embedding_constraints: as TrainConfig's global_embedding_constraints.
_FEATURE_IGNORED = {
    "IdFeature": ("value_dim", "fg_value_type", "stub_type", "embedding_constraints"),
    "ComboFeature": ("value_dim", "stub_type", "embedding_constraints"),
    "RawFeature": ("stub_type", "embedding_constraints"),
}
# The embedding's fields of a raw feature, which has an embedding only with boundaries (as in
# TorchEasyRec; init_fn and data_type there are errors, features/raw_feature.py).
_RAW_EMBEDDING = ("embedding_dim", "embedding_name", "pooling", "trainable")
# Of those, the fields a sequence's features act on: an id sequence's value_dim (1 reads
# an item's first value, 0 all of its values pooled into one embedding; others are refused).
_SEQUENCE_READS = ("value_dim",)
_FEATURE_KINDS = ("id_feature", "raw_feature", "combo_feature", "sequence_id_feature",
                  "sequence_raw_feature")


def is_set(message, name: str) -> bool:
    """Whether ``message`` sets field ``name`` (False where it has no such field; a repeated
    or map field is set when it holds anything)."""
    if name not in message.DESCRIPTOR.fields_by_name:
        return False
    try:
        return message.HasField(name)
    except ValueError:  # a repeated field: set when it holds anything
        return len(getattr(message, name)) > 0


def _messages(config):
    """(path, message) of every message the tables above name, in config order."""
    for name in ("train_config", "eval_config", "data_config", "export_config",
                 "model_config"):
        if config.HasField(name):
            yield name, getattr(config, name)
    if config.HasField("train_config"):
        train = config.train_config
        if train.HasField("grad_clipping"):
            yield "train_config.grad_clipping", train.grad_clipping
        yield "train_config.dense_optimizer", train.dense_optimizer
        sparse = train.sparse_optimizer.WhichOneof("optimizer")
        if sparse is not None:
            yield (f"train_config.sparse_optimizer.{sparse}",
                   getattr(train.sparse_optimizer, sparse))
    for i, fc in enumerate(config.feature_configs):
        if fc.WhichOneof("feature") == "sequence_feature":
            yield f"feature_configs[{i}].sequence_feature", fc.sequence_feature
    if config.HasField("model_config"):
        model_config = config.model_config
        for i, group in enumerate(model_config.feature_groups):
            yield f"model_config.feature_groups[{i}]", group
            for j, encoder in enumerate(group.sequence_encoders):
                if encoder.WhichOneof("seq_module") == "hstu_encoder":
                    yield (f"model_config.feature_groups[{i}].sequence_encoders[{j}]."
                           f"hstu_encoder", encoder.hstu_encoder)
        yield from _metric_messages("model_config", model_config)
        model = model_config.WhichOneof("model")
        if model:
            yield f"model_config.{model}", getattr(model_config, model)
        if model == "hstu_match":
            where = "model_config.hstu_match.user_tower.hstu"
            yield where, model_config.hstu_match.user_tower.hstu
            yield f"{where}.stu", model_config.hstu_match.user_tower.hstu.stu
        if model == "dlrm_hstu":
            where = "model_config.dlrm_hstu.hstu"
            yield where, model_config.dlrm_hstu.hstu
            yield f"{where}.stu", model_config.dlrm_hstu.hstu.stu
            for i, task in enumerate(model_config.dlrm_hstu.fusion_mtl_tower.task_configs):
                yield from _metric_messages(
                    f"model_config.dlrm_hstu.fusion_mtl_tower.task_configs[{i}]", task)
        if model and "task_towers" in getattr(model_config, model).DESCRIPTOR.fields_by_name:
            for i, tower in enumerate(getattr(model_config, model).task_towers):
                where = f"model_config.{model}.task_towers[{i}]"
                yield where, tower
                yield from _metric_messages(where, tower)


def _metric_messages(where: str, holder):
    """(path, metric config) of ``holder``'s metrics."""
    for i, metric in enumerate(holder.metrics):
        yield f"{where}.metrics[{i}]", metric


def _features(config):
    """(label, feature message, whether a sequence reads it) of every id, raw and combo
    feature, sequences' included."""
    for i, fc in enumerate(config.feature_configs):
        kind = fc.WhichOneof("feature")
        if kind in _FEATURE_KINDS:
            sub = getattr(fc, kind)
            yield (f"feature {sub.feature_name!r} (feature_configs[{i}])", sub,
                   kind.startswith("sequence_"))
        elif kind == "sequence_feature":
            for seq_fc in fc.sequence_feature.features:
                seq_kind = seq_fc.WhichOneof("feature")
                if seq_kind in _FEATURE_KINDS:
                    sub = getattr(seq_fc, seq_kind)
                    name = f"{fc.sequence_feature.sequence_name}__{sub.feature_name}"
                    yield f"feature {name!r} (feature_configs[{i}])", sub, True


def unused_field_problems(config) -> list[str]:
    """One message per field set to something HashRec would not do."""
    problems = []
    for path, message in _messages(config):
        for name, (differs, instead) in _REFUSED.get(message.DESCRIPTOR.name, {}).items():
            if is_set(message, name) and differs(getattr(message, name)):
                problems.append(f"{path}.{name} is not supported ({instead}); remove it")
    for label, feature, _ in _features(config):
        for name, (differs, instead) in _FEATURE_REFUSED.items():
            if is_set(feature, name) and differs(getattr(feature, name)):
                problems.append(f"{label}: {name} is not supported ({instead}); remove it")
    return problems


def _set_off_default(message, name: str) -> bool:
    """Whether ``message`` sets field ``name`` to other than its default."""
    field = message.DESCRIPTOR.fields_by_name.get(name)
    return is_set(message, name) and (field.default_value != getattr(message, name)
                                       or isinstance(field.default_value, list))


def ignored_field_notes(config) -> list[str]:
    """The fields set, to other than their defaults, that HashRec ignores without
    changing what a model learns (``train_config.is_profiling``, ``value_dim of feature
    'cate' (feature_configs[3])``; a sequence's features read their value_dim; the
    embedding's fields of a raw feature without boundaries)."""
    notes = []
    for path, message in _messages(config):
        for name in _IGNORED.get(message.DESCRIPTOR.name, ()):
            if _set_off_default(message, name):
                notes.append(f"{path}.{name}")
    data = config.data_config if config.HasField("data_config") else None
    mode = fg_input(data)
    raw = mode == RAW
    if data is not None:
        if not data.shuffle and _set_off_default(data, "shuffle_buffer_size"):
            notes.append("data_config.shuffle_buffer_size (shuffle is false)")
        if raw and _set_off_default(data, "fg_encoded_multival_sep"):
            notes.append("data_config.fg_encoded_multival_sep (the input is raw)")
    for label, feature, in_sequence in _features(config):
        for name in _FEATURE_IGNORED.get(feature.DESCRIPTOR.name, ()):
            if _set_off_default(feature, name) and not (in_sequence
                                                        and name in _SEQUENCE_READS):
                notes.append(f"{name} of {label}")
        notes += _unread_default_notes(feature, label, mode)
        if feature.DESCRIPTOR.name == "RawFeature" and not len(feature.boundaries):
            notes += [f"{name} of {label} (no boundaries, so no embedding)"
                      for name in _RAW_EMBEDDING if _set_off_default(feature, name)]
    return notes


def _unread_default_notes(feature, label: str, mode: str) -> list[str]:
    """The missing-cell default that input of fg input ``mode`` does not read: FG_NONE
    reads ``fg_encoded_default_value``, raw input and FG_BUCKETIZE ``default_value``."""
    if mode == ENCODED and is_set(feature, "default_value"):
        return [f"default_value of {label} (the input is encoded: fg_encoded_default_value "
                f"fills its missing cells)"]
    if mode != ENCODED and is_set(feature, "fg_encoded_default_value"):
        why = "the input is raw" if mode == RAW else \
            "FG_BUCKETIZE fills missing cells with default_value"
        return [f"fg_encoded_default_value of {label} ({why})"]
    return []


def fg_mode_note(config) -> str | None:
    """What a config whose input a feature generation already wrote (``fg_mode`` FG_NONE
    or FG_BUCKETIZE, or ``fg_encoded: true``) makes the features read,
    for the log; None for raw input (``hashrec.features.encoded`` reads the others)."""
    data = config.data_config if config.HasField("data_config") else None
    mode = fg_input(data)
    if mode == RAW:
        return None
    said = fg_input_setting(data)
    what = ("ids as the generation bucketized them (rows of their tables, keys of dynamic "
            "and ZCH tables), values as it normalized them, missing cells as "
            "fg_encoded_default_value" if mode == ENCODED else
            "tokens bucketized here as from raw input, values not normalized again, missing "
            "cells as default_value")
    return (f"{said}: each feature reads the column named as the feature (not its "
            f"expression's field), {what}; a cell's values joined by "
            f"{data.fg_encoded_multival_sep!r} or a list, a sequence's items split on its "
            f"sequence_delim first")
