"""Pipeline config: the .proto schema, its generated code, loading, editing, validation.

The schema keeps TorchEasyRec's message and field names (package
``hashrec.protos``). Regenerate the ``*_pb2.py`` modules with
``python -m hashrec.config.regen`` after editing a ``.proto`` file.
"""

from hashrec.config.edit import apply_edit_config_json
from hashrec.config.errors import ConfigError
from hashrec.config.loader import load_pipeline_config, parse_pipeline_config, save_pipeline_config
from hashrec.config.pipeline_pb2 import EasyRecConfig
from hashrec.config.validate import validate_pipeline_config

__all__ = [
    "ConfigError",
    "EasyRecConfig",
    "apply_edit_config_json",
    "load_pipeline_config",
    "parse_pipeline_config",
    "save_pipeline_config",
    "validate_pipeline_config",
]
