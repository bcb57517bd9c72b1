"""Where the upsert's block kernel spends its time: runs that need eviction, or not.

Per load factor, a table of ``--slots`` slots (bucket 128) is filled directly, and one
batch of ``--batch`` keys (60% present, 40% new, score 1 over stored scores 0) goes
through ``upsert_slots`` once to capture the block kernel's inputs. Then, with the
table restored before every call:

* the runs of misses are counted: short ones (at most the block form's width), long
  ones, and those whose bucket has fewer empty slots than first occurrences (eviction
  needed), with the block programs that hold at least one of those;
* the block kernel alone is timed with eviction allowed (as insert_or_assign runs it)
  and not (such runs are then refused: a lower bound with the eviction path idle);
* the whole ``upsert_slots`` call is timed.

    python benchmarks/profile_upsert_evict.py --out benchmarks/results/upsert_evict_gpu
    python benchmarks/profile_upsert_evict.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import os
import sys

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=64 * 2 ** 20)
    p.add_argument("--batch", type=int, default=1_048_576)
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 0.85, 1.0])
    p.add_argument("--reps", type=int, default=5)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.load_factors, args.reps = 4096, 300, [0.5, 1.0], 1
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _table_fill import filled_index, random_keys  # noqa: E402
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.table.ops.insert import upsert  # noqa: E402
from hashrec.table.ops.insert.upsert_block import UPSERT_BLOCK, block_positions  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INDEX = ("keys", "digests", "scores")


class _Capture:
    """Stands in for the block kernel: records each launch's grid and arguments, then
    launches it."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, dict(kwargs)))
            return self.kernel[grid](*args, **kwargs)
        return launch


def _run_stats(storage, args: tuple, block: int, width: int) -> dict:
    """Runs of the sorted misses in ``args`` (the block kernel's inputs), against the
    table as it is now."""
    in_bucket, in_first = args[4], args[5]
    n = in_bucket.numel()
    miss = in_bucket >= 0
    at = torch.arange(n, device=in_bucket.device)
    opens = miss & torch.cat([torch.ones(1, dtype=torch.bool, device=DEVICE),
                              in_bucket[1:] != in_bucket[:-1]])
    starts = at[opens]
    ends = torch.cat([starts[1:], miss.sum().reshape(1)])
    length = ends - starts
    firsts = (in_first == at) & miss
    n_first = torch.zeros(n + 1, dtype=torch.int64, device=DEVICE)
    n_first[1:] = torch.cumsum(firsts.to(torch.int64), 0)
    run_firsts = n_first[ends] - n_first[starts]
    cap = storage.bucket_capacity
    digests = storage.digests.view(-1, cap)[in_bucket[starts]]
    empty = (digests == 0).sum(1)
    needs = run_firsts > empty
    programs = torch.unique(starts[needs] // block).numel()
    return {"misses": int(miss.sum()), "runs": int(starts.numel()),
            "short_runs": int((length <= width).sum()), "long_runs": int((length > width).sum()),
            "runs_needing_eviction": int(needs.sum()),
            "programs": -(-n // block), "programs_with_eviction": programs,
            "programs_with_misses": torch.unique(starts // block).numel()}


def _load_factor(lf: float) -> dict:
    storage, stored = filled_index(ARGS.slots, lf, DEVICE)
    saved = [getattr(storage, name).clone() for name in INDEX]

    def restore(_i: int = 0) -> None:
        for name, src in zip(INDEX, saved):
            getattr(storage, name).copy_(src)

    n = ARGS.batch
    present = stored[torch.randint(0, stored.numel(), (int(n * 0.6),), device=DEVICE)]
    batch = torch.cat([present, random_keys(n - present.numel(), DEVICE)])
    scores = torch.ones_like(batch)
    capture = _Capture(upsert.upsert_block_kernel)
    upsert.upsert_block_kernel = capture
    try:
        upsert.upsert_slots(storage, batch, None, scores, allow_evict=True)
    finally:
        upsert.upsert_block_kernel = capture.kernel
    grid, args, kwargs = capture.launches[-1]
    restore()
    block = block_positions(UPSERT_BLOCK["block"], UPSERT_BLOCK["elements"],
                            storage.bucket_capacity)
    row = {"load_factor": lf, "measured_load_factor": storage.size() / storage.capacity}
    row.update(_run_stats(storage, args, block, UPSERT_BLOCK["width"]))
    for evict in (True, False):
        kw = dict(kwargs, ALLOW_EVICT=evict)
        ms = time_ms(lambda _, kw=kw: capture.kernel[grid](*args, **kw), ARGS.reps,
                     setup=restore)
        row[f"block_kernel_ms_evict{int(evict)}"] = ms
    row["upsert_ms"] = time_ms(
        lambda _: upsert.upsert_slots(storage, batch, None, scores, allow_evict=True),
        ARGS.reps, setup=restore)
    return row


def main() -> None:
    if not UPSERT_BLOCK["block"]:
        raise SystemExit("the block form is off (HASHREC_UPSERT_BLOCK=0); nothing to time")
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots,
               "batch": ARGS.batch, "upsert_block": dict(UPSERT_BLOCK), "rows": []}
    for lf in ARGS.load_factors:
        row = _load_factor(lf)
        print(row, flush=True)
        results["rows"].append(row)
        torch.cuda.empty_cache() if DEVICE.type == "cuda" else None
    env = results["env"]
    lines = [
        "# The upsert's block kernel: runs that need eviction", "",
        f"Command: `{results['command']}`", "",
        f"Date {env['date']}, GPU {env.get('gpu', 'none')}, torch {env['torch']}, triton "
        f"{env['triton']}; {ARGS.slots} slots (bucket 128), {ARGS.batch} keys a call (60% "
        "present), the table restored before every call; median of "
        f"{ARGS.reps} calls.", "",
        "| load factor | runs | needing eviction | programs with misses | with eviction "
        "| block kernel ms | same, eviction off | upsert ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        lines.append(
            f"| {r['measured_load_factor']:.3f} | {r['runs']} | {r['runs_needing_eviction']} "
            f"| {r['programs_with_misses']} | {r['programs_with_eviction']} "
            f"| {r['block_kernel_ms_evict1']:.3f} | {r['block_kernel_ms_evict0']:.3f} "
            f"| {r['upsert_ms']:.3f} |")
    print("\n".join(lines))
    if ARGS.out:
        write_results(ARGS.out, results, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
