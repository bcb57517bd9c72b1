"""Writing one rank's part of an export: ``model-<rank>-of-<world>.safetensors`` + meta JSON.

Rank 0 writes the dense network and the dense embedding tables; every rank
writes the keys and values of the dynamic tables it holds (and of the ZCH ids it
owns: ``hashrec.export.tables``). Tables keep the dtype
they store their rows in. Tables are read
twice in chunks (count, then write), so memory stays at one chunk whatever the
table size.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.safetensors_io import SafetensorsWriter
from hashrec.export.tables import DEFAULT_CHUNK_ROWS, DynamicTableView


@dataclass(frozen=True)
class PartContents:
    """What one part holds.

    Attributes:
        dense_network: name -> tensor of the dense network (``dense: true``).
        dense_tables: table name -> (num_rows, dim) embedding matrix (``dense: false``), in
            the table's dtype.
        dynamic_tables: the logical dynamic tables whose keys this rank holds.
    """

    dense_network: dict[str, torch.Tensor]
    dense_tables: dict[str, torch.Tensor]
    dynamic_tables: list[DynamicTableView]


def _declare(contents: PartContents, counts: dict[str, int], rank: int, world_size: int
             ) -> tuple[dict, dict]:
    """(tensors to declare: name -> (dtype, shape), meta entries: item -> entry)."""
    tensors, entries = {}, {}
    for name, tensor in contents.dense_network.items():
        tensors[name] = (tensor.dtype, tuple(tensor.shape))
        entries[name] = meta.tensor_entry(name, tensor.dtype, tuple(tensor.shape), dense=True)
    for table, weight in contents.dense_tables.items():
        name = meta.dense_table_tensor_name(table)
        tensors[name] = (weight.dtype, tuple(weight.shape))
        entries[table] = meta.tensor_entry(name, weight.dtype, tuple(weight.shape), dense=False)
    for view in contents.dynamic_tables:
        keys, values = meta.hashmap_tensor_names(view.name, rank, world_size)
        tensors[keys] = (torch.int64, (counts[view.name],))
        tensors[values] = (view.dtype, (counts[view.name], view.dim))
        entries[view.name] = meta.hashmap_entry(view.name, rank, world_size,
                                                counts[view.name], view.dim, view.dtype)
    return tensors, entries


def write_part(export_dir: str, contents: PartContents, rank: int = 0, world_size: int = 1,
               chunk_rows: int = DEFAULT_CHUNK_ROWS) -> dict[str, dict]:
    """Writes this rank's safetensors file and its meta JSON; returns the meta entries."""
    counts = {view.name: view.count(chunk_rows) for view in contents.dynamic_tables}
    tensors, entries = _declare(contents, counts, rank, world_size)
    path = os.path.join(export_dir, meta.weights_file(rank, world_size))
    metadata = {"format": "pt", "rank": str(rank), "world_size": str(world_size)}
    with SafetensorsWriter(path, tensors, metadata) as writer:
        for name, tensor in contents.dense_network.items():
            writer.write(name, 0, tensor)
        for table, weight in contents.dense_tables.items():
            writer.write(meta.dense_table_tensor_name(table), 0, weight)
        for view in contents.dynamic_tables:
            _write_table(writer, view, rank, world_size, counts[view.name], chunk_rows)
    meta_path = os.path.join(export_dir, meta.meta_file(rank, world_size))
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
    return entries


def _write_table(writer: SafetensorsWriter, view: DynamicTableView, rank: int,
                 world_size: int, count: int, chunk_rows: int) -> None:
    keys_name, values_name = meta.hashmap_tensor_names(view.name, rank, world_size)
    written = 0
    for keys, values in view.chunks(chunk_rows):
        if written + keys.numel() <= count:
            writer.write(keys_name, written, keys)
            writer.write(values_name, written, values)
        written += keys.numel()
    if written != count:
        raise ExportError(f"table {view.name!r} changed while exporting: counted {count} keys, "
                          f"read {written}")
