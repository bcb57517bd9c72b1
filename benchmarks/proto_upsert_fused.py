"""A lower bound for insert_or_assign on the table's layout: one kernel, atomic placing.

Benchmark A asks insert_or_assign for 2.5 B-KV/s at dim 128; the library's
``upsert_assign`` (``upsert_slots`` and then ``write_rows``) reaches about 2.0 on an
H200. This script measures the least any design on the same index layout (a digest
line a bucket, keys, scores and digests in arrays of their own, rows beside them) could
take, to see whether the target is within reach of such a design at all:

* ``fused``: one kernel a block of keys. It probes each key (the library's
  ``probe_bucket``), places each miss at the next free slot of its bucket by an
  ``atomic_add`` on a per-bucket fill count, writes the miss's key, score and digest,
  and then copies every key's row from the batch into its slot;
* ``atomic_index``: the same kernel without the rows, then the library's ``write_rows``;
* ``paired`` (``paired_index``: without the rows, then ``write_rows``): the same kernel
  writing each miss's key and score side by side as one 16-byte entry of a pairs array,
  the layout whose placing floor is the lowest (``bench_table_floor.py``'s
  ``place_pairs_digests``), which the table does not have. It probes the table's own key
  array, as a probe of the pairs would (a present key's confirming read is one sector
  either way), so its time is that layout's; its checks read the placed keys and scores
  from the pairs.

Both are lower bounds, not designs: which new key takes which slot depends on thread
timing (the library's placing does not), there is no eviction (a miss whose bucket is
full is left out; their count is printed) and no tags, the batch holds distinct keys,
and the fill counts stand in for the empty-slot search, which is only valid because the
benchmark's index fills each bucket from its first slot. The library's ``upsert_assign``
runs in the same call on the same index, batches and rows, the index restored (untimed)
before every call. Checks at full size: every placed key found at its slot, no slot
taken twice, the present keys where they were, and a sample of rows equal to the
batch's. Output: a JSON file and a markdown table.

    python benchmarks/proto_upsert_fused.py --out benchmarks/results/upsert_fused_bound
    python benchmarks/proto_upsert_fused.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import json

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=1 << 26, help="table slots (128 a bucket)")
    p.add_argument("--batch", type=int, default=1 << 20, help="keys a call")
    p.add_argument("--dims", type=int, nargs="+", default=[128])
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75])
    p.add_argument("--block", type=int, default=32, help="keys a program of the fused kernel")
    p.add_argument("--warps", type=int, nargs="+", default=[1, 4],
                   help="warps a program of the fused kernel (each timed)")
    p.add_argument("--reps", type=int, default=10)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.reps, args.dims = 1 << 12, 256, 1, [8]
        args.load_factors, args.warps = args.load_factors[:1], args.warps[:1]
    return args


ARGS = _args()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _table_fill import filled_index, mixed_batch, restore, snapshot  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.table._triton_hash import bucket_of_fast, digest_of, tagged_hash  # noqa: E402
from hashrec.table.hashing import digest_of as digest_ref  # noqa: E402
from hashrec.table.hashing import mix64  # noqa: E402
from hashrec.table.ops.find.probe import probe_bucket  # noqa: E402
from hashrec.table.ops.find.triton import find_slots, probe_launch  # noqa: E402
from hashrec.table.ops.insert.rows import write_rows  # noqa: E402
from hashrec.table.ops.insert.upsert_rows import upsert_assign  # noqa: E402
from hashrec.table.ops.launch import cdiv  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() and not ARGS.smoke else "cpu")
WARMUP = 0 if ARGS.smoke else 2  # interpreted kernels need no warm-up
CHECKED_OLD_KEYS = 256 if ARGS.smoke else 100_000  # present keys a check finds again


@triton.jit(do_not_specialize=["n"])
def _fused_kernel(keys_ptr, scores_ptr, vals_ptr, t_keys, t_tags, t_line, t_scores, t_digests,
                  t_rows, t_pairs, fill, slots_ptr, n, num_buckets, CAP: tl.constexpr,
                  LINE: tl.constexpr, WORDS: tl.constexpr, POW2: tl.constexpr,
                  ROUND: tl.constexpr, MASKS: tl.constexpr, BY_WORD: tl.constexpr,
                  ROWS: tl.constexpr, PAIRED: tl.constexpr, DIM: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = tl.zeros([BLOCK], dtype=tl.int32)
    slot = probe_bucket(key, tag, mask, t_keys, t_tags, t_line, num_buckets, CAP, LINE, WORDS,
                        POW2, ROUND, BY_WORD, MASKS)
    miss = mask & (slot < 0)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        h = tagged_hash(key, tag)
        bucket = bucket_of_fast(h, num_buckets, POW2)
        at = tl.atomic_add(fill + bucket, tl.full([BLOCK], 1, tl.int32), mask=miss)
        ok = miss & (at < CAP)
        placed = bucket * CAP + at.to(tl.int64)
        score = tl.load(scores_ptr + offs, mask=ok, other=0)
        if PAIRED:  # key and score as one 16-byte entry
            half = tl.arange(0, 2)
            pair = tl.where(half[None, :] == 0, key[:, None], score[:, None])
            tl.store(t_pairs + placed[:, None] * 2 + half[None, :], pair, mask=ok[:, None])
        else:
            tl.store(t_keys + placed, key, mask=ok)
            tl.store(t_scores + placed, score, mask=ok)
        tl.store(t_digests + placed, digest_of(h).to(tl.uint8), mask=ok)
        slot = tl.where(ok, placed, slot)
    tl.store(slots_ptr + offs, slot, mask=mask)
    if ROWS:
        col = tl.arange(0, DIM)
        keep = (mask & (slot >= 0))[:, None]
        x = tl.load(vals_ptr + offs[:, None] * DIM + col[None, :], mask=keep, other=0.0)
        tl.store(t_rows + slot[:, None] * DIM + col[None, :], x, mask=keep)


class FusedUpsert:
    """The bound's kernel on one storage: ``__call__(keys, scores, rows)`` -> slots."""

    def __init__(self, storage: TableStorage, fill: torch.Tensor, with_rows: bool, warps: int,
                 pairs: torch.Tensor | None = None):
        self.storage, self.fill, self.with_rows, self.warps = storage, fill, with_rows, warps
        self.probe, self.pairs = probe_launch(storage), pairs

    def __call__(self, keys: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor):
        s, n, dim = self.storage, keys.numel(), rows.shape[1]
        slots = torch.empty(n, dtype=torch.int64, device=keys.device)
        _fused_kernel[(cdiv(n, ARGS.block),)](
            keys, scores, rows, s.keys, s.probe_tags(None), self.probe.line, s.scores, s.digests,
            s.values, self.pairs if self.pairs is not None else s.keys, self.fill, slots, n,
            s.num_buckets, BY_WORD=self.probe.by_word(), ROWS=self.with_rows,
            PAIRED=self.pairs is not None, DIM=dim, BLOCK=ARGS.block, num_warps=self.warps,
            **self.probe.constexprs)
        if not self.with_rows:
            write_rows(s.values, slots, None, rows)
        return slots


def _fill_counts(storage: TableStorage) -> torch.Tensor:
    """Each bucket's occupied slots (the benchmark's index fills a bucket from slot 0)."""
    lines = storage.digests.view(storage.num_buckets, storage.bucket_capacity)
    return (lines != 0).sum(1).to(torch.int32)


def _check(storage: TableStorage, reset, stored: torch.Tensor, form) -> dict:
    """One call from the filled index: each new key's key, score and digest at its slot
    (found there by ``find_slots``, or read from the pairs), no slot taken twice, the
    present keys unmoved, a sample of rows equal to the batch's."""
    reset()
    keys = mixed_batch(stored, ARGS.batch, DEVICE)
    ones = torch.ones_like(keys)
    rows = torch.randn(keys.numel(), storage.values.shape[1], device=DEVICE)
    was = find_slots(storage, keys)
    old = stored[:CHECKED_OLD_KEYS]
    before = find_slots(storage, old)
    slots = form(keys, ones, rows)
    placed = slots >= 0
    new = placed & (was < 0)
    at = slots[new]
    held = slots[placed]
    if form.pairs is None:
        entries = torch.stack([storage.keys[at], storage.scores[at]], 1)
        found = bool(torch.equal(find_slots(storage, keys)[placed], held))
    else:
        entries = form.pairs[at]
        found = bool(torch.equal(slots[was >= 0], was[was >= 0]))
    sample = torch.nonzero(placed).flatten()[:4096]
    return {"misses": int((was < 0).sum()), "left_out": int((~placed).sum()),
            "placed_found_at_their_slots": found,
            "new_entries_written": bool(torch.equal(entries, torch.stack(
                [keys[new], ones[new]], 1))),
            "new_digests_written": bool(torch.equal(storage.digests[at],
                                                    digest_ref(mix64(keys[new])))),
            "slots_distinct": held.unique().numel() == held.numel(),
            "present_keys_unmoved": bool(torch.equal(before, find_slots(storage, old))),
            "rows_stored": bool(torch.equal(storage.values[slots[sample]], rows[sample]))}


def _row(storage: TableStorage, stored: torch.Tensor, lf: float, dim: int) -> dict:
    n = ARGS.batch
    fill = _fill_counts(storage)
    saved, saved_fill = snapshot(storage), fill.clone()

    def reset() -> None:  # every call starts from the filled index
        restore(storage, saved)
        fill.copy_(saved_fill)
    forms = {f"fused_w{w}": FusedUpsert(storage, fill, True, w) for w in ARGS.warps}
    forms["atomic_index"] = FusedUpsert(storage, fill, False, ARGS.warps[0])
    pairs = torch.zeros(storage.capacity, 2, dtype=torch.int64, device=DEVICE)
    forms.update({f"paired_w{w}": FusedUpsert(storage, fill, True, w, pairs)
                  for w in ARGS.warps})
    forms["paired_index"] = FusedUpsert(storage, fill, False, ARGS.warps[0], pairs)
    checks = {}
    for name, form in forms.items():
        checks[name] = _check(storage, reset, stored, form)
        print(f"load factor {lf}, dim {dim}, {name}: {checks[name]}", flush=True)
    batches = [mixed_batch(stored, ARGS.batch, DEVICE) for _ in range(2 * (ARGS.reps + 2))]
    ones = torch.ones(n, dtype=torch.int64, device=DEVICE)
    rows = torch.randn(n, dim, device=DEVICE)

    def fresh(i: int) -> torch.Tensor:
        reset()
        return batches[i]
    library = ("upsert_assign", lambda k: upsert_assign(storage, k, None, ones, rows, True))
    times = {}
    for name, fn in (library, *((f, lambda k, f=f: forms[f](k, ones, rows)) for f in forms),
                     (library[0] + "_again", library[1])):
        times[name] = time_device_ms(fn, ARGS.reps, WARMUP, setup=fresh)["device_ms"]
        print(f"  {name}: {times[name]:.4f} ms ({n / times[name] / 1e6:.2f} B-KV/s)",
              flush=True)
    return {"load_factor": lf, "dim": dim, "checks": checks,
            **{f"{k}_ms": v for k, v in times.items()}}


def main() -> None:
    rows = []
    for lf in ARGS.load_factors:
        index, stored = filled_index(ARGS.slots, lf, DEVICE)
        for dim in ARGS.dims:
            # Untagged, as benchmark A's table (``bench_table_gpu.py``): no probe reads tags.
            storage = TableStorage(index.num_buckets, index.bucket_capacity, index.keys,
                                   index.tags, index.digests, index.scores,
                                   torch.empty(index.capacity, dim, device=DEVICE),
                                   tagged=False)
            rows.append(_row(storage, stored, lf, dim))
            del storage
        del index, stored
    results = {"command": command_line(), **environment(), "slots": ARGS.slots,
               "batch": ARGS.batch, "block": ARGS.block, "reps": ARGS.reps, "rows": rows}
    if not ARGS.out:
        print(json.dumps(results, indent=1))
        return
    forms = [k[:-3] for k in rows[0] if k.endswith("_ms") and k.startswith(("fused", "atomic", "paired"))]
    lines = [f"Command: `{results['command']}`", "",
             f"Date {results.get('date')}, GPU {results.get('gpu')}, torch "
             f"{results.get('torch')}, triton {results.get('triton')}; {ARGS.slots} slots, "
             f"{ARGS.batch} keys a call (60% present). insert_or_assign, device ms "
             "(B-KV/s).", "",
             "| load factor | dim | upsert_assign | " + " | ".join(forms)
             + " | upsert_assign again | checks |",
             "| --- | --- | --- | " + " | ".join("---" for _ in forms) + " | --- | --- |"]
    for r in rows:
        good = all(v for c in r["checks"].values() for v in c.values() if isinstance(v, bool))
        cells = [f"{r[f + '_ms']:.4f} ({ARGS.batch / r[f + '_ms'] / 1e6:.2f})"
                 for f in ("upsert_assign", *forms, "upsert_assign_again")]
        left = max(c["left_out"] for c in r["checks"].values())
        lines.append(f"| {r['load_factor']} | {r['dim']} | " + " | ".join(cells[:-1])
                     + f" | {cells[-1]} | {'all hold' if good else r['checks']}; "
                     f"{left} keys left out |")
    write_results(ARGS.out, results, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
