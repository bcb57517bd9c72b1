"""Where the host's time goes: a sampling profiler of Python stacks.

``HostSampler`` samples the Python stacks of every other thread (the training
thread and the autograd engine's) every ``interval_s`` while it runs, and
attributes each sample to the innermost frame inside the project's own code
(its "self" line) and to every project function on the stack ("inclusive").
Unlike ``torch.profiler`` it adds almost nothing to each operator, so the shares
it reports are those of an unprofiled step. While a sample is taken the sampled
thread is between bytecodes or inside a call that released the GIL (most torch
operators do), so time inside such a call is charged to the line that made it.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_PACKAGE = os.path.join(_ROOT, "hashrec") + os.sep


def _own(filename: str) -> bool:
    return filename.startswith(_PACKAGE)


def _short(code, line: int) -> str:
    name = code.co_filename
    where = os.path.relpath(name, _ROOT) if name.startswith(_PACKAGE) else \
        "/".join(name.split("/")[-2:])
    return f"{where}:{line} {code.co_name}"


class HostSampler:
    """Samples other threads' stacks on a background thread (``with`` block)."""

    def __init__(self, interval_s: float = 0.0002) -> None:
        self.interval_s = interval_s
        self.ticks = 0
        self.samples = 0
        self.self_lines: collections.Counter = collections.Counter()
        self.inclusive: collections.Counter = collections.Counter()
        self.outside = collections.Counter()  # innermost frame when no project frame
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self._switch = None

    def __enter__(self) -> HostSampler:
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval_s / 2)  # let the sampler take the GIL often
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def _run(self) -> None:
        me, main = threading.get_ident(), threading.main_thread().ident
        while not self._stop.is_set():
            self.ticks += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                label = "main" if ident == main else names.get(ident, "other").split(" ")[-1]
                self._record(label, frame)
            time.sleep(self.interval_s)

    def _record(self, label: str, frame) -> None:
        innermost, seen, first = None, set(), frame
        while frame is not None:
            code = frame.f_code
            if _own(code.co_filename):
                if innermost is None:
                    innermost = f"[{label}] {_short(code, frame.f_lineno)}"
                name = f"{os.path.relpath(code.co_filename, _ROOT)} {code.co_qualname}" \
                    if hasattr(code, "co_qualname") else _short(code, code.co_firstlineno)
                seen.add(f"[{label}] {name}")
            frame = frame.f_back
        if innermost is None:
            # A thread outside the project's code: waiting threads (queues, events) are
            # idle; keep their innermost frame apart.
            self.outside[f"[{label}] {_short(first.f_code, first.f_lineno)}"] += 1
            return
        self.samples += 1
        self.self_lines[innermost] += 1
        for name in seen:
            self.inclusive[name] += 1

    def report(self, wall_s: float, steps: int, top: int = 40) -> dict:
        """Top lines (self) and functions (inclusive) per thread, in ms per step (each
        sampling round stands for the wall time over the rounds)."""
        ms_per_sample = wall_s * 1000.0 / max(self.ticks, 1) / steps

        def rows(counter):
            return [{"where": k, "samples": n, "ms_per_step": n * ms_per_sample}
                    for k, n in counter.most_common(top)]
        return {"samples": self.samples, "rounds": self.ticks, "self": rows(self.self_lines),
                "inclusive": rows(self.inclusive), "outside": rows(self.outside)[:10]}
