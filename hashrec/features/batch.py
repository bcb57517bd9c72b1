"""One training/eval batch as the model sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hashrec.embedding.jagged import KeyedJaggedTensor


@dataclass
class Batch:
    """Tensors parsed from one block of input rows.

    Attributes:
        sparse: ids of every embedded feature (id, bucketized raw, combo and
            sequence id features), keyed by feature name. Sequence features'
            bags are the (truncated) sequences.
        dense: raw features without boundaries: name -> (B, value_dim) float32.
        sequence_dense: raw sequence sub-features without boundaries:
            name -> (B, L, value_dim) float32, zero padded.
        labels: label field -> (B,) float32.
        batch_size: B, the input rows.
        negatives: N, the rows of sampled negative items after the B rows in ``sparse``,
            ``dense`` and ``sequence_dense`` (a match model's ``negative_sampler``; their
            other features are empty or default); 0 without a sampler.
        hard_negatives: (B, H) bool of a hard-negative sampler's batch: which of each
            row's H hard-negative slots hold an item (row i's slot j is negative row
            ``negatives - B * H + i * H + j``); None without hard negatives.
        reserved: untouched input columns kept for prediction output
            (pyarrow arrays by column name), empty during training.
        packed: ``(buffer, rebuild)`` when every tensor is a view of the uint8
            ``buffer`` (batches from the loader's workers are): ``rebuild(copy)``
            gives this batch over a copy of the buffer, so ``to`` moves one buffer
            instead of each tensor (so a packed batch's tensors are not to be
            replaced). None otherwise.
    """

    sparse: KeyedJaggedTensor
    dense: dict[str, torch.Tensor] = field(default_factory=dict)
    sequence_dense: dict[str, torch.Tensor] = field(default_factory=dict)
    labels: dict[str, torch.Tensor] = field(default_factory=dict)
    batch_size: int = 0
    reserved: dict = field(default_factory=dict)
    packed: tuple | None = field(default=None, repr=False, compare=False)
    negatives: int = 0
    hard_negatives: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """This batch on ``device``: itself when every tensor is already there (so a
        batch prepared ahead, ``EmbeddingCollection.prepare``, stays the same object).
        A packed batch moves in one copy."""
        if self.packed is not None:
            buffer, rebuild = self.packed
            moved = buffer.to(device, non_blocking=non_blocking)
            return self if moved is buffer else rebuild(moved)
        groups = (self.dense, self.sequence_dense, self.labels)
        moved = [{k: v.to(device, non_blocking=non_blocking) for k, v in d.items()}
                 for d in groups]
        sparse = self.sparse.to(device, non_blocking)
        hard = self.hard_negatives
        if hard is not None:
            hard = hard.to(device, non_blocking=non_blocking)
        if sparse is self.sparse and hard is self.hard_negatives and \
                all(m[k] is d[k] for m, d in zip(moved, groups) for k in d):
            return self
        return Batch(sparse, *moved, self.batch_size, self.reserved, negatives=self.negatives,
                     hard_negatives=hard)

    def pin_memory(self) -> Batch:
        """This batch in pinned memory: itself when it already is (a packed batch whose
        buffer is pinned stays packed)."""
        if self.packed is not None:
            buffer, rebuild = self.packed
            return self if buffer.is_pinned() else rebuild(buffer.pin_memory())
        pin = lambda d: {k: v.pin_memory() for k, v in d.items()}  # noqa: E731
        hard = self.hard_negatives
        return Batch(self.sparse.pin_memory(), pin(self.dense), pin(self.sequence_dense),
                     pin(self.labels), self.batch_size, self.reserved,
                     negatives=self.negatives,
                     hard_negatives=None if hard is None else hard.pin_memory())
