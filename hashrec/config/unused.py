"""TorchEasyRec config fields that HashRec parses but does not act on.

A config that sets one of them to something other than its default would train
another model than its author meant without a word, so
:func:`unused_field_problems` reports it (``validate_pipeline_config`` refuses the
config). Fields whose absence changes nothing the model learns (profiling,
summaries, export selection) are only warned about, once per config
(:func:`ignored_field_notes`).
"""

from __future__ import annotations

# Per message: field -> (what counts as set to something HashRec does not do, why).
_REFUSED = {
    "TrainConfig": {
        "gradient_accumulation_steps": (lambda v: v > 1, "each step applies its own gradients"),
    },
    "FeatureGroupConfig": {
        "sequence_groups": (bool, "sequences are grouped by their feature group"),
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
    "fg_encoded_default_value": (bool, "missing values take the feature's default"),
    "asset_dir": (bool, "no feature assets are read"),
}
_IGNORED = {
    "TrainConfig": ("is_profiling", "tensorboard_summaries", "cudnn_allow_tf32",
                    "cuda_matmul_allow_tf32"),
    # HashRec's loader turns the input columns into features itself, whatever these say.
    "DataConfig": ("fg_mode", "fg_encoded", "fg_threads", "fg_encoded_multival_sep"),
    "ExportConfig": ("exporter_type", "best_exporter_metric", "metric_larger_is_better"),
}
_FEATURE_KINDS = ("id_feature", "raw_feature", "combo_feature")


def _is_set(message, name: str) -> bool:
    if name not in message.DESCRIPTOR.fields_by_name:
        return False
    try:
        return message.HasField(name)
    except ValueError:  # a repeated field: set when it holds anything
        return len(getattr(message, name)) > 0


def _messages(config):
    """(path, message) of every message the tables above name, in config order."""
    for name in ("train_config", "data_config", "export_config"):
        if config.HasField(name):
            yield name, getattr(config, name)
    if config.HasField("train_config") and config.train_config.HasField("grad_clipping"):
        yield "train_config.grad_clipping", config.train_config.grad_clipping
    if config.HasField("model_config"):
        for i, group in enumerate(config.model_config.feature_groups):
            yield f"model_config.feature_groups[{i}]", group


def _features(config):
    """(label, feature message) of every id, raw and combo feature, sequences' included."""
    for i, fc in enumerate(config.feature_configs):
        kind = fc.WhichOneof("feature")
        if kind in _FEATURE_KINDS:
            sub = getattr(fc, kind)
            yield f"feature {sub.feature_name!r} (feature_configs[{i}])", sub
        elif kind == "sequence_feature":
            for seq_fc in fc.sequence_feature.features:
                seq_kind = seq_fc.WhichOneof("feature")
                if seq_kind in _FEATURE_KINDS:
                    sub = getattr(seq_fc, seq_kind)
                    name = f"{fc.sequence_feature.sequence_name}__{sub.feature_name}"
                    yield f"feature {name!r} (feature_configs[{i}])", sub


def unused_field_problems(config) -> list[str]:
    """One message per field set to something HashRec would not do."""
    problems = []
    for path, message in _messages(config):
        for name, (differs, instead) in _REFUSED.get(message.DESCRIPTOR.name, {}).items():
            if _is_set(message, name) and differs(getattr(message, name)):
                problems.append(f"{path}.{name} is not supported ({instead}); remove it")
    for label, feature in _features(config):
        for name, (differs, instead) in _FEATURE_REFUSED.items():
            if _is_set(feature, name) and differs(getattr(feature, name)):
                problems.append(f"{label}: {name} is not supported ({instead}); remove it")
    return problems


def ignored_field_notes(config) -> list[str]:
    """The fields set, to other than their defaults, that HashRec ignores without
    changing what a model learns."""
    notes = []
    for path, message in _messages(config):
        for name in _IGNORED.get(message.DESCRIPTOR.name, ()):
            field = message.DESCRIPTOR.fields_by_name.get(name)
            if _is_set(message, name) and (
                    field.default_value != getattr(message, name) or isinstance(
                        field.default_value, list)):
                notes.append(f"{path}.{name}")
    return notes
