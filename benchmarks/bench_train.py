"""End-to-end training throughput of the example configs on generated data.

Generates Taobao-like parquet at scale 1 (``hashrec.tools.gen_taobao_data``;
reused when present), then trains the MultiTowerDIN dynamicemb example config and
the num_buckets example config (``--configs`` adds the MMoE and WideAndDeep
examples, ``mmoe`` and ``wide_and_deep``, the DLRM example ``dlrm`` on Criteo-like
data, generated the same way at the example's scale, and the DLRM HSTU example
``dlrm_hstu`` on KuaiRand-like data, with its baseline ``dlrm_hstu_num_buckets``: the same
config with every dynamicemb table a num_buckets table of the same dim sized to the data's
id range, and the HSTU match example ``hstu_match`` on Taobao-like data with the generator's
item table for its negative sampler, with ``hstu_match_num_buckets`` sized as the num_buckets
example's tables) in the same run through the real trainer
(``hashrec.train_eval``) with step timing on (``HASHREC_STEP_TIMING``). Each run
reports samples/s after warm-up (the first ``--warmup_steps`` steps are left
out), the per-phase milliseconds per step (data wait, embedding forward,
dense forward, dense and embedding backward, optimizer, logging), and under
several GPUs the all-to-all time per step from the progress log. Writes
``train_<device>.json`` and ``.md`` to ``--out_dir`` with the command, date, GPU
and versions, and the dynamicemb / num_buckets throughput ratio (of dlrm_hstu too).

Usage::

    python benchmarks/bench_train.py --out_dir benchmarks/results
    python benchmarks/bench_train.py --nproc 2          # launches torchrun per config
    torchrun --nproc_per_node 2 benchmarks/bench_train.py   # same, already launched
    python benchmarks/bench_train.py --smoke            # tiny CPU run (a minute or less)
    python benchmarks/bench_train.py --configs dlrm_hstu  # the DLRM HSTU pair alone
    python benchmarks/bench_train.py --configs hstu_match  # HSTU match and its twin
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "dynamicemb": os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config"),
    "num_buckets": os.path.join(ROOT, "examples", "multi_tower_din_taobao.config"),
    "mmoe": os.path.join(ROOT, "examples", "mmoe_taobao_dynamicemb.config"),
    "wide_and_deep": os.path.join(ROOT, "examples", "wide_and_deep_taobao_dynamicemb.config"),
    "dlrm": os.path.join(ROOT, "examples", "dlrm_criteo_dynamicemb.config"),
    "dlrm_hstu": os.path.join(ROOT, "examples", "dlrm_hstu_kuairand_dynamicemb.config"),
    "hstu_match": os.path.join(ROOT, "examples", "hstu_match_taobao_dynamicemb.config"),
}
# The data each config trains on (Taobao-like unless named here).
CRITEO = ("dlrm",)
KUAIRAND = ("dlrm_hstu",)
# Taobao-like data with the generator's item table, which their negative samplers read.
ITEMS = ("hstu_match",)
# A config's num_buckets baseline, trained after it in the same run (its config built from
# the config's, see ``num_buckets_config``).
BASELINES = {"dlrm_hstu": "dlrm_hstu_num_buckets", "hstu_match": "hstu_match_num_buckets"}
TIMING_FILE = "step_timing.json"
A2A_PATTERN = re.compile(r"step (\d+) \|.*\| a2a ([0-9.]+) ms/step")
PHASE_ORDER = ("data_wait", "embedding_forward", "dense_forward", "dense_backward",
               "embedding_backward", "optimizer", "logging", "step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--data_dir", default=None,
                   help="parquet folder (default: data/bench_train_<rows> in the repository)")
    p.add_argument("--num_rows", type=int, default=2_000_000, help="generated training rows")
    p.add_argument("--num_files", type=int, default=16)
    p.add_argument("--kuairand_rows", type=int, default=300_000,
                   help="generated KuaiRand-like rows for dlrm_hstu (its --num_rows samples "
                        "loop over them)")
    p.add_argument("--batch_size", type=int, default=8192, help="per GPU (per rank)")
    p.add_argument("--num_steps", type=int, default=0,
                   help="steps per config (default: one pass over the rows)")
    p.add_argument("--warmup_steps", type=int, default=20)
    p.add_argument("--log_every", type=int, default=50)
    p.add_argument("--num_workers", type=int, default=None,
                   help="data loader workers per rank (default: HASHREC_BENCH_WORKERS if set, "
                        "else from the CPU count)")
    p.add_argument("--sequence_format", default="list", choices=("list", "string"),
                   help="how generated data stores the behaviour sequences (parquet "
                        "list<int64>, or IDs joined by '|'); existing data is reused as is")
    p.add_argument("--mixed_precision", default=None, choices=("BF16", "FP16", "FP32"),
                   help="default BF16 (FP32 with --smoke: BF16 is slow on CPUs)")
    p.add_argument("--configs", default="dynamicemb,num_buckets",
                   help=f"comma-separated subset of {sorted(CONFIGS)}")
    p.add_argument("--nproc", type=int, default=1,
                   help="GPUs: > 1 launches torchrun --nproc_per_node for every config")
    p.add_argument("--smoke", action="store_true",
                   help="tiny CPU run: 20000 rows, batch 256, 8 steps, 0 workers")
    args = p.parse_args(argv)
    if args.smoke:
        args.num_rows, args.batch_size = min(args.num_rows, 20_000), min(args.batch_size, 256)
        args.kuairand_rows = min(args.kuairand_rows, args.num_rows)
        args.num_steps = args.num_steps or 8
        args.warmup_steps, args.log_every, args.num_files = 3, 4, 2
        args.num_workers = 0 if args.num_workers is None else args.num_workers
        args.mixed_precision = args.mixed_precision or "FP32"
    args.mixed_precision = args.mixed_precision or "BF16"
    for name in args.configs.split(","):
        if name not in CONFIGS:
            p.error(f"--configs: {name!r} is not one of {sorted(CONFIGS)}")
    return args


def log(message: str) -> None:
    print(f"[bench_train {time.strftime('%H:%M:%S')}] {message}", flush=True)


def world() -> tuple[int, int]:
    """(rank, world_size) when this script itself runs under torchrun."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def default_workers(nproc: int) -> int:
    """Loader workers per rank: the CPUs less two per rank for the training processes, at
    most 8 (enough for the target rate; on a 32-core host more workers slowed the
    training process: the num_buckets config on sequences stored as strings ran at
    679k / 623k / 570k samples/s with 8 / 12 / 16 workers,
    ``results/train_gpu_num_buckets_workers*.md``)."""
    if os.environ.get("HASHREC_BENCH_WORKERS"):  # A/B runs of another worker count
        return int(os.environ["HASHREC_BENCH_WORKERS"])
    cpus = os.cpu_count() or 2
    return max(0, min(8, cpus // max(nproc, 1) - 2))


def ensure_data(args, kind: str = "taobao") -> str:
    """Training parquet folder, generated unless it already holds parquet files: Taobao-like
    (``--data_dir``, else generated at scale 1), Criteo-like (``criteo``: generated at
    the generator's default scale, which the DLRM example's capacities fit) or KuaiRand-like
    (``kuairand``: ``--kuairand_rows`` rows at the generator's default scale) or
    Taobao-like with an item table (``taobao_items``: ``train`` and ``items`` below the
    folder)."""
    rows = args.kuairand_rows if kind == "kuairand" else args.num_rows
    if kind == "taobao":
        folder = args.data_dir or os.path.join(ROOT, "data", f"bench_train_{rows}")
    else:
        folder = os.path.join(ROOT, "data", f"bench_train_{kind}_{rows}")
    train = os.path.join(folder, "train") if kind == "taobao_items" else folder
    done = os.path.join(folder, "_COMPLETE")
    rank, _ = world()
    present = os.path.exists(done) or bool(args.data_dir and kind == "taobao"
                                           and _has_parquet(folder))
    if rank != 0:
        while not present and not os.path.exists(done):
            time.sleep(1.0)
        return train
    if present:
        log(f"reusing data in {folder}")
        return train
    names = {"taobao": "Taobao", "criteo": "Criteo", "kuairand": "KuaiRand",
             "taobao_items": "Taobao"}
    log(f"generating {rows} {names[kind]}-like rows into {folder}")
    start = time.perf_counter()
    generator = {"taobao": ["hashrec.tools.gen_taobao_data", "--scale", "1",
                            "--sequence_format", args.sequence_format],
                 "criteo": ["hashrec.tools.gen_criteo_data", "--overwrite"],
                 "kuairand": ["hashrec.tools.gen_kuairand_data", "--overwrite"],
                 "taobao_items": ["hashrec.tools.gen_taobao_data", "--scale", "1",
                                  "--sequence_format", args.sequence_format, "--overwrite",
                                  "--item_table", "--eval_rows", str(max(1000, rows // 100))],
                 }[kind]
    subprocess.run([sys.executable, "-m", *generator, "--output_dir", folder, "--num_rows",
                    str(rows), "--num_files", str(args.num_files)],
                   check=True, cwd=ROOT)
    with open(done, "w", encoding="utf-8") as f:
        f.write(f"{rows}\n")
    log(f"data generated in {time.perf_counter() - start:.1f}s")
    return train


def _has_parquet(folder: str) -> bool:
    return os.path.isdir(folder) and any(n.endswith(".parquet") for n in os.listdir(folder))


def sequence_format(folder: str) -> str:
    """``list`` when the data's behaviour sequences are parquet lists, else ``string``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))[0]
    schema = pq.read_schema(os.path.join(folder, name))
    return "list" if any(pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
                         for f in schema) else "string"


def edits(args, nproc: int) -> dict:
    steps = args.num_steps or max(1, args.num_rows // (args.batch_size * nproc))
    out = {"train_config.num_steps": steps, "train_config.num_epochs": 0,
           "train_config.log_step_count_steps": args.log_every,
           "train_config.save_checkpoints_steps": 0,
           "data_config.batch_size": args.batch_size,
           "data_config.num_workers": args.num_workers,
           "data_config.pin_memory": True, "eval_input_path": ""}
    if args.mixed_precision != "FP32":
        out["train_config.mixed_precision"] = args.mixed_precision
    return out


def _id_members(config):
    """Every id feature of ``config``'s feature configs, sequences' sub-features included."""
    for feature in config.feature_configs:
        kind = feature.WhichOneof("feature")
        inner = getattr(feature, kind)
        members = [getattr(f, f.WhichOneof("feature")) for f in inner.features] \
            if kind == "sequence_feature" else [inner]
        yield from (m for m in members if "dynamicemb" in m.DESCRIPTOR.fields_by_name)


def num_buckets_config(args, name: str, out_dir: str) -> str:
    """``name``'s config with every dynamicemb table a num_buckets table of the same dim,
    sized to the generated data's id range (KuaiRand-like: a new user a row, the
    generator's video catalog; Taobao-like: the num_buckets example's sizes, the
    generator's at scale 1), written to ``out_dir``; returns its path."""
    from hashrec.config.loader import load_pipeline_config, save_pipeline_config
    from hashrec.tools.gen_kuairand_data import num_videos

    if name not in BASELINES:
        raise ValueError(f"no num_buckets baseline for {name!r}; one of {list(BASELINES)}")
    if name in KUAIRAND:
        # The generator's ids: users 0 .. rows - 1, videos below its default scale's catalog.
        sizes = {"user_id": args.kuairand_rows, "video_id": num_videos(0.01)}
    else:
        sizes = {m.expression.split(":")[-1]: m.num_buckets
                 for m in _id_members(load_pipeline_config(CONFIGS["num_buckets"]))
                 if m.num_buckets}
    config = load_pipeline_config(CONFIGS[name])
    for member in _id_members(config):
        if not member.HasField("dynamicemb"):
            continue
        source = member.expression.split(":")[-1]
        if source not in sizes:
            raise ValueError(f"{name}: no id range known for {member.feature_name} "
                             f"({member.expression}); known: {sorted(sizes)}")
        member.ClearField("dynamicemb")
        member.num_buckets = sizes[source]
    path = os.path.join(out_dir, f"{BASELINES[name]}.config")
    save_pipeline_config(config, path)
    return path


def train_argv(args, name: str, data: str, model_dir: str, nproc: int,
               config: str | None = None) -> list[str]:
    changes = edits(args, nproc)
    if name in _with_baselines(ITEMS):
        # ``taobao_items`` data: the item table beside the training rows
        changes["data_config.negative_sampler.input_path"] = os.path.join(
            os.path.dirname(data), "items")
    return ["--pipeline_config_path", config or CONFIGS[name], "--model_dir", model_dir,
            "--train_input_path", data, "--edit_config_json", json.dumps(changes)]


def _timing_mode() -> str:
    """``host`` when the caller asked for phases on the host clock, else ``1``."""
    return "host" if os.environ.get("HASHREC_STEP_TIMING") == "host" else "1"


def run_config(args, name: str, data: str, nproc: int, config: str | None = None) -> dict:
    """Train one config (``CONFIGS[name]`` unless ``config`` names another file); returns
    the step timing summary plus a2a and wall time."""
    model_dir = tempfile.mkdtemp(prefix=f"bench_train_{name}_")
    env = {**os.environ, "HASHREC_STEP_TIMING": _timing_mode(),
           "HASHREC_STEP_TIMING_WARMUP": str(args.warmup_steps), "PYTHONUNBUFFERED": "1"}
    rank, world_size = world()
    start = time.perf_counter()
    a2a: list[float] = []
    if world_size > 1:
        # Already under torchrun: every rank trains in this process.
        os.environ.update({k: env[k] for k in ("HASHREC_STEP_TIMING",
                                               "HASHREC_STEP_TIMING_WARMUP")})
        from hashrec.train_eval import main as train_main
        model_dir = _shared_dir(model_dir)
        lines = _LogLines()
        logging.getLogger("hashrec.train").addHandler(lines)
        try:
            code = train_main(train_argv(args, name, data, model_dir, world_size, config))
        finally:
            logging.getLogger("hashrec.train").removeHandler(lines)
        if code:
            raise RuntimeError(f"training {name} failed with exit code {code}")
        a2a = _a2a_of(lines.lines)
    else:
        cmd = [sys.executable, "-m", "hashrec.train_eval"]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(nproc), "-m", "hashrec.train_eval"]
        cmd += train_argv(args, name, data, model_dir, nproc, config)
        a2a = _run_logged(cmd, env, os.path.join(model_dir, TIMING_FILE))
    wall = time.perf_counter() - start
    if rank != 0:
        return {}
    with open(os.path.join(model_dir, TIMING_FILE), encoding="utf-8") as f:
        result = json.load(f)
    result["wall_seconds"] = wall
    result["per_gpu_batch"] = args.batch_size
    if a2a:
        result["a2a_ms_per_step"] = sum(a2a) / len(a2a)
    return result


def _shared_dir(model_dir: str) -> str:
    """Rank 0's model_dir on every rank (broadcast through the process group's store)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        if _cuda():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if _cuda() else "gloo")
    box = [model_dir]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class _LogLines(logging.Handler):
    """Keeps the trainer's log messages (in-process runs under torchrun)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _a2a_of(lines: list[str]) -> list[float]:
    """a2a ms/step of the progress windows after the first (which holds the warm-up)."""
    a2a = [float(m.group(2)) for m in map(A2A_PATTERN.search, lines) if m]
    return a2a[1:] or a2a


# Seconds a trainer may take to exit once it has written its step timing (its results).
EXIT_GRACE_S = 60


def _run_logged(cmd: list[str], env: dict, done_file: str | None = None) -> list[float]:
    """Run the trainer, echoing its log; returns a2a ms/step (see ``_a2a_of``).

    A trainer that has written ``done_file`` (its results) but has not exited
    ``EXIT_GRACE_S`` seconds later is ended, with a warning, and its results kept: a
    hang at exit (say, in the process group's destruction) costs one run's grace, not
    the benchmark's remaining runs."""
    log("running: " + " ".join(cmd))
    lines = []
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ended: list[bool] = []
    if done_file is not None:
        threading.Thread(target=_end_if_hung, args=(proc, done_file, ended), daemon=True).start()
    for line in proc.stdout:
        sys.stdout.write("    " + line)
        sys.stdout.flush()
        lines.append(line)
    if proc.wait() and not ended:
        raise RuntimeError(f"training failed with exit code {proc.returncode}")
    return _a2a_of(lines)


def _end_if_hung(proc: subprocess.Popen, done_file: str, ended: list[bool]) -> None:
    """Watches ``proc``: once ``done_file`` exists, it gets ``EXIT_GRACE_S`` to exit."""
    while proc.poll() is None and not os.path.exists(done_file):
        time.sleep(1)
    try:
        proc.wait(EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        log(f"WARNING: the trainer wrote its results but did not exit within {EXIT_GRACE_S} "
            f"s; ending it")
        ended.append(True)
        os.killpg(proc.pid, signal.SIGTERM)


def environment() -> dict:
    import platform

    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (cpu)"
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": gpu,
            "gpus_visible": torch.cuda.device_count(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version()}


def _threads_text(threads: dict) -> str:
    """``main thread 83% on the CPU, 2.1 preemptions/step`` of a run's ``host_threads``."""
    parts = []
    if "main_thread_cpu_share" in threads:
        parts.append(f"main thread {100 * threads['main_thread_cpu_share']:.0f}% on the CPU")
    if "preemptions_per_step" in threads:
        parts.append(f"{threads['preemptions_per_step']:.1f} preemptions/step")
    return ", ".join(parts)


def _window_range(windows: list[dict]) -> str:
    """``min / median / max`` of the windows' global samples/s, or ``-`` without any."""
    rates = sorted(w["global_samples_per_second"] for w in windows)
    if not rates:
        return "-"
    return " / ".join(f"{v:,.0f}" for v in (rates[0], statistics.median(rates), rates[-1]))


RANK_PHASES = ("data_wait_host", "embedding_forward", "embedding_backward", "step")


def _rank_lines(runs: dict) -> list[str]:
    """Several ranks: each rank's phases that differ between ranks (its own waits for
    the loader and, inside the exchanges, for its peers), its slowest window's, and
    its main thread's CPU share."""
    rows = [(name, i, r) for name, run in runs.items()
            for i, r in enumerate(run.get("ranks") or [])]
    if not rows:
        return []
    lines = ["", "Per rank (ms/step; the phases with collectives include a rank's waits "
                 "for its peers; worst: the window with the lowest samples/s):", "",
             "| config | rank | " + " | ".join(RANK_PHASES) + " | "
             + " | ".join(f"worst {p}" for p in RANK_PHASES) + " | main thread CPU |",
             "|---|---:|" + "---:|" * (2 * len(RANK_PHASES)) + "---:|"]
    for name, rank, r in rows:
        phases = r.get("phases_ms", {})
        windows = r.get("windows") or [{}]
        worst = min(windows, key=lambda w: w.get("global_samples_per_second", 0.0))
        worst = worst.get("phases_ms", {})
        share = r.get("host_threads", {}).get("main_thread_cpu_share")
        lines.append(f"| {name} | {rank} | "
                     + " | ".join(f"{phases.get(p, 0.0):.2f}" for p in RANK_PHASES) + " | "
                     + " | ".join(f"{worst.get(p, 0.0):.2f}" for p in RANK_PHASES) + " | "
                     + ("-" if share is None else f"{100 * share:.0f}%") + " |")
    return lines


def _data_text(report: dict) -> list[str]:
    """What the runs trained on: Taobao-like data (its sequences' storage), Criteo-like."""
    texts = []
    if report.get("sequence_format", "string") is not None:
        texts.append(f"Taobao-like data at scale 1 (behaviour sequences stored as "
                     f"{report.get('sequence_format', 'string')}s)")
    if any(name in CRITEO for name in report["runs"]):
        texts.append("Criteo-like data at scale 0.01 for " + ", ".join(
            name for name in report["runs"] if name in CRITEO))
    kuairand = [name for name in report["runs"] if name in _with_baselines(KUAIRAND)]
    if kuairand:
        texts.append(f"KuaiRand-like data at scale 0.01 ({report.get('kuairand_rows')} rows) "
                     f"for " + ", ".join(kuairand))
    items = [name for name in report["runs"] if name in _with_baselines(ITEMS)]
    if items:
        texts.append("negatives from the generator's item table for " + ", ".join(items))
    return texts


def _with_baselines(names: tuple[str, ...]) -> set[str]:
    """``names`` and their num_buckets baselines' runs (which train on the same data)."""
    return set(names) | {BASELINES[name] for name in names if name in BASELINES}


def _sequence_text(runs: dict) -> str:
    """The Taobao-like sequences' length, unless every run is on KuaiRand-like data."""
    return "" if runs and set(runs) <= _with_baselines(KUAIRAND) else ", sequence length 100"


def markdown(report: dict) -> str:
    env, runs = report["environment"], report["runs"]
    lines = ["# End-to-end training throughput (generated data)", "",
             f"{env['date']}, GPU {env['gpu']} x {report['nproc']}, {env['cpus']} CPUs, "
             f"torch {env['torch']}, triton {env['triton']}, python {env['python']}.", "",
             f"Command: `{report['command']}`", "",
             f"{report['num_rows']} training samples per config (steps = samples / global "
             f"batch; the data loops when it holds fewer rows), "
             + ", ".join(_data_text(report)) + ", per-GPU batch "
             f"{report['batch_size']}, {report['mixed_precision']}, "
             f"{report['num_workers']} loader workers per rank{_sequence_text(runs)}; "
             f"the first {report['warmup_steps']} steps are left out.", "",
             "| config | steps | global samples/s | windows min / median / max | step ms | "
             + " | ".join(p for p in PHASE_ORDER[:-1]) + " | a2a ms |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(PHASE_ORDER) - 1) + "---:|"]
    for name, r in runs.items():
        phases = r.get("phases_ms", {})
        cells = " | ".join(f"{phases.get(p, 0.0):.2f}" for p in PHASE_ORDER[:-1])
        a2a = f"{r['a2a_ms_per_step']:.2f}" if "a2a_ms_per_step" in r else "-"
        lines.append(f"| {name} | {r.get('steps', 0)} | "
                     f"{r.get('global_samples_per_second', 0.0):,.0f} | "
                     f"{_window_range(r.get('windows', []))} | "
                     f"{phases.get('step', 0.0):.2f} | {cells} | {a2a} |")
    if "ratio_dynamicemb_over_num_buckets" in report:
        lines += ["", f"dynamicemb / num_buckets throughput: "
                      f"{report['ratio_dynamicemb_over_num_buckets']:.3f}"]
    for name, baseline in BASELINES.items():
        key = f"ratio_{name}_dynamicemb_over_num_buckets"
        if key in report:
            lines += ["", f"{name} dynamicemb / num_buckets throughput ({name} over {baseline}, "
                          f"every dynamicemb table a num_buckets table of the same dim): "
                          f"{report[key]:.3f}"]
    lines += ["", "Windows: global samples/s of each progress-log window after warm-up "
              "(host clock), as min / median / max."]
    threads = [f"{name} {_threads_text(r['host_threads'])}" for name, r in runs.items()
               if r.get("host_threads")]
    if threads:
        lines += ["", "Training threads of rank 0 after warm-up (main thread's CPU time as a "
                      "share of the wall clock; preemptions of the main and autograd threads "
                      "per step): " + "; ".join(threads) + "."]
    lines += _rank_lines(runs)
    clock = "on the host clock (HASHREC_STEP_TIMING=host)" if _timing_mode() == "host" \
        else "on the device timeline (CUDA events; host clock on CPU)"
    lines += ["", f"Phases are milliseconds per step {clock}; embedding_backward is the storages' backward nodes "
              "(gradient exchange and fused sparse optimizer), dense_backward the rest of "
              "backward; data_wait_host (JSON) is the host's wait for the loader.", ""]
    return "\n".join(lines)


def _train(args, name: str, data: str, nproc: int, config: str | None = None) -> dict:
    """``run_config``, logged on rank 0."""
    rank, _ = world()
    if rank == 0:
        log(f"training {name} ({nproc} process(es), batch {args.batch_size} per rank)")
    r = run_config(args, name, data, nproc, config)
    if rank == 0:
        log(f"{name}: {r.get('global_samples_per_second', 0.0):,.0f} samples/s over "
            f"{r.get('steps', 0)} steps after warm-up, phases ms/step "
            f"{json.dumps({k: round(v, 2) for k, v in r.get('phases_ms', {}).items()})}")
    return r


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world_size = world()
    nproc = world_size if world_size > 1 else args.nproc
    if args.num_workers is None:
        args.num_workers = default_workers(nproc)
    names = args.configs.split(",")
    kinds = {name: "criteo" if name in CRITEO else "kuairand" if name in KUAIRAND
             else "taobao_items" if name in ITEMS else "taobao" for name in names}
    folders = {kind: ensure_data(args, kind) for kind in dict.fromkeys(kinds.values())}
    data = folders.get("taobao") or folders.get("taobao_items")
    runs = {}
    for name in names:
        runs[name] = _train(args, name, folders[kinds[name]], nproc)
        if name in BASELINES:
            with tempfile.TemporaryDirectory(prefix="bench_train_config_") as tmp:
                runs[BASELINES[name]] = _train(args, BASELINES[name], folders[kinds[name]],
                                               nproc, num_buckets_config(args, name, tmp))
    if rank != 0:
        return 0
    report = {"command": "python " + " ".join([os.path.relpath(__file__, ROOT),
                                               *(sys.argv[1:] if argv is None else argv)]),
              "environment": environment(), "nproc": nproc, "num_rows": args.num_rows,
              "batch_size": args.batch_size, "mixed_precision": args.mixed_precision,
              "num_workers": args.num_workers, "warmup_steps": args.warmup_steps,
              "sequence_format": sequence_format(data) if data else None, "runs": runs}
    rates = {k: v.get("global_samples_per_second") for k, v in runs.items()}
    if rates.get("dynamicemb") and rates.get("num_buckets"):
        report["ratio_dynamicemb_over_num_buckets"] = rates["dynamicemb"] / rates["num_buckets"]
    for name, baseline in BASELINES.items():
        if rates.get(name) and rates.get(baseline):
            report[f"ratio_{name}_dynamicemb_over_num_buckets"] = rates[name] / rates[baseline]
    if any(kind == "kuairand" for kind in kinds.values()):
        report["kuairand_rows"] = args.kuairand_rows
    tag = ("smoke_" if args.smoke else "") + ("gpu" if _cuda() else "cpu") + \
        (f"_x{nproc}" if nproc > 1 else "")
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, f"train_{tag}")
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(report))
    log(f"wrote {base}.json and {base}.md")
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
