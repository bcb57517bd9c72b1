"""Triton find: digest probe, then key + tag compare, inside the key's bucket only.

One program handles ``BLOCK`` keys. Each key's bucket digest line (128 bytes at
the default bucket capacity) is read as 32-bit words and compared four digests
at a time with an exact byte-match test (SWAR, no false positives), so the whole
line costs a few integer operations per word. In buckets of up to 128 slots (the
default, ``MASK_PROBE``) the thread that holds a key reads its line in 16-byte chunks
and packs the matches into two 64-bit masks (``line_masks``); the two lowest bits are
confirmed together (one round of memory latency for almost every key), and only keys
with a third match (about 1.5% at a full bucket) go through a loop. Wider buckets that
are a multiple of 128 slots (the admission counters' 1,024) are probed the same way one
128-slot segment after the other, until the key is found (``_probe_segments``); other
wide buckets take the matches from a (keys, line) tile, the two lowest found by
reductions over its words (``WORD_PROBE``). With a power-of-two bucket count (the usual
case: tables grow by doubling) the bucket is a bit mask of the hash, not a 64-bit
modulo. Bucket capacities that are not a multiple of 4 fall back to comparing bytes.
``find_values`` also gathers the embedding columns of found rows in the same program,
so a lookup is a single launch.

The probe itself (``probe_bucket`` and its forms) is in ``find/probe.py``, shared with
the upsert and the admission count; this module holds the find kernel, its launcher and
the settings (module globals that benchmarks and tests may set) by which every launcher
picks the probe's form.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import check_keys, is_pow2, load_tags
from hashrec.table.ops.find.probe import probe_bucket
from hashrec.table.ops.launch import cdiv, env_int, fast_launch, maxnreg, next_pow2
from hashrec.table.storage import TableStorage


# n is not specialized, so a batch's key count compiles no variant of its own. With n
# specialized (divisible by 16 or not) and every row masked by it, find of 1M keys at dim
# 128 ran 12% faster than unspecialized (benchmarks/results/compile_variants.md): each
# row had its own mask predicate, and the kernel spilled under its 80-register cap.
# SHIFT (rows of 128 columns, calls of at least BLOCK keys) masks no row instead: the
# last program starts BLOCK keys before the end, finding again some keys the program
# before it found and writing the same slots and rows there. Compiled for sm_90 at the
# benchmark launches (registers / stack bytes / SASS instructions): dim 128, 16 keys a
# program: 76 / 0 / 624 shifted, 76 / 0 / 656 masked with n divisible by 16, 80 / 72 /
# 840 masked unspecialized; dim 64, 32 keys: shifted spills (80 / 56 / 744), masked
# unspecialized does not (80 / 0 / 744; 720 with n divisible); dims 8 and 32: masked
# unspecialized 552 and 640 instructions, 552 and 632 divisible, no stack. On an H200,
# 1M keys a call (divisible by 16), dims 8-128 and load factors 0.5-1.0, find ran as fast
# as with n specialized, within 0.5% at every setting in two runs of each
# (benchmarks/results/find_shifted.md).
@fast_launch
@triton.jit(do_not_specialize=["n"])
def _find_kernel(keys_ptr, tags_ptr, t_keys, t_tags, t_digests, t_values, out_slots,
                 out_values, n, num_buckets, HAS_TAGS: tl.constexpr, WITH_VALUES: tl.constexpr,
                 CAP: tl.constexpr, LINE: tl.constexpr, WORDS: tl.constexpr,
                 POW2: tl.constexpr, ROUND: tl.constexpr, ROW_DIM: tl.constexpr,
                 DIM: tl.constexpr, DIM_P2: tl.constexpr, BY_WORD: tl.constexpr,
                 MASKS: tl.constexpr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Slots (and rows) of BLOCK keys. Each row is read once its key is confirmed
    (reading the row at the lowest digest match beside the confirming loads was 10-30%
    slower on an H200: ``benchmarks/results/find_speculate_gpu.md``)."""
    if SHIFT:  # n >= BLOCK
        offs = tl.minimum(tl.program_id(0).to(tl.int64) * BLOCK, n - BLOCK) \
            + tl.arange(0, BLOCK)
        mask = tl.full([BLOCK], 1, tl.int1)
    else:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = load_tags(tags_ptr, offs, mask, HAS_TAGS)
    slot = probe_bucket(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP, LINE,
                        WORDS, POW2, ROUND, BY_WORD, MASKS)
    tl.store(out_slots + offs, slot, mask=mask)
    if WITH_VALUES:
        col = tl.arange(0, DIM_P2)
        cmask = col[None, :] < DIM
        found = (slot >= 0)[:, None] & cmask
        row = tl.load(t_values + slot[:, None] * ROW_DIM + col[None, :], mask=found, other=0.0)
        tl.store(out_values + offs[:, None] * DIM + col[None, :], row,
                 mask=mask[:, None] & cmask)  # SHIFT: mask is constant, folded away


# (keys per program, warps, and optionally "maxnreg": registers a thread at most) of the
# find launch; None picks by row width and bucket (``_config``). Benchmarks may set it.
FIND_CONFIG: dict | None = None
# Slots or rows of up to 64 columns from buckets of up to 128 slots: 32 keys a program
# on one warp, at most 80 registers a thread (uncapped, the probe takes 96, at 31%
# occupancy), probing by word (``WORD_PROBE``). On an H200, find of 1M keys into 64M
# slots ran 7-11% faster at dim 8 and 11-17% at dim 32 than at 64 keys on 2 warps
# uncapped, the earlier choice (benchmarks/results/table_gpu_find_configs.md); with the
# probe by word, 11-12% faster at dim 64 than 64 keys on 4 warps by position
# (find_sweep_word_gpu.md). Rows of 128 columns took twice as long at this cap.
NARROW_FIND = {"block": 32, "num_warps": 1, "maxnreg": 80, "by_word": True}
# Rows of 128 columns from buckets of up to 128 slots: 16 keys a program on one warp, at
# most 80 registers a thread, by word. On an H200 it ran 1.05 / 1.07 / 1.08x as fast as
# 64 keys on 4 warps by position, the earlier choice, at load factors 0.5 / 0.75 / 1.0
# (3.84 / 3.78 / 3.71 B-KV/s: table_gpu_dim128.md, same run; 1.00-1.03x in the sweep
# find_sweep_block16_gpu.md). Other rows keep 64 keys on 4 warps (2 up to 32 columns),
# uncapped, by position.
ROWS128_FIND = {"block": 16, "num_warps": 1, "maxnreg": 80, "by_word": True}


# Buckets of at least this many slots confirm their later digest matches four per probe
# round instead of one (0: never), where a probe reads a (keys, line) tile. An 8-bit
# digest matches about cap / 256 slots of a full bucket at random: some four in the
# admission counters' 1,024-slot buckets, each a dependent key load when confirmed one at
# a time. Off: on an H200 the tile probe of 1,024-slot counter buckets ran find 1.4-1.6x
# and the admission count 1.3-1.4x slower with it (benchmarks/results/admission_gpu.md,
# "tile4" against "tile"); such buckets are now probed by segments (``_probe_segments``),
# 11-12x faster than the tile, and the setting reaches only other wide buckets.
WIDE_PROBE_MIN_CAP = max(0, env_int("HASHREC_WIDE_PROBE_MIN_CAP", 0))


# The probe's two lowest digest matches from reductions over the digest words (the lowest
# matching word, the next one and a flag count: ``_lowest``) instead of three passes
# that place every matching digest. Results are the same. On an H200, 1M keys into 64M
# slots (benchmarks/results/table_gpu_word_probe.md against table_gpu_by_position.md,
# one run), find ran 1.10-1.26x faster at dim 8 and 1.15-1.28x at dim 32, the same at
# dim 128 and 4-7% slower at dim 64 (64 keys on 4 warps); the upsert's probe 1.00-1.03x.
# So the narrow find launch (NARROW_FIND, now also dim 64) and the upsert's probe take
# it; rows of 128 columns take it at 16 keys a program (ROWS128_FIND), where it is
# faster, and wider buckets and rows do not. HASHREC_WORD_PROBE=1 or 0 sets it for every
# probe; None keeps each launch's choice.
_WORD_PROBE_ENV = os.environ.get("HASHREC_WORD_PROBE", "").strip()
if _WORD_PROBE_ENV not in ("", "0", "1"):
    raise ValueError("HASHREC_WORD_PROBE must be 0 (by position) or 1 (by word), got "
                     f"{_WORD_PROBE_ENV!r}")
WORD_PROBE: bool | None = None if _WORD_PROBE_ENV == "" else _WORD_PROBE_ENV == "1"
# How many of the lowest digest matches a probe by word finds and confirms together, 2 or
# 3 (HASHREC_WORD_PROBE_LOWEST). With 8-bit digests a key of a full 128-slot bucket has
# about half a false match on average, so some 2% of keys need a third, and at 32 keys a
# program about half the programs wait on one more dependent load for them; the third
# costs two more reductions over the line. On an H200 (table_gpu_probe_lowest3.md against
# _lowest2.md, one run), three made find 1.02-1.06x faster at load factor 1.0 (tables of
# fixed capacity, full and evicting, run there) and 4-9% slower at 0.5, so two is the
# default. Three only in programs where a key has three matches or more (a branch on a
# reduction) made find 1.8x slower (_lowest4.md), and was dropped.
WORD_PROBE_LOWEST = env_int("HASHREC_WORD_PROBE_LOWEST", 2)
if WORD_PROBE_LOWEST not in (2, 3):
    raise ValueError(f"HASHREC_WORD_PROBE_LOWEST must be 2 or 3, got {WORD_PROBE_LOWEST}")


# The probe's digest matches as two 64-bit masks, each key's line read in 16-byte chunks
# by the thread that holds the key (``line_masks``), instead of a (keys, line) tile
# whose reductions cross threads: buckets of up to 128 slots whose digests are read as
# words. HASHREC_MASK_PROBE=0 keeps the tile (in the probe and in the upsert's lane
# form). Results are the same. On an H200, find of 1M keys (60% present) into 64M slots
# ran 1.34 / 1.41 / 1.70x as fast as from the tile at dim 8, load factors 0.5 / 0.75 /
# 1.0 (12.7 / 11.2 / 11.9 B-KV/s), 1.11 / 1.24 / 1.35x at dim 32, 1.04-1.13x at dim 64
# and 1.01-1.02x at dim 128 (benchmarks/results/table_gpu_337e5cd.md against
# table_gpu_tile.md, same call); a counter profile of the tile probe had shown it bound
# by instruction issue (64% of the multiprocessors' throughput, 38-47% of the memory's:
# table_gpu_profile_tile_probe.log).
MASK_PROBE = env_int("HASHREC_MASK_PROBE", 1)
if MASK_PROBE not in (0, 1):
    raise ValueError(f"HASHREC_MASK_PROBE must be 0 (tile) or 1 (masks), got {MASK_PROBE}")


def mask_probe(cap: int, words: bool) -> bool:
    """Whether a ``cap``-slot bucket's whole line fits one pair of ``line_masks`` (up to
    128 slots, digests read as words): the lane form's empty slots."""
    return bool(MASK_PROBE) and words and cap <= 128


def probe_masks(cap: int, words: bool) -> bool:
    """Whether a probe of ``cap``-slot buckets takes masks: a line that fits one pair
    (``mask_probe``) whole, a wider one that is a multiple of 128 slots by segments."""
    return mask_probe(cap, words) or (bool(MASK_PROBE) and words and cap % 128 == 0)


def by_word(default: bool) -> int:
    """The BY_WORD of a probe whose launch picks ``default``: 0 (by position) or how many
    lowest matches it finds by word."""
    return WORD_PROBE_LOWEST if (default if WORD_PROBE is None else WORD_PROBE) else 0


def probe_round(cap: int) -> int:
    """Later digest matches a probe of a ``cap``-slot bucket confirms per round."""
    return 4 if WIDE_PROBE_MIN_CAP and cap >= WIDE_PROBE_MIN_CAP else 1


def _config(dim_p2: int, width: int) -> dict:
    if FIND_CONFIG is not None:
        return FIND_CONFIG
    if width <= 32 and dim_p2 <= 64:
        return NARROW_FIND
    if width <= 32 and dim_p2 == 128:
        return ROWS128_FIND
    return {"block": 64, "num_warps": 4 if dim_p2 > 32 else 2}


def probe_block(width: int, num_warps: int = 2, limit: int = 64) -> int:
    """Keys per program of a probe over digest lines ``width`` elements wide: at most
    ``limit``, and few enough that the (keys, width) digest tile stays near 32 values
    per thread (wide buckets, such as the admission counters' 1,024 slots, would
    otherwise spill registers)."""
    return max(1, min(limit, 32 * 32 * num_warps // width))


def digest_line(storage: TableStorage) -> tuple[torch.Tensor, int, bool]:
    """The digest array as the probe reads it: (tensor, line width, as 32-bit words)."""
    digests, cap = storage.digests, storage.bucket_capacity
    if cap % 4 == 0 and digests.storage_offset() % 4 == 0 and digests.is_contiguous():
        return digests.view(torch.int32), next_pow2(cap // 4), True
    return digests, next_pow2(cap), False


class ProbeLaunch(NamedTuple):
    """How a kernel that calls ``probe_bucket`` probes a storage (``probe_launch``)."""

    line: torch.Tensor  # the digest array as the probe reads it (``digest_line``)
    tile: int  # the digest tile width that sizes its programs (``probe_block``)
    masks: bool  # whether it takes the matches as masks (``probe_masks``)
    constexprs: dict  # probe_bucket's CAP, LINE, WORDS, POW2, ROUND and MASKS

    def by_word(self, default: bool | None = None) -> int:
        """BY_WORD for a launch that picks ``default`` (None: by word where the tile is at
        most 32 words wide, as the upsert's probe and the admission count)."""
        return by_word(self.tile <= 32 if default is None else default)


def probe_launch(storage: TableStorage) -> ProbeLaunch:
    """The probe settings of ``storage``'s buckets, the same for every kernel that probes
    them (find, the upsert's probe, the admission count)."""
    line, width, words = digest_line(storage)
    cap = storage.bucket_capacity
    masks = probe_masks(cap, words)
    # A probe by masks holds 16-byte chunks, not the line: a segmented bucket's tile is
    # that of a 128-slot one.
    return ProbeLaunch(line, min(width, 32) if masks else width, masks, {
        "CAP": cap, "LINE": width, "WORDS": words, "POW2": is_pow2(storage.num_buckets),
        "ROUND": probe_round(cap), "MASKS": masks})


def launch_find(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                slots: torch.Tensor, values: torch.Tensor | None = None,
                config: dict | None = None) -> None:
    """Runs the find kernel into preallocated ``slots`` (n,) and optional ``values``
    (n, dim); no validation, no allocation, no host sync (hot paths call this)."""
    n = keys.numel()
    if n == 0:
        return
    probe = probe_launch(storage)
    dim = values.shape[1] if values is not None else 1
    dim_p2 = next_pow2(dim)
    config = config or _config(dim_p2, probe.tile)
    block = min(probe_block(probe.tile, config["num_warps"], config["block"]),
                max(1, 16384 // dim_p2))
    _find_kernel[(cdiv(n, block),)](
        keys, tags if tags is not None else keys, storage.keys, storage.probe_tags(tags),
        probe.line, storage.values, slots, values if values is not None else slots, n,
        storage.num_buckets, HAS_TAGS=tags is not None, WITH_VALUES=values is not None,
        ROW_DIM=storage.row_dim, DIM=dim, DIM_P2=dim_p2,
        BY_WORD=probe.by_word(config.get("by_word", False)),
        SHIFT=n >= block and dim_p2 >= 128, BLOCK=block, num_warps=config["num_warps"],
        **probe.constexprs, **maxnreg(config.get("maxnreg", 0)))


def _launch(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
            dim: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_keys(keys, tags, storage.device)
    keys = keys.contiguous()
    tags = tags.contiguous() if tags is not None else None
    slots = torch.empty(keys.numel(), dtype=torch.int64, device=keys.device)
    values = None
    if dim is not None:
        if not 0 < dim <= storage.row_dim:
            raise ValueError(f"dim={dim} must be in [1, row_dim={storage.row_dim}]")
        values = torch.empty(keys.numel(), dim, dtype=storage.values.dtype, device=keys.device)
    launch_find(storage, keys, tags, slots, values)
    return slots, values


def find_slots(storage: TableStorage, keys: torch.Tensor,
               tags: torch.Tensor | None = None) -> torch.Tensor:
    """Slots of keys: (n,) int64 [+ (n,) int32 tags] -> (n,) int64, -1 where absent."""
    return _launch(storage, keys, tags, None)[0]


def find_values(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None = None,
                dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and the first ``dim`` value columns of keys in one pass.

    Returns ``(slots (n,) int64 with -1 where absent, values (n, dim))``; rows of
    absent keys are zero. ``dim`` defaults to the full row.
    """
    slots, values = _launch(storage, keys, tags, dim or storage.row_dim)
    return slots, values
