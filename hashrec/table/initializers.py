"""Initial embeddings of new rows (and what missing keys read as).

Every mode is a transform of uniforms in (0, 1): UNIFORM scales them, NORMAL and
TRUNCATED_NORMAL (cut at mean +- 2 std) apply the normal quantile function. The
uniforms come from a random generator, or, with ``key_seed`` set, from a
counter-based hash of (key_seed, key, tag, column), which makes a key's initial
vector independent of batch order, batch composition and rank.
"""

from __future__ import annotations

import math

import torch

from hashrec.table.hashing import mix64, mix_tagged
from hashrec.table.options import InitializerArgs, InitializerMode

_COLUMN_STRIDE = 0x9E3779B97F4A7C15 - (1 << 64)
_SEED_STRIDE = 0xD1B54A32D192ED03 - (1 << 64)
_TRUNCATION = 2.0
_MANTISSA = 1 << 53


def hashed_uniforms(keys: torch.Tensor, tags: torch.Tensor | None, dim: int,
                    seed: int) -> torch.Tensor:
    """keys (n,) int64 -> (n, dim) float64 uniforms in (0, 1), a pure function of each key."""
    base = mix64(mix_tagged(keys, tags) ^ (seed * _SEED_STRIDE & ((1 << 63) - 1)))
    columns = torch.arange(1, dim + 1, dtype=torch.int64, device=keys.device) * _COLUMN_STRIDE
    bits = mix64(base[:, None] + columns[None, :])
    mantissa = (bits >> 11) & (_MANTISSA - 1)
    return (mantissa.to(torch.float64) + 0.5) / _MANTISSA


def _random_uniforms(n: int, dim: int, device: torch.device,
                     generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand((n, dim), dtype=torch.float64, device=device, generator=generator)
    return u.clamp_(0.5 / _MANTISSA, 1.0 - 0.5 / _MANTISSA)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def initial_values(args: InitializerArgs, keys: torch.Tensor, tags: torch.Tensor | None,
                   dim: int, dtype: torch.dtype,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Initial embeddings for ``keys``: (n,) int64 -> (n, dim) in ``dtype``.

    Args:
        args: initializer with defaults resolved (``InitializerArgs.resolved``).
        keys: keys of the new rows (only used when ``args.key_seed`` is set).
        tags: their tags (None = 0).
        dim: embedding dimension.
        dtype: output dtype.
        generator: random generator (None -> torch's global one).
    """
    n = keys.numel()
    if args.mode is InitializerMode.CONSTANT:
        return torch.full((n, dim), float(args.value), dtype=dtype, device=keys.device)
    if args.key_seed is None:
        u = _random_uniforms(n, dim, keys.device, generator)
    else:
        u = hashed_uniforms(keys, tags, dim, args.key_seed)
    if args.mode is InitializerMode.UNIFORM:
        out = u.mul_(args.upper - args.lower).add_(args.lower)
    else:
        if args.mode is InitializerMode.TRUNCATED_NORMAL:
            low = _normal_cdf(-_TRUNCATION)
            u = u.mul_(_normal_cdf(_TRUNCATION) - low).add_(low)
        out = torch.special.ndtri(u).mul_(args.std_dev).add_(args.mean)
    return out.to(dtype)
