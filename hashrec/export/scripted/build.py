"""Assemble, compile and save the inference model of a trained model.

The hash map tables come from the export's safetensors parts (every rank's
part of every dynamic table), so the same code serves single- and multi-rank
exports; dense tables and the dense network come from the model in memory.
"""


import copy
import itertools
import json
import os
import shutil

import torch
from safetensors import safe_open
from torch import nn

from hashrec.checkpoint.errors import disk_full_hint
from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.scripted.dlrm_hstu_head import DlrmHSTUHead
from hashrec.export.scripted.heads import dense_head
from hashrec.export.scripted.lookup import EmbeddingLookup, FeatureLayout, TableLookup
from hashrec.export.scripted.match_head import match_head, match_outputs
from hashrec.models import MIND, DlrmHSTU, MatchModel
from hashrec.models.outputs import split_task_logits, task_outputs


class InferenceModel(nn.Module):
    """Parsed inputs -> {"logits": (B,), "probs": (B,)}; a regression model's (l2_loss)
    -> {"logits": (B,), "y": (B,)}, ``y`` the logits themselves; a model of C > 1 classes
    -> {"logits": (B, C), "probs": (B, C) their softmax} and with two classes "probs1"
    (B,), probs[:, 1]. A multi-task model's head gives each task's ``num_class`` logits
    side by side: each task's outputs as a single-task model's, suffix ``_<tower_name>``
    (``hashrec.models.tasks``; a PEPNet's towers per domain: every domain's,
    ``_<tower_name>_<k>``). A match model (DSSM, ``match_dim`` its embeddings' width)
    -> {"user_tower_emb": (B, D), "item_tower_emb": (B, D), "similarity": (B,)}, each row's
    user and item embedded and their similarity over the temperature; one tower's export
    (``tower`` "user" or "item") -> {"<tower>_tower_emb": (B, D)}. MIND's (``interests``
    K) user_tower_emb is (B, K, D), its interests (zero beyond a user's count).
    dlrm_hstu's (``candidates`` K) outputs are each task's, one a candidate slot: (B, K)
    (a row's slots past its candidates hold padding's values).

    Inputs (name -> tensor): ``values`` (n,) int64 ids and ``lengths`` (B,) bag
    sizes of every sparse feature; ``weights`` (n,) of weighted features;
    ``dense`` (B, value_dim) float32 raw features; ``sequence_dense``
    (B, L, value_dim) float32 raw sequence features.
    """

    suffixes: list[str]
    regression: list[bool]
    num_classes: list[int]
    multi_task: bool
    match_dim: int
    interests: int
    tower: str
    candidates: int

    def __init__(self, embedding: EmbeddingLookup, head: nn.Module,
                 regression: bool = False, tasks=None, num_class: int = 1,
                 suffix: str = "", match_dim: int = 0, tower: str = "",
                 interests: int = 0, candidates: int = 0) -> None:
        super().__init__()
        # dlrm_hstu's candidate slots a row (0: the head gives a row's outputs)
        self.candidates = candidates
        self.match_dim = match_dim
        # MIND's interests a user (0: one embedding, DSSM).
        self.interests = interests
        # A match model's tower exported alone ("user" or "item"); "" for a whole model.
        self.tower = tower
        self.embedding = embedding
        self.head = head
        # tasks (hashrec.models.tasks.Task): a multi-task model's, in logit order.
        self.multi_task = tasks is not None
        # suffix: a single-task model's outputs' (RocketLaunching's "_light").
        self.suffixes = [t.suffix for t in tasks] if tasks is not None else [suffix]
        self.regression = [t.regression for t in tasks] if tasks is not None else [regression]
        self.num_classes = [t.num_class for t in tasks] if tasks is not None else [num_class]

    def forward(self, values: dict[str, torch.Tensor], lengths: dict[str, torch.Tensor],
                weights: dict[str, torch.Tensor], dense: dict[str, torch.Tensor],
                sequence_dense: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pooled, sequences, sequence_lengths = self.embedding(values, lengths, weights)
        logits = self.head(pooled, sequences, sequence_lengths, dense, sequence_dense).float()
        if self.match_dim > 0:
            return match_outputs(logits, self.match_dim, self.tower, self.interests)
        out = task_outputs(split_task_logits(logits, self.num_classes, self.multi_task),
                           self.suffixes, self.regression)
        if self.candidates > 0:
            for name in list(out.keys()):
                value = out[name]
                out[name] = value.reshape([-1, self.candidates] + value.shape[1:])
        return out


def load_hashmaps(export_dir: str, world_size: int, tables: list[str]
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every part of the dynamic tables ``tables``: name -> (keys sorted, values).

    Raises:
        ExportError: a part or a table's entry is missing.
    """
    keys: dict[str, list[torch.Tensor]] = {t: [] for t in tables}
    values: dict[str, list[torch.Tensor]] = {t: [] for t in tables}
    for rank in range(world_size):
        meta_path = os.path.join(export_dir, meta.meta_file(rank, world_size))
        weights_path = os.path.join(export_dir, meta.weights_file(rank, world_size))
        if not (os.path.isfile(meta_path) and os.path.isfile(weights_path)):
            raise ExportError(f"{weights_path} or its meta {meta_path} is missing")
        with open(meta_path, encoding="utf-8") as f:
            entries = json.load(f)
        with safe_open(weights_path, framework="pt") as part:
            for table in tables:
                entry = entries.get(table)
                if entry is None or not entry.get("is_hashmap"):
                    raise ExportError(f"{meta_path}: no is_hashmap entry for table {table!r}")
                keys[table].append(part.get_tensor(entry["hashmap_key"]))
                values[table].append(part.get_tensor(entry["hashmap_value"]))
    out = {}
    for table in tables:
        all_keys = torch.cat(keys[table])
        order = torch.argsort(all_keys)
        out[table] = (all_keys[order], torch.cat(values[table])[order])
    return out


def build_inference_model(model: nn.Module, feature_set,
                          hashmaps: dict[str, tuple[torch.Tensor, torch.Tensor]],
                          missing: dict[str, float], tower: str = "") -> InferenceModel:
    """The (not yet compiled) inference model of a trained ``model``.

    Args:
        model: the trained RankModel (its dense tables and dense network are used).
        feature_set: the model's FeatureSet (features and tables); for one tower, the
            tower's (``hashrec.export.towers.tower_feature_set``): its tables only.
        hashmaps: dynamic table -> (keys sorted (n,), values (n, dim)).
        missing: dynamic table -> value of ids it does not hold.
        tower: "user" or "item": that tower of a match model alone; "" the whole model.
    """
    dense_tables = getattr(model.embedding, "dense_tables", {})
    lookups = []
    for spec in feature_set.embedding_tables():
        if spec.is_dynamic or spec.zch is not None:  # ZCH tables: raw id -> row hash maps
            keys, values = hashmaps[spec.name]
            lookups.append(TableLookup(spec.name, values, keys, missing[spec.name]))
        else:
            table = dense_tables[spec.name]
            weight = table.rows[:, :table.dim].detach().cpu().clone()  # rows may be a view
            lookups.append(TableLookup(spec.name, weight))
    features = [FeatureLayout(f.name, f.table, f.pooling == "mean", f.is_sequence,
                              f.max_length, f.weighted, f.input_key, f.multi_value)
                for f in feature_set.embedding_features()]
    match = isinstance(model, MatchModel)
    if tower and not match:
        raise ExportError(f"only a match model (dssm, dat, mind, match_backbone, hstu_match) "
                          f"exports a {tower} tower alone")
    if isinstance(model, DlrmHSTU):
        head: nn.Module = DlrmHSTUHead(model)
    else:
        head = match_head(model, tower) if match else dense_head(model)
    head = copy.deepcopy(head).cpu().eval()
    # the outputs' tasks: a PEPNet's towers per domain give each task once per domain
    tasks = getattr(model, "output_tasks", model.tasks) \
        if getattr(model, "multi_task", False) else None
    suffix = model.tasks[0].suffix if getattr(model, "tasks", None) else ""
    return InferenceModel(EmbeddingLookup(lookups, features), head,
                          bool(getattr(model, "regression", False)), tasks,
                          int(getattr(model, "num_class", 1)), suffix,
                          model.user_tower.dim if match else 0, tower,
                          model.user_tower.capsule.max_k if isinstance(model, MIND) else 0,
                          model.candidates if isinstance(model, DlrmHSTU) else 0).eval()


# Models up to this size are serialized in memory and written by Python; larger ones
# (tables of millions of rows) stream from TorchScript's writer, as a copy in memory would
# take three times their size on the host.
IN_MEMORY_SAVE_BYTES = 256 << 20


def save_scripted(module: InferenceModel, path: str) -> torch.jit.ScriptModule:
    """Compiles ``module`` with TorchScript and saves it to ``path``.

    TorchScript's own writer to a path aborts the whole process (C++ ``terminate``, no
    Python error, no cleanup) when a write fails, as on a full disk. A model of up to
    ``IN_MEMORY_SAVE_BYTES`` is therefore serialized in memory and written by Python; a
    larger one streams from TorchScript's writer once the disk is seen to have room for
    it (so only a disk that fills while it is written still aborts).

    Raises:
        ExportError: the model does not compile, or ``path`` cannot be written or its
            disk has no room for the model (with a hint when the disk looks full).
    """
    try:
        scripted = torch.jit.script(module)
    except Exception as err:  # noqa: BLE001 - any compiler failure becomes one clear error
        raise ExportError(f"TorchScript could not compile the inference model: {err}") from err
    size = sum(t.numel() * t.element_size()
               for t in itertools.chain(scripted.parameters(), scripted.buffers()))
    hint = "; the disk may be full: free space (or use another --export_dir) and export again"
    try:
        if size <= IN_MEMORY_SAVE_BYTES:
            with open(path, "wb") as f:
                f.write(scripted.save_to_buffer())
            return scripted
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        needed = size + size // 100 + (16 << 20)  # the archive's headers and code
        if free < needed:
            raise ExportError(f"cannot write the scripted model {path}: it needs about "
                              f"{needed / 2**30:.2f} GiB, its disk has {free / 2**30:.2f} GiB "
                              f"free{hint}")
        scripted.save(path)
    except OSError as err:
        raise ExportError(f"cannot write the scripted model {path}: {err.strerror or err}"
                          f"{disk_full_hint(err, 'another --export_dir', 'export again')}"
                          ) from err
    return scripted
