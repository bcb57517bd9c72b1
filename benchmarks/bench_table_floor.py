"""Memory floors under benchmark A's insert ops: the accesses an insert cannot avoid, alone.

At benchmark A's shape (``--slots`` slots in 128-slot buckets, ``--batch`` keys a call,
60% of them present) an insert of a batch has to, whatever its kernels:

* probe: read every key's digest line (128 bytes at a random bucket) and, for a key
  whose digest matches (the present ones), one 8-byte key in that bucket, at a slot
  the line names (``_probe_floor_kernel``: the same accesses, nothing else);
* place: write each new key's entry, its key, score (8 bytes each) and digest (1 byte)
  into the table's arrays at a random slot (``_place_floor_kernel``; for comparison, with
  PAIRS it writes key and score as one 16-byte entry, a layout the table does not have);
* rows: move every key's row, dim fp32 values read from the batch and written to the
  table (``_rows_floor_ms``: a copy of as many bytes, contiguous, the copy bandwidth).

Each is timed alone on arrays of the table's sizes and compared with the insert ops'
allowance at a throughput target: at ``--target`` B-KV/s (2.5) one call may take
batch / target, and what the rows take leaves the rest to the index work
(probe + place). Output: a JSON file and a markdown table.

    python benchmarks/bench_table_floor.py --out benchmarks/results/table_floor
    python benchmarks/bench_table_floor.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import json

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=1 << 26, help="table slots (128 a bucket)")
    p.add_argument("--batch", type=int, default=1 << 20, help="keys a call")
    p.add_argument("--dims", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--new", type=float, default=0.4, help="share of the batch that is new")
    p.add_argument("--target", type=float, default=2.5, help="insert target, B-KV/s")
    p.add_argument("--reps", type=int, default=20)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dims, args.reps = 1 << 12, 256, [8], 1
    return args


ARGS = _args()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _timing import command_line, environment, time_device_ms  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() and not ARGS.smoke else "cpu")
CAP = 128
_CAP = tl.constexpr(CAP)  # the kernels' bucket size


@triton.jit
def _probe_floor_kernel(buckets_ptr, present_ptr, t_words, t_keys, out_ptr, n,
                        CONFIRM: tl.constexpr, BLOCK: tl.constexpr):
    """Per key: its bucket's digest line (32 int32 words) and, CONFIRM and where present,
    the key at the slot the line's words name (a dependent read, as a probe's
    confirmation)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    bucket = tl.load(buckets_ptr + i, mask=mask, other=0)
    w = tl.arange(0, 32)
    words = tl.load(t_words + bucket[:, None] * 32 + w[None, :], mask=mask[:, None], other=0)
    col = tl.sum(words & 1, axis=1) & (_CAP - 1)  # a slot named by the line's contents
    key = col.to(tl.int64)
    if CONFIRM:
        hit = mask & (tl.load(present_ptr + i, mask=mask, other=0) != 0)
        key += tl.load(t_keys + bucket * _CAP + col, mask=hit, other=0)
    tl.store(out_ptr + i, key, mask=mask)


@triton.jit
def _place_floor_kernel(slots_ptr, keys_ptr, scores_ptr, t_keys, t_scores, t_digests, m,
                        FIELDS: tl.constexpr, PAIRS: tl.constexpr, BLOCK: tl.constexpr):
    """Per new key: its key (FIELDS 1), score (2) and digest (3) written at its slot.
    PAIRS (every field), a layout the table does not have: key and score side by side
    in one 16-byte entry of ``t_keys`` (one sector), then the digest."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < m
    slot = tl.load(slots_ptr + i, mask=mask, other=0)
    key = tl.load(keys_ptr + i, mask=mask, other=0)
    if PAIRS:
        half = tl.arange(0, 2)
        pair = tl.where(half[None, :] == 0, key[:, None],
                        tl.load(scores_ptr + i, mask=mask, other=0)[:, None])
        tl.store(t_keys + slot[:, None] * 2 + half[None, :], pair, mask=mask[:, None])
    else:
        tl.store(t_keys + slot, key, mask=mask)
        if FIELDS >= 2:
            tl.store(t_scores + slot, tl.load(scores_ptr + i, mask=mask, other=0), mask=mask)
    if FIELDS >= 3:
        tl.store(t_digests + slot, (key & 0xFF).to(tl.uint8), mask=mask)


def _rows_floor_ms(n: int, dim: int) -> float:
    """A contiguous copy of n rows of dim fp32 values: the rows' bytes at the copy
    bandwidth (an insert's rows land at scattered slots, which is no faster)."""
    src = torch.empty(n, dim, device=DEVICE)
    dst = torch.empty(n, dim, device=DEVICE)
    return time_device_ms(lambda: dst.copy_(src), ARGS.reps)["device_ms"]


def main() -> None:
    n, nb = ARGS.batch, ARGS.slots // CAP
    m = int(ARGS.new * n)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    t_keys = torch.randint(0, 1 << 62, (ARGS.slots,), device=DEVICE, generator=gen)
    t_scores = torch.zeros(ARGS.slots, dtype=torch.int64, device=DEVICE)
    t_digests = torch.randint(0, 256, (ARGS.slots,), dtype=torch.uint8, device=DEVICE,
                              generator=gen)
    buckets = torch.randint(0, nb, (n,), device=DEVICE, generator=gen)
    present = torch.zeros(n, dtype=torch.int8, device=DEVICE)
    present[m:] = 1
    out = torch.empty(n, dtype=torch.int64, device=DEVICE)
    # distinct random slots for the new keys
    slots = torch.randperm(ARGS.slots, device=DEVICE, generator=gen)[:m]
    new_keys = torch.randint(0, 1 << 62, (m,), device=DEVICE, generator=gen)
    new_scores = torch.ones(m, dtype=torch.int64, device=DEVICE)
    parts = {}
    for confirm in (0, 1):
        parts[f"probe_lines{'_keys' if confirm else ''}_ms"] = time_device_ms(
            lambda c=confirm: _probe_floor_kernel[(triton.cdiv(n, 64),)](
                buckets, present, t_digests.view(torch.int32), t_keys, out, n, CONFIRM=c,
                BLOCK=64, num_warps=2), ARGS.reps)["device_ms"]
    t_pairs = torch.zeros(ARGS.slots, 2, dtype=torch.int64, device=DEVICE)
    for fields, pairs, name in ((1, 0, "keys"), (2, 0, "keys_scores"),
                                (3, 0, "keys_scores_digests"), (3, 1, "pairs_digests")):
        parts[f"place_{name}_ms"] = time_device_ms(
            lambda f=fields, p=pairs: _place_floor_kernel[(triton.cdiv(m, 256),)](
                slots, new_keys, new_scores, t_pairs if p else t_keys, t_scores, t_digests,
                m, FIELDS=f, PAIRS=p, BLOCK=256, num_warps=4), ARGS.reps)["device_ms"]
    probe, place = parts["probe_lines_keys_ms"], parts["place_keys_scores_digests_ms"]
    budget_ms = n / (ARGS.target * 1e6)
    rows = []
    for dim in ARGS.dims:
        copy = _rows_floor_ms(n, dim)
        moved = 2 * n * dim * 4
        rows.append({"dim": dim, "rows_ms": copy, "rows_tb_s": moved / copy / 1e9,
                     "index_allowance_ms": budget_ms - copy,
                     "floor_ms": probe + place + copy,
                     "floor_bkvs": n / (probe + place + copy) / 1e6})
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots, "batch": n, "new": m,
               "target_bkvs": ARGS.target, "call_allowance_ms": budget_ms,
               "probe_ms": probe, "place_ms": place, "parts": parts, "rows": rows}
    _write(results)


def _write(results: dict) -> None:
    env = results["env"]
    lines = [
        "# Memory floors under benchmark A's insert ops", "",
        f"Command: `{results['command']}`", "",
        f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton {env['triton']};"
        f" {results['slots']} slots (bucket {CAP}), {results['batch']} keys a call, "
        f"{results['new']} of them new. Probe floor (every key's digest line, a key read "
        f"for each present one): {results['probe_ms']:.3f} ms; place floor (each new "
        f"key's key, score and digest written at a random slot): "
        f"{results['place_ms']:.3f} ms. At {results['target_bkvs']} B-KV/s a call may take "
        f"{results['call_allowance_ms']:.3f} ms.", "",
        "Parts (ms): " + ", ".join(f"{k.removesuffix('_ms')} {v:.3f}"
                                   for k, v in results["parts"].items()) + ".", "",
        "| dim | rows floor ms (TB/s) | left for the index work ms | probe + place floor ms "
        "| all floors ms | B-KV/s at the floors |",
        "| --- | --- | --- | --- | --- | --- |"]
    index = results["probe_ms"] + results["place_ms"]
    for r in results["rows"]:
        lines.append(f"| {r['dim']} | {r['rows_ms']:.3f} ({r['rows_tb_s']:.2f}) | "
                     f"{r['index_allowance_ms']:.3f} | {index:.3f} | {r['floor_ms']:.3f} | "
                     f"{r['floor_bkvs']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if ARGS.out:
        with open(ARGS.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        with open(ARGS.out + ".md", "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
