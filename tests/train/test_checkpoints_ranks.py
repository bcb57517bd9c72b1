"""Under several ranks (gloo, CPU) the latest checkpoint of a model_dir is the one rank 0
finds, on every rank: eval and export (``restore_resolved``), ``--continue_train`` and a
fine-tune start from a model_dir. Here each rank finds another one, as when a run commits
a checkpoint between two ranks' looks."""

from __future__ import annotations

import functools
import os
import sys
from types import SimpleNamespace

from hashrec.train import checkpoints
from hashrec.train.errors import TrainError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "distributed"))
from dist_workers import run_world  # noqa: E402


class _Model:
    class embedding:  # noqa: N801 - stands in for the model's attribute
        @staticmethod
        def dynamic_tables():
            return {}


def _latest_differs_by_rank(rank: int, none_on_rank_zero: bool = False) -> None:
    """This rank's lookups find model.ckpt-<5 + rank> (rank 0: nothing, if asked)."""
    def latest(model_dir):
        if rank == 0 and none_on_rank_zero:
            return None
        return os.path.join(model_dir, f"model.ckpt-{5 + rank}")

    checkpoints.latest_checkpoint = latest


def scenario_latest(root: str, ctx) -> dict:
    """The checkpoint each way of taking a model_dir's latest one restores on this rank."""
    _latest_differs_by_rank(ctx.rank)
    restored = []

    def restore_checkpoint(path, *args, **kwargs):
        restored.append(os.path.basename(path))
        return {"step": int(path.rsplit("-", 1)[1]), "extra": {}, "rank_state": {}}

    checkpoints.restore_checkpoint = restore_checkpoint
    checkpoints.restore_fine_tune = lambda path, *args: restored.append(os.path.basename(path))
    model_dir, dense = os.path.join(root, "model"), SimpleNamespace(optimizers=None)
    resolved, _ = checkpoints.restore_resolved(model_dir, restore_checkpoint)
    continued = checkpoints.restore_for_training(model_dir, _Model, dense, True, None)
    fine_tuned = checkpoints.restore_for_training(os.path.join(root, "fresh"), _Model, dense,
                                                  False, model_dir)
    return {"resolved": os.path.basename(resolved),
            "continued": os.path.basename(continued.path),
            "fine_tuned": os.path.basename(fine_tuned.path), "restored": restored}


def scenario_none_on_rank_zero(root: str, ctx) -> str:
    """What restoring the latest checkpoint of a model_dir gives where rank 0 finds none."""
    _latest_differs_by_rank(ctx.rank, none_on_rank_zero=True)
    try:
        path, _ = checkpoints.restore_resolved(os.path.join(root, "model"), lambda path: path)
    except TrainError as err:
        return f"TrainError: {err}"
    return os.path.basename(path)


def test_every_rank_restores_the_latest_checkpoint_rank_zero_finds(tmp_path):
    for name in ("model.ckpt-5", "model.ckpt-6"):
        (tmp_path / "model" / name).mkdir(parents=True)
        (tmp_path / "model" / name / "DONE").write_text("{}")
    (tmp_path / "fresh").mkdir()
    results = run_world({"latest": functools.partial(scenario_latest, str(tmp_path)),
                         "none": functools.partial(scenario_none_on_rank_zero, str(tmp_path))},
                        2, tmp_path)
    for rank in (*results["latest"], *results["none"]):
        assert not isinstance(rank, Exception), rank
    for rank in results["latest"]:
        assert rank == {"resolved": "model.ckpt-5", "continued": "model.ckpt-5",
                        "fine_tuned": "model.ckpt-5",
                        "restored": ["model.ckpt-5", "model.ckpt-5", "model.ckpt-5"]}
    # Rank 0's error, on every rank (rank 1 alone would have found a checkpoint).
    assert results["none"] == [f"TrainError: {str(tmp_path / 'model')!r} holds no complete "
                               f"checkpoint (model.ckpt-<step>/); pass a model_dir or one of "
                               f"its model.ckpt-<step> directories (an export directory is "
                               f"not one)"] * 2
