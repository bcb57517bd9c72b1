"""Export and scripted-model inference speed.

Two measurements:

* **export of one large dynamic table**: a HashTable of ``--table_keys`` keys
  (dim ``--dim``) is written as a safetensors part (count pass + streaming write),
  read back and sorted into the scripted lookup, and compiled and saved as a
  TorchScript ``TableLookup``; plus the scripted lookup's ids/s on that table.
* **inference**: MultiTowerDIN of the example Taobao config (dynamic tables
  filled with every id of the generated data, untrained weights) is exported
  with ``export_model``; the scripted model's rows/s are timed on pre-parsed
  batches (parsing excluded), on CPU and on CUDA when present, and end-to-end
  ``predict`` rows/s (parquet in, parquet out) on CPU.

    python benchmarks/bench_export.py --table_keys 10000000 \\
        --json benchmarks/results/export_cpu.json --markdown benchmarks/results/export_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import environment  # noqa: E402

from hashrec.checkpoint import save_checkpoint  # noqa: E402
from hashrec.config import apply_edit_config_json, load_pipeline_config  # noqa: E402
from hashrec.data import create_dataloader  # noqa: E402
from hashrec.export import export_model  # noqa: E402
from hashrec.export.loading import model_inputs  # noqa: E402
from hashrec.export.part_writer import PartContents, write_part  # noqa: E402
from hashrec.export.scripted import TableLookup, load_hashmaps  # noqa: E402
from hashrec.export.tables import DynamicTableView, dynamic_table_views  # noqa: E402
from hashrec.predict import predict  # noqa: E402
from hashrec.table import HashTable, TableOptions  # noqa: E402
from hashrec.tools.gen_taobao_data import generate  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                      "multi_tower_din_taobao_dynamicemb.config")


def big_table(num_keys: int, dim: int) -> tuple[HashTable, float]:
    table = HashTable(TableOptions(dim=dim, max_capacity=num_keys * 3 // 2))
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    chunk = 1 << 20
    for begin in range(0, num_keys, chunk):
        count = min(chunk, num_keys - begin)
        keys = torch.arange(begin, begin + count, dtype=torch.int64) * 2654435761 - 2**40
        table.insert_or_assign(keys, torch.randn(count, dim, generator=generator))
    return table, time.perf_counter() - start


def bench_table_export(num_keys: int, dim: int, workdir: str) -> dict:
    table, insert_s = big_table(num_keys, dim)
    view = DynamicTableView("big", table, None)
    start = time.perf_counter()
    write_part(workdir, PartContents({}, {}, [view]))
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    keys, values = load_hashmaps(workdir, 1, ["big"])["big"]
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    lookup = torch.jit.script(TableLookup("big", values, keys, 0.0))
    lookup.save(os.path.join(workdir, "lookup.pt"))
    script_s = time.perf_counter() - start
    ids = torch.cat([keys[torch.randint(0, num_keys, (1 << 15,))],
                     torch.randint(-(2**62), 2**62, (1 << 15,))])
    lookup(ids)
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        lookup(ids)
    lookup_s = (time.perf_counter() - start) / reps
    size = os.path.getsize(os.path.join(workdir, "model-000000-of-000001.safetensors"))
    return {"keys": num_keys, "dim": dim, "table_fill_s": insert_s, "write_part_s": write_s,
            "write_keys_per_s": num_keys / write_s, "file_bytes": size,
            "load_and_sort_s": load_s, "script_and_save_s": script_s,
            "export_total_s": write_s + load_s + script_s,
            "scripted_lookup_ids_per_s": ids.numel() / lookup_s}


def fill_tables(session, batches) -> dict[str, int]:
    """Stores every id of ``batches`` in the dynamic tables (random rows)."""
    ids: dict[str, list[torch.Tensor]] = {}
    for spec in session.feature_set.embedding_features():
        for batch in batches:
            ids.setdefault(spec.table, []).append(batch.sparse[spec.name].values)
    sizes = {}
    for view in dynamic_table_views(session.model.embedding):
        keys = torch.unique(torch.cat(ids[view.name]))
        tags = None if view.tag is None else torch.full_like(keys, view.tag, dtype=torch.int32)
        view.table.insert_or_assign(keys, torch.randn(keys.numel(), view.dim, device=keys.device)
                                    * 0.05, tags=tags)
        sizes[view.name] = int(keys.numel())
    return sizes


def time_model(model, batches, device: torch.device, passes: int = 3) -> float:
    """Rows/s of the median pass over ``batches`` after three warm-up passes (TorchScript
    specializes during its first runs)."""
    inputs = [model_inputs(b.to(device), set()) for b in batches]
    rows = sum(b.batch_size for b in batches)
    rates = []
    with torch.inference_mode():
        for i in range(3 + passes):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for x in inputs:
                model(*x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                rates.append(rows / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_inference(num_rows: int, batch_sizes: list[int], workdir: str) -> dict:
    data = os.path.join(workdir, "data")
    generate(data, num_rows, seed=0, scale=0.05, quiet=True)
    edits = json.dumps({"data_config.num_workers": 0, "model_dir": os.path.join(workdir, "m")})
    config = apply_edit_config_json(load_pipeline_config(CONFIG), edits)
    session = build_session(config, device=torch.device("cpu"))
    parsed = list(create_dataloader(config.data_config, session.feature_set, data, "predict",
                                    batch_size=4096))
    sizes = fill_tables(session, parsed)
    os.makedirs(config.model_dir)
    save_checkpoint(config.model_dir, 0, session.model, session.dense.optimizers,
                    session.model.embedding.dynamic_tables())
    export_dir = os.path.join(workdir, "export")
    start = time.perf_counter()
    export_model(config, export_dir)
    out = {"rows": num_rows, "table_keys": sizes, "export_model_s": time.perf_counter() - start,
           "rows_per_s": {}}
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available()
                                       else [])
    for device in devices:
        model = torch.jit.load(os.path.join(export_dir, "scripted_model.pt"), map_location=device)
        for batch_size in batch_sizes:
            batches = list(create_dataloader(config.data_config, session.feature_set, data,
                                             "predict", batch_size=batch_size))
            out["rows_per_s"][f"{device.type}-batch{batch_size}"] = time_model(
                model, batches, device)
    result = predict(export_dir, data, os.path.join(workdir, "pred.parquet"), (), 2048, "cpu")
    out["predict_end_to_end_cpu_rows_per_s"] = result["rows"] / result["seconds"]
    return out


def markdown(result: dict) -> str:
    t, i = result["table_export"], result["inference"]
    lines = [f"# Export and scripted inference ({result['environment']['gpu']}, "
             f"torch {result['environment']['torch']}, {os.cpu_count()} CPU cores)", "",
             f"## Export of one dynamic table: {t['keys']:,} keys, dim {t['dim']}", "",
             "| step | seconds |", "|---|---|",
             f"| write part (count + stream write, {t['file_bytes'] / 2**20:.0f} MiB) | "
             f"{t['write_part_s']:.2f} |",
             f"| read back + sort keys | {t['load_and_sort_s']:.2f} |",
             f"| TorchScript compile + save of the lookup | {t['script_and_save_s']:.2f} |",
             f"| **total** | **{t['export_total_s']:.2f}** |", "",
             f"Scripted lookup on that table: {t['scripted_lookup_ids_per_s']:,.0f} ids/s "
             f"(65,536 ids per call, half of them absent).", "",
             f"## Scripted MultiTowerDIN inference ({i['rows']:,} rows, example config, "
             f"sequence length 100)", "", "| device-batch | rows/s |", "|---|---|"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in i["rows_per_s"].items()]
    lines += ["", f"End-to-end predict on CPU (parse + model + parquet write): "
              f"{i['predict_end_to_end_cpu_rows_per_s']:,.0f} rows/s; export_model of the "
              f"whole model: {i['export_model_s']:.1f} s.", "",
              "Notes: CPU figures come from a machine shared with other jobs, so rows/s "
              "vary widely from run to run (the model-only and end-to-end rates were "
              "measured at different moments). The table export is dominated by reading "
              "back and sorting the keys; memory stays at one chunk while writing."]
    if not any(k.startswith("cuda") for k in i["rows_per_s"]):
        lines.append("No CUDA device was present for this run, so there are no GPU rows.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table_keys", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--num_rows", type=int, default=8192)
    parser.add_argument("--batch_sizes", default="256,2048")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as table_dir, tempfile.TemporaryDirectory() as infer_dir:
        result = {"environment": environment(),
                  "table_export": bench_table_export(args.table_keys, args.dim, table_dir),
                  "inference": bench_inference(args.num_rows, [int(b) for b in
                                                               args.batch_sizes.split(",")],
                                               infer_dir)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(result))


if __name__ == "__main__":
    main()
