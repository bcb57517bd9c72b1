"""python -m hashrec.predict: output layout and row order, batch sizes, reserved columns, clear
errors."""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "export"))

from export_helpers import write_config  # noqa: E402

from hashrec.checkpoint import save_checkpoint  # noqa: E402
from hashrec.config import load_pipeline_config  # noqa: E402
from hashrec.export import export_model  # noqa: E402
from hashrec.predict import main, predict  # noqa: E402
from hashrec.tools.gen_taobao_data import generate  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An untrained model (dense tables only) exported in-process, and input rows."""
    root = tmp_path_factory.mktemp("predict")
    generate(str(root / "data"), 200, seed=4, scale=0.01, eval_rows=130, quiet=True)
    config_path = write_config(root, root / "data", root / "model", dynamic=False)
    config = load_pipeline_config(config_path)
    session = build_session(config, device=torch.device("cpu"))
    (root / "model").mkdir()
    save_checkpoint(str(root / "model"), 0, session.model, session.dense.optimizers, {})
    export_model(config, str(root / "export"))
    return root


@pytest.mark.parametrize("batch_size", [1000, 7], ids=["one-batch", "batch7"])
def test_predictions_do_not_depend_on_batch_size(exported, tmp_path, batch_size):
    out = predict(str(exported / "export"), str(exported / "data" / "eval"),
                  str(tmp_path / "out"), ("clk", "user_id"), batch_size)
    assert out["rows"] == 130 and out["output"] == str(tmp_path / "out" / "part-00000.parquet")
    table = pq.read_table(out["output"])
    assert table.column_names == ["logits", "probs", "clk", "user_id"]
    reference = predict(str(exported / "export"), str(exported / "data" / "eval"),
                        str(tmp_path / "ref.parquet"), (), 64)
    assert pq.read_table(reference["output"]).column_names == ["logits", "probs"]
    torch.testing.assert_close(torch.from_numpy(table["probs"].to_numpy()),
                               torch.from_numpy(pq.read_table(reference["output"])[
                                   "probs"].to_numpy()), atol=1e-6, rtol=0)


def test_the_progress_lines_count_the_rows_of_the_input(exported, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hashrec.predict"):
        predict(str(exported / "export"), str(exported / "data" / "eval"),
                str(tmp_path / "out.parquet"), batch_size=50, log_every_s=0)
    lines = [r.getMessage() for r in caplog.records if " of 130 rows (" in r.getMessage()]
    assert [line.split(" (")[0] for line in lines] == [
        "predicted 50 of 130 rows", "predicted 100 of 130 rows", "predicted 130 of 130 rows"]
    assert ["s left)" in line for line in lines] == [True, True, False]


def test_a_long_prediction_says_its_time_left_in_minutes(exported, tmp_path, caplog,
                                                          monkeypatch):
    clock = iter(range(0, 10 ** 6, 100))  # every reading 100 s after the one before
    slow = types.SimpleNamespace(perf_counter=lambda: float(next(clock)))
    monkeypatch.setattr("hashrec.predict.time", slow)
    with caplog.at_level(logging.INFO, logger="hashrec.predict"):
        predict(str(exported / "export"), str(exported / "data" / "eval"),
                str(tmp_path / "out.parquet"), batch_size=50, log_every_s=0)
    first = next(r.getMessage() for r in caplog.records if " of 130 rows (" in r.getMessage())
    assert re.search(r", about \d+m \d+s left\)$", first), first


def test_csv_input_predicts_like_parquet(exported, tmp_path):
    import pyarrow.csv as pacsv

    parquet_dir = exported / "data" / "eval"
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for i, part in enumerate(sorted(parquet_dir.glob("*.parquet"))):
        pacsv.write_csv(pq.read_table(part), csv_dir / f"part-{i}.csv")
    from_csv = predict(str(exported / "export"), str(csv_dir), str(tmp_path / "csv.parquet"),
                       ("user_id",), 64)
    from_parquet = predict(str(exported / "export"), str(parquet_dir),
                           str(tmp_path / "pq.parquet"), ("user_id",), 64)
    assert from_csv["rows"] == from_parquet["rows"] == 130
    a, b = pq.read_table(from_csv["output"]), pq.read_table(from_parquet["output"])
    # A CSV column without a type in input_fields is copied as its text.
    assert a["user_id"].to_pylist() == [str(v) for v in b["user_id"].to_pylist()]
    torch.testing.assert_close(torch.from_numpy(a["probs"].to_numpy()),
                               torch.from_numpy(b["probs"].to_numpy()), atol=1e-6, rtol=0)


def test_input_without_a_known_extension_is_told_by_its_first_bytes(exported, tmp_path):
    import shutil

    import pyarrow.csv as pacsv

    parquet_dir = exported / "data" / "eval"
    text_dir, bare_dir = tmp_path / "text", tmp_path / "bare"
    text_dir.mkdir()
    bare_dir.mkdir()
    for i, part in enumerate(sorted(parquet_dir.glob("*.parquet"))):
        pacsv.write_csv(pq.read_table(part), text_dir / f"part-{i}.txt")  # CSV, header row
        shutil.copy(part, bare_dir / f"part-{i}")  # parquet without its extension
    want = pq.read_table(predict(str(exported / "export"), str(parquet_dir),
                                 str(tmp_path / "pq.parquet"))["output"])
    for name, folder in [("text", text_dir), ("bare", bare_dir)]:
        got = pq.read_table(predict(str(exported / "export"), str(folder),
                                    str(tmp_path / f"{name}.parquet"))["output"])
        torch.testing.assert_close(torch.from_numpy(got["probs"].to_numpy()),
                                   torch.from_numpy(want["probs"].to_numpy()), atol=1e-6,
                                   rtol=0)


@pytest.mark.parametrize("header", [False, True], ids=["no-header", "header"])
def test_csv_without_a_header_line_says_so(caplog, exported, tmp_path, header):
    import pyarrow.csv as pacsv

    rows = pq.read_table(sorted((exported / "data" / "eval").glob("*.parquet"))[0])
    rows = rows.drop(["user_id"]) if header else rows  # a header without user_id
    path = tmp_path / "rows.csv"
    pacsv.write_csv(rows, path, pacsv.WriteOptions(include_header=header))
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(path),
                         "--predict_output_path", str(tmp_path / "out.parquet"))
    assert code == 1 and "Traceback" not in log
    assert f"DataError: {path}: column 'user_id' is missing (the file has [" in log
    hint = ("; its first line reads like a row, not a header: give the file a header line "
            "naming the columns (a CsvDataset config can name them in data_config.input_fields "
            "instead, with with_header: false)")
    assert (hint in log) == (not header)
    assert not (tmp_path / "out.parquet").exists()


def test_csv_and_parquet_input_together_is_one_error(caplog, exported, tmp_path):
    import pyarrow.csv as pacsv

    parquet = sorted((exported / "data" / "eval").glob("*.parquet"))[0]
    pacsv.write_csv(pq.read_table(parquet), tmp_path / "rows.csv")
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", f"{parquet},{tmp_path / 'rows.csv'}",
                         "--predict_output_path", str(tmp_path / "out.parquet"))
    assert code == 1 and "Traceback" not in log
    assert (f"DataError: --predict_input_path '{parquet},{tmp_path / 'rows.csv'}' holds both "
            f".csv files (such as {tmp_path / 'rows.csv'}) and .parquet files (such as "
            f"{parquet}); predict reads one format a run: predict the CSV and the parquet files "
            f"apart") in log
    assert sorted(os.listdir(tmp_path)) == ["rows.csv"]


@pytest.mark.parametrize("output", ["directory", "file"])
def test_an_input_file_is_never_the_output_even_with_overwrite(caplog, exported, tmp_path,
                                                               output):
    data = tmp_path / "data"
    data.mkdir()
    part = data / "part-00000.parquet"
    shutil.copy(sorted((exported / "data" / "eval").glob("*.parquet"))[0], part)
    before = part.read_bytes()
    target = data if output == "directory" else part
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(data), "--predict_output_path",
                         str(target), "--overwrite")
    assert code == 1 and "Traceback" not in log
    assert (f"ExportError: --predict_output_path: {part} is one of the input files "
            f"(--predict_input_path {str(data)!r}); predictions never replace their input: "
            f"choose another output path") in log
    assert part.read_bytes() == before and os.listdir(data) == [part.name]


def run_main(caplog, *args: str) -> tuple[int, str]:
    with caplog.at_level(logging.INFO):
        code = main(list(args))
    return code, caplog.text


def test_missing_export_directory_is_a_clear_error(caplog, tmp_path):
    code, log = run_main(caplog, "--scripted_model_path", str(tmp_path / "nope"),
                         "--predict_input_path", str(tmp_path), "--predict_output_path",
                         str(tmp_path / "o.parquet"))
    assert code == 1
    assert "scripted_model.pt does not exist" in log and "python -m hashrec.export" in log


def test_reserved_column_named_like_a_prediction_is_refused(caplog, exported, tmp_path):
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(tmp_path / "o.parquet"),
                         "--reserved_columns", "user_id,probs")
    assert code == 1 and "collide with the prediction columns" in log
    assert not (tmp_path / "o.parquet").exists()


def test_missing_input_column_names_the_column(caplog, exported, tmp_path):
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(tmp_path / "o.parquet"),
                         "--reserved_columns", "no_such_column")
    assert code == 1 and "no_such_column" in log


def _nan_price_file(exported, path) -> str:
    """The eval rows with one NaN price in the last row: parsing fails after the first
    batches were predicted."""
    import numpy as np
    import pyarrow as pa

    table = pq.read_table(exported / "data" / "eval")
    price = table["price"].to_numpy().copy()
    price[-1] = np.nan
    table = table.set_column(table.schema.get_field_index("price"), "price", pa.array(price))
    pq.write_table(table, path)
    return str(path)


@pytest.mark.parametrize("existing", [False, True], ids=["new-output", "replaced-output"])
def test_failed_predict_leaves_no_partial_output(exported, tmp_path, existing):
    from hashrec.data import DataError

    output = tmp_path / "o.parquet"
    if existing:
        output.write_bytes(b"earlier predictions")
    inputs = f"{exported / 'data' / 'eval'},{_nan_price_file(exported, tmp_path / 'nan.parquet')}"
    with pytest.raises(DataError, match="value nan is not finite"):
        predict(str(exported / "export"), inputs, str(output), batch_size=16,
                overwrite=existing)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        (["nan.parquet", "o.parquet"] if existing else ["nan.parquet"])
    if existing:
        assert output.read_bytes() == b"earlier predictions"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("workers", [0, 2], ids=["rows", "join"])
def test_a_full_disk_is_one_error_and_leaves_nothing(caplog, exported, tmp_path, workers):
    export = _with_workers(exported, tmp_path, workers)
    out = tmp_path / "out"
    out.mkdir()
    # /dev/full fails every write with ENOSPC, as a full disk does. Without loader workers
    # the rows go straight to the staging file; two workers' parts are joined into it.
    fails = out / ".o.parquet.tmp"
    os.symlink("/dev/full", fails)
    code, _ = run_main(caplog, "--scripted_model_path", export, "--predict_input_path",
                       str(exported / "data" / "eval"), "--predict_output_path",
                       str(out / "o.parquet"), "--batch_size", "32")
    assert code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"ExportError: cannot write the predictions to {fails}: No space "
                      f"left on device; the disk may be full: free space (or use another "
                      f"--predict_output_path) and predict again"]
    assert os.listdir(out) == []


def test_existing_output_file_is_refused_unless_overwrite(caplog, exported, tmp_path):
    output = tmp_path / "o.parquet"
    args = ["--scripted_model_path", str(exported / "export"), "--predict_input_path",
            str(exported / "data" / "eval"), "--predict_output_path", str(output)]
    assert run_main(caplog, *args)[0] == 0
    first = output.read_bytes()
    caplog.clear()
    code, log = run_main(caplog, *args, "--reserved_columns", "user_id")
    assert code == 1
    assert f"--predict_output_path {str(output)!r} exists; pass --overwrite" in log
    assert output.read_bytes() == first
    assert run_main(caplog, *args, "--reserved_columns", "user_id", "--overwrite")[0] == 0
    assert pq.read_table(output).column_names == ["logits", "probs", "user_id"]


def test_non_empty_output_directory_is_refused_unless_overwrite(exported, tmp_path):
    from hashrec.export import ExportError

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"is not empty \(it holds keep.txt\)"):
        predict(str(exported / "export"), str(exported / "data" / "eval"), str(out))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    result = predict(str(exported / "export"), str(exported / "data" / "eval"), str(out),
                     overwrite=True)
    assert result["rows"] == 130
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "part-00000.parquet"]


def test_a_second_predict_into_one_output_is_refused_while_the_first_writes(exported,
                                                                            tmp_path):
    from hashrec.export import ExportError
    from hashrec.export.output_lock import OutputLock

    output = tmp_path / "o.parquet"
    args = (str(exported / "export"), str(exported / "data" / "eval"), str(output))
    running = OutputLock(str(output))  # as a predict writing there holds it
    (tmp_path / ".o.parquet.tmp").write_bytes(b"the running predict's rows")
    with pytest.raises(ExportError, match=r"another predict is writing .*o\.parquet"):
        predict(*args)
    assert (tmp_path / ".o.parquet.tmp").read_bytes() == b"the running predict's rows"
    running.release()
    assert predict(*args)["rows"] == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet"]  # no lock file left


@pytest.mark.parametrize("kind", ["file-for-directory", "directory-for-file", "csv"])
def test_output_path_of_the_wrong_kind_is_one_error(caplog, exported, tmp_path, kind):
    if kind == "file-for-directory":
        target = tmp_path / "predictions"
        target.write_text("mine")
        message = "is a file; name a directory (for part-00000.parquet)"
    elif kind == "csv":
        target = tmp_path / "predictions.csv"
        message = ": predictions are written as parquet; name a file ending in .parquet"
    else:
        target = tmp_path / "predictions.parquet"
        target.mkdir()
        message = "is a directory; a path ending in .parquet names the output file"
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(target), "--overwrite")
    assert code == 1
    assert f"ExportError: --predict_output_path {str(target)!r}{'' if kind == 'csv' else ' '}" \
           f"{message}" in log
    assert "Traceback" not in log and (kind != "csv" or not target.exists())


def test_unknown_device_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--scripted_model_path", "e", "--predict_input_path", "i",
              "--predict_output_path", str(tmp_path / "o.parquet"), "--device", "gpu"])
    assert exit_info.value.code == 2
    assert ("argument --device: expected auto, cpu, cuda or cuda:<index>, got 'gpu'"
            in capsys.readouterr().err)


def test_cuda_device_without_cuda_is_one_error(caplog, exported, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(tmp_path / "o.parquet"),
                         "--device", "cuda")
    assert code == 1 and "--device cuda: CUDA is not available on this machine" in log
    assert not (tmp_path / "o.parquet").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    from hashrec.export import ExportError
    from hashrec.export.loading import resolve_device

    with pytest.raises(ExportError, match="--device cuda:1: this machine has 1 CUDA device"):
        resolve_device("cuda:1")
    with pytest.raises(ExportError, match="--device 'tpu' is not supported"):
        resolve_device("tpu")


def _with_workers(exported, tmp_path, workers: int) -> str:
    """A copy of the export whose pipeline.config has ``workers`` loader workers."""
    export = tmp_path / f"export{workers}"
    shutil.copytree(exported / "export", export)
    config = export / "pipeline.config"
    text = config.read_text()
    assert "num_workers: 0" in text
    config.write_text(text.replace("num_workers: 0", f"num_workers: {workers}"))
    return str(export)


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "workers2"])
def test_a_bad_value_is_one_clear_error_with_or_without_workers(caplog, exported, tmp_path,
                                                                 workers):
    export = _with_workers(exported, tmp_path, workers)
    (part,) = sorted((exported / "data" / "eval").glob("*.parquet"))
    table = pq.read_table(part)
    price = table.column("price").to_numpy().copy()
    price[100] = float("nan")  # in the fourth batch of 32
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("price"), "price",
                                    pa.array(price)), bad)
    code, _ = run_main(caplog, "--scripted_model_path", export, "--predict_input_path",
                       str(bad), "--predict_output_path", str(tmp_path / "o.parquet"),
                       "--batch_size", "32")
    assert code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"DataError: {bad}: feature 'price': column 'price' row 100: value nan "
                      f"is not finite (NaN/inf are not allowed)"]


def test_rows_keep_the_input_order_with_loader_workers(exported, tmp_path):
    (train,) = sorted((exported / "data" / "train").glob("*.parquet"))
    inputs = f"{train},{exported / 'data' / 'eval'}"  # two files, in the listed order
    keys = ("user_id", "adgroup_id", "price")
    want = pa.concat_tables([pq.read_table(train, columns=list(keys)),
                             pq.read_table(exported / "data" / "eval", columns=list(keys))])
    outputs, exports = {}, {w: _with_workers(exported, tmp_path, w) for w in (0, 2, 3)}
    # Three workers of one full batch and one row: the first and last write, not the middle.
    for workers, batch_size in ((0, 7), (2, 7), (3, 7), (3, want.num_rows - 1)):
        out = predict(exports[workers], inputs,
                      str(tmp_path / f"w{workers}_{batch_size}.parquet"), keys,
                      batch_size=batch_size)
        outputs[workers] = pq.read_table(out["output"])
        assert outputs[workers].select(list(keys)).to_pylist() == want.to_pylist()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no parts left
    torch.testing.assert_close(torch.from_numpy(outputs[2]["probs"].to_numpy()),
                               torch.from_numpy(outputs[0]["probs"].to_numpy()),
                               atol=1e-6, rtol=0)


def test_refuses_to_run_under_several_ranks(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.ERROR):
        assert main(["--scripted_model_path", str(tmp_path), "--predict_input_path",
                     str(tmp_path), "--predict_output_path", str(tmp_path / "o.parquet")]) == 1
    assert "runs as one process (WORLD_SIZE is 2 here)" in caplog.text
    assert not (tmp_path / "o.parquet").exists()


def test_a_damaged_scripted_model_is_one_error_naming_it(caplog, exported, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(exported / "export", export)
    model = export / "scripted_model.pt"
    with open(model, "r+b") as f:
        f.truncate(model.stat().st_size // 2)
    code, log = run_main(caplog, "--scripted_model_path", str(export),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(tmp_path / "o.parquet"))
    assert code == 1 and "Traceback" not in log
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"ExportError: {model} cannot be loaded (")
    assert errors[0].endswith("the file is damaged or incomplete: export the model again with "
                              "python -m hashrec.export")
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("signum, code, message", [
    ("SIGTERM", 143, "stopped by SIGTERM (no predictions written; an earlier output is kept)"),
    ("SIGINT", 130, "interrupted (no predictions written; an earlier output is kept)"),
], ids=["sigterm", "sigint"])
def test_a_stop_signal_leaves_no_output_behind(caplog, exported, tmp_path, monkeypatch,
                                               signum, code, message):
    import signal

    import hashrec.predict

    signum = getattr(signal, signum)
    written = hashrec.predict._write_predictions

    def write_then_stop(*args):
        rows = written(*args)
        parts = args[-2]  # a part file per loader worker holds its rows
        assert [os.path.isfile(p) for p in parts.paths] == [True, True]
        os.kill(os.getpid(), signum)
        return rows

    monkeypatch.setattr(hashrec.predict, "_write_predictions", write_then_stop)
    export = _with_workers(exported, tmp_path, 2)
    # Outside the command this test's handler would see the SIGTERM: a failure, not an exit.
    def unhandled(*_):
        pytest.fail("SIGTERM not handled by the command")

    previous = signal.signal(signal.SIGTERM, unhandled)
    # a process started in the background by a shell ignores SIGINT: give it Python's
    # handler, as an interactive run has
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status, log = run_main(caplog, "--scripted_model_path", export,
                               "--predict_input_path", str(exported / "data" / "eval"),
                               "--predict_output_path", str(tmp_path / "new" / "out"),
                               "--batch_size", "7")
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the command's handler is gone
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert status == code and message in log and "Traceback" not in log
    assert os.listdir(tmp_path) == ["export2"]


def test_workers_batches_taken_out_of_turn_fail_rather_than_misorder(exported, tmp_path,
                                                                    monkeypatch):
    from hashrec.data.loader import BatchLoader

    export = _with_workers(exported, tmp_path, 2)
    monkeypatch.setattr(BatchLoader, "reader_turns", lambda self: iter([0] * 10_000))
    with pytest.raises(RuntimeError, match=r"the loader's workers gave \[\d+, 0\] rows, their "
                                           r"slices hold \[\d+, \d+\]; the output would be"):
        predict(export, str(exported / "data" / "eval"), str(tmp_path / "out.parquet"),
                batch_size=7)
    monkeypatch.setattr(BatchLoader, "reader_turns", lambda self: iter([0, 1]))
    with pytest.raises(RuntimeError, match=r"more batches than the loader's workers were to "
                                           r"give \(after 14 rows\)"):
        predict(export, str(exported / "data" / "eval"), str(tmp_path / "out.parquet"),
                batch_size=7)
    assert os.listdir(tmp_path) == ["export2"]


def test_output_columns_pick_and_order_the_predictions(caplog, exported, tmp_path):
    # As in TorchEasyRec: the prediction columns (all, sorted by name, unless
    # --output_columns lists some), then the reserved columns.
    output = tmp_path / "o.parquet"
    args = ["--scripted_model_path", str(exported / "export"), "--predict_input_path",
            str(exported / "data" / "eval"), "--predict_output_path", str(output)]
    assert run_main(caplog, *args, "--output_columns", "probs", "--reserved_columns",
                    "user_id,clk")[0] == 0
    assert pq.read_table(output).column_names == ["probs", "user_id", "clk"]
    assert run_main(caplog, *args, "--output_columns", "probs, logits", "--overwrite")[0] == 0
    assert pq.read_table(output).column_names == ["probs", "logits"]


@pytest.mark.parametrize("columns, message", [
    ("probs,y", r"--output_columns \['y'\] are not columns of the model; it gives logits, "
                r"probs"),
    ("probs,probs", r"--output_columns lists a column twice: \['probs', 'probs'\]"),
], ids=["unknown", "twice"])
def test_bad_output_columns_are_one_error(caplog, exported, tmp_path, columns, message):
    output = tmp_path / "o.parquet"
    code, log = run_main(caplog, "--scripted_model_path", str(exported / "export"),
                         "--predict_input_path", str(exported / "data" / "eval"),
                         "--predict_output_path", str(output), "--output_columns", columns)
    assert code == 1 and re.search(message, log) and not output.exists()


def test_a_config_of_encoded_input_without_expressions_exports_and_predicts(exported,
                                                                             tmp_path):
    # TorchEasyRec's configs of encoded input leave expression out; the same checkpoint
    # exported with such a config predicts the encoded rows as the raw export the raw rows
    from hashrec.tools.encode_input import encode

    raw_config = load_pipeline_config(exported / "dense.config")
    encode(raw_config, str(exported / "data" / "eval"), str(tmp_path / "encoded"), quiet=True)
    text = (exported / "dense.config").read_text()
    text = re.sub(r'expression: "\w+:\w+"', "", text).replace(
        "label_fields:", "fg_mode: FG_NONE label_fields:")
    assert "expression" not in text
    (tmp_path / "encoded.config").write_text(text)
    export_model(load_pipeline_config(tmp_path / "encoded.config"), str(tmp_path / "export"))
    encoded = predict(str(tmp_path / "export"), str(tmp_path / "encoded"),
                      str(tmp_path / "encoded.parquet"))
    raw = predict(str(exported / "export"), str(exported / "data" / "eval"),
                  str(tmp_path / "raw.parquet"))
    assert encoded["rows"] == raw["rows"] == 130
    torch.testing.assert_close(
        torch.from_numpy(pq.read_table(encoded["output"])["probs"].to_numpy()),
        torch.from_numpy(pq.read_table(raw["output"])["probs"].to_numpy()))
