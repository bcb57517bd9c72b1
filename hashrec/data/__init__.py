"""Parquet and CSV datasets that yield parsed :class:`~hashrec.features.batch.Batch` objects."""

from hashrec.data.dataset import CsvDataset, FileDataset, ParquetDataset, ReadOptions
from hashrec.data.errors import DataError
from hashrec.data.loader import build_dataset, create_dataloader, csv_format, read_options
from hashrec.data.paths import expand_input_path
from hashrec.data.sources import CsvFormat

__all__ = [
    "CsvDataset", "CsvFormat", "DataError", "FileDataset", "ParquetDataset", "ReadOptions",
    "build_dataset", "create_dataloader", "csv_format", "expand_input_path", "read_options",
]
