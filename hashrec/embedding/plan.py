"""Which storage serves which logical table: dense tables, dynamic tables, fusion.

Every dense table is its own storage. A dynamic table is its own storage unless
table fusion applies: dynamic tables with the same non-None ``fusion_group``,
the same ``trainable`` flag and the same options apart from capacities and name
(dim, optimizer, dtype, score strategy, initializers, admission threshold, ...)
share one ``HashTable``: one storage, one admission counter, with independent
key spaces through tags (tag = position of the logical table in the storage).
The fused storage's ``max_capacity`` (and ``init_capacity``, admission
``counter_capacity``) is the sum of its tables' (``init_capacity`` per rank). Initializers whose defaults
depend on capacity are resolved per logical table before comparing, so tables
whose effective initializers differ stay in separate storages.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import torch

from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.specs import EmbeddingTableSpec
from hashrec.table.optim import OptimizerSpec
from hashrec.table.options import InitializerArgs, InitializerMode, TableOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoragePlan:
    """One storage and the logical tables it serves.

    Attributes:
        name: storage name (the table name when unfused; ``<fusion_group>`` or
            ``<fusion_group>_<k>`` when fused, ``_fused`` appended where a table has
            that name).
        tables: logical tables served; the index of a table is its tag.
        options: TableOptions of a dynamic storage; None for a dense table.
        fused: True when several logical tables share the storage (tags are passed).
    """

    name: str
    tables: tuple[EmbeddingTableSpec, ...]
    options: TableOptions | None
    fused: bool

    @property
    def is_dynamic(self) -> bool:
        return self.options is not None

    @property
    def trainable(self) -> bool:
        return self.tables[0].trainable

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the storage keeps its rows in."""
        return self.options.dtype if self.options is not None else self.tables[0].row_dtype


def _dynamic_options(spec: EmbeddingTableSpec, optimizer: OptimizerSpec,
                     device: torch.device) -> TableOptions:
    """The table's options with optimizer, device, name and capacity-dependent defaults set.

    Raises:
        EmbeddingError: the dims disagree, or an initializer's UNIFORM bound set on one side
            crosses the other side's default (naming the table and the initializer).
    """
    options = spec.dynamic
    if options.dim != spec.dim:
        raise EmbeddingError(
            f"table {spec.name!r}: dim={spec.dim} but its TableOptions.dim={options.dim}")

    def resolve(args: InitializerArgs, field_name: str) -> InitializerArgs:
        try:
            return args.resolved(options.dim, options.max_capacity, field_name)
        except ValueError as err:
            raise EmbeddingError(f"table {spec.name!r}: {err}") from None

    admission = options.admission
    if admission is not None:
        admission = dataclasses.replace(
            admission, initializer=resolve(admission.initializer, "admission.initializer"))
    return dataclasses.replace(
        options, optimizer=options.optimizer or optimizer, device=device, name=spec.name,
        initializer=resolve(options.initializer, "initializer"),
        eval_initializer=resolve(options.eval_initializer, "eval_initializer"),
        admission=admission)


def _effective(args: InitializerArgs) -> InitializerArgs:
    """Only the fields the initializer's mode reads (resolved bounds of other modes vary
    with capacity and do not matter)."""
    if args.mode is InitializerMode.CONSTANT:
        return InitializerArgs(mode=args.mode, value=args.value, key_seed=args.key_seed)
    if args.mode is InitializerMode.DEBUG:
        return InitializerArgs(mode=args.mode)
    if args.mode is InitializerMode.UNIFORM:
        return InitializerArgs(mode=args.mode, lower=args.lower, upper=args.upper,
                               key_seed=args.key_seed)
    if args.mode is InitializerMode.TRUNCATED_NORMAL:  # its bounds are its cut
        return InitializerArgs(mode=args.mode, mean=args.mean, std_dev=args.std_dev,
                               lower=args.lower, upper=args.upper, key_seed=args.key_seed)
    return InitializerArgs(mode=args.mode, mean=args.mean, std_dev=args.std_dev,
                           key_seed=args.key_seed)


def _fusion_key(options: TableOptions) -> TableOptions:
    """Options with the fields that may differ between fused tables blanked out."""
    admission = options.admission
    if admission is not None:
        admission = dataclasses.replace(admission, counter_capacity=None,
                                        initializer=_effective(admission.initializer))
    # set_by_user says which storage choices are fixed, not what they are: tables whose
    # options agree fuse whether or not a config spelled a default out
    return dataclasses.replace(options, max_capacity=1, init_capacity=None, name="",
                               admission=admission, initializer=_effective(options.initializer),
                               eval_initializer=_effective(options.eval_initializer),
                               set_by_user=frozenset())


def _fused_options(name: str, members: list[TableOptions], world_size: int) -> TableOptions:
    """The fused storage's options: capacities summed, the members' names its
    ``tag_names`` (tags in their order). ``init_capacity`` is per rank (the config's
    ``init_capacity_per_rank``): a member without one starts full, its share of a rank's
    rows (``max_capacity / world_size``)."""
    first = members[0]
    admission = first.admission
    if admission is not None:
        counters = sum(o.admission.counter_capacity or o.max_capacity for o in members)
        admission = dataclasses.replace(admission, counter_capacity=counters)
    init = None
    if any(o.init_capacity is not None for o in members):
        init = sum(o.init_capacity if o.init_capacity is not None
                   else math.ceil(o.max_capacity / world_size) for o in members)
    return dataclasses.replace(first, max_capacity=sum(o.max_capacity for o in members),
                               init_capacity=init, name=name, admission=admission,
                               set_by_user=frozenset().union(*(o.set_by_user for o in members)),
                               tag_names=tuple(o.name for o in members))


def plan_storages(tables: list[EmbeddingTableSpec], optimizer: OptimizerSpec,
                  device: torch.device, world_size: int = 1,
                  note_splits: bool = True) -> list[StoragePlan]:
    """Groups tables into storages, in the order tables are given. ``world_size``: the
    ranks the dynamic storages are sharded over (a fused storage's per-rank
    ``init_capacity`` depends on it). ``note_splits``: log one INFO line per feature
    group whose tables take several storages (the storage planner, which plans the
    same storages before the embedding collection builds them, leaves it to the
    collection).

    A fused storage whose name a table (or another storage) has takes ``_fused`` after it.
    """
    plans: list[StoragePlan] = []
    groups: dict[tuple, list[tuple[EmbeddingTableSpec, TableOptions]]] = {}
    for spec in tables:
        if not spec.is_dynamic:
            plans.append(StoragePlan(spec.name, (spec,), None, False))
            continue
        options = _dynamic_options(spec, optimizer, device)
        group = spec.fusion_group if spec.fusion_group is not None else ("", spec.name)
        groups.setdefault((group, spec.trainable, _fusion_key(options)), []).append(
            (spec, options))
    if note_splits:
        _note_splits(groups)
    per_group: dict[object, int] = {}
    for (group, _, _), members in groups.items():
        if len(members) > 1:
            per_group[group] = per_group.get(group, 0) + 1
    seen: dict[object, int] = {}
    taken = {spec.name for spec in tables}  # unfused storages take their table's name
    for (group, _, _), members in groups.items():
        specs = tuple(spec for spec, _ in members)
        if len(members) == 1:
            plans.append(StoragePlan(specs[0].name, specs, members[0][1], False))
            continue
        name = group if per_group[group] == 1 else f"{group}_{seen.get(group, 0)}"
        seen[group] = seen.get(group, 0) + 1
        while name in taken:  # a table (or another group's storage) has the group's name
            name += "_fused"
        taken.add(name)
        options = _fused_options(name, [o for _, o in members], world_size)
        plans.append(StoragePlan(name, specs, options, True))
    return plans


def _note_splits(groups: dict[tuple, list[tuple[EmbeddingTableSpec, TableOptions]]]) -> None:
    """One INFO line per fusion group whose dynamic tables take several storages, naming
    the options (or the trainable flag) that keep them apart."""
    by_group: dict[str, list[tuple]] = {}
    for key in groups:
        if isinstance(key[0], str):  # ("", name) tuples are tables of no fusion group
            by_group.setdefault(key[0], []).append(key)
    for group, keys in by_group.items():
        if len(keys) < 2:
            continue
        differ = [f.name for f in dataclasses.fields(TableOptions)
                  if len({repr(getattr(key[2], f.name)) for key in keys}) > 1]
        if len({key[1] for key in keys}) > 1:
            differ.append("trainable")
        parts = " | ".join(", ".join(spec.name for spec, _ in groups[key]) for key in keys)
        uniform = "initializer" in differ and all(
            key[2].initializer.mode is InitializerMode.UNIFORM for key in keys)
        hint = (" (UNIFORM bounds default to +-sqrt(1/max_capacity): set them, or another "
                "initializer, alike to fuse the tables)") if uniform else ""
        logger.info("feature group %r: its dynamic tables take %d storages (%s): their "
                    "options differ in %s%s", group, len(keys), parts, ", ".join(differ), hint)
