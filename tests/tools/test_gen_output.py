"""The generators' output folders: what an earlier run wrote is replaced, other files are
refused unless --overwrite."""

from __future__ import annotations

import os

import pytest

from hashrec.tools.gen_output import GeneratorError, output_dirs, prepare_dir, write_marker

MARKER = "_gen_test.json"


def _earlier_run(out_dir, eval_rows: int) -> None:
    """The files a run wrote: part files and a marker per folder it wrote."""
    dirs, _ = output_dirs(str(out_dir), eval_rows, False, MARKER)
    for folder in dirs.values():
        os.makedirs(folder, exist_ok=True)
        for name in ("part-00000.parquet", "part-00001.parquet"):
            open(os.path.join(folder, name), "wb").close()
        write_marker(folder, MARKER, ["part-00000.parquet", "part-00001.parquet"], 10, True)


def test_a_run_without_eval_rows_replaces_an_earlier_runs_train_and_eval(tmp_path):
    _earlier_run(tmp_path / "d", eval_rows=5)
    dirs, stale = output_dirs(str(tmp_path / "d"), 0, False, MARKER)
    prepare_dir(dirs["data"], stale["data"], lambda message: None)
    assert os.listdir(tmp_path / "d") == []  # nothing left for a read of d to mix in


def test_a_train_folder_holding_other_files_is_still_refused(tmp_path):
    _earlier_run(tmp_path / "d", eval_rows=5)
    open(tmp_path / "d" / "train" / "mine.txt", "w").close()
    with pytest.raises(GeneratorError, match="it holds train"):
        output_dirs(str(tmp_path / "d"), 0, False, MARKER)
    dirs, stale = output_dirs(str(tmp_path / "d"), 0, True, MARKER)  # --overwrite
    prepare_dir(dirs["data"], stale["data"], lambda message: None)
    assert os.listdir(tmp_path / "d") == ["train"]  # eval held the earlier run's alone
    assert os.listdir(tmp_path / "d" / "train") == ["mine.txt"]  # not the generator's
