"""The export directory: checked up front, filled in a staging sibling, renamed into place.

An export is written into ``<export_dir>.tmp`` (next to ``export_dir``, so that the
final rename stays on one filesystem) and renamed to ``export_dir`` once every file
is complete. A killed export therefore leaves no ``export_dir`` that looks usable,
only the staging directory, which the next export of the same ``export_dir``
removes. The staging directory holds a marker file from its creation on; a
directory of that name without the marker is not ours and is never removed. The
export holds an advisory lock (``flock``) on its marker until it ends, so a second
export into the same ``export_dir`` meanwhile is refused rather than deleting the
staging directory the first one is writing (the two would mix their files, or fail
on files gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil

from hashrec.export.errors import ExportError

STAGING_SUFFIX = ".tmp"
STAGING_MARKER = ".hashrec_export_in_progress"
_LISTED = 5


def staging_dir(export_dir: str) -> str:
    """The staging sibling of ``export_dir`` (``<export_dir>.tmp``)."""
    return os.path.normpath(os.path.abspath(export_dir)) + STAGING_SUFFIX


def check_export_dir(export_dir: str) -> None:
    """``export_dir`` must be new or an empty directory.

    Raises:
        ExportError: it is a file, or a directory holding anything (named, with the
            first few entries).
    """
    if not os.path.exists(export_dir):
        return
    if not os.path.isdir(export_dir):
        raise ExportError(f"export_dir {export_dir!r} is a file; --export_dir must be a new or "
                          f"empty directory")
    entries = sorted(os.listdir(export_dir))
    if entries:
        shown = ", ".join(entries[:_LISTED]) + (", ..." if len(entries) > _LISTED else "")
        raise ExportError(f"export_dir {export_dir!r} is not empty (it holds {shown}); "
                          f"choose a new or empty --export_dir")


def prepare_staging(export_dir: str) -> int:
    """Checks ``export_dir`` and creates its empty staging directory, whose marker it
    locks; returns the marker's descriptor, which holds the lock: close it once the
    staging directory is published or discarded.

    A staging directory left by a killed export (its marker unlocked) is removed first.

    Raises:
        ExportError: ``export_dir`` is not new or empty, a directory named like the
            staging directory exists without the marker of an export, or another
            export into ``export_dir`` is running.
    """
    check_export_dir(export_dir)
    staging = staging_dir(export_dir)
    marker = os.path.join(staging, STAGING_MARKER)
    if os.path.lexists(staging):
        if not os.path.isfile(marker):
            raise ExportError(f"{staging} exists and was not made by an export; move it away "
                              f"or choose another --export_dir")
        if _locked(marker):
            raise ExportError(f"another export into --export_dir {export_dir!r} is running "
                              f"(it writes {staging}); wait for it to end, or choose another "
                              f"--export_dir")
        shutil.rmtree(staging)
    try:
        os.makedirs(os.path.dirname(staging), exist_ok=True)
        os.mkdir(staging)
        fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as err:
        raise ExportError(f"cannot create {staging} for --export_dir {export_dir!r}: "
                          f"{err.strerror}") from None
    with contextlib.suppress(OSError):  # a file system without flock: exports unguarded
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _locked(marker: str) -> bool:
    """Whether a running export holds the lock on the staging ``marker``."""
    try:
        fd = os.open(marker, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the lock it may have taken
    return False


def publish(staging: str, export_dir: str) -> None:
    """Renames the complete ``staging`` directory to ``export_dir``.

    Raises:
        ExportError: ``export_dir`` was created or filled meanwhile, or the rename failed.
    """
    check_export_dir(export_dir)
    try:
        # rename() replaces an empty directory in one step; a non-empty one makes it fail.
        os.rename(staging, export_dir)
    except OSError as err:
        raise ExportError(f"cannot rename {staging} to --export_dir {export_dir!r}: "
                          f"{err.strerror}") from None
    os.remove(os.path.join(export_dir, STAGING_MARKER))


def discard(staging: str) -> None:
    """Removes a staging directory after a failed export (if it is still ours)."""
    if os.path.isfile(os.path.join(staging, STAGING_MARKER)):
        shutil.rmtree(staging, ignore_errors=True)
