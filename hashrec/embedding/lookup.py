"""One lookup per storage per step, and the sparse update in backward.

``lookup_rows`` returns the unique rows (U, dim) of a storage as the output of
an autograd Function. Pooling and padding index these rows; their backward
(``hashrec.embedding.emit``) reduces gradients per unique row, so this
Function's backward receives exactly one gradient row per unique key and applies
the sparse optimizer in place: ``apply_gradients`` on the rows that are stored
(slot >= 0; keys awaiting admission, refused or missing in eval get no update).
No gradient flows to any parameter.

Because the update happens inside backward, running backward twice over the
same graph (``retain_graph=True``) applies the update twice.

A dynamic table on the Triton path can leave the rows of keys it stored before the
call out of the lookup (``stored_rows=False``): the caller then reads them from the
table by slot (``hashrec.embedding.emit.TableRows``), and the lookup's rows hold the
others only.

A storage's ``backward_timer`` (None by default; any object with a
``region()`` context, e.g. the trainer's step timer) times its backward node:
the sparse update, and under several ranks the gradient exchange.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from hashrec.embedding.plan import StoragePlan
from hashrec.embedding.stats import TableCounters
from hashrec.table import HashTable


class Storage:
    """A built storage: the table object, its plan and the learning rate in use.

    Attributes:
        plan: which logical tables the storage serves.
        table: ``HashTable`` (dynamic) or ``DenseTable``; both offer ``lookup``,
            ``apply_gradients``, ``advance_step``, ``memory_bytes`` and ``stats``.
        lr: learning-rate override for the sparse optimizer (None: the spec's lr).
        counters: per logical table (index = tag), what the collection looked up.
        backward_timer: times the storage's backward node when set (see the module).
    """

    def __init__(self, plan: StoragePlan, table: nn.Module | object) -> None:
        self.plan, self.table, self.lr = plan, table, None
        self.counters = [TableCounters() for _ in plan.tables]
        self.backward_timer = None

    def backward_region(self):
        """Context around this storage's backward work (timed when a timer is set)."""
        timer = self.backward_timer
        return contextlib.nullcontext() if timer is None else timer.region()

    @property
    def name(self) -> str:
        return self.plan.name

    def changes_in(self, training: bool) -> bool:
        """Whether lookups in this mode may change the table (insert, admit, evict,
        update scores): training lookups of a trainable storage. A frozen storage
        (``trainable`` false) is read as in evaluation: its keys and rows stay as
        loaded, and keys it lacks read the eval initializer."""
        return training and self.plan.trainable

    def skips_stored_rows(self) -> bool:
        """Whether a lookup may leave stored rows out for reading by slot: a dynamic
        table whose rows all lie in ``storage.values`` and whose lookups run the Triton
        kernels."""
        table = self.table
        return isinstance(table, HashTable) and table._fixed_path()

    def apply_gradients(self, slots: torch.Tensor, grads: torch.Tensor,
                        version: int | None = None) -> None:
        """Updates rows ``slots`` (U,) with per-unique-key grads (U, dim); -1 slots are
        skipped. ``version``: a dynamic table's ``LookupResult.version`` of the lookup
        that gave the slots; the table refuses them (TableError) if it grew since."""
        if not self.plan.trainable:
            return
        # Negative slots (keys not stored, ids without a ZCH slot) are the tables' to
        # skip: on the device they do so without a host read.
        if slots.numel():
            extra = {"version": version} if version is not None else {}
            self.table.apply_gradients(slots, grads.float().contiguous(), lr=self.lr,
                                       **extra)


class _StorageLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, storage, keys, tags, counts, train, extra):  # noqa: D102
        result = storage.table.lookup(keys, tags=tags, train=train, counts=counts, **extra)
        ctx.storage = storage
        # A later training lookup before this backward can grow the table and move
        # every slot (two forwards, then one backward): the version makes that an error
        # instead of updates to whichever keys hold these slots now.
        ctx.version = result.version if isinstance(storage.table, HashTable) else None
        ctx.save_for_backward(result.slots)
        ctx.mark_non_differentiable(result.slots)
        return result.values.float(), result.slots

    @staticmethod
    def backward(ctx, grad_rows, grad_slots):  # noqa: D102
        (slots,) = ctx.saved_tensors
        with ctx.storage.backward_region():
            ctx.storage.apply_gradients(slots, grad_rows, ctx.version)
        return None, None, None, None, None, None, None


def lookup_rows(storage: Storage, keys: torch.Tensor, tags: torch.Tensor | None,
                counts: torch.Tensor, train: bool, stored_rows: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Looks up unique ``keys`` (U,) once: -> (rows (U, dim) float32, slots (U,) int64).

    ``counts`` (U,) int64 are the keys' occurrences in the batch (admission and LFU
    count by multiplicity). ``stored_rows`` False (only where ``skips_stored_rows``):
    the rows of keys stored before the call are undefined; read them from the table by
    slot.

    ``train``: the collection's mode; a frozen storage is looked up as in evaluation
    (``Storage.changes_in``). ``rows`` requires grad when grad mode is on and the
    storage is trainable; its backward applies the sparse optimizer to the storage.
    """
    extra = {} if stored_rows else {"stored_rows": False}
    train = storage.changes_in(train)
    anchor = None
    if torch.is_grad_enabled() and storage.plan.trainable:
        anchor = torch.empty(0, device=keys.device, requires_grad=True)
    if anchor is None:
        result = storage.table.lookup(keys, tags=tags, train=train, counts=counts, **extra)
        return result.values.float(), result.slots
    return _StorageLookup.apply(anchor, storage, keys, tags, counts, train, extra)
