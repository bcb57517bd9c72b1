"""rehash: move every entry into a storage with more buckets (growth)."""

from hashrec.table.ops.rehash.reference import rehash

__all__ = ["rehash"]
