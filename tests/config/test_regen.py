"""The committed generated code matches the .proto files and imports portably."""

from __future__ import annotations

import sys

import pytest

from hashrec.config import regen


def test_committed_code_is_fresh():
    pytest.importorskip("grpc_tools")
    stale = regen.stale_modules(regen.generate())
    assert stale == [], f"run python -m hashrec.config.regen (stale: {stale})"


def test_without_grpcio_tools_the_command_says_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # as if not installed
    assert regen.main(["--check"]) == 1
    assert capsys.readouterr().err == (
        "python -m hashrec.config.regen: error: regenerating the config code needs "
        "grpcio-tools, which is not installed; pip install grpcio-tools\n")


def test_generated_code_has_no_runtime_version_check():
    for path in regen.CONFIG_DIR.glob("*_pb2.py"):
        assert "ValidateProtobufRuntimeVersion" not in path.read_text(), path.name


def test_make_portable_strips_the_check():
    source = ("from google.protobuf import descriptor as _descriptor\n"
              "from google.protobuf import runtime_version as _runtime_version\n"
              "_runtime_version.ValidateProtobufRuntimeVersion(\n"
              "    _runtime_version.Domain.PUBLIC,\n    7,\n    35,\n    1,\n    '',\n"
              "    'x.proto'\n)\n"
              "DESCRIPTOR = 1\n")
    assert regen.make_portable(source) == ("from google.protobuf import descriptor as "
                                           "_descriptor\nDESCRIPTOR = 1\n")
