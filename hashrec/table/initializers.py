"""Initial embeddings of new rows (and what missing keys read as).

Every mode is a transform of uniforms in (0, 1): UNIFORM scales them, NORMAL applies
the normal quantile function, and TRUNCATED_NORMAL applies it to uniforms scaled into
[Phi(a), Phi(b)], a and b its bounds [lower, upper] standardized (mean +- 2 std when
neither is set; an unset one does not cut), as dynamicemb's truncated normal where both
are set (dynamicemb cuts an unset lower at 0 and an unset upper at 1). The
uniforms come from a random generator, or, with ``key_seed`` set, from a
counter-based hash of (key_seed, key, tag, column), which makes a key's initial
vector independent of batch order, batch composition and rank. DEBUG draws nothing:
every column is the key modulo 100000 (dynamicemb's debug rows).
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
# DEBUG rows: key mod 100000 of the key as uint64 (dynamicemb's debug initializer);
# a negative key is key + 2**64, whose residue adds 2**64 mod 100000.
DEBUG_MOD = 100_000
_DEBUG_WRAP = (1 << 64) % DEBUG_MOD


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
    return 0.5 * math.erfc(-x / math.sqrt(2.0))  # precise far below the mean too


def _truncated_normal(u: torch.Tensor, args: InitializerArgs) -> torch.Tensor:
    """Uniforms ``u`` in (0, 1) (float64, in place) -> draws of a normal (mean, std_dev)
    cut at [lower, upper]; with neither bound set at mean +- 2 std."""
    lower, upper = args.lower, args.upper
    if lower is None and upper is None:
        a, b = -_TRUNCATION, _TRUNCATION
    elif args.std_dev == 0:
        return u.fill_(args.mean).clamp_(lower, upper)
    else:
        a = -math.inf if lower is None else (lower - args.mean) / args.std_dev
        b = math.inf if upper is None else (upper - args.mean) / args.std_dev
    # A cut lying mostly above the mean is drawn mirrored below it, where the CDF keeps
    # its precision (above, it rounds to 1 and the quantile to infinity).
    sign = -1.0 if a + b > 0 else 1.0
    if sign < 0:
        a, b = -b, -a
    low, high = _normal_cdf(a), _normal_cdf(b)
    z = torch.special.ndtri(u.mul_(high - low).add_(low)).clamp_(a, b)
    out = z.mul_(sign * args.std_dev).add_(args.mean)
    return out if lower is None and upper is None else out.clamp_(lower, upper)


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
    if args.mode is InitializerMode.DEBUG:
        residue = (keys.remainder(DEBUG_MOD) + (keys < 0) * _DEBUG_WRAP).remainder_(DEBUG_MOD)
        return residue.to(torch.float64)[:, None].expand(n, dim).to(dtype)
    if args.key_seed is None:
        u = _random_uniforms(n, dim, keys.device, generator)
    else:
        u = hashed_uniforms(keys, tags, dim, args.key_seed)
    if args.mode is InitializerMode.UNIFORM:
        out = u.mul_(args.upper - args.lower).add_(args.lower)
    elif args.mode is InitializerMode.TRUNCATED_NORMAL:
        out = _truncated_normal(u, args)
    else:
        out = torch.special.ndtri(u).mul_(args.std_dev).add_(args.mean)
    return out.to(dtype)
