"""The one error base of the checkpoint subsystem."""

from __future__ import annotations

import errno


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file or table."""


def disk_full_hint(error: BaseException) -> str:
    """``"; the disk may be full ..."`` when ``error`` (or its cause) looks like a full disk.

    torch.save reports a failed write as ``[enforce fail at inline_container.cc] ...
    unexpected pos``, without the OS error.
    """
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            break
        if "unexpected pos" in str(error) or "inline_container" in str(error):
            break
        error = error.__cause__
    else:
        return ""
    return "; the disk may be full: free space (or use another model_dir) and save again"
