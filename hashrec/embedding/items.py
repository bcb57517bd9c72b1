"""Multi-value sequences: an item of several ids is one bag, pooled, then padded.

A sequence whose items hold several ids (an id sequence's ``value_dim`` 0,
``EmbeddingFeatureSpec.multi_value``) reaches the collection as two keys: its own, whose
bags hold every id of a row's items, and ``items_key`` of it, whose bags hold each item's
number of ids. Its ids are embedded as a bag feature with one bag per item (the pooled
path, ``pooling`` sum or mean, on every backend and table kind), and ``pad_items`` lays
the (m, D) item embeddings out as the (B, max_length, D) sequence. Both steps keep the
shapes the host knows (m, the items, is the size of the item-sizes tensor): no device
value is read on the host.
"""

from __future__ import annotations

import dataclasses

import torch

from hashrec.embedding.batching import FeatureIds, feature_ids
from hashrec.embedding.jagged import JaggedTensor
from hashrec.embedding.specs import EmbeddingFeatureSpec


def item_bag_ids(spec: EmbeddingFeatureSpec, ids: JaggedTensor, items: JaggedTensor
                 ) -> FeatureIds:
    """A multi-value sequence's ids as a bag feature of one bag per item; its
    ``item_rows`` (B,) are the items of each row.

    Args:
        spec: the sequence (``multi_value``).
        ids: its key's bags: every id of each row's items, item by item.
        items: its ``items_key`` bags: each item's number of ids, row by row.

    The item sizes sum to the ids (the feature layer builds them so); they are not read
    here, which would cost a device read per step.
    """
    sizes = items.values.to(torch.int64)
    offsets = torch.zeros(sizes.numel() + 1, dtype=torch.int64, device=sizes.device)
    torch.cumsum(sizes, 0, out=offsets[1:])
    bags = JaggedTensor(ids.values, sizes, offsets)
    pooled = dataclasses.replace(spec, is_sequence=False, max_length=0, multi_value=False)
    out = feature_ids(pooled, bags)
    out.item_rows = items.lengths.to(torch.int64)
    return out


def pad_items(pooled: torch.Tensor, item_rows: torch.Tensor, max_length: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Item embeddings (m, D), row by row, -> ((B, max_length, D) zero padded, lengths (B,)).

    A row of more than ``max_length`` items keeps its first ``max_length`` (the feature
    layer truncates before, so none has more). Differentiable in ``pooled``.

    Example::

        pad_items(torch.ones(3, 2), torch.tensor([2, 0, 1]), 2)[1]  # tensor([2, 0, 1])
    """
    batch, m = item_rows.numel(), pooled.shape[0]
    starts = torch.cumsum(item_rows, 0) - item_rows
    row = torch.repeat_interleave(torch.arange(batch, device=pooled.device), item_rows,
                                  output_size=m)
    position = torch.arange(m, device=pooled.device) - starts[row]
    # items past max_length land in a spare slot per row, dropped below: no mask to read
    slot = row * (max_length + 1) + position.clamp(max=max_length)
    out = pooled.new_zeros(batch * (max_length + 1), pooled.shape[1]).index_add(0, slot, pooled)
    padded = out.view(batch, max_length + 1, -1)[:, :max_length].contiguous()
    return padded, item_rows.clamp(max=max_length)
