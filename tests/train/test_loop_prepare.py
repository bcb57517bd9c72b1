"""The training step starts the next batch's id deduplication, and the next forward
uses it instead of deduplicating again."""

from __future__ import annotations

import os

import pytest
import torch

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.embedding import collection as collection_module
from hashrec.tools.gen_taobao_data import generate
from hashrec.train import ahead, checkpoints
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


def _loop(data_dir, tmp_path, device: str = "cpu") -> TrainLoop:
    edits = {"data_config.batch_size": 256, "data_config.num_workers": 0,
             "train_config.num_steps": STEPS, "eval_input_path": "",
             "model_dir": str(tmp_path / "model"),
             "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 8,
             "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
             "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [8],
             "model_config.multi_tower_din.final.hidden_units": [4]}
    config = apply_edit_config_json(load_pipeline_config(CONFIG), edits)
    torch.manual_seed(0)
    session = build_session(config, device=torch.device(device))
    return TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())


@pytest.mark.parametrize("threaded", ["0", "1"])
def test_each_batch_is_deduplicated_once(data_dir, tmp_path, monkeypatch, threaded):
    monkeypatch.setenv(ahead.ENV, threaded)
    in_forward, prepared = [], []
    real_dedup = collection_module.dedup_storages
    real_start = collection_module.start_dedup
    monkeypatch.setattr(collection_module, "dedup_storages",
                        lambda storages: in_forward.append(1) or real_dedup(storages))
    monkeypatch.setattr(collection_module, "start_dedup",
                        lambda storages, share=None: prepared.append(1) or real_start(storages, share))
    loop = _loop(data_dir, tmp_path)
    assert loop.ahead.threaded == (threaded == "1")
    loop.session.model.train()
    loop.run_epoch(str(data_dir))
    loop.ahead.close()
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


def _trained(data_dir, tmp_path, monkeypatch, threaded: str, device: str = "cpu") -> dict:
    monkeypatch.setenv(ahead.ENV, threaded)
    loop = _loop(data_dir, tmp_path / threaded, device)
    loop.run(str(data_dir))
    assert loop.step == STEPS
    state = {k: v.clone() for k, v in loop.session.model.state_dict().items()
             if isinstance(v, torch.Tensor)}
    for i, table in enumerate(loop.session.model.embedding.dynamic_tables().values()):
        keys, tags, rows, scores = (torch.cat(parts) for parts in
                                    zip(*table.export_state(1 << 20)))
        order = torch.argsort(keys * 64 + tags)
        state[f"table {i}"] = torch.cat([keys[order, None].double(), tags[order, None].double(),
                                         rows[order].double(), scores[order, None].double()], 1)
    return state


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_threaded_dedup_trains_alike(data_dir, tmp_path, monkeypatch, device):
    """The next batch's dedup on a helper thread changes nothing in the results (on a
    GPU its kernels share the stream with the step's; the dense network is captured
    as a CUDA graph at the third step)."""
    inline = _trained(data_dir, tmp_path, monkeypatch, "0", device)
    threaded = _trained(data_dir, tmp_path, monkeypatch, "1", device)
    assert inline.keys() == threaded.keys()
    assert any(name.startswith("table ") for name in inline)
    for name, value in inline.items():
        assert torch.equal(value, threaded[name]), name


def test_a_failing_threaded_dedup_fails_the_step(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(ahead.ENV, "1")
    loop = _loop(data_dir, tmp_path)

    def broken(kjt):
        raise RuntimeError("dedup broke")

    monkeypatch.setattr(loop.session.model.embedding, "prepare", broken)
    with pytest.raises(RuntimeError, match="dedup broke"):
        loop.run(str(data_dir))
    assert loop.step == 0


@pytest.mark.parametrize(("value", "device", "world", "wanted"), [
    ("", "cuda", 1, True), ("", "cpu", 1, False), ("1", "cpu", 1, True),
    ("0", "cuda", 1, False), ("", "cuda", 2, False), ("1", "cuda", 2, False)])
def test_prepare_thread_wanted(monkeypatch, value, device, world, wanted):
    monkeypatch.setenv(ahead.ENV, value)
    assert ahead.prepare_thread_wanted(torch.device(device), world) == wanted


def test_prepare_thread_setting_is_checked(monkeypatch):
    monkeypatch.setenv(ahead.ENV, "yes")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        ahead.prepare_thread_wanted(torch.device("cpu"), 1)
