"""Compiles the kernels the interpreted tests launch, for the GPU the project runs on.

The CPU tests run the Triton kernels in Triton's interpreter, which accepts code the
compiler refuses (a plain global read in a kernel, a tile shape the backend cannot
lower). This closes that gap without a GPU:

1. as a pytest plugin (``-p tests.compile_check`` with ``HASHREC_LAUNCH_LOG=FILE``),
   every interpreted ``fast_launch`` kernel launch is logged once: the kernel, its
   arguments' types (and whether each tensor is 16-byte aligned) and its constexpr
   values (``make test`` does this);
2. ``python -m tests.compile_check FILE`` then, in a process without the interpreter,
   compiles each distinct launch ahead of time to a cubin for sm_90 (the H100/H200),
   and fails naming every launch that does not compile.

Each launch compiles with the specializations Triton's launcher would give it on a
GPU: aligned tensors and integers divisible by 16 carry ``tt.divisibility``, integers
equal to 1 become constants (unless the kernel opts out). They matter: a row load
that vectorizes under them can fail to compile where the unspecialized one compiles.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time

_LOG_ENV = "HASHREC_LAUNCH_LOG"
_PER_KERNEL = 24  # distinct launches compiled per kernel at most
_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
           "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
           "bool": "i1"}


def _describe(value):
    import torch
    if isinstance(value, torch.Tensor):  # with whether Triton would take it as 16-byte aligned
        return ["tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16 == 0]
    if value is None or isinstance(value, (bool, int, float, str)):
        return ["value", value]
    raise TypeError(f"unlogged launch argument {type(value).__name__}")


def _kernel_name(kernel) -> tuple[str, str]:
    module = sys.modules[kernel.kernel.fn.__module__]
    for name, value in vars(module).items():
        if value is kernel:
            return module.__name__, name
    raise LookupError(f"{kernel.kernel.fn.__name__} is not a global of {module.__name__}")


def launch_entry(kernel, args: tuple, kwargs: dict) -> dict:
    """A ``fast_launch`` launch as logged: the kernel's module and name, its arguments
    described (``_describe``)."""
    module, name = _kernel_name(kernel)
    return {"module": module, "kernel": name, "args": [_describe(a) for a in args],
            "kwargs": {k: _describe(v) for k, v in kwargs.items()}}


_patched = False


def pytest_runtest_setup(item):  # noqa: ARG001 - the pytest hook's signature
    """Logs launches from the first test on: by then the test modules are imported, and
    each kernel module was built under the settings its tests chose."""
    install_launch_log()


def install_launch_log() -> None:
    """Appends each distinct interpreted launch of a project kernel to the file that
    ``HASHREC_LAUNCH_LOG`` names (nothing where it is unset); once a process. The test
    workers of several ranks call it too, so that their launches are compiled as well."""
    global _patched
    path = os.environ.get(_LOG_ENV)
    if _patched or not path:
        return
    _patched = True
    from hashrec.table.ops.launch import FastKernel
    launch = FastKernel.launch
    seen = set()

    def logged(self, grid, args, kwargs):
        # Interpreted launches of the project's kernels (compiled ones need no check).
        if not self._enabled and self.kernel.fn.__module__.startswith("hashrec."):
            try:
                entry = json.dumps(launch_entry(self, args, kwargs), sort_keys=True)
            except (TypeError, LookupError) as err:
                entry = json.dumps({"error": str(err)})
            if entry not in seen:
                seen.add(entry)
                with open(path, "a") as f:
                    f.write(entry + "\n")
        return launch(self, grid, args, kwargs)

    FastKernel.launch = logged


_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _source(entry: dict):
    """(ASTSource, compile options) of one logged launch."""
    import importlib

    from triton.compiler import ASTSource
    fn = getattr(importlib.import_module(entry["module"]), entry["kernel"]).kernel
    bound = dict(zip(fn.arg_names, entry["args"]))
    bound.update({k: v for k, v in entry["kwargs"].items() if k not in _OPTIONS})
    signature, constexprs, attrs = {}, {}, {}
    for param in fn.params:
        kind, value, *aligned = bound.get(param.name, ["value", param.default])
        specialize = not param.do_not_specialize
        on_alignment = specialize and not param.do_not_specialize_on_alignment
        if param.is_constexpr or kind == "value" and (value is None or isinstance(value, str)):
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif kind == "tensor":
            signature[param.name] = "*" + _DTYPES[value]
            if on_alignment and aligned and aligned[0]:
                attrs[(param.num,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int) and value == 1 and specialize:
            signature[param.name], constexprs[param.name] = "constexpr", 1
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if on_alignment and value % 16 == 0:
                attrs[(param.num,)] = [["tt.divisibility", 16]]
        else:
            signature[param.name] = "fp32"
    options = {k: v[1] for k, v in entry["kwargs"].items() if k in _OPTIONS}
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), options


def _int_class(value: int) -> int:
    """A stand-in for an int argument that Triton specializes the same way (== 1,
    divisible by 16, 32 or 64 bits): launches that differ in sizes alone compile once."""
    if value == 1:
        return 1
    small = -2 ** 31 <= value < 2 ** 31
    if value % 16 == 0:
        return 16 if small else 2 ** 40
    return 3 if small else 2 ** 40 + 1


def _normalized(entry: dict) -> dict:
    import importlib
    fn = getattr(importlib.import_module(entry["module"]), entry["kernel"]).kernel
    args = [[kind, _int_class(value)] if kind == "value" and type(value) is int
            and not param.is_constexpr else [kind, value, *rest]
            for param, (kind, value, *rest) in zip(fn.params, entry["args"])]
    return {**entry, "args": args}


def _entries(path: str) -> tuple[list[dict], list[str]]:
    """The distinct launches of a log (at most ``_PER_KERNEL`` a kernel, those with
    constexprs not seen before first), and the log's errors."""
    distinct, errors = {}, []
    with open(path) as f:
        for line in f:
            entry = json.loads(line)
            if "error" in entry:
                errors.append(entry["error"])
                continue
            entry = _normalized(entry)
            distinct.setdefault(json.dumps(entry, sort_keys=True), entry)
    per_kernel: dict[tuple, list[dict]] = {}
    for entry in distinct.values():
        per_kernel.setdefault((entry["module"], entry["kernel"]), []).append(entry)
    entries = []
    for group in per_kernel.values():
        seen, first, rest = set(), [], []
        for entry in group:
            key = json.dumps(entry["kwargs"], sort_keys=True)
            (rest if key in seen else first).append(entry)
            seen.add(key)
        entries += (first + rest)[:_PER_KERNEL]
    return entries, sorted(set(errors))


def _project_kernels() -> set[tuple[str, str]]:
    """(module, name) of every ``fast_launch`` kernel of the package."""
    import importlib
    import pkgutil

    import hashrec
    from hashrec.table.ops.launch import FastKernel
    kernels = set()
    for info in pkgutil.walk_packages(hashrec.__path__, "hashrec."):
        module = importlib.import_module(info.name)
        kernels |= {(module.__name__, name) for name, value in vars(module).items()
                    if isinstance(value, FastKernel)
                    and value.kernel.fn.__module__ == module.__name__}
    return kernels


def _summary(message: str) -> str:
    """First and last lines of a compiler error (where, and what)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""


def _compile(entry: dict, arch: int) -> str | None:
    """None when the launch compiles, else what failed."""
    import triton
    from triton.backends.compiler import GPUTarget
    try:
        source, options = _source(entry)
        triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        return None
    except Exception as err:  # noqa: BLE001 - every failure is reported
        constexprs = {k: v[1] for k, v in entry["kwargs"].items()}
        return (f"{entry['module']}.{entry['kernel']} {json.dumps(constexprs)}: "
                f"{type(err).__name__}: {_summary(str(err))}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="the launch log the plugin wrote")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (default 90)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    args = p.parse_args(argv)
    if not os.path.exists(args.log) or os.path.getsize(args.log) == 0:
        import torch
        if not torch.cuda.is_available():  # the CPU tests always interpret kernels
            p.error(f"{args.log} logs no launch: run the tests with -p tests.compile_check "
                    f"and {_LOG_ENV} set")
        # On a GPU the tests run the kernels compiled: nothing was interpreted.
        print(f"compile check: {args.log} logs no interpreted launch; nothing to compile")
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("run without TRITON_INTERPRET=1: the kernels must be compiled, not interpreted")
    entries, failures = _entries(args.log)
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        results = pool.map(_compile, entries, [args.arch] * len(entries))
        for i, failure in enumerate(results, 1):
            if failure:
                failures.append(failure)
            if i % 50 == 0 or i == len(entries):
                print(f"compile check: {i}/{len(entries)} launches, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    unlaunched = sorted(_project_kernels() - {(e["module"], e["kernel"]) for e in entries})
    if unlaunched:
        print("compile check: not launched by the tests, so not checked:",
              ", ".join(f"{m}.{k}" for m, k in unlaunched))
    for failure in failures:
        print("FAILED", failure)
    print(f"compile check: {len(entries) - len(failures)} of {len(entries)} launches compile "
          f"for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
