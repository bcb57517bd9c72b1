"""Export: safetensors parts with ``is_hashmap`` meta, the pipeline config, a scripted model.

Public API::

    export_model(config, export_dir, checkpoint_path=None) -> ExportResult
    ExportError

``python -m hashrec.export --pipeline_config_path P [--checkpoint_path C] --export_dir E``
runs it from the command line (also under ``torchrun``); ``python -m hashrec.predict``
runs the scripted model on parquet or CSV files.
"""

from hashrec.export.errors import ExportError
from hashrec.export.exporter import ExportResult, export_model

__all__ = ["ExportError", "ExportResult", "export_model"]
