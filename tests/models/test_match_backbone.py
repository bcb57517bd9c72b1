"""The match backbone on the fakes: its towers against hand computations of their blocks,
the projection to output_dim and COSINE, the towers told apart by their output blocks'
names, and the configs that join the towers or name them badly refused, naming the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch

from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.features.batch import Batch
from hashrec.models import MatchBackbone, ModelError
from hashrec.models.backbone.towers import tower_roles

# The user tower's MLP ends 8 wide (projected to output_dim 4), the item tower's 4 wide
# (taken as it is); the item tower is named first.
BLOCKS = """
  blocks { name: "u" inputs { feature_group_name: "user" } input_layer {} }
  blocks { name: "i" inputs { feature_group_name: "item" } input_layer {} }
  blocks { name: "user_tower" inputs { block_name: "u" }
           module { class_name: "MLP" mlp { hidden_units: [8] } } }
  blocks { name: "item_tower" inputs { block_name: "i" }
           module { class_name: "MLP" mlp { hidden_units: [4] } } }
"""
GROUPS = """
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
"""


def config(blocks: str = BLOCKS, outputs=("item_tower", "user_tower"),
           params: str = "output_dim: 4 similarity: COSINE temperature: 0.5",
           groups: str = GROUPS, negatives: str = "in_batch_negative: true") -> str:
    names = " ".join(f'output_blocks: "{name}"' for name in outputs)
    return (groups + f"match_backbone {{ backbone {{ {blocks} {names} }} "
            f"model_params {{ {params} {negatives} }} }}\n"
            "losses { softmax_cross_entropy {} }")


CONFIG = config(negatives="%s")
ROWS, SAMPLED = 4, 2


def _batch(sampled: int = 0, seed: int = 1) -> Batch:
    batch = make_batch(ROWS + sampled, seed=seed)
    labels = {k: v[:ROWS] for k, v in batch.labels.items()}
    return Batch(batch.sparse, dense=batch.dense, labels=labels, batch_size=ROWS,
                 negatives=sampled)


def _mlp(x: torch.Tensor, mlp) -> torch.Tensor:
    """An MLP of one hidden layer by hand: relu(x W^T + b)."""
    (linear,) = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    return torch.relu(x @ linear.weight.t() + linear.bias)


def _group_tensors(model, batch):
    """The user group's (B, 5) and the item group's (B + N, 8), from the embeddings."""
    pooled = model.embedding(batch.sparse).pooled
    user = torch.cat([pooled["user_id"], batch.dense["price"]], dim=1)[:batch.batch_size]
    item = torch.cat([pooled["item_id"], pooled["cate_id"]], dim=1)
    return user, item


def _tower_modules(model, tower: str):
    blocks = getattr(model, f"{tower}_tower").backbone.blocks
    return blocks[-1]  # the tower's output block runs last


@pytest.mark.parametrize("sampled", [0, SAMPLED], ids=["in-batch", "sampled"])
def test_towers_are_their_blocks_then_the_projection_then_cosine(sampled):
    model = fake_model(CONFIG % ("in_batch_negative: true" if not sampled else ""))
    assert type(model) is MatchBackbone
    assert (model.user_block, model.item_block) == ("user_tower", "item_tower")
    assert [g.name for g in model.user_groups] == ["user"]
    assert [g.name for g in model.item_groups] == ["item"]
    # each tower runs its own blocks only
    assert len(model.user_tower.backbone.blocks) == len(model.item_tower.backbone.blocks) == 2
    model.eval()
    batch = _batch(sampled)
    user_x, item_x = _group_tensors(model, batch)
    hidden = _mlp(user_x, _tower_modules(model, "user"))
    projection = model.user_tower.output
    assert isinstance(projection, torch.nn.Linear) and projection.weight.shape == (4, 8)
    user = torch.nn.functional.normalize(hidden @ projection.weight.t() + projection.bias)
    assert isinstance(model.item_tower.output, torch.nn.Identity)  # 4 wide already
    item = torch.nn.functional.normalize(_mlp(item_x, _tower_modules(model, "item")))
    if sampled:
        expected = torch.cat([(user * item[:ROWS]).sum(1, keepdim=True),
                              user @ item[ROWS:].t()], dim=1) / 0.5
    else:
        expected = user @ item.t() / 0.5
    similarity = model(batch)["similarity"]
    assert similarity.shape == (ROWS, 1 + SAMPLED if sampled else ROWS)
    torch.testing.assert_close(similarity, expected)
    embedded_user, embedded_item = model.embeddings(
        *model.dense_inputs(model.embedding(batch.sparse), batch))
    torch.testing.assert_close(embedded_user.norm(dim=1), torch.ones(ROWS))
    torch.testing.assert_close(embedded_item, item)


def test_inner_product_leaves_the_embeddings_unnormalized_and_the_projection_trains():
    model = fake_model(config(params="output_dim: 6 similarity: INNER_PRODUCT"))
    model.eval()
    batch = _batch()
    user_x, item_x = _group_tensors(model, batch)
    user_linear, item_linear = model.user_tower.output, model.item_tower.output
    assert user_linear.weight.shape == (6, 8) and item_linear.weight.shape == (6, 4)
    user = _mlp(user_x, _tower_modules(model, "user")) @ user_linear.weight.t() \
        + user_linear.bias
    item = _mlp(item_x, _tower_modules(model, "item")) @ item_linear.weight.t() \
        + item_linear.bias
    out = model(batch)
    torch.testing.assert_close(out["similarity"], user @ item.t())  # temperature 1
    model.train()
    out = model(batch)
    model.loss(out, batch)["softmax_cross_entropy"].backward()
    # the projections are parameters of the model (its optimizer trains them), with grads
    names = {n for n, _ in model.named_parameters()}
    assert {"user_tower.output.weight", "item_tower.output.weight"} <= names
    assert user_linear.weight.grad.abs().sum() > 0 and item_linear.weight.grad.abs().sum() > 0


def test_output_dim_zero_keeps_the_blocks_widths_which_must_be_equal():
    equal = BLOCKS.replace("hidden_units: [8]", "hidden_units: [4]")
    model = fake_model(config(equal, params="output_dim: 0"))
    assert model.user_tower.dim == model.item_tower.dim == 4
    assert isinstance(model.user_tower.output, torch.nn.Identity)
    with pytest.raises(ModelError, match=r"model_params.output_dim is 0.*8 wide "
                                         r"\('user_tower'\) and 4 wide \('item_tower'\)"):
        fake_model(config(params="output_dim: 0"))


def test_the_default_output_dim_is_64():
    model = fake_model(config(params=""))
    assert model.user_tower.dim == model.item_tower.dim == 64
    assert not model.cosine and model.temperature == 1.0


@pytest.mark.parametrize("names, roles", [
    (("user_tower", "item_tower"), ("user_tower", "item_tower")),
    (("Item_Emb", "USER_emb"), ("USER_emb", "Item_Emb")),
    (("product", "user"), ("user", "product")),
    (("left", "right"), ("left", "right")),  # neither named: first user, then item
])
def test_the_towers_are_told_by_their_output_blocks_names(names, roles):
    from hashrec.config.model_pb2 import BackboneTower

    backbone = BackboneTower(output_blocks=list(names))
    assert tower_roles(backbone, "b") == {"user": roles[0], "item": roles[1]}


@pytest.mark.parametrize("names, error", [
    (("user_tower",), r"output_blocks is \['user_tower'\]; a match backbone names two"),
    (("a", "b", "c"), r"output_blocks is \['a', 'b', 'c'\]"),
    (("a", "a"), r"output_blocks is \['a', 'a'\]"),
    (("user_a", "user_b"), r"'user_a' \(user\), 'user_b' \(user\); name one block with "
                           r"'user' and the other with 'item'"),
    (("user_tower", "tower2"), r"'user_tower' \(user\), 'tower2' \(neither\)"),
    (("user_item", "x"), r"'user_item' holds both 'user' and 'item'"),
])
def test_output_blocks_that_tell_the_towers_badly_are_refused(names, error):
    from hashrec.config.model_pb2 import BackboneTower

    with pytest.raises(ModelError, match=error):
        tower_roles(BackboneTower(output_blocks=list(names)), "b")


BOTH_SIDES = BLOCKS.replace('inputs { block_name: "u" }',
                            'inputs { block_name: "u" } inputs { block_name: "i" }')
SHARED = BLOCKS.replace('inputs { block_name: "u" }', 'inputs { block_name: "mid" }') \
    .replace('inputs { block_name: "i" }', 'inputs { block_name: "mid" }') + """
  blocks { name: "mid" inputs { block_name: "u" } inputs { block_name: "i" } }"""
GROUP_TWICE = BLOCKS.replace('blocks { name: "i" inputs { feature_group_name: "item" }',
                             'blocks { name: "i" inputs { feature_group_name: "item" } '
                             'inputs { feature_group_name: "user" }')
WHERE = r"model_config\.match_backbone\.backbone"


@pytest.mark.parametrize("blocks, outputs, error", [
    (BOTH_SIDES, ("user_tower", "item_tower"),
     WHERE + r"\.blocks\['user_tower'\] of the user tower \(output block 'user_tower'\) "
     r"reads block 'i', which the item tower \(output block 'item_tower'\) depends on too"),
    (SHARED, ("user_tower", "item_tower"),
     r"blocks\['user_tower'\] of the user tower .* reads block 'mid', which the item tower"),
    (GROUP_TWICE, ("user_tower", "item_tower"),
     r"blocks\['u'\] of the user tower .* reads feature group 'user', which the item tower"),
    (BLOCKS.replace('inputs { block_name: "i" }', 'inputs { block_name: "user_tower" }'),
     ("user_tower", "item_tower"),
     r"blocks\['item_tower'\] of the item tower .* reads block 'user_tower', which the "
     r"user tower"),
    (BLOCKS + 'blocks { name: "idle" inputs { block_name: "u" } }', ("user_tower", "item_tower"),
     WHERE + r"\.blocks \['idle'\] feed neither tower's output block"),
    (BLOCKS, ("u", "i"), r"\['user_tower', 'item_tower'\] feed neither tower"),
    (BLOCKS.replace('module { class_name: "MLP" mlp { hidden_units: [4] } }',
                    'lambda { expression: "lambda x: [x, x]" }'),
     ("user_tower", "item_tower"),
     r"output_blocks: 'item_tower' \(the item tower's\) gives a list of 2 tensors"),
    (BLOCKS.replace('module { class_name: "MLP" mlp { hidden_units: [4] } }',
                    'lambda { expression: "lambda x: x.unsqueeze(1)" }'),
     ("user_tower", "item_tower"), r"'item_tower' \(the item tower's\) gives B x 1 x 8"),
    (BLOCKS.replace('"u" }', '"nope" }', 1), ("user_tower", "item_tower"),
     r"block_name 'nope' is not a block"),
])
def test_a_backbone_whose_towers_are_not_apart_is_refused_naming_the_block(blocks, outputs,
                                                                         error):
    with pytest.raises(ModelError, match=error):
        fake_model(config(blocks, outputs))


def test_a_group_no_tower_reads_and_joined_outputs_are_refused():
    three = GROUPS + ('feature_groups { group_name: "other" feature_names: "cate_id" '
                      'group_type: DEEP }')
    with pytest.raises(ModelError, match=WHERE + r": feature groups \['other'\] feed "
                                                 r"neither tower"):
        fake_model(config(groups=three))
    concat = config().replace('output_blocks: "item_tower" output_blocks: "user_tower"',
                              'concat_blocks: "item_tower" concat_blocks: "user_tower"')
    with pytest.raises(ModelError, match=WHERE + r"\.concat_blocks: a match backbone gives "
                                                 r"two outputs"):
        fake_model(concat)
    top = config().replace('output_blocks: "user_tower"',
                           'output_blocks: "user_tower" top_mlp { hidden_units: [4] }')
    with pytest.raises(ModelError, match=WHERE + r"\.top_mlp would join the two towers"):
        fake_model(top)
    with pytest.raises(ModelError, match=r"match_backbone.model_params.similarity: only "
                                         r"COSINE and INNER_PRODUCT"):
        fake_model(config(params="similarity: EUCLID"))
    with pytest.raises(ModelError, match=r"match_backbone.model_params.temperature=0.0"):
        fake_model(config(params="temperature: 0"))


# A package called by the user tower alone, over its input block: the tower's.
PACKAGE = """
  packages { name: "proj" blocks { name: "lin" inputs { use_package_input: true }
             module { class_name: "MLP" mlp { hidden_units: [3] } } } }
  blocks { name: "u" inputs { feature_group_name: "user" } input_layer {} }
  blocks { name: "i" inputs { feature_group_name: "item" } input_layer {} }
  blocks { name: "user_tower" inputs { package_name: "proj" package_input: "u" } }
  blocks { name: "item_tower" inputs { block_name: "i" } }
"""


def test_a_package_belongs_to_the_tower_that_calls_it():
    model = fake_model(config(PACKAGE, ("user_tower", "item_tower"), "output_dim: 5"))
    assert len(model.user_tower.backbone.packages) == 1
    assert len(model.item_tower.backbone.packages) == 0
    assert model.user_tower.output.weight.shape == (5, 3)
    assert model.item_tower.output.weight.shape == (5, 8)
    both = PACKAGE.replace('inputs { block_name: "i" }',
                           'inputs { package_name: "proj" package_input: "i" }')
    with pytest.raises(ModelError, match=r"blocks\['user_tower'\] of the user tower .* reads "
                                         r"package 'proj', which the item tower"):
        fake_model(config(both, ("user_tower", "item_tower"), "output_dim: 5"))


_PIPELINE = """model_dir: "m"
model_config { %s }
feature_configs { id_feature { feature_name: "u" expression: "user:u" num_buckets: 5
  embedding_dim: 4 } }
feature_configs { id_feature { feature_name: "i" expression: "item:i" num_buckets: 5
  embedding_dim: 4 } }
data_config { dataset_type: ParquetDataset label_fields: "clk" }
"""


def test_a_match_backbone_without_negatives_is_refused_naming_its_field():
    groups = ('feature_groups { group_name: "user" feature_names: "u" group_type: DEEP } '
              'feature_groups { group_name: "item" feature_names: "i" group_type: DEEP } ')
    blocks = ('blocks { name: "user" inputs { feature_group_name: "user" } } '
              'blocks { name: "item" inputs { feature_group_name: "item" } }')
    text = _PIPELINE % config(blocks, ("user", "item"), "", groups, "")
    with pytest.raises(ConfigError, match=r"model_config.match_backbone has no negatives: set "
                                          r"model_params.in_batch_negative: true"):
        validate_pipeline_config(parse_pipeline_config(text))
    validate_pipeline_config(parse_pipeline_config(
        _PIPELINE % config(blocks, ("user", "item"), "", groups)))
