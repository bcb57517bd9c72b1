"""The dense optimizers' state in a checkpoint: one torch optimizer per kind saved and
restored, checkpoints of one optimizer as before, and entries whose kind changed named."""

from __future__ import annotations

import json
import os

import pytest
import torch
from google.protobuf import text_format
from torch import nn

from hashrec.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.config import optimizer_pb2
from hashrec.train.optimizers import build_dense_optimizer

ADAM = "adam_optimizer { lr: 0.01 } constant_learning_rate {}"
SGD_FINAL = ('param_optimizers { sgd_optimizer { lr: 0.1 momentum: 0.9 } '
             'regex_pattern: "final\\\\..*" }')
ADAM_FINAL = 'param_optimizers { adam_optimizer { lr: 0.05 } regex_pattern: "final\\\\..*" }'


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Module()
    model.tower = nn.Linear(4, 3)
    model.final = nn.Linear(3, 1)
    return model


def _dense(model: nn.Module, entries: str, dense: str = ADAM):
    config = text_format.Parse(f"{dense} {entries}", optimizer_pb2.DenseOptimizer())
    return build_dense_optimizer(config, dict(model.named_parameters()))


def _trained(tmp_path, entries: str, dense: str = ADAM):
    """A model trained 2 steps by the dense optimizers of ``entries``, and its checkpoint."""
    model = _model(0)
    optimizer = _dense(model, entries, dense)
    for step in range(2):
        optimizer.set_learning_rates(step, 0)
        optimizer.zero_grad()
        model.final(model.tower(torch.ones(2, 4))).sum().backward()
        for each in optimizer.optimizers:
            each.step()
    return optimizer, save_checkpoint(str(tmp_path), 2, model, optimizer.optimizers, {})


def _states(optimizer) -> list[dict]:
    return [optimizer.state[p] for group in optimizer.param_groups for p in group["params"]]


def _assert_same_state(saved, restored) -> None:
    for before, after in zip(saved.optimizers, restored.optimizers, strict=True):
        assert type(before) is type(after)
        for old, new in zip(_states(before), _states(after), strict=True):
            assert old.keys() == new.keys() and old
            assert all(torch.equal(old[k], new[k]) for k in old)


def test_each_kinds_state_is_saved_in_a_file_of_its_own_and_restored(tmp_path):
    saved, path = _trained(tmp_path, SGD_FINAL)
    entry = read_complete_meta(path)["dense"]["optimizer"]
    assert (entry["file"], entry["type"]) == ("optimizer.pt", "Adam")
    assert [(m["file"], m["type"]) for m in entry["more"]] == [("optimizer-1.pt", "SGD")]
    restored = _dense(_model(1), SGD_FINAL)
    restore_checkpoint(path, None, restored.optimizers, {})
    _assert_same_state(saved, restored)
    assert "momentum_buffer" in _states(restored.optimizers[1])[0]


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-record"])
def test_a_checkpoint_of_one_optimizer_restores_as_before(tmp_path, recorded):
    """A checkpoint of one torch optimizer (entries of the dense optimizer's kind), also
    one of a version that did not record its kind, restores into the same config."""
    saved, path = _trained(tmp_path, ADAM_FINAL)
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    assert "more" not in meta["dense"]["optimizer"]
    if not recorded:
        for key in ("type", "hyperparameters"):
            del meta["dense"]["optimizer"][key]
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
    restored = _dense(_model(1), ADAM_FINAL)
    restore_checkpoint(path, None, restored.optimizers, {})
    _assert_same_state(saved, restored)


@pytest.mark.parametrize("saved,configured,message", [
    ((ADAM_FINAL, ADAM), (SGD_FINAL, ADAM),
     r"param_optimizers entries changed kind: train_config\.dense_optimizer\."
     r"param_optimizers\[0\] \(SGD in the config, Adam in the checkpoint\)"),
    ((SGD_FINAL, ADAM), (ADAM_FINAL, ADAM),
     r"param_optimizers\[0\] \(Adam in the config, SGD in the checkpoint\)"),
    ((SGD_FINAL, ADAM), (SGD_FINAL, "adagrad_optimizer { lr: 0.01 }"),
     r"optimizer\.pt: dense optimizer Adam in the checkpoint, Adagrad in the model"),
    (("", ADAM), (SGD_FINAL, ADAM),
     r"holds the dense optimizers Adam, the config builds Adam, SGD"),
], ids=["entry-adam-to-sgd", "entry-sgd-to-adam", "dense-kind", "entry-of-a-new-kind"])
def test_a_changed_kind_is_named(tmp_path, saved, configured, message):
    _, path = _trained(tmp_path, *saved)
    model = _model(1)
    with pytest.raises(CheckpointError, match=message + ".*--ignore_restore_optimizer"):
        restore_checkpoint(path, None, _dense(model, *configured).optimizers, {})


def test_an_entry_of_another_kind_names_its_changed_hyperparameters(tmp_path, caplog):
    _, path = _trained(tmp_path, SGD_FINAL)
    changed = _dense(_model(1), SGD_FINAL.replace("momentum: 0.9", "momentum: 0.5"))
    with caplog.at_level("INFO", logger="hashrec.checkpoint.optimizer_state"):
        restore_checkpoint(path, None, changed.optimizers, {})
    assert changed.optimizers[1].param_groups[0]["momentum"] == 0.5
    assert (f"{path}/optimizer-1.pt: the dense optimizer's state is restored with the "
            f"configured hyperparameters, not the saved ones (of train_config.dense_optimizer."
            f"param_optimizers[0]): momentum 0.5 (checkpoint 0.9)") in caplog.text
    assert "optimizer.pt:" not in caplog.text
