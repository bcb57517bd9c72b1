"""The dense graphs' capture helpers that run without a GPU."""

from __future__ import annotations

import warnings

from hashrec.train.graphs import STREAM_MISMATCH, quiet_warmup_streams

MISMATCH = STREAM_MISMATCH + " the stream of the node that produced the incoming gradient."


def _warned(*messages: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_warmup_streams():
            for message in messages:
                warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn(MISMATCH, UserWarning, stacklevel=1)  # after the capture: shown again
    return [str(w.message) for w in caught]


def test_the_warmup_stream_warning_is_ignored_in_the_capture_alone():
    assert _warned(MISMATCH, "another warning") == ["another warning", MISMATCH]
