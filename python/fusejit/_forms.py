"""How each spelling of an op in a traced graph is a grammar op (fusejit._recognize reads it):
the signatures of the functional and method forms, the builders of their ops, the supported
torch.nn modules, the arithmetic forms (constants, per-channel parameters) and the written-out
swish and hardswish; _match_step classifies one node given the chain's value before it."""
from __future__ import annotations

import dataclasses
import inspect
import operator
from typing import Any, Optional, Tuple

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from ._grammar import (Unsupported, _Ctx, _Op, _check_hooks, _describe, _int, _is_node, _no_nodes,
                       _number, _own_param, _param_from_node, _positive, _refuse, _triple)

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
def _s_clamp_min(input, min): pass
def _s_clamp_max(input, max): pass
def _s_mean(input, dim=None, keepdim=False, *, dtype=None, axis=None): pass
def _s_sum(input, dim=None, keepdim=False, *, dtype=None): pass
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


def _b_clamp_min(b, where, layer, ctx):
    return _clamp_op(b["min"], None, where, layer)


def _b_clamp_max(b, where, layer, ctx):
    return _clamp_op(None, b["max"], where, layer)


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


def _b_sum(b, where, layer, ctx):
    """A sum is the chain's mean times the count of the values it reduces (attrs["sum"]; the
    drop-in multiplies the mean's result: Recognized.sum_axes)."""
    if b["dim"] is None or (isinstance(b["dim"], (list, tuple)) and not b["dim"]):
        _refuse(where, "sum over all dimensions; fusejit sums over [2,3,4] (giving [N,C]) or "
                       "[1,2,3,4] (giving [N])", layer)
    kind, attrs, params = _b_mean(b, where, layer, ctx)
    attrs["sum"] = True
    return kind, attrs, params


def _b_gn(b, where, layer, ctx):
    groups = _int(b["num_groups"], "num_groups", where, layer)
    eps = _positive(_number(b["eps"], "eps", where, layer), "eps", where, layer)
    params = _norm_params(b, "group_norm", where, layer, ctx)
    attrs = {"groups": groups, "eps": eps}
    if not params:  # weight 1, bias 0: norm_constants
        attrs["channels"] = None
    return "group_norm", attrs, params


def _norm_params(b, what, where, layer, ctx) -> dict:
    """{"weight", "bias"}: the model's Parameters a functional norm `what` was given (both
    checked [C]), or {} where it was given neither; refused with only one."""
    if b["weight"] is None and b["bias"] is None:
        return {}
    if b["weight"] is None or b["bias"] is None:
        _refuse(where, "%s with a %s but no %s; give both (the model's Parameters) or "
                       "neither" % ((what,) + (("bias", "weight") if b["weight"] is None else
                                              ("weight", "bias"))), layer)
    w = _param_from_node(b["weight"], what + " weight", ctx, where, layer)
    bias = _param_from_node(b["bias"], what + " bias", ctx, where, layer)
    _check_gn_params(w[0], bias[0], None, where, layer)
    return {"weight": w, "bias": bias}


def _b_in(b, where, layer, ctx):
    """F.instance_norm with the batch's statistics: a group_norm with a group a channel (the
    channels from its weight, or _assemble's from the convolution before it)."""
    if b["running_mean"] is not None or b["running_var"] is not None or \
            b["use_input_stats"] is not True:
        _refuse(where, "instance_norm with running statistics; fusejit fuses it with the input's "
                       "own statistics (running_mean=None, running_var=None)", layer)
    eps = _positive(_number(b["eps"], "eps", where, layer), "eps", where, layer)
    attrs = {"groups": None, "eps": eps, "channels": None, "instance": True}
    params = _norm_params(b, "instance_norm", where, layer, ctx)
    if params:  # (without: weight 1, bias 0, norm_constants; the channels _assemble's)
        attrs["groups"] = attrs["channels"] = int(params["weight"][0].numel())
    return "group_norm", attrs, params


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
    (["torch.clamp_min"], _s_clamp_min, _b_clamp_min, False),
    (["torch.clamp_min_"], _s_clamp_min, _b_clamp_min, True),
    (["torch.clamp_max"], _s_clamp_max, _b_clamp_max, False),
    (["torch.clamp_max_"], _s_clamp_max, _b_clamp_max, True),
    (["F.hardtanh"], _s_hardtanh, _b_hardtanh, "inplace"),
    (["F.hardtanh_", "torch._C._nn.hardtanh_"], _s_hardtanh_, _b_hardtanh, True),
    (["F.relu6"], _s_unary_inplace, _b_relu6, "inplace"),
    (["torch.mean"], _s_mean, _b_mean, False),
    (["torch.sum"], _s_sum, _b_sum, False),
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
    "clamp_min": (_s_clamp_min, _b_clamp_min, False), "clamp_min_": (_s_clamp_min, _b_clamp_min, True),
    "clamp_max": (_s_clamp_max, _b_clamp_max, False), "clamp_max_": (_s_clamp_max, _b_clamp_max, True),
    "mean": (_s_mean, _b_mean, False), "sum": (_s_sum, _b_sum, False),
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
