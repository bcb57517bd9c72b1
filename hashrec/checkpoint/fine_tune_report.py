"""The one summary a fine-tune restore logs: what came from the checkpoint, what starts fresh.

Parts are modules (a layer's own parameters and buffers, named by module path) and
tables (named as feature configs name them). Module paths restored or fresh alike
are shortened to the highest module all of whose parts share that fate
(``towers.deep`` rather than its three layers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Outcome:
    """What a fine-tune restore made of one kind of part (modules, or tables).

    Attributes:
        restored: parts read under their own name.
        renamed: {name in this model: name in the checkpoint} of the map lines (module
            prefixes) or tables that restored something.
        missing: parts the checkpoint lacks; they keep their fresh initialization.
        differs: {part: why} of parts the checkpoint holds in another shape or kind;
            they keep their fresh initialization too.
        unused: parts of the checkpoint that nothing of the model read.
    """

    restored: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    differs: dict[str, str] = field(default_factory=dict)
    unused: list[str] = field(default_factory=list)

    def merge(self, other: Outcome) -> Outcome:
        return Outcome(self.restored + other.restored, {**self.renamed, **other.renamed},
                       self.missing + other.missing, {**self.differs, **other.differs},
                       self.unused + other.unused)

    @property
    def all_restored(self) -> bool:
        return not (self.missing or self.differs or self.unused)


def collapse(names: Iterable[str], universe: Iterable[str]) -> list[str]:
    """The shortest module paths that cover ``names`` and no other path of ``universe``.

    Example::

        collapse(["a.x.0", "a.x.1", "b.0"], ["a.x.0", "a.x.1", "a.y", "b.0", "b.1"])
        == ["a.x", "b.0"]
    """
    chosen = set(names)
    universe = set(universe) | chosen

    def covered(prefix: str) -> bool:
        return all(name in chosen for name in universe
                   if name == prefix or name.startswith(prefix + "."))

    tops = set()
    for name in chosen:
        top = name
        while "." in top and covered(top.rsplit(".", 1)[0]):
            top = top.rsplit(".", 1)[0]
        tops.add(top)
    return sorted(t for t in tops if not any(t.startswith(o + ".") for o in tops))


def _phrase(modules: list[str], tables: list[str]) -> str:
    parts = list(modules)
    if tables:
        parts.append(("table " if len(tables) == 1 else "tables ") + ", ".join(tables))
    return ", ".join(parts)


def summary(path: str, modules: Outcome, tables: Outcome, model_modules: Iterable[str],
            saved_modules: Iterable[str]) -> tuple[int, str]:
    """(log level, message): INFO when the checkpoint restored all of the model and held
    nothing else, WARNING otherwise.

    Args:
        path: the checkpoint.
        modules, tables: the outcomes of the model's modules and of its tables.
        model_modules, saved_modules: every module part of the model, of the checkpoint.
    """
    model_modules, saved_modules = list(model_modules), list(saved_modules)
    sections = []
    renamed = [f"{ours} (from {theirs})" for ours, theirs in sorted(modules.renamed.items())]
    renamed_tables = [f"{ours} (from {theirs})"
                      for ours, theirs in sorted(tables.renamed.items())]
    restored = _phrase(collapse(modules.restored, model_modules) + renamed,
                       sorted(tables.restored) + renamed_tables)
    sections.append(f"restored {restored or 'nothing'}")
    missing = _phrase(collapse(modules.missing, model_modules), sorted(tables.missing))
    if missing:
        sections.append(f"start fresh, not in the checkpoint: {missing}")
    differs = [f"{name} ({why})" for name, why in sorted(modules.differs.items())]
    differs += [f"table {name} ({why})" for name, why in sorted(tables.differs.items())]
    if differs:
        sections.append(f"start fresh, shape or kind differs: {', '.join(differs)}")
    unused = _phrase(collapse(modules.unused, saved_modules), sorted(tables.unused))
    if unused:
        sections.append(f"in the checkpoint but read by nothing: {unused}")
    level = logging.INFO if modules.all_restored and tables.all_restored else logging.WARNING
    return level, f"fine-tune start from {path}: {'; '.join(sections)}"
