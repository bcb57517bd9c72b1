"""Input paths: comma-separated lists of files, directories and glob patterns."""

from __future__ import annotations

import glob
import os

from hashrec.data.errors import DataError

_GLOB_CHARS = set("*?[")


def _visible(name: str) -> bool:
    # Hidden files and markers such as _SUCCESS or .crc files are not data.
    return not name.startswith((".", "_"))


def _files_under(directory: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if _visible(d))
        found.extend(os.path.join(root, f) for f in sorted(files) if _visible(f))
    return found


def expand_input_path(input_path: str) -> list[str]:
    """Expand ``input_path`` into the data files it names.

    Args:
        input_path: comma-separated entries, each a file, a directory (all
            files below it, recursively, in sorted order, skipping names that
            start with ``.`` or ``_``) or a glob pattern (``**`` recurses;
            matched files whose names start with ``.`` or ``_``, such as Spark's
            ``_SUCCESS`` marker, are skipped; matched directories expand as
            above). A file named by itself is read whatever its name.

    Returns:
        Files in entry order; a file named by several entries is kept once
        (at its first position).

    Raises:
        DataError: when the path is empty, an entry names nothing, or nothing
            at all is found.
    """
    entries = [e.strip() for e in (input_path or "").split(",") if e.strip()]
    if not entries:
        raise DataError(f"input path {input_path!r} names no files")
    files: list[str] = []
    for entry in entries:
        if _GLOB_CHARS & set(entry):
            found = sorted(glob.glob(entry, recursive=True))
            matches = [m for m in found if os.path.isdir(m) or _visible(os.path.basename(m))]
            if not matches:
                skipped = (f" but {len(found)} whose names start with '.' or '_' (hidden "
                           f"files and markers, skipped)") if found else ""
                raise DataError(f"input pattern {entry!r} matches no files{skipped}")
        elif os.path.exists(entry):
            matches = [entry]
        else:
            raise DataError(f"input path {entry!r} does not exist")
        for match in matches:
            files.extend(_files_under(match) if os.path.isdir(match) else [match])
    unique = list(dict.fromkeys(os.path.abspath(f) for f in files))
    if not unique:
        raise DataError(f"input path {input_path!r} names only empty directories")
    return unique
