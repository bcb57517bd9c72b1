"""``train_config.fine_tune_ckpt_param_map``: which checkpoint entry a renamed part reads.

The file holds one mapping per line, ``<name in this model> <name in the checkpoint>``
(whitespace separated); blank lines and everything after a ``#`` are ignored. A name is
either a table (dense ``num_buckets``, ZCH or dynamic; the logical table that feature
configs name, also inside a fused storage) or a prefix of dense ``state_dict`` keys at a
``.`` boundary: ``towers.deep towers.user`` makes every ``towers.deep.<rest>`` read
``towers.user.<rest>``. A table maps only to a table of the same kind. Where several
prefixes match a key, the longest wins. Entries the map does not name are read by
their own name.

Example::

    # this model              the checkpoint
    towers.deep               towers.user
    item_id_v2                item_id
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from hashrec.checkpoint.errors import CheckpointError

# Table kinds, as the messages name them.
DYNAMIC = "dynamic"
NUM_BUCKETS = "num_buckets"
ZCH = "ZCH"

_SHOWN = 8


@dataclass(frozen=True)
class MapLine:
    """One mapping: ``model_name`` of this model reads ``checkpoint_name``, from ``line``."""

    model_name: str
    checkpoint_name: str
    line: int


@dataclass(frozen=True)
class ParamMap:
    """The mappings of one file, in file order."""

    path: str
    lines: tuple[MapLine, ...] = ()

    def where(self, line: MapLine) -> str:
        return f"fine_tune_ckpt_param_map {self.path}:{line.line}"


@dataclass(frozen=True)
class Names:
    """What one side (the model or the checkpoint) holds: {table: kind} and the dense
    ``state_dict`` keys."""

    tables: dict[str, str] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ResolvedMap:
    """A map checked against a model and a checkpoint.

    Attributes:
        prefixes: (model prefix, checkpoint prefix) of dense state keys, longest first.
        tables: {model table: checkpoint table}.
    """

    prefixes: tuple[tuple[str, str], ...] = ()
    tables: dict[str, str] = field(default_factory=dict)

    def prefix_of(self, key: str) -> tuple[str, str] | None:
        """The (model prefix, checkpoint prefix) that maps ``key``, or None."""
        for pair in self.prefixes:
            if under(key, pair[0]):
                return pair
        return None

    def source_key(self, key: str) -> str:
        """The checkpoint key that model key ``key`` reads by a prefix (itself when none
        maps it)."""
        pair = self.prefix_of(key)
        return key if pair is None else pair[1] + key[len(pair[0]):]

    def source_table(self, name: str) -> str:
        """The checkpoint table that model table ``name`` reads."""
        return self.tables.get(name, name)


def under(key: str, prefix: str) -> bool:
    """True when ``key`` is ``prefix`` or lies below it at a ``.`` boundary."""
    return key == prefix or key.startswith(prefix + ".")


def read_param_map(path: str) -> ParamMap:
    """Parses the map file ``path`` (relative to the working directory or absolute).

    Raises:
        CheckpointError: the file is missing or unreadable, a line does not hold two
            names, or a model name is mapped twice; the message names the file and line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CheckpointError(
            f"fine_tune_ckpt_param_map {path} ({os.path.abspath(path)}): cannot be read "
            f"({reason}); give the path of a readable text file, relative to the working "
            f"directory or absolute") from None
    param_map = ParamMap(path)
    lines: list[MapLine] = []
    first: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        names = raw.split("#", 1)[0].split()
        if not names:
            continue
        if len(names) != 2:
            raise CheckpointError(
                f"fine_tune_ckpt_param_map {path}:{number}: expected '<name in this model> "
                f"<name in the checkpoint>', got {raw.strip()!r}")
        line = MapLine(names[0], names[1], number)
        if line.model_name in first:
            raise CheckpointError(
                f"{param_map.where(line)}: {line.model_name!r} is mapped again (first on "
                f"line {first[line.model_name]}); map each name once")
        first[line.model_name] = number
        lines.append(line)
    return ParamMap(path, tuple(lines))


def _some(names: Iterable[str]) -> str:
    names = sorted(names)
    if not names:
        return "none"
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _modules(keys: Iterable[str]) -> list[str]:
    """Module paths of ``keys`` cut at two levels: a hint of which prefixes exist."""
    return sorted({".".join(key.split(".")[:-1][:2]) or key for key in keys})


def _unknown(side: str, name: str, names: Names) -> str:
    return (f"{name!r} is no table of {side} and no prefix of its parameter names (at a "
            f"'.' boundary); its tables: {_some(names.tables)}; its modules include "
            f"{_some(_modules(names.keys))}")


def resolve_param_map(param_map: ParamMap | None, model: Names,
                      checkpoint: Names) -> ResolvedMap:
    """Checks every line of ``param_map`` against both sides.

    Raises:
        CheckpointError: a name unknown on its side, a table mapped to a prefix or to a
            table of another kind; the message names the file and line.
    """
    if param_map is None:
        return ResolvedMap()
    prefixes: list[tuple[str, str]] = []
    tables: dict[str, str] = {}
    for line in param_map.lines:
        ours, theirs = line.model_name, line.checkpoint_name
        where = param_map.where(line)
        if ours in model.tables:
            kind = model.tables[ours]
            if theirs not in checkpoint.tables:
                raise CheckpointError(
                    f"{where}: {ours!r} is a {kind} table of this model but {theirs!r} is no "
                    f"table of the checkpoint; the checkpoint's tables: "
                    f"{_some(checkpoint.tables)}")
            if checkpoint.tables[theirs] != kind:
                raise CheckpointError(
                    f"{where}: {ours!r} is a {kind} table of this model, {theirs!r} a "
                    f"{checkpoint.tables[theirs]} table of the checkpoint; a table maps "
                    f"only to a table of its kind")
            tables[ours] = theirs
            continue
        if not any(under(key, ours) for key in model.keys):
            raise CheckpointError(f"{where}: {_unknown('this model', ours, model)}")
        if not any(under(key, theirs) for key in checkpoint.keys):
            raise CheckpointError(f"{where}: {_unknown('the checkpoint', theirs, checkpoint)}")
        prefixes.append((ours, theirs))
    prefixes.sort(key=lambda pair: len(pair[0]), reverse=True)
    return ResolvedMap(tuple(prefixes), tables)
