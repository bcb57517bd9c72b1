"""Integration: train_eval -> export -> predict command lines on small generated data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch
from export_helpers import ROOT, eval_predictions, run, write_config
from safetensors import safe_open

from hashrec.checkpoint import latest_checkpoint
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.config import load_pipeline_config
from hashrec.data import create_dataloader
from hashrec.export.loading import model_inputs
from hashrec.features import build_feature_set
from hashrec.tools.gen_taobao_data import generate

pytestmark = pytest.mark.slow

DYNAMIC_TABLES = ("user_id", "adgroup_id", "cate_id")
DENSE_TABLES = ("cms_segid", "pid")


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """Generated data, a trained model, its export and predictions."""
    root = tmp_path_factory.mktemp("export_flow")
    generate(str(root / "data"), 2000, seed=5, scale=0.01, eval_rows=500, quiet=True)
    config = write_config(root, root / "data", root / "model")
    proc = run("hashrec.train_eval", "--pipeline_config_path", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    export_dir = root / "export"
    proc = run("hashrec.export", "--pipeline_config_path", config, "--export_dir",
               str(export_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = root / "pred.parquet"
    proc = run("hashrec.predict", "--scripted_model_path", str(export_dir),
               "--predict_input_path", str(root / "data" / "eval"),
               "--predict_output_path", str(output), "--reserved_columns", "user_id,clk",
               "--batch_size", "128")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "config": config, "export": export_dir, "output": output,
            "predict_log": proc.stderr,
            "checkpoint": latest_checkpoint(str(root / "model"))}


@pytest.fixture(scope="module")
def expected(flow) -> torch.Tensor:
    """The restored model's eval-mode probs on the eval rows, in file order."""
    return eval_predictions(flow["config"], flow["checkpoint"],
                            str(flow["root"] / "data" / "eval")).float()


def read_meta(export_dir, rank: int = 0, world_size: int = 1) -> dict:
    with open(export_dir / f"model-{rank:06d}-of-{world_size:06d}.json",
              encoding="utf-8") as f:
        return json.load(f)


def test_export_writes_part_meta_config_and_scripted_model(flow):
    names = sorted(os.listdir(flow["export"]))
    assert names == ["model-000000-of-000001.json", "model-000000-of-000001.safetensors",
                     "pipeline.config", "scripted_model.pt"]
    assert load_pipeline_config(str(flow["export"] / "pipeline.config")).model_config \
        == load_pipeline_config(flow["config"]).model_config


def test_meta_has_an_is_hashmap_entry_per_dynamic_table(flow):
    entries = read_meta(flow["export"])
    with safe_open(str(flow["export"] / "model-000000-of-000001.safetensors"), "pt") as part:
        stored = set(part.keys())
        for table in DYNAMIC_TABLES:
            entry = entries[table]
            assert entry["is_hashmap"] is True and entry["dense"] is False
            assert entry["hashmap_key_dtype"] == "int64" and entry["dtype"] == "float32"
            assert entry["name"] == entry["hashmap_value"] == f"{table}.values/part_0_1"
            keys = part.get_tensor(entry["hashmap_key"])
            values = part.get_tensor(entry["hashmap_value"])
            assert keys.dtype == torch.int64 and values.dtype == torch.float32
            assert list(values.shape) == entry["shape"] and entry["dimension"] == 8
            assert keys.shape == (entry["shape"][0],) and entry["shape"][0] > 0
            assert keys.unique().numel() == keys.numel()
        for table in DENSE_TABLES:
            entry = entries[table]
            assert (entry["is_hashmap"], entry["dense"]) == (False, False)
            assert list(part.get_tensor(entry["name"]).shape) == entry["shape"]
        dense = [e for e in entries.values() if e["dense"]]
        assert dense and all(e["is_hashmap"] is False for e in dense)
        referenced = {e["name"] for e in entries.values()} | {
            e["hashmap_key"] for e in entries.values() if e["is_hashmap"]}
        assert referenced == stored


def test_hashmap_parts_hold_the_trained_tables(flow):
    from hashrec.checkpoint import restore_checkpoint
    from hashrec.export.tables import dynamic_table_views
    from hashrec.train.session import build_session

    session = build_session(load_pipeline_config(flow["config"]), device=torch.device("cpu"))
    restore_checkpoint(flow["checkpoint"], session.model, None,
                       session.model.embedding.dynamic_tables(), restore_optimizer=False)
    entries = read_meta(flow["export"])
    with safe_open(str(flow["export"] / "model-000000-of-000001.safetensors"), "pt") as part:
        for view in dynamic_table_views(session.model.embedding):
            keys = torch.cat([k for k, _ in view.chunks(64)])
            values = torch.cat([v for _, v in view.chunks(64)])
            exported = part.get_tensor(entries[view.name]["hashmap_key"])
            order, exported_order = keys.argsort(), exported.argsort()
            assert torch.equal(keys[order], exported[exported_order])
            assert torch.equal(values[order],
                               part.get_tensor(entries[view.name]["hashmap_value"])[
                                   exported_order])


def test_predict_equals_eval_predictions(flow, expected):
    table = pq.read_table(flow["output"])
    assert table.column_names == ["logits", "probs", "user_id", "clk"]
    probs = torch.from_numpy(table["probs"].to_numpy())
    assert probs.shape == expected.shape == (500,)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)
    logits = torch.from_numpy(table["logits"].to_numpy())
    torch.testing.assert_close(torch.sigmoid(logits), probs, atol=1e-6, rtol=0)
    source = pq.read_table(flow["root"] / "data" / "eval")
    assert table["user_id"].to_pylist() == source["user_id"].to_pylist()
    assert "predicted 500 rows" in flow["predict_log"]


def saved_inputs(flow, path) -> None:
    """The first 64 eval rows parsed by HashRec, saved as plain tensors."""
    config = load_pipeline_config(flow["config"])
    features = build_feature_set(config)
    batch = next(iter(create_dataloader(config.data_config, features,
                                        str(flow["root"] / "data" / "eval"), "predict",
                                        batch_size=64)))
    torch.save(model_inputs(batch, set()), path)


FRESH_PROCESS = """
import json, sys, torch
model = torch.jit.load(sys.argv[1])
out = model(*torch.load(sys.argv[2]))
print(json.dumps({"hashrec": [m for m in sys.modules if m.split(".")[0] == "hashrec"],
                  "probs": out["probs"].tolist()}))
"""


def test_scripted_model_runs_in_a_fresh_process_without_hashrec(flow, expected, tmp_path):
    saved_inputs(flow, tmp_path / "inputs.pt")
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(flow["export"] / "scripted_model.pt"),
         str(tmp_path / "inputs.pt")], cwd=str(tmp_path), capture_output=True, text=True,
        timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hashrec"] == []
    torch.testing.assert_close(torch.tensor(result["probs"]), expected[:64], atol=1e-5,
                               rtol=0)


def test_torchrun_export_splits_tables_and_predicts_the_same(flow, tmp_path):
    export_dir = tmp_path / "export2"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(29000 + os.getpid() % 1000), "-m", "hashrec.export",
         "--pipeline_config_path", flow["config"], "--export_dir", str(export_dir)],
        capture_output=True, text=True, timeout=300, cwd=str(flow["root"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "storage plan for 2 rank(s)" in proc.stderr  # each rank holds its share
    single = read_meta(flow["export"])
    for table in DYNAMIC_TABLES:
        keys = []
        for rank in range(2):
            entry = read_meta(export_dir, rank, 2)[table]
            assert entry["hashmap_key"] == f"{table}.keys/part_{rank}_2"
            path = export_dir / f"model-{rank:06d}-of-000002.safetensors"
            with safe_open(str(path), "pt") as part:
                keys.append(part.get_tensor(entry["hashmap_key"]))
        assert min(k.numel() for k in keys) > 0
        with safe_open(str(flow["export"] / "model-000000-of-000001.safetensors"), "pt") as p:
            whole = p.get_tensor(single[table]["hashmap_key"])
        assert torch.equal(torch.cat(keys).sort().values, whole.sort().values)
    saved_inputs(flow, tmp_path / "inputs.pt")
    inputs = torch.load(tmp_path / "inputs.pt")
    one = torch.jit.load(str(flow["export"] / "scripted_model.pt"))(*inputs)
    two = torch.jit.load(str(export_dir / "scripted_model.pt"))(*inputs)
    torch.testing.assert_close(two["probs"], one["probs"], atol=0, rtol=0)


def _torchrun(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(29000 + os.getpid() % 1000), *args],
        capture_output=True, text=True, timeout=300, cwd=str(cwd))


def _exported_keys(export_dir, world_size: int) -> dict[str, int]:
    counts = {}
    for rank in range(world_size):
        meta = read_meta(export_dir, rank, world_size)
        path = export_dir / f"model-{rank:06d}-of-{world_size:06d}.safetensors"
        with safe_open(str(path), "pt") as part:
            for table in DYNAMIC_TABLES:
                keys = part.get_tensor(meta[table]["hashmap_key"])
                counts[table] = counts.get(table, 0) + keys.numel()
    return counts


def test_a_full_table_exports_and_evaluates_every_row_on_another_number_of_ranks(tmp_path):
    # A fused storage trained full on one process: on two ranks its keys fill each rank's
    # buckets otherwise, and export and eval grow the table rather than drop rows.
    generate(str(tmp_path / "data"), 2000, seed=5, scale=0.01, eval_rows=300, quiet=True)
    config = write_config(tmp_path, tmp_path / "data", tmp_path / "model")
    with open(config, encoding="utf-8") as f:
        text = f.read().replace("max_capacity: 20000", "max_capacity: 256")
    with open(config, "w", encoding="utf-8") as f:
        f.write(text.replace("init_capacity_per_rank: 1024", ""))
    proc = run("hashrec.train_eval", "--pipeline_config_path", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = read_complete_meta(latest_checkpoint(str(tmp_path / "model")))
    saved = meta["tables"]["deep"]["num_rows"]
    assert saved >= 0.95 * 3 * 256  # the fused storage of the three tables is full
    proc = run("hashrec.export", "--pipeline_config_path", config, "--export_dir",
               str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = _exported_keys(tmp_path / "one", 1)
    assert sum(one.values()) == saved
    proc = _torchrun("-m", "hashrec.export", "--pipeline_config_path", config, "--export_dir",
                     str(tmp_path / "two"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "storage plan for 2 rank(s)" in proc.stderr
    assert _exported_keys(tmp_path / "two", 2) == one
    proc = _torchrun("-m", "hashrec.eval", "--pipeline_config_path", config, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "storage plan for 2 rank(s)" in proc.stderr
    assert "not restored" not in proc.stderr and "WARNING" not in proc.stderr


def test_exporter_type_best_exports_and_keeps_the_checkpoint_evaluated_best(tmp_path):
    # metric_larger_is_better false on auc: the worst-scored checkpoint, an early one
    generate(str(tmp_path / "data"), 2000, seed=5, scale=0.01, eval_rows=300, quiet=True)
    config = write_config(tmp_path, tmp_path / "data", tmp_path / "model")
    with open(config, encoding="utf-8") as f:
        text = f.read().replace("num_epochs: 1", "num_epochs: 1\n  save_checkpoints_steps: 2"
                                                 "\n  keep_checkpoint_max: 1")
    with open(config, "w", encoding="utf-8") as f:
        f.write(text + 'export_config { exporter_type: "best" metric_larger_is_better: false }\n')
    proc = run("hashrec.train_eval", "--pipeline_config_path", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "model" / "eval_result.txt", encoding="utf-8") as f:
        results = [json.loads(line) for line in f]
    assert len(results) >= 4
    worst = min(results, key=lambda r: (r["auc"], -r["step"]))
    kept = sorted(os.listdir(tmp_path / "model"))
    latest = f"model.ckpt-{results[-1]['step']}"
    assert [n for n in kept if n.startswith("model.ckpt-")] == sorted(
        {latest, os.path.basename(worst["checkpoint"])})
    proc = run("hashrec.export", "--pipeline_config_path", config, "--export_dir",
               str(tmp_path / "export"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"exporter_type best: taking {worst['checkpoint']}, the lowest "
                             f"auc in eval_result.txt") == 1
    assert f"exported {worst['checkpoint']} (step {worst['step']})" in proc.stderr
    assert "ignores export_config" not in proc.stderr


@pytest.mark.parametrize("target", ["export", "keep-file", "model-dir"])
def test_export_refuses_a_non_empty_directory(flow, target):
    export_dir = {"export": flow["export"], "model-dir": flow["root"] / "model",
                  "keep-file": flow["root"] / "keep"}[target]
    if target == "keep-file":
        export_dir.mkdir(exist_ok=True)
        (export_dir / "keep.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in export_dir.iterdir() if p.is_file()}
    proc = run("hashrec.export", "--pipeline_config_path", flow["config"], "--export_dir",
               str(export_dir))
    assert proc.returncode == 1
    assert f"export_dir {str(export_dir)!r} is not empty" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in export_dir.iterdir() if p.is_file()} == before
    assert not os.path.exists(f"{export_dir}.tmp")


def test_export_refuses_a_file_as_export_dir(flow, tmp_path):
    target = tmp_path / "file"
    target.write_text("mine")
    proc = run("hashrec.export", "--pipeline_config_path", flow["config"], "--export_dir",
               str(target))
    assert proc.returncode == 1 and "is a file" in proc.stderr
    assert target.read_text() == "mine"


KILLED_EXPORT = """
import os, sys
import hashrec.export.exporter as exporter
from hashrec.export.__main__ import main
exporter.save_scripted = lambda *args: os._exit(9)  # killed while writing the last file
main(sys.argv[1:])
"""


def test_killed_export_leaves_no_export_dir_and_a_rerun_succeeds(flow, tmp_path):
    export_dir = tmp_path / "export"
    args = ["--pipeline_config_path", flow["config"], "--export_dir", str(export_dir)]
    proc = subprocess.run([sys.executable, "-c", KILLED_EXPORT, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert not export_dir.exists()
    assert "model-000000-of-000001.safetensors" in os.listdir(f"{export_dir}.tmp")
    proc = run("hashrec.export", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(export_dir)) == sorted(os.listdir(flow["export"]))
    assert not os.path.exists(f"{export_dir}.tmp")


FULL_DISK_EXPORT = """
import sys
import hashrec.export.exporter as exporter
from hashrec.export.__main__ import main
save_scripted = exporter.save_scripted
# /dev/full fails every write with ENOSPC, as a full disk does.
exporter.save_scripted = lambda module, path: save_scripted(module, "/dev/full")
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_scripted_model_on_a_full_disk_is_one_error_and_leaves_nothing(flow, tmp_path):
    export_dir = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_EXPORT, "--pipeline_config_path",
                           flow["config"], "--export_dir", str(export_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # not a C++ abort (-6)
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "ExportError: cannot write the scripted model /dev/full: No space left" in errors[0]
    assert "the disk may be full: free space (or use another --export_dir)" in errors[0]
    assert os.listdir(tmp_path) == []  # neither export_dir nor its staging directory


def test_a_large_model_on_a_disk_without_room_is_one_error_before_writing(flow, tmp_path,
                                                                          monkeypatch):
    """A model past the in-memory size streams from TorchScript's writer, which aborts
    the process on a failed write: a disk without room for it is refused first."""
    import shutil

    from hashrec.export import ExportError, exporter
    from hashrec.export.scripted import build

    monkeypatch.setattr(build, "IN_MEMORY_SAVE_BYTES", 0)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(
        1 << 30, 1 << 30, 1 << 20))  # 1 MiB free
    export_dir = tmp_path / "export"
    with pytest.raises(ExportError, match=r"scripted_model\.pt: it needs about 0\.0\d GiB, its "
                                          r"disk has 0\.00 GiB free; the disk may be full"):
        exporter.export_model(load_pipeline_config(flow["config"]), str(export_dir))
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setattr(build, "IN_MEMORY_SAVE_BYTES", 0)  # streamed where there is room
    exporter.export_model(load_pipeline_config(flow["config"]), str(export_dir))
    assert (export_dir / "scripted_model.pt").stat().st_size > 0


def test_failed_export_removes_its_staging_directory(flow, tmp_path, monkeypatch):
    from hashrec.export import ExportError, exporter

    def fail(*args):
        raise ExportError("scripting failed")

    monkeypatch.setattr(exporter, "save_scripted", fail)
    export_dir = tmp_path / "empty"
    export_dir.mkdir()  # an empty directory is a valid target and stays as it was
    with pytest.raises(ExportError, match="scripting failed"):
        exporter.export_model(load_pipeline_config(flow["config"]), str(export_dir))
    assert os.listdir(export_dir) == []
    assert not os.path.exists(f"{export_dir}.tmp")


def test_a_foreign_directory_named_like_the_staging_one_is_kept(flow, tmp_path):
    from hashrec.export import ExportError, export_model

    foreign = tmp_path / "export.tmp"
    foreign.mkdir()
    (foreign / "data.txt").write_text("mine")
    with pytest.raises(ExportError, match="not made by an export"):
        export_model(load_pipeline_config(flow["config"]), str(tmp_path / "export"))
    assert (foreign / "data.txt").read_text() == "mine"


def test_a_second_export_into_the_same_export_dir_is_refused_while_the_first_runs(tmp_path):
    from hashrec.export import ExportError
    from hashrec.export.staging import STAGING_MARKER, prepare_staging

    export_dir = str(tmp_path / "export")
    first = prepare_staging(export_dir)  # the first export, still writing
    (tmp_path / "export.tmp" / "part").write_text("first")
    try:
        with pytest.raises(ExportError, match=rf"another export into --export_dir "
                                              rf"'{export_dir}' is running \(it writes "
                                              rf"{export_dir}\.tmp\); wait for it to end"):
            prepare_staging(export_dir)
        assert (tmp_path / "export.tmp" / "part").read_text() == "first"
    finally:
        os.close(first)  # the first export ends (here: killed, its staging left behind)
    os.close(prepare_staging(export_dir))  # a killed export's staging is removed
    assert os.listdir(tmp_path / "export.tmp") == [STAGING_MARKER]
