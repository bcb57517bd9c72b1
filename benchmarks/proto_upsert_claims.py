"""A lower bound for placing an upsert's misses by claims instead of the counting sort.

The upsert (``hashrec/table/ops/insert/upsert.py``) groups the misses by bucket with a
counting sort and places each bucket's run in sorted order, so that which new key takes
which empty slot does not depend on thread timing. This script measures a form without
the sort, to see whether it could pay before building it into the library:

1. the probe kernel (the library's ``probe_bucket``) finds every key; each miss then
   claims a place in its bucket's row of C claim words (``claims``: num_buckets x C
   int64, ``generation << 32 | ~position``) by ``atomic_max``: a claim that finds a word
   of an earlier call takes it; one that finds a later batch position there takes the
   word and carries that position on to the next word; one that finds an earlier
   position goes on itself. Whatever the timing, word r ends up holding the bucket's
   r-th earliest miss (a bucket of more than C misses is flagged);
2. one kernel in batch order: each miss reads its bucket's claim words (one 32-byte
   sector), its rank among them, and its bucket's digest line; rank r takes the r-th
   empty slot where the bucket has room for all its misses and was not flagged, and
   writes key and score (and its digest, when it is its bucket's only miss);
3. one kernel writes the other placed keys' digests (a lane must not change a line
   that another lane of its bucket still reads in step 2).

Left out, so that the figures bound the form from below: tags, repeated keys in a batch
(every batch here holds distinct keys), eviction, the refused count and the buckets a
claim row cannot take (those would go to the sorted path: their count is printed). The
library's upsert (``upsert_slots``) is timed on the same index and batches, restored
before every call. Output: a JSON file and a markdown table.

    python benchmarks/proto_upsert_claims.py --out benchmarks/results/upsert_claims
    python benchmarks/proto_upsert_claims.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import json

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=1 << 26, help="table slots (128 a bucket)")
    p.add_argument("--batch", type=int, default=1 << 20, help="keys a call")
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75])
    p.add_argument("--claims", type=int, default=4, help="claim words a bucket")
    p.add_argument("--reps", type=int, default=10)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.reps = 1 << 16, 512, 1
        args.load_factors = args.load_factors[:1]
    return args


ARGS = _args()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _table_fill import filled_index, mixed_batch, restore, snapshot  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.table._triton_hash import bucket_of_fast, digest_of, tagged_hash  # noqa: E402
from hashrec.table.ops.find.probe import line_masks, popcount64, probe_bucket  # noqa: E402
from hashrec.table.ops.find.triton import find_slots, probe_block, probe_launch  # noqa: E402
from hashrec.table.ops.insert.upsert import upsert_slots  # noqa: E402
from hashrec.table.ops.insert.upsert_lanes import nth_bit  # noqa: E402
from hashrec.table.ops.launch import cdiv  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() and not ARGS.smoke else "cpu")
LOW = tl.constexpr(0xFFFFFFFF)


@triton.jit(do_not_specialize=["n", "gen"])
def _claim_probe_kernel(keys_ptr, t_keys, t_tags, t_line, slots_ptr, claims, over, n, num_buckets,
                        gen, C: tl.constexpr, CARRY: tl.constexpr, CAP: tl.constexpr,
                        LINE: tl.constexpr,
                        WORDS: tl.constexpr, POW2: tl.constexpr, ROUND: tl.constexpr,
                        MASKS: tl.constexpr, BY_WORD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = tl.zeros([BLOCK], dtype=tl.int32)
    slot = probe_bucket(key, tag, mask, t_keys, t_tags, t_line, num_buckets, CAP, LINE, WORDS,
                        POW2, ROUND, BY_WORD, MASKS)
    tl.store(slots_ptr + offs, slot, mask=mask)
    miss = mask & (slot < 0)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        bucket = bucket_of_fast(tagged_hash(key, tag), num_buckets, POW2)
        g = gen.to(tl.int64)
        carry = (g << 32) | (LOW - offs)
        j = tl.zeros([BLOCK], dtype=tl.int64)
        active = miss
        while tl.max(active.to(tl.int32), axis=0) > 0:
            old = tl.atomic_max(claims + bucket * C + j, carry, mask=active)
            free = (old >> 32) < g  # a word of an earlier call: taken, done
            on = active & ~free  # an earlier position holds it (go on) or a later (carry it)
            if CARRY:  # off: the mutation the checks must catch
                carry = tl.where(on & (old < carry), old, carry)
            j = j + on.to(tl.int64)
            tl.store(over + bucket, gen, mask=on & (j >= C))
            active = on & (j < C)


@triton.jit(do_not_specialize=["n", "gen"])
def _claim_place_kernel(keys_ptr, scores_ptr, t_keys, t_scores, t_digests, t_words, slots_ptr,
                        created_ptr, claims, over, n, num_buckets, gen, C: tl.constexpr,
                        CAP: tl.constexpr, POW2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    slot = tl.load(slots_ptr + offs, mask=mask, other=0)
    miss = mask & (slot < 0)
    created = tl.zeros([BLOCK], dtype=tl.int8)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        key = tl.load(keys_ptr + offs, mask=miss, other=0)
        h = tagged_hash(key, tl.zeros([BLOCK], dtype=tl.int32))
        bucket = bucket_of_fast(h, num_buckets, POW2)
        g = gen.to(tl.int64)
        me = (g << 32) | (LOW - offs)
        word = tl.load(claims + bucket[:, None] * C + tl.arange(0, C)[None, :],
                       mask=miss[:, None], other=0)
        cur = (word >> 32) == g
        count = tl.sum(cur.to(tl.int32), axis=1)
        rank = tl.sum((cur & (word > me[:, None])).to(tl.int32), axis=1)
        flagged = tl.load(over + bucket, mask=miss, other=0) == gen
        lo, hi = line_masks(t_words, bucket, tl.zeros([BLOCK], dtype=tl.int32), miss, CAP, True)
        room = popcount64(lo) + popcount64(hi)
        ok = miss & ~flagged & (count <= room)
        column = nth_bit(lo, hi, rank, CAP, C)
        placed = bucket * CAP + column
        tl.store(t_keys + placed, key, mask=ok)
        tl.store(t_scores + placed, tl.load(scores_ptr + offs, mask=ok, other=0), mask=ok)
        tl.store(slots_ptr + offs, placed, mask=ok)
        alone = ok & (count == 1)  # its bucket's only miss: no other lane reads the line
        tl.store(t_digests + placed, digest_of(h).to(tl.uint8), mask=alone)
        created = tl.where(alone, 2, tl.where(ok, 1, 0)).to(tl.int8)
    tl.store(created_ptr + offs, created, mask=mask)


@triton.jit(do_not_specialize=["n"])
def _claim_digest_kernel(keys_ptr, slots_ptr, created_ptr, t_digests, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    late = mask & (tl.load(created_ptr + offs, mask=mask, other=0) == 1)
    if tl.max(late.to(tl.int32), axis=0) > 0:
        key = tl.load(keys_ptr + offs, mask=late, other=0)
        h = tagged_hash(key, tl.zeros([BLOCK], dtype=tl.int32))
        slot = tl.load(slots_ptr + offs, mask=late, other=0)
        tl.store(t_digests + slot, digest_of(h).to(tl.uint8), mask=late)


class ClaimUpsert:
    """The claims form on one storage: ``__call__(keys, scores)`` -> (slots, created)."""

    def __init__(self, storage, claims: int, carry: bool = True):
        self.storage, self.c, self.gen, self.carry = storage, claims, 0, carry
        nb = storage.num_buckets
        self.claims = torch.zeros(nb * claims, dtype=torch.int64, device=storage.device)
        self.over = torch.zeros(nb, dtype=torch.int32, device=storage.device)
        self.probe = probe_launch(storage)
        self.words = storage.digests.view(torch.int32)

    def __call__(self, keys: torch.Tensor, scores: torch.Tensor):
        s, n = self.storage, keys.numel()
        self.gen += 1
        slots = torch.empty(n, dtype=torch.int64, device=keys.device)
        created = torch.empty(n, dtype=torch.int8, device=keys.device)
        block = probe_block(self.probe.tile, 1, 32)
        _claim_probe_kernel[(cdiv(n, block),)](
            keys, s.keys, s.probe_tags(None), self.probe.line, slots, self.claims, self.over,
            n, s.num_buckets, self.gen, C=self.c, CARRY=self.carry, BY_WORD=self.probe.by_word(),
            BLOCK=block, num_warps=1, **self.probe.constexprs)
        cap = s.bucket_capacity
        _claim_place_kernel[(cdiv(n, 128),)](
            keys, scores, s.keys, s.scores, s.digests, self.words, slots, created, self.claims,
            self.over, n, s.num_buckets, self.gen, C=self.c, CAP=cap,
            POW2=self.probe.constexprs["POW2"], BLOCK=128, num_warps=4)
        _claim_digest_kernel[(cdiv(n, 1024),)](keys, slots, created, s.digests, n,
                                               BLOCK=1024, num_warps=4)
        return slots, created


def _check(storage, saved, stored, claim: ClaimUpsert) -> dict:
    """Outcome of one call from the filled index, twice: every placed key found at its
    slot, the present keys where they were, no slot taken twice, the same both times."""
    restore(storage, saved)
    keys = mixed_batch(stored, ARGS.batch, DEVICE)
    scores = torch.ones_like(keys)
    misses = int((find_slots(storage, keys) < 0).sum())
    slots, created = claim(keys, scores)
    first = (slots.clone(), storage.keys.clone(), storage.digests.clone())
    found = find_slots(storage, keys)
    placed = created > 0
    ok = bool(torch.equal(found[placed], slots[placed]))
    held = slots[slots >= 0]
    unique = held.unique().numel() == held.numel()
    old_stored = stored[:min(stored.numel(), 100_000)]
    restore(storage, saved)
    before = find_slots(storage, old_stored)
    slots2, _ = claim(keys, scores)
    after = find_slots(storage, old_stored)
    same = (torch.equal(first[0], slots2) and torch.equal(first[1], storage.keys)
            and torch.equal(first[2], storage.digests))
    return {"misses": misses, "placed": int(placed.sum()),
            "left_to_sorted_path": misses - int(placed.sum()),
            "placed_found_at_their_slots": ok, "slots_distinct": bool(unique),
            "present_keys_unmoved": bool(torch.equal(before, after)),
            "deterministic": bool(same)}


def _row(lf: float) -> dict:
    storage, stored = filled_index(ARGS.slots, lf, DEVICE)
    saved = snapshot(storage)
    claim = ClaimUpsert(storage, ARGS.claims)
    check = _check(storage, saved, stored, claim)
    print(f"load factor {lf}: {check}", flush=True)
    mutated = _check(storage, saved, stored, ClaimUpsert(storage, ARGS.claims, carry=False))
    print(f"  without the carry (a mutation the checks must catch): {mutated}", flush=True)
    batches = [mixed_batch(stored, ARGS.batch, DEVICE) for _ in range(2 * (ARGS.reps + 2))]
    ones = torch.ones(ARGS.batch, dtype=torch.int64, device=DEVICE)

    def fresh(i: int) -> torch.Tensor:
        restore(storage, saved)
        return batches[i]
    times = {}
    for name, fn in (("upsert_slots", lambda k: upsert_slots(storage, k, None, ones, True)),
                     ("claims", lambda k: claim(k, ones)),
                     ("upsert_slots_again", lambda k: upsert_slots(storage, k, None, ones,
                                                                   True))):
        times[name] = time_device_ms(fn, ARGS.reps, setup=fresh)
        print(f"  {name}: {times[name]['device_ms']:.4f} ms", flush=True)
    return {"load_factor": lf, "check": check, "check_without_carry": mutated,
            **{f"{k}_ms": v["device_ms"] for k, v in times.items()}}


def main() -> None:
    rows = [_row(lf) for lf in ARGS.load_factors]
    results = {"command": command_line(), **environment(), "slots": ARGS.slots,
               "batch": ARGS.batch, "claims": ARGS.claims, "reps": ARGS.reps, "rows": rows}
    if not ARGS.out:
        print(json.dumps(results, indent=1))
        return
    lines = [f"Command: `{results['command']}`", "",
             f"Date {results.get('date')}, GPU {results.get('gpu')}, torch "
             f"{results.get('torch')}, triton {results.get('triton')}; {ARGS.slots} slots, "
             f"{ARGS.batch} keys a call (60% present), {ARGS.claims} claim words a bucket. "
             "Upsert alone (no rows), device ms.", "",
             "| load factor | upsert_slots | claims form (lower bound) | upsert_slots again "
             "| misses left to the sorted path | checks |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        c = r["check"]
        good = all(v for k, v in c.items() if isinstance(v, bool))
        lines.append(f"| {r['load_factor']} | {r['upsert_slots_ms']:.4f} | {r['claims_ms']:.4f} "
                     f"| {r['upsert_slots_again_ms']:.4f} | {c['left_to_sorted_path']} of "
                     f"{c['misses']} | {'all hold' if good else c} |")
    write_results(ARGS.out, results, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
