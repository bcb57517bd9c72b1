"""A backbone of packages over input layers under CUDA graphs: it trains like eager, and
its input-layer dropout draws new masks at every replay (GPU only)."""

from __future__ import annotations

import pytest
import torch
from model_kinds import pipeline_text
from test_graphs_gpu import _losses, _recording_loop

from hashrec.config import apply_edit_config_json, parse_pipeline_config
from hashrec.tools.gen_taobao_data import main as generate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# A backbone of packages over input layers: the "tower" package normalizes its group's
# columns (batch norm) and is called twice, once reset to a layer norm; "scaled" reads
# its package input. ``{dropout}`` adds input-layer draws to the first call.
BACKBONE_PACKAGES = """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  rank_backbone { backbone {
    packages { name: "tower"
      blocks { name: "in" inputs { feature_group_name: "all" }
               input_layer { do_batch_norm: true {dropout} } }
      blocks { name: "enc" inputs { block_name: "in" }
               module { class_name: "MLP" mlp { hidden_units: [8] } } }
      concat_blocks: "enc" }
    packages { name: "scaled"
      blocks { name: "lin" inputs { use_package_input: true }
               module { class_name: "Linear" st_params { fields { key: "out_features"
                                                                  value { number_value: 4 } } } } }
      concat_blocks: "lin" }
    blocks { name: "a" inputs { package_name: "tower" } }
    blocks { name: "b" inputs { package_name: "tower" reset_input { do_layer_norm: true } } }
    blocks { name: "out" inputs { block_name: "a" }
             inputs { package_name: "scaled" package_input: "b"
                      package_input_fn: "lambda x: x * 2" } }
    concat_blocks: "out"
  } }"""


def _backbone_packages(data: str, tmp_path, dropout: str = ""):
    body = BACKBONE_PACKAGES.replace("{dropout}", dropout)
    return parse_pipeline_config(pipeline_text("", data, tmp_path / "model", body))


def test_backbone_packages_and_input_layers_train_graphed_like_eager(tmp_path):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "2048", "--num_files", "1", "--quiet"])
    base = _backbone_packages(data, tmp_path)
    eager, none = _losses(data, tmp_path, False, "", base=base)
    graphed, captured = _losses(data, tmp_path, True, "", base=base)
    assert none == 0 and captured == 1
    assert graphed == pytest.approx(eager, rel=1e-4)
    assert eager[-1] != eager[0]


def _losses_of_one_batch(config, data: str, tmp_path, steps: int = 5) -> tuple[list[float], int]:
    """The losses of ``steps`` graphed steps on one batch, nothing learnt (learning rates 0)."""
    config = apply_edit_config_json(config, {
        "data_config.batch_size": 256, "data_config.num_workers": 0, "eval_input_path": "",
        "train_config.dense_optimizer.adam_optimizer.lr": 0.0,
        "train_config.sparse_optimizer.adagrad_optimizer.lr": 0.0,
        "train_config.dense_cuda_graph": True, "model_dir": str(tmp_path / "one_batch")})
    session, loop, losses = _recording_loop(config)
    batch = next(iter(session.loader(data, "train"))).to(session.device)
    for _ in range(steps):
        loop.train_step(batch)
    return losses, loop.dense_graphs.captured


def test_graphed_input_layer_dropout_draws_new_masks_each_step(tmp_path):
    data = str(tmp_path / "data")
    generate(["--output_dir", data, "--num_rows", "512", "--num_files", "1", "--quiet"])
    # without draws the same batch gives the same loss at every replay ...
    plain, captured = _losses_of_one_batch(_backbone_packages(data, tmp_path), data, tmp_path)
    assert captured == 1 and plain == pytest.approx([plain[0]] * len(plain), rel=1e-6)
    # ... with them every replay draws its own masks (a graph that replayed the masks of
    # its capture would give one loss again)
    dropped, captured = _losses_of_one_batch(
        _backbone_packages(data, tmp_path, "dropout_rate: 0.3 feature_dropout_rate: 0.3"),
        data, tmp_path / "dropout")
    assert captured == 1
    assert len(set(dropped[1:])) == len(dropped) - 1
