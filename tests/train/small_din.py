"""A small MultiTowerDIN training loop on the example dynamicemb config (a fused dynamic
storage and a dense group, both 16 wide), for tests of the training step."""

from __future__ import annotations

import os

import torch

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.tools.gen_taobao_data import generate
from hashrec.train import checkpoints
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.session import build_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")
STEPS = 4


def generate_data(out, seed: int) -> None:
    """1,500 Taobao-like rows (about six batches of 256)."""
    generate(str(out), 1500, seed=seed, scale=0.001, quiet=True)


def small_config(model_dir, edits: dict | None = None):
    """The config of :func:`small_loop` (``edits`` change it)."""
    edits = {"data_config.batch_size": 256, "data_config.num_workers": 0,
             "train_config.num_steps": STEPS, "eval_input_path": "",
             "model_dir": str(model_dir),
             "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 8,
             "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
             "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [8],
             "model_config.multi_tower_din.final.hidden_units": [4], **(edits or {})}
    return apply_edit_config_json(load_pipeline_config(CONFIG), edits)


def small_loop(model_dir, device: str = "cpu", edits: dict | None = None,
               continue_train: bool = False, world_size: int = 1, ctx=None) -> TrainLoop:
    """A TrainLoop of STEPS steps of 256 samples, sequences of 8, narrow towers
    (``edits`` change the config; ``continue_train`` resumes from ``model_dir``;
    ``world_size``: this process reads rank 0's share of that many; ``ctx``: a rank of a
    process group, which sets the device and the ranks)."""
    config = small_config(model_dir, edits)
    torch.manual_seed(0)
    session = build_session(config, 0, world_size, device=torch.device(device), ctx=ctx)
    resume = checkpoints.Resume()
    if continue_train:
        resume = checkpoints.restore_for_training(str(model_dir), session.model,
                                                  session.dense, True, None)
    return TrainLoop(session, LoopOptions.from_config(config), resume)


def trained_state(loop: TrainLoop) -> dict[str, torch.Tensor]:
    """The model's tensors and, per dynamic table, its keys, tags, rows (with optimizer
    state) and scores sorted by key: what two equivalent runs must agree on."""
    session = loop.session
    state = {k: v.clone() for k, v in session.model.state_dict().items()
             if isinstance(v, torch.Tensor)}
    for name, table in session.model.embedding.dynamic_tables().items():
        keys, tags, rows, scores = (torch.cat(parts) for parts in
                                    zip(*table.export_state(1 << 20)))
        by_tag = torch.argsort(tags, stable=True)  # then by key: (key, tag) order
        order = by_tag[torch.argsort(keys[by_tag], stable=True)]
        state[f"table {name}"] = torch.cat([keys[order, None].double(),
                                            tags[order, None].double(), rows[order].double(),
                                            scores[order, None].double()], 1)
    return state
