"""Options of a dynamic table: frozen dataclasses validated on construction.

Every enum field also accepts its name as a string (``"LFU"``, ``"normal"``);
a bad value raises ``ValueError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from hashrec.table.optim import OPTIMIZER_SPECS, OptimizerSpec


class ScoreStrategy(enum.Enum):
    """How an entry's score (larger = more important) is kept."""

    STEP = "STEP"  # training step of the last access (the caller advances the step)
    TIMESTAMP = "TIMESTAMP"  # wall-clock microseconds of the last access
    LFU = "LFU"  # access count, duplicates in a batch counted by multiplicity
    CUSTOMIZED = "CUSTOMIZED"  # scores given by the caller
    NO_EVICTION = "NO_EVICTION"  # score as STEP, but full buckets refuse instead of evicting


class InitializerMode(enum.Enum):
    """Distribution of a new row's embedding."""

    NORMAL = "NORMAL"
    TRUNCATED_NORMAL = "TRUNCATED_NORMAL"
    UNIFORM = "UNIFORM"
    CONSTANT = "CONSTANT"
    DEBUG = "DEBUG"  # every column float(key mod 100000), the key read as uint64 (dynamicemb's)


class CheckMode(enum.Enum):
    """What a refused insert does: raise, log a warning with counts, or nothing."""

    ERROR = "ERROR"
    WARNING = "WARNING"
    IGNORE = "IGNORE"


class StorageMode(enum.Enum):
    """Where values live, derived from ``cache_load_factor`` and ``caching``."""

    HBM_ONLY = "HBM_ONLY"
    HYBRID = "HYBRID"
    CACHING = "CACHING"


# The options the storage planner chooses unless the user did (``TableOptions.set_by_user``).
STORAGE_CHOICES = ("cache_load_factor", "caching")

# Dtypes a table stores its rows (embedding and optimizer state) in.
ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def coerce_enum(enum_cls: type[enum.Enum], value: Any, field_name: str) -> enum.Enum:
    """Returns ``value`` as a member of ``enum_cls``; accepts members and names (any case).

    Raises:
        ValueError: naming ``field_name``, the value and the allowed names.
    """
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str) and value.upper() in enum_cls.__members__:
        return enum_cls[value.upper()]
    allowed = ", ".join(enum_cls.__members__)
    raise ValueError(f"{field_name}={value!r} is not valid; allowed: {allowed}")


SEED_LIMIT = 2 ** 63  # seeds are int64 (torch generators, the key hash): [0, 2**63)


def _check_int(field_name: str, value: Any, minimum: int, optional: bool = False,
               maximum: int | None = None) -> int | None:
    """``value`` as a plain int (NumPy integers accepted, bools refused), or None."""
    if optional and value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum
            or (maximum is not None and value > maximum)):
        allowed = f"an int >= {minimum}" if maximum is None else \
            f"an int in [{minimum}, {maximum}]"
        raise ValueError(f"{field_name}={value!r} is not valid; allowed: {allowed}")
    return int(value)


def _check_float(field_name: str, value: Any, optional: bool = False) -> float | int | None:
    """``value`` as a plain Python number (NumPy scalars accepted, bools refused), or None."""
    if optional and value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)):
        raise ValueError(f"{field_name}={value!r} is not valid; allowed: a finite number")
    return value if type(value) in (int, float) else float(value)


def _set_checked(options: Any, checks: dict[str, Any]) -> None:
    """Stores each checked value (a plain Python number) on the frozen ``options``."""
    for name, value in checks.items():
        object.__setattr__(options, name, value)


@dataclass(frozen=True)
class InitializerArgs:
    """How new rows' embeddings are drawn (dynamicemb's ``initializer_args``).

    Attributes:
        mode: NORMAL | TRUNCATED_NORMAL | UNIFORM | CONSTANT | DEBUG (every column of a
            key's row is float(key mod 100000), the key read as an unsigned 64-bit number,
            as dynamicemb's DEBUG mode: rows that tell their keys, for tests).
        mean: mean of NORMAL and TRUNCATED_NORMAL.
        std_dev: standard deviation of NORMAL / TRUNCATED_NORMAL; None -> sqrt(1 / dim).
        lower: UNIFORM lower bound; None -> -sqrt(1 / max_capacity).
        upper: UNIFORM upper bound; None -> +sqrt(1 / max_capacity).
            TRUNCATED_NORMAL cuts at the absolute bounds [lower, upper] (dynamicemb's
            cut; lower < upper): an unset bound leaves its side uncut, and with neither
            set the cut is at mean +- 2 * std_dev.
        value: CONSTANT value.
        key_seed: None draws from a random generator (depends on batch order). An int
            makes initialization per-key deterministic: the vector is a hash of
            (key_seed, key, tag, column), identical whatever the batch order or rank.
    """

    mode: InitializerMode | str = InitializerMode.UNIFORM
    mean: float = 0.0
    std_dev: float | None = None
    lower: float | None = None
    upper: float | None = None
    value: float = 0.0
    key_seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", coerce_enum(InitializerMode, self.mode, "mode"))
        _set_checked(self, {
            "mean": _check_float("mean", self.mean),
            "std_dev": _check_float("std_dev", self.std_dev, optional=True),
            "lower": _check_float("lower", self.lower, optional=True),
            "upper": _check_float("upper", self.upper, optional=True),
            "value": _check_float("value", self.value)})
        if self.std_dev is not None and self.std_dev < 0:
            raise ValueError(f"std_dev={self.std_dev!r} is not valid; allowed: >= 0")
        # Only these modes read the bounds (another mode's are ignored, with a warning where
        # a config sets them); a truncated normal cut to one point has no probability left
        # to draw from.
        bounded = self.mode in (InitializerMode.UNIFORM, InitializerMode.TRUNCATED_NORMAL)
        if bounded and self.lower is not None and self.upper is not None:
            truncated = self.mode is InitializerMode.TRUNCATED_NORMAL
            if self.lower > self.upper or (truncated and self.lower == self.upper):
                allowed = f"lower {'<' if truncated else '<='} upper ({self.upper!r})"
                raise ValueError(f"lower={self.lower!r} is not valid; allowed: {allowed}"
                                 + (" for TRUNCATED_NORMAL" if truncated else ""))
        object.__setattr__(self, "key_seed", _check_int("key_seed", self.key_seed, minimum=0,
                                                        optional=True, maximum=SEED_LIMIT - 1))

    def resolved(self, dim: int, max_capacity: int, field_name: str = "initializer"
                 ) -> InitializerArgs:
        """Returns a copy with dynamicemb's defaults filled in for this table.

        A TRUNCATED_NORMAL keeps its unset bounds None (no cut on that side).

        Raises:
            ValueError: a UNIFORM bound set on one side only crosses the other side's
                default, +-sqrt(1 / max_capacity) (naming ``field_name``).
        """
        std_dev = math.sqrt(1.0 / dim) if self.std_dev is None else self.std_dev
        if self.mode is InitializerMode.TRUNCATED_NORMAL:
            return replace(self, std_dev=std_dev)
        bound = math.sqrt(1.0 / max_capacity)
        lower = -bound if self.lower is None else self.lower
        upper = bound if self.upper is None else self.upper
        if self.mode is InitializerMode.UNIFORM and lower > upper:
            side, value = ("upper", upper) if self.upper is None else ("lower", lower)
            raise ValueError(
                f"{field_name}: lower={lower!r} > upper={upper!r}, where {side}={value!r} is "
                f"the default {'+' if side == 'upper' else '-'}sqrt(1 / max_capacity) for "
                f"max_capacity={max_capacity}; allowed: lower <= upper, so set {side} too")
        return replace(
            self,
            std_dev=std_dev,
            lower=-bound if self.lower is None else self.lower,
            upper=bound if self.upper is None else self.upper,
        )


def _constant_zero() -> InitializerArgs:
    return InitializerArgs(mode=InitializerMode.CONSTANT, value=0.0)


@dataclass(frozen=True)
class AdmissionOptions:
    """Frequency admission: a key is stored once its counted frequency reaches ``threshold``.

    Attributes:
        threshold: occurrences (duplicates in one batch count) needed to admit a key; 0
            admits every key where first seen, as 1 does (dynamicemb takes both).
        counter_capacity: slots of the bounded counter table; None -> max_capacity.
        counter_bucket_capacity: slots per counter bucket; a full bucket evicts its
            lowest counts.
        initializer: what a key not (yet) admitted reads as; CONSTANT 0 by default.
    """

    threshold: int = 1
    counter_capacity: int | None = None
    counter_bucket_capacity: int = 1024
    initializer: InitializerArgs = field(default_factory=_constant_zero)

    def __post_init__(self) -> None:
        _set_checked(self, {
            "threshold": _check_int("threshold", self.threshold, minimum=0),
            "counter_capacity": _check_int("counter_capacity", self.counter_capacity,
                                           minimum=1, optional=True),
            "counter_bucket_capacity": _check_int("counter_bucket_capacity",
                                                  self.counter_bucket_capacity, minimum=1)})
        if not isinstance(self.initializer, InitializerArgs):
            raise ValueError(
                f"initializer={self.initializer!r} is not valid; allowed: InitializerArgs")


@dataclass(frozen=True)
class TableOptions:
    """Options of one dynamic table.

    A ``HashTable`` built from them holds up to ``max_capacity`` entries. An embedding
    collection sharded over N ranks reads ``max_capacity`` (and the admission
    ``counter_capacity``) as the whole table's: each rank's shard holds
    ceil(max_capacity / N) entries, as TorchEasyRec shards its tables row-wise, while
    ``init_capacity`` is per rank.

    Attributes:
        dim: embedding dimension.
        max_capacity: most entries the table holds, over all ranks when sharded; rounded up
            to whole buckets.
        init_capacity: entries allocated at start, per rank (None -> the rank's share of
            max_capacity). Rounded up to whole buckets (max_capacity's count where that
            leaves less than 1.5x to grow); growth then doubles, the last growth going to
            max_capacity's bucket count exactly, 1.5x to 3x (``hashrec.table.capacity``).
        bucket_capacity: slots per bucket; a key lives only in its bucket.
        score_strategy: STEP | TIMESTAMP | LFU | CUSTOMIZED | NO_EVICTION (CUSTOMIZED: the
            caller passes every lookup's scores, so a pipeline config cannot name it).
        initializer: how admitted keys' embeddings start (training).
        eval_initializer: what missing keys read as in evaluation (CONSTANT 0).
        admission: None admits every key; AdmissionOptions counts first.
        optimizer: None (no state columns) or a sparse optimizer spec from
            ``hashrec.table.optim``; decides the state columns of each row.
        cache_load_factor: share of values kept on the GPU (1.0 -> HBM_ONLY).
        caching: with cache_load_factor < 1: False -> HYBRID, True -> CACHING.
            HYBRID splits value rows by bucket between ``device`` and pinned host
            memory; CACHING keeps every row in host memory and the hot ones in a
            device cache (see ``hashrec.table.tiers``).
        check_mode: what a refused insert does: ERROR | WARNING | IGNORE.
        dtype: dtype of embeddings and optimizer state (lookups return float32 rows;
            optimizer updates compute in float32 and store rounded to this dtype).
        device: device of the storage (None -> CPU).
        max_load_factor: load factor past which the table doubles (until max_capacity).
        seed: seed of the table's random generator for initializers; None uses
            torch's global generator.
        name: table name used in error messages.
        set_by_user: which of ``cache_load_factor`` and ``caching`` the user chose (those a
            config sets). The storage planner of a training run keeps these and chooses the
            others (empty: both); a table built directly uses both as given.
        whole_max_capacity: the whole table's max_capacity where this table is one rank's
            row-wise shard of it (messages name both); None: the table is whole.
        tag_names: names of the tags 0, 1, ... (the tables fused into this one, each
            keeping its keys apart by its tag): ``stats()`` then counts each one's
            admission rejections and refused inserts apart, as
            ``admission_rejected/<name>`` and ``refused/<name>``; keys of other tags
            count in the totals alone. Empty: no per-tag counts.
    """

    dim: int
    max_capacity: int
    init_capacity: int | None = None
    bucket_capacity: int = 128
    score_strategy: ScoreStrategy | str = ScoreStrategy.STEP
    initializer: InitializerArgs = field(default_factory=InitializerArgs)
    eval_initializer: InitializerArgs = field(default_factory=_constant_zero)
    admission: AdmissionOptions | None = None
    optimizer: OptimizerSpec | None = None
    cache_load_factor: float = 1.0
    caching: bool = False
    check_mode: CheckMode | str = CheckMode.WARNING
    dtype: torch.dtype = torch.float32
    device: torch.device | str | None = None
    max_load_factor: float = 0.75
    seed: int | None = None
    name: str = "table"
    set_by_user: frozenset[str] = frozenset()
    whole_max_capacity: int | None = None
    tag_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _set_checked(self, {
            "dim": _check_int("dim", self.dim, minimum=1),
            "max_capacity": _check_int("max_capacity", self.max_capacity, minimum=1),
            "whole_max_capacity": _check_int("whole_max_capacity", self.whole_max_capacity,
                                             minimum=self.max_capacity, optional=True),
            "init_capacity": _check_int("init_capacity", self.init_capacity, minimum=1,
                                        optional=True),
            "bucket_capacity": _check_int("bucket_capacity", self.bucket_capacity, minimum=1)})
        if self.init_capacity is not None and self.init_capacity > self.max_capacity:
            raise ValueError(
                f"init_capacity={self.init_capacity!r} is not valid; allowed: "
                f"<= max_capacity ({self.max_capacity})")
        object.__setattr__(
            self, "score_strategy", coerce_enum(ScoreStrategy, self.score_strategy,
                                                "score_strategy"))
        object.__setattr__(self, "check_mode", coerce_enum(CheckMode, self.check_mode,
                                                           "check_mode"))
        for name in ("initializer", "eval_initializer"):
            if not isinstance(getattr(self, name), InitializerArgs):
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not valid; allowed: InitializerArgs")
        if self.admission is not None and not isinstance(self.admission, AdmissionOptions):
            raise ValueError(
                f"admission={self.admission!r} is not valid; allowed: None or AdmissionOptions")
        if self.optimizer is not None and not isinstance(self.optimizer, OPTIMIZER_SPECS):
            allowed = ", ".join(spec.__name__ for spec in OPTIMIZER_SPECS)
            raise ValueError(f"optimizer={self.optimizer!r} is not valid; allowed: None, {allowed}")
        self._check_floats_and_device()

    def _check_floats_and_device(self) -> None:
        _set_checked(self, {
            "cache_load_factor": _check_float("cache_load_factor", self.cache_load_factor),
            "max_load_factor": _check_float("max_load_factor", self.max_load_factor)})
        if not 0.0 < self.cache_load_factor <= 1.0:
            raise ValueError(
                f"cache_load_factor={self.cache_load_factor!r} is not valid; allowed: (0, 1]")
        if not 0.0 < self.max_load_factor <= 1.0:
            raise ValueError(
                f"max_load_factor={self.max_load_factor!r} is not valid; allowed: (0, 1]")
        if not isinstance(self.caching, bool):
            raise ValueError(f"caching={self.caching!r} is not valid; allowed: True, False")
        if self.dtype not in ROW_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not valid; allowed: {ROW_DTYPES}")
        object.__setattr__(self, "seed", _check_int("seed", self.seed, minimum=0, optional=True,
                                                    maximum=SEED_LIMIT - 1))
        if not isinstance(self.name, str):
            raise ValueError(f"name={self.name!r} is not valid; allowed: a str")
        try:
            device = torch.device("cpu" if self.device is None else self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={self.device!r} is not valid; allowed: a torch "
                             f"device") from exc
        object.__setattr__(self, "device", device)
        self._check_set_by_user()
        self._check_tag_names()

    def _check_set_by_user(self) -> None:
        chosen = self.set_by_user
        if isinstance(chosen, str) or not isinstance(chosen, (set, frozenset, tuple, list)) \
                or not set(chosen) <= set(STORAGE_CHOICES):
            raise ValueError(f"set_by_user={chosen!r} is not valid; allowed: a set of "
                             f"{', '.join(map(repr, STORAGE_CHOICES))}")
        object.__setattr__(self, "set_by_user", frozenset(chosen))

    def _check_tag_names(self) -> None:
        names = self.tag_names
        if isinstance(names, str) or not isinstance(names, (tuple, list)) or not all(
                isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"tag_names={names!r} is not valid; allowed: a tuple of distinct "
                             f"non-empty table names, one a tag")
        object.__setattr__(self, "tag_names", tuple(names))

    @property
    def storage_mode(self) -> StorageMode:
        """HBM_ONLY when cache_load_factor is 1.0, else HYBRID or CACHING by ``caching``."""
        if self.cache_load_factor >= 1.0:
            return StorageMode.HBM_ONLY
        return StorageMode.CACHING if self.caching else StorageMode.HYBRID

    @property
    def state_dim(self) -> int:
        """Optimizer state columns per row."""
        return 0 if self.optimizer is None else self.optimizer.state_dim(self.dim)

    @property
    def row_dim(self) -> int:
        """Columns of a stored row: embedding then optimizer state."""
        return self.dim + self.state_dim
