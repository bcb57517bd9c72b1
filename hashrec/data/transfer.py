"""Hand parsed batches from DataLoader workers to the main process in reused shared buffers.

Pickling a :class:`Batch` the default way moves every tensor into a fresh
shared-memory segment: allocated, zero-filled and faulted in by the worker,
its file descriptor passed over a socket handshake, then mapped and faulted
in again by the receiver, once per tensor and batch. Here a worker packs all
tensors of a batch into one *slot* of a small ring of shared buffers that it
reuses, and sends the slot's key with a description of the batch. The slot's
file descriptor travels only until the receiver has mapped it; the receiver
keeps the mapping, copies each batch's bytes out at once (into pinned memory
when the loader pins), so the Batch it hands on never aliases the slot, and
marks the slot free again.

A slot starts with three header words, each written by one side only:
``busy`` (the sender sets it when it packs a batch, the receiver clears it
after the copy), ``mapped`` (the receiver holds a mapping) and ``retired``
(the sender will not send again; the receiver may then drop its mapping).
A sender never waits for a slot: when none is free it packs into a one-off
buffer that travels with its descriptor. The KeyedJaggedTensor's host layout
is computed by the sender, so the receiver runs no tensor arithmetic.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.features.batch import Batch

_HEADER = 64      # bytes before a slot's payload (header words, then padding)
_BUSY, _MAPPED, _RETIRED = 0, 1, 2
_ALIGN = 64       # payload offset alignment of every tensor
_SWEEP_EVERY = 64  # receives between sweeps for retired slots


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lies in a packed payload: byte ``offset``, ``dtype``, ``shape``,
    size ``nbytes``."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class BatchLayout:
    """Everything of a Batch except its tensors' bytes.

    Attributes:
        keys: KeyedJaggedTensor keys.
        sparse: specs of the values, lengths and weights (None when unweighted).
        jagged_layout: the KeyedJaggedTensor's host layout (value bounds, longest bags).
        dense, sequence_dense, labels: (name, spec) pairs in the Batch's order.
        batch_size: rows.
        nbytes: payload size.
        negatives: sampled negative rows after the batch's rows.
        hard_negatives: the spec of the hard-negative mask (None without one).
    """

    keys: tuple[str, ...]
    sparse: tuple[TensorSpec | None, ...]
    jagged_layout: tuple[list[int], list[int]]
    dense: tuple[tuple[str, TensorSpec], ...]
    sequence_dense: tuple[tuple[str, TensorSpec], ...]
    labels: tuple[tuple[str, TensorSpec], ...]
    batch_size: int
    nbytes: int
    negatives: int = 0
    hard_negatives: TensorSpec | None = None

    def specs(self) -> list[TensorSpec]:
        """Specs of every packed tensor, in payload order."""
        named = [s for group in (self.dense, self.sequence_dense, self.labels) for _, s in group]
        hard = [self.hard_negatives] if self.hard_negatives is not None else []
        return [s for s in self.sparse if s is not None] + named + hard


def plan(batch: Batch) -> tuple[BatchLayout, list[torch.Tensor]]:
    """The payload layout of ``batch`` and its tensors in payload order.

    The KeyedJaggedTensor's offsets are not packed: with the host layout known,
    the receiver's copy computes them only where they are used (on the device).
    """
    tensors: list[torch.Tensor] = []
    end = 0

    def place(tensor: torch.Tensor | None) -> TensorSpec | None:
        nonlocal end
        if tensor is None:
            return None
        spec = TensorSpec(end, tensor.dtype, tuple(tensor.shape),
                          tensor.numel() * tensor.element_size())
        tensors.append(tensor)
        end += -(-spec.nbytes // _ALIGN) * _ALIGN
        return spec

    kjt = batch.sparse
    sparse = tuple(place(t) for t in (kjt.values(), kjt.lengths(), kjt.weights_or_none()))
    groups = [tuple((name, place(t)) for name, t in group.items())
              for group in (batch.dense, batch.sequence_dense, batch.labels)]
    hard = place(batch.hard_negatives)
    layout = BatchLayout(tuple(kjt.keys()), sparse, _jagged_layout(kjt), *groups,
                         batch.batch_size, end, batch.negatives, hard)
    return layout, tensors


def _jagged_layout(kjt: KeyedJaggedTensor) -> tuple[list[int], list[int]]:
    # The KeyedJaggedTensor computes and caches its host layout on first use
    # (pin_memory and to() carry it along); computing it here keeps that work
    # in the worker.
    return kjt.host_layout()


def _view(buffer: torch.Tensor, spec: TensorSpec | None) -> torch.Tensor | None:
    if spec is None:
        return None
    return buffer[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).view(spec.shape)


def unpack(buffer: torch.Tensor, layout: BatchLayout, reserved: dict | None = None) -> Batch:
    """The Batch whose tensors are views of ``buffer`` (a uint8 payload laid out as
    ``layout``); it is ``packed``, so moving it to a device copies ``buffer`` once."""
    values, lengths, weights = (_view(buffer, s) for s in layout.sparse)
    kjt = KeyedJaggedTensor(list(layout.keys), values, lengths, weights, validate=False)
    kjt.set_host_layout(layout.jagged_layout)  # the sender's, from the same tensors
    group = lambda pairs: {name: _view(buffer, spec) for name, spec in pairs}  # noqa: E731
    return Batch(kjt, group(layout.dense), group(layout.sequence_dense), group(layout.labels),
                 layout.batch_size, reserved or {}, negatives=layout.negatives,
                 hard_negatives=_view(buffer, layout.hard_negatives),
                 packed=(buffer, functools.partial(unpack, layout=layout, reserved=reserved)))


class _Slot:
    """One shared buffer: header words, then the payload."""

    def __init__(self, capacity: int) -> None:
        storage = torch.UntypedStorage._new_shared(_HEADER + capacity)
        self.tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.array = self.tensor.numpy()
        self.words = self.array[:_HEADER].view(np.int64)
        self.words[:] = 0
        self.capacity = capacity

    def retire(self) -> None:
        self.words[_RETIRED] = 1


class BatchSender:
    """Worker side: packs batches into a reused ring of shared slots.

    Args:
        pin: the receiver copies batches into pinned memory.
        max_slots: slots kept for reuse (more batches in flight use one-off buffers).
    """

    def __init__(self, pin: bool = False, max_slots: int = 8) -> None:
        self.pin = pin
        self.max_slots = max_slots
        self.token = int.from_bytes(os.urandom(8), "little") >> 1
        self._slots: list[_Slot] = []

    def _slot(self, nbytes: int) -> tuple[int, _Slot]:
        """A free slot of at least ``nbytes`` (index -1: a one-off buffer)."""
        free = [i for i, s in enumerate(self._slots) if s.words[_BUSY] == 0]
        for i in free:
            if self._slots[i].capacity >= nbytes:
                return i, self._slots[i]
        capacity = nbytes + nbytes // 4  # headroom: later batches may be a little larger
        if len(self._slots) < self.max_slots:
            self._slots.append(_Slot(capacity))
            return len(self._slots) - 1, self._slots[-1]
        if free:  # replace a free slot that is too small
            self._slots[free[0]].retire()
            self._slots[free[0]] = _Slot(capacity)
            return free[0], self._slots[free[0]]
        return -1, _Slot(nbytes)

    def pack(self, batch: Batch) -> PackedBatch:
        """Copy ``batch`` into a slot; the result pickles as the slot's key plus the layout."""
        layout, tensors = plan(batch)
        index, slot = self._slot(layout.nbytes)
        for spec, tensor in zip(layout.specs(), tensors):
            start = _HEADER + spec.offset
            # numpy copies on this thread alone (torch may fan a large copy out to threads)
            slot.array[start:start + spec.nbytes] = tensor.numpy().reshape(-1).view(np.uint8)
        slot.words[_BUSY] = 1
        mapped = index >= 0 and slot.words[_MAPPED] == 1
        return PackedBatch(None if mapped else slot.tensor,
                           (self.token, index) if index >= 0 else None, layout, self.pin,
                           batch.reserved)

    def close(self) -> None:
        """Retire every slot: no batch follows, the receiver may drop its mappings."""
        for slot in self._slots:
            slot.retire()
        self._slots = []


class PackedBatch:
    """A batch in a shared slot; unpickling it yields the :class:`Batch` (see :func:`receive`).

    Args:
        slot: the slot's uint8 tensor, or None when the receiver has it mapped.
        key: (sender token, slot index); None for a one-off buffer.
        layout: the payload layout.
        pin: copy into pinned memory.
        reserved: ``Batch.reserved`` (pickled as is).
    """

    def __init__(self, slot: torch.Tensor | None, key: tuple[int, int] | None,
                 layout: BatchLayout, pin: bool, reserved: dict) -> None:
        self.slot, self.key, self.layout, self.pin, self.reserved = slot, key, layout, pin, \
            reserved

    def __reduce__(self):
        return receive, (self.slot, self.key, self.layout, self.pin, self.reserved)


class _Mappings:
    """Receiver side: slots it holds mapped, by key; retired free slots are dropped."""

    def __init__(self) -> None:
        self._slots: dict[tuple[int, int], torch.Tensor] = {}
        self._lock = threading.Lock()  # a train and an eval loader may receive at once
        self._receives = 0

    def get(self, slot: torch.Tensor | None, key: tuple[int, int] | None) -> torch.Tensor:
        if key is None:
            return slot
        with self._lock:
            self._receives += 1
            if self._receives % _SWEEP_EVERY == 0:
                self._drop_retired()
            if slot is None:
                return self._slots[key]
            self._slots[key] = slot
        slot.numpy()[:_HEADER].view(np.int64)[_MAPPED] = 1
        return slot

    def drop_retired(self) -> None:
        """Drop the mappings of slots whose sender retired them (and that hold no batch)."""
        with self._lock:
            self._drop_retired()

    def _drop_retired(self) -> None:
        for key, slot in list(self._slots.items()):
            words = slot.numpy()[:_HEADER].view(np.int64)
            if words[_RETIRED] and not words[_BUSY]:
                del self._slots[key]

    def __len__(self) -> int:
        return len(self._slots)


_mappings = _Mappings()


def receive(slot: torch.Tensor | None, key: tuple[int, int] | None, layout: BatchLayout,
            pin: bool, reserved: dict) -> Batch:
    """Receiver side: copy a slot's payload out, free the slot, return the Batch."""
    source = _mappings.get(slot, key).numpy()
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=pin)
    np.copyto(buffer.numpy(), source[_HEADER:_HEADER + layout.nbytes])
    source[:_HEADER].view(np.int64)[_BUSY] = 0
    return unpack(buffer, layout, reserved)
