"""Features -> embedding tables: ``embedding_name`` sharing, dynamic options, fusion groups.

Features sharing a table must agree on what it is: embedding_dim, rows, dense or
dynamic, dynamicemb settings, zch, init_fn and data_type (the dtype its rows are
stored in). A feature's own table is named after it; TorchEasyRec calls it
``<feature>_emb``, so an ``embedding_name`` of that form shares it (``alias_emb_names``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Set

import torch

from hashrec.config.errors import ConfigError
from hashrec.config.sequence_groups import group_feature_names
from hashrec.embedding.specs import EmbeddingTableSpec
from hashrec.features.base import Feature, TableRequest
from hashrec.features.data_type import data_type_name
from hashrec.table.options import (
    STORAGE_CHOICES,
    AdmissionOptions,
    InitializerArgs,
    TableOptions,
)

logger = logging.getLogger("hashrec.features")

# The fields of a DynamicEmbInitializerArgs message each mode draws from (dynamicemb's
# and TorchEasyRec's reading); a field set beside another mode is not read.
_MODE_FIELDS = {"NORMAL": ("mean", "std_dev"),
                "TRUNCATED_NORMAL": ("mean", "std_dev", "lower", "upper"),
                "UNIFORM": ("lower", "upper"), "CONSTANT": ("value",), "DEBUG": ()}


def initializer_args(cfg, default_mode: str, where: str, dim: int,
                     max_capacity: int) -> InitializerArgs:
    """InitializerArgs from a DynamicEmbInitializerArgs message (unset mode -> ``default_mode``).

    Args:
        cfg: the message.
        default_mode: the mode where ``cfg`` sets none.
        where: the block, as errors name it (``table 'u': dynamicemb.initializer_args``).
        dim, max_capacity: the table's, for the defaults of unset bounds.

    Raises:
        ConfigError: naming ``where``: an unknown mode, a bad value, or a UNIFORM bound set
            on one side only that crosses the other side's default.
    """
    try:
        args = InitializerArgs(
            mode=cfg.mode.upper() if cfg.mode else default_mode,
            mean=cfg.mean,
            std_dev=cfg.std_dev if cfg.HasField("std_dev") else None,
            lower=cfg.lower if cfg.HasField("lower") else None,
            upper=cfg.upper if cfg.HasField("upper") else None,
            value=cfg.value,
        )
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    try:
        # The embedding layer fills in the same defaults; a crossing is found here, at load.
        args.resolved(dim, max_capacity, field_name=where)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    unread = [name for name in ("mean", "std_dev", "lower", "upper", "value")
              if cfg.HasField(name) and name not in _MODE_FIELDS[args.mode.name]]
    if unread:
        logger.warning("%s: mode %s does not read %s (it reads %s), which %s ignored",
                       where, args.mode.name, ", ".join(unread),
                       ", ".join(_MODE_FIELDS[args.mode.name]) or "none",
                       "is" if len(unread) == 1 else "are")
    return args


# Score strategies a config may name. CUSTOMIZED is left out: its scores are passed by
# the caller of every lookup, which the Python API (``hashrec.table``) does and a config
# cannot.
CONFIG_SCORE_STRATEGIES = ("STEP", "TIMESTAMP", "LFU", "NO_EVICTION")
_CUSTOMIZED = ("is not available in a config: CUSTOMIZED scores are passed by the caller of "
               "every lookup (the Python API, hashrec.table), which a config cannot do")

# What each of dynamicemb's evict strategies asks of the scores: the score strategies
# that evict that way (the first when score_strategy is unset). EPOCH_LRU (the epoch
# above the last access's time) orders entries as LRU does under a clock that never runs
# backwards, as the step does: an earlier epoch's last access is the earlier one.
# EPOCH_LFU (an access count under the epoch) is not built.
_EVICT_SCORES = {"LRU": ("STEP", "TIMESTAMP"), "EPOCH_LRU": ("STEP", "TIMESTAMP"),
                 "LFU": ("LFU",)}
# dynamicemb's numbering of its evict strategies, which its proto stores as an int.
_EVICT_NUMBERS = {"0": "LRU", "1": "LFU", "2": "EPOCH_LRU", "3": "EPOCH_LFU", "4": "CUSTOMIZED"}


def score_strategy(dynamicemb, where: str) -> str:
    """The table's score strategy: ``score_strategy``, or the one ``evict_strategy``
    implies where only that is set (LRU and EPOCH_LRU: STEP, LFU: LFU). ``where`` names
    the block in errors (``table 'u': dynamicemb``).

    Raises:
        ConfigError: score_strategy is not one of ``CONFIG_SCORE_STRATEGIES`` (CUSTOMIZED
            included), evict_strategy is not one of LRU, EPOCH_LRU, LFU (EPOCH_LFU is not
            built) or their dynamicemb numbers 0, 2, 1, or the two disagree.
    """
    allowed = ", ".join(CONFIG_SCORE_STRATEGIES)
    score = dynamicemb.score_strategy.strip().upper()
    if score == "CUSTOMIZED":
        raise ConfigError(f"{where}.score_strategy CUSTOMIZED {_CUSTOMIZED}; allowed: {allowed}")
    if score not in CONFIG_SCORE_STRATEGIES:
        hint = (f" ({score} is an evict_strategy, which picks score_strategy "
                f"{' or '.join(_EVICT_SCORES[score])}: set evict_strategy: \"{score}\" instead)"
                if score in _EVICT_SCORES else "")
        raise ConfigError(f"{where}.score_strategy {dynamicemb.score_strategy!r} is not "
                          f"supported; allowed: {allowed}{hint}")
    if not dynamicemb.HasField("evict_strategy"):
        return score
    raw = dynamicemb.evict_strategy.strip().upper()
    evict = _EVICT_NUMBERS.get(raw, raw)
    numbers = {name: number for number, name in _EVICT_NUMBERS.items()}
    instead = (f"allowed: {', '.join(_EVICT_SCORES)} (dynamicemb's numbers "
               f"{', '.join(numbers[name] for name in _EVICT_SCORES)}; or leave it unset and "
               f"set score_strategy: {' | '.join(CONFIG_SCORE_STRATEGIES)})")
    if evict == "CUSTOMIZED":
        raise ConfigError(f"{where}.evict_strategy CUSTOMIZED {_CUSTOMIZED}; {instead}")
    if evict not in _EVICT_SCORES:
        named = f" ({evict})" if raw in _EVICT_NUMBERS else ""
        raise ConfigError(f"{where}.evict_strategy {dynamicemb.evict_strategy!r}{named} is not "
                          f"supported; {instead}")
    scores = _EVICT_SCORES[evict]
    if not dynamicemb.HasField("score_strategy"):
        return scores[0]
    if score not in scores:
        raise ConfigError(
            f"{where}.evict_strategy {evict} and score_strategy {score} disagree: {evict} "
            f"eviction takes score_strategy {' or '.join(scores)}; set one of them alone")
    return score


def _admission(dynamicemb, where: str, dim: int, max_capacity: int) -> AdmissionOptions:
    """AdmissionOptions of a ``frequency_admission_strategy`` block."""
    fa = dynamicemb.frequency_admission_strategy
    block = f"{where}.frequency_admission_strategy"
    initializer = initializer_args(fa.initializer_args, "CONSTANT", f"{block}.initializer_args",
                                   dim, max_capacity)
    try:
        return AdmissionOptions(
            threshold=int(fa.threshold),
            counter_capacity=int(fa.counter_capacity) if fa.HasField("counter_capacity")
            else None,
            counter_bucket_capacity=int(fa.counter_bucket_capacity), initializer=initializer)
    except ValueError as err:
        raise ConfigError(f"{block}: {err}") from None


def _capacities(dynamicemb, where: str) -> tuple[int, int | None]:
    """(max_capacity, init_capacity_per_rank or None), checked under their config names."""
    max_capacity = int(dynamicemb.max_capacity)
    if max_capacity < 1:
        raise ConfigError(f"{where}.max_capacity={max_capacity} is not valid; allowed: an int "
                          f">= 1 (the table's rows over all ranks)")
    if not dynamicemb.HasField("init_capacity_per_rank"):
        return max_capacity, None
    init = int(dynamicemb.init_capacity_per_rank)
    if init == 0:
        # As TorchEasyRec reads it (a zero initial capacity is no initial capacity).
        logger.info("%s.init_capacity_per_rank=0 is read as unset: each rank allocates its "
                    "whole share of max_capacity at start", where)
        return max_capacity, None
    if init > max_capacity:
        # As dynamicemb clamps its init_capacity: a rank never starts above what the whole
        # table may hold (a shard's smaller share bounds it again per rank).
        logger.info("%s.init_capacity_per_rank=%d is above max_capacity (%d): the table "
                    "starts at max_capacity", where, init, max_capacity)
        init = max_capacity
    return max_capacity, init


def _table_label(table: str, features: tuple[str, ...]) -> str:
    """``table 't'``, with its features where the table is not named after its one feature."""
    if not features or features == (table,):
        return f"table {table!r}"
    return (f"table {table!r} (feature{'s' if len(features) > 1 else ''} "
            f"{', '.join(map(repr, features))})")


def table_options(dynamicemb, dim: int, table: str, dtype: torch.dtype = torch.float32,
                  features: tuple[str, ...] = ()) -> TableOptions:
    """TableOptions of a dynamic table from its DynamicEmbedding message; ``dtype`` (its
    features' ``data_type``) stores the rows; errors name ``features``, those reading it.

    The sparse optimizer is left unset: the embedding layer fills it from
    ``train_config.sparse_optimizer``. ``evict_strategy`` enters through the score
    strategy (``score_strategy``); ``init_table`` does not enter the options (it is
    read by ``create_dynamicemb_init_ckpt``). ``cache_load_factor`` and ``caching`` are
    recorded in ``set_by_user`` where the message sets them: the storage planner keeps
    those and chooses the others.

    Raises:
        ConfigError: an invalid field, named as the config names it.
    """
    where = f"{_table_label(table, features)}: dynamicemb"
    max_capacity, init_capacity = _capacities(dynamicemb, where)
    strategy = score_strategy(dynamicemb, where)
    admission = _admission(dynamicemb, where, dim, max_capacity) \
        if dynamicemb.HasField("frequency_admission_strategy") else None
    initializer = initializer_args(dynamicemb.initializer_args, "UNIFORM",
                                   f"{where}.initializer_args", dim, max_capacity)
    eval_initializer = initializer_args(dynamicemb.eval_initializer_args, "CONSTANT",
                                        f"{where}.eval_initializer_args", dim, max_capacity)
    if eval_initializer.mode.name != "CONSTANT":
        # As dynamicemb, which refuses any other: evaluation and export read an id the
        # table lacks as one fixed value.
        raise ConfigError(
            f"{where}.eval_initializer_args.mode {eval_initializer.mode.name} is not "
            f"supported; allowed: CONSTANT (what an id the table lacks reads as in "
            f"evaluation and in an export; value default 0)")
    try:
        return TableOptions(
            dim=dim, max_capacity=max_capacity, init_capacity=init_capacity,
            bucket_capacity=int(dynamicemb.bucket_capacity), score_strategy=strategy,
            initializer=initializer, eval_initializer=eval_initializer, admission=admission,
            cache_load_factor=dynamicemb.cache_load_factor
            if dynamicemb.HasField("cache_load_factor") else 1.0,
            caching=dynamicemb.caching, dtype=dtype, name=table,
            set_by_user=frozenset(name for name in STORAGE_CHOICES
                                  if dynamicemb.HasField(name)))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _merge(requests: list[tuple[str, TableRequest]]) -> TableRequest:
    """One request per table; features sharing a table must agree on it."""
    first_feature, first = requests[0]
    dynamic = [(f, r) for f, r in requests if r.dynamicemb is not None]
    for feature, req in requests[1:]:
        if req.dim != first.dim:
            raise ConfigError(f"features {first_feature!r} and {feature!r} share table "
                              f"{first.name!r} but have embedding_dim {first.dim} and {req.dim}")
        if req.num_rows != first.num_rows and None not in (req.num_rows, first.num_rows):
            raise ConfigError(f"features {first_feature!r} and {feature!r} share table "
                              f"{first.name!r} but have {first.num_rows} and {req.num_rows} rows")
    if dynamic and any(r.num_rows is not None for _, r in requests):
        dense = next(f for f, r in requests if r.num_rows is not None)
        raise ConfigError(f"table {first.name!r}: feature {dynamic[0][0]!r} sets dynamicemb but "
                          f"{dense!r} reads it as a dense table; use one kind per table")
    for feature, req in dynamic[1:]:
        if req.dynamicemb != dynamic[0][1].dynamicemb:
            raise ConfigError(f"features {dynamic[0][0]!r} and {feature!r} share table "
                              f"{first.name!r} with different dynamicemb settings")
    for feature, req in requests[1:]:
        if req.dtype != first.dtype:
            raise ConfigError(
                f"features {first_feature!r} and {feature!r} share table {first.name!r} but "
                f"have data_type {data_type_name(first.dtype)} and {data_type_name(req.dtype)}; "
                f"set the same data_type on every feature of the table")
        if req.zch != first.zch:
            raise ConfigError(f"features {first_feature!r} and {feature!r} share table "
                              f"{first.name!r} with different zch settings")
    initialized = [(f, r.initializer) for f, r in requests if r.initializer is not None]
    for feature, init in initialized[1:]:
        if init != initialized[0][1]:
            raise ConfigError(f"features {initialized[0][0]!r} and {feature!r} share table "
                              f"{first.name!r} with different init_fn")
    trainable = all(r.trainable for _, r in requests)
    return TableRequest(first.name, first.dim, first.num_rows,
                        dynamic[0][1].dynamicemb if dynamic else None, trainable, first.zch,
                        initialized[0][1] if initialized else None, first.dtype)


# Group types whose dynamic tables fuse, in the order they decide a table's group: DEEP,
# then SEQUENCE and JAGGED_SEQUENCE (WIDE groups' tables are their own: features/wide.py).
_FUSING_TYPES = ((0,), (2, 3))


def fusion_group(features: tuple[str, ...], model_config) -> str | None:
    """The feature group whose dynamic tables fuse with the table ``features`` read: the
    one DEEP group holding some of them, else the one SEQUENCE (or JAGGED_SEQUENCE)
    group. A feature in two groups of the deciding type counts for neither; None when
    the features lie in several groups of that type, or in none."""
    for types in _FUSING_TYPES:
        owners: dict[str, set[str]] = {}
        for group in model_config.feature_groups:
            if group.group_type in types:
                for name in group_feature_names(group):
                    if name in features:
                        owners.setdefault(name, set()).add(group.group_name)
        if owners:
            held = {next(iter(groups)) for groups in owners.values() if len(groups) == 1}
            return held.pop() if len(held) == 1 else None
    return None


EMB_SUFFIX = "_emb"


def alias_emb_names(features: list[Feature]) -> dict[str, str]:
    """Points an ``embedding_name`` ``<feature>_emb`` at the table of that feature where
    its table is its own (named after it, as HashRec names a feature's own table), as
    TorchEasyRec names it so and shares it; returns {feature: table it now reads}."""
    own = {f.name for f in features if f.table is not None and f.table.name == f.name}
    moved = {}
    for feature in features:
        table = feature.table
        if table is None or not table.name.endswith(EMB_SUFFIX):
            continue
        owner = table.name[:-len(EMB_SUFFIX)]
        if owner in own and owner != feature.name:
            feature.table = dataclasses.replace(table, name=owner)
            moved[feature.name] = owner
    return moved


def build_tables(features: list[Feature], model_config=None) -> list[EmbeddingTableSpec]:
    """Resolve every sparse feature's TableRequest into EmbeddingTableSpecs (first-use order)."""
    by_table: dict[str, list[tuple[str, TableRequest]]] = {}
    for feature in features:
        if feature.table is not None:
            by_table.setdefault(feature.table.name, []).append((feature.name, feature.table))
    specs = []
    for name, requests in by_table.items():
        req = _merge(requests)
        names = tuple(f for f, _ in requests)
        if req.dynamicemb is None:
            specs.append(EmbeddingTableSpec(name, req.dim, num_rows=req.num_rows, features=names,
                                            trainable=req.trainable, zch=req.zch,
                                            initializer=req.initializer, dtype=req.dtype))
            continue
        options = table_options(req.dynamicemb, req.dim, name, req.dtype, names)
        if req.initializer is not None:
            if req.dynamicemb.HasField("initializer_args"):
                raise ConfigError(f"table {name!r}: init_fn and dynamicemb.initializer_args "
                                  f"both say how rows start; keep one")
            options = dataclasses.replace(options, initializer=req.initializer)
        specs.append(EmbeddingTableSpec(
            name, req.dim, dynamic=options, features=names,
            fusion_group=fusion_group(names, model_config) if model_config is not None
            else None, trainable=req.trainable))
    return specs


def tables_read_by(specs: list[EmbeddingTableSpec], features: Set[str]
                   ) -> list[EmbeddingTableSpec]:
    """The tables some of ``features`` read, each listing only those features (order kept)."""
    kept = []
    for spec in specs:
        readers = tuple(f for f in spec.features if f in features)
        if readers:
            kept.append(spec if readers == spec.features
                        else dataclasses.replace(spec, features=readers))
    return kept
