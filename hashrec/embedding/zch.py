"""Zero-collision hashing (ZCH): raw ids remapped into the rows of a fixed-size table.

A ZCH table is a dense table of ``zch_size`` rows plus a :class:`ZchRemapper`
that gives every admitted raw id a slot (a row) of its own, so no two ids share
an embedding. Per slot it keeps the raw id, an access count and the step of the
last access; the eviction policy turns these into the slot's score:

* ``LFU``: the access count;
* ``LRU``: the step of the last access (``decay_exponent`` does not change the order);
* ``DISTANCE_LFU``: ``count / (1 + step - last_step) ** decay_exponent``.

Training forwards (one per step):

1. ids holding a slot map to it and update its count and last step;
2. new ids take free slots right away (most frequent in the batch first, ties by
   smaller id);
3. the other new ids wait in a pending list of at most ``zch_size`` candidates
   with their counts and last step;
4. every ``eviction_interval`` steps the candidates compete with the held slots:
   the i-th best candidate takes the i-th lowest-scoring slot if its score is
   strictly higher; the pending list is then cleared. The rows of reassigned
   slots are re-initialized by the caller.

Ids without a slot (waiting, or unseen in eval) map to -1 and read as zeros;
they receive no gradient. The remapper's state (slot ids, counts, last steps,
pending candidates, step) lives in registered buffers, so it travels in the
model's ``state_dict`` and therefore in checkpoints.

Progress counters (``counters``, cumulative since the remapper was built, not in the
state_dict, as a dynamic table's): ``assigned`` ids given a row (a free one or, at an
eviction round, a held one), ``evictions`` rows given to another id at eviction rounds,
``without_row`` unique ids of a training step left without a row (read as zeros),
``hits`` unique ids that held a row, ``lookups`` unique ids, and ``size`` / ``capacity``.

Several ranks: the table and its remapper are replicated. In training every rank
remaps the ids of the whole global batch, in rank order (the embedding
collection all-gathers them), so the replicas count, assign and evict exactly as
one process reading the global batch would; rows re-initialized by an eviction
are rank 0's, broadcast. Evaluation maps each rank's own ids (read-only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

ZCH_POLICIES = ("LFU", "LRU", "DISTANCE_LFU")


@dataclass(frozen=True)
class ZchOptions:
    """Options of one ZCH table.

    Attributes:
        zch_size: rows of the table (slots of the remapper).
        eviction_interval: training steps between two evictions (>= 1).
        policy: LFU | LRU | DISTANCE_LFU.
        decay_exponent: distance exponent of DISTANCE_LFU (and LRU, where it does not
            change the order).
    """

    zch_size: int = 1
    eviction_interval: int = 5
    policy: str = "LFU"
    decay_exponent: float = 1.0

    def __post_init__(self) -> None:
        if self.zch_size < 1:
            raise ValueError(f"zch_size={self.zch_size} is not valid; allowed: >= 1")
        if self.eviction_interval < 1:
            raise ValueError(f"eviction_interval={self.eviction_interval} is not valid; "
                             f"allowed: >= 1")
        if self.policy not in ZCH_POLICIES:
            raise ValueError(f"policy={self.policy!r} is not valid; allowed: "
                             f"{', '.join(ZCH_POLICIES)}")
        if self.decay_exponent < 0:
            raise ValueError(f"decay_exponent={self.decay_exponent} is not valid; "
                             f"allowed: >= 0")


def _merge_counts(keys: torch.Tensor, counts: torch.Tensor, last: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums counts and takes the max last step per distinct key."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    merged = torch.zeros(unique.numel(), dtype=counts.dtype, device=keys.device)
    merged.index_add_(0, inverse, counts)
    latest = torch.zeros(unique.numel(), dtype=last.dtype, device=keys.device)
    latest.scatter_reduce_(0, inverse, last, reduce="amax", include_self=False)
    return unique, merged, latest


def _rank_desc(primary: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Order by primary descending, then key ascending (stable, deterministic)."""
    by_key = torch.argsort(keys, stable=True)
    return by_key[torch.argsort(primary[by_key], descending=True, stable=True)]


class ZchRemapper(nn.Module):
    """Raw id -> slot of one ZCH table (see the module docstring).

    Args:
        options: the table's ZchOptions.
        name: table name (messages).
        device: where the buffers live.
    """

    def __init__(self, options: ZchOptions, name: str = "",
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.options, self.name = options, name
        size = options.zch_size
        i64 = dict(dtype=torch.int64, device=device)
        self.register_buffer("slot_keys", torch.zeros(size, **i64))
        self.register_buffer("slot_used", torch.zeros(size, dtype=torch.bool, device=device))
        self.register_buffer("slot_counts", torch.zeros(size, dtype=torch.float64,
                                                        device=device))
        self.register_buffer("slot_last_step", torch.zeros(size, **i64))
        self.register_buffer("pending_keys", torch.zeros(size, **i64))
        self.register_buffer("pending_counts", torch.zeros(size, dtype=torch.float64,
                                                           device=device))
        self.register_buffer("pending_last_step", torch.zeros(size, **i64))
        self.register_buffer("pending_size", torch.zeros((), **i64))
        self.register_buffer("step", torch.zeros((), **i64))
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None
        # The progress counters (ints, or 0-d device tensors read by ``counters``).
        self._counts: Counter = Counter()

    def counters(self) -> dict[str, float]:
        """size, capacity, load_factor, assigned, evictions, without_row, hits, lookups
        (see the module docstring); a host read."""
        size = int(self.slot_used.sum())
        capacity = self.options.zch_size
        out = {"size": float(size), "capacity": float(capacity),
               "load_factor": size / capacity}
        for name in ("assigned", "evictions", "without_row", "hits", "lookups"):
            out[name] = float(self._counts[name])
        return out

    # -- lookup structure -----------------------------------------------------------
    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._index = None

    def _sorted_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._index is None:
            slots = torch.nonzero(self.slot_used).flatten()
            keys = self.slot_keys[slots]
            order = torch.argsort(keys)
            self._index = (keys[order], slots[order])
        return self._index

    def find(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (n,) int64 -> slots (n,) int64, -1 for ids without a slot (read-only)."""
        keys, slots = self._sorted_index()
        if keys.numel() == 0 or ids.numel() == 0:
            return torch.full_like(ids, -1)
        position = torch.searchsorted(keys, ids).clamp_(max=keys.numel() - 1)
        found = keys[position] == ids
        return torch.where(found, slots[position], torch.full_like(ids, -1))

    def assigned(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(raw ids, slots, counts int64, last steps) of every held slot, by slot."""
        slots = torch.nonzero(self.slot_used).flatten()
        return (self.slot_keys[slots], slots, self.slot_counts[slots].round().to(torch.int64),
                self.slot_last_step[slots])

    # -- training -------------------------------------------------------------------
    def remap(self, ids: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Maps raw ids to slots; in training also counts, assigns and evicts.

        Args:
            ids: (n,) int64 raw ids of every feature reading the table this step.
            train: True advances the step and updates the state (once per step).

        Returns:
            (slots (n,) int64 with -1 for ids without a slot,
             reset (r,) int64 slots reassigned by an eviction: their rows must be
             re-initialized before the lookup).
        """
        empty = torch.zeros(0, dtype=torch.int64, device=ids.device)
        if not train:
            return self.find(ids), empty
        self.step += 1
        step = int(self.step)
        unique, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        slots = self.find(unique)
        hit = slots >= 0
        self._counts["lookups"] += unique.numel()
        self._counts["hits"] += hit.sum()
        self.slot_counts[slots[hit]] += counts[hit].to(torch.float64)
        self.slot_last_step[slots[hit]] = step
        new_keys, new_counts = unique[~hit], counts[~hit].to(torch.float64)
        new_keys, new_counts = self._fill_free(new_keys, new_counts, step)
        self._add_pending(new_keys, new_counts, step)
        reset = empty
        if step % self.options.eviction_interval == 0:
            reset = self._evict(step)
            self._counts["assigned"] += reset.numel()
            self._counts["evictions"] += reset.numel()
        slots = self.find(unique)  # after the assignments and evictions above
        self._counts["without_row"] += (slots < 0).sum()
        return slots[inverse], reset

    def _take_slots(self, slots: torch.Tensor, keys: torch.Tensor, counts: torch.Tensor,
                    last: torch.Tensor | int) -> None:
        self.slot_keys[slots] = keys
        self.slot_used[slots] = True
        self.slot_counts[slots] = counts
        self.slot_last_step[slots] = last
        self._index = None

    def _fill_free(self, keys: torch.Tensor, counts: torch.Tensor, step: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """New ids take free slots (most frequent first); returns those left waiting."""
        free = torch.nonzero(~self.slot_used).flatten()
        if free.numel() == 0 or keys.numel() == 0:
            return keys, counts
        order = _rank_desc(counts, keys)
        taken = min(free.numel(), keys.numel())
        chosen = order[:taken]
        self._take_slots(free[:taken], keys[chosen], counts[chosen], step)
        self._counts["assigned"] += taken
        rest = order[taken:]
        return keys[rest], counts[rest]

    def _add_pending(self, keys: torch.Tensor, counts: torch.Tensor, step: int) -> None:
        if keys.numel() == 0:
            return
        size = int(self.pending_size)
        keys, counts, last = _merge_counts(
            torch.cat([self.pending_keys[:size], keys]),
            torch.cat([self.pending_counts[:size], counts]),
            torch.cat([self.pending_last_step[:size], torch.full_like(keys, step)]))
        keep = _rank_desc(counts, keys)[:self.options.zch_size]
        size = keep.numel()
        self.pending_keys[:size] = keys[keep]
        self.pending_counts[:size] = counts[keep]
        self.pending_last_step[:size] = last[keep]
        self.pending_size.fill_(size)

    def _scores(self, counts: torch.Tensor, last: torch.Tensor, step: int) -> torch.Tensor:
        policy = self.options.policy
        if policy == "LFU":
            return counts
        if policy == "LRU":
            return last.to(torch.float64)
        distance = (step - last).clamp(min=0).to(torch.float64) + 1.0
        return counts / distance.pow(self.options.decay_exponent)

    def _evict(self, step: int) -> torch.Tensor:
        """Candidates replace lower-scoring slots; returns the reassigned slots."""
        size = int(self.pending_size)
        self.pending_size.fill_(0)
        held = torch.nonzero(self.slot_used).flatten()
        if size == 0 or held.numel() == 0:
            return torch.zeros(0, dtype=torch.int64, device=held.device)
        keys = self.pending_keys[:size].clone()
        counts = self.pending_counts[:size].clone()
        last = self.pending_last_step[:size].clone()
        cand_scores = self._scores(counts, last, step)
        cand_order = _rank_desc(cand_scores, keys)
        slot_scores = self._scores(self.slot_counts[held], self.slot_last_step[held], step)
        slot_order = _rank_desc(-slot_scores, held)  # lowest score first, ties by slot
        pairs = min(size, held.numel())
        cand_order, slot_order = cand_order[:pairs], slot_order[:pairs]
        wins = cand_scores[cand_order] > slot_scores[slot_order]
        # Both sides are sorted, so the winners form a prefix.
        taken = int(wins.to(torch.int64).cumprod(0).sum())
        chosen, slots = cand_order[:taken], held[slot_order[:taken]]
        self._take_slots(slots, keys[chosen], counts[chosen], last[chosen])
        return slots

    def extra_repr(self) -> str:
        o = self.options
        return (f"name={self.name!r}, zch_size={o.zch_size}, "
                f"eviction_interval={o.eviction_interval}, policy={o.policy}")
