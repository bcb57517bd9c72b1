"""Dynamic-table ops in HierarchicalKV's setup, through the Triton kernels.

Per load factor the index is filled once (random int64 keys, equal scores); per
dim a value matrix is attached and three ops are timed on batches of ``--batch``
keys, 60% present and 40% new:

* find: ``find_values`` (digest probe + key compare + value gather, one launch);
* insert_or_assign: ``upsert_assign``: ``upsert_slots`` (find, insert the misses,
  evicting at a full bucket; no host sync) then ``write_rows`` of the batch's values to
  every placed slot (with a key repeated in the batch, one of its rows lands);
* find_or_insert: ``upsert_embeddings``: ``upsert_slots`` then ``read_or_init_rows``
  (every key's row, new rows drawn in-kernel from hashed uniforms in [0, 0.01) and
  written, one launch).

The insert ops' scores (every one 1) are made before the timing, as the keys and values
are (``--scores-in-call``: made inside each timed call, as before).
The index is restored between dims so every dim sees the same load factor, and
before every timed insert call (untimed), so each call inserts its 40% new keys at
the row's load factor (``--no-restore`` times them one after the other instead; each
adds about 0.6% of 64M slots, and the later calls of a row then run above it).
Output: a JSON file and a markdown table (B-KV/s = 1e9 keys per second).

    python benchmarks/bench_table_gpu.py --out benchmarks/results/table_gpu
    python benchmarks/bench_table_gpu.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _cli import add_out_and_smoke, launch_config, parse_with_smoke

# Flags that set one entry of the upsert's launch settings (``UPSERT_BLOCK``): flag,
# entry, what it sets.
UPSERT_BLOCK_FLAGS = (
    ("--upsert-block", "block", "insert programs in block form with this many sorted "
     "positions each (0: per-position form)"),
    ("--upsert-width", "width", "block form: longest run placed in tiles"),
    ("--upsert-lanes", "lanes", "1: the lane form places short runs into free slots before "
     "the block form; 0: the block form alone"),
    ("--upsert-lane-width", "lane_width", "lane form: longest run it places (0: the block "
     "form's width)"),
    ("--upsert-maxnreg", "maxnreg", "block form: at most this many registers a thread (0: "
     "the compiler's choice)"),
    ("--upsert-warps", "num_warps", "block form: warps a program"),
    ("--lane-warps", "lane_warps", "lane form: warps a program"),
    ("--upsert-elements", "elements", "block form: values a (positions, bucket) tile holds "
     "at most, which caps its positions a program"),
    ("--upsert-inline", "inline", "lane form: 1 places every run itself (no block form "
     "after it), 0 never, -1 where the previous call left few runs to the block form"),
    ("--upsert-inline-share", "inline_share", "lane form, inline -1: places every run itself "
     "where the previous call flagged at most 1 / this of its blocks"),
    ("--upsert-inline-bi", "inline_bi", "lane form, placing every run itself: incoming keys "
     "of a run held in registers"),
    ("--upsert-inline-maxnreg", "inline_maxnreg", "lane form, placing every run itself: at "
     "most this many registers a thread (0: the compiler's choice)"),
    ("--probe-maxnreg", "probe_maxnreg", "the upsert's probe: at most this many registers a "
     "thread (0: the compiler's choice)"),
)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=64 * 2 ** 20)
    p.add_argument("--batch", type=int, default=1_048_576)
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    p.add_argument("--dims", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--reps", type=int, default=10)
    add_out_and_smoke(p)
    p.add_argument("--no-restore", action="store_true",
                   help="time the insert calls one after the other into the same index, "
                        "which fills past the row's load factor (each call adds some 40%% "
                        "of a batch); by default every call starts from the filled index")
    p.add_argument("--scores-in-call", action="store_true",
                   help="make the insert ops' scores (torch.ones_like(keys)) inside each "
                        "timed call, one more kernel a call; by default they are made "
                        "before the timing, as the keys and values are")
    p.add_argument("--profile", action="store_true",
                   help="print a kernel profile of one insert_or_assign and find_or_insert")
    p.add_argument("--upsert-group", type=int, default=None, choices=[0, 1],
                   help="how the upsert groups its misses by bucket: 1 a counting sort over the "
                        "buckets, 0 torch's stable sort of every key (default: the "
                        "HASHREC_UPSERT_GROUP setting, else 1)")
    for flag, _, text in UPSERT_BLOCK_FLAGS:
        p.add_argument(flag, type=int, default=None, help=f"{text} (default: the library's)")
    p.add_argument("--probe-launch", default=None,
                   help="the upsert's probe: KEYSxWARPS[rREGS] (keys a program, warps, at "
                        "most REGS registers a thread), e.g. 32x1r80; default: the library's")
    p.add_argument("--word-probe", type=int, default=None, choices=[0, 1],
                   help="every probe (find, and the upsert's) places its digest matches by "
                        "position (0) or finds the lowest by word (1) (HASHREC_WORD_PROBE); "
                        "default: each launch's choice")
    p.add_argument("--word-probe-lowest", type=int, default=None, choices=[2, 3],
                   help="the probe by word finds and confirms its 2 or 3 lowest digest "
                        "matches together (HASHREC_WORD_PROBE_LOWEST); default: the "
                        "library's")
    p.add_argument("--stream", action="store_true",
                   help="run on a stream of its own, not the default one (--l2-digests does)")
    p.add_argument("--l2-digests", action="store_true",
                   help="keep the digest array in the GPU's L2 persisting share (an access "
                   "policy window on the stream, benchmarks/_l2.py)")
    p.add_argument("--l2-share", type=float, default=1.0,
                   help="--l2-digests: the fraction of the largest persisting share set aside")
    p.add_argument("--tagged", action="store_true",
                   help="probes also compare the tag array (a fused table's storage); by "
                        "default the table is an unfused one (every tag 0, not read)")
    p.add_argument("--find-configs", nargs="*", default=[],
                   help="extra find launch configs BLOCKxWARPS[rREGS] to time, e.g. 64x8 "
                        "or 64x2r80 (at most 80 registers a thread)")
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dims, args.reps = 1024, 200, [8], 1
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _l2  # noqa: E402
import torch  # noqa: E402
from _table_fill import restore, snapshot  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.table.ops.export.triton import occupied_slots  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.ops.find.triton import find_slots, find_values  # noqa: E402
from hashrec.table.ops.insert import rows as rows_tt  # noqa: E402
from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert.triton import insert_keys  # noqa: E402
from hashrec.table.ops.insert.upsert_rows import upsert_assign, upsert_embeddings  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
I64 = torch.iinfo(torch.int64)


def _random_keys(n: int) -> torch.Tensor:
    return torch.randint(I64.min, I64.max, (n,), dtype=torch.int64, device=DEVICE)


def _fill(storage: TableStorage, load_factor: float) -> int:
    """Inserts random keys until the load factor is reached; returns keys offered."""
    target, offered = int(load_factor * storage.capacity), 0
    chunk = max(1, storage.capacity // 16)
    while storage.size() < target and offered < 2 * storage.capacity:
        n = min(chunk, max(target - storage.size(), chunk // 8))
        keys = torch.unique(_random_keys(n))
        keys = keys[find_slots(storage, keys) < 0]
        insert_keys(storage, keys, None, torch.zeros_like(keys), allow_evict=True)
        offered += keys.numel()
    return offered


def _batch(stored: torch.Tensor, n: int) -> torch.Tensor:
    hits = int(0.6 * n)
    pick = stored[torch.randint(0, stored.numel(), (hits,), device=DEVICE)]
    return torch.cat([pick, _random_keys(n - hits)])


def _scores(keys: torch.Tensor, ones: torch.Tensor | None) -> torch.Tensor:
    """The insert's scores: ``ones`` made before the timing, else made here (in the call)."""
    return torch.ones_like(keys) if ones is None else ones


def _insert_or_assign(storage: TableStorage, keys: torch.Tensor, values: torch.Tensor,
                      ones: torch.Tensor | None = None) -> None:
    upsert_assign(storage, keys, None, _scores(keys, ones), values, allow_evict=True)


def _find_or_insert(storage: TableStorage, keys: torch.Tensor,
                    ones: torch.Tensor | None = None) -> torch.Tensor:
    return upsert_embeddings(storage, keys, None, _scores(keys, ones), True, storage.row_dim,
                             0.0, 0.01, seed=0)[1]


def _bench_dim(index: TableStorage, saved: list, stored: torch.Tensor, dim: int,
               lf: float) -> dict:
    restore(index, saved)
    storage = TableStorage(index.num_buckets, index.bucket_capacity, index.keys, index.tags,
                           index.digests, index.scores,
                           torch.randn(index.capacity, dim, device=DEVICE),
                           tagged=ARGS.tagged)
    n, reps = ARGS.batch, ARGS.reps
    probe = _batch(stored, n)
    hit_rate = float((find_slots(storage, probe) >= 0).float().mean())
    find = time_device_ms(lambda: find_values(storage, probe, None, dim), reps)
    storage.tagged = not ARGS.tagged  # the other form, for comparison
    other = time_device_ms(lambda: find_values(storage, probe, None, dim), reps)
    storage.tagged = ARGS.tagged
    sweep = {}
    default = find_tt.FIND_CONFIG
    for cfg in ARGS.find_configs:
        find_tt.FIND_CONFIG = launch_config(cfg)
        t = time_device_ms(lambda: find_values(storage, probe, None, dim), reps)
        sweep[cfg] = {"bkvs": n / t["device_ms"] / 1e6, "call_bkvs": n / t["call_ms"] / 1e6}
    find_tt.FIND_CONFIG = default
    # Every insert call starts from the filled index (restored, untimed), so each one
    # sees the row's load factor rather than the one its predecessors left.
    batches = [_batch(stored, n) for _ in range(2 * (reps + 2))]

    def fresh(i: int) -> torch.Tensor:
        if not ARGS.no_restore:
            restore(index, saved)
        return batches[i]
    vals = torch.randn(n, dim, device=DEVICE)
    ones = None if ARGS.scores_in_call else torch.ones(n, dtype=torch.int64, device=DEVICE)
    ioa = time_device_ms(lambda k: _insert_or_assign(storage, k, vals, ones), reps, setup=fresh)
    batches = [_batch(stored, n) for _ in range(2 * (reps + 2))]
    foi = time_device_ms(lambda k: _find_or_insert(storage, k, ones), reps, setup=fresh)
    if ARGS.profile and DEVICE.type == "cuda" and dim in (ARGS.dims[0], ARGS.dims[-1]):
        print(f"profile: load factor {lf}, dim {dim}, a fresh batch from the filled index",
              flush=True)
        restore(index, saved)
        _profile(storage, _batch(stored, n), _batch(stored, n), vals)
    row = {"dim": dim, "find_hit_rate": hit_rate, "find_sweep_bkvs": sweep,
           "find_other_tagged_ms": other["device_ms"]}
    for op, t in (("find", find), ("insert_or_assign", ioa), ("find_or_insert", foi)):
        row.update({f"{op}_ms": t["device_ms"], f"{op}_call_ms": t["call_ms"],
                    f"{op}_issue_ms": t["issue_ms"], f"{op}_spin_short": t["spin_short"],
                    f"{op}_bkvs": n / t["device_ms"] / 1e6,
                    f"{op}_call_bkvs": n / t["call_ms"] / 1e6})
    return row


def _profile(storage: TableStorage, ioa_keys: torch.Tensor, foi_keys: torch.Tensor,
             vals: torch.Tensor) -> None:
    """Kernel times of one insert_or_assign and then one find_or_insert, each of a batch
    the table has not seen (60% present, 40% new)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _insert_or_assign(storage, ioa_keys, vals)
        _find_or_insert(storage, foi_keys)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)


def main() -> None:
    if ARGS.upsert_group is not None:
        upsert_tt.UPSERT_GROUP["count"] = ARGS.upsert_group
    for flag, name, _ in UPSERT_BLOCK_FLAGS:
        value = getattr(ARGS, flag[2:].replace("-", "_"))
        if value is not None:
            upsert_tt.UPSERT_BLOCK[name] = value
    if ARGS.probe_launch is not None:
        launch = launch_config(ARGS.probe_launch)
        upsert_tt.UPSERT_BLOCK.update(probe_keys=launch["block"], probe_warps=launch["num_warps"],
                                      probe_maxnreg=launch["maxnreg"])
    if ARGS.word_probe is not None:
        find_tt.WORD_PROBE = bool(ARGS.word_probe)
    if ARGS.word_probe_lowest is not None:
        find_tt.WORD_PROBE_LOWEST = ARGS.word_probe_lowest
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots,
               "batch": ARGS.batch, "restored": not ARGS.no_restore, "bucket_capacity": 128,
               "scores_in_call": ARGS.scores_in_call,
               "upsert_config": dict(upsert_tt.UPSERT_CONFIG),
               "upsert_block": dict(upsert_tt.UPSERT_BLOCK),
               "upsert_group": dict(upsert_tt.UPSERT_GROUP),
               "rows_launch": dict(rows_tt.ROWS_LAUNCH),
               "tagged": ARGS.tagged, "word_probe": find_tt.WORD_PROBE,
               "word_probe_lowest": find_tt.WORD_PROBE_LOWEST,
               "mask_probe": bool(find_tt.MASK_PROBE), "rows": []}
    if ARGS.stream or ARGS.l2_digests:  # a window needs a stream other than the legacy one
        if DEVICE.type != "cuda":
            raise SystemExit("--stream and --l2-digests need a CUDA device")
        torch.cuda.set_stream(torch.cuda.Stream())
    for lf in ARGS.load_factors:
        index = TableStorage.empty(ARGS.slots // 128, 128, 1, device=DEVICE)
        offered = _fill(index, lf)
        real_lf = index.size() / index.capacity
        stored = index.keys[occupied_slots(index, 0, index.capacity)]
        saved = snapshot(index)
        l2 = _l2.persist(index.digests, ARGS.l2_share) if ARGS.l2_digests else None
        for dim in ARGS.dims:
            row = {"load_factor": lf, "measured_load_factor": real_lf, "keys_offered": offered}
            if l2 is not None:
                row["l2_window"] = l2
            row.update(_bench_dim(index, saved, stored, dim, lf))
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        if l2 is not None:
            _l2.clear()
        del index, saved, stored
        torch.cuda.empty_cache() if DEVICE.type == "cuda" else None
    _write(results)


def _write(results: dict) -> None:
    ops = ("find", "insert_or_assign", "find_or_insert")
    lines = ["| load factor | dim | " + " | ".join(f"{op} B-KV/s (ms)" for op in ops)
             + " | " + " | ".join(f"{op} one call B-KV/s" for op in ops) + " |",
             "| --- | --- |" + " --- |" * (2 * len(ops))]
    for r in results["rows"]:
        device = " | ".join(f"{r[f'{op}_bkvs']:.2f} ({r[f'{op}_ms']:.3f})" for op in ops)
        call = " | ".join(f"{r[f'{op}_call_bkvs']:.2f}" for op in ops)
        lines.append(f"| {r['measured_load_factor']:.3f} | {r['dim']} | {device} | {call} |")
    if ARGS.find_configs:
        lines += ["", "find at the extra launch configs, B-KV/s (device time, same run):", "",
                  "| load factor | dim | default | " + " | ".join(ARGS.find_configs) + " |",
                  "| --- | --- | --- |" + " --- |" * len(ARGS.find_configs)]
        for r in results["rows"]:
            extra = " | ".join(f"{r['find_sweep_bkvs'][c]['bkvs']:.2f}"
                               for c in ARGS.find_configs)
            lines.append(f"| {r['measured_load_factor']:.3f} | {r['dim']} | "
                         f"{r['find_bkvs']:.2f} | {extra} |")
    table = "\n".join(lines)
    print(table)
    if ARGS.out:
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# Table ops on GPU\n\nCommand: `{results['command']}`\n\n"
                      f"Insert programs: {results['upsert_block']} (block 0: one program "
                      f"per sorted position, {results['upsert_config']}); misses grouped by "
                      f"{'a counting sort' if results['upsert_group']['count'] else 'a sort'} "
                      f"({results['upsert_group']}); tags compared: "
                      f"{results['tagged']} (False: an unfused table, every tag 0); probes "
                      f"from bit masks: {results['mask_probe']} (HASHREC_MASK_PROBE); row "
                      f"kernels: {results['rows_launch']} (HASHREC_ROWS_ELEMENTS, "
                      f"HASHREC_ROWS_WARPS, HASHREC_ROWS_INIT_ELEMENTS, "
                      f"HASHREC_ROWS_INIT_WARPS); the insert ops' scores made "
                      f"{'in each timed call' if ARGS.scores_in_call else 'before the timing'}"
                      f".\n\n"
                      f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
                      f"{env['triton']}; {results['slots']} slots (bucket 128), "
                      f"{results['batch']} keys per call, every batch 60% present. "
                      + ("The insert calls ran one after the other into the same index, so "
                         "their load factor grew past the row's (`--no-restore`)."
                         if ARGS.no_restore else "Every insert call started from the "
                         "filled index (restored between calls, untimed).") + "\n\n"
                      "B-KV/s (ms): the device's time for the op, with the host's issue "
                      "hidden behind a spin queued ahead (`_timing.time_device_ms`). One "
                      "call: the op between device syncs, host issue (Python, checks, "
                      "launches) included.\n\n"
                      f"{table}\n")


if __name__ == "__main__":
    main()
