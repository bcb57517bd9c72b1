"""The feature subsystem's error type."""

from __future__ import annotations


class FeatureError(ValueError):
    """Input data a feature cannot turn into tensors.

    Messages name the feature, the column and, where known, the row (0-based
    within the parsed block), and say what was expected. An error about one row
    keeps the row apart (``row``, ``subject``, ``detail``) so that a reader that
    knows where the block came from can name the file and the row in it.

    Args:
        subject: what the error is about (feature and column), or the whole message.
        row: the row at fault, 0-based within the parsed block; None: no single row.
        detail: with ``row``: what is wrong with that row.
    """

    def __init__(self, subject: str, row: int | None = None, detail: str = "") -> None:
        super().__init__(subject if row is None else f"{subject} row {row}: {detail}")
        self.subject = subject
        self.row = row
        self.detail = detail

    def __reduce__(self):
        return type(self), (self.subject, self.row, self.detail)
