"""The model registry and the config validator name the same models."""

from __future__ import annotations

from hashrec.config.validate import MULTI_TASK_MODELS as VALIDATED_MULTI_TASK
from hashrec.config.validate import SUPPORTED_MODELS
from hashrec.models.registry import MODELS
from hashrec.models.tasks import MULTI_TASK_MODELS


def test_validator_accepts_exactly_the_registered_models():
    assert SUPPORTED_MODELS == tuple(MODELS)


def test_validator_and_tasks_name_the_same_multi_task_models():
    assert VALIDATED_MULTI_TASK == MULTI_TASK_MODELS


def test_validator_and_tasks_name_the_same_match_models():
    from hashrec.config.validate import MATCH_MODELS as VALIDATED_MATCH
    from hashrec.models.tasks import MATCH_MODELS

    assert VALIDATED_MATCH == MATCH_MODELS
