"""Growth of a table on the GPU: the Triton rehash against the reference's, same storage.

A table doubles (``HashTable`` growth, ``max_load_factor``) by rehashing every entry
into a storage with twice the buckets. For each (slots, dim) this fills an index at
``--load-factor`` (random keys and scores, random rows), then times the rehash to
twice the buckets with the Triton op (``hashrec/table/ops/rehash/triton.py``: one
program per old bucket, rows moved in the same program) and with the reference op
(PyTorch sorts and gathers) on the same CUDA tensors, median of ``--reps`` runs each.
Both results are compared slot for slot once. Also reported: the device-to-device
copy bandwidth measured in the same run, the share of it the Triton rehash reaches
on its minimal bytes (the new storage's zero fill, the old digests and the entries'
index fields read, the entries written, each row read and written), and the memory
each op allocates beyond the new storage at its peak.

Usage::

    python benchmarks/bench_rehash.py --out benchmarks/results/rehash_gpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=["24:8", "24:32", "24:128", "26:8", "26:32"],
                   help="LOG2_SLOTS:DIM pairs (slots before the growth)")
    p.add_argument("--load-factor", type=float, default=0.75)
    p.add_argument("--reps", type=int, default=5)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:  # the Triton op interpreted on CPU tensors, tiny sizes
        args.configs, args.reps = ["10:4"], 1
    return args


ARGS = _args()

import torch  # noqa: E402
from _table_fill import filled_index  # noqa: E402
from _timing import command_line, copy_bandwidth, environment, time_ms, write_results  # noqa: E402

from hashrec.table.ops.rehash import reference as rehash_ref  # noqa: E402
from hashrec.table.ops.rehash import triton as rehash_tt  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402


def _storage(log2_slots: int, dim: int, device: torch.device) -> TableStorage:
    index, _ = filled_index(1 << log2_slots, ARGS.load_factor, device)
    occupied = index.digests != 0
    index.scores = torch.where(occupied, torch.randint_like(index.scores, 0, 1 << 20), 0)
    index.values = torch.randn(index.capacity, dim, device=device)
    return index


def _minimal_bytes(old: TableStorage, entries: int) -> int:
    """Bytes a rehash to twice the buckets must move (see the module docstring)."""
    dim_bytes = old.row_dim * old.values.element_size()
    slot_bytes = 8 + 4 + 1 + 8 + dim_bytes  # key, tag, digest, score, row
    index_fields = 8 + 1 + 8  # key, digest, score (an untagged table leaves tags alone)
    return (2 * old.capacity * slot_bytes + old.capacity + entries * index_fields * 2
            + entries * dim_bytes * 2)


def _time(op, old: TableStorage) -> float:
    """Median ms of ``op`` growing ``old`` to twice its buckets."""
    return time_ms(lambda: op(old, old.num_buckets * 2), reps=ARGS.reps, warmup=1)


def _peak_extra_gb(op, old: TableStorage) -> float:
    """GB the op allocates at its peak beyond what stays allocated (the new storage)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grown = op(old, old.num_buckets * 2)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    extra = torch.cuda.max_memory_allocated() - before - kept
    del grown
    return extra / 1e9


def _same(a: TableStorage, b: TableStorage) -> bool:
    occupied = a.digests != 0
    return bool(torch.equal(a.digests, b.digests)
                and torch.equal(a.keys[occupied], b.keys[occupied])
                and torch.equal(a.scores[occupied], b.scores[occupied])
                and torch.equal(a.values[occupied], b.values[occupied]))


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    bandwidth = copy_bandwidth(device, 1 << 30) if cuda else None
    rows = []
    for config in ARGS.configs:
        log2_slots, dim = (int(x) for x in config.split(":"))
        old = _storage(log2_slots, dim, device)
        entries = int((old.digests != 0).sum())
        same = _same(rehash_tt.rehash(old, old.num_buckets * 2),
                     rehash_ref.rehash(old, old.num_buckets * 2))
        times = {"triton": _time(rehash_tt.rehash, old),
                 "reference": _time(rehash_ref.rehash, old)}
        row = {"slots": old.capacity, "dim": dim, "entries": entries, "same": same,
               "triton_ms": times["triton"], "reference_ms": times["reference"],
               "speedup": times["reference"] / times["triton"],
               "minimal_bytes": _minimal_bytes(old, entries)}
        if cuda:
            row["triton_share_of_copy"] = row["minimal_bytes"] / (
                times["triton"] * 1e-3) / bandwidth
            row["triton_extra_gb"] = _peak_extra_gb(rehash_tt.rehash, old)
            row["reference_extra_gb"] = _peak_extra_gb(rehash_ref.rehash, old)
        print(row, flush=True)
        rows.append(row)
        del old
        if cuda:
            torch.cuda.empty_cache()
    results = {"command": command_line(), **environment(), "load_factor": ARGS.load_factor,
               "copy_bandwidth_tbs": bandwidth / 1e12 if bandwidth else None, "rows": rows}
    if ARGS.out:
        write_results(ARGS.out, results, _markdown(results))


def _markdown(results: dict) -> str:
    bw = results["copy_bandwidth_tbs"]
    lines = [
        "# Table growth: Triton rehash against the reference rehash", "",
        f"Command: `{results['command']}`", "",
        f"Date {results['date']}, GPU {results['gpu']}, torch {results['torch']}, "
        f"triton {results['triton']}; load factor {results['load_factor']} before the "
        "growth, each rehash to twice the buckets, medians of the runs"
        + (f"; copy bandwidth {bw:.2f} TB/s in the same run." if bw else "."), "",
        "| slots before | dim | entries | Triton ms | reference ms | speedup | Triton share "
        "of copy bandwidth | extra GB (Triton / reference) | same result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        share = f"{r['triton_share_of_copy']:.2f}" if "triton_share_of_copy" in r else "-"
        extra = (f"{r['triton_extra_gb']:.2f} / {r['reference_extra_gb']:.2f}"
                 if "triton_extra_gb" in r else "-")
        lines.append(f"| {r['slots']:,} | {r['dim']} | {r['entries']:,} | {r['triton_ms']:.2f} "
                     f"| {r['reference_ms']:.2f} | {r['speedup']:.1f}x | {share} | {extra} "
                     f"| {'yes' if r['same'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
