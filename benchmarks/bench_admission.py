"""Frequency admission's counter table on the GPU, by the probe's form.

A table with admission counts the keys it has not stored yet in a counter table of
wide buckets (``counter_bucket_capacity``, 1,024 slots by default). This times, on the
same counter tables and batches, the three ways a probe can read such a bucket
(``hashrec/table/ops/find/probe.py``), alternating (``--rounds`` rounds, medians of
``--reps`` runs each):

- ``segments`` (the default): the bucket as 128-slot segments in order, each probed from
  two 64-bit digest-match masks as a 128-slot bucket is, until the key is found;
- ``tile``: the whole digest line as a (keys, line) tile (``HASHREC_MASK_PROBE=0``), the
  matches confirmed one a round (an 8-bit digest matches about cap / 256 slots of a full
  bucket at random: some four in 1,024 slots);
- ``tile4``: the same, four matches confirmed a round (``HASHREC_WIDE_PROBE_MIN_CAP``).

Timed: find (the counters' slots of a batch of unique keys, the Triton ``find_slots``)
and count (a training lookup's admission step, ``AdmissionCounter.count_masked``: the
counting kernel, then the new counters inserted through the upsert's probe, evicting the
lowest counts of a full bucket), each run from the same filled counter table. The
count's outcome is also checked once against the reference count on a CPU copy.

Counter tables of ``--slots`` slots are filled at each ``--load-factors`` (random
keys, counts 1-2); a batch holds ``--batch`` unique keys, ``--present`` of them
counted before; each key adds 1 with threshold 3, so a third of the present keys are
admitted. Every form's results are compared with the first's once (slots; admitted
keys, evicted counters and the counter table after the count).

Usage::

    python benchmarks/bench_admission.py --out benchmarks/results/admission_gpu
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=1 << 24, help="counter table slots")
    p.add_argument("--bucket", type=int, default=1024, help="counter bucket capacity")
    p.add_argument("--batch", type=int, default=1 << 20, help="unique keys a call")
    p.add_argument("--present", type=float, default=0.6,
                   help="share of a batch's keys that have a counter")
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--wide-lane-width", type=int, default=None,
                   help="the upsert lane form's longest run in buckets over 128 slots "
                        "(UPSERT_BLOCK['wide_lane_width']; default: the library's)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one count call of each form and load factor "
                        "(torch.profiler) and write its kernels by device time to "
                        "OUT_profile.txt")
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:  # interpreted on CPU tensors, tiny sizes
        args.slots, args.bucket, args.batch, args.reps, args.rounds = 4096, 256, 64, 1, 1
        args.load_factors = [0.5, 1.0]
    return args


ARGS = _args()

import torch  # noqa: E402
from _table_fill import filled_index, random_keys  # noqa: E402
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.table.admission import AdmissionCounter  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.ops.insert.upsert_block import UPSERT_BLOCK, lane_width  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

if ARGS.wide_lane_width is not None:
    UPSERT_BLOCK["wide_lane_width"] = ARGS.wide_lane_width

THRESHOLD = 3
WARMUP = 0 if ARGS.smoke else 2
# form: (MASK_PROBE, WIDE_PROBE_MIN_CAP)
FORMS = {"segments": (1, 0), "tile": (0, 0), "tile4": (0, ARGS.bucket)}


def _use(form: str) -> None:
    find_tt.MASK_PROBE, find_tt.WIDE_PROBE_MIN_CAP = FORMS[form]


def _counter(load_factor: float, device: torch.device) -> tuple[AdmissionCounter, torch.Tensor]:
    """A counter table at ``load_factor`` (counts 1-2) and its counted keys."""
    index, stored = filled_index(ARGS.slots, load_factor, device, cap=ARGS.bucket)
    counter = AdmissionCounter(THRESHOLD, ARGS.slots, ARGS.bucket, device)
    occupied = index.digests != 0
    counter.storage.keys.copy_(index.keys)
    counter.storage.digests.copy_(index.digests)
    counter.storage.scores.copy_(torch.where(
        occupied, torch.randint_like(index.scores, 1, THRESHOLD), 0))
    return counter, stored


def _batch(stored: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``--batch`` unique keys, ``--present`` of them from ``stored``, shuffled."""
    present = stored[torch.randperm(stored.numel(), device=device)[:int(ARGS.batch * ARGS.present)]]
    absent = random_keys(2 * ARGS.batch, device)
    absent = absent[~torch.isin(absent, stored)]
    keys = torch.unique(torch.cat([present, absent[:ARGS.batch - present.numel()]]))
    return keys[torch.randperm(keys.numel(), device=device)]


def _snapshot(storage: TableStorage) -> tuple[torch.Tensor, ...]:
    return storage.keys.clone(), storage.digests.clone(), storage.scores.clone()


def _restore(storage: TableStorage, saved: tuple[torch.Tensor, ...]) -> None:
    for field, value in zip((storage.keys, storage.digests, storage.scores), saved):
        field.copy_(value)


def _count(counter: AdmissionCounter, keys: torch.Tensor):
    ones = torch.ones_like(keys)
    active = torch.ones_like(keys, dtype=torch.bool)
    return counter.count_masked(keys, None, ones, active)


def _measure(counter: AdmissionCounter, keys: torch.Tensor, saved) -> dict:
    """ms of find and count in the current form, medians of ``--reps``."""
    find_ms = time_ms(lambda: find_tt.find_slots(counter.storage, keys, None), reps=ARGS.reps,
                      warmup=WARMUP)
    count_ms = time_ms(lambda _: _count(counter, keys), reps=ARGS.reps, warmup=WARMUP,
                       setup=lambda _: _restore(counter.storage, saved))
    _restore(counter.storage, saved)
    return {"find_ms": find_ms, "count_ms": count_ms}


def _profile(counter: AdmissionCounter, keys: torch.Tensor, saved, title: str) -> str:
    """One count call's kernels by device time, as a table under ``title``."""
    from torch.profiler import ProfilerActivity, profile
    _count(counter, keys)  # compiled and warm
    _restore(counter.storage, saved)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        _count(counter, keys)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    _restore(counter.storage, saved)
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return f"## {title}\n\n" + prof.key_averages().table(
        sort_by=sort, row_limit=20, max_name_column_width=70) + "\n"


def _occupied(storage_fields) -> list[tuple[int, int]]:
    keys, digests, scores = (t.cpu() for t in storage_fields)
    live = digests != 0
    return sorted(zip(keys[live].tolist(), scores[live].tolist()))


def _matches_reference(keys: torch.Tensor, saved, outcome) -> bool:
    """Whether the count's outcome (``_outcome``'s) is the reference count's, run on a
    CPU copy of the counter table: the same admissions, evictions and counters."""
    ref = AdmissionCounter(THRESHOLD, ARGS.slots, ARGS.bucket, torch.device("cpu"))
    for field, value in zip((ref.storage.keys, ref.storage.digests, ref.storage.scores), saved):
        field.copy_(value.cpu())
    expected, _ = ref.count(keys.cpu(), None, torch.ones(keys.numel(), dtype=torch.int64))
    _, admitted, evicted, *after = outcome
    return (torch.equal(expected, admitted.cpu()) and int(evicted.sum()) == ref.evictions
            and _occupied(after) == _occupied(_snapshot(ref.storage)))


def _outcome(counter: AdmissionCounter, keys: torch.Tensor, saved) -> tuple[torch.Tensor, ...]:
    """Everything the forms must agree on: the slots found, then after one count the
    admitted keys, evicted counters and the counter table."""
    slots = find_tt.find_slots(counter.storage, keys, None)
    admitted, _, evicted = _count(counter, keys)
    after = _snapshot(counter.storage)
    _restore(counter.storage, saved)
    return (slots, admitted, evicted) + after


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, profiles = [], []
    for load_factor in ARGS.load_factors:
        counter, stored = _counter(load_factor, device)
        keys = _batch(stored, device)
        saved = _snapshot(counter.storage)
        outcomes, times = {}, {form: [] for form in FORMS}
        for form in FORMS:
            _use(form)
            outcomes[form] = _outcome(counter, keys, saved)
        first = outcomes["segments"]
        for _ in range(ARGS.rounds):
            for form in FORMS:
                _use(form)
                times[form].append(_measure(counter, keys, saved))
        row = {"load_factor": load_factor,
               "measured_load_factor": float((saved[1] != 0).float().mean()),
               "keys": keys.numel(),
               "same": all(torch.equal(a, b) for form in FORMS
                           for a, b in zip(first, outcomes[form])),
               "reference": _matches_reference(keys, saved, first)}
        for form in FORMS:
            for op in ("find", "count"):
                row[f"{op}_{form}_ms"] = [t[f"{op}_ms"] for t in times[form]]
            if ARGS.profile:
                _use(form)
                profiles.append(_profile(counter, keys, saved,
                                         f"count, {form}, load factor {load_factor}"))
        print(row, flush=True)
        rows.append(row)
        del counter, stored, saved, outcomes
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _use("segments")
    results = {"command": command_line(), **environment(), "slots": ARGS.slots,
               "bucket": ARGS.bucket, "batch": ARGS.batch, "present": ARGS.present,
               "rounds": ARGS.rounds, "reps": ARGS.reps,
               "wide_lane_width": UPSERT_BLOCK["wide_lane_width"],
               "lane_width": lane_width(UPSERT_BLOCK, ARGS.bucket),
               "rows": rows}
    if ARGS.out:
        write_results(ARGS.out, results, _markdown(results))
        if profiles:
            with open(f"{ARGS.out}_profile.txt", "w") as f:
                f.write(f"Command: {results['command']}\n\n" + "\n".join(profiles))
    for text in profiles:
        print(text, flush=True)


def _ms(values: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _markdown(results: dict) -> str:
    lines = [
        "# Admission counters: the probe's forms in wide buckets", "",
        f"Command: `{results['command']}`", "",
        f"Date {results['date']}, GPU {results['gpu']}, torch {results['torch']}, "
        f"triton {results['triton']}; counter tables of {results['slots']:,} slots in "
        f"buckets of {results['bucket']}, {results['batch']:,} unique keys a call "
        f"({results['present']:.0%} counted before); the upsert's lane form places runs "
        f"of up to {results['lane_width']} misses there. ms are medians of {results['reps']} "
        f"runs, one figure a round ({results['rounds']} rounds, the forms alternating); "
        "speedup: the tile's median over the segments'.", "",
        "| load factor | op | segments ms | tile ms | tile4 ms | speedup over tile "
        "| over tile4 | same results | count as the reference's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        for op in ("find", "count"):
            mid = {form: statistics.median(r[f"{op}_{form}_ms"]) for form in FORMS}
            lines.append(
                f"| {r['measured_load_factor']:.2f} | {op} | {_ms(r[f'{op}_segments_ms'])} "
                f"| {_ms(r[f'{op}_tile_ms'])} | {_ms(r[f'{op}_tile4_ms'])} "
                f"| {mid['tile'] / mid['segments']:.2f}x | {mid['tile4'] / mid['segments']:.2f}x "
                f"| {'yes' if r['same'] else 'NO'} | {'yes' if r['reference'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
