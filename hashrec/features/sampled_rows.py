"""A feature over a batch with a sampler's negative rows after it (``FeatureSet.parse``).

The sampler fills its attr fields alone (the item side's columns); every other column of
a sampled row is missing. A sparse feature reads such a row as an empty bag (or its
default), and a dense raw feature with a value for missing cells (``default_value``, or
``fg_encoded_default_value`` of encoded input) takes that value. A dense raw feature
without one would refuse the row, which encoded input (``fg_mode: FG_NONE``, where a
missing cell has no value unless the config gives one) makes the case of every user-side
raw feature; the sampled rows of a feature whose columns the sampler leaves empty are then
zeros: they are the user side's, which no tower reads (the user tower reads the batch's
rows only), as TorchEasyRec builds no user features for its sampled items at all.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from hashrec.features.base import Feature, SparseIds


def _unfilled_dense(feature: Feature, negatives: pa.Table) -> bool:
    """``feature`` is dense, without a value for missing cells, and the sampler fills
    none of its columns."""
    if feature.is_sparse or feature.is_sequence or getattr(feature, "default", ""):
        return False
    return all(negatives.column(c).null_count == negatives.num_rows
               for c in feature.columns)


def parse_with_negatives(feature: Feature, table: pa.Table, rows: int,
                         negatives: pa.Table | None) -> SparseIds | np.ndarray:
    """``feature`` over ``table``: the batch's ``rows`` rows, then ``negatives``' (None:
    none; see the module docstring for a dense feature the sampler leaves empty)."""
    if negatives is None or not negatives.num_rows or not _unfilled_dense(feature, negatives):
        return feature.parse(table)
    head = feature.parse(table.slice(0, rows))
    return np.concatenate([head, np.zeros((negatives.num_rows, *head.shape[1:]),
                                          dtype=head.dtype)])
