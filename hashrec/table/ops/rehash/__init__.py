"""rehash: move every entry into a storage with more buckets (growth)."""

from __future__ import annotations

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.rehash import reference
from hashrec.table.storage import TableStorage


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """A storage with ``num_buckets`` buckets (at least ``storage``'s) holding its entries:
    every one where the count is a multiple, else each new bucket's highest-scored ones
    that fit (see ``reference``)."""
    return backend(__name__, reference, storage.device).rehash(storage, num_buckets)


__all__ = ["rehash"]
