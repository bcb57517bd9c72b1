"""Compiled Triton kernels may read only constexpr globals (and jit functions, modules).

The interpreter the CPU tests run under accepts any global, so a plain ``X = 5`` read
inside a ``@triton.jit`` body passes there and fails to compile on a GPU. This check
reads every kernel's source and holds the compiled rule on the CPU.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import hashrec  # noqa: E402
from hashrec.table.ops.launch import FastKernel  # noqa: E402


def _jit_modules():
    for info in pkgutil.walk_packages(hashrec.__path__, "hashrec."):
        if info.name == "hashrec.table.ops.launch":  # the launcher; it defines no kernel
            continue
        spec = importlib.util.find_spec(info.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as f:
            if "triton.jit" in f.read():
                yield info.name


def _jit_functions(module):
    for value in vars(module).values():
        fn = value.kernel if isinstance(value, FastKernel) else value
        # JITFunction, or InterpretedFunction when imported under TRITON_INTERPRET=1
        if isinstance(fn, triton.runtime.jit.KernelInterface) \
                and getattr(fn, "fn", None) is not None and fn.fn.__module__ == module.__name__:
            yield fn.fn


def _local_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _allowed(value) -> bool:
    return isinstance(value, (types.ModuleType, tl.constexpr, triton.runtime.jit.KernelInterface,
                              type)) or callable(value)


def _bad_globals(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    local = _local_names(tree)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                and node.id not in local and node.id in fn.__globals__ \
                and not _allowed(fn.__globals__[node.id]):
            bad.append(node.id)
    return sorted(set(bad))


MODULES = sorted(_jit_modules())


def test_kernel_modules_are_found():
    assert "hashrec.table.ops.find.triton" in MODULES
    assert "hashrec.table.ops.insert.upsert_block" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_kernels_read_only_constexpr_globals(name):
    module = importlib.import_module(name)
    functions = list(_jit_functions(module))
    assert functions, f"{name} mentions triton.jit but defines no kernel"
    bad = {fn.__name__: names for fn in functions if (names := _bad_globals(fn))}
    assert not bad, f"{name}: kernels read non-constexpr globals {bad}"
