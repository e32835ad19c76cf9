"""The drop-in's vocabulary for the chain grammar (fusejit._recognize reads it): the GRAMMAR text
errors end with, Unsupported, numbers printed as the C++ spec printer prints them, _Op (one op of
a chain as found in a traced graph, and its spec text), how nodes are described in messages, and
the checks of an op's arguments."""
from __future__ import annotations

import dataclasses
import decimal
import math
import operator
import os
import re
from typing import Optional, Tuple

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

GRAMMAR = ("the chain grammar accepts [conv3d|conv_transpose3d] -> elementwise ops (relu, leaky_relu, "
           "sigmoid, tanh, swish/silu, hardswish, gelu, clamp, hardtanh/relu6, mish, softplus, elu, "
           "selu, hardsigmoid, gelu(approximate='tanh'), logsigmoid, softsign, tanhshrink, celu, "
           "* / + - by a constant, c - x, -x) "
           "-> at most one group_norm "
           "(or instance norm without running statistics), "
           "with elementwise ops before and after it -> optional mean (or sum) over [2,3,4] or [1,2,3,4]; "
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
_FUSEJIT_DIR = os.path.dirname(os.path.abspath(__file__))  # (its own frames: fuse(), the trace)
# (a frame's source line is absent where there is no source: code made with exec, python -c)
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)(?:\n(?!\s*File ")([^\n]*))?')


def _user_frame(node) -> Optional[Tuple[str, str, str]]:
    """(file, line, code) of the model's own source line that made `node`, from its recorded
    stack trace; None where there is none."""
    try:
        st = getattr(node, "stack_trace", None) or ""
        frames = _FRAME_RE.findall(st)
        if not frames:
            return None
        inner_first = any(f[0].startswith(_TORCH_DIR) and "symbolic_trace" in f[0] for f in frames)
        user = [f for f in frames
                if not os.path.abspath(f[0]).startswith(_TORCH_DIR) and f[2].strip() != "<module>"
                and os.path.dirname(os.path.abspath(f[0])) != _FUSEJIT_DIR]
        if not user:
            return None
        f = user[0] if inner_first else user[-1]
        return f[0], f[1], f[3].strip()
    except Exception:  # (messages and a source check only)
        return None


def _location(node) -> str:
    """' at file.py:12: x = x + y' from the node's recorded stack trace, where there is one."""
    f = _user_frame(node)
    if f is None:
        return ""
    return " at %s:%s%s" % (os.path.basename(f[0]), f[1], ": " + f[2] if f[2] else "")


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
