"""What ``param_optimizers`` entries of another kind cost the dense optimizer's step.

The trainer builds one torch optimizer per optimizer kind over the dense parameters
(``hashrec.train.optimizers.build_dense_optimizer``): the dense optimizer's own, plus
one for each other kind that a ``param_optimizers`` / ``part_optimizers`` entry names
(both build the same groups), and steps each (``Optimizers``). This times the dense
step of a real model, built by the trainer's ``build_session`` from ``--config`` (the
taobao MultiTowerDIN example by default; ``--widths`` also builds it with every MLP's
hidden units multiplied, a model of a few million dense parameters), in four forms:

- ``adam``: the config's dense optimizer (Adam) over every parameter, as built;
- ``adam+adam``: an entry of the same kind (its own lr) for ``--pattern``: one Adam,
  two param groups;
- ``adam+OTHER``: an entry of ``--other`` kind (SGD by default, the config's defaults:
  momentum 0.9) for ``--pattern`` (the ``towers`` MLP): a second torch optimizer;
- ``torch Adam``: a plain ``torch.optim.Adam`` over the same parameters with the
  settings and the ``fused`` / ``foreach`` choice the trainer's Adam got (the baseline);
- ``torch Adam, OTHER``: the two plain torch optimizers of ``adam+OTHER``'s split, each
  over its parameters in one group, built with the trainer's settings (what the split
  costs without HashRec's construction).

A step is what the training loop runs for the dense parameters on one process: the
optimizers' step (``MixedPrecision.step`` of ``as_one_optimizer``, float32) and
``DenseOptimizer.zero_grad`` (set to None). Before each, untimed, every parameter gets
its gradient (a fixed random tensor). The forms alternate by round; a figure is the
median of the rounds' medians.

Usage::

    python benchmarks/bench_dense_optimizers.py --out benchmarks/results/dense_optimizers_gpu
    python benchmarks/bench_dense_optimizers.py --smoke
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "multi_tower_din_taobao_dynamicemb.config"
KINDS = ("sgd_optimizer", "adagrad_optimizer", "adamw_optimizer")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(CONFIG), help="pipeline config of the model")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4],
                   help="factors on every MLP's hidden units (1: the config's model)")
    p.add_argument("--pattern", default=r"towers\..*",
                   help="regex_pattern of the entries (a full match of parameter names)")
    p.add_argument("--other", default="sgd_optimizer", choices=KINDS,
                   help="the other kind's entry")
    p.add_argument("--reps", type=int, default=50, help="timed steps a median")
    p.add_argument("--rounds", type=int, default=4)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.widths, args.reps, args.rounds = [1, 2], 2, 2
    return args


ARGS = _args()

import torch  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.config import load_pipeline_config  # noqa: E402
from hashrec.train.optimizers import build_dense_optimizer, dense_parameters  # noqa: E402
from hashrec.train.precision import as_one_optimizer  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
WARMUP = 1 if ARGS.smoke else 3
OWN = "adam_optimizer"


def _widen(message, factor: int) -> None:
    """Multiplies every ``hidden_units`` under ``message`` (a model config) by ``factor``."""
    from google.protobuf.message import Message

    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in [value] if isinstance(value, Message) else list(value):
            if field.message_type.name == "MLP":
                item.hidden_units[:] = [factor * h for h in item.hidden_units]
            _widen(item, factor)


def _config(width: int):
    config = load_pipeline_config(ARGS.config)
    kind = config.train_config.dense_optimizer.WhichOneof("optimizer")
    if kind != OWN:
        raise SystemExit(f"{ARGS.config}: train_config.dense_optimizer is {kind}; this "
                         f"benchmark compares entries against Adam (adam_optimizer)")
    if width != 1:
        _widen(config.model_config, width)
    return config


def _with_entry(dense_config, kind: str):
    """A copy of ``dense_config`` with one ``param_optimizers`` entry of ``kind`` for
    ``--pattern`` (the same kind: half the lr; else that kind's defaults)."""
    edited = type(dense_config)()
    edited.CopyFrom(dense_config)
    entry = edited.param_optimizers.add()
    entry.regex_pattern = ARGS.pattern
    own = getattr(edited, OWN)
    getattr(entry, kind).lr = own.lr / 2 if kind == OWN else 0.01
    return edited


def _plain(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A plain torch optimizer of ``optimizer``'s class over its parameters in one group,
    with its settings (``fused`` and ``foreach`` included)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    return type(optimizer)(parameters, **optimizer.defaults)


def _forms(session) -> dict:
    """Form name -> (optimizer to step, zero_grad, description, the trainer's
    ``DenseOptimizer`` or None): the trainer's forms,
    then the plain torch ones (the trainer's Adam over every parameter; and its
    optimizers of the two-kind form, each over its parameters in one group)."""
    dense_config = session.config.train_config.dense_optimizer
    named = dense_parameters(session.model)
    other = ARGS.other.removesuffix("_optimizer")
    built = {"adam": session.dense,
             "adam+adam": build_dense_optimizer(_with_entry(dense_config, OWN), named),
             f"adam+{other}": build_dense_optimizer(_with_entry(dense_config, ARGS.other),
                                                    named)}
    forms = {name: (as_one_optimizer(dense.optimizers), dense.zero_grad,
                    " + ".join(_describe(o) for o in dense.optimizers), dense)
             for name, dense in built.items()}
    plain = {"torch Adam": [_plain(session.dense.optimizers[0])],
             f"torch Adam, {other}": [_plain(o) for o in built[f"adam+{other}"].optimizers]}
    for name, optimizers in plain.items():
        forms[name] = (as_one_optimizer(optimizers),
                       lambda each=optimizers: [o.zero_grad(set_to_none=True) for o in each],
                       " + ".join(_describe(o) for o in optimizers), None)
    return forms


def _describe(optimizer: torch.optim.Optimizer) -> str:
    d = optimizer.defaults
    return (f"{type(optimizer).__name__} ({len(optimizer.param_groups)} group(s), "
            f"{sum(len(g['params']) for g in optimizer.param_groups)} tensors, fused="
            f"{d.get('fused')}, foreach={d.get('foreach')})")


def _measure(session, forms: dict) -> dict:
    """Each form's device, call and issue ms a step, one median a round."""
    parameters = list(dense_parameters(session.model).values())
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    grads = [1e-3 * torch.randn(p.shape, generator=gen, device=DEVICE) for p in parameters]

    def give_grads(_):
        for p, g in zip(parameters, grads):
            p.grad = g

    def step(optimizer, zero_grad):
        session.precision.step(optimizer)
        zero_grad()

    times = {name: {"device_ms": [], "call_ms": [], "issue_ms": [], "spin_short": 0}
             for name in forms}
    for r in range(ARGS.rounds):
        order = list(forms) if r % 2 == 0 else list(reversed(forms))
        for name in order:
            optimizer, zero_grad, _, _ = forms[name]
            t = time_device_ms(lambda _, o=optimizer, z=zero_grad: step(o, z), ARGS.reps,
                               WARMUP, setup=give_grads)
            for what in ("device_ms", "call_ms", "issue_ms"):
                times[name][what].append(t[what])
            times[name]["spin_short"] += t["spin_short"]
    return times


def _width_row(width: int) -> dict:
    session = build_session(_config(width), device=DEVICE)
    named = dense_parameters(session.model)
    forms = _forms(session)
    times = _measure(session, forms)
    entry = [n for n in named if re.fullmatch(ARGS.pattern, n)]
    row = {"width": width, "parameters": sum(p.numel() for p in named.values()),
           "tensors": len(named), "entry_parameters": sum(named[n].numel() for n in entry),
           "entry_tensors": len(entry), "forms": {}}
    for name, (_, _, described, dense) in forms.items():
        row["forms"][name] = {"optimizers": described, **times[name],
                              "rates_us": _rates_us(dense) if dense is not None else None}
    return row


def _rates_us(dense) -> float:
    """Host us of the step's learning rates, as ``Session.set_learning_rates`` sets the
    dense ones (every param group's from its schedule, then each entry's for the
    progress line), median of ``--reps`` calls."""
    times = []
    for step in range(ARGS.reps):
        t0 = time.perf_counter()
        dense.set_learning_rates(step, 0)
        dense.entry_rates()
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for width in ARGS.widths:
        row = _width_row(width)
        print(_markdown_rows([row]), flush=True)
        rows.append(row)
    results = {"command": command_line(), **environment(), "config": ARGS.config,
               "pattern": ARGS.pattern, "other": ARGS.other, "reps": ARGS.reps,
               "rounds": ARGS.rounds, "warmup": WARMUP, "rows": rows}
    markdown = _markdown(results)
    print(markdown)
    if ARGS.out:
        write_results(ARGS.out, results, markdown)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _markdown_rows(rows: list[dict]) -> str:
    lines = ["| width | dense parameters (tensors) | entry's (tensors) | form | ms a step "
             "(one call) | host issue ms | device over torch Adam | one call over torch "
             "Adam | learning rates, host us |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        base = r["forms"]["torch Adam"]
        base_device, base_call = _median(base["device_ms"]), _median(base["call_ms"])
        for name, f in r["forms"].items():
            device, call = _median(f["device_ms"]), _median(f["call_ms"])
            lines.append(
                f"| {r['width']}x | {r['parameters']:,} ({r['tensors']}) "
                f"| {r['entry_parameters']:,} ({r['entry_tensors']}) | {name} "
                f"| {device:.3f} ({call:.3f}) | {_median(f['issue_ms']):.3f} "
                f"| {device / base_device:.2f}x | {call / base_call:.2f}x "
                f"| {'-' if f['rates_us'] is None else format(f['rates_us'], '.1f')} |")
    return "\n".join(lines)


def _markdown(results: dict) -> str:
    built = []
    for r in results["rows"]:
        for name, f in r["forms"].items():
            per = " / ".join(f"{d:.3f}" for d in f["device_ms"])
            built.append(f"- {r['width']}x, {name}: {f['optimizers']}; device ms by round "
                         f"{per}; spins outrun {f['spin_short']}")
    return "\n".join([
        "# Dense optimizer step with param_optimizers entries of another kind", "",
        f"Command: `{results['command']}`", "",
        f"Date {results['date']}, GPU {results['gpu']}, torch {results['torch']}, "
        f"triton {results['triton']}. The dense parameters of "
        f"`{os.path.relpath(results['config'], REPO)}`'s model as `build_session` builds it "
        "(width: the factor on every MLP's hidden units); entries for "
        f"`{results['pattern']}`. A step: the optimizers' step and zero_grad (set to None), "
        "as the training loop runs them, every gradient given before it untimed. ms are "
        "the device's time with the host's issue hidden (in brackets one step between "
        f"syncs, host issue included), medians of {results['reps']} steps, the median of "
        f"{results['rounds']} rounds with the forms alternating. Learning rates: the host "
        "time the trainer's forms spend setting each param group's rate a step "
        "(`DenseOptimizer.set_learning_rates` and `entry_rates`, not in the step's ms).",
        "",
        _markdown_rows(results["rows"]), "", "Optimizers built:", "", *built, ""])


if __name__ == "__main__":
    main()
