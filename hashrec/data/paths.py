"""Input paths: comma-separated lists of files, directories and glob patterns."""

from __future__ import annotations

import glob
import os
import re
import stat

from hashrec.data.errors import DataError

# A URL's scheme (odps://, hdfs://, oss://, s3:// ...): tables and stores not read here.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
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


def _fixed_part(pattern: str) -> str:
    """The directories of a glob pattern before its first component with a wildcard."""
    parts = pattern.split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if _GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or ("." if not pattern.startswith(os.sep) else os.sep)


def _visible_match(match: str, fixed: str) -> bool:
    """Whether a glob match is data: no name below the pattern's fixed directories (Spark's
    ``_temporary`` directory, a ``.checkpoint`` one, the ``_SUCCESS`` marker) starts with
    ``.`` or ``_``."""
    below = os.path.relpath(match, fixed).split(os.sep)
    return all(_visible(name) for name in below if name not in (".", ".."))


def relative_to_cwd(path: str) -> str:
    """`` (relative to the working directory D)`` for a relative ``path``, else "": where a
    relative path in a config was looked for, when it is not found there."""
    return "" if os.path.isabs(path) else f" (relative to the working directory {os.getcwd()})"


def expand_input_path(input_path: str) -> list[str]:
    """Expand ``input_path`` into the data files it names.

    Args:
        input_path: comma-separated entries, each a file, a directory (all
            files below it, recursively, in sorted order, skipping names that
            start with ``.`` or ``_``) or a glob pattern (``**`` recurses;
            matches with a name below the pattern's fixed directories that starts
            with ``.`` or ``_``, such as Spark's ``_SUCCESS`` marker or the files in
            its ``_temporary`` directory, are skipped; matched directories expand as
            above). A file named by itself is read whatever its name; an entry that
            names an existing file or directory is that path, even where its name holds
            glob characters (``day[1]``).

    Returns:
        Files in entry order; a file named by several entries is kept once
        (at its first position).

    Raises:
        DataError: when the path is empty, an entry names nothing, nothing at all
            is found, or a file found is not a regular file (a named pipe, say).
    """
    entries = [e.strip() for e in (input_path or "").split(",") if e.strip()]
    if not entries:
        raise DataError(f"input path {input_path!r} names no files")
    files: list[str] = []
    for entry in entries:
        scheme = _SCHEME.match(entry)
        if scheme:
            raise DataError(f"input path {entry!r}: {scheme.group(1)}:// paths are not read; "
                            f"HashRec reads parquet and CSV files on a local or mounted file "
                            f"system (export the table to parquet first)")
        if _GLOB_CHARS & set(entry) and not os.path.exists(entry):
            found = sorted(glob.glob(entry, recursive=True))
            fixed = _fixed_part(entry)
            matches = [m for m in found if _visible_match(m, fixed)]
            if not matches:
                skipped = (f" but {len(found)} whose names start with '.' or '_' (hidden "
                           f"files and markers, skipped)") if found else ""
                raise DataError(f"input pattern {entry!r} matches no files{skipped}")
        elif os.path.exists(entry):
            matches = [entry]
        else:
            raise DataError(f"input path {entry!r} does not exist{relative_to_cwd(entry)}")
        for match in matches:
            files.extend(_files_under(match) if os.path.isdir(match) else [match])
    unique = list(dict.fromkeys(os.path.abspath(f) for f in files))
    if not unique:
        raise DataError(f"input path {input_path!r} names only empty directories")
    for path in unique:
        _check_regular(path)
    return unique


def _check_regular(path: str) -> None:
    """DataError unless ``path`` is a regular file (or a link to one): a named pipe, a
    socket or a device would be waited on, and a file is read more than once (its rows
    are counted when the input is listed)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise DataError(f"input file {path} cannot be read: {e}") from e
    if not stat.S_ISREG(mode):
        raise DataError(f"input file {path} is not a regular file (a named pipe, socket or "
                        f"device); input files are read more than once: copy it to a file "
                        f"or leave it out of the input path")
