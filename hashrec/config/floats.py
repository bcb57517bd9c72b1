"""Float fields of the config as the config text wrote them.

A ``float`` field holds a float32, so protobuf hands back ``0.1`` as
0.10000000149011612; an error naming the value, or a comparison with float64 data,
should read the ``0.1`` the user wrote.
"""

from __future__ import annotations

import math

import numpy as np

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def proto_float(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as ``value`` (a ``float``
    field's value; NaN, infinities and values beyond float32's range are returned as
    they are).

    Example::

        proto_float(0.10000000149011612) == 0.1
    """
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        return value
    return float(str(np.float32(value)))
