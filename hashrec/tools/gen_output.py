"""What the synthetic data generators share: where they may write, their marker files,
progress lines and command-line number types.

A generator writes ``part-*.parquet`` files into a directory, with a marker
(``_gen_<name>.json``) naming them; readers skip names starting with ``_``. A directory
holding anything else is refused unless the caller overwrites; one holding only an earlier
run's files (listed in its marker) is replaced. The marker is written before the parts and
says ``"complete": true`` once all of them are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import pyarrow.parquet as pq


class GeneratorError(ValueError):
    """The generator cannot write where it was asked to; the message names the path."""


class Progress:
    """Timestamped progress lines on stderr, prefixed with the generator's name."""

    def __init__(self, name: str, quiet: bool) -> None:
        self._name = name
        self._quiet = quiet
        self._start = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self._quiet:
            elapsed = time.perf_counter() - self._start
            print(f"[{self._name} {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def _previous_output(out_dir: str, marker: str) -> set[str]:
    """Names an earlier run of the generator wrote into ``out_dir`` (by its marker)."""
    try:
        with open(os.path.join(out_dir, marker), encoding="utf-8") as f:
            return {marker, *json.load(f)["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _previous_splits(out_dir: str, marker: str, overwrite: bool) -> list[str]:
    """The files of an earlier run with --eval_rows in the ``train``, ``eval`` and
    ``items`` (an item table) folders of ``out_dir``, as paths relative to it: a folder
    holding nothing else goes too (after its files); with ``overwrite`` the run's files go
    from one that holds other files too, which stay."""
    found = []
    for split in ("train", "eval", "items"):
        folder = os.path.join(out_dir, split)
        ours = _previous_output(folder, marker) if os.path.isdir(folder) else set()
        entries = set(os.listdir(folder)) if ours else set()
        if ours and (entries <= ours or overwrite):
            found += [os.path.join(split, name) for name in sorted(entries & ours)]
            found += [split] if entries <= ours else []
    return found


def stale_files(out_dir: str, overwrite: bool, marker: str, splits: bool = False
                ) -> list[str]:
    """The files in ``out_dir`` to delete before writing a split into it. ``splits``:
    the earlier run's ``train`` and ``eval`` folders are stale too (a run without
    --eval_rows, which reads ``out_dir`` whole, writes into it).

    Raises:
        GeneratorError: ``out_dir`` is a file, or it holds files that an earlier run did
            not write and ``overwrite`` is False.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise GeneratorError(f"{out_dir} is a file; --output_dir must name a directory")
    if not os.path.isdir(out_dir):
        return []
    entries = sorted(os.listdir(out_dir))
    earlier = _previous_splits(out_dir, marker, overwrite) if splits else []
    ours = _previous_output(out_dir, marker) | set(earlier)
    foreign = [e for e in entries if e not in ours]
    if foreign and not overwrite:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise GeneratorError(f"{out_dir} is not empty (it holds {shown}); choose another "
                             f"--output_dir, or pass --overwrite to replace its "
                             f"part-*.parquet files")
    return [e for e in entries if e in ours and e not in earlier
            or (e.startswith("part-") and e.endswith(".parquet"))] + earlier


def prepare_dir(out_dir: str, stale: tuple[str, ...], log) -> None:
    """Creates ``out_dir`` and removes its ``stale`` files (see :func:`stale_files`)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise GeneratorError(f"cannot create {out_dir}: {err.strerror}") from None
    files = 0
    for name in stale:  # an earlier run's split folder comes after its files
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            os.rmdir(path)
        else:
            os.remove(path)
            files += 1
    if files:
        log(f"removed {files} old files in {out_dir}")


def write_marker(out_dir: str, marker: str, names: list[str], rows: int,
                 complete: bool) -> None:
    with open(os.path.join(out_dir, marker), "w", encoding="utf-8") as f:
        json.dump({"files": names, "rows": rows, "complete": complete}, f)


def write_splits(dirs: dict[str, str], stale: dict[str, tuple[str, ...]], num_rows: int,
                 num_files: int, eval_rows: int, marker: str, row_group_size: int, log,
                 table_of: Callable, detail: Callable | None = None,
                 announce: bool = False) -> dict[str, list[str]]:
    """Write each split of ``output_dirs``' ``dirs``: ``num_rows`` rows in ``num_files``
    parts (``eval_rows`` in proportionally fewer for "eval"), each part ``table_of(rows)``
    (a pyarrow table of the next ``rows`` rows), the marker first and marked complete
    last; ``announce`` logs each part before it is made, ``detail(table)`` adds to the
    line logged after. Returns {split: [paths]}."""
    eval_files = max(1, min(num_files, round(num_files * eval_rows / num_rows)))
    sizes = {"data": (num_rows, num_files), "train": (num_rows, num_files),
             "eval": (eval_rows, eval_files)}
    written = {}
    for split, out_dir in dirs.items():
        rows, files = sizes[split]
        prepare_dir(out_dir, stale[split], log)
        names = [f"part-{i:05d}.parquet" for i in range(files)]
        # The marker goes first: a run killed halfway leaves a directory a rerun recognises.
        write_marker(out_dir, marker, names, rows, complete=False)
        bounds = np.linspace(0, rows, files + 1).round().astype(np.int64)
        written[split] = []
        for i, name in enumerate(names):
            path = os.path.join(out_dir, name)
            size = int(bounds[i + 1] - bounds[i])
            if announce:
                log(f"generating {path} ({size} rows)")
            table = table_of(size)
            pq.write_table(table, path, row_group_size=row_group_size)
            written[split].append(path)
            log(f"wrote {path} ({table.num_rows} rows{detail(table) if detail else ''})")
        write_marker(out_dir, marker, names, rows, complete=True)
    return written


def _whole_number(text: str) -> int:
    """``text`` as an int; integer-valued scientific notation (1e5) is accepted too."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 100000 or 1e5, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text}")
    return int(value)


def count(minimum: int = 1):
    """argparse type: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        value = _whole_number(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value
    return parse


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def output_dirs(output_dir: str, eval_rows: int, overwrite: bool, marker: str
                ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """The directories a run writes ({"train", "eval"} with ``eval_rows``, else {"data"})
    and each one's stale files; nothing is touched yet.

    Raises:
        GeneratorError: ``output_dir`` is a file, or a directory holds foreign files.
    """
    dirs = {"train": os.path.join(output_dir, "train"),
            "eval": os.path.join(output_dir, "eval")} if eval_rows else {"data": output_dir}
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise GeneratorError(f"{output_dir} is a file; --output_dir must name a directory")
    return dirs, {split: tuple(stale_files(d, overwrite, marker, splits=split == "data"))
                  for split, d in dirs.items()}


def generator_parser(name: str, description: str, marker: str, scale_default: float,
                     scale_help: str, eval_help: str) -> argparse.ArgumentParser:
    """A generator's command line: output, sizes, seed, scale, overwrite and quiet."""
    p = argparse.ArgumentParser(prog=f"python -m hashrec.tools.{name}",
                                description=description)
    p.add_argument("--output_dir", required=True,
                   help="where the parquet files go: a new or empty directory, or one an "
                        "earlier run wrote (its files are replaced); see --overwrite")
    p.add_argument("--num_rows", type=count(), required=True,
                   help="rows to write (training rows when --eval_rows is given); "
                        "whole numbers in e-notation such as 1e6 are accepted")
    p.add_argument("--num_files", type=count(), default=1,
                   help="parquet files of the training split, or of the one split without "
                        "--eval_rows (default 1); the eval split gets files in proportion "
                        "to its rows: round(num_files * eval_rows / num_rows), at least 1 "
                        "and at most num_files")
    p.add_argument("--seed", type=count(0), default=0,
                   help="random seed, a whole number >= 0 (default 0)")
    p.add_argument("--scale", type=positive_float, default=scale_default, help=scale_help)
    p.add_argument("--eval_rows", type=count(0), default=0, help=eval_help)
    p.add_argument("--row_group_size", type=count(), default=65536,
                   help="parquet row group size (default 65536)")
    p.add_argument("--overwrite", action="store_true",
                   help="also write into an output directory that holds files of its own: "
                        "its part-*.parquet files are deleted first, other files are kept. "
                        "Without it such a directory is refused; a directory holding only "
                        f"an earlier run's files (listed in its {marker}) is replaced "
                        "either way")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def run_generator(name: str, generate) -> int:
    """Runs ``generate()``; a GeneratorError becomes one error line and exit status 1."""
    try:
        generate()
    except GeneratorError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 1
    return 0
