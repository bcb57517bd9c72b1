"""xxh64_tokens: the xxhash package's XXH64 of every token, computed over the array."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from hashrec.features.xxh64 import LONG, STRIPE, xxh64_tokens

ALPHABET = "abcXYZ0189+- é７"  # one-, two- and three-byte UTF-8


def _tokens(seed: int, lengths: range, per_length: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(length))
            for length in lengths for _ in range(per_length)]


def _package(tokens: list) -> np.ndarray:
    return np.array([xxhash.xxh64_intdigest((t or "").encode()) for t in tokens],
                    dtype=np.uint64)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()], ids=["string", "large"])
def test_every_length_hashes_as_the_package_does(kind):
    # characters, not bytes: multi-byte ones take tokens past every lane boundary; up to
    # two stripes and a tail, then tokens around and past the vectorized path's limit
    tokens = _tokens(0, range(2 * STRIPE + 17), 8) + _tokens(1, range(LONG - 90, LONG + 3), 1)
    array = pa.array(tokens, kind)
    assert np.array_equal(xxh64_tokens(array), _package(tokens))


def test_slices_nulls_and_empty_arrays():
    tokens = _tokens(2, range(40), 1)
    array = pa.array(tokens)
    assert np.array_equal(xxh64_tokens(array.slice(5, 20)), _package(tokens[5:25]))
    with_nulls = ["ab", None, "", "abcdefghi"]
    assert np.array_equal(xxh64_tokens(pa.array(with_nulls)), _package(with_nulls))
    assert xxh64_tokens(pa.array([], pa.string())).shape == (0,)
    assert np.array_equal(xxh64_tokens(pa.array(["", ""])), _package(["", ""]))


def test_random_arrays_and_their_slices():
    # the last token of an array reads the lanes nearest the data's end
    rng = random.Random(3)
    for _ in range(200):
        tokens = _tokens(rng.randint(0, 10**6), range(rng.randint(0, 90), 91), 1)[:30]
        array = pa.array(tokens, pa.string())
        start = rng.randint(0, len(tokens) - 1)
        assert np.array_equal(xxh64_tokens(array), _package(tokens))
        assert np.array_equal(xxh64_tokens(array.slice(start)), _package(tokens[start:]))
