"""Recognizes a PyTorch nn.Module as a fusejit chain, with torch.fx.

    r = recognize(model)          # raises Unsupported, naming the layer or call and what is accepted
    r.ops                         # ["conv_transpose3d(out=16,k=3,stride=2,padding=1)", "swish", ...]
    r.params                      # {"0.weight": <the model's own Parameter>, ...}
    r.param_paths                 # {"0.weight": "conv_transpose.weight", ...}
    r.spec((128, 3, 16, 32, 32))  # "x:f32[128,3,16,32,32] | conv_transpose3d(...) | swish | ..."

The op texts are the canonical ones codegen/chain.cc prints (OpText): sizes as one int when all
three agree, arguments at their defaults left out, numbers in the shortest text that reads back to
the same double (FormatDouble), so a spec built here equals fusejit's own printing of it.

What is recognized (torch.fx.symbolic_trace of the model, leaf modules are torch.nn's):
- producer, first: nn.Conv3d / nn.ConvTranspose3d (groups=1, padding_mode='zeros', padding
  'valid' or symmetric 'same' resolved), F.conv3d / F.conv_transpose3d / torch.conv3d /
  torch.conv_transpose3d with the model's own Parameters (get_attr) as weight and bias.
- elementwise, as modules, functions, methods and in-place forms: relu, leaky_relu, sigmoid, tanh,
  silu -> swish, hardswish, gelu (approximate='tanh' -> gelu_tanh), clamp (torch.clamp,
  Tensor.clamp, clip), mish, softplus (beta, threshold), elu (alpha), selu, hardsigmoid, celu
  (alpha), logsigmoid, softsign, tanhshrink (modules nn.Mish, nn.Softplus, nn.ELU, nn.SELU,
  nn.Hardsigmoid, nn.CELU, nn.LogSigmoid, nn.Softsign, nn.Tanhshrink and their F. / torch.
  functions), -x (operator.neg, torch.neg, Tensor.neg) -> mul(by=-1),
  hardtanh (nn.Hardtanh, F.hardtanh, nn.ReLU6 and F.relu6 -> hardtanh(min=0,max=6): clamp's values,
  gradient 0 at the bounds where clamp's is 1); a clamp with only min or only max is the
  grammar's one-sided clamp (clamp(min=0) too: its gradient at 0 is 1, relu's 0), swish written out
  (x * sigmoid(x) in either order, any sigmoid spelling, also x * hardsigmoid(x) -> hardswish),
  hardswish written out (x * relu6(x + 3) / 6 and x * (relu6(x + 3) / 6), relu6 in any spelling;
  with torch.clamp(x + 3, 0, 6) marked: its gradient at +-3 is not hardswish's); a constant
  multiply, divide, add or subtract (x * 2, 0.5 * x, x / 4, x + 1, 1 + x, x - 0.5, torch.mul /
  div / add / sub, the methods and in-place forms, *= /= += -=, with a Python number; 1 - x ->
  mul(by=-1) | add(by=1)) -> mul(by)
  or add(by); x / c is mul(by=1/c), x - c is add(by=-c).
- at most one group_norm: nn.GroupNorm, F.group_norm / torch.group_norm with the model's
  Parameters as weight and bias, or with neither; nn.InstanceNorm3d (track_running_stats=False)
  as group_norm(groups=num_features), F.instance_norm without running statistics as
  group_norm(groups=C) (C from its weight or the convolution before it). Without weight and bias (affine=False, InstanceNorm3d's
  default) the chain's group_norm gets weight 1 and bias 0 (Recognized.norm_constants: tensors
  the drop-in makes, not model parameters).
- last, optional: mean over dims {2,3,4} or {1,2,3,4} (negative dims, tuple, list or int,
  consecutive means combined, keepdim either, dim= or axis=), as torch.mean or Tensor.mean; also
  global average pooling, adaptive_avg_pool3d(x, 1) (module or function), which is a mean over
  [2,3,4] with keepdim=True ([N,C,1,1,1]), or [N,C] when flatten(1) follows it (nn.Flatten,
  torch.flatten, Tensor.flatten). The chain's mean gives [N,C] or [N]; Recognized.out_dims says
  how its result is viewed as the model's (size-1 dimensions kept).
- a multiply, divide, add or subtract by one of the model's nn.Parameters (or registered buffers)
  shaped per channel
  ([C,1,1,1], [1,C,1,1,1] or one value: x * self.scale, x + self.bias, self.bias - x, ...) right
  after the convolution or the group_norm (several in a row too): folded into that op's weight and
  bias (Recognized.folds: (conv(x) + b) * s = conv(x, w s) + b s); a convolution without a bias
  gets one when an add is folded into it. Elsewhere (after a nonlinearity) it is refused.
- nn.BatchNorm3d, and nn.InstanceNorm3d with track_running_stats=True, in eval mode: the
  per-channel affine (x - running_mean) / sqrt(running_var + eps) * weight + bias, folded the same
  way ("channel_norm"; Recognized.running_norms names them). In training mode they normalize with
  the batch's (the sample's) statistics and update the running ones: recognize(training_mode=True)
  refuses them (the drop-in's chain for training-mode calls stops before the first).
- skipped: nn.Identity, dropout with p=0 (modules and F.dropout) or training=False (F.dropout),
  x.contiguous(), x.clone(); dropout modules with p > 0 (nn.Dropout, nn.Dropout3d, ...), which are
  the identity in eval mode: Recognized.dropout_modules names them, and the drop-in runs the
  original forward while any of them is in training mode.
- plain subclasses of the supported modules that override nothing of their behaviour
  (`class MyConv(nn.Conv3d): pass`) count as their base class.
With partial=True (the drop-in without strict), a forward that goes on past the grammar after at
least one fused op is recognized up to there: Recognized.rest runs the rest of the traced graph as
the model's own code on the chain's output (it may read that output, the model's input -- a
residual -- and the model's registered submodules, parameters and buffers). In the rest, each
further chain that starts with a convolution is recognized too (Recognized.sub_chains: the rest
calls it); a forward with nothing to fuse at its start is all rest (Recognized.ops empty) where it
has such chains.
The traced graph must be a straight line from the one input to the returned tensor: every value is
used only by the next op (the written-out swish/hardswish use theirs twice; an in-place op whose
result is discarded, e.g. `self.relu(x)` with inplace=True, mutates the value and is followed).
Modules with hooks, subclasses that override forward, parametrized / weight_norm / lazy
(uninitialized) weights, buffers or tensors in place of Parameters are refused. An in-place op on
the model's input (e.g. x.relu_() first) changes the caller's tensor in eager mode; the fused chain
leaves it unchanged.
"""
from __future__ import annotations

import dataclasses
import decimal
import inspect
import math
import operator
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Unsupported", "Recognized", "recognize", "format_number", "GRAMMAR"]

GRAMMAR = ("the chain grammar accepts [conv3d|conv_transpose3d] -> elementwise ops (relu, leaky_relu, "
           "sigmoid, tanh, swish/silu, hardswish, gelu, clamp, hardtanh/relu6, mish, softplus, elu, "
           "selu, hardsigmoid, gelu(approximate='tanh'), logsigmoid, softsign, tanhshrink, celu, "
           "* / + - by a constant, c - x, -x) "
           "-> at most one group_norm "
           "(or instance norm without running statistics), "
           "with elementwise ops before and after it -> optional mean over [2,3,4] or [1,2,3,4]; "
           "right after the convolution or the group_norm, per-channel * / + - by a Parameter "
           "and batch norms in eval mode fold into it")


class Unsupported(Exception):
    """The model (or one call of it) is outside fusejit's chain grammar.

    `layer` is the module's qualified name or the fx node's description (None where no single node
    is to blame); `reason` is the specific problem. str() is the whole message, with GRAMMAR.
    """

    def __init__(self, message: str, layer: Optional[str] = None, reason: str = ""):
        super().__init__(message)
        self.layer = layer
        self.reason = reason or message


# ----------------------------------------------------------------------------------------------
# Numbers, printed as codegen/format_number.cc FormatDouble prints them.

def format_number(v) -> str:
    """Shortest text that reads back to exactly float(v), in std::to_chars's choice of fixed or
    scientific notation (fixed on a tie) with the exponent tidied ("1e-5", "0.01", "6", "1e20")."""
    v = float(v)
    if not math.isfinite(v):
        raise ValueError("fusejit numbers must be finite, got %r" % v)
    sign = "-" if math.copysign(1.0, v) < 0 else ""
    if v == 0:
        return sign + "0"
    t = decimal.Decimal(repr(abs(v))).as_tuple()  # repr: the shortest round-trip digits
    digits = list(t.digits)
    exp = t.exponent
    while len(digits) > 1 and digits[-1] == 0:
        digits.pop()
        exp += 1
    while len(digits) > 1 and digits[0] == 0:
        digits.pop(0)
    d = "".join(str(x) for x in digits)
    n = len(d)
    sci_exp = exp + n - 1
    sci = d[0] + ("." + d[1:] if n > 1 else "") + "e" + ("-" if sci_exp < 0 else "+") + \
        "%02d" % abs(sci_exp)
    if exp >= 0:
        fixed = str(int(abs(v)))  # to_chars prints the exact integer, not padded digits
    else:
        point = n + exp
        fixed = d[:point] + "." + d[point:] if point > 0 else "0." + "0" * (-point) + d
    if len(fixed) <= len(sci):
        return sign + fixed
    mantissa, e = sci.split("e")
    return sign + mantissa + "e" + ("-" if sci_exp < 0 else "") + str(abs(sci_exp))


def _dims3_text(d) -> str:
    d = tuple(int(x) for x in d)
    if d[0] == d[1] == d[2]:
        return str(d[0])
    return "[%d,%d,%d]" % d


# ----------------------------------------------------------------------------------------------
# The result.

@dataclasses.dataclass(eq=False)  # compared by identity: factors hold tensors
class Fold:
    """A chain parameter computed from the model's: a convolution's or group_norm's weight
    (role "scale") or bias ("shift") with the per-channel multiplies and adds after it folded in.
    (x @ w + b) * s + t is x @ (w s) + (b s + t): along the steps (op, factor path, eps), "mul" /
    "div" by the factor scale both, "add" / "sub" shift the bias, "rsub" (P - x) negates the
    weight and gives the bias P - b, "div_std" (a batch norm's running variance v) scales both by
    1 / sqrt(v + eps); "mul_by" / "add_by" (factor path None, the constant in eps's place: a
    Python-number multiply or add between the convolution and a per-channel op) scale both /
    shift the bias by that constant. `base` is the model path of the parameter folded into (None: 1 for a group_norm
    without weight, 0 for a missing bias); `axis` the weight's output-channel axis (0 conv3d, 1
    conv_transpose3d; None for a [C] vector); `factors` path -> Parameter for the base and steps."""
    base: Optional[str]
    role: str
    steps: list
    axis: Optional[int]
    channels: Optional[int]
    factors: dict = dataclasses.field(default_factory=dict, repr=False)
    buffers: frozenset = frozenset()  # the factor paths that are registered buffers
    # Paths read only for their versions (a batch norm's num_batches_tracked: it counts the
    # updates of the running statistics, which do not bump theirs), and whether the value may
    # be kept while the versions of what it reads stay (False: an instance norm's running
    # statistics, updated with no count).
    watch: tuple = ()
    cacheable: bool = True

    def paths(self) -> list:
        """The model paths this parameter is computed from (the base, then the factors), then
        those watched."""
        return ([self.base] if self.base else []) + [step[1] for step in self.steps
                                                      if step[1] is not None] + list(self.watch)

    def value(self, get, channels: int):
        """The chain parameter from the model's tensors (get(path) -> tensor), contiguous, in their
        dtype: computed in float32 for 16-bit ones and rounded once. Differentiable (torch ops), so
        gradients reach the model's parameters through it. `channels`: the group_norm's or
        convolution's channel count (for the 1 or 0 that stands for a missing base)."""
        first = get(self.paths()[0])
        dtype, device = first.dtype, first.device
        work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        if self.base is not None:
            t = get(self.base).to(work)
        else:
            t = torch.full((channels,), 1.0 if self.role == "scale" else 0.0, dtype=work,
                           device=device)
        for op, path, eps in self.steps:
            if op in ("mul_by", "add_by"):  # a constant
                if op == "mul_by" or self.role == "shift":
                    t = t * eps if op == "mul_by" else t + eps
                continue
            s = get(path).to(work).reshape(-1)
            if op == "div_std":  # a batch norm's running variance: times 1 / sqrt(var + eps)
                op, s = "mul", torch.rsqrt(s + eps)
            if self.axis is not None:  # along the weight's output channels
                s = s.reshape([-1 if a == self.axis else 1 for a in range(t.dim())])
            if op == "mul":
                t = t * s
            elif op == "div":
                t = t / s
            elif op == "rsub":  # P - (x w + b) = x (-w) + (P - b)
                t = -t if self.role == "scale" else s - t
            elif self.role == "shift":
                t = t + s if op == "add" else t - s
        return t.to(dtype).contiguous()


@dataclasses.dataclass(eq=False)
class SubChain:
    """A chain in the rest of a partially fused forward: `recognized` (its ops and parameters;
    no rest of its own), `forward(module, y)` its nodes as the model's own code (a GraphModule's
    generated forward over the live module) and `run(module, y)` what the rest calls: forward,
    until the drop-in sets its fused call there."""
    recognized: Any
    forward: Any
    run: Any = None

    def __post_init__(self):
        if self.run is None:
            self.run = self.forward


@dataclasses.dataclass(eq=False)  # compared by identity: params hold tensors
class Recognized:
    ops: list
    params: dict
    param_paths: dict
    # Extras (not needed by the spec): where each op came from, for logs and warnings.
    sources: list = dataclasses.field(default_factory=list)
    # Why calls that need gradients must run the original forward (None: they can run fused):
    # an op whose values fusejit has but whose gradient convention it does not (a clamp with only
    # min=0, run as relu; a hardswish written with torch.clamp).
    training_fallback: Optional[str] = None
    # Qualified names of the dropout modules with p > 0 ("" for the model itself): the chain is
    # the model's forward only while every one of them is in eval mode.
    dropout_modules: list = dataclasses.field(default_factory=list)
    # Qualified names of the batch norms (running statistics) folded in: the chain is the model's
    # forward only while every one of them is in eval mode; in training mode the chain that
    # recognize(training_mode=True) finds (it stops before the first) is.
    running_norms: list = dataclasses.field(default_factory=list)
    # The group_norm's weight and bias where the model has none (affine=False, InstanceNorm3d):
    # (weight name, bias name, channels), channels None where only the input tells them (a
    # functional group_norm without a convolution before it). None: every chain parameter is in
    # `params`.
    norm_constants: Optional[Tuple[str, str, Optional[int]]] = None
    # How the chain's output ([N,C] or [N] after a mean, else the input's rank) is viewed as the
    # model's: for each dimension of the model's output, the chain output's dimension it is, or
    # None for a kept size-1 dimension (mean with keepdim=True: (0, 1, None, None, None)). None:
    # the chain's output is the model's.
    out_dims: Optional[Tuple[Optional[int], ...]] = None
    # The group_norm is an nn.InstanceNorm3d: torch.autocast does not run it in float32 (as it does
    # group_norm), so under autocast it stays in the convolution's dtype.
    norm_is_instance: bool = False
    # Chain parameters computed from model parameters (per-channel multiplies and adds folded into
    # the convolution's or group_norm's weight and bias): chain name -> Fold. These names are not
    # in `params`.
    folds: dict = dataclasses.field(default_factory=dict)
    # The rest of forward after the chain, where the model goes on past the grammar: rest(module,
    # y) runs it as the model's own code on the chain's output y (viewed by out_dims), reading
    # the module's submodules and parameters at the call; rest_from says why the chain stops
    # there. None: the chain is the whole forward.
    rest: Any = dataclasses.field(default=None, repr=False, compare=False)
    rest_from: Optional[str] = None
    # Further chains found in the rest, each starting with a convolution (a second conv block
    # after a pooling, the convolutions of a residual block): in the rest they run as
    # SubChain.run(module, y), the chain's own code until the drop-in sets its fused call.
    # With no ops (a forward with nothing to fuse at its start) the whole forward is the rest,
    # rest(module, x, x), and these chains are all there is to fuse.
    sub_chains: list = dataclasses.field(default_factory=list, repr=False, compare=False)
    _conv_weight: Any = dataclasses.field(default=None, repr=False, compare=False)
    _transposed: bool = dataclasses.field(default=False, repr=False)
    # (groups, channels or None): the group_norm's, for checking an input's shape
    _gn: Optional[Tuple[int, Optional[int]]] = dataclasses.field(default=None, repr=False,
                                                                 compare=False)

    def spec(self, shape, dtype="f32") -> str:
        """The fusejit spec of this chain for an input of `shape` ([N,C,D,H,W]); raises Unsupported
        where the shape cannot be that of this model's input (rank, channels, groups)."""
        try:
            shape = [int(s) for s in shape]
        except (TypeError, ValueError):
            raise Unsupported("fusejit cannot fuse an input of shape %r: not a list of sizes"
                              % (shape,))
        if len(shape) != 5 or any(s <= 0 for s in shape):
            raise Unsupported("fusejit cannot fuse an input of shape %s: fusejit takes 5-D NCDHW "
                              "input [N,C,D,H,W] with every size >= 1" % _shape_text(shape))
        channels = shape[1]
        if self._conv_weight is not None:
            w = self._conv_weight
            cin = int(w.shape[0] if self._transposed else w.shape[1])
            if channels != cin:
                raise Unsupported("fusejit cannot fuse an input of shape %s: the convolution takes "
                                  "%d input channels" % (_shape_text(shape), cin))
            channels = int(w.shape[1] if self._transposed else w.shape[0])
        if self._gn is not None:
            groups, want = self._gn
            if (want is not None and want != channels) or channels % groups != 0:
                raise Unsupported("fusejit cannot fuse an input of shape %s: group_norm expects %s "
                                  "channels in %d groups, the chain gives it %d"
                                  % (_shape_text(shape), "a multiple of %d" % groups
                                     if want is None else want, groups, channels))
        return "x:%s%s | %s" % (_dtype_text(dtype), _shape_text(shape), " | ".join(self.ops))


def _shape_text(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.float64: "f64"}


def _dtype_text(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise Unsupported("fusejit cannot fuse an input of dtype %s" % dtype)
        return _DTYPE_NAMES[dtype]
    return str(dtype)


# ----------------------------------------------------------------------------------------------
# One op of the chain as found in the graph.

@dataclasses.dataclass
class _Op:
    kind: str                      # grammar op name, or "skip", "hardsigmoid" (only as a gate)
    where: str                     # "layer 'conv' (nn.Conv3d)", "call torch.sigmoid", ...
    attrs: dict = dataclasses.field(default_factory=dict)
    params: dict = dataclasses.field(default_factory=dict)   # role -> (Parameter, path)
    mutates_input: bool = False    # in-place on its input
    layer: Optional[str] = None    # module qualified name or node name, for Unsupported.layer

    def text(self) -> str:
        k, a = self.kind, self.attrs
        if k in ("conv3d", "conv_transpose3d"):
            s = "%s(out=%d,k=%s" % (k, a["out"], _dims3_text(a["k"]))
            if tuple(a["stride"]) != (1, 1, 1):
                s += ",stride=" + _dims3_text(a["stride"])
            if tuple(a["padding"]) != (0, 0, 0):
                s += ",padding=" + _dims3_text(a["padding"])
            if k == "conv_transpose3d" and tuple(a["output_padding"]) != (0, 0, 0):
                s += ",output_padding=" + _dims3_text(a["output_padding"])
            if tuple(a["dilation"]) != (1, 1, 1):
                s += ",dilation=" + _dims3_text(a["dilation"])
            if not a["bias"]:
                s += ",bias=false"
            return s + ")"
        if k == "leaky_relu":
            return "leaky_relu(slope=%s)" % format_number(a["slope"])
        if k in ("clamp", "hardtanh"):
            bounds = [(n, a[n]) for n in ("min", "max") if a[n] is not None]
            return "%s(%s)" % (k, ",".join("%s=%s" % (n, format_number(v)) for n, v in bounds))
        if k in ("mul", "add"):
            return "%s(by=%s)" % (k, format_number(a["by"]))
        if k == "softplus":
            return "softplus(beta=%s,threshold=%s)" % (format_number(a["beta"]),
                                                       format_number(a["threshold"]))
        if k in ("elu", "celu"):
            return "%s(alpha=%s)" % (k, format_number(a["alpha"]))
        if k == "group_norm":
            return "group_norm(groups=%d,eps=%s)" % (a["groups"], format_number(a["eps"]))
        if k == "mean":
            return "mean(dims=[%s])" % ",".join(str(d) for d in a["dims"])
        return k


class _Ctx:
    def __init__(self, model: nn.Module, training_mode: bool = False):
        self.model = model
        # recognize(training_mode=True): the batch norms normalize with the batch's statistics
        # (training mode), so they are no per-channel affine to fold, and dropout modules draw
        # masks, so they are no identity to skip
        self.training_mode = training_mode
        # Tensors forward makes from constants (torch.tensor(2.0)), which torch.fx keeps as
        # attributes "_tensor_constant<i>" it sets on the model: taken off it (_trace), by name
        self.constants = {}

    def module(self, path: str) -> nn.Module:
        m = self.model
        for part in path.split(".") if path else []:
            m = getattr(m, part)
        return m


def _refuse(where: str, reason: str, layer: Optional[str] = None):
    raise Unsupported("fusejit cannot fuse %s: %s; %s" % (where, reason, GRAMMAR),
                      layer=layer, reason=reason)


# ----------------------------------------------------------------------------------------------
# Describing nodes in messages.

_OPERATOR_SYMBOLS = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
    operator.neg: "unary -", operator.getitem: "[...]", operator.iadd: "+=", operator.imul: "*=",
    operator.and_: "&", operator.or_: "|", operator.lt: "<", operator.gt: ">",
}


def _class_name(obj) -> str:
    cls = type(obj)
    if getattr(nn, cls.__name__, None) is cls:
        return "nn." + cls.__name__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _func_name(f) -> str:
    if f in _OPERATOR_SYMBOLS:
        return "'%s' (operator.%s)" % (_OPERATOR_SYMBOLS[f], f.__name__)
    name = getattr(f, "__name__", None) or repr(f)
    if getattr(F, name, None) is f:
        return "F." + name
    if getattr(torch, name, None) is f:
        return "torch." + name
    mod = getattr(f, "__module__", None)
    return "%s.%s" % (mod, name) if mod else name


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n([^\n]*)')


def _location(node) -> str:
    """' at file.py:12: x = x + y' from the node's recorded stack trace, where there is one."""
    try:
        st = getattr(node, "stack_trace", None) or ""
        frames = _FRAME_RE.findall(st)
        if not frames:
            return ""
        inner_first = any(f[0].startswith(_TORCH_DIR) and "symbolic_trace" in f[0] for f in frames)
        user = [f for f in frames
                if not os.path.abspath(f[0]).startswith(_TORCH_DIR) and f[2].strip() != "<module>"
                and os.path.abspath(f[0]) != os.path.abspath(__file__)]
        if not user:
            return ""
        f = user[0] if inner_first else user[-1]
        return " at %s:%s: %s" % (os.path.basename(f[0]), f[1], f[3].strip())
    except Exception:  # a message nicety only
        return ""


def _describe(node, ctx: _Ctx) -> Tuple[str, str]:
    """(description, layer) of an fx node."""
    loc = _location(node)
    if node.op == "call_module":
        try:
            mod = ctx.module(node.target)
            return "layer '%s' (%s)%s" % (node.target, _class_name(mod), loc), node.target
        except AttributeError:
            return "layer '%s'%s" % (node.target, loc), node.target
    if node.op == "call_function":
        return "call %s%s" % (_func_name(node.target), loc), node.name
    if node.op == "call_method":
        return "method call .%s()%s" % (node.target, loc), node.name
    if node.op == "get_attr":
        return "attribute '%s'%s" % (node.target, loc), node.target
    if node.op == "placeholder":
        return "input '%s'" % node.target, node.name
    if node.op == "output":
        return "the forward's return value", None
    return "%s %s" % (node.op, node.name), node.name


# ----------------------------------------------------------------------------------------------
# Argument checks.

def _is_node(v) -> bool:
    return isinstance(v, torch.fx.Node)


def _number(v, what: str, where: str, layer) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _refuse(where, "%s is %s; fusejit needs a constant number there"
                % (what, "computed in the graph" if _is_node(v) else repr(v)), layer)
    v = float(v)
    if not math.isfinite(v):
        _refuse(where, "%s is %r; fusejit needs a finite number" % (what, v), layer)
    return v


def _positive(v: float, what: str, where: str, layer) -> float:
    if not v > 0:
        _refuse(where, "%s=%r; fusejit needs %s > 0" % (what, v, what), layer)
    return v


def _int(v, what: str, where: str, layer) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        _refuse(where, "%s is %r; fusejit needs a constant whole number" % (what, v), layer)
    return int(v)


def _triple(v, what: str, where: str, layer) -> Tuple[int, int, int]:
    if isinstance(v, (list, tuple)):
        vals = [_int(x, what, where, layer) for x in v]
        if len(vals) == 1:
            vals = vals * 3
        if len(vals) != 3:
            _refuse(where, "%s=%r is not one size or three" % (what, v), layer)
        return tuple(vals)
    x = _int(v, what, where, layer)
    return (x, x, x)


def _no_nodes(bound: dict, allowed, where: str, layer):
    for k, v in bound.items():
        if k in allowed:
            continue
        vals = v if isinstance(v, (list, tuple)) else [v]
        if any(_is_node(x) for x in vals):
            _refuse(where, "argument '%s' is computed in the graph; fusejit needs a constant" % k,
                    layer)


def _check_hooks(mod: nn.Module, where: str, layer):
    for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        if getattr(mod, attr, None):
            _refuse(where, "it has %s registered; the fused chain would not run them"
                    % attr.strip("_").replace("_", " "), layer)


def _own_param(owner: nn.Module, attr: str, path: str, where: str, layer, optional=False):
    """owner.<attr> as (Parameter, path), refusing anything that is not a plain registered one."""
    p = owner._parameters.get(attr) if hasattr(owner, "_parameters") else None
    current = getattr(owner, attr, None)
    if p is None:
        if optional and current is None:
            return None
        if attr in getattr(owner, "_buffers", {}):
            what = "a buffer"
        elif torch.is_tensor(current):
            what = "a tensor computed on access or kept as a plain attribute (parametrization, " \
                   "weight_norm)"
        else:
            what = type(current).__name__
        _refuse(where, "'%s' is not a registered nn.Parameter but %s" % (path, what), layer)
    if current is not p:
        _refuse(where, "'%s' is computed on access (parametrized?), not the Parameter itself" % path,
                layer)
    uninit = getattr(nn.parameter, "UninitializedParameter", None)
    if uninit is not None and isinstance(p, uninit):
        _refuse(where, "'%s' is not initialized yet (lazy module); run the model once first" % path,
                layer)
    return (p, path)


def _param_from_node(v, what: str, ctx: _Ctx, where: str, layer, optional=False):
    if v is None and optional:
        return None
    if not _is_node(v) or v.op != "get_attr":
        _refuse(where, "%s must be one of the model's own nn.Parameters, found %s"
                % (what, _describe(v, ctx)[0] if _is_node(v) else repr(v)), layer)
    path = v.target
    prefix, _, attr = path.rpartition(".")
    try:
        owner = ctx.module(prefix)
    except AttributeError:
        _refuse(where, "%s '%s' is not found in the model" % (what, path), layer)
    return _own_param(owner, attr, path, where, layer)


# ----------------------------------------------------------------------------------------------
# Signatures of the functional and method forms (bound with inspect, so positional and keyword
# spellings are one).

def _s_unary(input): pass
def _s_unary_inplace(input, inplace=False): pass
def _s_leaky(input, negative_slope=0.01, inplace=False): pass
def _s_leaky_(input, negative_slope=0.01): pass
def _s_hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False): pass
def _s_hardtanh_(input, min_val=-1.0, max_val=1.0): pass
def _s_gelu(input, approximate="none"): pass
def _s_softplus(input, beta=1.0, threshold=20.0): pass
def _s_elu(input, alpha=1.0, inplace=False): pass
def _s_elu_(input, alpha=1.0): pass
def _s_clamp(input, min=None, max=None): pass
def _s_mean(input, dim=None, keepdim=False, *, dtype=None, axis=None): pass
def _s_gn(input, num_groups, weight=None, bias=None, eps=1e-5): pass
def _s_gn_torch(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True): pass
def _s_in(input, running_mean=None, running_var=None, weight=None, bias=None,
          use_input_stats=True, momentum=0.1, eps=1e-5): pass
def _s_conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): pass
def _s_convt(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
             dilation=1): pass
def _s_dropout(input, p=0.5, training=True, inplace=False): pass
def _s_binary(input, other): pass
def _s_div(input, other, *, rounding_mode=None): pass
def _s_add(input, other, *, alpha=1): pass


def _bind(stub, node, where, layer) -> dict:
    try:
        b = inspect.signature(stub).bind(*node.args, **node.kwargs)
    except TypeError as e:
        _refuse(where, "unexpected arguments (%s)" % e, layer)
    b.apply_defaults()
    return dict(b.arguments)


# Builders: (bound arguments, where, layer, ctx) -> (kind, attrs, params)

def _b_plain(kind):
    def build(b, where, layer, ctx):
        return kind, {}, {}
    return build


def _b_leaky(b, where, layer, ctx):
    return "leaky_relu", {"slope": _number(b["negative_slope"], "negative_slope", where, layer)}, {}


def _b_hardtanh(b, where, layer, ctx):
    return _hardtanh_op(b["min_val"], b["max_val"], where, layer)


def _b_relu6(b, where, layer, ctx):
    return _hardtanh_op(0.0, 6.0, where, layer)


def _hardtanh_op(lo, hi, where, layer):
    """hardtanh and relu6 as the grammar's hardtanh: clamp's values, but the gradient only strictly
    inside (min, max) (PyTorch's hardtanh backward), where clamp's includes the bounds."""
    lo = _number(lo, "min_val", where, layer)
    hi = _number(hi, "max_val", where, layer)
    if lo > hi:
        _refuse(where, "hardtanh min_val %r is larger than max_val %r" % (lo, hi), layer)
    return "hardtanh", {"min": lo, "max": hi}, {}


def _gelu_op(approximate, where, layer):
    if approximate not in ("none", "tanh"):
        _refuse(where, "gelu with approximate=%r; PyTorch takes 'none' or 'tanh'"
                % (approximate,), layer)
    return ("gelu" if approximate == "none" else "gelu_tanh"), {}, {}


def _b_gelu(b, where, layer, ctx):
    return _gelu_op(b["approximate"], where, layer)


def _celu_op(alpha, where, layer):
    alpha = _number(alpha, "alpha", where, layer)
    if alpha == 0:
        _refuse(where, "celu with alpha=0 (it divides by alpha)", layer)
    return "celu", {"alpha": alpha}, {}


def _b_celu(b, where, layer, ctx):
    return _celu_op(b["alpha"], where, layer)


def _softplus_op(beta, threshold, where, layer):
    beta = _number(beta, "beta", where, layer)
    if beta == 0:
        _refuse(where, "softplus with beta=0 (it divides by beta)", layer)
    return "softplus", {"beta": beta, "threshold": _number(threshold, "threshold", where, layer)}, {}


def _b_softplus(b, where, layer, ctx):
    return _softplus_op(b["beta"], b["threshold"], where, layer)


def _b_elu(b, where, layer, ctx):
    return "elu", {"alpha": _number(b["alpha"], "alpha", where, layer)}, {}


def _b_clamp(b, where, layer, ctx):
    return _clamp_op(b["min"], b["max"], where, layer)


def _clamp_op(lo, hi, where, layer):
    """clamp with min, max or both (a bound left out is None in attrs; clamp(min=0) is not relu:
    its gradient at exactly 0 is 1, relu's 0, and the grammar's clamp has PyTorch's)."""
    if lo is None and hi is None:
        _refuse(where, "clamp with neither min nor max", layer)
    lo = None if lo is None else _number(lo, "min", where, layer)
    hi = None if hi is None else _number(hi, "max", where, layer)
    if lo is not None and hi is not None and lo > hi:
        _refuse(where, "clamp min %r is larger than max %r" % (lo, hi), layer)
    return "clamp", {"min": lo, "max": hi}, {}


def _b_mean(b, where, layer, ctx):
    dim = b["dim"] if b.get("axis") is None else b["axis"]  # numpy's name, which torch takes too
    if dim is None or (b.get("axis") is not None and b["dim"] is not None):
        _refuse(where, "mean over all dimensions; fusejit's mean is over [2,3,4] (giving [N,C]) or "
                       "[1,2,3,4] (giving [N])", layer)
    if not isinstance(b["keepdim"], bool):
        _refuse(where, "mean with keepdim=%r; write True or False" % (b["keepdim"],), layer)
    if b.get("dtype") is not None:
        _refuse(where, "mean with dtype=%s" % b["dtype"], layer)
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    dims = [_int(d, "dim", where, layer) for d in dims]
    return "mean", {"dims": dims, "keepdim": b["keepdim"]}, {}


def _b_gn(b, where, layer, ctx):
    groups = _int(b["num_groups"], "num_groups", where, layer)
    eps = _positive(_number(b["eps"], "eps", where, layer), "eps", where, layer)
    if b["weight"] is None and b["bias"] is None:  # weight 1, bias 0: norm_constants
        return "group_norm", {"groups": groups, "eps": eps, "channels": None}, {}
    if b["weight"] is None or b["bias"] is None:
        _refuse(where, "group_norm with a %s but no %s; give both (the model's Parameters) or "
                       "neither" % (("bias", "weight") if b["weight"] is None else
                                    ("weight", "bias")), layer)
    w = _param_from_node(b["weight"], "group_norm weight", ctx, where, layer)
    bias = _param_from_node(b["bias"], "group_norm bias", ctx, where, layer)
    _check_gn_params(w[0], bias[0], None, where, layer)
    return "group_norm", {"groups": groups, "eps": eps}, {"weight": w, "bias": bias}


def _b_in(b, where, layer, ctx):
    """F.instance_norm with the batch's statistics: a group_norm with a group a channel (the
    channels from its weight, or _assemble's from the convolution before it)."""
    if b["running_mean"] is not None or b["running_var"] is not None or \
            b["use_input_stats"] is not True:
        _refuse(where, "instance_norm with running statistics; fusejit fuses it with the input's "
                       "own statistics (running_mean=None, running_var=None)", layer)
    eps = _positive(_number(b["eps"], "eps", where, layer), "eps", where, layer)
    attrs = {"groups": None, "eps": eps, "channels": None, "instance": True}
    if b["weight"] is None and b["bias"] is None:  # weight 1, bias 0: norm_constants
        return "group_norm", attrs, {}
    if b["weight"] is None or b["bias"] is None:
        _refuse(where, "instance_norm with a %s but no %s; give both (the model's Parameters) or "
                       "neither" % (("bias", "weight") if b["weight"] is None else
                                    ("weight", "bias")), layer)
    w = _param_from_node(b["weight"], "instance_norm weight", ctx, where, layer)
    bias = _param_from_node(b["bias"], "instance_norm bias", ctx, where, layer)
    _check_gn_params(w[0], bias[0], None, where, layer)
    attrs["groups"] = attrs["channels"] = int(w[0].numel())
    return "group_norm", attrs, {"weight": w, "bias": bias}


def _check_gn_params(w, b, channels, where, layer):
    if w.dim() != 1 or b.dim() != 1 or w.shape != b.shape or \
            (channels is not None and int(w.shape[0]) != channels):
        _refuse(where, "group_norm weight %s and bias %s are not both [C]"
                % (list(w.shape), list(b.shape)), layer)


def _conv_attrs(kind, weight, bias, stride, padding, dilation, output_padding, groups, where, layer):
    groups = _int(groups, "groups", where, layer)
    if groups != 1:
        _refuse(where, "groups=%d; fusejit's convolutions take groups=1 only" % groups, layer)
    w = weight[0]
    if w.dim() != 5:
        _refuse(where, "weight of shape %s is not 5-D" % list(w.shape), layer)
    out = int(w.shape[1] if kind == "conv_transpose3d" else w.shape[0])
    if bias is not None and (bias[0].dim() != 1 or int(bias[0].shape[0]) != out):
        _refuse(where, "bias of shape %s does not match %d output channels"
                % (list(bias[0].shape), out), layer)
    k = tuple(int(x) for x in w.shape[2:])
    stride = _triple(stride, "stride", where, layer)
    dilation = _triple(dilation, "dilation", where, layer)
    if isinstance(padding, str):
        if kind != "conv3d":
            _refuse(where, "padding=%r" % padding, layer)
        if padding == "valid":
            padding = (0, 0, 0)
        elif padding == "same":
            total = [dilation[a] * (k[a] - 1) for a in range(3)]
            if any(t % 2 for t in total):
                _refuse(where, "padding='same' with an even kernel extent pads one side more than "
                               "the other; fusejit's padding is symmetric", layer)
            padding = tuple(t // 2 for t in total)
        else:
            _refuse(where, "padding=%r" % padding, layer)
    else:
        padding = _triple(padding, "padding", where, layer)
    attrs = {"out": out, "k": k, "stride": stride, "padding": padding, "dilation": dilation,
             "bias": bias is not None}
    if kind == "conv_transpose3d":
        attrs["output_padding"] = _triple(output_padding, "output_padding", where, layer)
    params = {"weight": weight}
    if bias is not None:
        params["bias"] = bias
    return kind, attrs, params


def _b_conv(kind):
    def build(b, where, layer, ctx):
        weight = _param_from_node(b["weight"], "conv weight", ctx, where, layer)
        bias = _param_from_node(b["bias"], "conv bias", ctx, where, layer, optional=True)
        return _conv_attrs(kind, weight, bias, b["stride"], b["padding"], b["dilation"],
                           b.get("output_padding", 0), b["groups"], where, layer)
    return build


def _b_neg(b, where, layer, ctx):  # -x is x * -1
    return "mul", {"by": -1.0}, {}


def _b_dropout(b, where, layer, ctx):
    p = _number(b["p"], "p", where, layer)
    if b["training"] is False:  # the identity
        return "skip", {}, {}
    if p != 0:
        _refuse(where, "dropout with p=%r and training=%r (it draws a random mask; p=0 or "
                       "training=False is skipped, and a dropout module, nn.Dropout, runs fused "
                       "in eval mode)" % (p, b["training"]), layer)
    return "skip", {}, {}


# (function objects, signature, builder, in-place: False / True / "inplace" argument)
_FUNCTION_FORMS = [
    (["torch.relu", "F.relu"], _s_unary_inplace, _b_plain("relu"), "inplace"),
    (["torch.relu_", "F.relu_"], _s_unary, _b_plain("relu"), True),
    (["F.leaky_relu"], _s_leaky, _b_leaky, "inplace"),
    (["F.leaky_relu_", "torch._C._nn.leaky_relu_"], _s_leaky_, _b_leaky, True),
    (["torch.sigmoid", "F.sigmoid", "torch.special.expit"], _s_unary, _b_plain("sigmoid"), False),
    (["torch.sigmoid_"], _s_unary, _b_plain("sigmoid"), True),
    (["torch.tanh", "F.tanh"], _s_unary, _b_plain("tanh"), False),
    (["torch.tanh_"], _s_unary, _b_plain("tanh"), True),
    (["F.silu"], _s_unary_inplace, _b_plain("swish"), "inplace"),
    (["F.hardswish"], _s_unary_inplace, _b_plain("hardswish"), "inplace"),
    (["F.hardsigmoid"], _s_unary_inplace, _b_plain("hardsigmoid"), "inplace"),
    (["F.mish"], _s_unary_inplace, _b_plain("mish"), "inplace"),
    (["F.softplus", "torch._C._nn.softplus"], _s_softplus, _b_softplus, False),
    (["F.elu"], _s_elu, _b_elu, "inplace"),
    (["F.elu_", "torch._C._nn.elu_"], _s_elu_, _b_elu, True),
    (["F.selu", "torch.selu"], _s_unary_inplace, _b_plain("selu"), "inplace"),
    (["F.selu_", "torch.selu_"], _s_unary, _b_plain("selu"), True),
    (["F.gelu"], _s_gelu, _b_gelu, False),
    (["F.celu", "torch.celu"], _s_elu, _b_celu, "inplace"),
    (["F.celu_", "torch.celu_"], _s_elu_, _b_celu, True),
    (["F.logsigmoid"], _s_unary, _b_plain("logsigmoid"), False),
    (["F.softsign"], _s_unary, _b_plain("softsign"), False),
    (["F.tanhshrink"], _s_unary, _b_plain("tanhshrink"), False),
    (["torch.neg", "torch.negative"], _s_unary, _b_neg, False),
    (["torch.neg_", "torch.negative_"], _s_unary, _b_neg, True),
    (["torch.clamp", "torch.clip"], _s_clamp, _b_clamp, False),
    (["torch.clamp_", "torch.clip_"], _s_clamp, _b_clamp, True),
    (["F.hardtanh"], _s_hardtanh, _b_hardtanh, "inplace"),
    (["F.hardtanh_", "torch._C._nn.hardtanh_"], _s_hardtanh_, _b_hardtanh, True),
    (["F.relu6"], _s_unary_inplace, _b_relu6, "inplace"),
    (["torch.mean"], _s_mean, _b_mean, False),
    (["F.group_norm"], _s_gn, _b_gn, False),
    (["torch.group_norm"], _s_gn_torch, _b_gn, False),
    (["F.instance_norm"], _s_in, _b_in, False),
    (["torch.conv3d", "F.conv3d"], _s_conv, _b_conv("conv3d"), False),
    (["torch.conv_transpose3d", "F.conv_transpose3d"], _s_convt, _b_conv("conv_transpose3d"), False),
    (["F.dropout", "F.dropout1d", "F.dropout2d", "F.dropout3d", "F.alpha_dropout",
      "F.feature_alpha_dropout"], _s_dropout, _b_dropout, False),
]

_METHOD_FORMS = {
    "relu": (_s_unary, _b_plain("relu"), False), "relu_": (_s_unary, _b_plain("relu"), True),
    "sigmoid": (_s_unary, _b_plain("sigmoid"), False),
    "sigmoid_": (_s_unary, _b_plain("sigmoid"), True),
    "tanh": (_s_unary, _b_plain("tanh"), False), "tanh_": (_s_unary, _b_plain("tanh"), True),
    "clamp": (_s_clamp, _b_clamp, False), "clip": (_s_clamp, _b_clamp, False),
    "clamp_": (_s_clamp, _b_clamp, True), "clip_": (_s_clamp, _b_clamp, True),
    "mean": (_s_mean, _b_mean, False),
    "neg": (_s_unary, _b_neg, False), "neg_": (_s_unary, _b_neg, True),
    "negative": (_s_unary, _b_neg, False), "negative_": (_s_unary, _b_neg, True),
    "contiguous": (_s_unary, _b_plain("skip"), False), "clone": (_s_unary, _b_plain("skip"), False),
}


def _resolve(name: str):
    obj = {"torch": torch, "F": F}[name.split(".")[0]]
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _function_table():
    table = {}
    for names, stub, build, inplace in _FUNCTION_FORMS:
        for name in names:
            f = _resolve(name)
            if f is None:
                continue
            try:
                table.setdefault(f, (stub, build, inplace))
            except TypeError:  # unhashable: never expected
                pass
    return table


_FUNCTIONS = _function_table()
_FUNCTIONS[operator.neg] = (_s_unary, _b_neg, False)  # -x

# The arithmetic forms: function objects and method names -> operation; augmented assignment
# (x *= c) traces as the in-place operators.
_ARITH_FUNCS = {operator.mul: "*", torch.mul: "*", operator.imul: "*",
                operator.truediv: "/", torch.div: "/", torch.true_divide: "/",
                operator.itruediv: "/",
                operator.add: "+", torch.add: "+", operator.iadd: "+",
                operator.sub: "-", torch.sub: "-", operator.isub: "-"}
_ARITH_METHODS = {"mul": "*", "mul_": "*", "multiply": "*", "multiply_": "*",
                  "div": "/", "div_": "/", "divide": "/", "divide_": "/", "true_divide": "/",
                  "true_divide_": "/", "add": "+", "add_": "+", "sub": "-", "sub_": "-",
                  "subtract": "-", "subtract_": "-"}
_IN_PLACE_OPERATORS = {operator.imul, operator.itruediv, operator.iadd, operator.isub}


def _arith(node) -> Optional[str]:
    """"*", "/", "+" or "-" for an arithmetic node in any spelling, else None."""
    if node.op == "call_function":
        try:
            return _ARITH_FUNCS.get(node.target)
        except TypeError:  # unhashable target: never expected
            return None
    if node.op == "call_method":
        return _ARITH_METHODS.get(node.target)
    return None


# ----------------------------------------------------------------------------------------------
# Modules.

def _dropout_types():
    names = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"]
    return tuple(t for t in (getattr(nn, n, None) for n in names) if t is not None)


_SUPPORTED_MODULES = (nn.Conv3d, nn.ConvTranspose3d, nn.GroupNorm, nn.InstanceNorm3d,
                      nn.BatchNorm3d, nn.ReLU,
                      nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Hardswish, nn.Hardsigmoid,
                      nn.GELU, nn.ReLU6, nn.Hardtanh, nn.Mish, nn.Softplus, nn.ELU, nn.SELU,
                      nn.CELU, nn.LogSigmoid, nn.Softsign, nn.Tanhshrink,
                      nn.Identity) + _dropout_types()
# Methods a subclass must not override to count as its torch.nn base class.
_BEHAVIOUR = ("forward", "_conv_forward", "_output_padding")


def _base_module_type(mod) -> Optional[type]:
    """The supported torch.nn class `mod` behaves as: its own class, or a base class whose forward
    (and helpers) the subclass does not override (`class MyConv(nn.Conv3d): pass`, parametrized
    modules; their weights are checked separately). None for anything else."""
    t = type(mod)
    if t in _SUPPORTED_MODULES:
        return t
    for base in _SUPPORTED_MODULES:
        if isinstance(mod, base) and all(getattr(t, m, None) is getattr(base, m, None)
                                         for m in _BEHAVIOUR):
            return base
    return None


class _Tracer(torch.fx.Tracer):
    """symbolic_trace's tracer, also keeping the supported modules' plain subclasses as leaves."""

    def is_leaf_module(self, m, module_qualified_name):
        if _base_module_type(m) is not None:
            return True
        return super().is_leaf_module(m, module_qualified_name)


# Modules without arguments: type -> (grammar op, whether its inplace= flag is read).
_PLAIN_MODULES = {nn.ReLU: ("relu", True), nn.Sigmoid: ("sigmoid", False),
                  nn.Tanh: ("tanh", False), nn.SiLU: ("swish", True),
                  nn.Hardswish: ("hardswish", True), nn.Hardsigmoid: ("hardsigmoid", True),
                  nn.Mish: ("mish", True), nn.SELU: ("selu", True),
                  nn.LogSigmoid: ("logsigmoid", False), nn.Softsign: ("softsign", False),
                  nn.Tanhshrink: ("tanhshrink", False)}


def _module_op(mod: nn.Module, path: str, where: str, layer, training_mode: bool = False
               ) -> Optional[Tuple[str, dict, dict, bool]]:
    t = _base_module_type(mod)
    inplace = bool(getattr(mod, "inplace", False))
    if t in (nn.Conv3d, nn.ConvTranspose3d):
        kind = "conv3d" if t is nn.Conv3d else "conv_transpose3d"
        if mod.padding_mode != "zeros":
            _refuse(where, "padding_mode=%r; fusejit pads with zeros only" % mod.padding_mode, layer)
        weight = _own_param(mod, "weight", _join(path, "weight"), where, layer)
        bias = _own_param(mod, "bias", _join(path, "bias"), where, layer, optional=True)
        kind, attrs, params = _conv_attrs(kind, weight, bias, mod.stride, mod.padding, mod.dilation,
                                          getattr(mod, "output_padding", 0), mod.groups, where,
                                          layer)
        if attrs["out"] != mod.out_channels:
            _refuse(where, "weight shape does not match out_channels=%d" % mod.out_channels, layer)
        return kind, attrs, params, False
    if t is nn.BatchNorm3d or (t is nn.InstanceNorm3d and mod.track_running_stats):
        return _running_norm_op(mod, t, path, where, layer, training_mode)
    if t in (nn.GroupNorm, nn.InstanceNorm3d):
        if t is nn.GroupNorm:
            groups = _int(mod.num_groups, "num_groups", where, layer)
            channels = _int(mod.num_channels, "num_channels", where, layer)
        else:  # instance norm (track_running_stats=False): one group a channel
            groups = channels = _int(mod.num_features, "num_features", where, layer)
        eps = _positive(_number(mod.eps, "eps", where, layer), "eps", where, layer)
        attrs = {"groups": groups, "eps": eps, "channels": channels,
                 "instance": t is nn.InstanceNorm3d}
        if not mod.affine:  # weight 1, bias 0: norm_constants
            return "group_norm", attrs, {}, False
        w = _own_param(mod, "weight", _join(path, "weight"), where, layer)
        b = _own_param(mod, "bias", _join(path, "bias"), where, layer)
        _check_gn_params(w[0], b[0], channels, where, layer)
        return "group_norm", attrs, {"weight": w, "bias": b}, False
    if t in _PLAIN_MODULES:
        kind, takes_inplace = _PLAIN_MODULES[t]
        return kind, {}, {}, inplace and takes_inplace
    if t is nn.LeakyReLU:
        return "leaky_relu", {"slope": _number(mod.negative_slope, "negative_slope", where, layer)}, \
            {}, inplace
    if t is nn.Softplus:
        kind, attrs, params = _softplus_op(mod.beta, mod.threshold, where, layer)
        return kind, attrs, params, False
    if t is nn.ELU:
        return "elu", {"alpha": _number(mod.alpha, "alpha", where, layer)}, {}, inplace
    if t is nn.GELU:
        kind, attrs, params = _gelu_op(getattr(mod, "approximate", "none"), where, layer)
        return kind, attrs, params, False
    if t is nn.CELU:
        kind, attrs, params = _celu_op(mod.alpha, where, layer)
        return kind, attrs, params, inplace
    if t is nn.ReLU6:
        kind, attrs, params = _hardtanh_op(0.0, 6.0, where, layer)
        return kind, attrs, params, inplace
    if t is nn.Hardtanh:
        kind, attrs, params = _hardtanh_op(mod.min_val, mod.max_val, where, layer)
        return kind, attrs, params, inplace
    if t is nn.Identity:
        return "skip", {}, {}, False
    if t in _dropout_types():
        p = _number(mod.p, "p", where, layer)
        if p != 0 and training_mode:
            _refuse(where, "a dropout module in training mode draws a random mask; it runs as "
                           "PyTorch there (in eval mode, where it is the identity, the chain "
                           "goes on past it)", layer)
        # p > 0: the identity in eval mode only (Recognized.dropout_modules)
        return ("dropout" if p != 0 else "skip"), {}, {}, False
    return None


def _running_norm_op(mod, t, path: str, where: str, layer, training_mode: bool):
    """nn.BatchNorm3d, or nn.InstanceNorm3d with track_running_stats=True, in eval mode: the
    per-channel affine (x - running_mean) / sqrt(running_var + eps) * weight + bias, a
    "channel_norm" op folded like a per-channel multiply and add (Recognized.running_norms names
    the module: the drop-in fuses it only while the module is in eval mode). Refused where it
    normalizes with the batch's (or the sample's) statistics: track_running_stats=False, or
    training_mode (the training-mode recognition)."""
    name = "nn.%s" % t.__name__
    if not mod.track_running_stats or mod.running_mean is None or mod.running_var is None:
        _refuse(where, "%s with track_running_stats=False normalizes with the batch's statistics "
                       "in every mode; fusejit folds a batch norm with running statistics "
                       "(eval mode) into the convolution or group_norm before it" % name, layer)
    if training_mode:
        _refuse(where, "%s in training mode normalizes with the %s statistics and updates its "
                       "running ones; it is fused in eval mode (model.eval()), where it is a "
                       "per-channel affine folded into the op before it"
                % (name, "batch's" if t is nn.BatchNorm3d else "sample's"), layer)
    channels = _int(mod.num_features, "num_features", where, layer)
    eps = _positive(_number(mod.eps, "eps", where, layer), "eps", where, layer)
    params = {}
    for stat in ("running_mean", "running_var"):
        b = mod._buffers.get(stat)
        if not torch.is_tensor(b) or tuple(b.shape) != (channels,):
            _refuse(where, "its %s is not a [%d] buffer" % (stat, channels), layer)
        params[stat] = (b, _join(path, stat))
    if mod.affine:
        params["weight"] = _own_param(mod, "weight", _join(path, "weight"), where, layer)
        params["bias"] = _own_param(mod, "bias", _join(path, "bias"), where, layer)
        _check_gn_params(params["weight"][0], params["bias"][0], channels, where, layer)
    # nn.BatchNorm3d counts its updates in num_batches_tracked (an in-place add: its version
    # moves); an instance norm updates its running statistics without a count
    counter = None
    if t is nn.BatchNorm3d and torch.is_tensor(mod._buffers.get("num_batches_tracked")):
        counter = _join(path, "num_batches_tracked")
    return "channel_norm", {"eps": eps, "numel": channels, "counter": counter}, params, False


def _join(prefix: str, name: str) -> str:
    return prefix + "." + name if prefix else name


# ----------------------------------------------------------------------------------------------
# Classifying one node whose chain input is `inp`.

def _classify(node, inp, ctx: _Ctx) -> Optional[_Op]:
    """The op `node` computes from `inp`, None where the node is not one of the grammar's forms.
    Raises Unsupported where it is one but with arguments the grammar cannot express."""
    where, layer = _describe(node, ctx)
    if node.op == "call_module":
        mod = ctx.module(node.target)
        found = _module_op(mod, node.target, where, layer, ctx.training_mode)
        if found is None:
            return None
        if tuple(node.args) != (inp,) or node.kwargs:
            _refuse(where, "it is called with arguments besides the chain's tensor", layer)
        _check_hooks(mod, where, layer)
        kind, attrs, params, inplace = found
        return _Op(kind, where, attrs, params, inplace, layer)
    if node.op == "call_function":
        try:
            form = _FUNCTIONS.get(node.target)
        except TypeError:
            form = None
        if form is None:
            return None
        stub, build, inplace = form
    elif node.op == "call_method":
        form = _METHOD_FORMS.get(node.target)
        if form is None:
            return None
        stub, build, inplace = form
    else:
        return None
    b = _bind(stub, node, where, layer)
    if b["input"] is not inp:
        _refuse(where, "the chain's value is not its input tensor", layer)
    _no_nodes(b, ("input", "weight", "bias"), where, layer)
    kind, attrs, params = build(b, where, layer, ctx)
    if inplace == "inplace":
        inplace = b.get("inplace") is True
    return _Op(kind, where, attrs, params, bool(inplace), layer)


def _binary_operands(node):
    """(a, b, method_inplace) for a multiply/divide/add node in any spelling, else None."""
    if node.op == "call_function":
        if node.kwargs or len(node.args) != 2:
            return None
        return node.args[0], node.args[1], False
    if node.op == "call_method":
        if node.kwargs or len(node.args) != 2:
            return None
        return node.args[0], node.args[1], node.target.endswith("_")
    return None


def _is_mul(node) -> bool:
    return _arith(node) == "*"


def _is_div(node) -> bool:
    return _arith(node) == "/"


def _is_add(node) -> bool:
    return _arith(node) == "+"


def _const_equal(v, c) -> bool:
    return not _is_node(v) and not isinstance(v, bool) and isinstance(v, (int, float)) and \
        float(v) == c


def _mul_of(node, a, b):
    """node is a*b or b*a; returns (True, mutates a in place) or (False, False)."""
    if not _is_mul(node):
        return False, False
    ops = _binary_operands(node)
    if ops is None:
        return False, False
    x, y, inpl = ops
    if (x is a and y is b) or (x is b and y is a):
        return True, inpl and x is a
    return False, False


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


@dataclasses.dataclass
class _Step:
    op: _Op
    nodes: list
    result: Any


def _match_step(cur, first, ctx: _Ctx) -> Optional[_Step]:
    # swish / hardswish as x * gate(x), either order, any spelling of the gate.
    gate = _classify(first, cur, ctx)
    if gate is not None and gate.kind in ("sigmoid", "hardsigmoid") and not gate.mutates_input:
        m = _only_user(first)
        if m is not None:
            ok, inpl = _mul_of(m, cur, first)
            if ok:
                kind = "swish" if gate.kind == "sigmoid" else "hardswish"
                where = "%s written as x * %s(x) (%s)" % (kind, gate.kind, gate.where)
                return _Step(_Op(kind, where, mutates_input=inpl, layer=gate.layer), [first, m], m)
    if gate is not None:
        return _Step(gate, [first], first)
    # hardswish written out: x * relu6(x + 3) / 6 or x * (relu6(x + 3) / 6).
    step = _match_hardswish(cur, first, ctx)
    if step is not None:
        return step
    # x * c, x / c, x + c, x - c with a constant number c.
    step = _match_scalar(cur, first, ctx)
    if step is not None:
        return step
    # x * P, x + P, ... with a per-channel Parameter P.
    step = _match_channel(cur, first, ctx)
    if step is not None:
        return step
    # global average pooling: adaptive_avg_pool3d(x, 1) then flatten(1) is a mean over [2,3,4].
    return _match_global_pool(cur, first, ctx)


def _is_one(v) -> bool:
    if isinstance(v, (list, tuple)):
        return len(v) in (1, 3) and all(_is_one(x) for x in v)
    return not isinstance(v, bool) and isinstance(v, int) and v == 1


def _match_global_pool(cur, first, ctx: _Ctx) -> Optional[_Step]:
    size = _MISSING = object()
    if first.op == "call_module":
        mod = ctx.module(first.target)
        if type(mod) is nn.AdaptiveAvgPool3d and tuple(first.args) == (cur,) and not first.kwargs:
            _check_hooks(mod, *_describe(first, ctx))
            size = mod.output_size
    elif first.op == "call_function" and first.target in _ADAPTIVE_POOLS:
        try:
            b = inspect.signature(_s_pool).bind(*first.args, **first.kwargs).arguments
        except TypeError:
            b = {}
        if b.get("input") is cur:
            size = b.get("output_size")
    if size is _MISSING:
        return None
    where, layer = _describe(first, ctx)
    if not _is_one(size):
        _refuse(where, "adaptive average pooling to %r; fusejit accepts it only to size 1 followed "
                       "by flatten(1), a mean over [2,3,4]" % (size,), layer)
    f = _only_user(first)
    start = end = None
    if f is not None and f.op == "call_module":
        m = ctx.module(f.target)
        if type(m) is nn.Flatten and tuple(f.args) == (first,) and not f.kwargs:
            _check_hooks(m, *_describe(f, ctx))
            start, end = m.start_dim, m.end_dim
    elif f is not None and ((f.op == "call_function" and f.target is torch.flatten) or
                            (f.op == "call_method" and f.target == "flatten")):
        try:
            b = inspect.signature(_s_flatten).bind(*f.args, **f.kwargs)
            b.apply_defaults()
            if b.arguments["input"] is first:
                start, end = b.arguments["start_dim"], b.arguments["end_dim"]
        except TypeError:
            pass
    if start == 1 and end in (-1, 4):
        return _Step(_Op("mean", "%s and flatten(1) (a mean over [2,3,4])" % where,
                         {"dims": [2, 3, 4], "keepdim": False}, layer=layer), [first, f], f)
    # Alone (or before anything but flatten(1)): a mean over [2,3,4] keeping them, [N,C,1,1,1].
    return _Step(_Op("mean", "%s (a mean over [2,3,4], keepdim=True)" % where,
                     {"dims": [2, 3, 4], "keepdim": True}, layer=layer), [first], first)


def _match_scalar(cur, first, ctx: _Ctx) -> Optional[_Step]:
    """`first` as mul(by) / add(by) of `cur` and a Python number: x * c, c * x, x / c, x + c,
    c + x, x - c in any spelling (no alpha= or rounding_mode=), and c - x ("rsub_scalar":
    _assemble writes it as mul(by=-1) | add(by=c), -x exact, so PyTorch's one rounding); None
    for anything else (c / x too)."""
    sym = _arith(first)
    if sym is None or first.kwargs or len(first.args) != 2:
        return None
    if first.op == "call_function":
        inplace = first.target in _IN_PLACE_OPERATORS
    else:
        inplace = first.target.endswith("_")
    a, b = first.args
    number = lambda v: not isinstance(v, bool) and isinstance(v, (int, float))  # noqa: E731
    if a is cur and number(b):
        c = b
    elif b is cur and number(a) and sym in "*+-" and first.op == "call_function":
        c, inplace = a, False
    else:
        return None
    where, layer = _describe(first, ctx)
    c = _number(c, "the constant", where, layer)
    if sym == "-" and b is cur:  # c - x
        kind, by = "rsub_scalar", c
    elif sym == "/":
        if c == 0:
            _refuse(where, "division by zero", layer)
        kind, by = "mul", 1.0 / c
    elif sym == "-":
        kind, by = "add", -c
    else:
        kind, by = ("mul" if sym == "*" else "add"), c
    return _Step(_Op(kind, where, {"by": by}, mutates_input=inplace, layer=layer), [first], first)


_CHANNEL_OPS = {"*": "mul", "/": "div", "+": "add", "-": "sub"}


def _match_channel(cur, first, ctx: _Ctx) -> Optional[_Step]:
    """`first` as a per-channel parameter op: x * P, P * x, x / P, x + P, P + x, x - P, P - x with
    P one of the model's nn.Parameters shaped to broadcast per channel against [N,C,D,H,W]
    ([C,1,1,1], [1,C,1,1,1], or a single value); None where `first` is no such arithmetic.
    It is folded into the convolution's or the group_norm's parameters (_fold_channel_ops)."""
    sym = _arith(first)
    if sym is None or first.kwargs or len(first.args) != 2:
        return None
    a, b = first.args
    is_attr = lambda v: _is_node(v) and v.op == "get_attr"  # noqa: E731
    if a is cur and is_attr(b):
        op, pnode = _CHANNEL_OPS[sym], b
        inplace = (first.target in _IN_PLACE_OPERATORS if first.op == "call_function"
                   else first.target.endswith("_"))
    elif b is cur and is_attr(a) and first.op == "call_function" and sym != "/":
        op, pnode, inplace = {"*": "mul", "+": "add", "-": "rsub"}[sym], a, False
    else:
        return None
    where, layer = _describe(first, ctx)
    param = _buffer_from_node(pnode, ctx)  # a registered buffer (register_buffer) serves too
    if param is None:
        param = _param_from_node(pnode, "the tensor it %s" % ("multiplies by" if sym in "*/"
                                                              else "adds"), ctx, where, layer)
    shape = tuple(param[0].shape)
    padded = (1,) * (5 - len(shape)) + shape if len(shape) <= 5 else shape
    if len(shape) > 5 or any(d != 1 for i, d in enumerate(padded) if i != 1):
        _refuse(where, "parameter '%s' of shape %s does not broadcast per channel against the "
                       "[N,C,D,H,W] value (fusejit takes [C,1,1,1], [1,C,1,1,1] or a single "
                       "value)" % (param[1], list(shape)), layer)
    return _Step(_Op("channel_" + op, where, {"numel": int(param[0].numel())},
                     {"factor": param}, mutates_input=inplace, layer=layer), [first], first)


def _buffer_from_node(v, ctx: _Ctx):
    """(tensor, path) where get_attr node `v` is a registered buffer of its module, else None."""
    prefix, _, attr = v.target.rpartition(".")
    try:
        owner = ctx.module(prefix)
    except AttributeError:
        return None
    b = getattr(owner, "_buffers", {}).get(attr)
    return (b, v.target) if torch.is_tensor(b) else None


def _s_pool(input, output_size): pass
def _s_flatten(input, start_dim=0, end_dim=-1): pass


_ADAPTIVE_POOLS = {f for f in (getattr(F, "adaptive_avg_pool3d", None),
                               getattr(torch, "adaptive_avg_pool3d", None),
                               _resolve("torch._C._nn.adaptive_avg_pool3d")) if f is not None}


def _match_hardswish(cur, first, ctx: _Ctx) -> Optional[_Step]:
    if not _is_add(first):
        return None
    ops = _binary_operands(first)
    if ops is None or ops[2]:
        return None
    a, b, _ = ops
    if not ((a is cur and _const_equal(b, 3.0)) or (b is cur and _const_equal(a, 3.0))):
        return None
    r = _only_user(first)
    if r is None:
        return None
    try:
        six = _classify(r, first, ctx)
    except Unsupported:
        return None
    if six is None or six.kind not in ("clamp", "hardtanh") or \
            (six.attrs["min"], six.attrs["max"]) != (0.0, 6.0):
        return None
    u = _only_user(r)
    if u is None:
        return None
    where = "x * relu6(x + 3) / 6 (hardswish) via %s" % six.where
    # With relu6 / hardtanh its gradient is hardswish's everywhere; with torch.clamp (bounds
    # included) it is -1/2 at -3 and 3/2 at 3, where hardswish's is 0 and 1: marked.
    attrs = {} if six.kind == "hardtanh" else {"_exclusive": "clamp hardswish"}
    ok, _ = _mul_of(u, cur, r)
    if ok:  # (x * r) / 6  or  (x * r) * (1/6)
        d = _only_user(u)
        if d is None:
            return None
        dops = _binary_operands(d)
        if dops is None or dops[0] is not u:
            return None
        if (_is_div(d) and _const_equal(dops[1], 6.0)) or \
                (_is_mul(d) and _const_equal(dops[1], 1.0 / 6.0)):
            return _Step(_Op("hardswish", where, attrs, layer=six.layer), [first, r, u, d], d)
        return None
    dops = _binary_operands(u)
    if dops is not None and dops[0] is r and _is_div(u) and _const_equal(dops[1], 6.0):
        m = _only_user(u)
        if m is not None:
            ok, inpl = _mul_of(m, cur, u)
            if ok:
                return _Step(_Op("hardswish", where, attrs, mutates_input=inpl,
                                 layer=six.layer), [first, r, u, m], m)
    return None


# ----------------------------------------------------------------------------------------------
# Tracing and the walk.

def _trace(model: nn.Module, ctx: Optional[_Ctx] = None) -> torch.fx.Graph:
    """The traced graph of model's forward. torch.fx sets the tensors forward makes from
    constants on the model as attributes; they are taken off it again (the model is left as it
    was) into ctx.constants."""
    tracer = _Tracer()
    before = set(model.__dict__)
    try:
        tracer.record_stack_traces = True
    except Exception:
        pass
    try:
        graph = tracer.trace(model)
    except Exception as e:  # anything the user's forward raises under tracing
        for name in set(model.__dict__) - before:
            del model.__dict__[name]
        raise Unsupported("fusejit cannot fuse model %s: torch.fx could not trace its forward (%s: "
                          "%s); fusejit recognizes forwards that torch.fx.symbolic_trace can "
                          "trace; %s" % (_class_name(model), type(e).__name__, e, GRAMMAR),
                          reason="torch.fx could not trace the forward")
    for name in set(model.__dict__) - before:
        value = model.__dict__.pop(name)
        if ctx is not None and torch.is_tensor(value):
            ctx.constants[name] = value
    return graph


def in_mode(model: nn.Module, training: bool, fn):
    """fn() with every module of `model` in training (or eval) mode, each module's own mode put
    back after."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        for m, _ in flags:
            m.training = training
        return fn()
    finally:
        for m, was in flags:
            m.training = was


def forward_reads_training(model: nn.Module) -> bool:
    """Whether forward's traced code differs between training and eval mode: code torch.fx runs
    while tracing reads self.training (F.dropout(x, p, self.training), `if self.training:`), so
    each mode has a graph of its own. Modules the trace keeps whole (the grammar's, nn.Dropout,
    nn.BatchNorm3d) read their mode when they run, so they do not count. True where forward can
    be traced in one mode only; False where it cannot be traced in either (recognize says
    why)."""
    if _Tracer().is_leaf_module(model, ""):
        return False

    def code():
        try:
            return _trace(model).python_code("self").src
        except Unsupported:
            return None
    return in_mode(model, False, code) != in_mode(model, True, code)


def recognize(model: nn.Module, partial: bool = False, training_mode: bool = False) -> Recognized:
    """Recognizes `model`'s forward as a fusejit chain; raises Unsupported naming the first layer
    or call outside the grammar. partial=True: where forward goes on past the grammar after at
    least one fused op, the chain is the part before and Recognized.rest the rest of forward
    (run as the model's own code); Unsupported only where nothing can be fused or the rest
    reads values inside the chain. training_mode=True: the chain of the model in training mode,
    where batch norms normalize with the batch's statistics and dropout modules draw masks (both
    refused: the chain stops before them, or with partial=False, Unsupported)."""
    if not isinstance(model, nn.Module):
        raise Unsupported("fusejit cannot fuse %r: not a torch.nn.Module" % (model,))
    ctx = _Ctx(model, training_mode)
    _check_hooks(model, "model %s" % _class_name(model), None)
    if _Tracer().is_leaf_module(model, ""):
        # A bare torch.nn module (nn.Conv3d(...), nn.GroupNorm(...)) is the whole chain; tracing
        # would go into its own forward.
        where = "model %s" % _class_name(model)
        found = _module_op(model, "", where, None, training_mode)
        if found is None:
            _refuse(where, "it is not one of the ops fusejit fuses")
        kind, attrs, params, _ = found
        return _assemble([_Op(kind, where, attrs, params)], model)
    graph = _trace(model, ctx)
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outputs = [n for n in nodes if n.op == "output"]
    if len(placeholders) != 1:
        raise Unsupported("fusejit cannot fuse model %s: its forward takes %d inputs (%s); a fusejit "
                          "chain takes one tensor x:[N,C,D,H,W]; %s"
                          % (_class_name(model), len(placeholders),
                             ", ".join(p.target for p in placeholders), GRAMMAR),
                          reason="forward does not take exactly one input")
    output = outputs[0]
    consumed = {placeholders[0], output}
    g = _grow(placeholders[0], consumed, order, output, ctx, partial)
    found, cur, stop, x_mutated = g.found, g.end, g.stop, g.start_mutated
    if g.returns_more:
        stop = Unsupported("fusejit cannot fuse model %s: forward returns %r, not the chain's "
                           "single tensor; %s"
                           % (_class_name(model), output.args[0] if output.args else None,
                              GRAMMAR), reason="forward does not return one tensor")
    left = [n for n in nodes if n not in consumed and n.op != "get_attr"]
    if stop is None and left:
        where, layer = _describe(left[0], ctx)
        try:
            _refuse(where, "it is not part of the straight chain from the input to the output",
                    layer)
        except Unsupported as e:
            stop = e  # (partial: values besides the chain's feed the output, e.g. the input's)
    if stop is not None:
        # The chain ends at `cur`; the rest of forward runs as the model's own code -- where the
        # chain has an op to fuse and the rest reads nothing but `cur` and the model's tensors.
        if not partial:
            raise stop
        if not any(op.kind not in ("skip", "dropout") for op in found):
            # Nothing to fuse at the start: the whole forward is the rest, fused where it has
            # chains (a model starting with a pooling, a grouped convolution, ...), else refused.
            start = {placeholders[0], output}
            subs = _sub_chains(model, nodes, start, order, output, ctx)
            if not any(_starts_with_producer(sub) for _, _, _, sub in subs):
                raise stop  # (a forward without a convolution to fuse is not fused)
            rest, why = _rest_of_forward(model, nodes, placeholders[0], start, ctx, stop, None,
                                         subs)
            return Recognized(ops=[], params={}, param_paths={}, rest=rest, rest_from=why,
                              sub_chains=[sub for _, _, _, sub in subs],
                              running_norms=[n for _, _, _, sub in subs
                                             for n in sub.recognized.running_norms],
                              dropout_modules=[n for _, _, _, sub in subs
                                               for n in sub.recognized.dropout_modules])
        r = _assemble(found, model)
        subs = _sub_chains(model, nodes, consumed, order, output, ctx)
        r.rest, r.rest_from = _rest_of_forward(model, nodes, cur, consumed, ctx, stop,
                                               None if x_mutated else placeholders[0], subs)
        r.sub_chains = [sub for _, _, _, sub in subs]
        for sub in r.sub_chains:  # (the drop-in switches on any of them being in training)
            r.running_norms += sub.recognized.running_norms
            r.dropout_modules += sub.recognized.dropout_modules
        return r
    return _assemble(found, model)


_PRODUCERS = ("conv3d", "conv_transpose3d")


@dataclasses.dataclass
class _Growth:
    found: list            # the chain's ops (with "skip" and "dropout" entries)
    end: Any               # the node of its last value
    stop: Optional[Unsupported]  # why it ends there (None: it reaches the output)
    start_mutated: bool    # an in-place op of the chain changed its start value
    returns_more: bool = False  # it reaches the output, which returns more than its value


def _grow(start, consumed: set, order, output, ctx: _Ctx, shared_start: bool,
          first_node=None) -> _Growth:
    """Grows a chain from value node `start` along its users, one grammar op at a time, adding
    the nodes it takes to `consumed`. Each value inside the chain must feed only the next op
    (but for an in-place op whose result is discarded: the chain goes on with the mutated value);
    shared_start: `start` may feed other nodes too (the model's input of a partial chain, a
    residual). first_node: the node to take first (else start's first user in graph order)."""
    cur = start
    found: List[_Op] = []
    steps = []  # per op of `found`: (the value before it, its nodes, mutated_start before it)
    prev_where = "the input"
    mutated_start = False
    while True:
        users = sorted((u for u in cur.users if u not in consumed or u is output), key=order.get)
        if not users:
            raise Unsupported("fusejit cannot fuse model %s: the value after %s is not returned; %s"
                              % (_class_name(ctx.model), prev_where, GRAMMAR))
        first = first_node if first_node is not None and not found else users[0]
        if first is output:
            more = len(users) > 1 or tuple(output.args) != (cur,) or bool(output.kwargs)
            return _without_unfusable_means(
                _Growth(found, cur, None, mutated_start, returns_more=more), steps, consumed)
        try:
            step = _match_step(cur, first, ctx)
            if step is None:
                where, layer = _describe(first, ctx)
                _refuse(where, "it is not one of the ops fusejit fuses", layer)
            _check_order(found, step.op)
            rest = [u for u in users if u not in step.nodes]
            mutated = False  # an in-place op with its result discarded: the value is mutated
            if rest:
                last = max(order[n] for n in step.nodes)
                mutated = not step.result.users and step.op.mutates_input and \
                    all(order[u] > last for u in rest)
                if not mutated and not (shared_start and cur is start):
                    a = _describe(first, ctx)[0]
                    b, layer = _describe(rest[0], ctx)
                    _refuse(b, "it takes the value after %s, which also feeds %s; fusejit fuses "
                               "a straight chain where each value feeds only the next op"
                            % (prev_where, a), layer)
        except Unsupported as e:
            return _without_unfusable_means(_Growth(found, cur, e, mutated_start), steps,
                                            consumed)
        steps.append((cur, step.nodes, mutated_start))
        consumed.update(step.nodes)
        if mutated:  # the chain goes on with the mutated value
            mutated_start = mutated_start or cur is start
        else:
            cur = step.result
        found.append(step.op)
        prev_where = step.op.where


def _without_unfusable_means(g: _Growth, steps, consumed: set) -> _Growth:
    """g, or where its closing means combine to dims fusejit has no mean over (a mean over the
    channels alone, over [3,4]: _combine_means), g ending before them (their nodes given back
    from `consumed`), stopped by that refusal: the means run in the rest."""
    first = next((i for i, op in enumerate(g.found) if op.kind == "mean"), None)
    if first is None:
        return g
    try:
        _combine_means([op for op in g.found[first:] if op.kind == "mean"])
        return g
    except Unsupported as e:
        for _, nodes, _ in steps[first:]:
            consumed.difference_update(nodes)
        cur, _, mutated_start = steps[first]
        return _Growth(g.found[:first], cur, e, mutated_start)


def _check_order(found: List[_Op], op: _Op) -> None:
    """Refuses `op` where the grammar cannot put it after the ops `found` (a second convolution,
    a second group_norm, anything but a mean after the mean, a per-channel parameter op that
    has no convolution or group_norm right before it to fold into)."""
    real = [o for o in found if o.kind not in ("skip", "dropout")]
    if op.kind in _PRODUCERS and real:
        _refuse(op.where, "a convolution must be the first op of the chain (fusejit fuses one "
                          "producer, before any other op)", op.layer)
    if op.kind == "group_norm" and any(o.kind == "group_norm" for o in real):
        _refuse(op.where, "a chain may have at most one group_norm", op.layer)
    if real and real[-1].kind == "mean" and op.kind != "mean":
        _refuse(op.where, "it comes after the mean; mean must be the last op of the chain",
                op.layer)
    # (Python-number multiplies and adds right before it fold in too: _fold_targets)
    last = len(real)
    while op.kind.startswith("channel_") and last and \
            real[last - 1].kind in ("mul", "add", "rsub_scalar"):
        last -= 1
    if op.kind.startswith("channel_") and not (
            last and (real[last - 1].kind in _PRODUCERS + ("group_norm",) or
                      real[last - 1].kind.startswith("channel_"))):
        # (a channel op was itself accepted only after one of those: the run folds into it)
        _refuse(op.where, "%s is fused only right after the convolution or the group_norm (it "
                          "folds into their weight and bias); here it %s" %
                ("a batch norm with running statistics" if op.kind == "channel_norm" else
                 "a multiply or add by a per-channel parameter",
                 "follows %s" % real[-1].where if real else "comes first"), op.layer)


def _sub_chains(model: nn.Module, nodes, consumed, order, output, ctx: _Ctx) -> list:
    """The further chains in the rest of forward (after the nodes `consumed` by the first):
    [(its nodes in graph order, start value, end value, SubChain)], each starting at an op of a
    value the rest computes (or the model's input: a residual block's shortcut) -- a convolution,
    or ops _worth_a_chain (their value's rank is known only at run time: the drop-in runs a
    chain whose value is not 5-D as its own code) -- and grown as far as the grammar goes, its
    nodes disjoint from the others'. A candidate that changes its start value
    in place, or that _assemble refuses, is left to PyTorch."""
    taken = set(consumed)
    subs = []
    for n in nodes:
        if n in taken or n.op not in ("call_module", "call_function") or not n.args or \
                not _is_node(n.args[0]):
            continue
        v = n.args[0]
        try:
            op = _classify(n, v, ctx)
            if op is None:
                continue
            trial = set(taken)
            g = _grow(v, trial, order, output, ctx, shared_start=True, first_node=n)
            if not g.found or g.start_mutated or (
                    op.kind not in _PRODUCERS and not _worth_a_chain(g.found)):
                continue
            r = _assemble(g.found, model)
            mine = sorted(trial - taken, key=order.get)
            forward = _chain_code(model, mine, v, g.end)
        except Unsupported:
            continue
        taken = trial
        subs.append((mine, v, g.end, SubChain(r, forward)))
    return subs


def _worth_a_chain(found: List[_Op]) -> bool:
    """Whether ops without a convolution are worth a chain of their own in the rest: a
    group_norm, or two ops or more (one elementwise op is PyTorch's one kernel either way)."""
    real = [op for op in found if op.kind not in ("skip", "dropout")]
    return len(real) >= 2 or any(op.kind == "group_norm" for op in real)


def _starts_with_producer(sub: "SubChain") -> bool:
    ops = sub.recognized.ops
    return bool(ops) and ops[0].startswith(_PRODUCERS)


def _chain_code(model: nn.Module, chain_nodes, start, end):
    """forward(module, y): the nodes of a chain (in graph order) from value `start` (as y) to
    `end`, as the model's own code over the live module; Unsupported where they read an
    attribute that is not registered on the model."""
    graph = torch.fx.Graph()
    env = {start: graph.placeholder("y")}
    refuse = Unsupported("a chain's nodes read an attribute not registered on the model")

    def arg(a):
        if a in env:
            return env[a]
        if a.op == "get_attr" and _registered(model, a.target):
            env[a] = graph.get_attr(a.target)
            return env[a]
        raise refuse

    for n in chain_nodes:
        if n.op == "call_module" and not _registered(model, n.target):
            raise refuse
        env[n] = graph.node_copy(n, arg)
    graph.output(env[end])
    try:
        code = torch.fx.GraphModule(model, graph)
    except Exception:  # not expected: every target was checked to be registered
        raise refuse
    return type(code).forward


def _constant(value):
    """A function returning `value`: a tensor forward makes from constants, as the traced graph
    has it, for the rest's code (which reads the live module, where it is no attribute)."""
    def fusejit_constant():
        return value
    return fusejit_constant


def _sub_chain_call(sub: SubChain):
    """The function the rest's code calls for `sub`: sub.run(module, y), looked up at each call
    (the drop-in sets it after recognition)."""
    def fusejit_sub_chain(module, y):
        return sub.run(module, y)
    return fusejit_sub_chain


def _rest_of_forward(model: nn.Module, nodes, start, consumed, ctx: _Ctx, stop: Unsupported,
                     x_node=None, subs=()):
    """(rest(module, y, x), where the chain stops): the nodes of forward after the chain, as a
    function of the chain's output y and the model's input x (`x_node`, its placeholder; None
    where the rest may not read it) that reads the module's registered submodules, parameters
    and buffers through `module` (the fused module at each call: what the model has then). The
    nodes of each sub-chain in `subs` (_sub_chains) are one call of it, where its first node was.
    Raises `stop` (the reason the chain ends) where the rest reads a value inside the chain, the
    input when it may not, or changes the input in place, or reads an attribute that is not
    registered on the model."""
    graph = torch.fx.Graph()
    env = {start: graph.placeholder("y")}
    x_in = graph.placeholder("x")
    m_in = graph.placeholder("m")  # the module again: the sub-chains' calls take it
    if x_node is not None:
        env[x_node] = x_in

    def arg(a):
        if a in env:
            return env[a]
        if a.op == "get_attr" and _registered(model, a.target):
            env[a] = graph.get_attr(a.target)
            return env[a]
        if a.op == "get_attr" and a.target in ctx.constants:  # torch.tensor(2.0) in forward
            env[a] = graph.call_function(_constant(ctx.constants[a.target]), ())
            return env[a]
        raise stop  # the input, or a value inside the chain

    first_of = {mine[0]: (v, end, sub) for mine, v, end, sub in subs}
    in_subs = set().union(*[mine for mine, _, _, _ in subs]) if subs else set()
    for n in nodes:
        if n in first_of:
            v, end, sub = first_of[n]
            env[end] = graph.call_function(_sub_chain_call(sub), (m_in, arg(v)))
            continue
        if n in consumed and n.op != "output" or n.op in ("placeholder", "get_attr") or \
                n in in_subs:
            continue
        if n.op == "call_module" and not _registered(model, n.target):
            raise stop
        if x_node is not None and x_node in n.all_input_nodes and _in_place(n, model):
            raise stop  # (after the chain, where eager changes it before)
        if n.op == "output":
            graph.output(torch.fx.map_arg(n.args[0], arg))
        else:
            env[n] = graph.node_copy(n, arg)
    try:
        code = torch.fx.GraphModule(model, graph)
    except Exception:  # not expected: every target was checked to be registered
        raise stop
    # where the chain stops and why: the message without its prefix and the grammar's text
    why = str(stop).split("; " + GRAMMAR)[0]
    forward = type(code).forward

    def rest(module, y, x):
        return forward(module, y, x, module)
    return rest, why[len("fusejit cannot fuse "):] if why.startswith(
        "fusejit cannot fuse ") else why


def _in_place(n, model: nn.Module) -> bool:
    """Whether fx node `n` changes its input in place (x.relu_(), x += 1, inplace=True, a module
    with inplace=True)."""
    if n.kwargs.get("inplace") is True:
        return True
    if n.op == "call_method":
        return n.target.endswith("_")
    if n.op == "call_function":
        return n.target in _IN_PLACE_OPERATORS or getattr(n.target, "__name__", "").endswith("_")
    if n.op == "call_module":
        return bool(getattr(model.get_submodule(n.target), "inplace", False))
    return False


def _registered(model: nn.Module, target: str) -> bool:
    """Whether `target` ("block.fc", "scale") is a submodule, Parameter or buffer registered on
    `model` (not a plain attribute, e.g. a constant torch.fx made while tracing)."""
    *path, leaf = target.split(".")
    m = model
    for p in path:
        m = m._modules.get(p) if isinstance(m, nn.Module) else None
        if m is None:
            return False
    return isinstance(m, nn.Module) and (leaf in m._modules or leaf in m._parameters or
                                         leaf in m._buffers)


def _fold_targets(ops: List[_Op]) -> Tuple[List[_Op], Dict[int, List[_Op]]]:
    """(the ops without the per-channel parameter ops, {index in that list of the convolution or
    group_norm: the per-channel ops right after it, in order}): a run of them right after the
    convolution or the group_norm folds into its weight and bias (_check_order admitted them only
    there)."""
    kept: List[_Op] = []
    folds: Dict[int, List[_Op]] = {}
    target = None
    scalars: List[_Op] = []  # mul(by) / add(by) after the target: folded too if a channel op follows
    for op in ops:
        if target is not None and op.kind in ("mul", "add"):
            scalars.append(op)
            continue
        if not op.kind.startswith("channel_"):
            kept += scalars + [op]
            scalars = []
            target = len(kept) - 1 if op.kind in ("conv3d", "conv_transpose3d",
                                                  "group_norm") else None
            continue
        folds.setdefault(target, []).extend(
            _Op("channel_scalar", s.where, {"numel": 1, "op": s.kind, "by": s.attrs["by"]},
                layer=s.layer) for s in scalars)
        scalars = []
        folds[target].append(op)
    return kept + scalars, folds


def _fold_steps(c: _Op) -> list:
    """The Fold steps (op, factor path, eps) of per-channel op `c`: one for a multiply or add by
    a tensor; for a batch norm with running statistics (x - mean) / sqrt(var + eps) * w + b."""
    if c.kind == "channel_scalar":
        return [(c.attrs["op"] + "_by", None, c.attrs["by"])]
    if c.kind != "channel_norm":
        return [(c.kind[len("channel_"):], c.params["factor"][1], None)]
    steps = [("sub", c.params["running_mean"][1], None),
             ("div_std", c.params["running_var"][1], c.attrs["eps"])]
    if "weight" in c.params:
        steps += [("mul", c.params["weight"][1], None), ("add", c.params["bias"][1], None)]
    return steps


def _combine_means(run: List[_Op]):
    """(dims, out_dims) of consecutive means: one mean over the union of their original axes, and
    where keepdim left size-1 axes, the chain output's view (the unreduced axes in order, None for
    a kept one); Unsupported where the union is not [2,3,4] or [1,2,3,4] (fusejit's means)."""
    # `layout` follows the value's dimensions: each an original axis, reduced ones (kept by
    # keepdim) marked negative as ~axis.
    layout = [0, 1, 2, 3, 4]
    for m in run:
        rank = len(layout)
        picked = []
        for d in m.attrs["dims"]:
            if not -rank <= d < rank:
                _refuse(m.where, "dim %d is out of range for a %d-D value (the chain's input "
                                 "is 5-D)" % (d, rank), m.layer)
            picked.append(d % rank)
        if len(set(picked)) != len(picked):
            _refuse(m.where, "dims %s repeat a dimension" % m.attrs["dims"], m.layer)
        keep = m.attrs.get("keepdim", False)
        layout = [(~a if a >= 0 else a) if j in picked else a for j, a in enumerate(layout)
                  if keep or j not in picked]
    dims = sorted(set(range(5)) - set(a for a in layout if a >= 0))
    if dims not in ([2, 3, 4], [1, 2, 3, 4]):
        _refuse(run[0].where, "mean over dims %s; fusejit's mean is over [2,3,4] (giving [N,C]) "
                              "or [1,2,3,4] (giving [N])" % dims, run[0].layer)
    kept = [a for a in layout if a >= 0]
    out_dims = None
    if len(layout) != len(kept):
        out_dims = tuple(kept.index(a) if a >= 0 else None for a in layout)
    return dims, out_dims


def _assemble(found: List[_Op], model: nn.Module) -> Recognized:
    ops: List[_Op] = []
    out_dims = None
    i = 0
    dropouts = [op.layer or "" for op in found if op.kind == "dropout"]
    running_norms = [op.layer or "" for op in found if op.kind == "channel_norm"]
    found = [op for op in found if op.kind not in ("skip", "dropout")]
    while i < len(found):
        op = found[i]
        if op.kind == "rsub_scalar":  # c - x = (-x) + c
            ops.append(_Op("mul", op.where, {"by": -1.0}, layer=op.layer))
            ops.append(_Op("add", op.where, {"by": op.attrs["by"]}, layer=op.layer))
            i += 1
            continue
        if op.kind != "mean":
            ops.append(op)
            i += 1
            continue
        run = []
        while i < len(found) and found[i].kind == "mean":
            run.append(found[i])
            i += 1
        dims, out_dims = _combine_means(run)
        ops.append(_Op("mean", op.where, {"dims": dims}, layer=op.layer))
    ops, channel_ops = _fold_targets(ops)
    if not ops:
        raise Unsupported("fusejit cannot fuse model %s: its forward has no op to fuse; %s"
                          % (_class_name(model), GRAMMAR), reason="no ops")
    # (the ops' order -- one producer first, one group_norm, the mean last -- was checked as they
    # were found: _check_order)
    params: Dict[str, Any] = {}
    paths: Dict[str, str] = {}
    folds: Dict[str, Fold] = {}
    conv = ops[0] if ops[0].kind in ("conv3d", "conv_transpose3d") else None
    gn = None
    norm_constants = None
    gn_channels = None
    for i, op in enumerate(ops):
        if op.kind == "group_norm":
            gn = op
            if "weight" in op.params:
                gn_channels = int(op.params["weight"][0].numel())
            else:
                gn_channels = op.attrs.get("channels")
                if gn_channels is None and conv is not None:
                    gn_channels = conv.attrs["out"]
        chops = channel_ops.get(i)
        if chops:
            channels = conv.attrs["out"] if op is conv else gn_channels
            steps, factors, buffers, watch, cacheable = [], {}, set(), [], True
            for c in chops:
                n = c.attrs["numel"]
                if channels is None and n > 1:
                    channels = gn_channels = n  # the input's channels must be n (spec() checks)
                if n not in (1, channels):
                    what = ("parameter '%s'" % c.params["factor"][1] if "factor" in c.params
                            else c.where)
                    _refuse(c.where, "%s has %d values for the %d channels of %s"
                            % (what, n, channels, op.where), c.layer)
                steps += _fold_steps(c)
                factors.update({path: t for t, path in c.params.values()})
                buffers.update(path for t, path in c.params.values()
                               if not isinstance(t, nn.Parameter))
                if c.kind == "channel_norm":
                    counter = c.attrs.get("counter")
                    if counter is None:
                        cacheable = False
                    else:
                        watch.append(counter)
                        buffers.add(counter)
            if op is conv and not op.attrs["bias"] and any(
                    s[0] not in ("mul", "div", "mul_by") for s in steps):
                op.attrs["bias"] = True  # the added values are the bias
            axis = None if op is not conv else (1 if conv.kind == "conv_transpose3d" else 0)
            for role, kind in (("weight", "scale"), ("bias", "shift")):
                if op is conv and role == "bias" and not op.attrs["bias"]:
                    continue
                base = op.params.get(role)
                folds["%d.%s" % (i, role)] = Fold(
                    base=None if base is None else base[1], role=kind, steps=steps,
                    axis=axis if role == "weight" else None, channels=channels,
                    factors=dict(factors), buffers=frozenset(buffers), watch=tuple(watch),
                    cacheable=cacheable)
                if base is not None:
                    folds["%d.%s" % (i, role)].factors[base[1]] = base[0]
            continue
        for role in ("weight", "bias"):
            if role in op.params:
                p, path = op.params[role]
                params["%d.%s" % (i, role)] = p
                paths["%d.%s" % (i, role)] = path
        if op.kind == "group_norm" and "weight" not in op.params:
            norm_constants = ("%d.weight" % i, "%d.bias" % i, gn_channels)
    if gn is not None and gn.attrs.get("groups") is None:  # F.instance_norm: a group a channel
        if gn_channels is None:
            _refuse(gn.where, "instance_norm without weight and bias on a value whose channels "
                              "the chain does not know (no convolution before it); give it the "
                              "model's weight and bias Parameters, or use nn.InstanceNorm3d",
                    gn.layer)
        gn.attrs["groups"] = gn.attrs["channels"] = gn_channels
    if conv is not None and gn is not None:
        c = conv.attrs["out"]
        if gn_channels != c or c % gn.attrs["groups"] != 0:
            _refuse(gn.where, "group_norm of %d channels in %d groups follows a convolution with "
                              "%d output channels" % (gn_channels, gn.attrs["groups"], c),
                    gn.layer)
    # Ops whose values are a grammar op's but whose gradient at a kink is not (a hardswish written
    # with torch.clamp): calls that need gradients run the original.
    why = []
    for op in ops:
        mark = op.attrs.get("_exclusive")
        if mark == "clamp hardswish":
            why.append("%s, written with a clamp (bounds included), has gradient -1/2 at -3 and "
                       "3/2 at 3 where hardswish's is 0 and 1" % op.where)
    training_fallback = None
    if why:
        training_fallback = "%s: calls that need gradients run the original forward (calls " \
                            "without gradients run fused)" % "; ".join(why)
    return Recognized(
        training_fallback=training_fallback, folds=folds,
        ops=[op.text() for op in ops], params=params, param_paths=paths,
        sources=[op.where for op in ops], norm_constants=norm_constants, out_dims=out_dims,
        dropout_modules=dropouts, running_norms=running_norms,
        norm_is_instance=gn is not None and bool(gn.attrs.get("instance")),
        _conv_weight=None if conv is None else conv.params["weight"][0],
        _transposed=conv is not None and conv.kind == "conv_transpose3d",
        _gn=None if gn is None else (gn.attrs["groups"], gn_channels))
