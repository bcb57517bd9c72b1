"""Which kernel variants a run compiles after its first step, without a GPU.

``LaunchLog`` records every interpreted ``fast_launch`` launch with the step it fell in;
``late_variants`` (run in a process without the interpreter, ``late_variants_of``) gives
each launch the specialization the GPU launcher would (``compile_check._source``) and
names those after step 0 that differ from an earlier launch of the same kernel, types
and constexprs only in ``tt.divisibility``: a pointer's 16-byte alignment or an
integer's divisibility by 16, each of which Triton compiles anew.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Kernel arguments allowed to add a variant after the first step, by (module, kernel), with
# the reason at the kernel: none now.
ALLOWED: dict[tuple[str, str], set[str]] = {}


class LaunchLog:
    """Patches ``FastKernel.launch`` (through ``monkeypatch``, or for good in a worker
    process) to log each distinct launch with ``self.step`` into ``path``."""

    def __init__(self, path: str, monkeypatch=None) -> None:
        from hashrec.table.ops.launch import FastKernel
        from tests.compile_check import launch_entry
        self.path, self.step, self._lines = path, 0, {}
        launch = FastKernel.launch

        def logged(kernel, grid, args, kwargs):
            line = json.dumps({**launch_entry(kernel, args, kwargs), "step": self.step},
                              sort_keys=True)
            self._lines.setdefault(line, None)
            return launch(kernel, grid, args, kwargs)

        if monkeypatch is not None:
            monkeypatch.setattr(FastKernel, "launch", logged)
        else:
            FastKernel.launch = logged

    def write(self) -> set[int]:
        """Writes the log; returns the steps it holds."""
        with open(self.path, "w") as f:
            f.write("".join(line + "\n" for line in self._lines))
        return {json.loads(line)["step"] for line in self._lines}


def late_variants(paths: list[str], allowed: dict[tuple[str, str], set[str]]) -> list[str]:
    """Launches of the logs after step 0 that add a variant by alignment or divisibility
    alone (``allowed``: (module, kernel) -> argument names left out of the comparison)."""
    from tests.compile_check import _source
    late = []
    for path in paths:
        seen: dict[str, list[list[str]]] = {}
        with open(path) as f:
            for line in f:
                entry = json.loads(line)
                source, options = _source(entry)
                names = source.fn.arg_names
                skip = allowed.get((entry["module"], entry["kernel"]), set())
                attrs = sorted(names[k[0]] for k in source.attrs if names[k[0]] not in skip)
                key = json.dumps([entry["module"], entry["kernel"], source.signature,
                                  sorted((names[k[0]], repr(v))
                                         for k, v in source.constants.items()
                                         if names[k[0]] not in skip),
                                  sorted(options.items())], sort_keys=True)
                variants = seen.setdefault(key, [])
                if variants and attrs not in variants and entry["step"] > 0:
                    differs = sorted(set(variants[0]) ^ set(attrs))
                    late.append(f"step {entry['step']} {entry['kernel']}: {differs}")
                if attrs not in variants:
                    variants.append(attrs)
    return late


def late_variants_of(paths: list[str], allowed: dict[tuple[str, str], set[str]]
                     ) -> list[str]:
    """``late_variants`` in a process without the interpreter (kernels as the GPU has them)."""
    script = ("import json, sys\n"
              "from tests.kernel_variants import late_variants\n"
              "allowed = {tuple(k): set(v) for k, v in json.loads(sys.argv[2])}\n"
              "print(json.dumps(late_variants(json.loads(sys.argv[1]), allowed)))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                            "HASHREC_FORCE_TRITON")}
    run = subprocess.run([sys.executable, "-c", script, json.dumps([str(p) for p in paths]),
                          json.dumps([[list(k), sorted(v)] for k, v in allowed.items()])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if run.returncode:
        raise RuntimeError(run.stderr)
    return json.loads(run.stdout)
