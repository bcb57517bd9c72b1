"""Regenerate the committed ``*_pb2.py`` modules from the ``.proto`` files.

Run from anywhere (needs ``grpcio-tools``, which ``make test`` does not install:
``pip install grpcio-tools``; without it the tests skip the staleness check)::

    python -m hashrec.config.regen            # rewrite hashrec/config/*_pb2.py
    python -m hashrec.config.regen --check    # exit 1 when the committed code is stale

Recent ``protoc`` releases emit a ``ValidateProtobufRuntimeVersion`` call that
refuses to import under an older protobuf runtime (and ``runtime_version``
does not exist before protobuf 5.26). The generated code itself only needs
``descriptor_pool.AddSerializedFile`` and the ``builder`` helpers, present
since protobuf 4.21, so :func:`make_portable` removes that check; the
committed modules then import on every protobuf >= 4.25 that the package
supports.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
REPO_ROOT = CONFIG_DIR.parent.parent

_RUNTIME_IMPORT = re.compile(r"^from google\.protobuf import runtime_version as _runtime_version\n",
                             re.MULTILINE)
_RUNTIME_CHECK = re.compile(r"^_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:  .*\n)*?\)\n",
                            re.MULTILINE)
_VERSION_LINES = re.compile(r"^# (?:NO CHECKED-IN PROTOBUF GENCODE|Protobuf Python Version: .*)\n",
                            re.MULTILINE)


class RegenError(RuntimeError):
    """The generated code cannot be made here (no grpcio-tools, protoc failed)."""


def proto_files() -> list[Path]:
    """The schema's ``.proto`` files, sorted."""
    return sorted(CONFIG_DIR.glob("*.proto"))


def make_portable(source: str) -> str:
    """Strip the runtime-version check (and the comment lines naming the compiler version)."""
    source = _RUNTIME_IMPORT.sub("", source)
    source = _RUNTIME_CHECK.sub("", source)
    source = _VERSION_LINES.sub("", source)
    if "_runtime_version" in source:
        raise RuntimeError("protoc output changed shape: a runtime version reference survived; "
                           "update hashrec.config.regen.make_portable")
    return source


def generate() -> dict[str, str]:
    """Compile every ``.proto`` with grpc_tools' protoc: {module file name: portable source}.

    Raises:
        RegenError: grpcio-tools is not installed, or protoc failed.
    """
    try:
        from grpc_tools import protoc
    except ImportError:
        raise RegenError("regenerating the config code needs grpcio-tools, which is not "
                         "installed; pip install grpcio-tools") from None
    with tempfile.TemporaryDirectory() as out:
        # grpc_tools ships the well-known types (google/protobuf/struct.proto)
        well_known = Path(protoc.__file__).resolve().parent / "_proto"
        args = ["protoc", f"-I{REPO_ROOT}", f"-I{well_known}", f"--python_out={out}"]
        args += [str(p.relative_to(REPO_ROOT)) for p in proto_files()]
        if protoc.main(args) != 0:
            raise RegenError(f"protoc failed on {[p.name for p in proto_files()]} (its "
                             f"messages are above)")
        generated = Path(out) / CONFIG_DIR.relative_to(REPO_ROOT)
        return {p.name: make_portable(p.read_text()) for p in sorted(generated.glob("*_pb2.py"))}


def stale_modules(generated: dict[str, str]) -> list[str]:
    """Names of committed modules that differ from ``generated`` (or are missing/extra)."""
    committed = {p.name for p in CONFIG_DIR.glob("*_pb2.py")}
    stale = [name for name, text in generated.items()
             if not (CONFIG_DIR / name).exists() or (CONFIG_DIR / name).read_text() != text]
    return sorted(stale + sorted(committed - set(generated)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hashrec.config.regen",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report stale modules; exit 1 if any")
    args = parser.parse_args(argv)
    try:
        generated = generate()
    except RegenError as err:
        print(f"python -m hashrec.config.regen: error: {err}", file=sys.stderr)
        return 1
    stale = stale_modules(generated)
    if args.check:
        if stale:
            print(f"stale generated modules: {stale}; run python -m hashrec.config.regen")
            return 1
        print("generated modules are up to date")
        return 0
    for name, text in generated.items():
        (CONFIG_DIR / name).write_text(text)
    for name in set(p.name for p in CONFIG_DIR.glob("*_pb2.py")) - set(generated):
        (CONFIG_DIR / name).unlink()
    print(f"wrote {sorted(generated)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
