"""ZCH (zero-collision hash) id features: ``zch { zch_size, eviction_interval, lfu | lru |
distance_lfu }``.

Parsing keeps raw ids, exactly as for dynamic-embedding features (integers as they
are, integer strings parsed, other strings hashed); the embedding layer remaps them
into the ``zch_size`` rows of the feature's table (``hashrec.embedding.zch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hashrec.config.errors import ConfigError
from hashrec.embedding.zch import ZchOptions
from hashrec.features.bucketize import raw_int64_ids
from hashrec.features.errors import FeatureError
from hashrec.features.tokens import Bags

_POLICY_OF_FIELD = {"lfu": "LFU", "lru": "LRU", "distance_lfu": "DISTANCE_LFU"}


def zch_options(cfg, feature: str) -> ZchOptions:
    """ZchOptions from a ``ZeroCollisionHash`` message.

    Raises:
        ConfigError: threshold_filtering_func is set (not supported) or a value is invalid.
    """
    if cfg.threshold_filtering_func:
        raise ConfigError(
            f"feature {feature!r}: zch.threshold_filtering_func is not supported; remove it "
            f"(new ids compete for slots by the eviction policy's score)")
    field = cfg.WhichOneof("eviction_policy") or "lfu"
    decay = 1.0
    if field in ("lru", "distance_lfu"):
        decay = float(getattr(cfg, field).decay_exponent)
    try:
        return ZchOptions(zch_size=int(cfg.zch_size), eviction_interval=int(cfg.eviction_interval),
                          policy=_POLICY_OF_FIELD[field], decay_exponent=decay)
    except ValueError as err:
        raise ConfigError(f"feature {feature!r}: zch: {err}") from None


@dataclass(frozen=True)
class ZchIds:
    """Raw ids of a ZCH table of ``options.zch_size`` rows (remapped by the embedding layer)."""

    options: ZchOptions

    @property
    def num_rows(self) -> int:
        return self.options.zch_size

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        try:
            return raw_int64_ids(bags)
        except FeatureError as err:
            raise FeatureError(f"feature {feature!r}: column {column!r}: {err}") from None
