"""Helpers: a FeatureSet from a few lines of text-format feature configs."""

from __future__ import annotations

import pytest

from hashrec.config import parse_pipeline_config
from hashrec.features import build_feature_set


def make_feature_set(features: str, extra: str = ""):
    return build_feature_set(parse_pipeline_config(f'model_dir: "m"\n{features}\n{extra}'))


@pytest.fixture
def feature_set():
    return make_feature_set
