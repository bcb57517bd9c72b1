"""Shard files: round trip per dtype, and every corruption names the file."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hashrec.checkpoint import CheckpointError
from hashrec.checkpoint.shard_file import ShardReader, ShardWriter

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _write(stem: str, chunks: list[dict[str, torch.Tensor]], section: str = "rows") -> None:
    writer = ShardWriter(stem, {"table": "t"})
    writer.ensure_section(section)
    for chunk in chunks:
        writer.write_chunk(section, chunk)
    writer.close()


def _chunk(n: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"keys": torch.randint(-2**62, 2**62, (n,), generator=gen),
            "tags": torch.randint(0, 5, (n,), generator=gen, dtype=torch.int32),
            "rows": torch.randn(n, 3, generator=gen).to(dtype)}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("sizes", [[], [0], [1, 7, 3]], ids=["none", "empty-chunk", "odd"])
def test_round_trip(tmp_path, dtype, sizes):
    stem = str(tmp_path / "s")
    chunks = [_chunk(n, dtype, seed=i) for i, n in enumerate(sizes)]
    _write(stem, chunks)
    reader = ShardReader(stem)
    assert reader.count("rows") == sum(sizes)
    assert reader.attrs == {"table": "t"}
    got = list(reader.iter_chunks("rows"))
    assert len(got) == len(chunks)
    for a, b in zip(got, chunks):
        for name in b:
            assert a[name].dtype == b[name].dtype
            assert torch.equal(a[name], b[name])


def test_truncated_data_names_file(tmp_path):
    stem = str(tmp_path / "s")
    _write(stem, [_chunk(10, torch.float32)])
    with open(stem + ".bin", "r+b") as f:
        f.truncate(os.path.getsize(stem + ".bin") - 4)
    with pytest.raises(CheckpointError, match=r"s\.bin.*truncated"):
        ShardReader(stem)


def test_flipped_byte_fails_checksum(tmp_path):
    stem = str(tmp_path / "s")
    _write(stem, [_chunk(10, torch.float32)])
    with open(stem + ".bin", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    reader = ShardReader(stem)
    with pytest.raises(CheckpointError, match=r"s\.bin: checksum mismatch"):
        list(reader.iter_chunks("rows"))


@pytest.mark.parametrize("damage", ["missing-header", "truncated-header", "missing-data",
                                    "wrong-version"])
def test_damaged_shard_names_file(tmp_path, damage):
    stem = str(tmp_path / "s")
    _write(stem, [_chunk(4, torch.float32)])
    if damage == "missing-header":
        os.remove(stem + ".json")
    elif damage == "truncated-header":
        text = open(stem + ".json").read()
        open(stem + ".json", "w").write(text[: len(text) // 2])
    elif damage == "missing-data":
        os.remove(stem + ".bin")
    else:
        header = json.load(open(stem + ".json"))
        header["version"] = 99
        json.dump(header, open(stem + ".json", "w"))
    with pytest.raises(CheckpointError, match=r"s\.(json|bin)"):
        ShardReader(stem)
