"""What each kernel's unspecialized arguments cost in compiled code, on sm_90, without a GPU.

Kernels take some arguments unspecialized (``do_not_specialize``: an integer's
divisibility by 16; ``do_not_specialize_on_alignment``: a pointer's 16-byte alignment)
so that sizes and offsets that follow the data compile no variant of their own. This
compiles a logged launch of each such kernel (the last one ``make test`` logged in
``build/launches.jsonl``, at the tests' shapes) twice with Triton: as it is, and with those
arguments taken as divisible by 16 (aligned), then reads registers, stack bytes, SASS
instructions and local-memory loads and stores off the cubin with Triton's bundled
``cuobjdump``. A difference says the specialization changes the code; only a GPU says
what it costs in time.

    python benchmarks/specialization_cost.py build/launches.jsonl --out OUT/specialization_cost
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SKIP = {"dim", "src_stride", "groups", "chunks", "low", "shift"}  # per-table constants


def _usage(source, options: dict, tools: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path],
                             capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path],
                              capture_output=True, text=True, check=True).stdout
    return {"registers": int(re.search(r"REG:(\d+)", res).group(1)),
            "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
            "sass": len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M)),
            "local": len(re.findall(r"\b(?:STL|LDL)\b", sass))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="launch log of the interpreted tests (build/launches.jsonl)")
    p.add_argument("--out", help="path prefix for .json and .md")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("run without TRITON_INTERPRET=1: the kernels must be compiled")

    import triton
    from triton.compiler import ASTSource

    from tests.compile_check import _normalized, _project_kernels, _source
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    last: dict[tuple[str, str], dict] = {}
    with open(args.log) as f:
        for line in f:
            entry = json.loads(line)
            if "error" not in entry:
                last[(entry["module"], entry["kernel"])] = entry
    rows = []
    for module, name in sorted(_project_kernels()):
        entry = last.get((module, name))
        if entry is None:
            continue
        source, options = _source(_normalized(entry))
        fn = source.fn
        params = [q for q in fn.params if q.name not in _SKIP and not q.is_constexpr
                  and (q.do_not_specialize or q.do_not_specialize_on_alignment)
                  and source.signature.get(q.name, "").startswith(("*", "i"))
                  and source.signature.get(q.name) != "i1"]
        if not params:
            continue
        attrs = dict(source.attrs)
        for q in params:
            attrs[(q.num,)] = [["tt.divisibility", 16]]
        specialized = ASTSource(fn=fn, signature=source.signature,
                                constexprs=source.constants, attrs=attrs)
        row = {"kernel": f"{module}.{name}", "arguments": [q.name for q in params],
               "unspecialized": _usage(source, options, tools),
               "specialized": _usage(specialized, options, tools)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        import datetime
        with open(args.out + ".json", "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "triton": triton.__version__, "rows": rows}, f, indent=1)
        lines = ["| kernel | arguments | unspecialized: registers / stack B / SASS / local "
                 "| taken as divisible or aligned |", "| --- | --- | --- | --- |"]
        for row in rows:
            u, s = row["unspecialized"], row["specialized"]
            lines.append(f"| {row['kernel']} | {', '.join(row['arguments'])} | "
                         f"{u['registers']} / {u['stack']} / {u['sass']} / {u['local']} | "
                         f"{s['registers']} / {s['stack']} / {s['sass']} / {s['local']} |")
        with open(args.out + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
