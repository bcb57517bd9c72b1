"""Bandwidth cost model of a dynamic table's lookups and updates in one training step.

A step touches ``batch_size * ids_per_sample`` rows per rank. Each touch probes
one bucket of the index (on the GPU in every mode) and moves the row: the
forward reads the embedding, the sparse optimizer reads and writes embedding and
state. Where that row traffic goes depends on the storage mode:

* HBM_ONLY: all of it at HBM bandwidth.
* HYBRID: values are split across GPU and host by hash, so a share
  ``1 - cache_load_factor`` of the touches goes over the host link (PCIe or C2C).
* CACHING: the GPU caches the hottest ``cache_load_factor`` of the rows. Access
  frequencies follow a power law (Zipf exponent ``zipf_exponent``), so the hit
  rate is the hot set's share of the accesses; a miss fetches the row over the
  host link and, in training, writes the evicted dirty row back.

Costs are seconds per step; only their order matters to the planner, but they
are in real units so that the printed plan can be read against a step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hashrec.table.options import StorageMode


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not valid; allowed: a finite number > 0")


@dataclass(frozen=True)
class CostModel:
    """Bandwidths and access skew of the cost model.

    Attributes:
        hbm_bandwidth: GPU memory bandwidth in bytes/s (H100/H200 class: ~4e12).
        host_bandwidth: GPU <-> host link bandwidth in bytes/s (PCIe 5 x16 ~50e9;
            Grace C2C is higher).
        zipf_exponent: power-law exponent of key popularity (CACHING hit rates);
            recommendation ID traffic is typically around 1.
        training: True counts the optimizer's read-modify-write of each row;
            False prices lookups only (evaluation, inference).
    """

    hbm_bandwidth: float = 4.0e12
    host_bandwidth: float = 50.0e9
    zipf_exponent: float = 1.05
    training: bool = True

    def __post_init__(self) -> None:
        _check_positive("hbm_bandwidth", self.hbm_bandwidth)
        _check_positive("host_bandwidth", self.host_bandwidth)
        _check_positive("zipf_exponent", self.zipf_exponent)
        if not isinstance(self.training, bool):
            raise ValueError(f"training={self.training!r} is not valid; allowed: True, False")


def _harmonic(n: float, s: float) -> float:
    """Generalized harmonic number sum_{i<=n} i^-s, integral approximation (n >= 1)."""
    if n <= 1.0:
        return max(n, 0.0)
    if abs(s - 1.0) < 1e-9:
        return 1.0 + math.log(n)
    return 1.0 + (n ** (1.0 - s) - 1.0) / (1.0 - s)


def hot_set_hit_rate(cached_rows: float, rows: float, zipf_exponent: float) -> float:
    """Share of accesses that hit the ``cached_rows`` most popular of ``rows`` rows."""
    if rows <= 0 or cached_rows >= rows:
        return 1.0
    return _harmonic(cached_rows, zipf_exponent) / _harmonic(rows, zipf_exponent)


@dataclass(frozen=True)
class AccessProfile:
    """Per-step traffic of one table on one rank.

    Attributes:
        touches: rows touched per step (batch_size * ids_per_sample).
        rows: rows the table holds (the CACHING hot-set model's population).
        index_bytes: bytes read from the GPU index per touch (digests of one bucket,
            the key, the score).
        row_traffic_bytes: value bytes moved per touch (embedding read, plus the
            optimizer's read and write of embedding and state when training).
        row_bytes: bytes of one stored row (what a cache miss fetches or writes back).
        written: the step writes the rows it touches (training a trainable table): a
            CACHING miss then also writes the evicted dirty row back.
    """

    touches: float
    rows: float
    index_bytes: float
    row_traffic_bytes: float
    row_bytes: float
    written: bool = True


def step_cost(profile: AccessProfile, mode: StorageMode, cache_load_factor: float,
              model: CostModel) -> float:
    """Estimated seconds per step of one table in one storage mode."""
    hbm, host = model.hbm_bandwidth, model.host_bandwidth
    index = profile.touches * profile.index_bytes / hbm
    traffic = profile.touches * profile.row_traffic_bytes
    if mode is StorageMode.HBM_ONLY or cache_load_factor >= 1.0:
        return index + traffic / hbm
    if mode is StorageMode.HYBRID:
        on_gpu = cache_load_factor
        return index + traffic * (on_gpu / hbm + (1.0 - on_gpu) / host)
    hit = hot_set_hit_rate(cache_load_factor * profile.rows, profile.rows, model.zipf_exponent)
    misses = profile.touches * (1.0 - hit)
    fetch = profile.row_bytes * (1.0 / host + 1.0 / hbm)  # host -> GPU, then into the cache
    write_back = profile.row_bytes / host if model.training and profile.written else 0.0
    return index + traffic / hbm + misses * (fetch + write_back)
