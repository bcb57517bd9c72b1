"""Restoring into a changed model: dense tables with another sparse optimizer, another
dense optimizer or its hyperparameters changed, changed dims named in config terms, and
paths that are not one checkpoint."""

from __future__ import annotations

import json
import os

import pytest
import torch
from checkpoint_helpers import table_options, trained_table
from google.protobuf import text_format
from torch import nn

from hashrec.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint
from hashrec.checkpoint.dense import DENSE_TABLES
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.config import optimizer_pb2
from hashrec.embedding.dense_table import DenseTable
from hashrec.embedding.zch import ZchOptions, ZchRemapper
from hashrec.table import HashTable, SparseAdagrad, SparseAdam
from hashrec.train.optimizers import build_dense_optimizer, dense_parameters


class _Model(nn.Module):
    """The shape of a HashRec model as the checkpoint sees it: dense tables under
    ``embedding.dense_tables``, ZCH remappers under ``embedding.zch_remappers``, plus a
    dense layer. ``left_out``: also the tables of a num_buckets feature and a ZCH
    feature that no feature group names (as versions that embedded them saved)."""

    def __init__(self, optimizer, dim: int = 4, num_rows: int = 10, seed: int = 0,
                 left_out: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Module()
        self.embedding.dense_tables = nn.ModuleDict(
            {"cms_segid": DenseTable("cms_segid", num_rows, dim, optimizer)})
        self.embedding.zch_remappers = nn.ModuleDict()
        self.linear = nn.Linear(dim, 1)
        if left_out:
            self.embedding.dense_tables["age_level"] = DenseTable("age_level", 8, dim,
                                                                  optimizer)
            self.embedding.dense_tables["pid"] = DenseTable("pid", 16, dim, optimizer)
            self.embedding.zch_remappers["pid"] = ZchRemapper(ZchOptions(zch_size=16), "pid")

    @property
    def rows(self) -> torch.Tensor:
        return self.embedding.dense_tables["cms_segid"].rows


def _trained(tmp_path, optimizer=None) -> tuple[_Model, str]:
    model = _Model(optimizer or SparseAdagrad(lr=0.1, initial_accumulator_value=0.5))
    model.embedding.dense_tables["cms_segid"].apply_gradients(
        torch.tensor([1, 3]), torch.ones(2, 4))
    return model, save_checkpoint(str(tmp_path), 5, model, None, {})


def test_changed_sparse_optimizer_loads_dense_embeddings_without_optimizer(tmp_path):
    model, path = _trained(tmp_path)
    adam = _Model(SparseAdam(lr=0.01), seed=1)
    restore_checkpoint(path, adam, None, {}, restore_optimizer=False)
    assert torch.equal(adam.rows[:, :4], model.rows[:, :4])
    assert torch.equal(adam.rows[:, 4:], torch.zeros(10, 8))
    assert torch.equal(adam.linear.weight, model.linear.weight)


def test_fine_tune_resets_dense_optimizer_columns(tmp_path):
    model, path = _trained(tmp_path)
    same = _Model(SparseAdagrad(lr=0.1, initial_accumulator_value=0.25), seed=1)
    restore_checkpoint(path, same, None, {}, restore_optimizer=False)
    assert torch.equal(same.rows[:, :4], model.rows[:, :4])
    assert torch.equal(same.rows[:, 4:], torch.full((10, 4), 0.25))


def test_changed_sparse_optimizer_with_optimizer_names_the_flag(tmp_path):
    _, path = _trained(tmp_path)
    with pytest.raises(CheckpointError, match=r"dense table 'cms_segid'.*SparseAdagrad.*"
                                              r"SparseAdam.*--ignore_restore_optimizer"):
        restore_checkpoint(path, _Model(SparseAdam(lr=0.01)), None, {})


def _stepped(optimizer_class, **settings) -> tuple[_Model, torch.optim.Optimizer]:
    """A model whose dense layer took two steps of ``optimizer_class(**settings)``."""
    model = _Model(SparseAdagrad(lr=0.1), seed=2)
    optimizer = optimizer_class(model.linear.parameters(), **settings)
    for _ in range(2):
        optimizer.zero_grad()
        model.linear(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def _forget_optimizer_record(path: str) -> None:
    """Make ``path`` look like a checkpoint of a version that did not record the dense
    optimizer's kind and hyperparameters."""
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    for key in ("type", "hyperparameters"):
        del meta["dense"]["optimizer"][key]
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-record"])
@pytest.mark.parametrize("saved, configured", [
    ((torch.optim.Adam, "Adam"), (torch.optim.SGD, "SGD")),
    ((torch.optim.SGD, "SGD"), (torch.optim.Adagrad, "Adagrad")),
    ((torch.optim.Adam, "Adam"), (torch.optim.AdamW, "AdamW")),
], ids=["adam-sgd", "sgd-adagrad", "adam-adamw"])
def test_another_dense_optimizer_is_named_with_the_flag(tmp_path, recorded, saved,
                                                        configured):
    model, optimizer = _stepped(saved[0], lr=0.01)
    path = save_checkpoint(str(tmp_path), 2, model, optimizer, {})
    if not recorded:
        _forget_optimizer_record(path)
    new = _Model(SparseAdagrad(lr=0.1), seed=3)
    other = configured[0](new.linear.parameters(), lr=0.01)
    with pytest.raises(CheckpointError, match=(
            rf"{path}/optimizer\.pt: dense optimizer {saved[1]} in the checkpoint, "
            rf"{configured[1]} in the model \(train_config\.dense_optimizer\); restore "
            rf"without optimizer state \(--ignore_restore_optimizer\)")):
        restore_checkpoint(path, new, other, {})
    # Without optimizer state the model is restored and the configured optimizer steps.
    restore_checkpoint(path, new, other, {}, restore_optimizer=False)
    assert torch.equal(new.linear.weight, model.linear.weight)
    new.linear(torch.ones(3, 4)).sum().backward()
    other.step()


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-record"])
def test_the_configured_dense_hyperparameters_win_over_the_saved_ones(tmp_path, caplog,
                                                                      recorded):
    model, optimizer = _stepped(torch.optim.AdamW, lr=0.01, weight_decay=0.0)
    path = save_checkpoint(str(tmp_path), 2, model, optimizer, {})
    if not recorded:
        _forget_optimizer_record(path)
    new = _Model(SparseAdagrad(lr=0.1), seed=3)
    changed = torch.optim.AdamW(new.linear.parameters(), lr=0.02, weight_decay=0.5,
                                betas=(0.8, 0.999))
    with caplog.at_level("INFO", logger="hashrec.checkpoint.optimizer_state"):
        restore_checkpoint(path, new, changed, {})
    (group,) = changed.param_groups
    assert (group["lr"], group["weight_decay"], group["betas"]) == (0.02, 0.5, (0.8, 0.999))
    saved_state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    state = changed.state[group["params"][0]]
    assert torch.equal(state["exp_avg"], saved_state["exp_avg"])
    assert float(state["step"]) == 2
    lr = "lr 0.02 (checkpoint 0.01), " if recorded else ""  # older ones: the step's lr
    assert (f"{path}/optimizer.pt: the dense optimizer's state is restored with the "
            f"configured hyperparameters, not the saved ones: betas (0.8, 0.999) (checkpoint "
            f"(0.9, 0.999)), {lr}weight_decay 0.5 (checkpoint 0)") in caplog.text
    caplog.clear()
    same = _Model(SparseAdagrad(lr=0.1), seed=3)
    with caplog.at_level("INFO", logger="hashrec.checkpoint.optimizer_state"):
        restore_checkpoint(path, same, torch.optim.AdamW(same.linear.parameters(), lr=0.01,
                                                         weight_decay=0.0), {})
    assert "hyperparameters" not in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("flag", ["fused", "capturable"])
def test_a_fused_dense_adam_on_cuda_resumes_from_a_cpu_checkpoint(tmp_path, flag):
    """A checkpoint written by a plain Adam on the CPU keeps its step counts on the host;
    a fused or capturable Adam on CUDA needs them beside its parameters to step."""
    model, optimizer = _stepped(torch.optim.Adam, lr=0.01)
    path = save_checkpoint(str(tmp_path), 2, model, optimizer, {})
    new = _Model(SparseAdagrad(lr=0.1), seed=3).cuda()
    adam = torch.optim.Adam(new.linear.parameters(), lr=0.01, **{flag: True})
    restore_checkpoint(path, new, adam, {})
    for param in new.linear.parameters():
        step = adam.state[param]["step"]
        assert (step.device, step.dtype, float(step)) == (param.device, torch.float32, 2.0)
    new.linear(torch.ones(3, 4, device="cuda")).sum().backward()
    adam.step()
    optimizer.zero_grad()
    model.linear(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    torch.testing.assert_close(new.linear.weight.cpu(), model.linear.weight)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-record"])
def test_changed_dense_dim_is_named_in_config_terms(tmp_path, recorded):
    _, path = _trained(tmp_path)
    if not recorded:
        meta_path = os.path.join(path, "meta.json")
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        del meta["dense"]["model"][DENSE_TABLES]
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
    for restore_optimizer in (True, False):
        with pytest.raises(CheckpointError, match=r"dense table 'cms_segid'.*embedding_dim "
                                                  r"4 in the checkpoint, 8 in the config"
                                                  r".*pipeline\.config"):
            restore_checkpoint(path, _Model(SparseAdagrad(lr=0.1), dim=8), None, {},
                               restore_optimizer=restore_optimizer)


def test_saved_tables_the_model_lacks_are_skipped_with_a_warning(tmp_path, caplog):
    old = _Model(SparseAdagrad(lr=0.1), left_out=True)
    old.embedding.dense_tables["cms_segid"].apply_gradients(torch.tensor([1, 3]),
                                                            torch.ones(2, 4))
    path = save_checkpoint(str(tmp_path), 5, old, None, {"brand": trained_table(steps=2)})
    same = _Model(SparseAdagrad(lr=0.1), seed=1, left_out=True)
    with caplog.at_level("WARNING", logger="hashrec.checkpoint.restore"):
        restore_checkpoint(path, same, None, {"brand": HashTable(table_options())})
    assert "not restored" not in caplog.text
    new = _Model(SparseAdagrad(lr=0.1), seed=1)
    with caplog.at_level("WARNING", logger="hashrec.checkpoint.restore"):
        restore_checkpoint(path, new, None, {})
    assert torch.equal(new.rows, old.rows)
    assert torch.equal(new.linear.weight, old.linear.weight)
    assert (f"{path}: holds tables that no feature of the model reads, not restored: "
            f"'brand' (dynamic), 'age_level', 'pid'. Checkpoints of HashRec versions that "
            f"embedded features in no feature group") in caplog.text


def test_a_dense_table_missing_from_the_checkpoint_is_an_error(tmp_path):
    _, path = _trained(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not match the model \(\d+ entries the "
                                              r"checkpoint lacks, under embedding\.dense_tables\."
                                              r"age_level, .*: embedding\.dense_tables\.age_level\.rows.*"
                                              r"--fine_tune_checkpoint"):
        restore_checkpoint(path, _Model(SparseAdagrad(lr=0.1), left_out=True), None, {})


def test_a_zch_table_now_num_buckets_is_an_error_not_a_skipped_table(tmp_path, caplog):
    old = _Model(SparseAdagrad(lr=0.1), left_out=True)
    path = save_checkpoint(str(tmp_path), 5, old, None, {})
    new = _Model(SparseAdagrad(lr=0.1), seed=1, left_out=True)
    del new.embedding.zch_remappers["pid"]  # pid's ids are rows now, not ZCH slots
    with caplog.at_level("WARNING", logger="hashrec.checkpoint.restore"), \
            pytest.raises(CheckpointError, match=r"does not match the model \(\d+ entries the "
                                                 r"model lacks, under embedding\.zch_remappers\.pid: "
                                                 r"embedding\.zch_remappers\.pid\."):
        restore_checkpoint(path, new, None, {})
    assert "not restored" not in caplog.text


def test_changed_num_buckets_is_named(tmp_path):
    _, path = _trained(tmp_path)
    with pytest.raises(CheckpointError, match=r"'cms_segid'.*10 rows in the checkpoint, 12 "
                                              r"\(num_buckets\)"):
        restore_checkpoint(path, _Model(SparseAdagrad(lr=0.1), num_rows=12), None, {})


def test_changed_dynamic_dim_names_the_table_not_the_storage(tmp_path):
    path = save_checkpoint(str(tmp_path), 1, None, None,
                           {"deep": trained_table(steps=2, tagged=True)},
                           tag_tables={"deep": ["user_id", "brand", "customer"]})
    tables = {"deep": HashTable(table_options()), "user_id": HashTable(table_options(dim=8))}
    with pytest.raises(CheckpointError, match=r"table 'user_id' has embedding_dim 8 in the "
                                              r"config, 4 in the checkpoint.*pipeline\.config"):
        restore_checkpoint(path, None, None, tables,
                           tag_tables={"deep": ["brand", "customer"], "user_id": ["user_id"]})


def test_model_dir_instead_of_a_checkpoint_names_the_latest(tmp_path):
    save_checkpoint(str(tmp_path), 1, None, None, {"t": trained_table(steps=2)})
    latest = save_checkpoint(str(tmp_path), 2, None, None, {"t": trained_table(steps=2)})
    with pytest.raises(CheckpointError) as info:
        read_complete_meta(str(tmp_path))
    message = str(info.value)
    assert "is a model_dir" in message and latest in message
    assert "latest_checkpoint()" not in message


def test_interrupted_save_points_to_a_complete_sibling(tmp_path):
    latest = save_checkpoint(str(tmp_path), 1, None, None, {"t": trained_table(steps=2)})
    broken = os.path.join(str(tmp_path), "model.ckpt-2")
    os.makedirs(broken)
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint") as info:
        read_complete_meta(broken)
    assert latest in str(info.value) and "()" not in str(info.value)


def test_a_widened_layer_names_its_shapes_and_the_fine_tune_flag(tmp_path):
    _, path = _trained(tmp_path)
    wider = _Model(SparseAdagrad(lr=0.1))
    wider.linear = nn.Linear(4, 3)
    with pytest.raises(CheckpointError, match=r"does not match the model \(2 shapes differ: "
                                              r"linear\.weight \(1, 4\) saved, \(3, 4\) here; "
                                              r"linear\.bias \(1,\) saved, \(3,\) here\).*"
                                              r"--fine_tune_checkpoint"):
        restore_checkpoint(path, wider, None, {})


def _entry_optimizer(model: _Model, entry_lr: float, beta1: float):
    """The trainer's dense Adam over ``model``'s layer, its weight in a param_optimizers
    entry of lr ``entry_lr`` and beta1 ``beta1``."""
    config = text_format.Parse(f"""
        adam_optimizer {{ lr: 0.01 }}
        param_optimizers {{
          regex_pattern: "linear\\\\.weight"
          adam_optimizer {{ lr: {entry_lr} beta1: {beta1} }}
          param_learning_rate {{ cosine_annealing_learning_rate {{ T_max: 10 }} }}
        }}""", optimizer_pb2.DenseOptimizer())
    return build_dense_optimizer(config, dense_parameters(model))


def test_a_param_optimizers_entry_names_its_changed_hyperparameters(tmp_path, caplog):
    """An entry's group keeps its configured settings on a restore, and the INFO line names
    the entry and what changed there (its lr the configured one, not the scheduled rate)."""
    model = _Model(SparseAdagrad(lr=0.1), seed=2)
    dense = _entry_optimizer(model, entry_lr=0.05, beta1=0.9)
    for step in range(2):
        dense.set_learning_rates(step, 0)
        dense.zero_grad()
        model.linear(torch.ones(3, 4)).sum().backward()
        dense.optimizers[0].step()
    path = save_checkpoint(str(tmp_path), 2, model, dense.optimizers, {})
    new = _Model(SparseAdagrad(lr=0.1), seed=3)
    changed = _entry_optimizer(new, entry_lr=0.02, beta1=0.8)
    with caplog.at_level("INFO", logger="hashrec.checkpoint.optimizer_state"):
        restore_checkpoint(path, new, changed.optimizers, {})
    entry, rest = changed.param_groups
    assert [entry["lr"], *entry["betas"], rest["lr"], *rest["betas"]] == pytest.approx(
        [0.02, 0.8, 0.999, 0.01, 0.9, 0.999])
    assert (f"{path}/optimizer.pt: the dense optimizer's state is restored with the "
            f"configured hyperparameters, not the saved ones (of train_config.dense_optimizer."
            f"param_optimizers[0]): betas (0.8, 0.999) (checkpoint (0.9, 0.999)), lr 0.02 "
            f"(checkpoint 0.05)") in caplog.text
    caplog.clear()
    same = _Model(SparseAdagrad(lr=0.1), seed=3)
    with caplog.at_level("INFO", logger="hashrec.checkpoint.optimizer_state"):
        restore_checkpoint(path, same, _entry_optimizer(same, 0.05, 0.9).optimizers, {})
    assert "hyperparameters" not in caplog.text
