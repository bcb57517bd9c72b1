"""The model registry and the config validator name the same models."""

from __future__ import annotations

from hashrec.config.validate import SUPPORTED_MODELS
from hashrec.models.registry import MODELS


def test_validator_accepts_exactly_the_registered_models():
    assert SUPPORTED_MODELS == tuple(MODELS)
