"""The export directory: checked up front, filled in a staging sibling, renamed into place.

An export is written into ``<export_dir>.tmp`` (next to ``export_dir``, so that the
final rename stays on one filesystem) and renamed to ``export_dir`` once every file
is complete. A killed export therefore leaves no ``export_dir`` that looks usable,
only the staging directory, which the next export of the same ``export_dir``
removes. The staging directory holds a marker file from its creation on; a
directory of that name without the marker is not ours and is never removed.
"""

from __future__ import annotations

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


def prepare_staging(export_dir: str) -> str:
    """Checks ``export_dir`` and creates its empty staging directory; returns the latter.

    A staging directory left by a killed export is removed first.

    Raises:
        ExportError: ``export_dir`` is not new or empty, or a directory named like the
            staging directory exists without the marker of an export.
    """
    check_export_dir(export_dir)
    staging = staging_dir(export_dir)
    if os.path.lexists(staging):
        if not os.path.isfile(os.path.join(staging, STAGING_MARKER)):
            raise ExportError(f"{staging} exists and was not made by an export; move it away "
                              f"or choose another --export_dir")
        shutil.rmtree(staging)
    try:
        os.makedirs(os.path.dirname(staging), exist_ok=True)
        os.mkdir(staging)
        open(os.path.join(staging, STAGING_MARKER), "w", encoding="utf-8").close()
    except OSError as err:
        raise ExportError(f"cannot create {staging} for --export_dir {export_dir!r}: "
                          f"{err.strerror}") from None
    return staging


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
