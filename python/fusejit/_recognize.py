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
  consecutive means combined, keepdim either, dim= or axis=), as torch.mean or Tensor.mean; a
  sum over them (torch.sum, Tensor.sum, mixed with means too) as the mean times the count of the
  summed values (Recognized.sum_axes, applied by the drop-in to the chain's output); also
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
The forms are in fusejit._forms (each spelling of an op), the vocabulary (Unsupported, _Op,
messages, argument checks) in fusejit._grammar; this module traces, walks the graph and
assembles what it found (its folds, rest of forward and sub-chains).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx
import torch.nn as nn

from ._forms import _IN_PLACE_OPERATORS, _Tracer, _match_step, _module_op
from ._grammar import (GRAMMAR, Unsupported, _Ctx, _Op, _check_hooks, _class_name, _describe,
                       _is_node, _refuse, _user_frame, format_number)

__all__ = ["Unsupported", "Recognized", "recognize", "format_number", "GRAMMAR"]

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
        convolution's channel count (for the 1 or 0 that stands for a missing base). RuntimeError
        where a factor has another shape than at recognition (a Parameter replaced: [1,1,1,1,C]
        broadcasts along W, not the channels)."""
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
            s = get(path)
            seen = self.factors.get(path)
            if seen is not None and s.shape != seen.shape:  # replaced since recognition
                raise RuntimeError("'%s' has shape %s where fusejit recognized it per channel "
                                   "with shape %s" % (path, list(s.shape), list(seen.shape)))
            s = s.to(work).reshape(-1)
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
    # The axes of the chain's value before its mean (1 the channels, 2-4 the spatial ones) that
    # the model sums rather than averages (torch.sum, Tensor.sum): the model's output is the
    # chain's times their sizes (sum_count). Empty: no sum.
    sum_axes: Tuple[int, ...] = ()
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
    # An in-place op of the chain writes its input (x, or a sub-chain's start value): the
    # chain's own code (the original forward, which the drop-in's policy times) changes it; the
    # fused chain does not. The drop-in's measurements give that code a copy.
    writes_input: bool = False
    # Further chains found in the rest, each starting with a convolution (a second conv block
    # after a pooling, the convolutions of a residual block): in the rest they run as
    # SubChain.run(module, y), the chain's own code until the drop-in sets its fused call.
    # With no ops (a forward with nothing to fuse at its start) the whole forward is the rest,
    # rest(module, x, x), and these chains are all there is to fuse.
    sub_chains: list = dataclasses.field(default_factory=list, repr=False, compare=False)
    _conv_weight: Any = dataclasses.field(default=None, repr=False, compare=False)
    # the convolution's k, stride, padding, dilation (and output_padding), for sum_count
    _conv_geometry: Optional[dict] = dataclasses.field(default=None, repr=False)
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

    def sum_count(self, shape) -> int:
        """For an input of `shape` (one spec() takes), the product of the sizes of the chain's
        value before its mean along sum_axes: the factor from the chain's mean to the model's
        sum (1 without sum_axes)."""
        sizes = [int(s) for s in shape]
        if self._conv_weight is not None:
            w, g = self._conv_weight, self._conv_geometry
            sizes[1] = int(w.shape[1] if self._transposed else w.shape[0])
            for a in range(3):
                k, s, p, d = (g[n][a] for n in ("k", "stride", "padding", "dilation"))
                if self._transposed:
                    sizes[2 + a] = ((sizes[2 + a] - 1) * s - 2 * p + d * (k - 1)
                                    + g["output_padding"][a] + 1)
                else:
                    sizes[2 + a] = (sizes[2 + a] + 2 * p - d * (k - 1) - 1) // s + 1
        count = 1
        for a in self.sum_axes:
            count *= sizes[a]
        return count


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
# Tracing and the walk.

def _trace(model: nn.Module, ctx: Optional[_Ctx] = None) -> torch.fx.Graph:
    """The traced graph of model's forward. torch.fx sets the tensors forward makes from
    constants on the model as attributes; they are taken off it again (the model is left as it
    was) into ctx.constants."""
    tracer = _Tracer()
    before = set(model.__dict__)
    # Every module's attributes before tracing: a forward that assigns to them (self.calls += 1,
    # self.feat = x) has an effect the fused chain would not have (and tracing ran it once).
    modules = list(model.named_modules())
    attrs = [dict(m.__dict__) for _, m in modules]
    try:
        tracer.record_stack_traces = True
    except Exception:
        pass
    try:
        defaults = _defaulted_arguments(model)
        graph = tracer.trace(model, concrete_args=defaults or None)
        _drop_specialized(graph, defaults)
    except Exception as e:  # anything the user's forward raises under tracing
        for name in set(model.__dict__) - before:
            del model.__dict__[name]
        _restore_attributes(modules, attrs)
        raise Unsupported("fusejit cannot fuse model %s: torch.fx could not trace its forward (%s: "
                          "%s); fusejit recognizes forwards that torch.fx.symbolic_trace can "
                          "trace; %s" % (_class_name(model), type(e).__name__, e, GRAMMAR),
                          reason="torch.fx could not trace the forward")
    assigned = _restore_attributes(modules, attrs)
    if assigned:
        raise Unsupported("fusejit cannot fuse model %s: its forward assigns to %s, which the "
                          "fused chain would not do; fusejit fuses forwards that only compute "
                          "their output (keep such state outside forward, or return it)"
                          % (_class_name(model), " and ".join(assigned[:3])),
                          reason="forward assigns to module attributes")
    for name in set(model.__dict__) - before:
        value = model.__dict__.pop(name)
        if ctx is not None and torch.is_tensor(value):
            ctx.constants[name] = value
    return graph


_ABSENT = object()

# What torch.fx makes of `y += c` (its proxies have no in-place operators): the out-of-place op
_AUGMENTED = {operator.add: ast.Add, operator.sub: ast.Sub, operator.mul: ast.Mult,
              operator.truediv: ast.Div}


def _check_augmented_assignments(model: nn.Module, nodes, order) -> None:
    """Refuses a forward whose augmented assignment on a tensor (`y += c`, in place in PyTorch)
    torch.fx traced out of place (`y + c`) where that differs: the old value is read later (an
    alias, `feat = y; y += 1`), or it is the input or a model tensor (the original changes the
    caller's). Found by the source line of each such node (its recorded stack trace)."""
    for n in nodes:
        if n.op != "call_function" or n.target not in _AUGMENTED or not n.args or \
                not _is_node(n.args[0]):
            continue
        old = n.args[0]
        later = [u for u in old.users if u is not n and order[u] > order[n]]
        if not later and old.op not in ("placeholder", "get_attr"):
            continue
        frame = _user_frame(n)
        try:
            tree = ast.parse(frame[2]) if frame else None
        except SyntaxError:
            tree = None
        if tree is None or not any(isinstance(a, ast.AugAssign) and
                                   isinstance(a.op, _AUGMENTED[n.target]) for a in ast.walk(tree)):
            continue
        what = ("the forward's input" if old.op == "placeholder" else "a model tensor"
                if old.op == "get_attr" else "a value that is read again after it (an alias)")
        raise Unsupported("fusejit cannot fuse model %s: the augmented assignment of %s changes "
                          "%s in place, which torch.fx traces as a new value; write it out of "
                          "place (y = y + c) to fuse it; %s"
                          % (_class_name(model), _describe(n, _Ctx(model))[0], what, GRAMMAR),
                          reason="an in-place augmented assignment torch.fx does not trace")


def _defaulted_arguments(model: nn.Module) -> dict:
    """forward's arguments after the first that have plain default values (None, bool, int,
    float, str: `forward(self, x, scale=2.0)`), to trace with those values (calls giving them run
    the original: the drop-in fuses calls with x alone); {} where forward has other arguments
    (the trace then shows its inputs, and recognize refuses them)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is p.empty or \
                not isinstance(p.default, (type(None), bool, int, float, str)):
            return {}
        out[p.name] = p.default
    return out


def _drop_specialized(graph: torch.fx.Graph, defaults: dict) -> None:
    """Takes the placeholders of the arguments traced with their defaults (torch.fx keeps them,
    each with an assert that a call's value is the default) out of `graph`: the forward is then
    one of x alone."""
    if not defaults:
        return
    checks = (torch._assert, getattr(torch.fx._symbolic_trace, "_assert_is_none", None))
    for n in [n for n in graph.nodes if n.op == "placeholder"][1:]:
        for u in list(n.users):  # value == default -> assert, or assert_is_none(value)
            for a in list(u.users):
                if a.op == "call_function" and a.target in checks and not a.users:
                    graph.erase_node(a)
            if not u.users and u.op == "call_function" and (u.target is operator.eq or
                                                             u.target in checks):
                graph.erase_node(u)
        if not n.users:
            graph.erase_node(n)


def _restore_attributes(modules, attrs) -> List[str]:
    """Puts back every module attribute tracing assigned, added or removed (`attrs`: each of
    `modules`' __dict__ before), but torch.fx's constants on the root (_tensor_constant<i>, which
    _trace takes off itself); returns them as "attribute 'calls' of the model", in order."""
    assigned = []
    for (name, m), was in zip(modules, attrs):
        now = m.__dict__
        for k in [k for k in now if k not in was] + list(was):
            if m is modules[0][1] and k not in was and k.startswith("_tensor_constant"):
                continue
            if now.get(k, _ABSENT) is not was.get(k, _ABSENT):
                assigned.append("attribute '%s' of %s" % (k, "submodule '%s'" % name if name
                                                           else "the model"))
                if k in was:
                    now[k] = was[k]
                else:
                    del now[k]
    return assigned


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


def traced_code(model: nn.Module):
    """(eval-mode, training-mode) Python code of forward's trace, None for a mode where it cannot
    be traced (and for a bare torch.nn module: no trace). Equal codes: the same forward."""
    if _Tracer().is_leaf_module(model, ""):
        return None, None

    def code():
        try:
            return _trace(model).python_code("self").src
        except Unsupported:
            return None
    return in_mode(model, False, code), in_mode(model, True, code)


def forward_reads_training(model: nn.Module) -> bool:
    """Whether forward's traced code differs between training and eval mode: code torch.fx runs
    while tracing reads self.training (F.dropout(x, p, self.training), `if self.training:`), so
    each mode has a graph of its own. Modules the trace keeps whole (the grammar's, nn.Dropout,
    nn.BatchNorm3d) read their mode when they run, so they do not count. True where forward can
    be traced in one mode only; False where it cannot be traced in either (recognize says
    why)."""
    codes = traced_code(model)
    return codes[0] != codes[1]


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
    _check_augmented_assignments(model, nodes, order)
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
    # (the rest may not read an input the chain changed in place: eager reads the changed one)
    found, cur, stop = g.found, g.end, g.stop
    x_mutated = g.start_mutated or g.start_written
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
        r.writes_input = g.start_written
        subs = _sub_chains(model, nodes, consumed, order, output, ctx)
        if x_mutated and any(n not in consumed for n in placeholders[0].users):
            # (the rest reads the input after the chain changed it in place: say so, not
            # where the chain stops, which is not why the model cannot be fused)
            writer = next(op for op in found if op.mutates_input)
            stop = Unsupported("fusejit cannot fuse model %s: %s changes the input in place and "
                               "the rest of forward reads the input after it (eager reads the "
                               "changed values; the fused chain leaves the input unchanged); %s"
                               % (_class_name(model), writer.where, GRAMMAR), writer.layer,
                               reason="the chain changes the input in place, which the rest "
                                      "of forward reads")
        r.rest, r.rest_from = _rest_of_forward(model, nodes, cur, consumed, ctx, stop,
                                               None if x_mutated else placeholders[0], subs)
        r.sub_chains = [sub for _, _, _, sub in subs]
        for sub in r.sub_chains:  # (the drop-in switches on any of them being in training)
            r.running_norms += sub.recognized.running_norms
            r.dropout_modules += sub.recognized.dropout_modules
        return r
    r = _assemble(found, model)
    r.writes_input = g.start_written
    return r


_PRODUCERS = ("conv3d", "conv_transpose3d")


@dataclasses.dataclass
class _Growth:
    found: list            # the chain's ops (with "skip" and "dropout" entries)
    end: Any               # the node of its last value
    stop: Optional[Unsupported]  # why it ends there (None: it reaches the output)
    start_mutated: bool    # an in-place op of the chain changed its start value
    returns_more: bool = False  # it reaches the output, which returns more than its value
    # an in-place op of the chain wrote the start value's storage, its result discarded or not
    # (`y = self.act(x)` with inplace=True: y is x, changed): eager's later readers of the start
    # value see the change, the fused chain's do not
    start_written: bool = False


def _grow(start, consumed: set, order, output, ctx: _Ctx, shared_start: bool,
          first_node=None) -> _Growth:
    """Grows a chain from value node `start` along its users, one grammar op at a time, adding
    the nodes it takes to `consumed`. Each value inside the chain must feed only the next op
    (but for an in-place op whose result is discarded: the chain goes on with the mutated value);
    shared_start: `start` may feed other nodes too (the model's input of a partial chain, a
    residual). first_node: the node to take first (else start's first user in graph order)."""
    cur = start
    found: List[_Op] = []
    steps = []  # per op of `found`: (the value before it, its nodes, mutated_start and written
    #              before it)
    prev_where = "the input"
    mutated_start = False
    aliased = True  # cur is the start value's storage (in-place ops so far)
    written = False  # an in-place op wrote it
    while True:
        users = sorted((u for u in cur.users if u not in consumed or u is output), key=order.get)
        if not users:
            raise Unsupported("fusejit cannot fuse model %s: the value after %s is not returned; %s"
                              % (_class_name(ctx.model), prev_where, GRAMMAR))
        first = first_node if first_node is not None and not found else users[0]
        if first is output:
            more = len(users) > 1 or tuple(output.args) != (cur,) or bool(output.kwargs)
            return _without_unfusable_means(
                _Growth(found, cur, None, mutated_start, returns_more=more, start_written=written),
                steps, consumed)
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
            return _without_unfusable_means(
                _Growth(found, cur, e, mutated_start, start_written=written), steps, consumed)
        steps.append((cur, step.nodes, mutated_start, written))
        if aliased and step.op.mutates_input:
            written = True
        # (the skipped ops, x.contiguous(), an eval-mode dropout, nn.Identity, return their
        # input itself: still the start's storage; x.clone() too, counted so to be safe)
        aliased = aliased and (step.op.mutates_input or step.op.kind in ("skip", "dropout"))
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
        for _, nodes, _, _ in steps[first:]:
            consumed.difference_update(nodes)
        cur, _, mutated_start, written = steps[first]
        return _Growth(g.found[:first], cur, e, mutated_start, start_written=written)


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
    nodes disjoint from the others'. A candidate that changes its start value in place with
    the result discarded, or that changes it where the rest reads it too (eager's readers see
    the change, the fused chain's would not), whose start value the rest changes in place after
    it (the fused chain saves it for its backward, where PyTorch's ops may save their outputs
    instead), or that _assemble refuses, is left to PyTorch."""
    taken = set(consumed)
    subs = []
    for n in nodes:
        if n in taken or n.op not in ("call_module", "call_function") or not n.args or \
                not _is_node(n.args[0]):
            continue
        v = n.args[0]
        try:
            step = _match_step(v, n, ctx)  # (any op of the grammar, x * 3 too)
            if step is None:
                continue
            op = step.op
            trial = set(taken)
            g = _grow(v, trial, order, output, ctx, shared_start=True, first_node=n)
            if not g.found or g.start_mutated or (
                    op.kind not in _PRODUCERS and not _worth_a_chain(g.found)):
                continue
            r = _assemble(g.found, model)
            r.writes_input = g.start_written
            mine = sorted(trial - taken, key=order.get)
            if g.start_written and any(u not in trial for u in v.users):
                continue  # (it changes its start value in place, which others read: eager's
                #            readers see the change, the fused chain's would not)
            if any(_in_place(u, model) and u.args and u.args[0] is v and
                   order[u] > order[mine[-1]] for u in v.users if u not in trial):
                continue  # (the fused chain saves its input for the backward: changed after)
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
    """(dims, out_dims, summed) of consecutive means and sums: one mean over the union of their
    original axes; where keepdim left size-1 axes, the chain output's view (the unreduced axes in
    order, None for a kept one); the original axes a sum reduced (the mean's result times their
    sizes is the model's). Unsupported where the union is not [2,3,4] or [1,2,3,4] (fusejit's
    means)."""
    # `layout` follows the value's dimensions: each an original axis, reduced ones (kept by
    # keepdim) marked negative as ~axis.
    layout = [0, 1, 2, 3, 4]
    summed = set()
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
        if m.attrs.get("sum"):  # (a kept size-1 axis summed again adds nothing)
            summed.update(layout[j] for j in picked if layout[j] >= 0)
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
    return dims, out_dims, tuple(sorted(summed))


def _assemble(found: List[_Op], model: nn.Module) -> Recognized:
    ops: List[_Op] = []
    out_dims = None
    sum_axes = ()
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
        dims, out_dims, sum_axes = _combine_means(run)
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
        sum_axes=sum_axes,
        _conv_geometry=None if conv is None else {
            n: tuple(conv.attrs[n]) for n in ("k", "stride", "padding", "dilation",
                                              "output_padding") if n in conv.attrs},
        _conv_weight=None if conv is None else conv.params["weight"][0],
        _transposed=conv is not None and conv.kind == "conv_transpose3d",
        _gn=None if gn is None else (gn.attrs["groups"], gn_channels))
