"""Dump and load throughput of one dynamic table through save_checkpoint / restore_checkpoint.

Fills a HashTable with ``--gb`` of full rows (embedding + optimizer state), then
times a checkpoint save (export, checksums, write, fsync), a raw read of the
shards (read + checksum verify only), and a restore into an empty table (read,
verify, insert). Throughput is table bytes (keys, tags, rows, scores) per second.
The files are read right after being written, so reads may come from the page
cache; the JSON records that.

    python benchmarks/bench_checkpoint.py --gb 1 --out benchmarks/results/checkpoint_cpu.json
    python benchmarks/bench_checkpoint.py --gb 10 --device cuda --out .../checkpoint_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone

import torch

from hashrec.checkpoint import restore_checkpoint, save_checkpoint
from hashrec.checkpoint.layout import read_meta
from hashrec.checkpoint.restore import open_table_shards
from hashrec.table import HashTable, SparseAdagrad, SparseAdam, SparseSGD, TableOptions

_OPTIMIZERS = {"sgd": SparseSGD(lr=0.1), "adagrad": SparseAdagrad(lr=0.1),
               "adam": SparseAdam(lr=0.01)}


def _options(args: argparse.Namespace, rows: int) -> TableOptions:
    return TableOptions(dim=args.dim, max_capacity=2 * rows + 4096,
                        bucket_capacity=128, optimizer=_OPTIMIZERS[args.optimizer],
                        score_strategy="CUSTOMIZED", device=args.device, name="bench")


def _row_bytes(table: HashTable) -> int:
    element = torch.empty(0, dtype=table.options.dtype).element_size()
    return 8 + 4 + 8 + table.row_dim * element  # key, tag, scores, row


def _fill(table: HashTable, rows: int, batch: int) -> None:
    gen = torch.Generator().manual_seed(0)
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        keys = torch.arange(start, start + n, dtype=torch.int64) * 7919 - (1 << 40)
        values = torch.randn(n, table.row_dim, generator=gen)
        scores = torch.randint(0, 1000, (n,), generator=gen)
        dev = table.device
        table.load_state(keys.to(dev), None, values.to(dev), scores.to(dev), assume_unique=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _raw_read(path: str) -> int:
    meta = read_meta(path)
    total = 0
    for reader in open_table_shards(path, meta, "bench"):
        for chunk in reader.iter_chunks("rows"):
            total += int(chunk["keys"].shape[0])
    return total


def _dump(table: HashTable, work: str, args: argparse.Namespace) -> tuple[str, float]:
    paths: list[str] = []
    seconds = _timed(lambda: paths.append(save_checkpoint(
        work, 1, None, None, {"bench": table}, chunk_rows=args.chunk_rows)), args.device)
    return paths[0], seconds


def _filled_table(args: argparse.Namespace) -> tuple[HashTable, float]:
    probe = HashTable(_options(args, 1024))
    rows = int(args.gb * 1e9) // _row_bytes(probe)
    table = HashTable(_options(args, rows))
    return table, _timed(lambda: _fill(table, rows, args.chunk_rows), args.device)


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    table, fill_s = _filled_table(args)
    rows = table.size()
    nbytes = rows * _row_bytes(table)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir)
    try:
        path, save_s = _dump(table, work, args)
        file_bytes = sum(os.path.getsize(os.path.join(root, f))
                         for root, _, files in os.walk(path) for f in files)
        read_s = _timed(lambda: _raw_read(path), args.device)
        del table  # free it before the restore allocates a second table
        fresh = HashTable(_options(args, rows))
        load_s = _timed(lambda: restore_checkpoint(path, None, None, {"bench": fresh}),
                        args.device)
        if fresh.size() != rows:
            raise RuntimeError(f"restored {fresh.size()} rows, saved {rows}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = nbytes / 1e9
    return {
        "rows": rows, "dim": args.dim, "row_dim": fresh.row_dim, "optimizer": args.optimizer,
        "table_gb": round(gb, 3), "file_gb": round(file_bytes / 1e9, 3),
        "chunk_rows": args.chunk_rows, "device": args.device, "fill_s": round(fill_s, 2),
        "dump_s": round(save_s, 2), "dump_gb_per_s": round(gb / save_s, 3),
        "read_verify_s": round(read_s, 2), "read_verify_gb_per_s": round(gb / read_s, 3),
        "load_s": round(load_s, 2), "load_gb_per_s": round(gb / load_s, 3),
        "reads_after_write_page_cache": True,
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(), "host": platform.node(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="table size in GB of rows")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--optimizer", choices=sorted(_OPTIMIZERS), default="adagrad")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk_rows", type=int, default=1 << 20)
    parser.add_argument("--dir", default=None, help="where to write (default: temp dir)")
    parser.add_argument("--out", default=None, help="JSON result file")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
