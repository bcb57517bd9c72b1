"""Config -> feature objects -> tensors from pyarrow blocks.

``build_feature_set(pipeline_config)`` gives a :class:`FeatureSet` whose
``parse(table)`` turns a pyarrow Table/RecordBatch into a :class:`Batch`.
"""

from hashrec.features.batch import Batch
from hashrec.features.errors import FeatureError
from hashrec.features.feature_set import FeatureSet, build_feature_set

__all__ = ["Batch", "FeatureError", "FeatureSet", "build_feature_set"]
