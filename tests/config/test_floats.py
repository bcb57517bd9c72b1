import math
import struct

import pytest

from hashrec.config.floats import proto_float


def _float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


@pytest.mark.parametrize("written", [0.1, -0.1, 0.2, 1.5, 0.25, 1e-7, 3.14159, 123456.7, 0.0])
def test_a_float32_field_reads_as_the_decimal_written(written):
    assert proto_float(_float32(written)) == written


@pytest.mark.parametrize("value", [math.inf, -math.inf, 1e300])
def test_values_float32_cannot_hold_are_returned_as_is(value):
    assert proto_float(value) == value


def test_nan_stays_nan():
    assert math.isnan(proto_float(math.nan))
