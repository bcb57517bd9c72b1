"""Dense tables of one row layout served as one storage: one lookup, one update per step.

Small dense tables (``num_buckets`` features with a few dozen rows) cost a step
far more in per-table launches than in memory traffic. A ``DenseGroup`` puts
the rows of several ``DenseTable`` s with the same dim, optimizer, dtype and
``trainable`` flag into one matrix; every member's ``rows`` buffer becomes a
view of its block, so checkpoints, exports and statistics still see each
table on its own (``DenseTable`` saves a standalone copy of a view). The
collection then reads the group like a fused storage: tag = member index, key =
row of that member, and the group maps (tag, key) to a row of the matrix.

ZCH tables (whose rows are re-initialized on slot reuse) stay on their own.
"""

from __future__ import annotations

import torch

from hashrec.embedding.dense_table import DenseLookup, DenseTable, update_dense_rows
from hashrec.embedding.lookup import Storage
from hashrec.embedding.plan import StoragePlan


class DenseGroup:
    """The rows of several dense tables in one matrix (members' ``rows`` become views).

    Args:
        name: storage name of the group (logs and errors).
        members: the tables, in tag order; same dim, optimizer, dtype and device.
    """

    keys_may_be_negative = False

    def __init__(self, name: str, members: list[DenseTable]) -> None:
        first = members[0]
        for t in members:
            if (t.dim, t.optimizer, t.rows.dtype, t.rows.device) != \
                    (first.dim, first.optimizer, first.rows.dtype, first.rows.device):
                raise ValueError(f"dense table {t.name!r} cannot join group {name!r}: its dim, "
                                 f"optimizer, dtype or device differ from {first.name!r}'s")
        self.name, self.members = name, members
        self.dim, self.optimizer = first.dim, first.optimizer
        self._link()

    def _link(self) -> None:
        """Copies the members' rows into one matrix and makes each member's rows a view."""
        self.rows = torch.cat([t.rows for t in self.members])
        bases, start = [], 0
        for t in self.members:
            t.rows = self.rows[start:start + t.num_rows]
            bases.append(start)
            start += t.num_rows
        self.bases = torch.tensor(bases, dtype=torch.int64, device=self.rows.device)
        self._views = [t.rows for t in self.members]

    def _relink_if_replaced(self) -> None:
        """A member whose ``rows`` tensor was replaced (``load_state_dict(assign=True)``,
        ``.to()`` to another dtype) is joined again, so updates keep reaching it."""
        if any(t.rows is not view for t, view in zip(self.members, self._views)):
            self._link()

    @property
    def step(self) -> int:
        return self.members[0].step

    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None = None,
               train: bool = False, counts: torch.Tensor | None = None) -> DenseLookup:
        """Rows of (tag, key) pairs: keys (u,) ids of member ``tags`` (u,) int32 -> DenseLookup.

        ``slots`` are rows of the group's matrix. ``train`` and ``counts`` are
        accepted for symmetry with ``HashTable.lookup``.
        """
        self._relink_if_replaced()
        slots = keys if tags is None else keys + self.bases.index_select(0, tags)
        return DenseLookup(slots, self.rows.index_select(0, slots)[:, :self.dim].float())

    def apply_gradients(self, slots: torch.Tensor, grads: torch.Tensor,
                        lr: float | None = None) -> None:
        """In-place optimizer update of group rows ``slots`` (u,) unique with grads (u, dim)."""
        self._relink_if_replaced()
        update_dense_rows(self.rows, slots, grads, self.optimizer, lr, self.step)


def group_dense_storages(storages: list[Storage], zch: set[str]) -> list[Storage]:
    """The storages a forward reads: dense tables of one row layout joined into groups.

    Dynamic and ZCH storages, and dense tables without a partner, are returned
    as they are; each group takes the place of its first member. A group's
    ``counters`` are its members' own, so per-table statistics do not change.
    """
    keyed: dict[tuple, list[Storage]] = {}
    for s in storages:
        if not s.plan.is_dynamic and s.name not in zch:
            t = s.table
            keyed.setdefault((t.dim, t.optimizer, t.rows.dtype, s.plan.trainable), []).append(s)
    groups = {id(members[0]): members for members in keyed.values() if len(members) > 1}
    grouped = {id(s) for members in groups.values() for s in members}
    out = []
    for s in storages:
        if id(s) in groups:
            members = groups[id(s)]
            name = "dense_group:" + ",".join(m.name for m in members)
            plan = StoragePlan(name, tuple(m.plan.tables[0] for m in members), None, True)
            unit = Storage(plan, DenseGroup(name, [m.table for m in members]))
            unit.counters = [m.counters[0] for m in members]
            out.append(unit)
        elif id(s) not in grouped:
            out.append(s)
    return out
