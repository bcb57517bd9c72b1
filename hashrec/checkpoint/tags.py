"""Which logical table each tag of a fused dynamic storage holds, and remapping on restore.

Dynamic tables of one fusion group share a storage; an entry's tag is the
position of its table in that storage, which follows the order of the
feature configs. A checkpoint records the table names in tag order
(``tag_tables`` in meta.json and in each shard header), so that a config whose
features were reordered, added or removed still reads every table's own rows:
restore maps each saved tag to the tag the same table has now. Checkpoints
written before the record existed load tag for tag, as they always did.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hashrec.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

TAG_TABLES = "tag_tables"


def model_tag_tables(model: Any) -> dict[str, list[str]]:
    """{storage name: logical table names in tag order} of a model's embedding collection.

    Models without an ``embedding`` that reports ``table_locations()`` give {}.
    """
    embedding = getattr(model, "embedding", None)
    locations = getattr(embedding, "table_locations", None)
    if locations is None:
        return {}
    by_storage: dict[str, dict[int, str]] = {}
    for table, (storage, tag) in locations().items():
        by_storage.setdefault(storage, {})[int(tag)] = table
    return {storage: [tags[t] for t in sorted(tags)] for storage, tags in by_storage.items()}


def tag_remap(where: str, saved: list[str] | None, current: list[str] | None,
              elsewhere: frozenset[str] = frozenset()) -> torch.Tensor | None:
    """Saved tag -> current tag (-1: the table is no longer in the storage), or None
    when the tags are to be loaded as they are (same order, or either side unknown).

    Args:
        where: the storage and file, for log messages and errors.
        saved: table names in tag order as the checkpoint recorded them.
        current: table names in tag order in the model.
        elsewhere: tables the model holds in another storage, restored there.

    Raises:
        CheckpointError: a recorded name appears twice (a damaged record).
    """
    if saved is None or current is None or list(saved) == list(current):
        return None
    if len(set(saved)) != len(saved):
        raise CheckpointError(f"{where}: {TAG_TABLES} {saved} names a table twice")
    position = {name: tag for tag, name in enumerate(current)}
    remap = torch.tensor([position.get(name, -1) for name in saved], dtype=torch.int32)
    moved = [name for name in saved if name not in position and name in elsewhere]
    dropped = [name for name in saved if name not in position and name not in elsewhere]
    added = [name for name in current if name not in set(saved)]
    # A reorder alone loses nothing; a table dropped or added is worth a warning.
    level = logging.WARNING if dropped or added else logging.INFO
    logger.log(
        level, "%s: tables in tag order were %s when saved and are %s now; rows are "
        "restored by table name%s%s%s", where, list(saved), list(current),
        f"; restored into another storage: {moved}" if moved else "",
        f"; not in the model, skipped: {dropped}" if dropped else "",
        f"; not in the checkpoint, start empty: {added}" if added else "")
    return remap


def remap_chunk(chunk: dict[str, torch.Tensor], remap: torch.Tensor | None
                ) -> dict[str, torch.Tensor]:
    """A chunk with ``tags`` rewritten by ``remap`` and entries of dropped tables removed."""
    if remap is None:
        return chunk
    tags = chunk["tags"].long()
    known = (tags >= 0) & (tags < remap.shape[0])
    new_tags = torch.full_like(chunk["tags"], -1)
    new_tags[known] = remap[tags[known]].to(chunk["tags"].dtype)
    keep = new_tags >= 0
    out = {name: value[keep] for name, value in chunk.items() if name != "tags"}
    out["tags"] = new_tags[keep]
    return out
