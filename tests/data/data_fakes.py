"""A small stand-in feature set and file writers for the dataset tests."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.features.batch import Batch


class FakeFeatureSet:
    """Int columns -> one-id bags, list<int> or '|'-joined string columns -> bags.

    Raises ValueError on the id ``poison`` (to test how parse errors surface).
    """

    def __init__(self, ids=("row_id",), bags=(), labels=("clk",), poison=None):
        self.ids, self.bags, self.label_fields = list(ids), list(bags), list(labels)
        self.target_columns = list(self.label_fields)
        self.feature_columns = [*self.ids, *self.bags]
        self.input_columns = [*self.feature_columns, *self.label_fields]
        self.column_notes: dict[str, str] = {}
        self.poison = poison

    @staticmethod
    def _bag(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(values, lengths) of a list<int> column or a '|'-joined string column."""
        if pa.types.is_string(column.type):
            column = pc.split_pattern(column, "|")
        flat = pc.list_flatten(column)
        parent = pc.list_parent_indices(column).to_numpy()
        keep = pc.not_equal(flat.cast(pa.string()), "").to_numpy(zero_copy_only=False)
        values = flat.filter(pa.array(keep)).cast(pa.int64()).to_numpy()
        return values, np.bincount(parent[keep], minlength=len(column)).astype(np.int64)

    def parse(self, table: pa.Table, with_labels: bool = True) -> Batch:
        values, lengths = [], []
        for name in self.ids:
            col = table.column(name).to_numpy(zero_copy_only=False).astype(np.int64)
            values.append(col)
            lengths.append(np.ones(col.size, np.int64))
        for name in self.bags:
            bag_values, bag_lengths = self._bag(table.column(name).combine_chunks())
            values.append(bag_values)
            lengths.append(bag_lengths)
        all_values = np.concatenate(values) if values else np.zeros(0, np.int64)
        if self.poison is not None and (all_values == self.poison).any():
            raise ValueError(f"id {self.poison} is poisoned")
        kjt = KeyedJaggedTensor.from_lengths(
            [*self.ids, *self.bags], torch.from_numpy(all_values),
            torch.from_numpy(np.concatenate(lengths)))
        labels = {}
        if with_labels:
            labels = {n: torch.from_numpy(table.column(n).to_numpy().astype(np.float32))
                      for n in self.label_fields}
        return Batch(sparse=kjt, labels=labels, batch_size=table.num_rows)


def write_parquet(path: str, first: int, rows: int, row_group_size: int = 7) -> str:
    """A parquet file whose row_id column holds first .. first + rows - 1."""
    ids = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table({"row_id": ids, "clk": ids % 2,
                      "tags": pa.array([[int(i), int(i) + 1][: int(i) % 3] for i in ids],
                                       pa.list_(pa.int64()))})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def row_ids(batches) -> list[int]:
    """All row_id values of a sequence of batches, in order."""
    return [int(v) for b in batches for v in b.sparse["row_id"].values]


def data_config(**overrides):
    """A DataConfig look-alike with TorchEasyRec's defaults."""
    fields = dict(batch_size=4, eval_batch_size=0, dataset_type="ParquetDataset",
                  label_fields=["clk"], num_workers=0, pin_memory=False, input_fields=[],
                  delimiter=",", with_header=False, drop_remainder=False, shuffle=False,
                  shuffle_buffer_size=32)
    fields.update(overrides)
    return SimpleNamespace(**fields)


def input_field(name: str, kind: str | None):
    return SimpleNamespace(input_name=name, input_type=kind)
