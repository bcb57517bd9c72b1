"""torchrun smoke test: train_eval and eval on 2 CPU ranks (gloo) on tiny generated data.

The row counts are odd so the ranks' shares differ by one row: training stops
every rank together, and evaluation still covers every eval row (the rank that
runs out first serves its peer's lookups). A stop signal that one rank receives in an
evaluation stops every rank's before the same batch, and one received in the last step
ends every rank alike. Ranks whose training or eval input lists other files are refused.
Two ranks train an MMoE on Pareto loss weights.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from small_din import generate_data, small_config, small_loop

from hashrec.tools.gen_taobao_data import generate

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "distributed"))
from dist_workers import run_world  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")
EVAL_ROWS = 301

pytestmark = pytest.mark.slow

EDITS = {
    "data_config.batch_size": 100,
    "data_config.num_workers": 0,
    "train_config.num_epochs": 1,
    "train_config.log_step_count_steps": 2,
    "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 5,
    "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
    "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [4],
    "model_config.multi_tower_din.final.hidden_units": [4],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", module,
           *args, "--edit_config_json", json.dumps(EDITS)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_torchrun_train_eval_writes_per_rank_shards_and_one_result(tmp_path):
    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    model_dir = tmp_path / "model"
    run = torchrun("hashrec.train_eval", "--pipeline_config_path", CONFIG,
                   "--model_dir", str(model_dir), "--train_input_path", str(data / "train"),
                   "--eval_input_path", str(data / "eval"),
                   env={"HASHREC_STEP_TIMING": "1", "HASHREC_STEP_TIMING_WARMUP": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "storage plan for 2 rank(s)" in run.stderr
    # Step timing: rank 0's file holds every rank's summary, windows with their phases.
    with open(model_dir / "step_timing.json", encoding="utf-8") as f:
        timing = json.load(f)
    assert [r["steps"] for r in timing["ranks"]] == [3, 3]
    assert timing["ranks"][0]["phases_ms"] == timing["phases_ms"]
    assert all("embedding_forward" in w["phases_ms"] for r in timing["ranks"]
               for w in r["windows"])
    assert "a2a" in run.stderr and "ms/step" in run.stderr
    (checkpoint,) = glob.glob(str(model_dir / "model.ckpt-*"))
    tables = glob.glob(os.path.join(checkpoint, "dynamicemb", "*"))
    assert tables
    for table in tables:
        shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(table, "*.bin")))
        assert shards == ["rank-00000-of-00002.bin", "rank-00001-of-00002.bin"], table
    with open(model_dir / "eval_result.txt", encoding="utf-8") as f:
        (trained,) = [json.loads(line) for line in f if line.strip()]
    assert trained["num_examples"] == EVAL_ROWS
    # The 401/400-row shares at batch 100 give 5 and 4 batches: all ranks stop at 4.
    assert trained["step"] == 4

    again = torchrun("hashrec.eval", "--pipeline_config_path", CONFIG,
                     "--checkpoint_path", checkpoint, "--model_dir", str(model_dir),
                     "--eval_input_path", str(data / "eval"))
    assert again.returncode == 0, again.stderr[-4000:]
    with open(model_dir / "eval_result.txt", encoding="utf-8") as f:
        results = [json.loads(line) for line in f if line.strip()]
    assert len(results) == 2
    assert results[1]["num_examples"] == EVAL_ROWS
    assert results[1]["auc"] == pytest.approx(trained["auc"], abs=1e-6)
    assert results[1]["loss"] == pytest.approx(trained["loss"], rel=1e-5)


def _torchrun_cmd(module: str, *args: str, edits: dict,
                  monitor_s: float | None = None) -> list[str]:
    """torchrun of ``module`` on two ranks; ``monitor_s``: how often torchrun looks at its
    workers (it ends the others as soon as it sees one gone)."""
    monitor = ["--monitor-interval", str(monitor_s)] if monitor_s is not None else []
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *monitor,
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", module,
            *args, "--edit_config_json", json.dumps({**EDITS, **edits})]


def _rank_pid(root: int, rank: int) -> int | None:
    """The pid of the worker of ``rank`` (its environment's RANK) below process ``root``."""
    parents, environ = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ[int(entry)] = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    found = [pid for pid in below if f"RANK={rank}".encode() in environ.get(pid, [])]
    return min(found) if found else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    import signal
    import time

    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    model_dir = tmp_path / "model"
    cmd = _torchrun_cmd("hashrec.train_eval", "--pipeline_config_path", CONFIG,
                        "--model_dir", str(model_dir), "--train_input_path",
                        str(data / "train"), edits={"train_config.num_epochs": 1000,
                                                    "eval_input_path": ""})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 240
            while "step 6 " not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()[-4000:]
                time.sleep(0.5)
            pid = _rank_pid(proc.pid, 1)
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    stops = [line.split("stopped by SIGTERM at step ")[1].split(";")[0]
             for line in text.splitlines() if "stopped by SIGTERM at step" in line]
    assert len(stops) == 2 and stops[0] == stops[1], text[-4000:]
    assert "WARNING hashrec.train [rank 1]: SIGTERM received" in text
    assert "[rank 0]: SIGTERM received" not in text  # rank 0 stopped on rank 1's signal
    assert text.count("exitcode  : 143") == 2 and "TypeError" not in text  # torchrun's report
    assert os.path.isfile(model_dir / f"model.ckpt-{stops[0]}" / "DONE")


def test_an_error_on_one_rank_ends_every_rank(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    (part,) = sorted((data / "train").glob("*.parquet"))
    table = pq.read_table(part)
    price = table.column("price").to_numpy().copy()
    price[450:460] = float("nan")  # in one rank's share only
    pq.write_table(table.set_column(table.schema.get_field_index("price"), "price",
                                    pa.array(price)), part)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    # torchrun ends the other rank as soon as it sees rank 1 gone (every 0.1 s by default),
    # which on a busy host can come before rank 0 reaches its next collective and says
    # why it stops: it looks every 5 s here, while rank 0 steps in milliseconds.
    run = subprocess.run(
        _torchrun_cmd("hashrec.train_eval", "--pipeline_config_path", CONFIG, "--model_dir",
                      str(tmp_path / "model"), "--train_input_path", str(data / "train"),
                      edits={"eval_input_path": ""}, monitor_s=5),
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if " ERROR hashrec [rank " in line]
    assert any("DataError" in line and "not finite" in line for line in errors), run.stderr
    assert any("another rank is gone" in line for line in errors), run.stderr


def test_ranks_reading_other_files_are_refused(tmp_path):
    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    # A relative input path read from each rank's working directory: rank 1's holds
    # a copy of the data with one file fewer.
    for rank, files in ((0, 2), (1, 1)):
        where = tmp_path / f"cwd{rank}" / "train"
        where.mkdir(parents=True)
        part = sorted((data / "train").glob("*.parquet"))[0]
        for copy in range(files):
            (where / f"part-{copy:05d}.parquet").write_bytes(part.read_bytes())
    script = tmp_path / "run.py"
    script.write_text(
        "import os, runpy, sys\n"
        f"os.chdir(os.path.join({str(tmp_path)!r}, 'cwd' + os.environ['RANK']))\n"
        "sys.argv = ['hashrec.train_eval', *sys.argv[1:]]\n"
        "runpy.run_module('hashrec.train_eval', run_name='__main__')\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(script),
           "--pipeline_config_path", CONFIG, "--model_dir", str(tmp_path / "model"),
           "--train_input_path", "train", "--edit_config_json",
           json.dumps({**EDITS, "eval_input_path": ""})]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**env, "PYTHONPATH": ROOT})
    assert run.returncode != 0
    assert "differs between ranks (rank 0: 2 files" in run.stderr, run.stderr[-4000:]


def _train_on(ranks: int, model_dir, data, edits: dict, *args: str
              ) -> subprocess.CompletedProcess:
    """train_eval on ``ranks`` CPU ranks (1: a plain process) of the 801 rows of ``data``."""
    module = ("hashrec.train_eval", "--pipeline_config_path", CONFIG, "--model_dir",
              str(model_dir), "--train_input_path", str(data / "train"), *args)
    edits = {"eval_input_path": "", **edits}
    cmd = _torchrun_cmd(*module, edits=edits) if ranks == 2 else [
        sys.executable, "-m", *module, "--edit_config_json", json.dumps({**EDITS, **edits})]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.parametrize("before, after, trained, steps", [(1, 2, 4, 2), (2, 1, 2, 5)],
                         ids=["1to2", "2to1"])
def test_resuming_on_other_ranks_skips_the_rows_trained(tmp_path, before, after, trained,
                                                        steps):
    # 801 rows in batches of 100: one rank reads 9 batches an epoch, two ranks 4 each
    # (5 and 4). The epoch's rows trained before the stop (trained x before x 100) are
    # skipped as whole batches of the new layout: 1 -> 2 ranks skips 2 of 4, 2 -> 1 ranks
    # 4 of 9.
    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    model_dir = tmp_path / "model"
    first = _train_on(before, model_dir, data, {"train_config.num_steps": trained})
    assert first.returncode == 0, first.stderr[-4000:]
    again = _train_on(after, model_dir, data, {}, "--continue_train")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "the resumption is only approximate" in again.stderr
    assert f"training ends at step {trained + steps}: 1 of num_epochs 1 done" in again.stderr
    assert os.path.isfile(model_dir / f"model.ckpt-{trained + steps}" / "DONE")


def scenario_eval_stop(ctx) -> dict:
    """Rank 0 holds 5 eval batches, rank 1 holds 3 and receives SIGTERM while reading its
    second; returns the batches each rank yielded, its idle steps and the agreed signal."""
    import signal

    from hashrec.train.distributed import eval_batches
    from hashrec.train.interrupt import StopSignals

    signals, idle = StopSignals(), []

    def batches():
        for i in range(5 if ctx.rank == 0 else 3):
            if ctx.rank == 1 and i == 1:
                signals.received = signal.SIGTERM
            yield i

    def without_signal():
        return list(eval_batches(iter(range(5 if ctx.rank == 0 else 3)), ctx,
                                 lambda: idle.append(1)))

    return {"stopped": list(eval_batches(batches(), ctx, lambda: idle.append(1), 0,
                                         signals)),
            "agreed": signals.agreed, "whole": without_signal(), "idle": len(idle)}


def test_a_signal_to_one_rank_stops_every_rank_evaluation_at_the_same_batch(tmp_path):
    import signal

    (ranks,) = run_world({"eval": scenario_eval_stop}, 2, tmp_path).values()
    for rank in ranks:
        assert not isinstance(rank, Exception), rank
    assert [r["stopped"] for r in ranks] == [[0], [0]]
    assert [r["agreed"] for r in ranks] == [signal.SIGTERM] * 2
    # Without a signal every batch is evaluated; rank 1 serves rank 0's last two.
    assert [r["whole"] for r in ranks] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert [r["idle"] for r in ranks] == [0, 2]


def scenario_eval_other_files(root: str, ctx) -> str:
    """Evaluates eval<rank> of ``root``: rank 1's holds a file fewer than rank 0's."""
    from hashrec.data import DataError
    from hashrec.train.evaluation import evaluate
    from hashrec.train.session import build_session

    session = build_session(small_config(os.path.join(root, "model")), ctx=ctx)
    try:
        result = evaluate(session, os.path.join(root, f"eval{ctx.rank}"), 0)
    except DataError as err:
        return f"DataError: {err}"
    return f"evaluated {result['num_examples']} rows"


def test_ranks_evaluating_other_files_are_refused(tmp_path):
    generate_data(tmp_path / "data", seed=2)
    (part,) = sorted((tmp_path / "data").glob("*.parquet"))
    for rank, files in ((0, 2), (1, 1)):
        (tmp_path / f"eval{rank}").mkdir()
        for copy in range(files):
            shutil.copy(part, tmp_path / f"eval{rank}" / f"part-{copy:05d}.parquet")
    (ranks,) = run_world({"eval": functools.partial(scenario_eval_other_files,
                                                    str(tmp_path))}, 2, tmp_path).values()
    for rank, said in enumerate(ranks):
        assert not isinstance(said, Exception), said
        assert said.startswith(f"DataError: eval input {str(tmp_path / f'eval{rank}')!r} "
                               f"differs between ranks (rank 0: 2 files, 3000 rows; rank 1: 1 "
                               f"files, 1500 rows); every rank must read the same files"), said


def scenario_signal_in_the_last_step(root: str, ctx) -> dict:
    """Trains ``root``/data to the end (without eval) by num_steps, then by the end of the
    epoch, rank 1 receiving SIGTERM in the last step each time; how each run ended."""
    import signal

    from hashrec.train.interrupt import TrainInterrupted

    ends, received = {}, {}
    # 1,500 rows in batches of 256 on 2 ranks: 3 batches each an epoch.
    for name, edits, last in (("num_steps", {"train_config.num_steps": 2}, 2),
                              ("epoch", {"train_config.num_steps": 0,
                                         "train_config.num_epochs": 1}, 3)):
        loop = small_loop(os.path.join(root, name), edits=edits, ctx=ctx)
        step = loop.train_step

        def signalled(batch, upcoming=None, loop=loop, step=step, last=last):
            step(batch, upcoming)
            if ctx.rank == 1 and loop.step == last:
                signal.raise_signal(signal.SIGTERM)

        loop.train_step = signalled
        try:
            loop.run(os.path.join(root, "data"))
            ends[name] = ("finished", loop.step)
        except TrainInterrupted as stop:
            ends[name] = (f"stopped, exit {stop.exit_code}", loop.step)
        received[name] = loop.stop.signals.received
    return {"ends": ends, "received": received}


def test_a_signal_in_the_last_step_ends_every_rank_alike(tmp_path):
    # The last step's signal reduction is read after the loop by every rank alike: no rank
    # may stop (exit 143) while another finishes (exit 0).
    generate_data(tmp_path / "data", seed=2)
    (ranks,) = run_world({"stop": functools.partial(scenario_signal_in_the_last_step,
                                                    str(tmp_path))}, 2, tmp_path).values()
    import signal

    for rank in ranks:
        assert not isinstance(rank, Exception), rank
    assert [r["received"] for r in ranks] == [{"num_steps": None, "epoch": None},
                                              {"num_steps": signal.SIGTERM,
                                               "epoch": signal.SIGTERM}]
    assert ranks[0]["ends"] == ranks[1]["ends"], ranks
    assert {name: step for name, (_, step) in ranks[0]["ends"].items()} == {"num_steps": 2,
                                                                           "epoch": 3}
    for name, step in (("num_steps", 2), ("epoch", 3)):
        assert os.path.isfile(tmp_path / name / f"model.ckpt-{step}" / "DONE")


def test_two_ranks_train_on_pareto_loss_weights(tmp_path):
    # Each rank solves its weights from its own batch; the dense gradients of the weighted
    # losses are averaged as usual. The line shows the weights' mean over steps and ranks.
    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    edits = {"data_config.batch_size": 100, "data_config.num_workers": 0,
             "train_config.num_epochs": 1, "train_config.log_step_count_steps": 2,
             "model_config.use_pareto_loss_weight": True,
             "model_config.mmoe.task_towers[1].pareto_min_loss_weight": 0.3}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "hashrec.train_eval", "--pipeline_config_path",
           os.path.join(ROOT, "examples", "mmoe_taobao_dynamicemb.config"),
           "--model_dir", str(tmp_path / "model"), "--train_input_path", str(data / "train"),
           "--eval_input_path", str(data / "eval"), "--edit_config_json", json.dumps(edits)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = re.findall(r"loss weights \(binary_cross_entropy_ctr ([0-9.]+), "
                       r"binary_cross_entropy_cvr ([0-9.]+)\)", run.stderr)
    assert len(lines) == 2  # steps 2 and 4
    for ctr, cvr in lines:
        assert float(ctr) + float(cvr) == pytest.approx(1.0, abs=1e-4)
        assert float(cvr) >= 0.3 - 1e-5
    with open(tmp_path / "model" / "eval_result.txt", encoding="utf-8") as f:
        (result,) = [json.loads(line) for line in f if line.strip()]
    assert result["step"] == 4 and "auc_cvr" in result
