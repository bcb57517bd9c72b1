"""Input pipeline throughput: rows/s of parquet into parsed Batch objects.

For each worker count, iterates one full pass of ``create_dataloader`` (train
mode, no shuffle) over ``--data`` or generated data and reports rows per second, counting
from the first ``iter()`` (worker start-up included) to the last batch, and
rows per CPU second (the loop's process plus its workers), which is steadier
than wall time when other jobs share the machine.

    python benchmarks/bench_data.py --num_rows 1000000 \\
        --json benchmarks/results/data_cpu.json --markdown benchmarks/results/data_cpu.md

With ``--encoded`` the same rows are also written as a feature generation encodes them
(``hashrec.tools.encode_input``) and read with ``fg_mode: FG_NONE``, each worker count
right after the raw input's, so the two compare within one run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import torch

from hashrec.config import load_pipeline_config
from hashrec.data import create_dataloader
from hashrec.data.paths import expand_input_path
from hashrec.features import build_feature_set
from hashrec.tools.gen_taobao_data import generate

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "examples",
                              "multi_tower_din_taobao_dynamicemb.config")


def measure(config, feature_set, path: str, workers: int, batch_size: int) -> dict:
    """One pass over ``path`` with ``workers`` DataLoader workers."""
    loader = create_dataloader(config.data_config, feature_set, path, "train",
                               batch_size=batch_size, num_workers=workers)
    start = time.perf_counter()
    cpu_start = time.process_time(), _children_cpu()
    rows = batches = 0
    first = None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        rows += batch.batch_size
        batches += 1
    seconds = time.perf_counter() - start
    del loader  # workers are joined when the pass ends; their CPU time is then counted
    main_cpu = time.process_time() - cpu_start[0]
    cpu = main_cpu + _children_cpu() - cpu_start[1]
    return {"workers": workers, "rows": rows, "batches": batches, "seconds": round(seconds, 3),
            "first_batch_seconds": round(first or 0.0, 3), "rows_per_second": round(rows / seconds),
            "cpu_seconds": round(cpu, 3), "main_cpu_seconds": round(main_cpu, 3),
            "rows_per_cpu_second": round(rows / cpu)}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__,
        "pyarrow": pa.__version__, "numpy": np.__version__,
    }


def markdown(report: dict) -> str:
    env, setup = report["environment"], report["setup"]
    lines = [
        "# Input pipeline throughput (Taobao schema -> Batch)", "",
        f"{env['date']}, {env['cpu_count']} CPUs ({env['platform']}), python {env['python']},"
        f" torch {env['torch']}, pyarrow {env['pyarrow']}, numpy {env['numpy']}.", "",
        f"{setup['rows']} rows in {setup['num_files']} parquet files (scale {setup['scale']}), "
        f"batch size {setup['batch_size']}, config `{setup['config']}`; one pass per row "
        "below, worker start-up included.", "",
        f"Command: `{report['command']}`", "",
        "| input | workers | rows/s | seconds | first batch (s) | batches | CPU s | main CPU s |"
        " rows per CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(f"| {r.get('input', 'raw')} | {r['workers']} | {r['rows_per_second']:,} | "
                     f"{r['seconds']} | "
                     f"{r['first_batch_seconds']} | {r['batches']} | {r['cpu_seconds']} | "
                     f"{r.get('main_cpu_seconds', '-')} | {r['rows_per_cpu_second']:,} |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="pipeline config (features)")
    p.add_argument("--data", default=None, help="existing parquet input path (needed for a config of other "
                   "features); else Taobao-like rows are generated")
    p.add_argument("--num_rows", type=int, default=1_000_000, help="rows to generate")
    p.add_argument("--num_files", type=int, default=16, help="files to generate")
    p.add_argument("--scale", type=float, default=1.0, help="generator ID-space scale")
    p.add_argument("--batch_size", type=int, default=8192)
    p.add_argument("--workers", default="0,2,4,8,16",
                   help="comma-separated worker counts; those above the CPU count are skipped")
    p.add_argument("--encoded", action="store_true",
                   help="also read the rows encoded by encode_input (fg_mode FG_NONE)")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--markdown", default=None, help="write a markdown table here")
    return p


def _encoded(config_path: str, path: str, out: str):
    """(config, feature set, path) of ``path`` encoded into ``out``, read as FG_NONE."""
    from hashrec.tools.encode_input import encode

    encode(load_pipeline_config(config_path), path, out, quiet=True)
    config = load_pipeline_config(config_path)
    config.data_config.fg_mode = 1  # FG_NONE
    config.data_config.dataset_type = 2  # ParquetDataset
    return config, build_feature_set(config), out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = load_pipeline_config(args.config)
    feature_set = build_feature_set(config)
    counts = [w for w in map(int, args.workers.split(",")) if w <= (os.cpu_count() or 1)]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.data
        if path is None:
            path = os.path.join(tmp, "taobao")
            generate(path, args.num_rows, args.num_files, seed=0, scale=args.scale, quiet=True)
        files = expand_input_path(path)
        inputs = [("raw", config, feature_set, path)]
        if args.encoded:
            inputs.append(("encoded", *_encoded(args.config, path, os.path.join(tmp, "enc"))))
        results = []
        for workers in counts:
            for name, cfg, features, where in inputs:
                results.append({"input": name,
                                **measure(cfg, features, where, workers, args.batch_size)})
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    report = {
        "benchmark": "bench_data", "environment": environment(),
        "command": " ".join(["python", os.path.relpath(__file__), *sys.argv[1:]]),
        "setup": {"config": os.path.relpath(args.config), "data": args.data or "generated",
                  "rows": results[0]["rows"] if results else 0,
                  "num_files": args.num_files if args.data is None else len(files),
                  "scale": args.scale, "batch_size": args.batch_size},
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
