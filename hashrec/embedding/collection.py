"""EmbeddingCollection: features in, pooled and sequence embeddings out.

Tables are dense (``num_rows`` known, rows in a buffer) or dynamic (a
``HashTable`` per storage, possibly fused across tables; see ``plan``). Per
forward and per storage, the ids of every feature reading it are deduplicated
and looked up once; backward applies the sparse optimizer to the looked-up rows
in place (see ``lookup``). Storages of one row width share the dedup and the
pooling (``joint``). The collection has no ``nn.Parameter``: the dense
optimizer never sees embeddings, and dense tables' rows and optimizer state
travel in ``state_dict`` as buffers. Dynamic tables are reached through
``dynamic_tables()`` and ``table_locations()`` (checkpoints, exports).

Several ranks: given a ``DistContext`` with world size > 1, every dynamic storage
is a row-wise shard of the rank (capacities divided by the world size) reached
through all-to-all exchanges, and dense tables are replicated with their sparse
gradients summed over ranks; see ``hashrec.embedding.sharded`` for the update
scaling and the collective rule (every rank runs every forward, in step; a rank
without an eval batch calls ``idle_lookups``). ZCH remappers are replicated too:
in training every rank remaps the global batch's ids (``_remap_zch``), so they
assign and evict alike. World size 1 takes the local path.

Step clock: every training-mode forward advances the step of every storage once
before its lookups (STEP scores, Adam bias correction), after the batch's ids passed
their checks (a refused batch takes no step); eval-mode forwards do not. Train mode
admits, inserts and updates scores; eval mode is read-only and
missing keys read as the table's ``eval_initializer``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

import torch
from torch import nn

from hashrec.distributed.comm_timer import CommTimer
from hashrec.distributed.data_parallel import all_gather_rows, broadcast_rows
from hashrec.distributed.process_group import DistContext
from hashrec.distributed.sharded_lookup import ShardedTable
from hashrec.distributed.storage_estimate import per_rank_options
from hashrec.embedding.batching import (
    COMPACT,
    NARROW,
    FeatureIds,
    PendingDedup,
    StorageBatch,
    SummaryGather,
    dedup_storages,
    feature_ids,
    start_dedup,
)
from hashrec.embedding.dedup_graphs import pad_bits
from hashrec.embedding.dense_group import group_dense_storages
from hashrec.embedding.dense_table import DenseTable
from hashrec.embedding.emit import TableRows, emit_storage
from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.items import item_bag_ids, pad_items
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.embedding.joint import (
    joins_enabled,
    joint_ids,
    joint_name,
    make_joins,
    owned_tags,
    split_join,
)
from hashrec.embedding.lookup import Storage, lookup_rows
from hashrec.embedding.output import EmbeddingOutput
from hashrec.embedding.plan import StoragePlan, plan_storages
from hashrec.embedding.sharded import Request, ShardedLookups
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec, items_key
from hashrec.embedding.stats import collection_stats, fused_table_sizes, record_lookups
from hashrec.embedding.zch import ZchRemapper
from hashrec.table import HashTable
from hashrec.table.optim import OPTIMIZER_SPECS, OptimizerSpec, float16_state_floor

# All-gather into one flat tensor (newer torch names it all_gather_single).
_all_gather_flat = getattr(torch.distributed, "all_gather_single", None) or \
    torch.distributed.all_gather_into_tensor

# Batches whose dedup ``EmbeddingCollection.prepare`` keeps at most.
_MAX_AHEAD = 2

logger = logging.getLogger("hashrec.embedding")


def _check_specs(tables: list[EmbeddingTableSpec], features: list[EmbeddingFeatureSpec],
                 optimizer: OptimizerSpec) -> None:
    if not isinstance(optimizer, OPTIMIZER_SPECS):
        allowed = ", ".join(spec.__name__ for spec in OPTIMIZER_SPECS)
        raise EmbeddingError(f"sparse_optimizer={optimizer!r} is not valid; allowed: {allowed}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise EmbeddingError(f"duplicate table names in {names}")
    feature_names = [f.name for f in features]
    if len(set(feature_names)) != len(feature_names):
        raise EmbeddingError(f"duplicate feature names in {feature_names}")
    for f in features:
        if f.table not in names:
            raise EmbeddingError(f"feature {f.name!r} reads unknown table {f.table!r}; "
                                 f"tables: {names}")
        if f.is_sequence and f.max_length <= 0:
            raise EmbeddingError(f"sequence feature {f.name!r}: max_length must be > 0, "
                                 f"got {f.max_length}")
        if f.pooling not in ("sum", "mean"):
            raise EmbeddingError(f"feature {f.name!r}: pooling={f.pooling!r} is not valid; "
                                 f"allowed: sum, mean")


def _note_float16_state(plan: StoragePlan, sparse_optimizer: OptimizerSpec) -> None:
    """Warns when a float16 storage keeps squared gradients (Adagrad, Adam) in float16."""
    optimizer = plan.options.optimizer if plan.is_dynamic else sparse_optimizer
    floor = float16_state_floor(optimizer) if plan.dtype == torch.float16 else None
    if floor is not None:
        logger.warning(
            "storage %r keeps its %s state in float16 (data_type FP16): from gradients "
            "below about %.0e the squared-gradient state rounds to 0 and the updates grow "
            "(Adagrad's to lr a step); BF16 keeps float32's range", plan.name,
            type(optimizer).__name__, floor)


class EmbeddingCollection(nn.Module):
    """Dense and dynamic embedding tables read by named sparse features.

    Args:
        tables: the tables (dense: ``num_rows``; dynamic: ``dynamic`` TableOptions).
        features: the KeyedJaggedTensor keys and the table each reads.
        sparse_optimizer: ``SparseSGD`` | ``SparseAdagrad`` | ``SparseRowWiseAdagrad`` |
            ``SparseAdam``; fills ``TableOptions.optimizer`` where it is None and
            updates dense tables.
        device: device of every table (None -> CPU); dynamic tables' options are
            placed there. Dynamic tables do not follow ``.to()``: build the
            collection on the device it runs on.
        dist: the worker's DistContext; world size > 1 shards dynamic storages
            row-wise over the ranks (None or world size 1: local tables).
        group: process group of the exchanges (default group when None).
        storage_modes: dynamic storage name -> (cache_load_factor, caching) chosen by
            the storage planner; replaces those two options of the storage.
    """

    def __init__(self, tables: list[EmbeddingTableSpec], features: list[EmbeddingFeatureSpec],
                 sparse_optimizer: OptimizerSpec,
                 device: torch.device | str | None = None, dist: DistContext | None = None,
                 group=None, storage_modes: dict[str, tuple[float, bool]] | None = None
                 ) -> None:
        super().__init__()
        _check_specs(tables, features, sparse_optimizer)
        self._device = torch.device("cpu" if device is None else device)
        self._features = {f.name: f for f in features}
        self.dense_tables = nn.ModuleDict()
        # Zero-collision remappers of ZCH tables (buffers: they travel in state_dict).
        self.zch_remappers = nn.ModuleDict()
        self._storages: list[Storage] = []
        self._locations: dict[str, tuple[str, int]] = {}
        world = dist.world_size if dist is not None and dist.is_distributed else 1
        self.comm_timer = CommTimer(self._device, enabled=world > 1)
        sharded: dict[str, ShardedTable] = {}
        for plan in plan_storages(tables, sparse_optimizer, self._device, world):
            if plan.is_dynamic:
                options = plan.options
                if storage_modes and plan.name in storage_modes:
                    factor, caching = storage_modes[plan.name]
                    options = dataclasses.replace(options, cache_load_factor=float(factor),
                                                  caching=bool(caching))
                table = HashTable(per_rank_options(options, world))
                if world > 1:
                    sharded[plan.name] = ShardedTable(table, dist, group, self.comm_timer)
            else:
                spec = plan.tables[0]
                table = DenseTable(spec.name, spec.num_rows, spec.dim, sparse_optimizer,
                                   spec.initializer, self._device, spec.row_dtype)
                self.dense_tables[spec.name] = table
                # Without ZCH every id is checked to be a row (_check_dense_ids).
                table.keys_may_be_negative = spec.zch is not None
                if spec.zch is not None:
                    self.zch_remappers[spec.name] = ZchRemapper(spec.zch, spec.name,
                                                                self._device)
            if dist is None or dist.is_main:  # every rank builds the same storages
                _note_float16_state(plan, sparse_optimizer)
            self._storages.append(Storage(plan, table))
            for tag, spec in enumerate(plan.tables):
                self._locations[spec.name] = (plan.name, tag)
        self._readers = self._group_features(features)
        # What a forward reads: dense tables of one row layout joined into groups.
        self._units = group_dense_storages(self._storages, set(self.zch_remappers))
        for unit in self._units:
            if unit.name not in self._readers:
                self._readers[unit.name] = [self._readers[spec.name][0]
                                            for spec in unit.plan.tables]
        self._sharded = ShardedLookups(sharded, dist, group, self.comm_timer) \
            if world > 1 else None
        self._sharing = self._share_sizes()
        # Storages of one row width share their dedup and pooling (``joint``).
        self._joint = joins_enabled()
        self._sharded_names = frozenset(sharded)
        # Coming batches' ids and dedup started by ``prepare``: (kjt, ids, pending),
        # oldest first, at most ``_MAX_AHEAD``.
        self._ahead: list[tuple] = []
        # Storages whose ids did not fit the one-pass sort of keys (``dedup_storages``),
        # and those whose ids did not fit its int32 form (int64 keys from then on).
        self._wide_ids: set[str] = set()
        self._long_ids: set[str] = set()

    def _group_features(self, features) -> dict[str, list[list[EmbeddingFeatureSpec]]]:
        readers = {s.name: [[] for _ in s.plan.tables] for s in self._storages}
        for f in features:
            storage, tag = self._locations[f.table]
            readers[storage][tag].append(f)
        return readers

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def feature_names(self) -> list[str]:
        return list(self._features)

    def forward(self, kjt: KeyedJaggedTensor) -> EmbeddingOutput:
        """Embeds every feature: kjt holding all feature keys (extra keys are ignored).

        Returns:
            EmbeddingOutput with ``pooled[name]`` (B, dim) and
            ``sequences[name]`` ((B, max_length, dim), lengths (B,)).
        """
        self._check_input(kjt)
        storages = self._read_storages()
        ready = [i for i, entry in enumerate(self._ahead) if entry[0] is kjt]
        if ready:
            _, ids, pending = self._ahead[ready[0]]
            self._drop_ahead(ready[0])
            del self._ahead[0]
        else:
            ids, pending = self._feature_ids(storages, kjt), None
        checked = self._dedup(storages, ids, pending)
        if self.training:  # the ids passed their checks: no step for a refused batch
            for storage in self._storages:
                if storage.plan.trainable:  # a frozen table's STEP clock stays as loaded
                    storage.table.advance_step()
        out = EmbeddingOutput()
        for batch, rows, table in self._lookups(storages, ids, *checked):
            for f, value in zip(batch.features, emit_storage(rows, batch, table)):
                if f.item_rows is not None:
                    length = self._features[f.spec.name].max_length
                    out.sequences[f.spec.name] = pad_items(value, f.item_rows, length)
                elif f.spec.is_sequence:
                    out.sequences[f.spec.name] = (value, f.lengths)
                else:
                    out.pooled[f.spec.name] = value
        return out

    def carry_network_gradients(self, gradients) -> None:
        """Several ranks: the dense network's gradients (a ``FlatGradients``) are averaged
        in the last gradient exchange of each backward of the storages (the dynamic
        storages', else the dense tables'), when there is one; None stops it."""
        if self._sharded is not None:
            self._sharded.network_gradients = gradients

    def is_prepared(self, kjt: KeyedJaggedTensor) -> bool:
        """Whether ``prepare(kjt)`` ran for this very batch object and its forward has not."""
        return any(entry[0] is kjt for entry in self._ahead)

    def prepare(self, kjt: KeyedJaggedTensor) -> None:
        """Starts deduplicating the ids of a coming batch ``kjt``.

        The sorts are queued after the work queued so far on the current stream (on a
        GPU of a single process, on the device's dedup stream, beside what the current
        stream runs next: ``start_dedup``) and their sizes sent to the host without
        waiting, so the forward of ``kjt`` (a later call with that very object) reads
        them without draining the stream. A training step calls this for the next
        batch at its start: the host then never waits for the previous step's kernels,
        and the device sorts the next batch's ids while it runs this step's lookups and
        pooling. ZCH storages are deduplicated in the forward (their remapping depends
        on the remapper's state).

        Up to ``_MAX_AHEAD`` batches are kept (a step may prepare the next batch
        before its own forward); the forward of a prepared batch drops it and any
        prepared before it, the forward of another batch leaves them.

        Under several ranks this is a collective (``_sharing``): every rank
        prepares the same number of batches in the same order.
        """
        self._check_input(kjt)
        storages = self._read_storages()
        ids = self._feature_ids(storages, kjt)
        joins = [join for join in self._joins(storages)
                 if storages[join[0]].name not in self.zch_remappers]
        self._ahead.append((kjt, ids, start_dedup([self._dedup_entry(storages, ids, join)
                                                   for join in joins],
                                                  self._sharing)))
        self._drop_ahead(len(self._ahead) - _MAX_AHEAD)

    def _drop_ahead(self, count: int) -> None:
        """Drops the ``count`` oldest prepared batches unread (``PendingDedup.drop``)."""
        dropped = self._ahead[:max(count, 0)]
        del self._ahead[:len(dropped)]
        for _, _, pending in dropped:
            pending.drop()

    def _share_sizes(self) -> SummaryGather | None:
        """Several ranks: the dedup's sizes are all-gathered on the device before they
        travel to the host, so the lookups and dense-table gradients of a prepared
        batch exchange no sizes (``prepare`` is then a collective, which the training
        loop calls on every rank at the same point of every step). Made once, at init."""
        if self._sharded is None:
            return None
        ctx, group = self._sharded.ctx, self._sharded.group

        def gather(summary: torch.Tensor) -> torch.Tensor:
            out = summary.new_empty(ctx.world_size * summary.numel())
            _all_gather_flat(out, summary.contiguous(), group=group)
            return out.view(ctx.world_size, -1)

        return SummaryGather(torch.distributed.get_rank(group), gather)

    def _feature_ids(self, storages: list[Storage], kjt: KeyedJaggedTensor
                     ) -> list[list[list[FeatureIds]]]:
        bags = kjt.to_dict()
        return [[[item_bag_ids(f, bags[f.input_key], bags[items_key(f.input_key)])
                  if f.multi_value else feature_ids(f, bags[f.input_key]) for f in fs]
                 for fs in self._readers[s.name]]
                for s in storages]

    def _joins(self, storages: list[Storage]) -> list[tuple[int, ...]]:
        """Storages deduplicated and emitted together (``hashrec.embedding.joint``)."""
        if not self._joint:
            return [(i,) for i in range(len(storages))]
        return make_joins(storages, set(self.zch_remappers), self._sharded_names)

    def _dedup_entry(self, storages: list[Storage], ids: list[list[list[FeatureIds]]],
                     join: tuple[int, ...]) -> tuple:
        """``dedup_storages``' entry of a join: ids of dense tables without ZCH are
        rows (checked against the tables' sizes before any lookup); a sharded storage
        also counts the keys each rank owns (the lookup's sizes, known ahead). A join
        of several storages is one fused storage of their logical tables."""
        if len(join) > 1:
            members = [storages[i] for i in join]
            owned = owned_tags(members, self._sharded_names)
            owners = self._sharded.ctx.world_size if owned is not None else 0
            return joint_ids([ids[i] for i in join]), True, False, owners, \
                self._one_pass(joint_name(members)), owned
        storage, ids = storages[join[0]], ids[join[0]]
        sharded = self._sharded is not None and storage.name in self._sharded.sharded
        return ids, storage.plan.fused, self._ids_are_rows(storage), \
            self._sharded.ctx.world_size if sharded else 0, self._one_pass(storage.name)

    def _widen(self, name: str, batch: StorageBatch) -> None:
        """After a batch whose ids did not fit the one-pass keys it tried: int64 keys
        from now if it tried int32 keys and its ids fit int64 ones, else two passes. A
        batch prepared ahead tried the keys of before: a move it repeats is not logged."""
        ranges = batch.key_ranges or []
        limit = 1 << pad_bits(len(ranges))  # the stricter, padded form
        if batch.wide_ids == COMPACT and all(0 <= r[0] and r[1] < limit
                                             for r in ranges if r is not None):
            if name not in self._long_ids and name not in self._wide_ids:
                logger.info("storage %r: an id past the dedup sort's int32 keys; sorting "
                            "int64 keys from now", name)
            self._long_ids.add(name)
        elif name not in self._wide_ids:
            self._wide_ids.add(name)
            logger.info("storage %r: an id past the dedup sort's one-pass keys; sorting in "
                        "two passes from now", name)

    def _one_pass(self, name: str) -> int:
        """The one-pass dedup sort a storage's keys try: int32 keys until an id does not
        fit them, then int64 keys until an id does not fit those, then none."""
        if name in self._wide_ids:
            return 0
        return NARROW if name in self._long_ids else COMPACT

    def _ids_are_rows(self, storage: Storage) -> bool:
        """Dense tables without ZCH: every id is a row (range-checked before lookups)."""
        return not storage.plan.is_dynamic and storage.name not in self.zch_remappers

    def _read_storages(self) -> list[Storage]:
        """Storages (dense groups included) that some feature reads (the same on every rank)."""
        return [s for s in self._units if any(self._readers[s.name])]

    def _dedup(self, storages: list[Storage], ids: list[list[list[FeatureIds]]],
               pending: PendingDedup | None = None
               ) -> tuple[list[tuple[int, ...]], list[StorageBatch], list]:
        """Deduplicated ids of every join (``_joins``), dense ids checked before anything
        changes: the joins, each join's batch, and each storage's part of its join's
        batch (``split_join``; a storage alone: the batch itself).

        ``pending``: the non-ZCH joins' dedup started by ``prepare``. ZCH storages
        are remapped (which may claim slots) only after every other dense table's ids
        passed the range check.
        """
        joins = self._joins(storages)
        batches: list[StorageBatch | None] = [None] * len(joins)
        parts: list = [None] * len(storages)
        for group in (False, True):
            picked = [k for k, join in enumerate(joins)
                      if (storages[join[0]].name in self.zch_remappers) == group]
            if not picked:
                continue
            if group:
                for k in picked:
                    self._remap_zch(storages[joins[k][0]], ids[joins[k][0]][0])
            if pending is not None and not group:
                done = pending.result()
            else:
                done = dedup_storages([self._dedup_entry(storages, ids, joins[k])
                                       for k in picked], aside=self._sharded is None)
            for k, batch in zip(picked, done):
                batches[k] = batch
                members = [storages[i] for i in joins[k]]
                if batch.wide_ids:  # ids past the one-pass sort's range: a wider one from now
                    self._widen(joint_name(members), batch)
                split = [batch]
                if len(members) > 1:
                    split = split_join(batch, members, self._sharded_names)
                    batch.member_rows = [0, *itertools.accumulate(p.keys.numel()
                                                                  for p in split)]
                for i, part in zip(joins[k], split):
                    parts[i] = part
            if not group:
                read = [i for k in picked for i in joins[k]]
                self._check_dense_ids([storages[i] for i in read], [ids[i] for i in read],
                                      [parts[i] for i in read])
        return joins, batches, parts

    def _lookups(self, storages: list[Storage], ids: list[list[list[FeatureIds]]],
                 joins: list[tuple[int, ...]], batches: list[StorageBatch], parts: list
                 ) -> list[tuple[StorageBatch, torch.Tensor, TableRows | None]]:
        """Every join's batch and unique rows (members' rows one after the other), each
        storage's lookup counted in its statistics. Under several ranks the storages'
        requests go to the exchanges in the storages' order (what ``idle_lookups``
        matches). A storage alone in its join whose features are all bags and whose
        table ``skips_stored_rows`` returns only the rows of ids without a slot, and
        where its features read the others (``TableRows``)."""
        by_slot = [False] * len(storages)
        if self._sharded is not None:
            looked = self._sharded.lookup(
                [Request(s, p.keys, p.tags, p.counts, p.owner_counts, p.recv_counts,
                         p.unique_per_rank, p.pair_max) for s, p in zip(storages, parts)],
                self.training)
        else:
            for join, batch in zip(joins, batches):  # bags of a lone storage: by slot
                by_slot[join[0]] = len(join) == 1 and storages[join[0]].skips_stored_rows() \
                    and not any(f.spec.is_sequence for f in batch.features)
            looked = [lookup_rows(s, p.keys, p.tags, p.counts, self.training, not slotted)
                      for s, p, slotted in zip(storages, parts, by_slot)]
        for storage, fs, part, (_, slots) in zip(storages, ids, parts, looked):
            self._count(storage, part, fs, slots)
        out = []
        for join, batch in zip(joins, batches):
            if len(join) > 1:
                out.append((batch, torch.cat([looked[i][0] for i in join]), None))
                continue
            (rows, slots), storage = looked[join[0]], storages[join[0]]
            out.append((batch, rows, TableRows(storage.table.storage.values, slots)
                        if by_slot[join[0]] else None))
        return out

    def idle_lookups(self) -> None:
        """Serve the peers' eval-mode lookups without a batch of this rank's own.

        Under several ranks every rank must join every forward's exchanges; a rank
        whose evaluation input ran out calls this once per step its peers still run.
        A no-op on one rank.
        """
        if self._sharded is not None:
            self._sharded.idle(self._read_storages(),
                               {s.name: s.plan.fused for s in self._units})

    def _check_input(self, kjt: KeyedJaggedTensor) -> None:
        keys = set(kjt.keys())
        wanted = [k for f in self._features.values()
                  for k in ((f.input_key, items_key(f.input_key)) if f.multi_value
                            else (f.input_key,))]
        missing = list(dict.fromkeys(k for k in wanted if k not in keys))
        if missing:
            raise EmbeddingError(f"KeyedJaggedTensor lacks features {missing}; "
                                 f"it has {kjt.keys()}")
        if kjt.device.type != self._device.type or (
                self._device.index is not None and kjt.device != self._device):
            raise EmbeddingError(f"KeyedJaggedTensor is on {kjt.device} but the embedding "
                                 f"collection is on {self._device}; move the batch first")

    def _remap_zch(self, storage: Storage, ids: list[FeatureIds]) -> None:
        """Raw ids of a ZCH table -> its slots (-1 without one), in place.

        Several ranks, training a trainable table: every rank remaps the global batch's
        ids in rank order (one all-gather), so the replicated remappers stay identical,
        and the rows an eviction re-initializes are rank 0's (one broadcast on those
        steps). A frozen table remaps as in evaluation (no new ids, no evictions).
        """
        raw = torch.cat([f.values for f in ids])
        remapper = self.zch_remappers[storage.name]
        train = storage.changes_in(self.training)
        if not (train and self._sharded is not None):
            slots, reset = remapper.remap(raw, train)
            storage.table.reset_rows(reset)
        else:
            ctx, group = self._sharded.ctx, self._sharded.group
            everyone = all_gather_rows(raw, ctx, group)
            start = sum(part.numel() for part in everyone[:ctx.rank])
            slots, reset = remapper.remap(torch.cat(everyone), True)
            slots = slots[start:start + raw.numel()]
            storage.table.reset_rows(reset)
            with torch.no_grad():
                broadcast_rows(storage.table.rows, reset, ctx, group)
        start = 0
        for f in ids:
            f.values = slots[start:start + f.values.numel()]
            start += f.values.numel()

    def _check_dense_ids(self, storages: list[Storage], ids: list[list[list[FeatureIds]]],
                         batches: list[StorageBatch]) -> None:
        """Ids of dense (non-ZCH) tables must be rows of the table.

        The dedup brought every storage's smallest and largest id to the host, so
        the check reads nothing more from the device unless an id is out of range.
        """
        for storage, fs, batch in zip(storages, ids, batches):
            if storage.plan.is_dynamic or storage.name in self.zch_remappers:
                continue
            for spec, features, key_range in zip(storage.plan.tables, fs, batch.key_ranges):
                if key_range is not None and (key_range[0] < 0 or key_range[1] >= spec.num_rows):
                    self._raise_dense_ids(spec.name, spec.num_rows, features)

    @staticmethod
    def _raise_dense_ids(table: str, num_rows: int, ids: list[FeatureIds]) -> None:
        for f in ids:
            if f.values.numel() and bool(((f.values < 0) | (f.values >= num_rows)).any()):
                bad = f.values[(f.values < 0) | (f.values >= num_rows)][:5].tolist()
                raise EmbeddingError(
                    f"feature {f.spec.name!r}: ids {bad} are outside [0, {num_rows}) of "
                    f"table {table!r}; check num_buckets / hash_bucket_size")

    def _count(self, storage: Storage, batch: StorageBatch, ids: list[list[FeatureIds]],
               slots: torch.Tensor) -> None:
        if not any(ids):
            return
        # Every id of a dense table without ZCH has its row: stored = unique, no device op.
        record_lookups([c if features else None for c, features in zip(storage.counters, ids)],
                       [sum(f.values.numel() for f in features) for features in ids],
                       batch.unique_per_table,
                       None if self._ids_are_rows(storage) else slots, batch.tags)

    # -- learning rate, tables, statistics ---------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        """Sets the sparse optimizer's learning rate of every table (LR schedules)."""
        for storage in self._storages + self._units:
            storage.lr = float(lr)

    def set_backward_timer(self, timer) -> None:
        """Times every storage's backward node in ``timer.region()`` (None: untimed)."""
        for storage in self._storages + self._units:
            storage.backward_timer = timer

    def dynamic_tables(self) -> dict[str, HashTable]:
        """Dynamic storages by storage name (a fused storage serves several tables)."""
        return {s.name: s.table for s in self._storages if s.plan.is_dynamic}

    def fused_table_sizes(self) -> dict[str, dict[str, int]]:
        """Entries of each table of a fused dynamic storage: {storage: {table: size}}."""
        return fused_table_sizes(self._storages)

    def table_locations(self) -> dict[str, tuple[str, int]]:
        """Logical table -> (storage name, tag); dense tables map to (their name, 0)."""
        return dict(self._locations)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by all storages: {"gpu": ..., "host": ...}."""
        total = {"gpu": 0, "host": 0}
        for storage in self._storages:
            for where, size in storage.table.memory_bytes().items():
                total[where] = total.get(where, 0) + size
        return total

    def stats(self) -> dict[str, dict[str, dict]]:
        """Counters to log: {"tables": {table: {...}}, "storages": {storage: {...}}}.

        Per logical table: storage, tag, size, lookups (forwards that read it), ids,
        unique_ids, stored, stored_rate; a dynamic table's admission_rejected and refused
        (in a fused storage, its own). Per storage: the table's counters (lookups and
        hits of unique keys, inserts, evictions, refused, admission_rejected, growths,
        size, capacity; a fused storage's ``admission_rejected/<table>`` and
        ``refused/<table>``) plus load_factor, hit_rate, tables and memory_bytes; a ZCH
        table's storage adds its remapper's (``ZchRemapper.counters``: size and load
        of rows held, assigned, evictions, without_row, hits, lookups) and hit_rate,
        and its table's size is the rows held. See ``hashrec.embedding.stats``.
        """
        return collection_stats(self._storages, dict(self.zch_remappers.items()))
