"""A backbone block's ``module`` (TorchEasyRec's ``TorchLayer``): class_name -> HashRec
module, wrapped to take and give a value (``List[Tensor]``, see ``lambdas``).

Supported class names and what they take (B rows):

- ``MLP`` (``mlp``), ``Cross`` (``cross``; DCN v1's network), ``CrossNet``
  (``cross_net``, its older name: ``num_layers`` layers), ``CrossV2`` (``cross_v2``),
  ``MaskNetModule`` (``mask_net_module``): a tensor (B, D) -> (B, out);
- ``Cross`` / ``CrossNet`` also a pair [x_0, x_l]: its layers from x_l with x_0 as the
  base (a recurrent block's step);
- ``FM`` (``fm``): (B, N, d) -> (B, d), the pairwise interactions;
- ``MaskBlock`` (``mask_block``): a pair [x, m], x the hidden input and m the mask's
  input (a tensor x is [x, x]) -> (B, hidden_dim);
- ``MMoE`` (``mmoe``): (B, D) -> a list of ``num_task`` mixes of the experts (B, E);
- ``DIN`` (``din``): a SEQUENCE feature group -> (B, sequence width), target attention;
- ``Add``: a list -> its elementwise sum (a tensor: itself);
- torch.nn layers with ``st_params``: ``Linear`` (in_features, out_features, bias),
  ``Dropout`` (p), ``LayerNorm`` (normalized_shape), ``BatchNorm1d`` (num_features),
  ``ReLU``, ``Sigmoid``, ``Tanh``, ``GELU``, ``Identity``.
"""

from dataclasses import dataclass

import torch
from google.protobuf.json_format import MessageToDict
from torch import nn

from hashrec.models.backbone.lambdas import LIST, TENSOR
from hashrec.models.errors import ModelError
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.mmoe import gate_mix
from hashrec.modules import MLP, CrossV2, DINAttention, FactorizationMachine
from hashrec.modules.cross import Cross
from hashrec.modules.dropout import Dropout
from hashrec.modules.masknet import MaskBlock, MaskBlockOptions

# A SEQUENCE group's value: [query (B, Dq), sequence (B, L, Ds), lengths (B,)].
SEQUENCE = "sequence"


@dataclass(frozen=True)
class Value:
    """A value as the builder sees it: its kind and an example (batch 2) of its tensors."""

    kind: str
    tensors: tuple[torch.Tensor, ...]


class OnTensor(nn.Module):
    """A module of one tensor as a value's map."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.inner(value[0])]


class CrossPair(nn.Module):
    """[x_0, x_l] -> [DCN v1 cross layers from x_l over the base x_0]."""

    def __init__(self, cross: Cross) -> None:
        super().__init__()
        self.cross = cross

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.cross(value[0], value[1])]


class MaskBlockPair(nn.Module):
    """[x, m] (or [x]) -> [MaskBlock: m's mask scales x]."""

    def __init__(self, block: MaskBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.block(value[-1], value[0])]


class MMoEExperts(nn.Module):
    """(B, D) -> num_task gate mixes of the experts, each (B, E)."""

    def __init__(self, experts: list[nn.Module], gates: list[nn.Module]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.gates = nn.ModuleList(gates)

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        x = value[0]
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)
        return [gate_mix(gate(x), experts) for gate in self.gates]


class DINBlock(nn.Module):
    """[query, sequence, lengths] -> [target attention of the sequence]."""

    def __init__(self, attention: DINAttention) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.attention(value[0], value[1], value[2])]


class AddAll(nn.Module):
    """A list -> [the sum of its tensors]."""

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        total = value[0]
        for t in value[1:]:
            total = total + t
        return [total]


_TORCH_LAYERS = {
    "Linear": (nn.Linear, ("in_features", "out_features", "bias")),
    "Dropout": (Dropout, ("p",)),
    "LayerNorm": (nn.LayerNorm, ("normalized_shape", "eps")),
    "BatchNorm1d": (nn.BatchNorm1d, ("num_features", "eps", "momentum")),
    "ReLU": (nn.ReLU, ()), "Sigmoid": (nn.Sigmoid, ()), "Tanh": (nn.Tanh, ()),
    "GELU": (nn.GELU, ()), "Identity": (nn.Identity, ()),
}
# class_name -> the TorchLayer params field it reads ("" for none or st_params).
_PARAMS = {"MLP": "mlp", "Cross": "cross", "CrossNet": "cross_net", "CrossV2": "cross_v2",
           "MaskNetModule": "mask_net_module", "FM": "fm", "MaskBlock": "mask_block",
           "MMoE": "mmoe", "DIN": "din", "Add": ""}
CLASS_NAMES = tuple(_PARAMS) + tuple(_TORCH_LAYERS)


def build_layer(config, value: Value, where: str) -> tuple[nn.Module, str]:
    """(the value map of ``config``, a TorchLayer message, over ``value``; its output kind).

    Raises:
        ModelError: an unknown class_name, options of another class, an input of a kind
            or shape the class does not take, or bad options; names ``where``.
    """
    name = config.class_name
    if name not in CLASS_NAMES:
        raise ModelError(f"{where}.class_name {name!r} is not supported; supported: "
                         f"{', '.join(CLASS_NAMES)}")
    given = config.WhichOneof("params")
    wanted = _PARAMS.get(name, "st_params")
    if given is not None and given != wanted and not (wanted == "" and given == "st_params"
                                                      and not MessageToDict(config.st_params)):
        raise ModelError(f"{where}: class_name {name!r} with {given} options; "
                         f"{name} takes {wanted or 'no options'}")
    if value.kind == SEQUENCE and name != "DIN":
        raise ModelError(f"{where}: {name} over a SEQUENCE feature group; only DIN reads "
                         f"one (use DEEP groups for {name})")
    try:
        return _BUILDERS.get(name, _torch_layer)(config, value, where)
    except ModelError:
        raise
    except ValueError as err:
        raise ModelError(f"{where} ({name}): {err}") from None


def _tensor_width(value: Value, where: str, name: str, rank: int = 2) -> int:
    if value.kind != TENSOR:
        raise ModelError(f"{where}: {name} takes one tensor, got a list of "
                         f"{len(value.tensors)}; set merge_inputs_into_list: false to "
                         f"concatenate the inputs, or pick one with input_fn")
    shape = value.tensors[0].shape
    if len(shape) != rank:
        raise ModelError(f"{where}: {name} takes a {rank}-dimensional tensor, got "
                         f"{len(shape)} dimensions (B x {' x '.join(map(str, shape[1:]))})")
    return int(shape[-1])


def _mlp(config, value, where):

    mlp = MLP(_tensor_width(value, where, "MLP"), mlp_options(config.mlp, where + ".mlp"))
    return OnTensor(mlp), TENSOR


def _cross(config, value, where):
    layers = config.cross_net.num_layers if config.class_name == "CrossNet" \
        else config.cross.cross_num
    if value.kind == LIST and len(value.tensors) == 2:
        widths = {int(t.shape[-1]) for t in value.tensors}
        if len(widths) != 1 or value.tensors[0].dim() != 2:
            raise ModelError(f"{where}: {config.class_name} over a pair [x_0, x_l] needs "
                             f"two (B, D) tensors of one width")
        return CrossPair(Cross(widths.pop(), layers)), TENSOR
    return OnTensor(Cross(_tensor_width(value, where, config.class_name), layers)), TENSOR


def _cross_v2(config, value, where):
    options = config.cross_v2
    width = _tensor_width(value, where, "CrossV2")
    return OnTensor(CrossV2(width, options.cross_num, options.low_rank)), TENSOR


def _mask_net(config, value, where):
    from hashrec.models.mask_net import build_mask_net

    width = _tensor_width(value, where, "MaskNetModule")
    return OnTensor(build_mask_net(config.mask_net_module, width,
                                   where + ".mask_net_module")), TENSOR


def _fm(config, value, where):
    _tensor_width(value, where, "FM (B x N x d; reshape with input_fn "
                  "'lambda x: x.reshape(x.shape[0], N, d)')", rank=3)
    return OnTensor(FactorizationMachine()), TENSOR


def _mask_block(config, value, where):
    if value.kind == LIST and len(value.tensors) != 2:
        raise ModelError(f"{where}: MaskBlock takes a tensor or a pair [x, m], got a list "
                         f"of {len(value.tensors)}")
    widths = [int(t.shape[-1]) for t in value.tensors]
    options = config.mask_block
    block = MaskBlockOptions(options.hidden_dim, options.reduction_ratio,
                             options.aggregation_dim if options.HasField("aggregation_dim")
                             else None)
    return MaskBlockPair(MaskBlock(widths[-1], widths[0], block)), TENSOR


def _mmoe(config, value, where):

    options = config.mmoe
    width = _tensor_width(value, where, "MMoE")
    if options.num_expert < 1 or options.num_task < 1:
        raise ModelError(f"{where}.mmoe: num_expert={options.num_expert}, num_task="
                         f"{options.num_task}; both must be 1 or more")
    experts = [MLP(width, mlp_options(options.expert_mlp, where + ".mmoe.expert_mlp"))
               for _ in range(options.num_expert)]
    gates = []
    for _ in range(options.num_task):
        gate, gate_width = optional_mlp(options, "gate_mlp", width, where + ".mmoe.gate_mlp")
        gates.append(nn.Sequential(gate or nn.Identity(),
                                   nn.Linear(gate_width, options.num_expert)))
    return MMoEExperts(experts, gates), LIST


def _din(config, value, where):

    if value.kind != SEQUENCE:
        raise ModelError(f"{where}: DIN reads a SEQUENCE feature group (its query and "
                         f"sequence features); give it one as its only input")
    query, sequence, _ = value.tensors
    attention = DINAttention(int(query.shape[-1]), int(sequence.shape[-1]),
                             mlp_options(config.din.attn_mlp, where + ".din.attn_mlp"))
    return DINBlock(attention), TENSOR


def _add(config, value, where):
    if value.kind == TENSOR:
        return OnTensor(nn.Identity()), TENSOR
    if len({tuple(t.shape) for t in value.tensors}) != 1:
        raise ModelError(f"{where}: Add of tensors of different shapes "
                         f"{[tuple(t.shape[1:]) for t in value.tensors]}")
    return AddAll(), TENSOR


def _torch_layer(config, value, where):
    name = config.class_name
    cls, allowed = _TORCH_LAYERS[name]
    kwargs = MessageToDict(config.st_params) if config.HasField("st_params") else {}
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ModelError(f"{where}.st_params: {name} does not take {unknown}; allowed: "
                         f"{', '.join(allowed) or 'none'}")
    kwargs = {k: int(v) if isinstance(v, float) and v.is_integer() and k != "p" else v
              for k, v in kwargs.items()}
    width = _tensor_width(value, where, name, rank=value.tensors[0].dim()
                          if value.kind == TENSOR else 2)
    for key in ("in_features", "normalized_shape", "num_features"):
        if key in kwargs and kwargs[key] != width:
            raise ModelError(f"{where}.st_params: {name} {key}={kwargs[key]} but its input "
                             f"has {width} columns; set {key}: {width}")
    if name == "Linear" and "out_features" not in kwargs:
        raise ModelError(f"{where}.st_params: Linear needs out_features")
    if name in ("Linear", "LayerNorm", "BatchNorm1d"):
        key = {"Linear": "in_features", "LayerNorm": "normalized_shape"}.get(name,
                                                                           "num_features")
        kwargs[key] = width
    return OnTensor(cls(**kwargs)), TENSOR


_BUILDERS = {"MLP": _mlp, "Cross": _cross, "CrossNet": _cross, "CrossV2": _cross_v2,
             "MaskNetModule": _mask_net, "FM": _fm, "MaskBlock": _mask_block, "MMoE": _mmoe,
             "DIN": _din, "Add": _add}
