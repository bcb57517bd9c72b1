"""rank_backbone and multi_task_backbone on the fakes: the block DAG's order, merge
semantics and errors, each module class against its HashRec module, the scripted network
equal to the eager one and free of host reads."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import ModelError, MultiTaskBackbone, RankBackbone
from hashrec.modules import MLP

GROUPS = """
feature_groups { group_name: "deep" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
feature_groups { group_name: "seq" feature_names: ["item_id", "cate_id",
                 "click_seq__item_id", "click_seq__cate_id"] group_type: SEQUENCE }
"""
WIDTH = 3 * DIM + 1


def _deep_only() -> str:
    return GROUPS.split('feature_groups { group_name: "seq"')[0]


def _rank(blocks: str, tail: str = 'concat_blocks: "out"', groups: str = GROUPS) -> str:
    return (groups + f"rank_backbone {{ backbone {{ {blocks} {tail} }} }}\n"
            "losses { binary_cross_entropy {} }")


# every module class and layer kind in one DAG, written out of order
BLOCKS = """
  blocks { name: "out" inputs { block_name: "top" } inputs { block_name: "fm" }
           merge_inputs_into_list: true lambda { expression: "lambda xs: torch.cat(xs, dim=1)" } }
  blocks { name: "top" inputs { block_name: "dcn" } inputs { block_name: "masks" }
           inputs { block_name: "fm" } inputs { block_name: "din" }
           module { class_name: "MLP" mlp { hidden_units: [8] } } }
  blocks { name: "deep" inputs { feature_group_name: "deep" } input_layer {} }
  blocks { name: "dcn" inputs { block_name: "deep" input_fn: "lambda x: [x, x]" }
           recurrent { num_steps: 2 fixed_input_index: 0
                       module { class_name: "Cross" cross { cross_num: 1 } } } }
  blocks { name: "masks" inputs { block_name: "deep" input_fn: "lambda x: [x, x]" }
           repeat { num_repeat: 2 output_concat_axis: -1
                    module { class_name: "MaskBlock" mask_block { hidden_dim: 4 } } } }
  blocks { name: "fm" inputs { block_name: "deep" input_slice: "[..., :12]"
                               input_fn: "lambda x: x.reshape(x.shape[0], 3, 4)" }
           module { class_name: "FM" fm {} } }
"""
DIN = """blocks { name: "din" inputs { feature_group_name: "seq" }
           module { class_name: "DIN" din { attn_mlp { hidden_units: [8] } } } }"""
TOP = 'concat_blocks: "out" top_mlp { hidden_units: [4] }'
FULL = _rank(BLOCKS + DIN, TOP)
# DIN's attention packs the valid positions off CUDA (hashrec.modules.din)
NO_DIN = _rank(BLOCKS.replace('inputs { block_name: "din" }', ""), TOP, _deep_only())


def _inputs(model, batch):
    return list(model.dense_inputs(model.embedding(batch.sparse), batch))


def test_blocks_run_after_their_inputs_and_each_module_is_hashrecs():
    model = fake_model(FULL)
    assert type(model) is RankBackbone
    blocks = model.net.backbone.blocks
    # run order: deep, dcn, masks, fm, din, top, out (each after its inputs, else config order)
    assert blocks[-1].slots == [2 + 5, 2 + 3] and blocks[0].slots == [0]
    model.eval()
    batch = make_batch(5)
    deep, query, sequence, lengths = _inputs(model, batch)
    cross = blocks[1].layers[0].layers
    x = deep
    for step in cross:  # each step one cross layer from the previous output
        layer = step.cross
        x = deep * layer.weights[0](x) + layer.biases[0] + x
    mask_steps = blocks[2].layers[0].steps
    masks = torch.cat([step.ops[0].block(deep, deep) for step in mask_steps], dim=-1)
    pairs = deep[:, :12].reshape(5, 3, 4)
    fm = 0.5 * (pairs.sum(1) ** 2 - (pairs ** 2).sum(1))
    din = blocks[4].layers[0].attention(query, sequence, lengths)
    top = blocks[5].layers[0].inner(torch.cat([x, masks, fm, din], dim=-1))
    hidden = model.net.backbone.top_mlp(torch.cat([top, fm], dim=-1))
    expected = model.net.heads[0](hidden).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    assert isinstance(model.net.backbone.top_mlp, MLP)


def test_the_network_scripts_equal_and_reads_nothing_on_the_host():
    model = fake_model(FULL)
    train_one_batch(model)
    model.eval()
    inputs = _inputs(model, make_batch(6))
    torch.testing.assert_close(torch.jit.script(model.net)(inputs), model.net(inputs))
    no_din = fake_model(NO_DIN)
    inputs = _inputs(no_din, make_batch(6))
    with HostReads() as reads:
        no_din.net(inputs)
    assert not reads.counts


@pytest.mark.parametrize("merge, shape", [
    ("", (WIDTH * 2,)), ("input_concat_axis: 0", None), ("merge_inputs_into_list: true", 2),
], ids=["concat-last-axis", "concat-rows", "list"])
def test_inputs_concatenate_or_make_a_list(merge, shape):
    blocks = f"""blocks {{ name: "out" inputs {{ feature_group_name: "deep" }}
      inputs {{ feature_group_name: "deep" input_fn: "lambda x: x * 2" }} {merge} }}"""
    if shape == 2:  # a list into a rank model's head is refused; into the heads of two
        with pytest.raises(ModelError, match="gives a list of 2 outputs; rank_backbone "
                                             "needs one: use concat_blocks"):
            fake_model(_rank(blocks, 'output_blocks: "out"', GROUPS.split("feature_groups")[0]
                             + "feature_groups" + GROUPS.split("feature_groups")[1]))
        return
    if shape is None:  # rows concatenated: twice the batch, which the loss cannot read
        model = fake_model(_rank(blocks.replace("out", "o2") + """ blocks { name: "out"
            inputs { block_name: "o2" input_fn: "lambda x: x[:, :4]" } }""",
                                 groups=_deep_only()))
        assert model.net(_inputs(model, make_batch(3))).shape == (6,)
        return
    model = fake_model(_rank(blocks, groups=_deep_only()))
    assert model.net.heads[0].in_features == shape[0]


@pytest.mark.parametrize("blocks, message", [
    ('blocks { name: "out" inputs { block_name: "a" } } blocks { name: "a" inputs { '
     'block_name: "b" } } blocks { name: "b" inputs { block_name: "a" } }',
     "blocks a -> b -> a form a cycle"),
    ('blocks { name: "out" inputs { block_name: "nope" } }',
     "blocks['out']: block_name 'nope' is not a block (blocks: out)"),
    ('blocks { name: "out" inputs { feature_group_name: "nope" } }',
     "feature_group_name 'nope' is not a feature group (groups: deep)"),
    ('blocks { name: "out" }', "blocks['out'] has no inputs"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } } '
     'blocks { name: "out" inputs { feature_group_name: "deep" } }',
     "two blocks are named 'out'"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } module { class_name: "Foo" } }',
     "class_name 'Foo' is not supported"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } '
     'lambda { expression: "lambda x: os.system(1)" } }', "lambda 'lambda x: os.system(1)'"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } '
     'inputs { feature_group_name: "deep" } merge_inputs_into_list: true '
     'module { class_name: "MLP" mlp { hidden_units: [4] } } }',
     "MLP takes one tensor, got a list of 2; set merge_inputs_into_list: false"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } '
     'module { class_name: "FM" fm {} } }', "FM (B x N x d"),
    ('blocks { name: "out" inputs { feature_group_name: "deep" } module { class_name: '
     '"Linear" st_params { fields { key: "in_features" value { number_value: 5 } } '
     'fields { key: "out_features" value { number_value: 2 } } } } }',
     f"Linear in_features=5 but its input has {WIDTH} columns"),
], ids=["cycle", "unknown-block", "unknown-group", "no-inputs", "duplicate", "unknown-class",
        "bad-lambda", "list-into-mlp", "fm-2d", "linear-width"])
def test_config_errors_name_the_block_and_what_to_do(blocks, message):
    with pytest.raises(ModelError, match="model_config.rank_backbone.backbone") as err:
        fake_model(_rank(blocks, groups=_deep_only()))
    assert message in str(err.value)


MULTI = _deep_only() + """
multi_task_backbone {
  backbone {
    blocks { name: "mmoe" inputs { feature_group_name: "deep" }
             module { class_name: "MMoE" mmoe { expert_mlp { hidden_units: [6] } num_expert: 3
                                               num_task: 2 gate_mlp { hidden_units: [4] } } } }
  }
  task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] } }
  task_towers { tower_name: "cvr" label_name: "buy" }
}
"""


def test_multi_task_towers_read_the_outputs_of_their_position():
    model = fake_model(MULTI, labels=("clk", "buy"))
    assert type(model) is MultiTaskBackbone
    model.eval()
    batch = make_batch(4)
    (deep,) = _inputs(model, batch)
    mmoe = model.net.backbone.blocks[0].layers[0]
    experts = torch.stack([e(deep) for e in mmoe.experts], dim=1)
    mixes = [(torch.softmax(g(deep), -1).unsqueeze(-1) * experts).sum(1) for g in mmoe.gates]
    out = model(batch)
    for i, name in enumerate(("ctr", "cvr")):
        torch.testing.assert_close(out[f"logits_{name}"],
                                   model.net.heads[i](mixes[i]).squeeze(-1))
    with pytest.raises(ModelError, match="gives 2 outputs for 3 task towers"):
        fake_model(MULTI.replace('task_towers { tower_name: "cvr" label_name: "buy" }',
                                 'task_towers { tower_name: "cvr" label_name: "buy" } '
                                 'task_towers { tower_name: "c3" label_name: "buy" }'),
                   labels=("clk", "buy"))
