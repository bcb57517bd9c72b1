"""Loading an export to run it on input files (``predict`` and the tools that score with
an export).

``load_export`` gives the exported pipeline config, the feature set that parses the
input (a tower's export: the tower's), the scripted model on the device
``resolve_device`` picks, and the tower meta of a tower's export. The input is read with
the exported data settings, switched to the input files' format where it differs
(``input_data_config``), and each parsed batch feeds the model as its five inputs
(``model_inputs``).
"""

from __future__ import annotations

import argparse
import logging
import os
import re

import torch

from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.towers import read_tower_meta, tower_feature_set

logger = logging.getLogger("hashrec.predict")

DEVICES = "auto, cpu, cuda or cuda:<index>"
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def resolve_device(device: str | None) -> torch.device:
    """``device`` (auto, cpu, cuda or cuda:<index>; None: auto) as a torch.device.

    Raises:
        ExportError: another name, or CUDA asked for where it is not available.
    """
    name = device or "auto"
    if not _DEVICE.fullmatch(name):
        raise ExportError(f"--device {name!r} is not supported; allowed: {DEVICES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run_on = torch.device(name)
    if run_on.type == "cuda":
        if not torch.cuda.is_available():
            raise ExportError(f"--device {name}: CUDA is not available on this machine; use "
                              f"--device cpu or auto")
        if run_on.index is not None and run_on.index >= torch.cuda.device_count():
            raise ExportError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s)")
    return run_on


def device_arg(text: str) -> str:
    """``--device`` as an argparse type: ``text`` if it names a device (see ``DEVICES``)."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected {DEVICES}, got {text!r}")
    return text


def load_export(export_dir: str, device: torch.device):
    """(pipeline config, FeatureSet, scripted model on ``device``, tower meta or None) of
    the export directory ``export_dir``.

    Raises:
        ExportError: not an export directory, or a scripted model that does not load.
    """
    model_path = os.path.join(export_dir, meta.SCRIPTED_MODEL_FILE)
    config_path = os.path.join(export_dir, meta.PIPELINE_CONFIG_FILE)
    for needed in (model_path, config_path):
        if not os.path.isfile(needed):
            raise ExportError(f"{needed} does not exist; --scripted_model_path must be a "
                              f"directory written by python -m hashrec.export")
    from hashrec.config import load_pipeline_config

    config = load_pipeline_config(config_path)
    try:
        model = torch.jit.load(model_path, map_location=device)
    except RuntimeError as err:  # a truncated or overwritten file: torch's reader fails
        # torch's first sentence says what failed; the rest is generic advice.
        reason = str(err).strip().split(". ")[0].splitlines()[0][:200] or "unreadable"
        raise ExportError(f"{model_path} cannot be loaded ({reason}); the file is damaged "
                          f"or incomplete: export the model again with python -m "
                          f"hashrec.export") from None
    tower = read_tower_meta(export_dir, model)
    return config, _feature_set(config, model, model_path, tower), model, tower


def _feature_set(config, model, model_path: str, tower: dict | None):
    """The exported config's FeatureSet (a tower's export: the tower's), with the features
    in no feature group that ``model`` still looks up (exports of versions that embedded
    such features)."""
    from hashrec.features import build_feature_set

    if tower is not None:
        return tower_feature_set(config, tower["tower"])
    feature_set = build_feature_set(config, metric_keys=False)
    looked_up = [n for n in model.embedding.feature_names if n in feature_set.left_out]
    if not looked_up:
        return feature_set
    logger.info("%s looks up features that no feature group names (it was exported by a "
                "version that embedded them): %s; they are read from the input for it",
                model_path, ", ".join(looked_up))
    return build_feature_set(config, keep=looked_up, metric_keys=False)


def input_data_config(data_config, input_path: str):
    """The exported data_config, switched to the input's format when every input file
    says otherwise by its extension (.csv with a header row, or .parquet) or, where the
    extensions tell nothing (.txt, .tsv, none), by its first bytes: parquet files start
    with ``PAR1``, and files that do not, given to a parquet-trained model, are read as
    CSV with a header row.

    Raises:
        DataError: the input holds both .csv and .parquet files.
    """
    from hashrec.config import data_pb2
    from hashrec.data import DataError
    from hashrec.data.paths import expand_input_path
    from hashrec.data.sources import is_parquet_file

    files = expand_input_path(input_path)
    suffixes = frozenset(os.path.splitext(f)[1].lower() for f in files)
    if {".csv", ".parquet"} <= suffixes:
        first = {suffix: next(f for f in files if f.lower().endswith(suffix))
                 for suffix in (".csv", ".parquet")}
        raise DataError(f"--predict_input_path {input_path!r} holds both .csv files (such as "
                        f"{first['.csv']}) and .parquet files (such as {first['.parquet']}); "
                        f"predict reads one format a run: predict the CSV and the parquet "
                        f"files apart")
    kind = {frozenset({".csv"}): data_pb2.CsvDataset,
            frozenset({".parquet"}): data_pb2.ParquetDataset}.get(suffixes)
    if kind is None and not suffixes & {".csv", ".parquet"}:
        parquet = {is_parquet_file(f) for f in files}
        kind = data_pb2.ParquetDataset if parquet == {True} else (
            data_pb2.CsvDataset if parquet == {False} else None)
    if kind is None or kind == data_config.dataset_type:
        return data_config
    switched = type(data_config)()
    switched.CopyFrom(data_config)
    switched.dataset_type = kind
    if kind == data_pb2.CsvDataset:
        del switched.input_fields[:]  # column names and types come from the header row
        switched.with_header = True
    return switched


def model_inputs(batch, weighted: set[str]) -> tuple[dict, dict, dict, dict, dict]:
    """A parsed Batch as the scripted model's five inputs (values, lengths, weights,
    dense, sequence_dense)."""
    values, lengths, weights = {}, {}, {}
    for name, bags in batch.sparse.to_dict().items():
        values[name], lengths[name] = bags.values, bags.lengths
        if name in weighted and bags.weights is not None:
            weights[name] = bags.weights
    return values, lengths, weights, dict(batch.dense), dict(batch.sequence_dense)
