"""A backbone's input_layer options (batch / layer norm, dropout, feature dropout) and its
block packages on the fakes, against hand computations; scripted and free of host reads."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from model_fakes import DIM, fake_model, make_batch

from hashrec.models import ModelError

DEEP = """
feature_groups { group_name: "deep" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
"""
WIDTHS = [DIM, DIM, DIM, 1]
WIDTH = sum(WIDTHS)


def _rank(backbone: str, groups: str = DEEP) -> str:
    return (groups + f"rank_backbone {{ backbone {{ {backbone} }} }}\n"
            "losses { binary_cross_entropy {} }")


def _input_layer(options: str):
    model = fake_model(_rank(f"""blocks {{ name: "deep" inputs {{ feature_group_name: "deep" }}
                                   input_layer {{ {options} }} }} concat_blocks: "deep" """))
    (deep,) = model.dense_inputs(model.embedding(make_batch(64).sparse), make_batch(64))
    return model, deep


def _features(x: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.split(x, WIDTHS, dim=-1))


def test_batch_norm_and_layer_norm_normalize_the_groups_columns_and_rows():
    model, deep = _input_layer("do_batch_norm: true")
    backbone = model.net.backbone
    mean, var = deep.mean(0), deep.var(0, unbiased=False)
    torch.testing.assert_close(backbone([deep])[0], (deep - mean) / (var + 1e-5).sqrt())
    model, deep = _input_layer("do_layer_norm: true")
    mean, var = deep.mean(-1, keepdim=True), deep.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(model.net.backbone([deep])[0],
                               (deep - mean) / (var + 1e-5).sqrt())


def test_feature_dropout_drops_whole_features_per_row_in_training_only():
    model, deep = _input_layer("feature_dropout_rate: 0.5")
    torch.manual_seed(1)
    out = model.net.backbone([deep])[0]
    dropped = torch.zeros(deep.shape[0], len(WIDTHS), dtype=torch.bool)
    for f, (got, x) in enumerate(zip(_features(out), _features(deep))):
        zero = (got == 0).all(-1)
        torch.testing.assert_close(got[~zero], x[~zero] / 0.5)  # kept: scaled by 1/keep
        dropped[:, f] = zero
    # each feature dropped in some rows and kept in others; rows differ
    assert dropped.any(0).all() and (~dropped).any(0).all()
    assert len({tuple(r.tolist()) for r in dropped}) > 1
    model.eval()
    torch.testing.assert_close(model.net.backbone([deep])[0], deep)


def test_dropout_rate_drops_single_columns_in_training_only():
    model, deep = _input_layer("dropout_rate: 0.25")
    torch.manual_seed(0)
    out = model.net.backbone([deep])[0]
    kept = out != 0
    torch.testing.assert_close(out[kept], deep[kept] / 0.75)
    # single columns: some feature has a dropped and a kept column in one row
    assert any(((block == 0).any(-1) & (block != 0).any(-1)).any()
               for block in _features(out)[:3])
    model.eval()
    torch.testing.assert_close(model.net.backbone([deep])[0], deep)


@pytest.mark.parametrize("options, message", [
    ("do_batch_norm: true do_layer_norm: true", "do_batch_norm and do_layer_norm are both set"),
    ("dropout_rate: 1.0", "input_layer.dropout_rate=1.0; allowed: 0 <= rate < 1"),
    ("feature_dropout_rate: -0.5", "feature_dropout_rate=-0.5; allowed: 0 <= rate < 1"),
], ids=["both-norms", "dropout-1", "feature-dropout-negative"])
def test_bad_input_layer_options_are_refused(options, message):
    with pytest.raises(ModelError, match="blocks\\['deep'\\]") as err:
        _input_layer(options)
    assert message in str(err.value)


# item_tower: called twice with input dropout (two views), once reset (no dropout); the
# scaled tower reads its package input, the "top" block's output doubled
PACKAGES = """
packages { name: "item_tower"
  blocks { name: "item" inputs { feature_group_name: "deep" } input_layer { dropout_rate: 0.5 } }
  blocks { name: "enc" inputs { block_name: "item" }
           module { class_name: "MLP" mlp { hidden_units: [4] } } } }
packages { name: "scaled"
  blocks { name: "lin" inputs { use_package_input: true }
           module { class_name: "Linear" st_params { fields { key: "out_features"
                                                              value { number_value: 3 } } } } }
  concat_blocks: "lin" }
blocks { name: "views" inputs { package_name: "item_tower" } inputs { package_name: "item_tower" }
         merge_inputs_into_list: true }
blocks { name: "top" inputs { package_name: "item_tower" reset_input {} } }
blocks { name: "out" inputs { block_name: "top" }
         inputs { package_name: "scaled" package_input: "top" package_input_fn: "lambda x: x * 2" }
         inputs { block_name: "views" ignore_input: true } }
concat_blocks: "out"
"""


def test_a_package_shares_its_modules_across_calls_and_resets_its_input_layer():
    model = fake_model(_rank(PACKAGES))
    backbone = model.net.backbone
    tower, scaled = backbone.packages
    # one MLP and one Linear however many calls
    assert sum(1 for m in backbone.modules() if type(m).__name__ == "MLP") == 1
    (deep,) = model.dense_inputs(model.embedding(make_batch(8).sparse), make_batch(8))
    mlp = tower.blocks[1].layers[0].inner
    linear = scaled.blocks[0].layers[0].inner
    top = mlp(deep)  # reset_input {}: no dropout, even in training
    torch.manual_seed(0)
    out = backbone([deep])[0]
    torch.testing.assert_close(out, torch.cat([top, linear(top * 2)], dim=-1))
    # the two views draw their own dropout; in eval both are the tower without dropout
    views = [tower([[deep]], [], 0)[0] for _ in range(2)]
    assert not torch.allclose(views[0], views[1])
    model.eval()
    torch.testing.assert_close(tower([[deep]], [], 0)[0], top)


def test_a_network_with_packages_and_input_layers_scripts_and_reads_nothing_on_the_host():
    text = _rank(PACKAGES.replace("dropout_rate: 0.5",
                                  "do_batch_norm: true feature_dropout_rate: 0.3"))
    model = fake_model(text)
    model(make_batch(6))  # batch norm statistics away from their start
    batch = make_batch(6)
    inputs = list(model.dense_inputs(model.embedding(batch.sparse), batch))
    with HostReads() as reads:
        model.net(inputs)
    assert not reads.counts
    model.eval()
    torch.testing.assert_close(torch.jit.script(model.net)(inputs), model.net(inputs))


@pytest.mark.parametrize("backbone, message", [
    ('blocks { name: "out" inputs { package_name: "p" } }',
     "package_name 'p' is not a package (packages: none)"),
    ('blocks { name: "out" inputs { use_package_input: true } }',
     "use_package_input reads a package's input; only a block of a package"),
    ('packages { name: "p" blocks { name: "a" inputs { feature_group_name: "deep" } } } '
     'blocks { name: "out" inputs { feature_group_name: "deep" } }',
     "packages: ['p'] are never called"),
    ('packages { name: "p" blocks { name: "a" inputs { use_package_input: true } } } '
     'blocks { name: "out" inputs { package_name: "p" } inputs { feature_group_name: "deep" } }',
     "use_package_input, but this package's call gives no package_input"),
    ('packages { name: "p" blocks { name: "a" inputs { block_name: "out" } } } '
     'blocks { name: "out" inputs { package_name: "p" } inputs { feature_group_name: "deep" } }',
     "a package reads its own blocks, feature groups and use_package_input"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" reset_input {} } }',
     "reset_input is set on a feature_group_name input"),
    ('packages { name: "p" blocks { name: "a" inputs { feature_group_name: "deep" } } } '
     'blocks { name: "out" inputs { package_name: "p" package_input_fn: "lambda x: x" } }',
     "package_input_fn without package_input"),
], ids=["unknown-package", "package-input-outside", "never-called", "no-package-input",
        "backbone-block-in-package", "reset-not-a-call", "fn-without-input"])
def test_package_config_errors_name_the_place_and_what_to_do(backbone, message):
    with pytest.raises(ModelError, match="model_config.rank_backbone.backbone") as err:
        fake_model(_rank(backbone))
    assert message in str(err.value)
