"""The one error base of the checkpoint subsystem."""

from __future__ import annotations

import errno


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file or table."""


class CheckpointDamagedError(CheckpointError):
    """A file of a complete checkpoint is missing, truncated or fails its checksum: the
    checkpoint itself is damaged (unlike one that is merely another model's), so the
    next step is an earlier checkpoint."""


def disk_full_hint(error: BaseException, instead: str | None = "another model_dir",
                   retry: str = "save again") -> str:
    """``"; the disk may be full ..."`` when ``error`` (or its cause) looks like a full disk.

    torch.save reports a failed write as ``[enforce fail at inline_container.cc] ...
    unexpected pos``, without the OS error.

    Args:
        error: the failure (its ``__cause__`` chain is searched too).
        instead: where else the files could go (``"another --export_dir"``), or None.
        retry: what to do once there is space (``"export again"``).
    """
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            break
        if "unexpected pos" in str(error) or "inline_container" in str(error):
            break
        error = error.__cause__
    else:
        return ""
    elsewhere = f" (or use {instead})" if instead else ""
    return f"; the disk may be full: free space{elsewhere} and {retry}"
