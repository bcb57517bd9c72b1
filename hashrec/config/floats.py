"""Float fields of the config as the config text wrote them.

A ``float`` field holds a float32, so protobuf hands back ``0.1`` as
0.10000000149011612; an error naming the value should read the ``0.1`` the user wrote.
"""

from __future__ import annotations

import math
import struct


def proto_float(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as ``value`` (a ``float``
    field's value; a value float32 cannot hold, NaN and infinities are returned as is).

    Example::

        proto_float(0.10000000149011612) == 0.1
    """
    if not math.isfinite(value):
        return value
    try:
        stored = struct.pack("<f", value)
    except OverflowError:
        return value
    for digits in range(1, 10):
        text = float(f"{value:.{digits}g}")
        if struct.pack("<f", text) == stored:
            return text
    return value
