"""SafetensorsWriter: declared tensors written in chunks read back with safetensors."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hashrec.export.errors import ExportError
from hashrec.export.safetensors_io import SafetensorsWriter


@pytest.mark.parametrize("rows,chunk", [(0, 4), (1, 4), (7, 3), (1000, 333)],
                         ids=["empty", "one-row", "odd-chunks", "rows1000-chunk333"])
def test_chunked_writes_read_back_exactly(tmp_path, rows, chunk):
    keys = torch.randint(-(2**62), 2**62, (rows,), dtype=torch.int64)
    values = torch.randn(rows, 5)
    scalar = torch.tensor(3, dtype=torch.int64)
    half = torch.randn(3, 2).to(torch.bfloat16)
    path = str(tmp_path / "t.safetensors")
    declared = {"t.keys/part_0_1": (torch.int64, (rows,)), "t.values/part_0_1": (torch.float32,
                (rows, 5)), "step": (torch.int64, ()), "half": (torch.bfloat16, (3, 2))}
    with SafetensorsWriter(path, declared, {"rank": "0"}) as writer:
        for start in range(0, rows, chunk):
            writer.write("t.values/part_0_1", start, values[start:start + chunk])
            writer.write("t.keys/part_0_1", start, keys[start:start + chunk])
        writer.write("step", 0, scalar)
        writer.write("half", 0, half)
    loaded = load_file(path)
    assert torch.equal(loaded["t.keys/part_0_1"], keys)
    assert torch.equal(loaded["t.values/part_0_1"], values)
    assert torch.equal(loaded["step"], scalar) and torch.equal(loaded["half"], half)
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"rank": "0"}


def test_unwritten_rows_read_as_zero(tmp_path):
    path = str(tmp_path / "t.safetensors")
    with SafetensorsWriter(path, {"x": (torch.float32, (4, 2))}) as writer:
        writer.write("x", 2, torch.ones(2, 2))
    assert torch.equal(load_file(path)["x"], torch.tensor([[0.0, 0], [0, 0], [1, 1], [1, 1]]))


def test_rows_past_the_declared_shape_raise(tmp_path):
    with SafetensorsWriter(str(tmp_path / "t.safetensors"), {"x": (torch.float32, (2, 2))}) as w:
        with pytest.raises(ExportError, match="exceed its declared 2 rows"):
            w.write("x", 1, torch.ones(2, 2))
        with pytest.raises(ExportError, match="rows of \\(2,\\) expected"):
            w.write("x", 0, torch.ones(1, 3))


def test_unsupported_dtype_names_the_tensor(tmp_path):
    with pytest.raises(ExportError, match="'c'.*complex64"):
        SafetensorsWriter(str(tmp_path / "t.safetensors"), {"c": (torch.complex64, (1,))})
