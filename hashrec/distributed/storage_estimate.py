"""What the planner knows of one dynamic table, and its per-rank bytes in each storage mode.

Bytes come from the table's own accounting,
:func:`hashrec.table.memory.estimate_table_bytes` (TorchEasyRec's DynamicEmb
estimate: the hash index and admission counters on the GPU; values split by
mode), applied to the table's per-rank options with the variant's
``cache_load_factor`` and ``caching``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hashrec.table.memory import estimate_table_bytes
from hashrec.table.options import StorageMode, TableOptions


@dataclass(frozen=True)
class PlannerTable:
    """One dynamic table as the planner sees it (per rank).

    Attributes:
        name: table name (named in the plan and in errors).
        options: the table's per-rank options (``max_capacity`` = rows per rank).
        fixed_cache_load_factor: the user set ``options.cache_load_factor``; keep it
            instead of sweeping 0.1 .. 1.0.
        fixed_caching: the user set ``options.caching``; keep that mode.
        ids_per_sample: average ids per sample that read this table (prices lookups).
        trainable: False (a frozen table) prices training lookups as reads only.
    """

    name: str
    options: TableOptions
    fixed_cache_load_factor: bool = False
    fixed_caching: bool = False
    ids_per_sample: float = 1.0
    trainable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r} is not valid; allowed: a non-empty string")
        if not isinstance(self.options, TableOptions):
            raise ValueError(f"options={self.options!r} is not valid; allowed: TableOptions")
        for flag in ("fixed_cache_load_factor", "fixed_caching", "trainable"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} is not valid; allowed: True, "
                                 f"False")
        ids = self.ids_per_sample
        if isinstance(ids, bool) or not isinstance(ids, (int, float)) or not ids >= 0 \
                or not math.isfinite(ids):
            raise ValueError(f"ids_per_sample={ids!r} is not valid; allowed: a finite number >= 0")

    @classmethod
    def sharded(cls, name: str, options: TableOptions, world_size: int,
                **kwargs) -> PlannerTable:
        """Describe a table whose ``options`` hold global capacities, split over ``world_size``.

        ``max_capacity`` and the admission ``counter_capacity`` are divided among the
        ranks (rounded up), ``init_capacity`` is per rank; ``kwargs`` go to the constructor.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} is not valid; allowed: an int >= 1")
        return cls(name=name, options=per_rank_options(options, world_size), **kwargs)

    @property
    def rows(self) -> int:
        """Rows per rank."""
        return self.options.max_capacity

    @property
    def cache_load_factor(self) -> float | None:
        """The fixed factor, or None when the planner sweeps it."""
        return self.options.cache_load_factor if self.fixed_cache_load_factor else None

    @property
    def caching(self) -> bool | None:
        """The fixed mode flag, or None when the planner tries both."""
        return self.options.caching if self.fixed_caching else None

    @property
    def element_bytes(self) -> int:
        return self.options.dtype.itemsize

    def full_estimate(self) -> dict:
        """The HBM_ONLY estimate: {"gpu", "host", "values", "index", "mode"}."""
        return estimate_table_bytes(replace(self.options, cache_load_factor=1.0))


def per_rank_options(options: TableOptions, world_size: int) -> TableOptions:
    """Options of one rank's shard: ``max_capacity`` and the admission counter capacity
    divided by ``world_size`` (rounded up); ``init_capacity`` is per rank and kept."""
    if world_size == 1:
        return options
    admission = options.admission
    if admission is not None and admission.counter_capacity is not None:
        admission = replace(admission,
                            counter_capacity=math.ceil(admission.counter_capacity / world_size))
    # init_capacity is already per rank (the config's init_capacity_per_rank): keep it,
    # bounded by the shard's capacity.
    max_capacity = math.ceil(options.max_capacity / world_size)
    init = options.init_capacity
    return replace(options, max_capacity=max_capacity,
                   init_capacity=None if init is None else min(init, max_capacity),
                   admission=admission, whole_max_capacity=options.max_capacity)


def variant_bytes(table: PlannerTable, mode: StorageMode,
                  cache_load_factor: float) -> tuple[int, int]:
    """(GPU bytes, host bytes) per rank of ``table`` stored in ``mode`` at ``cache_load_factor``."""
    if mode is StorageMode.HBM_ONLY:
        cache_load_factor = 1.0
    options = replace(table.options, cache_load_factor=cache_load_factor,
                      caching=mode is StorageMode.CACHING)
    estimate = estimate_table_bytes(options)
    return int(estimate["gpu"]), int(estimate["host"])
