"""Load and save pipeline configs (protobuf text format), strictly."""

from __future__ import annotations

import contextlib
import difflib
import errno
import logging
import os
import re
from pathlib import Path

from google.protobuf import descriptor_pool, text_format

from hashrec.config.errors import ConfigError
from hashrec.config.pipeline_pb2 import EasyRecConfig
from hashrec.config.validate import SUPPORTED_MODELS

logger = logging.getLogger(__name__)


# dynamicemb types ``evict_strategy`` as an int (its DynamicEmbEvictStrategy number) where
# HashRec's field is a string naming it: a bare integer there is quoted so that both parse
# (the number is read in hashrec.features.tables). No line changes, so errors keep their lines.
_EVICT_NUMBER = re.compile(r"(?<![\w.])(evict_strategy\s*:\s*)(\d+)(?![\w.])")


def parse_pipeline_config(text: str, source: str = "<string>") -> EasyRecConfig:
    """Parse text-format ``text`` into an EasyRecConfig.

    Unknown fields, bad values and missing required fields raise
    :class:`ConfigError` naming ``source``, the line and the field.
    """
    config = EasyRecConfig()
    try:
        text_format.Parse(_EVICT_NUMBER.sub(r'\1"\2"', text), config)
    except text_format.ParseError as err:
        where = f"{source}:{err.GetLine()}" if err.GetLine() else source
        message = _strip_position(str(err))
        # a TorchEasyRec model HashRec lacks is said so, not likened to a model it has
        hint = _unimplemented_model(message) or _nested_field(message) or _close_name(message)
        raise ConfigError(f"{where}: {message}{hint}") from None
    missing = config.FindInitializationErrors()
    if missing:
        raise ConfigError(f"{source}: required fields are not set: {', '.join(missing)}")
    _split_concatenated_feature_names(config, source)
    _move_backbone_task_towers(config, source)
    return config


def load_pipeline_config(path: str | Path) -> EasyRecConfig:
    """Read a pipeline config file (strict; see :func:`parse_pipeline_config`).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 text, or does not parse;
            the message names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read pipeline config {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"cannot read pipeline config {path}: not UTF-8 text (byte "
                          f"0x{err.object[err.start]:02x} at offset {err.start}); save it "
                          f"as UTF-8 protobuf text format") from None
    return parse_pipeline_config(text, str(path))


def save_pipeline_config(config: EasyRecConfig, path: str | Path) -> None:
    """Write ``config`` as text format (UTF-8) to ``path``, creating parent folders.

    The text goes to a hidden sibling first, flushed to disk and renamed over ``path``:
    a full disk or a kill midway leaves the file that was there whole.

    Raises:
        ConfigError: the file or a parent folder cannot be written (a file stands where
            a folder is needed, no permission, a full disk ...); the message names the path.
    """
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(staging, "w", encoding="utf-8") as f:
            f.write(text_format.MessageToString(config, as_utf8=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            staging.unlink()
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
        advice = ("free space on its disk" if err.errno in (errno.ENOSPC, errno.EDQUOT)
                  else "check that its folder is a directory you can write")
        raise ConfigError(f"cannot write pipeline config {path}: {err.strerror}{where}; "
                          f"{advice}") from None


_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_ENUM = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')


def _close_name(message: str) -> str:
    """`` Did you mean "x"?`` for an unknown field or enum value of a ParseError message
    that is close to one the message or enum type has; "" otherwise."""
    pool = descriptor_pool.Default()
    names: list[str] = []
    if match := _UNKNOWN_FIELD.search(message):
        with contextlib.suppress(KeyError):
            names = list(pool.FindMessageTypeByName(match.group(1)).fields_by_name)
    elif match := _UNKNOWN_ENUM.search(message):
        with contextlib.suppress(KeyError):
            names = list(pool.FindEnumTypeByName(match.group(1)).values_by_name)
    close = difflib.get_close_matches(match.group(2), names, n=1) if match else []
    return f' Did you mean "{close[0]}"?' if close else ""


def _nested_field(message: str) -> str:
    """For an unknown field that a message field of the same message holds (MaskNet's
    ``n_mask_blocks``, which TorchEasyRec's configs once wrote straight under ``mask_net``
    and now write in its ``mask_net_module``): where to write it; "" otherwise."""
    match = _UNKNOWN_FIELD.search(message)
    if not match:
        return ""
    with contextlib.suppress(KeyError):
        holder = descriptor_pool.Default().FindMessageTypeByName(match.group(1))
        inner = [f.name for f in holder.fields if f.message_type is not None
                 and match.group(2) in f.message_type.fields_by_name]
        if len(inner) == 1:
            return (f" It belongs inside {inner[0]}: write {inner[0]} {{ "
                    f"{match.group(2)}: ... }}")
    return ""


# TorchEasyRec's models that HashRec's ModelConfig does not parse: the older form of its
# configurable backbone, its generative models and its multi-channel HSTU ranking model.
_UNPARSED_MODELS = {
    "ultra_hstu": "generative ranking model", "sid_rqvae": "semantic id model",
    "sid_rqkmeans": "semantic id model", "generative_qwen": "generative model",
    "prompt_generative_qwen": "generative model",
}


def _unimplemented_model(message: str) -> str:
    """For an unknown ``model_config`` field that is a TorchEasyRec model: that HashRec does
    not implement it, and the models it does; "" otherwise."""
    match = _UNKNOWN_FIELD.search(message)
    if not match or not match.group(1).endswith(".ModelConfig"):
        return ""
    if match.group(2) == "backbone":
        return (" It is the older schema of TorchEasyRec's configurable backbone, which "
                "TorchEasyRec's current model_config does not accept either. Write it as "
                "rank_backbone { backbone { blocks { name: ... inputs { feature_group_name: "
                "... } (or inputs { block_name: ... }) module { class_name: ... } } "
                "concat_blocks: ... } } (multi_task_backbone for several tasks): an inputs "
                "message per input in place of each string, and module { class_name: 'MLP' "
                "mlp { ... } } in place of input_layer: 'MLP' with input_layer_args")
    if match.group(2) not in _UNPARSED_MODELS:
        return ""
    return (f" It is TorchEasyRec's {_UNPARSED_MODELS[match.group(2)]} {match.group(2)}, "
            f"which HashRec does not implement; HashRec's models: {', '.join(SUPPORTED_MODELS)}")


def _strip_position(message: str) -> str:
    # ParseError messages start with "line:column : "; the caller prints the line itself.
    head, sep, rest = message.partition(" : ")
    return rest if sep and head.replace(":", "").isdigit() else message


def _known_feature_names(config: EasyRecConfig) -> set[str]:
    names = set()
    for fc in config.feature_configs:
        kind = fc.WhichOneof("feature")
        if kind is None:
            continue
        sub = getattr(fc, kind)
        if kind == "sequence_feature":
            names.update(f"{sub.sequence_name}__{getattr(f, f.WhichOneof('feature')).feature_name}"
                         for f in sub.features if f.WhichOneof("feature"))
        else:
            names.add(sub.feature_name)
    return names


def _segment(name: str, known: set[str]) -> list[list[str]]:
    """All ways to write ``name`` as a concatenation of known names (at most two kept)."""
    ways: dict[int, list[list[str]]] = {0: [[]]}
    for end in range(1, len(name) + 1):
        found = []
        for start in range(end):
            if start in ways and name[start:end] in known:
                found += [w + [name[start:end]] for w in ways[start]]
        if found:
            ways[end] = found[:2]
    return ways.get(len(name), [])


def _split_concatenated_feature_names(config: EasyRecConfig, source: str) -> None:
    """Undo text-format string concatenation in ``feature_names``.

    Text format joins adjacent literals (``feature_names: "a" "b"`` is the one
    string ``"ab"``), which is never a feature. An entry that is not a feature
    but splits in exactly one way into known feature names is replaced by
    those names, with a warning.
    """
    known = _known_feature_names(config)
    for group in config.model_config.feature_groups:
        names = list(group.feature_names)
        fixed: list[str] = []
        for name in names:
            ways = _segment(name, known) if name not in known else []
            if len(ways) == 1 and len(ways[0]) > 1:
                logger.warning(
                    "%s: feature group %r: feature_names %r is adjacent strings joined by the "
                    "text format; reading it as %s (write one name per string, e.g. "
                    "feature_names: [\"a\", \"b\"])", source, group.group_name, name, ways[0])
                fixed += ways[0]
            else:
                fixed.append(name)
        if fixed != names:
            del group.feature_names[:]
            group.feature_names.extend(fixed)


def _move_backbone_task_towers(config: EasyRecConfig, source: str) -> None:
    """``multi_task_backbone.model_params.task_towers`` (TorchEasyRec's place) into
    ``multi_task_backbone.task_towers``, where HashRec reads every multi-task model's
    towers; the two equal (older examples write both) are one list, with a warning.

    Raises:
        ConfigError: both lists set and different.
    """
    if config.model_config.WhichOneof("model") != "multi_task_backbone":
        return
    model = config.model_config.multi_task_backbone
    params = model.model_params.task_towers
    if not params:
        return
    if model.task_towers and list(model.task_towers) != list(params):
        raise ConfigError(f"{source}: multi_task_backbone sets task_towers and "
                          f"model_params.task_towers differently; keep one of the two")
    if model.task_towers:
        logger.warning("%s: multi_task_backbone sets task_towers and "
                       "model_params.task_towers alike; reading them once", source)
    else:
        model.task_towers.extend(params)
    model.ClearField("model_params")
