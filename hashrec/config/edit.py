"""``--edit_config_json``: dotted overrides applied to a loaded pipeline config.

Example::

    apply_edit_config_json(config, '{"feature_configs[0].id_feature.embedding_dim": "8",'
                                   ' "train_config.num_steps": 5,'
                                   ' "model_config.feature_groups[group_name=deep].group_type": "DEEP"}')

A path is dot-separated field names; a repeated field takes ``[i]`` (index,
negative allowed), ``[:]`` (every element) or ``[name=value]`` (elements whose
``name`` field, or the ``name`` field of their set oneof member, equals
``value``). Values are converted to the field's type: numbers from JSON
numbers or strings, booleans from ``true``/``false``, enums by name or
number, repeated scalars from a JSON list or a comma-separated string, and
messages from a JSON object or a text-format string. Numbers must fit the
field's type (a uint32 field takes 0 to 4294967295); ``true``/``false`` set
only boolean and string fields.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from hashrec.config.errors import ConfigError
from hashrec.config.pipeline_pb2 import EasyRecConfig

logger = logging.getLogger("hashrec.config")
_STEP = re.compile(r"^(\w+)(?:\[([^\]]*)\])?$")
# Integer field types -> (type name, smallest, largest value).
_INTS = {
    FieldDescriptor.TYPE_INT32: ("int32", -2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: ("sint32", -2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: ("sfixed32", -2**31, 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: ("uint32", 0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: ("fixed32", 0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: ("int64", -2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: ("sint64", -2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: ("sfixed64", -2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: ("uint64", 0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: ("fixed64", 0, 2**64 - 1),
}
_FLOATS = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
_FLOAT32_MAX = 3.4028234663852886e38


def apply_edit_config_json(config: EasyRecConfig, edit_json: str | dict) -> EasyRecConfig:
    """Return a copy of ``config`` with the overrides in ``edit_json`` applied.

    Raises:
        ConfigError: bad JSON, an unknown field, an index out of range, a
            selector that matches nothing, or a value of the wrong type.
    """
    if isinstance(edit_json, str):
        try:
            edits = json.loads(edit_json)
        except json.JSONDecodeError as err:
            raise ConfigError(f"edit_config_json is not valid JSON: {err}") from None
    else:
        edits = edit_json
    if not isinstance(edits, dict):
        raise ConfigError("edit_config_json must be a JSON object of {\"dotted.path\": value}")
    result = EasyRecConfig()
    result.CopyFrom(config)
    for path, value in edits.items():
        _apply(result, path, value)
    return result


def _apply(config: Message, path: str, value) -> None:
    steps = path.split(".")
    targets = [config]
    selected = False  # targets came from [:] or [field=value]: skip other oneof members
    for i, step in enumerate(steps):
        match = _STEP.match(step)
        if not match:
            raise ConfigError(f"edit_config_json path {path!r}: cannot read step {step!r}")
        name, selector = match.groups()
        last = i == len(steps) - 1
        next_targets = []
        for msg in targets:
            field = _field(msg, name, path)
            if _other_oneof_member(msg, field):
                if selected:
                    continue
                _warn_replaced(msg, field, path)
            if last and selector is None:
                _assign(msg, field, value, path)
                continue
            if field.type != FieldDescriptor.TYPE_MESSAGE and not (last and selector is not None):
                raise ConfigError(f"edit_config_json path {path!r}: {name!r} is not a message")
            if selector is None:
                if _repeated(field):
                    raise ConfigError(f"edit_config_json path {path!r}: {name!r} is repeated; "
                                      f"use {name}[i], {name}[:] or {name}[field=value]")
                next_targets.append(getattr(msg, name))
            elif last:
                _assign_elements(msg, field, selector, value, path)
            else:
                next_targets += _select(msg, field, selector, path)
        if not last and not next_targets and targets:
            raise ConfigError(f"edit_config_json path {path!r}: no selected element has "
                              f"{name!r} set")
        targets = next_targets
        selected = selected or (selector is not None and not selector.lstrip("-").isdigit())


def _other_oneof_member(msg: Message, field: FieldDescriptor) -> bool:
    """True when ``field`` is in a oneof of ``msg`` whose set member is another field."""
    oneof = field.containing_oneof
    return oneof is not None and msg.WhichOneof(oneof.name) not in (None, field.name)


def _warn_replaced(msg: Message, field: FieldDescriptor, path: str) -> None:
    """Setting ``field`` clears the other member of its oneof that ``msg`` holds (an
    index that names another feature than meant, or a switch of optimizer): say which."""
    oneof = field.containing_oneof
    held = msg.WhichOneof(oneof.name)
    logger.warning("edit_config_json path %r: sets %s of %s, which replaces its %s (one "
                   "oneof '%s' holds either)%s", path, field.name, msg.DESCRIPTOR.name, held,
                   oneof.name, _named(msg, held))


def _named(msg: Message, member: str) -> str:
    """`` of feature 'x'``-like words naming the replaced member, where it has a name."""
    held = getattr(msg, member)
    for key in ("feature_name", "sequence_name", "name"):
        if isinstance(held, Message) and key in held.DESCRIPTOR.fields_by_name \
                and getattr(held, key):
            return f"; the replaced {member} had {key} {getattr(held, key)!r}"
    return ""


def _repeated(field: FieldDescriptor) -> bool:
    # FieldDescriptor.label is gone in protobuf 7; is_repeated is missing before 5.
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _field(msg: Message, name: str, path: str) -> FieldDescriptor:
    field = msg.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        known = ", ".join(sorted(msg.DESCRIPTOR.fields_by_name))
        raise ConfigError(f"edit_config_json path {path!r}: {msg.DESCRIPTOR.name} has no field "
                          f"{name!r} (fields: {known})")
    return field


def _indices(container, selector: str, name: str, path: str) -> list[int]:
    n = len(container)
    if selector == ":":
        return list(range(n))
    if "=" in selector:
        key, want = (s.strip().strip("'\"") for s in selector.split("=", 1))
        hits = [i for i, el in enumerate(container) if _matches(el, key, want)]
        if not hits:
            raise ConfigError(f"edit_config_json path {path!r}: no element of {name!r} "
                              f"has {key} = {want!r}")
        return hits
    try:
        index = int(selector)
    except ValueError:
        raise ConfigError(f"edit_config_json path {path!r}: bad index [{selector}]") from None
    if not -n <= index < n:
        raise ConfigError(f"edit_config_json path {path!r}: index {index} out of range for "
                          f"{name!r} with {n} elements")
    return [index % n]


def _matches(element, key: str, want: str) -> bool:
    if not isinstance(element, Message):
        return str(element) == want
    candidates = [element]
    for oneof in element.DESCRIPTOR.oneofs:
        member = element.WhichOneof(oneof.name)
        if member and isinstance(getattr(element, member), Message):
            candidates.append(getattr(element, member))
    for msg in candidates:
        if key in msg.DESCRIPTOR.fields_by_name and str(getattr(msg, key)) == want:
            return True
    return False


def _select(msg: Message, field: FieldDescriptor, selector: str, path: str) -> list[Message]:
    if not _repeated(field):
        raise ConfigError(f"edit_config_json path {path!r}: {field.name!r} is not repeated")
    container = getattr(msg, field.name)
    return [container[i] for i in _indices(container, selector, field.name, path)]


def _assign_elements(msg: Message, field: FieldDescriptor, selector: str, value, path: str) -> None:
    if not _repeated(field):
        raise ConfigError(f"edit_config_json path {path!r}: {field.name!r} is not repeated")
    container = getattr(msg, field.name)
    for i in _indices(container, selector, field.name, path):
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            container[i].CopyFrom(_message_value(field, value, path))
        else:
            with _refusal_as_config_error(field, value, path):
                container[i] = _scalar(field, value, path)


def _assign(msg: Message, field: FieldDescriptor, value, path: str) -> None:
    if _repeated(field):
        items = value if isinstance(value, list) else (
            [v for v in str(value).split(",") if v.strip()] if field.type != FieldDescriptor.TYPE_MESSAGE
            else [value])
        container = getattr(msg, field.name)
        del container[:]
        for item in items:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                container.add().CopyFrom(_message_value(field, item, path))
            else:
                with _refusal_as_config_error(field, item, path):
                    container.append(_scalar(field, item, path))
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(msg, field.name).CopyFrom(_message_value(field, value, path))
    else:
        with _refusal_as_config_error(field, value, path):
            setattr(msg, field.name, _scalar(field, value, path))


@contextlib.contextmanager
def _refusal_as_config_error(field: FieldDescriptor, value, path: str):
    """Protobuf refusing a converted value becomes a ConfigError naming the path
    (``_scalar`` checks what it knows first, with a more specific message)."""
    try:
        yield
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"edit_config_json path {path!r}: cannot set {field.name!r} to "
                          f"{value!r}: {err}") from None


def _message_value(field: FieldDescriptor, value, path: str) -> Message:
    msg = field.message_type._concrete_class()
    try:
        if isinstance(value, dict):
            json_format.ParseDict(value, msg)
        else:
            text_format.Parse(str(value), msg)
    except (json_format.ParseError, text_format.ParseError) as err:
        raise ConfigError(f"edit_config_json path {path!r}: bad {field.message_type.name} "
                          f"value: {err}") from None
    return msg


def _scalar(field: FieldDescriptor, value, path: str):
    numeric = field.type in _INTS or field.type in _FLOATS \
        or field.type == FieldDescriptor.TYPE_ENUM
    if isinstance(value, bool) and numeric:  # a bool is an int: true would read as 1
        raise ConfigError(f"edit_config_json path {path!r}: {field.name!r} is not a boolean "
                          f"field; give {_kind(field)}, not {json.dumps(value)}")
    try:
        if field.type in _INTS:
            return _integer(field, value, path)
        if field.type in _FLOATS:
            return _float(field, value, path)
        if field.type == FieldDescriptor.TYPE_BOOL:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return text in ("true", "1")
        if field.type == FieldDescriptor.TYPE_ENUM:
            return _enum(field, value)
        if field.type == FieldDescriptor.TYPE_STRING:
            return str(value)
    except ConfigError:
        raise
    except (ValueError, OverflowError):  # OverflowError: int(inf)
        pass
    allowed = (f" (one of {sorted(field.enum_type.values_by_name)})"
               if field.type == FieldDescriptor.TYPE_ENUM else "")
    raise ConfigError(f"edit_config_json path {path!r}: cannot set {field.name!r} "
                      f"to {value!r}{allowed}")


def _kind(field: FieldDescriptor) -> str:
    """What values an integer, float or enum ``field`` takes, in words."""
    if field.type in _INTS:
        name, low, high = _INTS[field.type]
        return f"a {name} integer from {low} to {high}"
    if field.type == FieldDescriptor.TYPE_ENUM:
        return f"one of {sorted(field.enum_type.values_by_name)}"
    return "a float" if field.type == FieldDescriptor.TYPE_FLOAT else "a double"


def _integer(field: FieldDescriptor, value, path: str) -> int:
    """``value`` as an integer of ``field``'s type; ValueError when it is no integer."""
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    number = int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    _, low, high = _INTS[field.type]
    if not low <= number <= high:
        raise ConfigError(f"edit_config_json path {path!r}: {value!r} is out of range for "
                          f"{field.name!r}; allowed: {_kind(field)}")
    return number


def _float(field: FieldDescriptor, value, path: str) -> float:
    """``value`` as a float; past float32's range a float field would hold inf instead."""
    number = float(value)
    if field.type == FieldDescriptor.TYPE_FLOAT and math.isfinite(number) \
            and abs(number) > _FLOAT32_MAX:
        raise ConfigError(f"edit_config_json path {path!r}: {value!r} is out of range for "
                          f"{field.name!r}; allowed: a float of magnitude up to {_FLOAT32_MAX:g}")
    return number


def _enum(field: FieldDescriptor, value) -> int:
    by_name = field.enum_type.values_by_name
    if str(value) in by_name:
        return by_name[str(value)].number
    number = int(value)
    if number not in field.enum_type.values_by_number:
        raise ValueError(value)
    return number
