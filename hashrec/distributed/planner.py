"""Storage planner: HBM_ONLY, HYBRID or CACHING and the cache_load_factor of each dynamic table.

For every table the planner enumerates storage variants - HYBRID and CACHING at
cache_load_factor 0.1, 0.2, ..., 1.0 (both collapse to HBM_ONLY at 1.0), or only
the user's fixed factor / mode - and prices each by its per-rank GPU and host
bytes (:mod:`hashrec.distributed.storage_estimate`) and its step time
(:mod:`hashrec.distributed.cost_model`). :mod:`hashrec.distributed.plan_search`
then picks one variant per table: the cheapest plan its heuristics find within
both per-rank budgets. Without CUDA (``Topology.shared_memory``) both tiers are host
memory, so the host budget bounds a plan's GPU and host bytes together (the search's
second resource is then a variant's whole size) and the GPU budget its GPU bytes alone.
When no plan fits, :class:`PlannerError` names the tables that do not fit and by how
many bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hashrec.distributed.cost_model import AccessProfile, CostModel, step_cost
from hashrec.distributed.errors import PlannerError
from hashrec.distributed.plan_search import Grid, search
from hashrec.distributed.storage_estimate import PlannerTable, variant_bytes
from hashrec.distributed.topology import Topology
from hashrec.table.options import StorageMode

LOAD_FACTORS = tuple((i + 1) / 10 for i in range(10))


@dataclass(frozen=True)
class Variant:
    """One storage choice of one table, priced.

    Attributes:
        mode: HBM_ONLY, HYBRID or CACHING.
        cache_load_factor: share of values on the GPU (1.0 for HBM_ONLY).
        gpu_bytes: per-rank GPU bytes.
        host_bytes: per-rank host bytes.
        cost: estimated seconds per step.
    """

    mode: StorageMode
    cache_load_factor: float
    gpu_bytes: int
    host_bytes: int
    cost: float

    @property
    def caching(self) -> bool:
        return self.mode is StorageMode.CACHING


@dataclass(frozen=True)
class TablePlan:
    """The variant chosen for one table.

    Attributes:
        name: table (storage) name.
        variant: the chosen storage variant.
        rows: the table's rows on each rank (its max_capacity divided over the ranks).
    """

    name: str
    variant: Variant
    rows: int = 0


@dataclass(frozen=True)
class Plan:
    """A storage plan that fits the budgets.

    Attributes:
        tables: one entry per table, in input order.
        topology: the budgets it was planned for.
        batch_size: per-rank batch size it was priced at.
    """

    tables: tuple[TablePlan, ...]
    topology: Topology
    batch_size: int

    @property
    def gpu_bytes(self) -> int:
        return sum(t.variant.gpu_bytes for t in self.tables)

    @property
    def host_bytes(self) -> int:
        return sum(t.variant.host_bytes for t in self.tables)

    @property
    def cost(self) -> float:
        return sum(t.variant.cost for t in self.tables)

    def for_table(self, name: str) -> Variant:
        """The chosen variant of table ``name``."""
        for entry in self.tables:
            if entry.name == name:
                return entry.variant
        raise KeyError(f"table {name!r} is not in the plan; planned: "
                       f"{', '.join(t.name for t in self.tables)}")


def _access_profile(table: PlannerTable, batch_size: int, model: CostModel) -> AccessProfile:
    options = table.options
    row_bytes = options.row_dim * table.element_bytes
    written = model.training and table.trainable  # a frozen table is only read
    traffic = options.dim * table.element_bytes + (2 * row_bytes if written else 0)
    return AccessProfile(touches=batch_size * table.ids_per_sample, rows=table.rows,
                         index_bytes=options.bucket_capacity + 16, row_traffic_bytes=traffic,
                         row_bytes=row_bytes, written=written)


def enumerate_variants(table: PlannerTable, batch_size: int,
                       model: CostModel | None = None) -> list[Variant]:
    """All storage variants of a table, priced (HBM_ONLY listed once).

    Without fixed choices that is HYBRID and CACHING at 0.1 ... 0.9 plus HBM_ONLY
    (the 20 candidates of 2 modes x 10 factors, of which the two at 1.0 coincide).
    A fixed ``cache_load_factor`` leaves one factor, a fixed ``caching`` one mode.
    """
    model = CostModel() if model is None else model
    profile = _access_profile(table, batch_size, model)
    factors = LOAD_FACTORS if table.cache_load_factor is None else (table.cache_load_factor,)
    modes = (False, True) if table.caching is None else (table.caching,)
    variants: dict[tuple[StorageMode, float], Variant] = {}
    for caching in modes:
        for factor in factors:
            if factor >= 1.0:
                mode, factor = StorageMode.HBM_ONLY, 1.0
            else:
                mode = StorageMode.CACHING if caching else StorageMode.HYBRID
            if (mode, factor) in variants:
                continue
            gpu, host = variant_bytes(table, mode, factor)
            variants[(mode, factor)] = Variant(mode=mode, cache_load_factor=factor, gpu_bytes=gpu,
                                               host_bytes=host,
                                               cost=step_cost(profile, mode, factor, model))
    return list(variants.values())


def plan_tables(tables: list[PlannerTable], topology: Topology, batch_size: int,
                cost_model: CostModel | None = None) -> Plan:
    """Choose each table's storage mode and cache_load_factor.

    Args:
        tables: the dynamic tables (per-rank rows), names unique.
        topology: per-rank GPU and host budgets.
        batch_size: per-rank batch size (prices the lookups).
        cost_model: bandwidths and skew; default :class:`CostModel`.

    Returns:
        The cheapest plan the greedy search finds within both budgets (with
        ``topology.shared_memory``: GPU bytes within ``gpu_bytes``, GPU and host bytes
        together within ``host_bytes``).

    Raises:
        PlannerError: no plan fits; names the tables that do not fit and by how much.
        ValueError: duplicate table names or a batch size < 1.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; allowed: an int >= 1")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"table names must be unique; repeated: {', '.join(dupes)}")
    if not tables:
        return Plan(tables=(), topology=topology, batch_size=batch_size)
    variants = [enumerate_variants(t, batch_size, cost_model) for t in tables]
    # One memory behind both tiers: what the host budget bounds is a variant's whole size.
    shared = topology.shared_memory
    grid = Grid.build([[(v.gpu_bytes, v.host_bytes + (v.gpu_bytes if shared else 0), v.cost)
                        for v in row] for row in variants])
    choice = search(grid, topology.gpu_bytes, topology.host_bytes)
    if choice is None:
        _check_fits(tables, grid.gpu, topology.gpu_bytes, "GPU")
        _check_fits(tables, grid.host, topology.host_bytes,
                    "host (without CUDA: GPU and host tiers together)" if shared else "host")
        _raise_joint(tables, grid, topology)
    chosen = tuple(TablePlan(name=t.name, variant=variants[i][int(choice[i])], rows=t.rows)
                   for i, t in enumerate(tables))
    return Plan(tables=chosen, topology=topology, batch_size=batch_size)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit} ({int(n)} bytes)"
    return f"{int(n)} bytes"


def _check_fits(tables: list[PlannerTable], usage: np.ndarray, budget: int, label: str) -> None:
    """Raise if the tables cannot fit ``budget`` even at their smallest ``usage`` variants."""
    smallest = usage.min(axis=1)
    if smallest.sum() <= budget:
        return
    # Place the smallest tables first: the ones left over are those that do not fit.
    left, missing, fixed = float(budget), [], False
    for i in np.argsort(smallest, kind="stable"):
        need = float(smallest[i])
        if need <= left:
            left -= need
        else:
            note = _fixed_note(tables[i])
            fixed = fixed or bool(note)
            missing.append(f"{tables[i].name} (needs {_fmt_bytes(need)}, "
                           f"short by {_fmt_bytes(need - left)}{note})")
            left = 0.0
    unfix = (", or leave the fixed cache_load_factor / caching unset so that the planner may "
             "choose them" if fixed else "")
    raise PlannerError(
        f"the dynamic tables do not fit the {label} budget of {_fmt_bytes(budget)} per rank "
        f"even at their smallest variants (together {_fmt_bytes(smallest.sum())}, short by "
        f"{_fmt_bytes(smallest.sum() - budget)}); tables that do not fit: {'; '.join(missing)}. "
        f"Lower max_capacity, use more ranks, or raise the budget "
        f"(HASHREC_GPU_MEMORY_BYTES / HASHREC_HOST_MEMORY_BYTES){unfix}.")


def _fixed_note(table: PlannerTable) -> str:
    """What of the table's storage the user fixed, for error messages ('' for nothing)."""
    fixed = [] if table.cache_load_factor is None else \
        [f"cache_load_factor {table.cache_load_factor:g}"]
    if table.caching is not None:
        fixed.append(f"caching {str(table.caching).lower()}")
    return f"; fixed: {' and '.join(fixed)}" if fixed else ""


def _raise_joint(tables: list[PlannerTable], grid: Grid, topology: Topology) -> None:
    """Each budget alone can be met, but no plan found meets both: name the largest tables."""
    if topology.shared_memory:  # grid.host holds both tiers, within the host budget
        both, budget = grid.host.min(axis=1), topology.host_bytes
    else:
        both = np.where(np.isfinite(grid.gpu), grid.gpu + grid.host, np.inf).min(axis=1)
        budget = topology.gpu_bytes + topology.host_bytes
    short = both.sum() - budget
    largest = [f"{tables[i].name} (at least {_fmt_bytes(both[i])} on GPU and host together)"
               for i in np.argsort(-both, kind="stable")[:5]]
    shortfall = (f"together the tables need at least {_fmt_bytes(both.sum())}, short by "
                 f"{_fmt_bytes(short)}" if short > 0 else
                 "no split of the tables between the two budgets was found")
    raise PlannerError(
        f"the GPU budget {_fmt_bytes(topology.gpu_bytes)} and host budget "
        f"{_fmt_bytes(topology.host_bytes)} per rank cannot both be met: {shortfall}; largest "
        f"tables: {'; '.join(largest)}. Lower max_capacity, use more ranks, or raise a budget.")


def plan_to_table(plan: Plan) -> str:
    """The plan as a printable table: table, mode, load factor, rows per rank, GPU bytes,
    host bytes, cost."""
    header = ("table", "mode", "load factor", "rows/rank", "GPU bytes", "host bytes",
              "est. cost (us/step)")
    rows = [(t.name, t.variant.mode.value, f"{t.variant.cache_load_factor:g}", str(t.rows),
             str(t.variant.gpu_bytes), str(t.variant.host_bytes), f"{t.variant.cost * 1e6:.2f}")
            for t in plan.tables]
    rows.append(("total", "", "", "", str(plan.gpu_bytes), str(plan.host_bytes),
                 f"{plan.cost * 1e6:.2f}"))
    rows.append(("budget/rank", "", "", "", str(plan.topology.gpu_bytes),
                 str(plan.topology.host_bytes), ""))
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if c < 3 else cell.rjust(w)
                       for c, (cell, w) in enumerate(zip(r, widths))) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if plan.topology.shared_memory:
        lines.append(f"(no CUDA: both tiers are host memory; GPU + host bytes "
                     f"{plan.gpu_bytes + plan.host_bytes} within the host budget)")
    return "\n".join(lines)


