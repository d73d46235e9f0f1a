"""Inference-only speed-ups, applied to a copy of the model that only decoding sees.

`Translator.model` stays the plain `Transformer` (public parameter names, full state_dict, trainable);
`InferenceModel` hands decoding a copy of it with packed float32 linear layers (CPU), dynamic int8
linear layers, or a torch.compile'd decoder step, and makes that copy again whenever the plain
model's weights have changed since.
"""
from __future__ import annotations

import copy
import threading
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.ao.nn.intrinsic import LinearReLU

from xattn.errors import ParameterError
from xattn.attention import MultiHeadAttention
from xattn.layers import ACTIVATIONS, DecoderLayer, EncoderLayer, FeedForward
from xattn.model import Transformer


@dataclass(frozen=True)
class Speedups:
    """What the decoding copy gets. `pack`: float32 linear layers packed by oneDNN (CPU, not with
    `compile`); `quantize="int8"`: dynamic int8 linear layers (CPU); `compile`: torch.compile the
    decoder step, with plain linear layers, which the compiler lowers itself (it cannot lower PackedLinear)."""

    pack: bool = True
    quantize: str | None = None
    compile: bool = False

    def __post_init__(self):
        if self.quantize not in (None, "int8"):
            raise ParameterError("quantize", f"int8 or None, got {self.quantize!r}")

    def need_copy(self, device: torch.device) -> bool:
        """Whether decoding on `device` needs a rewritten copy at all (int8 off the CPU is an error)."""
        if self.quantize == "int8" and device.type != "cpu":
            raise ParameterError("device", f"int8 quantization runs on the CPU only, not on {device}")
        packs = self.pack and device.type == "cpu" and torch.backends.mkldnn.is_available()
        return self.quantize is not None or self.compile or packs


def prepare(model: Transformer, speedups: Speedups) -> Transformer:
    """An eval-mode copy of `model` rewritten for decoding; it shares every parameter it does not rewrite."""
    fast = copy.deepcopy(model, {id(p): p for p in model.parameters()}).eval()
    rewrite(fast, speedups)
    if type(model.generator) is torch.nn.Linear and not speedups.compile:
        fast.generator = FastOutput(model.generator, fast.generator, speedups)
    if speedups.compile:
        fast.decode = torch.compile(fast.decode, dynamic=True)
    return fast


QUANTIZING = threading.Lock()
"""Held by an int8 rewrite (a shortlist's output layer is rewritten per batch, so by two Translator.workers parts
at once): warnings.catch_warnings saves and restores the process's filters, and two at once leave them wrong."""


def rewrite(module: torch.nn.Module, speedups: Speedups) -> torch.nn.Module:
    """`module` with its linear layers quantized or packed as `speedups` says, in place; an FFN's activation is
    fused into its first layer where the rewrite has a fused form (ReLU in int8; ReLU, GELU and swish packed)."""
    if speedups.quantize == "int8":
        fuse_activations(module, INT8_FUSED)
        with QUANTIZING, warnings.catch_warnings():  # the filters are process-wide: one rewrite at a time
            warnings.simplefilter("ignore")
            torch.ao.quantization.quantize_dynamic(module, int8_layers(module), dtype=torch.qint8, inplace=True)
            fuse_int8_self_projections(module)
    elif speedups.pack and not speedups.compile:
        pack_linear_layers(module)
    return module


def int8_layers(module: torch.nn.Module) -> dict[str, torch.ao.quantization.QConfig]:
    """What int8 quantizes, by name: every linear layer (or fused LinearReLU) but those of no width, a pruned-away
    attention's, which stay float: a dynamic int8 layer with no inputs returns uninitialised memory, not its bias."""
    return {name: torch.ao.quantization.default_dynamic_qconfig for name, m in module.named_modules()
            if type(m) in (torch.nn.Linear, LinearReLU) and (m if type(m) is torch.nn.Linear else m[0]).weight.numel()}


Fused = dict[Callable[[Tensor], Tensor], Callable[[torch.nn.Linear], torch.nn.Module]]
"""An activation function -> the maker of a fused first layer from the plain float32 nn.Linear before it."""


def fuse_activations(module: torch.nn.Module, fused: Fused) -> None:
    """Give each FFN whose activation `fused` maps that fused first layer, and no activation of its own after it:
    no pass over the (rows, d_ff) hidden layer of its own (the figures: benchmarks/README.md, Translation speed).
    In place: use it on a copy (`prepare`)."""
    for ffn in module.modules():
        if isinstance(ffn, FeedForward) and type(ffn.fc1) is torch.nn.Linear and ffn.activation in fused \
                and ffn.fc1.weight.dtype == torch.float32:
            ffn.fc1, ffn.activation = fused[ffn.activation](ffn.fc1), identity


INT8_FUSED: Fused = {F.relu: lambda linear: LinearReLU(linear, torch.nn.ReLU())}
"""What int8 fuses: a ReLU, which dynamic quantization turns with its layer into one kernel (LinearReLU)."""


class FastOutput(torch.nn.Module):
    """The decoding copy's output projection: `fast`, the plain `linear` rewritten by `speedups`; `restrict`
    gives the same rewrite of some of its rows (a shortlist's, decoding/step.py)."""

    def __init__(self, linear: torch.nn.Linear, fast: torch.nn.Module, speedups: Speedups):
        super().__init__()
        self.fast, self.speedups = fast, speedups
        self.plain = [linear]  # a list: not a submodule (its parameters are the model's own)

    def forward(self, x: Tensor) -> Tensor:
        return self.fast(x)

    def restrict(self, vocab: Tensor) -> torch.nn.Module:
        return rewrite(torch.nn.Sequential(linear_rows(self.plain[0], vocab)), self.speedups)[0]


def linear_rows(linear: torch.nn.Linear, rows: Tensor) -> torch.nn.Linear:
    """A new linear layer with the output rows `rows` of `linear` (a shortlist's ids of the output projection)."""
    with torch.inference_mode(False), torch.no_grad():
        out = torch.nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None,
                              device=linear.weight.device, dtype=linear.weight.dtype)
        out.weight.copy_(linear.weight.index_select(0, rows))
        if linear.bias is not None:
            out.bias.copy_(linear.bias.index_select(0, rows))
    return out


Stamp = list[tuple[Tensor, int, int]]
"""(tensor, version counter, data pointer) of each parameter and persistent buffer."""


def weight_stamp(model: torch.nn.Module) -> Stamp:
    """What changes when the weights do: in-place writes (optimizer steps, load_state_dict, no_grad
    edits) bump the version counter, `.data =` and `.to()` move the data, a new Parameter is another tensor.
    Writes through `p.data` in place are the exception: autograd does not see them either."""
    return [(t, -1 if t.is_inference() else t._version, t.data_ptr())
            for t in model.state_dict(keep_vars=True).values()]


def same_stamp(a: Stamp, b: Stamp) -> bool:
    return len(a) == len(b) and all(x is y and vx == vy and px == py for (x, vx, px), (y, vy, py) in zip(a, b))


class InferenceModel:
    """What decoding runs on: `source` itself, or (with speedups that apply on `device`) a rewritten
    copy of it, made again before use whenever `source`'s weights have changed since it was made."""

    def __init__(self, source: Transformer, speedups: Speedups | None, device: torch.device):
        self.source, self.speedups = source, speedups
        self.rewrites = speedups is not None and speedups.need_copy(device)
        self._copy: Transformer | None = None
        self._stamp: Stamp = []
        if self.rewrites:
            self.current()

    def current(self) -> Transformer:
        """The model to decode with now."""
        if not self.rewrites:
            return self.source
        stamp = weight_stamp(self.source)
        if self._copy is None or not same_stamp(stamp, self._stamp):
            self._copy, self._stamp = prepare(self.source, self.speedups), stamp
        return self._copy


class PackedLinear(torch.nn.Module):
    """An inference-only float32 linear layer whose weight oneDNN packed once for this CPU, optionally
    with the activation that follows it fused in (`activation`: "relu", "gelu" or "swish"). A single row (a lone
    greedy request's decoder step) goes through the unpacked weight: as fast fresh, and the packed GEMM's one-row
    calls grow slower once oneDNN has seen many row counts (a server after load; the figures: benchmarks/README.md,
    Serving under load)."""

    def __init__(self, linear: torch.nn.Linear, activation: str = "none"):
        super().__init__()
        self.out_features = linear.out_features
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.row_weight = linear.weight.detach()  # for one row (see forward)
        self.bias = linear.bias.detach() if linear.bias is not None else None
        self.activation = activation
        self.algorithm = "none" if activation == "gelu" else ""  # gelu: the exact (erf) form, as F.gelu

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] == 1:  # as quick as the packed GEMM when fresh, and it stays so after oneDNN has seen
            y = UNFUSED[self.activation](F.linear(flat, self.row_weight, self.bias))  # many row counts
        else:
            y = torch.ops.mkldnn._linear_pointwise(flat, self.weight, self.bias, self.activation, [], self.algorithm)
        return y.view(*x.shape[:-1], self.out_features)


def identity(x: Tensor) -> Tensor:
    return x


FUSED_ACTIVATIONS = {fn: name for name, fn in ACTIVATIONS.items()}  # oneDNN names them as the config does
UNFUSED = {"none": identity, **{name: fn for fn, name in FUSED_ACTIVATIONS.items()}}


def pack_linear_layers(model: torch.nn.Module) -> None:
    """Replace every float32 nn.Linear by a PackedLinear (inference on CPU only), fusing each FFN's
    activation into its first layer. Rewrites `model` in place: use it on a copy (`prepare`).

    oneDNN's packed GEMM is faster than the default one for the decoder's shapes, and fusing the
    activation saves a pass over the (rows, d_ff) hidden layer (the figures: benchmarks/README.md,
    Translation speed); results agree to float32 rounding. Does nothing where PyTorch was built
    without oneDNN.
    """
    if not torch.backends.mkldnn.is_available():
        return
    fuse_self_projections(model)
    fuse_activations(model, {fn: partial(PackedLinear, activation=name) for fn, name in FUSED_ACTIVATIONS.items()})
    for module in list(model.modules()):
        fused = SELF_PROJECTIONS if getattr(module, "qkv", None) is not None else ()  # left plain: unused now
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32 and child.weight.numel() \
                    and name not in fused:
                setattr(module, name, PackedLinear(child))  # (not a layer of a pruned-away attention: oneDNN refuses)


SELF_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def self_attentions(model: torch.nn.Module) -> Iterator[tuple[MultiHeadAttention, tuple[torch.nn.Module, ...]]]:
    """The learned self-attentions of `model`'s encoder and decoder layers that have heads, each with its query, key
    and value projections."""
    for layer in model.modules():
        attn = getattr(layer, "self_attn", None)
        if isinstance(layer, (EncoderLayer, DecoderLayer)) and isinstance(attn, MultiHeadAttention) and attn.n_heads:
            yield attn, tuple(getattr(attn, name) for name in SELF_PROJECTIONS)


Int8Linear = torch.ao.nn.quantized.dynamic.Linear
PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)


def fuse_int8_self_projections(model: torch.nn.Module) -> None:
    """fuse_self_projections for dynamic int8 layers: one int8 layer holding the three's int8 weights, each row with
    its own layer's scale (per-channel), so the product is bit for bit the three's (a test) in one call, with one
    quantization of the input instead of three (the figures: benchmarks/README.md, Translation speed). In place, on
    the quantized copy."""
    for attn, parts in self_attentions(model):
        weights = [p.weight() for p in parts if type(p) is Int8Linear]
        if len(weights) < 3 or any(w.qscheme() not in PER_TENSOR or w.q_zero_point() != 0 for w in weights):
            continue
        scales = torch.cat([torch.full((w.shape[0],), w.q_scale(), dtype=torch.double) for w in weights])
        weight = torch._make_per_channel_quantized_tensor(torch.cat([w.int_repr() for w in weights]), scales,
                                                          torch.zeros(scales.shape, dtype=torch.long), 0)
        attn.qkv = Int8Linear(weight.shape[1], weight.shape[0], dtype=torch.qint8)
        attn.qkv.set_weight_bias(weight, torch.cat([p.bias() for p in parts]))


def fuse_self_projections(model: torch.nn.Module) -> None:
    """Give every learned self-attention of `model` (encoder and decoder) one float32 layer for its query, key and
    value projections (MultiHeadAttention.qkv): one matrix product instead of three, bit for bit the same
    results for the decoder's shapes (a test), and fewer operations a step (the figures: benchmarks/README.md,
    Translation speed). The three layers stay (plain, sharing the model's weights) for any other call. In place:
    use it on a copy (`prepare`)."""
    for attn, parts in self_attentions(model):
        if all(type(p) is torch.nn.Linear and p.weight.dtype == torch.float32 for p in parts):
            attn.qkv = torch.nn.Linear(parts[0].in_features, sum(p.out_features for p in parts),
                                       device=parts[0].weight.device)
            with torch.no_grad():
                attn.qkv.weight.copy_(torch.cat([p.weight for p in parts]))
                attn.qkv.bias.copy_(torch.cat([p.bias for p in parts]))
            attn.qkv.requires_grad_(False)
