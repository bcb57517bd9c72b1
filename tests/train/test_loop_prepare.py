"""The training step starts the next batch's id deduplication, and the next forward
uses it instead of deduplicating again."""

from __future__ import annotations

import os

import pytest
import torch

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.embedding import collection as collection_module
from hashrec.tools.gen_taobao_data import generate
from hashrec.train import checkpoints
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.session import build_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")
STEPS = 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), 1500, seed=4, scale=0.001, quiet=True)
    return out


def _loop(data_dir, tmp_path) -> TrainLoop:
    edits = {"data_config.batch_size": 256, "data_config.num_workers": 0,
             "train_config.num_steps": STEPS, "eval_input_path": "",
             "model_dir": str(tmp_path / "model"),
             "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 8,
             "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
             "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [8],
             "model_config.multi_tower_din.final.hidden_units": [4]}
    config = apply_edit_config_json(load_pipeline_config(CONFIG), edits)
    torch.manual_seed(0)
    session = build_session(config, device=torch.device("cpu"))
    return TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())


def test_each_batch_is_deduplicated_once(data_dir, tmp_path, monkeypatch):
    in_forward, prepared = [], []
    real_dedup = collection_module.dedup_storages
    real_start = collection_module.start_dedup
    monkeypatch.setattr(collection_module, "dedup_storages",
                        lambda storages: in_forward.append(1) or real_dedup(storages))
    monkeypatch.setattr(collection_module, "start_dedup",
                        lambda storages, share=None: prepared.append(1) or real_start(storages, share))
    loop = _loop(data_dir, tmp_path)
    loop.session.model.train()
    loop.run_epoch(str(data_dir))
    assert loop.step == STEPS
    # Only the first batch is deduplicated in its forward; every step starts the next's.
    assert len(in_forward) == 1
    assert len(prepared) == STEPS


def test_training_collects_garbage_on_its_schedule(data_dir, tmp_path, monkeypatch):
    import gc

    from hashrec.train.collection_schedule import CollectionSchedule

    young = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect",
                        lambda *args: young.append(args) if args == (1,) else real(*args))
    loop = _loop(data_dir, tmp_path)
    loop.collections = CollectionSchedule(every=2)
    assert gc.isenabled()
    loop.run(str(data_dir))
    assert loop.step == STEPS and len(young) == STEPS // 2
    assert gc.isenabled() and gc.get_freeze_count() == 0
