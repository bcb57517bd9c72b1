"""A ``HashTable``'s counters and memory: ``stats``, ``memory_bytes``, ``memory_report``.

``TableReport`` is a mixin of ``HashTable`` (its reporting half): it reads the table's
counters, index arrays, admission counter and row store, and changes nothing.
"""

from __future__ import annotations

import torch

from hashrec.table.memory import estimate_table_bytes
from hashrec.table.ops.tag_counts import add_by_tag


class TableReport:
    """Mixin of ``HashTable``: what it counted and what it allocated."""

    # (2, T + 1) int64 on the device, with ``options.tag_names``: admission rejections
    # (row 0) and refused inserts (row 1) by tag, column T the other tags'.
    _tag_counts: torch.Tensor | None = None

    def stats(self) -> dict[str, int | float]:
        """Counters: lookups, hits, inserts, evictions, erased, refused,
        admission_rejected, counter_evictions, growths, plus size and capacity.
        ``lookups`` counts every key passed to ``lookup`` (the active ones), ``find`` and
        ``find_or_insert``, duplicates included; ``hits`` those of them stored before the
        call; ``erased`` the keys ``erase`` removed, so that inserts - evictions - erased
        is the size. HYBRID adds device_rows and host_rows, CACHING adds cache_rows,
        cache_lookups, cache_hits, cache_hit_rate, fetched_rows, prefetched_rows,
        written_back_rows and host_direct_rows. With ``options.tag_names``, each tag's
        admission rejections and refused inserts: ``admission_rejected/<name>``,
        ``refused/<name>``."""
        self._fold_device_counts()
        out = {name: int(self._stats[name]) for name in (
            "lookups", "hits", "inserts", "evictions", "erased", "refused",
            "admission_rejected", "growths")}
        # ``count`` counts in the counter, the fixed-size path with this table's masks.
        out["counter_evictions"] = (self._counter.evictions + int(
            self._stats["counter_evictions"]) + int(self._counter.device_evictions)
        ) if self._counter else 0
        out["size"] = self.size()
        out["capacity"] = self.capacity()
        out.update(self._rows.stats())
        if self._tag_counts is not None:
            rejected, refused = self._tag_counts.tolist()
            for tag, name in enumerate(self.options.tag_names):
                out[f"admission_rejected/{name}"] = rejected[tag]
                out[f"refused/{name}"] = refused[tag]
        return out

    def _count_by_tag(self, tags: torch.Tensor | None, rejected: torch.Tensor | None,
                      refused: torch.Tensor) -> None:
        """Adds the keys (u,) bool masks flag, ``rejected`` by admission (None: none) and
        ``refused`` by the full table, to their tags' counts, on the device (nothing
        without ``options.tag_names``). Keys without tags are tag 0."""
        if self._tag_counts is None:
            return
        masks = [refused] if rejected is None else [rejected, refused]
        sums = self._tag_counts[2 - len(masks):]
        if tags is None:
            sums[:, 0] += torch.stack(masks).sum(1)
        else:
            add_by_tag(sums, tags, masks)

    def _count_by_tag_at(self, tags: torch.Tensor | None, n: int,
                         rejected: torch.Tensor | None, refused: torch.Tensor | None) -> None:
        """``_count_by_tag`` of positions among n keys (the reference path's form; None:
        none)."""
        if self._tag_counts is None:
            return
        masks = []
        for at in (rejected, refused):
            mask = torch.zeros(n, dtype=torch.bool, device=self._tag_counts.device)
            if at is not None:
                mask[at] = True
            masks.append(mask)
        self._count_by_tag(tags, *masks)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes allocated now, by where they live: {"gpu": ..., "host": ...}."""
        report = self.memory_report()
        return {"gpu": report["gpu"], "host": report["host"]}

    def memory_report(self) -> dict[str, int | str]:
        """Allocated bytes by location ("gpu", "host": on a CPU-only machine all is host)
        and by tier ("gpu_tier": index, counters, device rows and cache; "host_tier":
        host rows), the DynamicEmb storage estimate at max_capacity ("estimate_gpu",
        "estimate_host"), the storage "mode" and how kernels reach host rows
        ("host_access": none | uva | staged | host)."""
        device_tier, host_tier = self._rows.tier_tensors()
        device_tier = [*device_tier, self.storage.keys, self.storage.tags, self.storage.digests,
                       self.storage.scores, self.storage.values]
        if self._counter is not None:
            s = self._counter.storage
            device_tier += [s.keys, s.tags, s.digests, s.scores, s.values]
        on_gpu = sum(_nbytes(t) for t in device_tier + host_tier if t.is_cuda)
        total = sum(_nbytes(t) for t in device_tier + host_tier)
        estimate = estimate_table_bytes(self.options)
        return {"gpu": on_gpu, "host": total - on_gpu,
                "gpu_tier": sum(_nbytes(t) for t in device_tier),
                "host_tier": sum(_nbytes(t) for t in host_tier),
                "estimate_gpu": estimate["gpu"], "estimate_host": estimate["host"],
                "mode": self.options.storage_mode.value, "host_access": self._rows.host_access}


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
