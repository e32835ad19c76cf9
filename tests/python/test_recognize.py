"""Recognition of PyTorch modules as fusejit chains (python/fusejit/_recognize.py). CPU only.

Every recognized model is checked for meaning, not only for its text: a small float64 evaluator
below interprets the recognized op texts with torch.nn.functional and the recognized parameters, and
must agree with the model itself in float64 on random inputs with random weights (GroupNorm weight
and bias random too) to 1e-10.

Run: /usr/bin/python3 -m pytest tests/python -q
"""
import copy
import os
import random
import re
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.normpath(os.path.join(_HERE, "..", "..", "python")), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fusejit._recognize import GRAMMAR, Recognized, Unsupported, format_number, recognize  # noqa: E402
import seed_models  # noqa: E402


# ------------------------------------------------------------------------------------------------
# The float64 evaluator: parses the op texts (the grammar of codegen/spec_parser.cc) and runs them.

_OP = re.compile(r"^\s*([a-z_0-9]+)\s*(?:\((.*)\))?\s*$")


def _split_args(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _value(text):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("["):
        return [float(v) for v in text[1:-1].split(",")]
    return float(text)


def parse_op(text):
    m = _OP.match(text)
    assert m, "op text %r does not parse" % text
    args = {}
    if m.group(2) is not None and m.group(2).strip():
        for part in _split_args(m.group(2)):
            key, _, val = part.partition("=")
            assert key.strip() not in args
            args[key.strip()] = _value(val)
    return m.group(1), args


def _triple(v, default):
    v = default if v is None else v
    v = v if isinstance(v, list) else [v, v, v]
    assert len(v) == 3 and all(float(x).is_integer() for x in v)
    return tuple(int(x) for x in v)


def param(r, name, channels):
    """Chain parameter `name` of Recognized `r` in float64: the model's Parameter, or computed from
    the model's by its Fold (per-channel ops folded into it)."""
    assert not (name in r.params and name in r.folds), name
    if name in r.folds:
        f = r.folds[name]
        assert set(f.factors) == set(f.paths()) - set(f.watch)
        return f.value(lambda path: f.factors[path].detach().double(), f.channels or channels)
    return r.params[name].detach().double()


def evaluate(r, x):
    """Runs Recognized `r` on float64 `x` with r.params; checks the parameter names and shapes
    against codegen/chain.cc's ChainParams rule on the way."""
    expected_names = set()
    shape = tuple(x.shape)
    for i, text in enumerate(r.ops):
        name, a = parse_op(text)
        p = lambda role: param(r, "%d.%s" % (i, role), x.shape[1])  # noqa: E731
        if name in ("conv3d", "conv_transpose3d"):
            assert i == 0
            k = _triple(a["k"], None)
            stride = _triple(a.get("stride"), 1)
            padding = _triple(a.get("padding"), 0)
            dilation = _triple(a.get("dilation"), 1)
            bias = a.get("bias", True)
            expected_names |= {"%d.weight" % i} | ({"%d.bias" % i} if bias else set())
            w = p("weight")
            cin, cout = x.shape[1], int(a["out"])
            want = (cout, cin) + k if name == "conv3d" else (cin, cout) + k
            assert tuple(w.shape) == want, (text, tuple(w.shape), want)
            b = p("bias") if bias else None
            if b is not None:
                assert tuple(b.shape) == (cout,)
            if name == "conv3d":
                x = F.conv3d(x, w, b, stride=stride, padding=padding, dilation=dilation)
            else:
                x = F.conv_transpose3d(x, w, b, stride=stride, padding=padding,
                                       output_padding=_triple(a.get("output_padding"), 0),
                                       dilation=dilation)
        elif name == "relu":
            x = torch.relu(x)
        elif name == "leaky_relu":
            x = F.leaky_relu(x, a.get("slope", a.get("negative_slope", 0.01)))
        elif name == "sigmoid":
            x = torch.sigmoid(x)
        elif name == "tanh":
            x = torch.tanh(x)
        elif name in ("swish", "silu"):
            x = F.silu(x)
        elif name == "hardswish":
            x = F.hardswish(x)
        elif name == "gelu":
            x = F.gelu(x)
        elif name == "clamp":
            assert set(a) in ({"min", "max"}, {"min"}, {"max"})
            x = torch.clamp(x, a.get("min"), a.get("max"))
        elif name == "hardtanh":
            assert set(a) == {"min", "max"}
            x = F.hardtanh(x, a["min"], a["max"])
        elif name == "mul":
            x = x * a["by"]
        elif name == "add":
            x = x + a["by"]
        elif name == "mish":
            x = F.mish(x)
        elif name == "softplus":
            assert set(a) == {"beta", "threshold"}
            x = F.softplus(x, a["beta"], a["threshold"])
        elif name == "elu":
            assert set(a) == {"alpha"}
            x = F.elu(x, a["alpha"])
        elif name == "selu":
            x = F.selu(x)
        elif name == "hardsigmoid":
            x = F.hardsigmoid(x)
        elif name == "gelu_tanh":
            x = F.gelu(x, approximate="tanh")
        elif name == "logsigmoid":
            x = F.logsigmoid(x)
        elif name == "softsign":
            x = F.softsign(x)
        elif name == "tanhshrink":
            x = F.tanhshrink(x)
        elif name == "celu":
            assert set(a) == {"alpha"}
            x = F.celu(x, a["alpha"])
        elif name == "group_norm":
            if r.norm_constants is not None:  # no weight and bias in the model: 1 and 0
                assert r.norm_constants[:2] == ("%d.weight" % i, "%d.bias" % i)
                assert r.norm_constants[2] in (None, x.shape[1])
                w = torch.ones(x.shape[1], dtype=x.dtype)
                b = torch.zeros(x.shape[1], dtype=x.dtype)
            else:
                expected_names |= {"%d.weight" % i, "%d.bias" % i}
                w, b = p("weight"), p("bias")
            assert tuple(w.shape) == tuple(b.shape) == (x.shape[1],)
            x = F.group_norm(x, int(a["groups"]), w, b, a.get("eps", 1e-5))
        elif name == "mean":
            assert i == len(r.ops) - 1
            dims = [int(d) for d in a["dims"]]
            assert dims in ([2, 3, 4], [1, 2, 3, 4])
            assert set(r.sum_axes) <= set(dims)
            count = 1
            for d in r.sum_axes:  # the model sums over these: the mean times their sizes
                count *= x.shape[d]
            assert r.sum_count(shape) == count, (r.sum_count(shape), count)
            x = x.mean(dim=dims) * count
        else:
            raise AssertionError("unknown op %r" % text)
    assert set(r.params) | set(r.folds) == expected_names, (sorted(r.params), sorted(expected_names))
    if r.out_dims is not None:  # the model's view of the chain's output
        x = x.view([1 if d is None else x.shape[d] for d in r.out_dims])
    return x


def randomize(model, seed=0):
    """Random weights everywhere; GroupNorm weight and bias random, never 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1)
            if p.dim() == 1 and ("group_norm" in name or "gn" in name or "norm" in name):
                p.add_(torch.sign(p) * 0.5)  # keep weights away from zero
    return model


def check_semantics(model, shape, seed=0):
    """Recognizes `model`, checks the parameters are the model's own objects, and that the chain's
    float64 result equals the model's own float64 forward on random input to 1e-10."""
    model = randomize(model, seed)
    r = recognize(model)
    assert isinstance(r, Recognized)
    named = dict(model.named_parameters())
    assert set(r.params) == set(r.param_paths)
    for key, p in r.params.items():
        assert isinstance(p, nn.Parameter)
        assert p is named[r.param_paths[key]], key
    before = {k: p for k, p in r.params.items()}
    model = model.double()
    for k, p in r.params.items():
        assert p is before[k]  # .double() keeps the Parameter objects
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    with torch.no_grad():
        want = model(x.clone())
        got = evaluate(r, x.clone())
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= 1e-10 * (1 + want.abs().max().item()), (r.ops, err)
    assert want.abs().max().item() > 0  # not a degenerate all-zero comparison
    spec = r.spec(shape)
    assert spec == "x:f32[%s] | %s" % (",".join(str(s) for s in shape), " | ".join(r.ops))
    return r


# ------------------------------------------------------------------------------------------------
# The seed models.

@pytest.mark.parametrize("name", sorted(seed_models.SEEDS))
def test_seed_model(name):
    cls, init, seed_shape, seed_spec, small_shape = seed_models.SEEDS[name]
    model = cls(*init)
    r = recognize(model)
    assert r.spec(seed_shape) == seed_spec
    assert r.spec(list(seed_shape), dtype=torch.float32) == seed_spec
    check_semantics(cls(*init), small_shape)


def test_seed_w1_names_and_paths():
    cls, init = seed_models.SEEDS["W1"][:2]
    model = cls(*init)
    r = recognize(model)
    assert r.ops == ["conv_transpose3d(out=16,k=3,stride=2,padding=1)", "swish",
                     "group_norm(groups=4,eps=1e-5)", "hardswish"]
    assert r.param_paths == {"0.weight": "conv_transpose.weight", "0.bias": "conv_transpose.bias",
                             "2.weight": "group_norm.weight", "2.bias": "group_norm.bias"}
    assert r.params["0.weight"] is model.conv_transpose.weight
    assert r.params["2.bias"] is model.group_norm.bias
    assert len(r.sources) == 4 and "conv_transpose" in r.sources[0]


def test_seed_w3_w4_names():
    cls, init = seed_models.SEEDS["W3"][:2]
    r = recognize(cls(*init))
    assert sorted(r.params) == ["0.weight", "2.bias", "2.weight"]  # bias=False conv
    cls, init = seed_models.SEEDS["W4"][:2]
    r = recognize(cls(*init))
    assert r.param_paths == {"0.weight": "conv.weight", "0.bias": "conv.bias",
                             "1.weight": "group_norm.weight", "1.bias": "group_norm.bias"}


# ------------------------------------------------------------------------------------------------
# Other ways of writing chains: (id, model factory, input shape, expected ops).

class Fn(nn.Module):
    """A module whose forward is `fn(self, x)`, with submodules/parameters given as keywords."""

    def __init__(self, fn, **children):
        super().__init__()
        self._fn = fn
        for k, v in children.items():
            setattr(self, k, v)

    def forward(self, x):
        return self._fn(self, x)


class AugmentedAlias(nn.Module):
    """y += c where y's old value is also returned: in place in PyTorch, not in the trace."""

    def __init__(self):
        super().__init__()
        self.conv = conv()

    def forward(self, x):
        y = self.conv(x)
        feat = y
        y += 1.0
        return torch.relu(y), feat


class AugmentedInput(nn.Module):
    def forward(self, x):
        x *= 2.0  # changes the caller's tensor
        return torch.relu(x)


class AugmentedPlain(nn.Module):
    """y += c on a value read nowhere else: the trace's y + c is the same."""

    def __init__(self):
        super().__init__()
        self.conv = conv()

    def forward(self, x):
        y = self.conv(x)
        y += 1.0
        y *= 0.5
        return torch.tanh(y)


class WithDefaults(nn.Module):
    """forward(self, x, scale=..., act=None, flag=True): traced with the defaults."""

    def __init__(self):
        super().__init__()
        self.conv = conv()

    def forward(self, x, scale=0.5, act=None, flag=True, name="y"):
        x = self.conv(x) * scale
        if act is not None:
            x = act(x)
        if flag and name == "y":
            x = torch.clamp_min(x, -0.25).clamp_max(0.75)
        return x


def conv(cin=3, cout=8, k=3, **kw):
    return nn.Conv3d(cin, cout, k, **kw)


def gn(groups=2, c=8, **kw):
    return nn.GroupNorm(groups, c, **kw)


def fparam(*shape):
    return nn.Parameter(torch.randn(*shape))


def _with_buffer():
    m = Fn(lambda s, x: s.gn(s.conv(x) * s.scale) + s.shift, conv=conv(), gn=gn())
    m.register_buffer("scale", torch.rand(8, 1, 1, 1) + 0.5)
    m.register_buffer("shift", torch.randn(1, 8, 1, 1, 1))
    return m


def _bn(c=8):
    """An eval-mode BatchNorm3d with random running statistics and affine parameters."""
    m = nn.BatchNorm3d(c)
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(c) * 0.5)
        m.running_var.copy_(torch.rand(c) + 0.5)
        m.weight.copy_(torch.randn(c))
        m.bias.copy_(torch.randn(c))
    return m.eval()


def _scaled_then_folded():
    """Python-number multiplies and adds between the convolution and per-channel ops (a batch
    norm, a Parameter multiply) fold with them; those after the last one stay chain ops."""
    m = Fn(lambda s, x: torch.relu(s.bn((1 - s.conv(x) / 2.0) * s.scale + 0.5) * 3.0),
           conv=conv(bias=False), bn=_bn())
    m.scale = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)
    return m.eval()


def _with_plain_tensor():
    m = Fn(lambda s, x: s.conv(x) * s.scale, conv=conv())
    m.scale = torch.rand(8, 1, 1, 1)  # neither a Parameter nor a buffer
    return m


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.conv(x))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.norm = nn.GroupNorm(4, 8, eps=1e-3)

    def forward(self, x):
        x = self.block(x)
        x = self.norm(x)
        return torch.tanh(x)


class FunctionalConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3, 3))
        self.bias = nn.Parameter(torch.randn(8))
        self.gw = nn.Parameter(torch.randn(8))
        self.gb = nn.Parameter(torch.randn(8))

    def forward(self, x):
        x = F.conv3d(x, self.weight, self.bias, stride=2, padding=1)
        x = F.relu(x, inplace=True)
        x = F.group_norm(x, 4, self.gw, self.gb, eps=1e-3)
        return torch.mean(x, dim=(-3, -2, -1))


class FunctionalConvT(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 6, 3, 2, 3))  # [Cin, Cout, k...]

    def forward(self, x):
        x = torch.conv_transpose3d(x, self.w, None, 2, 1, 1)  # stride, padding, output_padding
        return x.sigmoid()


class TorchGroupNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.ModuleDict({"w": nn.ParameterList([fparam(6), fparam(6)])}) \
            if hasattr(nn, "ParameterList") else None
        self.scale = fparam(6)
        self.shift = fparam(6)

    def forward(self, x):
        return torch.group_norm(x, 3, self.scale, self.shift, 1e-4)


class DiscardedInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = conv()
        self.act = nn.ReLU(inplace=True)
        self.norm = gn()

    def forward(self, x):
        x = self.conv(x)
        self.act(x)  # result discarded: x itself is changed
        x = self.norm(x)
        x.clamp_(-0.5, 0.75)
        return x


class Chained(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = conv(cout=4)
        self.n = gn(2, 4)

    def forward(self, x):
        return self.n(self.c(x).relu_()).mean(-1).mean(-1).mean(-1)


class MyConv(nn.Conv3d):
    pass


class MyReLU(nn.ReLU):
    pass


class MyGroupNorm(nn.GroupNorm):
    def __init__(self, groups, channels):
        super().__init__(groups, channels, eps=1e-5)


def _sw(f):
    return lambda: Fn(lambda s, x: s.n(f(s, s.c(x))), c=conv(), n=gn(), sig=nn.Sigmoid(),
                      hs=nn.Hardsigmoid())


SWISH_FORMS = {
    "torch.sigmoid(x)*x": lambda s, x: torch.sigmoid(x) * x,
    "x*torch.sigmoid(x)": lambda s, x: x * torch.sigmoid(x),
    "x*x.sigmoid()": lambda s, x: x * x.sigmoid(),
    "x.sigmoid()*x": lambda s, x: x.sigmoid() * x,
    "x*F.sigmoid(x)": lambda s, x: x * F.sigmoid(x),
    "nn.Sigmoid()(x)*x": lambda s, x: s.sig(x) * x,
    "torch.mul(x,torch.sigmoid(x))": lambda s, x: torch.mul(x, torch.sigmoid(x)),
    "x.mul(x.sigmoid())": lambda s, x: x.mul(x.sigmoid()),
    "F.silu(x)": lambda s, x: F.silu(x),
    "F.silu(x,inplace=True)": lambda s, x: F.silu(x, inplace=True),
}

HARDSWISH_FORMS = {
    "F.hardswish(x)": lambda s, x: F.hardswish(x),
    "x*F.relu6(x+3)/6": lambda s, x: x * F.relu6(x + 3) / 6,
    "x*(F.relu6(x+3.)/6.)": lambda s, x: x * (F.relu6(x + 3.) / 6.),
    "x*torch.clamp(x+3,0,6)/6": lambda s, x: x * torch.clamp(x + 3, 0, 6) / 6,
    "F.hardtanh(3+x,0.,6.)*x/6": lambda s, x: F.hardtanh(3 + x, 0., 6.) * x / 6,
    "x*F.hardsigmoid(x)": lambda s, x: x * F.hardsigmoid(x),
    "nn.Hardsigmoid()(x)*x": lambda s, x: s.hs(x) * x,
}

class _ScalarMethods(nn.Module):
    def forward(self, x):
        x = x.mul(2).sub(1).tanh()
        x = x.div(2)
        x += 3
        x *= -1.5
        return x


CASES = [
    ("sequential", lambda: nn.Sequential(conv(), nn.ReLU(), gn()), (2, 3, 6, 6, 6),
     ["conv3d(out=8,k=3)", "relu", "group_norm(groups=2,eps=1e-5)"]),
    ("nested-sequential-identity-dropout0",
     lambda: nn.Sequential(nn.Sequential(nn.ConvTranspose3d(3, 8, 2, stride=2), nn.Identity()),
                           nn.SiLU(), nn.Dropout(p=0.0), gn(4), nn.Hardswish(inplace=True)),
     (2, 3, 3, 4, 3),
     ["conv_transpose3d(out=8,k=2,stride=2)", "swish", "group_norm(groups=4,eps=1e-5)",
      "hardswish"]),
    ("nested-custom-modules", Outer, (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3,padding=1)", "leaky_relu(slope=0.2)", "group_norm(groups=4,eps=0.001)",
      "tanh"]),
    ("functional-conv-group_norm-negative-mean", FunctionalConv, (2, 3, 6, 7, 8),
     ["conv3d(out=8,k=3,stride=2,padding=1)", "relu", "group_norm(groups=4,eps=0.001)",
      "mean(dims=[2,3,4])"]),
    ("functional-conv_transpose-positional", FunctionalConvT, (2, 3, 3, 4, 2),
     ["conv_transpose3d(out=6,k=[3,2,3],stride=2,padding=1,output_padding=1,bias=false)",
      "sigmoid"]),
    ("torch.group_norm-only", TorchGroupNorm, (2, 6, 3, 4, 5), ["group_norm(groups=3,eps=1e-4)"]),
    ("methods", lambda: Fn(lambda s, x: s.c(x).relu().sigmoid().tanh(), c=conv()),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "relu", "sigmoid", "tanh"]),
    ("inplace-forms", lambda: Fn(lambda s, x: F.relu_(torch.relu_(s.a(s.c(x)).relu_())),
                                 c=conv(), a=nn.ReLU(inplace=True)),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "relu", "relu", "relu", "relu"]),
    ("discarded-inplace-results", DiscardedInplace, (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3)", "relu", "group_norm(groups=2,eps=1e-5)", "clamp(min=-0.5,max=0.75)"]),
    ("leaky-forms", lambda: Fn(lambda s, x: F.leaky_relu_(F.leaky_relu(s.l(x), negative_slope=0.1),
                                                          0.3), l=nn.LeakyReLU(0.123456789)),
     (2, 4, 3, 3, 3),
     ["leaky_relu(slope=0.123456789)", "leaky_relu(slope=0.1)", "leaky_relu(slope=0.3)"]),
    ("clamp-forms", lambda: Fn(lambda s, x: torch.clip(F.hardtanh(x.clamp(min=-1, max=2)
                                                                   .clamp_(-1.5, 1.5), -2., 2.),
                                                        0.1, 0.9), ),
     (2, 4, 3, 3, 3),
     ["clamp(min=-1,max=2)", "clamp(min=-1.5,max=1.5)", "hardtanh(min=-2,max=2)",
      "clamp(min=0.1,max=0.9)"]),
    ("clamp-modules", lambda: nn.Sequential(nn.Hardtanh(-0.25, 0.75), nn.ReLU6(), nn.Hardtanh()),
     (2, 4, 3, 3, 3),
     ["hardtanh(min=-0.25,max=0.75)", "hardtanh(min=0,max=6)", "hardtanh(min=-1,max=1)"]),
    ("buffer-factors-folded", _with_buffer, (2, 3, 6, 6, 6),
     ["conv3d(out=8,k=3)", "group_norm(groups=2,eps=1e-5)"]),
    ("relu6-and-one-sided-clamp-min0",
     lambda: Fn(lambda s, x: torch.clamp(F.relu6(x), min=0)), (2, 4, 3, 3, 3),
     ["hardtanh(min=0,max=6)", "clamp(min=0)"]),
    ("one-sided-clamps", lambda: Fn(lambda s, x: torch.clamp(x.clamp(max=0.75), min=-0.25)),
     (2, 4, 3, 3, 3), ["clamp(max=0.75)", "clamp(min=-0.25)"]),
    ("gelu-forms", lambda: Fn(lambda s, x: F.gelu(F.gelu(s.g(x)), approximate="none"),
                              g=nn.GELU()),
     (2, 4, 3, 3, 3), ["gelu", "gelu", "gelu"]),
    ("more-activation-modules", lambda: nn.Sequential(
        nn.GELU(approximate="tanh"), nn.CELU(0.5), nn.LogSigmoid(), nn.Softsign(),
        nn.Tanhshrink()), (2, 4, 3, 3, 3),
     ["gelu_tanh", "celu(alpha=0.5)", "logsigmoid", "softsign", "tanhshrink"]),
    ("more-activation-functions", lambda: Fn(lambda s, x: -torch.neg(F.tanhshrink(F.softsign(
        F.logsigmoid(torch.celu(F.gelu(x, approximate="tanh"), 2.0))))).neg()), (2, 4, 3, 3, 3),
     ["gelu_tanh", "celu(alpha=2)", "logsigmoid", "softsign", "tanhshrink", "mul(by=-1)",
      "mul(by=-1)", "mul(by=-1)"]),
    ("constant-minus-x", lambda: Fn(lambda s, x: 1 - torch.sigmoid(0.5 - x)), (2, 4, 3, 3, 3),
     ["mul(by=-1)", "add(by=0.5)", "sigmoid", "mul(by=-1)", "add(by=1)"]),
    ("scalars-before-folds", _scaled_then_folded, (2, 3, 6, 6, 6),
     ["conv3d(out=8,k=3)", "mul(by=3)", "relu"]),
    ("scalar-then-batch-norm", lambda: Fn(lambda s, x: s.bn(s.gn(s.conv(x)) * 2.0 - 1.0),
                                          conv=conv(), gn=gn(), bn=_bn()).eval(),
     (2, 3, 6, 6, 6), ["conv3d(out=8,k=3)", "group_norm(groups=2,eps=1e-5)"]),
    ("functional-instance-norm", lambda: Fn(lambda s, x: torch.relu(F.instance_norm(
        s.conv(x), eps=1e-3)), conv=conv()), (2, 3, 6, 6, 6),
     ["conv3d(out=8,k=3)", "group_norm(groups=8,eps=0.001)", "relu"]),
    ("functional-instance-norm-weights", lambda: Fn(lambda s, x: F.instance_norm(
        torch.relu(x), weight=s.w, bias=s.b) * 2.0, w=nn.Parameter(torch.randn(4)),
        b=nn.Parameter(torch.randn(4))), (2, 4, 3, 4, 5),
     ["relu", "group_norm(groups=4,eps=1e-5)", "mul(by=2)"]),
    ("bias-false-conv-only", lambda: conv(bias=False), (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3,bias=false)"]),
    ("tuple-sizes", lambda: nn.Conv3d(3, 4, (3, 1, 2), stride=(2, 1, 1), padding=(1, 0, 1),
                                      dilation=(1, 2, 1)),
     (2, 3, 6, 5, 6),
     ["conv3d(out=4,k=[3,1,2],stride=[2,1,1],padding=[1,0,1],dilation=[1,2,1])"]),
    ("conv_transpose-output_padding-dilation",
     lambda: nn.ConvTranspose3d(3, 4, 3, stride=(2, 3, 2), padding=1, output_padding=(1, 2, 0),
                                dilation=2),
     (2, 3, 3, 2, 3),
     ["conv_transpose3d(out=4,k=3,stride=[2,3,2],padding=1,output_padding=[1,2,0],dilation=2)"]),
    ("padding-same", lambda: nn.Sequential(nn.Conv3d(3, 4, (3, 5, 1), padding="same",
                                                     dilation=(2, 1, 3)), nn.Tanh()),
     (2, 3, 6, 6, 6), ["conv3d(out=4,k=[3,5,1],padding=[2,2,0],dilation=[2,1,3])", "tanh"]),
    ("padding-valid", lambda: nn.Conv3d(3, 4, 2, padding="valid"), (2, 3, 4, 4, 4),
     ["conv3d(out=4,k=2)"]),
    ("group_norm-only-module", lambda: gn(3, 6, eps=1e-6), (2, 6, 3, 4, 5),
     ["group_norm(groups=3,eps=1e-6)"]),
    ("elementwise-only", lambda: nn.Sequential(nn.ReLU(), nn.Sigmoid()), (2, 4, 3, 3, 3),
     ["relu", "sigmoid"]),
    ("mean-1234-list", lambda: Fn(lambda s, x: s.n(x).mean([-4, -3, -2, -1]), n=gn(2, 4)),
     (2, 4, 3, 3, 3), ["group_norm(groups=2,eps=1e-5)", "mean(dims=[1,2,3,4])"]),
    ("mean-tuple-positional-reordered", lambda: Fn(lambda s, x: torch.mean(torch.relu(x), (4, 2, 3))),
     (2, 4, 3, 3, 3), ["relu", "mean(dims=[2,3,4])"]),
    ("mean-keyword-keepdim-false", lambda: Fn(lambda s, x: x.mean(dim=(2, 3, 4), keepdim=False)),
     (2, 4, 3, 3, 3), ["mean(dims=[2,3,4])"]),
    ("consecutive-means", Chained, (2, 3, 5, 5, 5),
     ["conv3d(out=4,k=3)", "relu", "group_norm(groups=2,eps=1e-5)", "mean(dims=[2,3,4])"]),
    ("means-then-channels",
     lambda: Fn(lambda s, x: torch.mean(x.mean(dim=[2, 3, 4]), 1)), (2, 4, 3, 3, 3),
     ["mean(dims=[1,2,3,4])"]),
    ("plain-subclasses", lambda: nn.Sequential(MyConv(3, 8, 3), MyReLU(), MyGroupNorm(4, 8)),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "relu", "group_norm(groups=4,eps=1e-5)"]),
    ("contiguous-clone", lambda: Fn(lambda s, x: torch.relu(x.contiguous()).clone()),
     (2, 4, 3, 3, 3), ["relu"]),
    ("global-avg-pool-module-flatten",
     lambda: nn.Sequential(conv(), gn(), nn.AdaptiveAvgPool3d(1), nn.Flatten()), (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3)", "group_norm(groups=2,eps=1e-5)", "mean(dims=[2,3,4])"]),
    ("global-avg-pool-functional-flatten-then-mean",
     lambda: Fn(lambda s, x: F.adaptive_avg_pool3d(torch.relu(x), (1, 1, 1)).flatten(1).mean(1)),
     (2, 4, 3, 3, 3), ["relu", "mean(dims=[1,2,3,4])"]),
    ("global-avg-pool-torch.flatten",
     lambda: Fn(lambda s, x: torch.flatten(F.adaptive_avg_pool3d(x, output_size=1), start_dim=1)),
     (2, 4, 3, 3, 3), ["mean(dims=[2,3,4])"]),
    ("sum-is-a-mean", lambda: Fn(lambda s, x: torch.sum(torch.relu(x), dim=[2, 3, 4])),
     (2, 4, 3, 3, 3), ["relu", "mean(dims=[2,3,4])"]),
    ("sum-method-kept-then-mean",
     lambda: Fn(lambda s, x: x.sigmoid().sum((2, 3, 4), keepdim=True).mean(1)),
     (2, 4, 3, 3, 3), ["sigmoid", "mean(dims=[1,2,3,4])"]),
    ("sum-after-strided-conv-transpose",
     lambda: Fn(lambda s, x: s.conv(x).sum([2, 3, 4], keepdim=True),
                conv=nn.ConvTranspose3d(3, 4, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 1),
                                        output_padding=(1, 0, 2), dilation=(1, 2, 1))),
     (2, 3, 3, 4, 3),
     ["conv_transpose3d(out=4,k=[3,2,3],stride=[2,1,3],padding=[1,0,1],output_padding=[1,0,2],"
      "dilation=[1,2,1])", "mean(dims=[2,3,4])"]),
    ("sum-after-dilated-conv-over-channels-too",
     lambda: Fn(lambda s, x: torch.sum(s.conv(x).mean(3), (1, 2, 3)),
                conv=nn.Conv3d(3, 5, 3, stride=(2, 1, 2), padding=(2, 0, 1), dilation=(1, 2, 1))),
     (2, 3, 7, 6, 5), ["conv3d(out=5,k=3,stride=[2,1,2],padding=[2,0,1],dilation=[1,2,1])",
                       "mean(dims=[1,2,3,4])"]),
    ("augmented-assignment-without-alias", AugmentedPlain, (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3)", "add(by=1)", "mul(by=0.5)", "tanh"]),
    ("forward-with-defaults", WithDefaults, (2, 3, 5, 5, 5),
     ["conv3d(out=8,k=3)", "mul(by=0.5)", "clamp(min=-0.25)", "clamp(max=0.75)"]),
    ("clamp_min-method-in-place", lambda: Fn(lambda s, x: torch.tanh(x).clamp_min_(0.1)),
     (2, 4, 3, 3, 3), ["tanh", "clamp(min=0.1)"]),
    ("keepdim", lambda: Fn(lambda s, x: torch.mean(torch.relu(x), dim=[2, 3, 4], keepdim=True)),
     (2, 4, 3, 3, 3), ["relu", "mean(dims=[2,3,4])"]),
    ("keepdim-all-but-batch", lambda: Fn(lambda s, x: x.sigmoid().mean([-1, 1, 2, 3], True)),
     (2, 4, 3, 3, 3), ["sigmoid", "mean(dims=[1,2,3,4])"]),
    ("keepdim-then-drop", lambda: Fn(lambda s, x: x.mean([3, 4], keepdim=True).mean(2)),
     (2, 4, 3, 3, 3), ["mean(dims=[2,3,4])"]),
    ("pool-without-flatten", lambda: nn.Sequential(conv(), nn.ReLU(), nn.AdaptiveAvgPool3d(1)),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "relu", "mean(dims=[2,3,4])"]),
    ("pool-functional-then-channel-mean",
     lambda: Fn(lambda s, x: F.adaptive_avg_pool3d(x, 1).mean(1, keepdim=True)),
     (2, 4, 3, 3, 3), ["mean(dims=[1,2,3,4])"]),
    ("affine-false", lambda: nn.Sequential(conv(), nn.GroupNorm(2, 8, affine=False), nn.Tanh()),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "group_norm(groups=2,eps=1e-5)", "tanh"]),
    ("affine-false-alone", lambda: nn.GroupNorm(3, 6, eps=1e-3, affine=False), (2, 6, 3, 4, 5),
     ["group_norm(groups=3,eps=0.001)"]),
    ("instance-norm", lambda: nn.Sequential(conv(), nn.InstanceNorm3d(8), nn.ReLU()),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "group_norm(groups=8,eps=1e-5)", "relu"]),
    ("instance-norm-affine", lambda: nn.Sequential(nn.SiLU(), nn.InstanceNorm3d(4, affine=True)),
     (2, 4, 3, 3, 3), ["swish", "group_norm(groups=4,eps=1e-5)"]),
    ("F.group_norm-no-params", lambda: Fn(lambda s, x: F.group_norm(torch.relu(x), 2)),
     (2, 4, 3, 3, 3), ["relu", "group_norm(groups=2,eps=1e-5)"]),
    ("F.group_norm-no-params-after-conv",
     lambda: Fn(lambda s, x: F.group_norm(s.conv(x), 4, eps=1e-4).mean([2, 3, 4], keepdim=True),
                conv=conv()),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "group_norm(groups=4,eps=1e-4)", "mean(dims=[2,3,4])"]),
    ("scalar-ops", lambda: Fn(lambda s, x: (torch.relu(s.conv(x) * 2.5) / 4 + 1 - 0.25) * -3,
                              conv=conv()),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "mul(by=2.5)", "relu", "mul(by=0.25)", "add(by=1)",
                       "add(by=-0.25)", "mul(by=-3)"]),
    ("scalar-ops-reversed-and-functions",
     lambda: Fn(lambda s, x: torch.sub(torch.div(0.5 * torch.add(2, torch.mul(x, 3)), 8), 1)),
     (2, 4, 3, 3, 3), ["mul(by=3)", "add(by=2)", "mul(by=0.5)", "mul(by=0.125)", "add(by=-1)"]),
    ("scalar-methods-and-in-place", _ScalarMethods, (2, 4, 3, 3, 3),
     ["mul(by=2)", "add(by=-1)", "tanh", "mul(by=0.5)", "add(by=3)", "mul(by=-1.5)"]),
    ("scalar-around-group-norm",
     lambda: Fn(lambda s, x: (s.n(x * 0.1) + 0.5).mean([2, 3, 4]), n=gn(2, 4)),
     (2, 4, 3, 3, 3), ["mul(by=0.1)", "group_norm(groups=2,eps=1e-5)", "add(by=0.5)",
                       "mean(dims=[2,3,4])"]),
    ("subclass-of-conv-scaled", lambda: type("MyConv", (nn.Conv3d,), {
        "forward": lambda self, x: nn.Conv3d.forward(self, x) * 2})(3, 4, 3),
     (2, 3, 5, 5, 5), ["conv3d(out=4,k=3)", "mul(by=2)"]),
    ("dropout-modules", lambda: nn.Sequential(conv(), nn.Dropout(0.5), nn.ReLU(), nn.Dropout3d(0.1),
                                              gn()).eval(),
     (2, 3, 5, 5, 5), ["conv3d(out=8,k=3)", "relu", "group_norm(groups=2,eps=1e-5)"]),
    ("F.dropout-not-training", lambda: Fn(lambda s, x: F.dropout(torch.tanh(x), 0.3, training=False)),
     (2, 4, 3, 3, 3), ["tanh"]),
    ("mean-axis-alias", lambda: Fn(lambda s, x: x.tanh().mean(axis=(2, 3, 4))), (2, 4, 3, 3, 3),
     ["tanh", "mean(dims=[2,3,4])"]),
    ("functional-dropout-p0", lambda: Fn(lambda s, x: F.dropout(torch.tanh(x), p=0.0)),
     (2, 4, 3, 3, 3), ["tanh"]),
]
CASES += [("swish:" + k, _sw(f), (2, 3, 5, 5, 5),
           ["conv3d(out=8,k=3)", "swish", "group_norm(groups=2,eps=1e-5)"])
          for k, f in SWISH_FORMS.items()]
CASES += [("hardswish:" + k, _sw(f), (2, 3, 5, 5, 5),
           ["conv3d(out=8,k=3)", "hardswish", "group_norm(groups=2,eps=1e-5)"])
          for k, f in HARDSWISH_FORMS.items()]


@pytest.mark.parametrize("factory,shape,ops", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_recognized(factory, shape, ops):
    r = check_semantics(factory(), shape)
    assert r.ops == ops


def test_dropout_modules_are_named():
    r = recognize(nn.Sequential(conv(), nn.Dropout(0.5), nn.ReLU(), nn.Dropout3d(0.1),
                                nn.Dropout(0.0)))
    assert r.ops == ["conv3d(out=8,k=3)", "relu"]
    assert r.dropout_modules == ["1", "3"]  # p=0 is the identity in either mode


def test_params_are_the_models_own_objects():
    model = FunctionalConv()
    r = recognize(model)
    assert r.param_paths == {"0.weight": "weight", "0.bias": "bias", "2.weight": "gw",
                             "2.bias": "gb"}
    assert r.params["0.weight"] is model.weight and r.params["2.bias"] is model.gb
    model = Outer()
    r = recognize(model)
    assert r.param_paths["0.weight"] == "block.conv.weight"
    assert r.params["0.weight"] is model.block.conv.weight
    assert r.param_paths["2.weight"] == "norm.weight"
    assert set(r.param_paths.values()) <= set(model.state_dict())


def test_numbers_read_back_exactly():
    model = nn.Sequential(nn.LeakyReLU(0.1 + 0.2), gn(4, 8, eps=1.0 / 3.0),
                          nn.Hardtanh(-1e-7, 123456.0))
    r = recognize(model)
    assert r.ops == ["leaky_relu(slope=0.30000000000000004)",
                     "group_norm(groups=4,eps=0.3333333333333333)",
                     "hardtanh(min=-1e-7,max=123456)"]
    check_semantics(model, (2, 8, 2, 3, 2))


# codegen/format_number.cc's FormatDouble (std::to_chars, exponent tidied), checked against GCC's
# std::to_chars on 20000 values when this was written.
@pytest.mark.parametrize("value,text", [
    (1e-5, "1e-5"), (0.01, "0.01"), (6.0, "6"), (0.2, "0.2"), (100000.0, "1e5"),
    (123456.0, "123456"), (1e-4, "1e-4"), (0.001, "0.001"), (-0.5, "-0.5"), (0.0, "0"),
    (-0.0, "-0"), (1e16, "1e16"), (1e300, "1e300"), (2.5e-300, "2.5e-300"),
    (6.270433393483738e17, "627043339348373760"), (1.0 / 3.0, "0.3333333333333333"),
])
def test_format_number(value, text):
    assert format_number(value) == text
    assert float(text) == value


def test_format_number_round_trips():
    rnd = random.Random(7)
    for _ in range(2000):
        v = rnd.uniform(-1, 1) * 10.0 ** rnd.randint(-40, 40)
        assert float(format_number(v)) == v


def test_spec_checks_the_shape():
    cls, init = seed_models.SEEDS["W2"][:2]
    r = recognize(cls(*init))
    with pytest.raises(Unsupported, match="5-D"):
        r.spec((3, 16, 32, 32))
    with pytest.raises(Unsupported, match="3 input channels"):
        r.spec((8, 4, 16, 32, 32))
    r = recognize(gn(3, 6))
    with pytest.raises(Unsupported, match="group_norm"):
        r.spec((2, 5, 4, 4, 4))
    assert r.spec((2, 6, 4, 4, 4)) == "x:f32[2,6,4,4,4] | group_norm(groups=3,eps=1e-5)"


def test_namespace_package_import():
    import fusejit
    import fusejit._recognize as mod
    assert mod.recognize is recognize
    here = os.path.normpath(os.path.join(_HERE, "..", "..", "python", "fusejit"))
    assert os.path.normpath(os.path.dirname(mod.__file__)) == here


# ------------------------------------------------------------------------------------------------
# Refusals: each names the layer or call, says why, and what the grammar accepts.

class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = conv()
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.conv(x)
        y = self.act(x)
        return x + y


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = conv()

    def forward(self, x, y):
        return self.conv(x) + y


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = conv()
        self.conv.register_forward_hook(lambda m, i, o: o * 2)

    def forward(self, x):
        return self.conv(x)


class ControlFlow(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return torch.relu(x)
        return x


class GnWeightOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = fparam(8)

    def forward(self, x):
        return F.group_norm(x, 2, self.w)


class BufferWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(8, 3, 3, 3, 3))

    def forward(self, x):
        return F.conv3d(x, self.w)


def _parametrized():
    from torch.nn.utils import parametrize

    class Neg(nn.Module):
        def forward(self, w):
            return -w
    m = Fn(lambda s, x: s.conv(x), conv=conv())
    parametrize.register_parametrization(m.conv, "weight", Neg())
    return m


def _weight_normed():
    m = Fn(lambda s, x: s.conv(x), conv=conv())
    torch.nn.utils.weight_norm(m.conv)
    return m


REFUSALS = [
    ("maxpool", lambda: Fn(lambda s, x: s.pool(s.conv(x)), conv=conv(), pool=nn.MaxPool3d(2)),
     ["layer 'pool'", "nn.MaxPool3d", "not one of the ops"]),
    ("batchnorm-batch-stats", lambda: Fn(lambda s, x: s.bn(s.conv(x)), conv=conv(),
                                         bn=nn.BatchNorm3d(8, track_running_stats=False)),
     ["layer 'bn'", "nn.BatchNorm3d", "track_running_stats=False", "batch's statistics"]),
    ("residual-add", Residual, ["operator.add", "straight chain"]),
    ("groups-2", lambda: nn.Sequential(nn.Conv3d(4, 8, 3, groups=2)),
     ["layer '0'", "nn.Conv3d", "groups=2"]),
    ("instance-norm-running-stats", lambda: nn.Sequential(nn.InstanceNorm3d(8,
                                                                 track_running_stats=True)),
     ["layer '0'", "nn.InstanceNorm3d", "a batch norm with running statistics", "comes first"]),
    ("F.gelu-approximate-other", lambda: Fn(lambda s, x: F.gelu(x, approximate="sigmoid")),
     ["F.gelu", "approximate='sigmoid'", "'none' or 'tanh'"]),
    ("celu-alpha-0", lambda: Fn(lambda s, x: s.act(x), act=nn.CELU(0.0)),
     ["layer 'act'", "nn.CELU", "alpha=0"]),
    ("number-over-x", lambda: Fn(lambda s, x: 2 / torch.relu(x)), ["'/' (operator.truediv)"]),
    ("divide-by-zero", lambda: Fn(lambda s, x: torch.relu(x) / 0), ["division by zero"]),
    ("instance-norm-channels-unknown", lambda: Fn(lambda s, x: F.instance_norm(torch.relu(x))),
     ["F.instance_norm", "channels the chain does not know"]),
    ("instance-norm-running-stats", lambda: Fn(lambda s, x: F.instance_norm(
        torch.relu(x), s.rm, s.rv), rm=nn.Parameter(torch.zeros(4)), rv=nn.Parameter(torch.ones(4))),
     ["running statistics"]),
    ("add-alpha", lambda: Fn(lambda s, x: torch.add(x, 2, alpha=3)), ["torch.add"]),
    ("scalar-nan", lambda: Fn(lambda s, x: x * float("nan")), ["finite number"]),
    ("op-after-kept-mean", lambda: Fn(lambda s, x: torch.relu(x.mean([2, 3, 4], keepdim=True))),
     ["torch.relu", "mean must be the last op"]),
    ("two-group-norms", lambda: nn.Sequential(gn(), nn.ReLU(), gn()),
     ["layer '2'", "nn.GroupNorm", "at most one group_norm"]),
    ("op-after-mean", lambda: Fn(lambda s, x: s.act(x.mean(dim=[2, 3, 4])), act=nn.ReLU()),
     ["layer 'act'", "nn.ReLU", "mean must be the last op"]),
    ("mean-23", lambda: Fn(lambda s, x: x.mean(dim=[2, 3])), ["mean", "[2, 3]", "[2,3,4]"]),
    ("mean-all", lambda: Fn(lambda s, x: x.mean()), [".mean()", "over all dimensions"]),
    ("augmented-assignment-on-an-alias", AugmentedAlias,
     ["y += 1.0", "changes a value that is read again after it (an alias)", "y = y + c"]),
    ("augmented-assignment-on-the-input", AugmentedInput, ["x *= 2.0", "the forward's input"]),
    ("forward-without-default", lambda: type("TwoInputs", (nn.Module,), {
        "forward": lambda self, x, y: x * y})(), ["takes 2 inputs"]),
    ("forward-with-tensor-default", lambda: type("TensorDefault", (nn.Module,), {
        "forward": lambda self, x, y=torch.ones(1): x * y})(), ["takes 2 inputs"]),
    ("sum-all", lambda: Fn(lambda s, x: torch.sum(x)), ["torch.sum", "sum over all dimensions"]),
    ("sum-channels", lambda: Fn(lambda s, x: x.sum(1)), ["sum", "[1]", "[2,3,4]"]),
    ("mean-batch", lambda: Fn(lambda s, x: x.mean(dim=0)), ["mean", "[0]"]),
    ("torch.cat", lambda: Fn(lambda s, x: torch.cat([x, x], 1)), ["torch.cat"]),
    ("reshape", lambda: Fn(lambda s, x: s.conv(x).view(2, -1).mean(1), conv=conv()),
     [".view()", "not one of the ops"]),
    ("two-inputs", TwoInputs, ["2 inputs", "x, y"]),
    ("conv-not-first", lambda: nn.Sequential(nn.ReLU(), conv()),
     ["layer '1'", "nn.Conv3d", "first op"]),
    ("padding-mode", lambda: nn.Sequential(nn.Conv3d(3, 8, 3, padding=1, padding_mode="reflect")),
     ["nn.Conv3d", "padding_mode='reflect'"]),
    ("F.dropout-p", lambda: Fn(lambda s, x: F.dropout(torch.relu(x), 0.5)),
     ["F.dropout", "p=0.5", "nn.Dropout"]),
    ("clamp-no-bounds", lambda: Fn(lambda s, x: x.clamp()), [".clamp()", "neither min nor max"]),
    ("channel-param-after-relu",
     lambda: Fn(lambda s, x: torch.relu(s.conv(x)) + s.b, conv=conv(), b=fparam(8, 1, 1, 1)),
     ["'+' (operator.add)", "right after the convolution or the group_norm", "torch.relu"]),
    ("channel-param-first", lambda: Fn(lambda s, x: x * s.p, p=fparam(3, 1, 1, 1)),
     ["'*' (operator.mul)", "comes first"]),
    ("channel-param-along-w", lambda: Fn(lambda s, x: s.conv(x) * s.p, conv=conv(), p=fparam(8)),
     ["parameter 'p' of shape [8]", "per channel"]),
    ("channel-param-wrong-count",
     lambda: Fn(lambda s, x: s.conv(x) * s.p, conv=conv(), p=fparam(4, 1, 1, 1)),
     ["parameter 'p' has 4 values for the 8 channels"]),
    ("channel-param-divides-x",
     lambda: Fn(lambda s, x: s.p / s.conv(x), conv=conv(), p=fparam(8, 1, 1, 1)),
     ["'/' (operator.truediv)", "not one of the ops"]),
    ("channel-plain-tensor", lambda: _with_plain_tensor(),
     ["'scale' is not a registered nn.Parameter but a tensor"]),
    ("hook", Hooked, ["layer 'conv'", "forward hooks"]),
    ("control-flow", ControlFlow, ["torch.fx could not trace"]),
    ("same-even-kernel", lambda: nn.Conv3d(3, 4, 2, padding="same"), ["padding='same'"]),
    ("softplus-beta-zero", lambda: nn.Softplus(beta=0), ["nn.Softplus", "beta=0"]),
    ("hardshrink", lambda: nn.Sequential(nn.Hardshrink()), ["layer '0'", "nn.Hardshrink"]),
    ("gn-weight-only", GnWeightOnly, ["F.group_norm", "a weight but no bias"]),
    ("buffer-weight", BufferWeight, ["conv3d", "'w' is not a registered nn.Parameter but a buffer"]),
    ("returns-tuple", lambda: Fn(lambda s, x: (torch.relu(x),)), ["returns"]),
    ("unused-branch", lambda: Fn(lambda s, x: (torch.sigmoid(x), torch.relu(x))[1]),
     ["straight chain"]),
    ("subclass-of-conv", lambda: type("MyConv", (nn.Conv3d,), {
        "forward": lambda self, x: nn.Conv3d.forward(self, x) ** 2})(3, 4, 3),
     ["'**' (operator.pow)"]),
    ("identity-only", lambda: nn.Sequential(nn.Identity()), ["nn.Sequential", "no op"]),
    ("pool-to-2", lambda: Fn(lambda s, x: F.adaptive_avg_pool3d(x, 2).flatten(1)),
     ["F.adaptive_avg_pool3d", "to 2"]),
    ("dead-code", lambda: Fn(lambda s, x: [torch.relu(x), x][1]),
     ["return value", "torch.relu", "straight chain"]),
    ("eps-zero", lambda: nn.GroupNorm(2, 8, eps=0.0), ["nn.GroupNorm", "eps=0.0"]),
    ("parametrized-weight", _parametrized, ["layer 'conv'", "computed on access"]),
    ("lazy-uninitialized", lambda: nn.Sequential(nn.LazyConv3d(8, 3)),
     ["layer '0'", "not initialized"]),
    ("weight-norm", _weight_normed, ["layer 'conv'", "weight_norm"]),
    ("gn-channel-mismatch", lambda: nn.Sequential(conv(cout=8), nn.GroupNorm(2, 6)),
     ["layer '1'", "group_norm"]),
]


@pytest.mark.parametrize("factory,needles", [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refused(factory, needles):
    with pytest.raises(Unsupported) as info:
        recognize(factory())
    msg = str(info.value)
    assert msg.startswith("fusejit cannot fuse"), msg
    assert GRAMMAR in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_refusal_message_reads_well():
    with pytest.raises(Unsupported) as info:
        recognize(Fn(lambda s, x: s.pool(s.conv(x)), conv=conv(), pool=nn.MaxPool3d(2)))
    msg = str(info.value)
    assert msg.startswith("fusejit cannot fuse layer 'pool' (nn.MaxPool3d)")
    assert "[conv3d|conv_transpose3d] -> elementwise ops (relu, leaky_relu, sigmoid, tanh, " \
           "swish/silu, hardswish, gelu, clamp, hardtanh/relu6, mish, softplus, elu, selu, " \
           "hardsigmoid, gelu(approximate='tanh'), logsigmoid, softsign, tanhshrink, celu, " \
           "* / + - by a constant, c - x, -x) -> at most one group_norm" in msg
    assert info.value.layer == "pool"


def test_not_a_module():
    with pytest.raises(Unsupported):
        recognize(lambda x: x)


# ------------------------------------------------------------------------------------------------
# Random chains: every op of the grammar in a random spelling, checked against the model in float64.

def _t3(v):
    return str(v[0]) if v[0] == v[1] == v[2] else "[%d,%d,%d]" % tuple(v)


def _elementwise(rng, i):
    """(children, apply(s, x), op text) of one random elementwise op in one random spelling."""
    a = round(rng.uniform(-2, -0.1), 3)
    b = round(rng.uniform(0.1, 2), 3)
    slope = round(rng.uniform(0.01, 0.5), 4)
    n = "act%d" % i
    sig = "sig%d" % i
    forms = [
        ({n: nn.ReLU()}, lambda s, x: getattr(s, n)(x), "relu"),
        ({n: nn.ReLU(inplace=True)}, lambda s, x: getattr(s, n)(x), "relu"),
        ({}, lambda s, x: torch.relu(x), "relu"),
        ({}, lambda s, x: F.relu(x, inplace=True), "relu"),
        ({}, lambda s, x: x.relu_(), "relu"),
        ({}, lambda s, x: x.clamp(min=0), "clamp(min=0)"),
        ({}, lambda s, x: torch.clamp(x, min=a), "clamp(min=%s)" % a),
        ({}, lambda s, x: x.clamp(max=b), "clamp(max=%s)" % b),
        ({n: nn.LeakyReLU(slope)}, lambda s, x: getattr(s, n)(x), "leaky_relu(slope=%s)" % slope),
        ({}, lambda s, x: F.leaky_relu(x, slope), "leaky_relu(slope=%s)" % slope),
        ({}, lambda s, x: F.leaky_relu(x, negative_slope=slope, inplace=True),
         "leaky_relu(slope=%s)" % slope),
        ({n: nn.Sigmoid()}, lambda s, x: getattr(s, n)(x), "sigmoid"),
        ({}, lambda s, x: torch.sigmoid(x), "sigmoid"),
        ({}, lambda s, x: x.sigmoid(), "sigmoid"),
        ({}, lambda s, x: torch.sigmoid_(x), "sigmoid"),
        ({n: nn.Tanh()}, lambda s, x: getattr(s, n)(x), "tanh"),
        ({}, lambda s, x: torch.tanh(x), "tanh"),
        ({}, lambda s, x: x.tanh_(), "tanh"),
        ({n: nn.SiLU()}, lambda s, x: getattr(s, n)(x), "swish"),
        ({}, lambda s, x: F.silu(x), "swish"),
        ({}, lambda s, x: torch.sigmoid(x) * x, "swish"),
        ({}, lambda s, x: x * x.sigmoid(), "swish"),
        ({sig: nn.Sigmoid()}, lambda s, x: x * getattr(s, sig)(x), "swish"),
        ({n: nn.Hardswish()}, lambda s, x: getattr(s, n)(x), "hardswish"),
        ({}, lambda s, x: F.hardswish(x), "hardswish"),
        ({}, lambda s, x: x * F.relu6(x + 3) / 6, "hardswish"),
        ({}, lambda s, x: x * F.hardsigmoid(x), "hardswish"),
        ({n: nn.GELU()}, lambda s, x: getattr(s, n)(x), "gelu"),
        ({}, lambda s, x: F.gelu(x), "gelu"),
        ({}, lambda s, x: torch.clamp(x, a, b), "clamp(min=%s,max=%s)" % (a, b)),
        ({}, lambda s, x: x.clamp(min=a, max=b), "clamp(min=%s,max=%s)" % (a, b)),
        ({}, lambda s, x: x.clamp_(a, b), "clamp(min=%s,max=%s)" % (a, b)),
        ({}, lambda s, x: F.hardtanh(x, a, b), "hardtanh(min=%s,max=%s)" % (a, b)),
        ({n: nn.Hardtanh(a, b)}, lambda s, x: getattr(s, n)(x), "hardtanh(min=%s,max=%s)" % (a, b)),
        ({n: nn.ReLU6()}, lambda s, x: getattr(s, n)(x), "hardtanh(min=0,max=6)"),
        ({}, lambda s, x: F.relu6(x), "hardtanh(min=0,max=6)"),
        ({}, lambda s, x: x * a, "mul(by=%s)" % format_number(a)),
        ({}, lambda s, x: b * x, "mul(by=%s)" % format_number(b)),
        ({}, lambda s, x: x / b, "mul(by=%s)" % format_number(1.0 / b)),
        ({}, lambda s, x: x + a, "add(by=%s)" % format_number(a)),
        ({}, lambda s, x: x.sub(b), "add(by=%s)" % format_number(-b)),
        ({n: nn.Mish()}, lambda s, x: getattr(s, n)(x), "mish"),
        ({}, lambda s, x: F.mish(x), "mish"),
        ({n: nn.Softplus()}, lambda s, x: getattr(s, n)(x), "softplus(beta=1,threshold=20)"),
        ({n: nn.Softplus(b, 1.0)}, lambda s, x: getattr(s, n)(x),
         "softplus(beta=%s,threshold=1)" % format_number(b)),
        ({}, lambda s, x: F.softplus(x, beta=b, threshold=2 * b),
         "softplus(beta=%s,threshold=%s)" % (format_number(b), format_number(2 * b))),
        ({n: nn.ELU()}, lambda s, x: getattr(s, n)(x), "elu(alpha=1)"),
        # (not inplace=True: PyTorch's own backward refuses it after an op that saves its output)
        ({n: nn.ELU(b)}, lambda s, x: getattr(s, n)(x), "elu(alpha=%s)" % b),
        ({}, lambda s, x: F.elu(x, b), "elu(alpha=%s)" % b),
        ({n: nn.SELU()}, lambda s, x: getattr(s, n)(x), "selu"),
        ({}, lambda s, x: torch.selu(x), "selu"),
        ({n: nn.Hardsigmoid()}, lambda s, x: getattr(s, n)(x), "hardsigmoid"),
        ({}, lambda s, x: F.hardsigmoid(x), "hardsigmoid"),
        ({n: nn.GELU(approximate="tanh")}, lambda s, x: getattr(s, n)(x), "gelu_tanh"),
        ({}, lambda s, x: F.gelu(x, approximate="tanh"), "gelu_tanh"),
        ({n: nn.CELU(b)}, lambda s, x: getattr(s, n)(x), "celu(alpha=%s)" % b),
        ({}, lambda s, x: torch.celu(x, b), "celu(alpha=%s)" % b),
        ({n: nn.LogSigmoid()}, lambda s, x: getattr(s, n)(x), "logsigmoid"),
        ({}, lambda s, x: F.logsigmoid(x), "logsigmoid"),
        ({n: nn.Softsign()}, lambda s, x: getattr(s, n)(x), "softsign"),
        ({}, lambda s, x: F.tanhshrink(x), "tanhshrink"),
        ({}, lambda s, x: -x, "mul(by=-1)"),
    ]
    return forms[rng.randrange(len(forms))]


def _channel_ops(rng, module, name, c):
    """1-2 random per-channel parameter ops (x * P, P - x, x / P, ...) as steps on `module`,
    with their Parameters registered as `name`0, `name`1; they fold into the op before them.
    Returns (steps, whether one adds or subtracts: a convolution then gets a bias)."""
    steps, shifts = [], False
    for j in range(rng.randint(1, 2)):
        shape = rng.choice([(c, 1, 1, 1), (1, c, 1, 1, 1), (), (1,)])
        pname = "%s%d" % (name, j)
        setattr(module, pname, nn.Parameter(torch.rand(shape) + 0.5))
        form = rng.randrange(6)
        shifts = shifts or form >= 3
        steps.append([
            lambda s, x, n=pname: x * getattr(s, n),
            lambda s, x, n=pname: torch.mul(getattr(s, n), x),
            lambda s, x, n=pname: x / getattr(s, n),
            lambda s, x, n=pname: x + getattr(s, n),
            lambda s, x, n=pname: getattr(s, n) - x,
            lambda s, x, n=pname: x.sub(getattr(s, n)),
        ][form])
    return steps, shifts


class RandomChain(nn.Module):
    def __init__(self, seed):
        super().__init__()
        rng = random.Random(seed)
        self.steps, self.expected = [], []
        cin = rng.choice([2, 3, 4])
        c = cin
        self.shape = (2, cin, rng.randint(5, 7), rng.randint(5, 7), rng.randint(5, 6))
        kind = rng.choice(["none", "conv3d", "conv_transpose3d"])
        if kind != "none":
            c = rng.choice([4, 6, 8])
            k = [rng.randint(1, 3) for _ in range(3)]
            stride = [rng.randint(1, 2) for _ in range(3)]
            padding = [rng.randint(0, 1) for _ in range(3)]
            dilation = [rng.randint(1, 2) for _ in range(3)]
            bias = rng.random() < 0.7
            text = "%s(out=%d,k=%s" % (kind, c, _t3(k))
            text += ",stride=" + _t3(stride) if stride != [1, 1, 1] else ""
            text += ",padding=" + _t3(padding) if padding != [0, 0, 0] else ""
            if kind == "conv3d":
                module = nn.Conv3d(cin, c, k, stride=stride, padding=padding, dilation=dilation,
                                   bias=bias)
            else:
                op = [rng.randrange(max(stride[a], dilation[a])) for a in range(3)]
                text += ",output_padding=" + _t3(op) if op != [0, 0, 0] else ""
                module = nn.ConvTranspose3d(cin, c, k, stride=stride, padding=padding,
                                            output_padding=op, dilation=dilation, bias=bias)
            text += ",dilation=" + _t3(dilation) if dilation != [1, 1, 1] else ""
            text += ",bias=false" if not bias else ""
            self.expected.append(text + ")")
            if rng.random() < 0.6:
                self.conv = module
                self.steps.append(lambda s, x: s.conv(x))
            else:  # the functional form with the module's parameters
                self.cw = module.weight
                self.cb = module.bias
                f = F.conv3d if kind == "conv3d" else F.conv_transpose3d
                kw = dict(stride=module.stride, padding=module.padding, dilation=module.dilation)
                if kind == "conv_transpose3d":
                    kw["output_padding"] = module.output_padding
                self.steps.append(lambda s, x: f(x, s.cw, s.cb, **kw))
            if rng.random() < 0.3:  # folded into the convolution's weight and bias
                steps, shifts = _channel_ops(rng, self, "conv_scale", c)
                self.steps += steps
                if shifts:
                    self.expected[-1] = self.expected[-1].replace(",bias=false", "")
        i = 0
        for phase in ("before", "norm", "after"):
            if phase == "norm":
                if rng.random() < 0.7:
                    groups = rng.choice([g for g in (1, 2, 3, 4) if c % g == 0])
                    eps = rng.choice([1e-5, 1e-3, 0.01])
                    self.expected.append("group_norm(groups=%d,eps=%s)" % (groups, format_number(eps)))
                    form = rng.random()
                    if form < 0.1 and kind == "none":  # (PyTorch's instance norm in training
                        # mode refuses 1x1x1 volumes, which a convolution can give)
                        self.expected[-1] = "group_norm(groups=%d,eps=%s)" % (c, format_number(eps))
                        self.gn = nn.InstanceNorm3d(c, eps=eps, affine=rng.random() < 0.5)
                        self.steps.append(lambda s, x: s.gn(x))
                    elif form < 0.45:
                        self.gn = nn.GroupNorm(groups, c, eps=eps)
                        self.steps.append(lambda s, x: s.gn(x))
                    elif form < 0.6:
                        self.gn = nn.GroupNorm(groups, c, eps=eps, affine=False)
                        self.steps.append(lambda s, x: s.gn(x))
                    elif form < 0.7:
                        self.steps.append(lambda s, x: F.group_norm(x, groups, eps=eps))
                    else:
                        self.gn_w = nn.Parameter(torch.ones(c))
                        self.gn_b = nn.Parameter(torch.zeros(c))
                        self.steps.append(lambda s, x: F.group_norm(x, groups, s.gn_w, s.gn_b, eps))
                    if rng.random() < 0.25:  # folded into the group_norm's weight and bias
                        self.steps += _channel_ops(rng, self, "norm_scale", c)[0]
                continue
            for _ in range(rng.randint(0, 2)):
                children, apply, text = _elementwise(rng, i)
                i += 1
                for name, m in children.items():
                    setattr(self, name, m)
                self.steps.append(apply)
                self.expected.append(text)
        if not self.expected or rng.random() < 0.4:
            forms = [
                (lambda s, x: torch.mean(x, dim=[2, 3, 4]), [2, 3, 4]),
                (lambda s, x: x.mean((-3, -2, -1)), [2, 3, 4]),
                (lambda s, x: x.mean(-1).mean(-1).mean(-1), [2, 3, 4]),
                (lambda s, x: x.mean(dim=[1, 2, 3, 4]), [1, 2, 3, 4]),
                (lambda s, x: torch.mean(x, (4, 3, 2, 1)), [1, 2, 3, 4]),
                (lambda s, x: x.mean([2, 3, 4], keepdim=True), [2, 3, 4]),
                (lambda s, x: x.mean(dim=(1, 2, 3, 4), keepdim=True), [1, 2, 3, 4]),
                (lambda s, x: F.adaptive_avg_pool3d(x, 1), [2, 3, 4]),
            ]
            apply, dims = forms[rng.randrange(len(forms))]
            last = self.expected[-1] if self.expected else ""
            if last.startswith("group_norm") and (
                    dims == [1, 2, 3, 4] or last.startswith("group_norm(groups=%d," % c)):
                # (a mean over every axis right after a group_norm, or over the space of one
                # with a group a channel, depends on nothing but its weight and bias -- without
                # them it is exactly 0: a degenerate check)
                self.steps.append(lambda s, x: torch.tanh(x))
                self.expected.append("tanh")
            self.steps.append(apply)
            self.expected.append("mean(dims=[%s])" % ",".join(str(d) for d in dims))

    def forward(self, x):
        for step in self.steps:
            x = step(self, x)
        return x


def eager_backward_refusal(model, shape):
    """PyTorch's own error for a backward through `model` (float64 copy on the CPU), or None:
    a random chain may put an in-place op after one whose backward reads its output (sigmoid
    then x.relu_()), which PyTorch's autograd refuses -- there is no reference gradient then."""
    ref = copy.deepcopy(model).double().cpu()
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    try:
        ref(x).sum().backward()
    except RuntimeError as e:
        if "inplace operation" in str(e):
            return str(e).split(":")[0]
        raise
    return None


@pytest.mark.parametrize("seed", range(60))
def test_random_chain(seed):
    model = RandomChain(seed)
    r = check_semantics(model, model.shape, seed)
    assert r.ops == model.expected


def test_recognize_leaves_the_model_alone():
    cls, init = seed_models.SEEDS["W1"][:2]
    model = cls(*init).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r1 = recognize(model)
    r2 = recognize(model)
    assert not model.training
    assert r1.ops == r2.ops and r1.param_paths == r2.param_paths
    assert all(r1.params[k] is r2.params[k] for k in r1.params)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unsupported_names_the_layer():
    with pytest.raises(Unsupported) as info:
        recognize(nn.Sequential(conv(), nn.MaxPool3d(2)))
    assert info.value.layer == "1"
    assert "not one of the ops" in info.value.reason
    with pytest.raises(Unsupported) as info:
        recognize(Fn(lambda s, x: s.inner(x), inner=nn.Sequential(nn.ReLU(), nn.GroupNorm(2, 8),
                                                                  nn.GroupNorm(2, 8))))
    assert info.value.layer == "inner.2"
    assert "layer 'inner.2' (nn.GroupNorm)" in str(info.value)


def test_more_hardswish_spellings():
    forms = [
        lambda s, x: x * (x + 3).clamp(0, 6) / 6,
        lambda s, x: x * F.relu6(x + 3.0) * (1 / 6),
        lambda s, x: x * F.hardtanh(x + 3, min_val=0.0, max_val=6.0) / 6.0,
        lambda s, x: torch.div(x * torch.clip(x + 3, 0, 6), 6),
    ]
    for f in forms:
        r = check_semantics(Fn(f), (2, 4, 3, 3, 3))
        assert r.ops == ["hardswish"]
    # Not hardswish: other constants.
    for f in (lambda s, x: x * F.relu6(x + 2) / 6, lambda s, x: x * F.relu6(x + 3) / 5):
        with pytest.raises(Unsupported):
            recognize(Fn(f))


# ------------------------------------------------------------------------------------------------
# Partial recognition: the chain is the fusable start of forward, the rest runs as the model's code.

class _ConvPoolHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(8 * 2 * 2 * 2, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        return self.fc(x.view(x.size(0), -1))


class _GnMeanHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(3, 6, 2, stride=2)
        self.gn = nn.GroupNorm(3, 6)
        self.head = nn.Sequential(nn.Linear(6, 4), nn.Sigmoid())
        self.bias = nn.Parameter(torch.randn(4))

    def forward(self, x):
        x = F.silu(self.gn(self.conv(x))).mean(dim=[2, 3, 4])
        return self.head(x * 2) + self.bias


class _TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(3, 6, 3, padding=1)
        self.b = nn.Conv3d(6, 4, 1)

    def forward(self, x):
        return torch.tanh(self.b(torch.relu(self.a(x))))


class _SelfResidual(nn.Module):
    """The chain's value used twice after it (y + relu(y)) and a tuple returned."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        y = self.gn(self.conv(x))
        return y + torch.relu(y), y.amax(dim=1)


class _ChannelMean(nn.Module):
    """Means fusejit has none of (over the channels alone, over [3,4] then [2]... kept apart from
    a mean over [2,3,4] it has): the chain stops before them, they run in the rest."""

    def __init__(self, dims):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3)
        self.dims = dims

    def forward(self, x):
        y = torch.relu(self.conv(x))
        for d in self.dims:
            y = y.mean(dim=d, keepdim=True) if d == 1 else y.mean(dim=d)
        return torch.tanh(y)


# name -> (model, input shape, the chain's ops, a needle of where the chain stops)
PARTIAL = {
    "channel-mean": (lambda: _ChannelMean([1]), (2, 3, 5, 5, 5), ["conv3d(out=4,k=3)", "relu"],
                     "mean over dims [1]"),
    "mean-over-3-4": (lambda: _ChannelMean([[3, 4]]), (2, 3, 5, 5, 5),
                      ["conv3d(out=4,k=3)", "relu"], "mean over dims [3, 4]"),
    "pool-linear-head": (_ConvPoolHead, (2, 3, 4, 4, 4), ["conv3d(out=8,k=3,padding=1)", "relu"],
                         "nn.MaxPool3d"),
    "mean-then-linear": (_GnMeanHead, (2, 3, 3, 3, 3),
                         ["conv_transpose3d(out=6,k=2,stride=2)", "group_norm(groups=3,eps=1e-5)",
                          "swish", "mean(dims=[2,3,4])"], "mean must be the last op"),
    "second-conv": (_TwoConvs, (2, 3, 4, 5, 4), ["conv3d(out=6,k=3,padding=1)", "relu"],
                    "a convolution must be the first op"),
    "value-used-twice": (_SelfResidual, (2, 3, 5, 5, 5),
                         ["conv3d(out=4,k=3)", "group_norm(groups=2,eps=1e-5)"], "also feeds"),
}


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_partial_recognition_runs_the_rest_as_the_models_code(case):
    """recognize(partial=True): the chain is forward's fusable start; Recognized.rest(model, y)
    on the chain's float64 result gives the model's own float64 forward; partial=False refuses."""
    make, shape, ops, needle = PARTIAL[case]
    model = randomize(make(), 3).double()
    with pytest.raises(Unsupported):
        recognize(model)
    r = recognize(model, partial=True)
    assert r.ops == ops and r.rest is not None and needle in r.rest_from, (r.ops, r.rest_from)
    x = torch.randn(*shape, dtype=torch.float64)
    with torch.no_grad():
        got, want = r.rest(model, evaluate(r, x), x), model(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-10, atol=1e-12)


class _InputResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x


class _MadeTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * torch.tensor(2.0)


def test_a_rest_reading_a_tensor_made_in_forward_keeps_it():
    """torch.tensor(2.0) in forward is a constant of the traced graph (which torch.fx sets on the
    model: taken off again, the model is left as it was); the rest reads it as traced."""
    torch.manual_seed(0)
    model = _MadeTensor()
    keys = set(model.__dict__)
    r = recognize(model, partial=True)
    assert set(model.__dict__) == keys
    assert r.ops == ["conv3d(out=3,k=3,padding=1)", "relu"] and "tensor" in r.rest_from, r.rest_from
    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
    model.double()
    with torch.no_grad():
        assert torch.allclose(r.rest(model, evaluate(r, x), x), model(x), rtol=1e-10, atol=1e-12)


class _Residual(nn.Module):
    """A residual block: the rest reads the input (x + ...) and runs a shortcut module on it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.shortcut = nn.Conv3d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x))) + self.shortcut(x) + x


class _InputMutatedFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 3, 3, padding=1)

    def forward(self, x):
        x.relu_()  # changes the caller's tensor, before the rest reads it
        return self.conv(x) + x


def test_partial_recognition_lets_the_rest_read_the_input():
    """A residual (the input read again after the chain, also through a module) is the rest's:
    rest(model, y, x) on the chain's float64 result and the input gives the model's forward."""
    model = randomize(_Residual(), 4).double()
    r = recognize(model, partial=True)
    assert r.ops == ["conv3d(out=4,k=3,padding=1)", "group_norm(groups=2,eps=1e-5)", "relu"]
    x = torch.randn(2, 4, 5, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(r.rest(model, evaluate(r, x), x), model(x), rtol=1e-10, atol=1e-12)
    # an input changed in place by the chain's first op: the rest reads the changed value (the
    # chain's), as eager's does
    model = randomize(_InputMutatedFirst(), 5).double()
    r = recognize(model, partial=True)
    assert r.ops == ["relu"], r.ops
    x = torch.randn(2, 3, 4, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        got = r.rest(model, evaluate(r, x), x)
        assert torch.allclose(got, model(x.clone()), rtol=1e-10, atol=1e-12)


def test_a_refusal_in_code_without_source_names_the_line_alone():
    """A model whose forward has no source text (made with exec, `python -c`): the message
    names its file and line, not a frame of torch.fx's or fusejit's own."""
    scope = {"nn": nn, "torch": torch}
    exec(compile("class M(nn.Module):\n"
                 "    def __init__(s):\n"
                 "        super().__init__(); s.conv = nn.Conv3d(3, 4, 3); s.pool = nn.MaxPool3d(2)\n"
                 "    def forward(s, x):\n"
                 "        return s.pool(torch.relu(s.conv(x)))\n", "<made>", "exec"), scope)
    why = recognize(scope["M"](), partial=True).rest_from
    assert "at <made>:5: it is not one of the ops" in why, why
