"""``staged``: a tool's output written through a hidden sibling, moved into place when
complete, removed with the folders made for it when the writer fails."""

from __future__ import annotations

import pytest

from hashrec.export.prediction_files import staged


def test_a_completed_write_is_moved_into_place(tmp_path):
    output = tmp_path / "new" / "out.parquet"
    with staged(str(output)) as staging:
        with open(staging, "w") as f:
            f.write("rows")
    assert output.read_text() == "rows"
    assert [p.name for p in output.parent.iterdir()] == ["out.parquet"]


def test_a_failed_write_leaves_nothing(tmp_path):
    output = tmp_path / "a" / "b" / "out.parquet"
    with pytest.raises(KeyboardInterrupt), staged(str(output)) as staging:
        with open(staging, "w") as f:
            f.write("part")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
