"""Which Triton kernels compile during a training run, when, for how long and why.

Runs the demo (``hashrec.tools.demo``; its arguments pass through) on the GPU with
Triton's compiler timed: every compile is recorded with the training step it fell in
(``setup`` before the first, ``after`` past the last: evaluation, checkpoint), its
seconds, and, for a kernel compiled before, what set the new variant apart from the
nearest earlier one: an argument's 16-byte alignment (pointers) or divisibility by 16
(integers), a type, or a compile-time constant. Steps are timed to the device's end.

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/compile_trace.py --out OUT/trace \\
        -- --work_dir DIR

A warm kernel cache loads compiled kernels from disk: those loads are recorded too, and
take milliseconds. Writes OUT.json (every compile and step) and OUT.md (a summary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from hashrec.tools import demo  # noqa: E402
from hashrec.train.loop import TrainLoop  # noqa: E402

PHASE = {"name": "setup", "step": 0}
COMPILES: list[dict] = []
STEPS: list[dict] = []
SEEN: dict[str, list[dict]] = {}


def _features(fn: JITFunction, signature: dict, constexprs: dict, attrs: dict) -> dict:
    """Argument name -> what the variant compiled for it."""
    names = fn.arg_names
    out = {name: str(kind) for name, kind in signature.items() if kind != "constexpr"}
    for path, value in constexprs.items():
        out[names[path[0]]] = repr(value)
    for path, value in attrs.items():
        out[names[path[0]]] = f"{out.get(names[path[0]], '')} {value}".strip()
    return out


def _diff(name: str, features: dict) -> list[str]:
    earlier = SEEN.get(name, [])
    if not earlier:
        return []
    nearest = min(earlier, key=lambda e: sum(e.get(k) != v for k, v in features.items()))
    return [f"{k}: {nearest.get(k)} -> {v}" for k, v in sorted(features.items())
            if nearest.get(k) != v]


def _traced_compile(original):
    def compile_(self, key, signature, device, constexprs, options, attrs, warmup):
        start = time.perf_counter()
        kernel = original(self, key, signature, device, constexprs, options, attrs, warmup)
        if hasattr(kernel, "result"):
            kernel = kernel.result()
        seconds = time.perf_counter() - start
        features = _features(self, signature, constexprs, attrs)
        name = self.fn.__name__
        COMPILES.append({"kernel": name, "module": self.fn.__module__, "phase": PHASE["name"],
                         "step": PHASE["step"], "seconds": round(seconds, 4),
                         "differs": _diff(name, features), "variant": len(SEEN.get(name, [])) + 1})
        SEEN.setdefault(name, []).append(features)
        return kernel
    return compile_


def _traced_step(original):
    def train_step(self, batch, *args, **kwargs):
        PHASE["step"] += 1
        PHASE["name"] = "train"
        torch.cuda.synchronize()
        start = time.perf_counter()
        compiled = len(COMPILES)
        out = original(self, batch, *args, **kwargs)
        torch.cuda.synchronize()
        STEPS.append({"step": PHASE["step"], "batch": batch.batch_size,
                      "seconds": round(time.perf_counter() - start, 4),
                      "compiles": len(COMPILES) - compiled})
        PHASE["name"] = "after"
        return out
    return train_step


def summary(compiles: list[dict], steps: list[dict], argv: list[str]) -> str:
    def phase_of(c):
        return "step 1" if c["phase"] == "train" and c["step"] == 1 else \
            "later steps" if c["phase"] == "train" else c["phase"]
    lines = [f"Demo arguments: `{' '.join(argv)}`", "",
             "| when | compiles | seconds |", "| --- | --- | --- |"]
    for when in ("setup", "step 1", "later steps", "after"):
        picked = [c for c in compiles if phase_of(c) == when]
        lines.append(f"| {when} | {len(picked)} | {sum(c['seconds'] for c in picked):.1f} |")
    lines += ["", "Steps that compiled (after the first):", "",
              "| step | batch | step seconds | compiles |", "| --- | --- | --- | --- |"]
    lines += [f"| {s['step']} | {s['batch']} | {s['seconds']:.2f} | {s['compiles']} |"
              for s in steps if s["compiles"] and s["step"] > 1]
    lines += ["", "Compiles of a kernel's second or later variant (what differs from the "
              "nearest earlier one):", "", "| when | kernel | variant | seconds | differs |",
              "| --- | --- | --- | --- | --- |"]
    for c in compiles:
        if c["variant"] > 1:
            where = f"step {c['step']}" if c["phase"] == "train" else c["phase"]
            lines.append(f"| {where} | {c['kernel']} | {c['variant']} | {c['seconds']:.2f} | "
                         f"{'; '.join(c['differs'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output path without extension")
    parser.add_argument("demo_args", nargs=argparse.REMAINDER,
                        help="after --: the demo's arguments")
    args = parser.parse_args(argv)
    demo_args = [a for a in args.demo_args if a != "--"]
    if not torch.cuda.is_available():
        print("compile_trace needs a GPU (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    JITFunction._do_compile = _traced_compile(JITFunction._do_compile)
    TrainLoop.train_step = _traced_step(TrainLoop.train_step)
    rc = demo.main(demo_args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    record = {"argv": demo_args, "rc": rc, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "compiles": COMPILES, "steps": STEPS}
    with open(args.out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(summary(COMPILES, STEPS, demo_args))
    print(summary(COMPILES, STEPS, demo_args))
    return rc


if __name__ == "__main__":
    sys.exit(main())
