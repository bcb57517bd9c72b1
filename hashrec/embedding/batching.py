"""From KeyedJaggedTensor bags to one deduplicated key set per storage.

Every feature that reads a storage (directly, through ``embedding_name``
sharing, or as a sequence sub-feature of a shared table) contributes its ids;
the ids of each logical table are deduplicated together, the unique keys of all
logical tables of a storage are concatenated with their tags, and each feature
keeps the ``inverse`` index from its ids to the unique rows. One lookup per
storage then serves all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.jagged import JaggedTensor
from hashrec.embedding.specs import EmbeddingFeatureSpec


@dataclass
class FeatureIds:
    """The ids one feature reads this batch (sequences already truncated).

    Attributes:
        spec: the feature.
        values: (n,) int64 ids, bag-major.
        offsets: (B + 1,) int64 bag boundaries in ``values``.
        lengths: (B,) int64 bag sizes.
        weights: (n,) float32 per-id weights of weighted features, else None.
        inverse: (n,) int64 row of each id in the storage's unique keys (set by
            ``dedup_storage``).
    """

    spec: EmbeddingFeatureSpec
    values: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None
    inverse: torch.Tensor | None = None


@dataclass
class StorageBatch:
    """Unique keys of one storage and the features they serve.

    Attributes:
        keys: (U,) int64 unique keys, logical table by logical table.
        tags: (U,) int32 tag of each key (fused storages), else None.
        features: the features' ids, each with its ``inverse`` set.
        counts: (U,) int64 occurrences of each unique key in the batch.
        unique_per_table: number of unique keys of each logical table, by tag.
    """

    keys: torch.Tensor
    tags: torch.Tensor | None
    counts: torch.Tensor
    features: list[FeatureIds]
    unique_per_table: list[int]


def feature_ids(spec: EmbeddingFeatureSpec, bags: JaggedTensor) -> FeatureIds:
    """Collects one feature's ids; sequence features keep their first ``max_length`` ids.

    Raises:
        EmbeddingError: a weighted feature without weights, or ids that are not integers.
    """
    values, lengths, offsets = bags.values, bags.lengths, bags.offsets
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise EmbeddingError(f"feature {spec.name!r}: ids must be integers, got {values.dtype}")
    values = values.to(torch.int64)
    weights = None
    if spec.weighted and not spec.is_sequence:
        if bags.weights is None:
            raise EmbeddingError(
                f"feature {spec.name!r} is weighted but the KeyedJaggedTensor has no weights")
        weights = bags.weights.to(torch.float32)
    # Truncation needs a mask whose size only the device knows; skip it when the
    # host already knows that no bag is longer than max_length.
    if spec.is_sequence and (bags.max_bag is None or bags.max_bag > spec.max_length):
        kept = lengths.clamp(max=spec.max_length)
        position = torch.arange(values.numel(), device=values.device) - \
            offsets[:-1].repeat_interleave(lengths, output_size=values.numel())
        values = values[position < spec.max_length]
        lengths = kept
        offsets = torch.zeros_like(offsets)
        torch.cumsum(lengths, 0, out=offsets[1:])
    return FeatureIds(spec, values, offsets, lengths, weights)


def dedup_storage(features_by_tag: list[list[FeatureIds]], fused: bool) -> StorageBatch:
    """Deduplicates ids per logical table and sets each feature's ``inverse``.

    Args:
        features_by_tag: for each logical table of the storage (index = tag), the
            features reading it this batch.
        fused: pass tags to the storage (True) or not (one logical table, tag 0).
    """
    keys, tags, counts, unique_per_table, base = [], [], [], [], 0
    for tag, features in enumerate(features_by_tag):
        if not features:
            unique_per_table.append(0)
            continue
        ids = torch.cat([f.values for f in features])
        unique, inverse, count = torch.unique(ids, sorted=True, return_inverse=True,
                                              return_counts=True)
        start = 0
        for f in features:
            f.inverse = inverse[start:start + f.values.numel()] + base
            start += f.values.numel()
        keys.append(unique)
        counts.append(count)
        if fused:
            tags.append(torch.full_like(unique, tag, dtype=torch.int32))
        unique_per_table.append(unique.numel())
        base += unique.numel()
    every = [f for fs in features_by_tag for f in fs]
    empty = torch.empty(0, dtype=torch.int64, device=every[0].values.device)
    return StorageBatch(torch.cat(keys) if keys else empty,
                        torch.cat(tags) if fused and tags else None,
                        torch.cat(counts) if counts else empty, every, unique_per_table)
