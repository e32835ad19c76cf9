"""fusejit.torch without a GPU: the drop-in's classes and modules, parameter sharing, fallbacks and
their warnings, strict errors, the eager evaluation used for shapes and gradients, the backward's
binding and its fallback decisions (with the GPU parts mocked), the policy store's integrity, and
the installed package. Needs libfusejit.so (FUSEJIT_LIBRARY or build/)."""
import copy
import inspect
import os
import pickle
import subprocess
import sys
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit
import fusejit.torch as fj
import kb_style_models
import random_nets
from fusejit import _chain, _lib, _policy
from seed_models import SEEDS

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def randomized(model, seed=0):
    """Random weights everywhere (GroupNorm weight/bias too: never 1 and 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return model


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_fused_class_is_a_drop_in(wid):
    cls, init, _, _, small = SEEDS[wid]
    ModelNew = fj.fused(cls)
    assert ModelNew.__name__ == cls.__name__
    assert issubclass(ModelNew, cls)
    assert inspect.signature(ModelNew) == inspect.signature(cls)
    torch.manual_seed(1)
    ref = cls(*init)
    torch.manual_seed(1)
    new = ModelNew(*init)
    assert fj.is_fused(new)
    assert list(new.state_dict()) == list(ref.state_dict())
    for (a, pa), (b, pb) in zip(ref.named_parameters(), new.named_parameters()):
        assert a == b and torch.equal(pa, pb)  # same construction, same initial values
    # load_state_dict from the original works both ways
    new.load_state_dict(randomized(ref).state_dict())
    ref.load_state_dict(new.state_dict())


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_fuse_shares_parameters_and_leaves_the_model_alone(wid):
    cls, init, _, _, small = SEEDS[wid]
    model = randomized(cls(*init))
    fast = fj.fuse(model)
    assert type(model) is cls and "_fusejit" not in model.__dict__
    assert isinstance(fast, cls) and fj.is_fused(fast)
    ours = dict(fast.named_parameters())
    for name, p in model.named_parameters():
        assert ours[name] is p
    assert list(fast.state_dict()) == list(model.state_dict())
    # An optimizer step through the fused module moves the original's parameters.
    opt = torch.optim.SGD(fast.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(*small)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fj.FusejitWarning)
        fast(x).square().sum().backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    fast.eval()
    assert not fast.training and not fast.group_norm.training and not model.group_norm.training
    fast.train()
    assert model.group_norm.training
    fast.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_cpu_input_runs_the_original_and_warns_once():
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init))
    fast = fj.fuse(model)
    x = torch.randn(*small)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1 = fast(x)
        y2 = fast(x)
    ours = [w for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "not a CUDA device" in str(ours[0].message)
    assert torch.equal(y1, model(x)) and torch.equal(y2, y1)


def test_strict_raises_for_calls_it_would_fall_back_on():
    cls, init, _, _, small = SEEDS["W2"]
    fast = fj.fuse(randomized(cls(*init)), strict=True)
    with pytest.raises(fj.Unsupported, match="not a CUDA device"):
        fast(torch.randn(*small))


class WithMaxPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        return self.pool(self.conv(x))


def test_strict_refuses_a_module_outside_the_grammar_at_once():
    with pytest.raises(fj.Unsupported) as e:
        fj.fuse(WithMaxPool(), strict=True)
    assert "pool" in str(e.value) and "MaxPool3d" in str(e.value)
    with pytest.raises(fj.Unsupported):
        fj.fused(WithMaxPool, strict=True)()


class PoolHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(2, 4)

    def forward(self, x):
        return self.fc(self.pool(x))


def test_unrecognized_module_runs_the_original_with_one_warning():
    model = PoolHead()  # nothing to fuse anywhere
    fast = fj.fuse(model)
    assert not fj.is_fused(fast)
    assert "pool" in fj.explain(fast, torch.randn(1, 3, 5, 5, 5))
    x = torch.randn(1, 3, 4, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(fast(x), model(x))
        fast(x)
    assert len([w for w in caught if issubclass(w.category, fj.FusejitWarning)]) == 1


@pytest.mark.parametrize("made_by", ["fuse", "fused"])
def test_fused_modules_copy_and_pickle(made_by):
    """copy.deepcopy, copy.copy and pickle (torch.save(model)) of a fused module give a fused module
    of the same class, strict and policy, with fusejit state of its own: a deep copy's parameters
    are its own (changing them leaves the original alone), a shallow copy shares them, and
    unpickled instances of fused(Model) are instances of that same class."""
    cls, init, _, _, small = SEEDS["W4"]
    torch.manual_seed(2)
    if made_by == "fuse":
        fast = fj.fuse(randomized(cls(*init)), policy="fused")
    else:
        fast = randomized(fj.fused(cls, policy="fused")(*init))
    x = torch.randn(*small)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fj.FusejitWarning)  # CPU input: the original runs
        want = fast(x)
        deep = copy.deepcopy(fast)
        shallow = copy.copy(fast)
        loaded = pickle.loads(pickle.dumps(fast))
        for other in (deep, shallow, loaded):
            assert type(other) is type(fast) and fj.is_fused(other)
            st, st0 = other.__dict__["_fusejit"], fast.__dict__["_fusejit"]
            assert st is not st0 and (st.strict, st.policy, st.tail) == (st0.strict, st0.policy,
                                                                          st0.tail)
            assert torch.equal(other(x), want)
        assert all(a is b for a, b in zip(shallow.parameters(), fast.parameters()))
        with torch.no_grad():
            for p in deep.parameters():
                p.mul_(2)
        assert torch.equal(fast(x), want)
    assert all(a is not b for a, b in zip(loaded.parameters(), fast.parameters()))


def test_bad_arguments_are_named():
    cls, init, _, _, _ = SEEDS["W3"]
    with pytest.raises(ValueError, match="auto, fused, eager"):
        fj.fuse(cls(*init), policy="fastest")
    with pytest.raises(TypeError, match="nn.Module"):
        fj.fuse(lambda x: x)
    with pytest.raises(TypeError, match="nn.Module subclass"):
        fj.fused(int)


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_eager_evaluation_of_the_canonical_spec_is_the_model(wid):
    """What backward differentiates and torch.compile's fake tensors see is the model's forward."""
    cls, init, _, _, small = SEEDS[wid]
    model = randomized(cls(*init)).double()
    fast = fj.fuse(model)
    st = fast.__dict__["_fusejit"]
    x = torch.randn(*small, dtype=torch.float64)
    spec = fusejit.canonical_spec(fj._spec(st, x.float()))
    params = [fj._get(fast, path) for _, path in st.param_paths]
    assert len(params) == _chain.param_count(_chain.ops_of(spec))
    y = _chain.eager(_chain.ops_of(spec), x, params)
    assert torch.allclose(y, model(x), rtol=1e-12, atol=1e-12)
    assert fj._fake(spec, x, params).shape == y.shape


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_backward_recompute_gives_the_models_gradients(wid):
    cls, init, _, _, small = SEEDS[wid]
    model = randomized(cls(*init), seed=3).double()
    fast = fj.fuse(model)
    st = fast.__dict__["_fusejit"]
    x = torch.randn(*small, dtype=torch.float64, requires_grad=True)
    y = model(x)
    g = torch.randn_like(y)
    y.backward(g)
    params = [fj._get(fast, path) for _, path in st.param_paths]
    spec = fusejit.canonical_spec(fj._spec(st, x.detach().float()))
    gx, gps = fj._eager_backward(spec, x.detach(), [p.detach() for p in params], g,
                                 [True] * (1 + len(params)))
    assert torch.allclose(gx, x.grad, rtol=1e-10, atol=1e-12)
    for p, gp in zip(params, gps):
        assert torch.allclose(gp, p.grad, rtol=1e-10, atol=1e-12)


def test_spec_parser_reads_every_canonical_form():
    spec = fusejit.canonical_spec(
        "x:f32[1,2,9,10,11] | conv_transpose3d(out=3,k=[1,3,5],stride=[1,2,3],padding=[0,1,2],"
        "output_padding=[0,1,2],bias=false) | clamp(min=-0.5,max=2) | leaky_relu(slope=0.2) | "
        "gelu | group_norm(groups=3,eps=1e-3) | mean(dims=[1,2,3,4])")
    ops = _chain.ops_of(spec)
    assert [n for n, _ in ops] == ["conv_transpose3d", "clamp", "leaky_relu", "gelu", "group_norm",
                                   "mean"]
    conv = ops[0][1]
    assert conv["k"] == (1, 3, 5) and conv["stride"] == (1, 2, 3) and conv["bias"] is False
    assert conv["output_padding"] == (0, 1, 2) and conv["dilation"] == (1, 1, 1)
    assert ops[1][1] == {"min": -0.5, "max": 2}
    assert ops[2][1]["slope"] == 0.2 and ops[4][1] == {"groups": 3, "eps": 1e-3}
    assert ops[5][1]["dims"] == [1, 2, 3, 4]


def test_library_errors_say_what_is_wrong():
    with pytest.raises(fusejit.FusejitError, match="strde"):
        fusejit.canonical_spec("x:f32[1,3,8,8,8] | conv3d(out=4,k=3,strde=2)")
    chain = fusejit.Chain("x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | relu", arch="sm_80")
    assert [t.name for t in chain.signature] == ["x", "0.weight", "0.bias", "y"]
    assert chain.tensor("y").shape == (2, 4, 6, 6, 6)
    with pytest.raises(fusejit.FusejitError, match="unknown tensor 'w'"):
        chain.run({"x": 256, "w": 256, "0.weight": 256, "0.bias": 256, "y": 256})
    chain.release()
    chain.release()  # a second release of the Python object is a no-op


# ---- the backward: binding, layout, fallbacks (GPU parts mocked) -----------------------------

BWD_SPEC = "x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | swish | group_norm(groups=2)"


def test_backward_chain_binding_for_an_explicit_arch():
    assert _lib.has_backward() and _lib.abi_minor() >= _lib.ABI_MINOR
    chain = fusejit.Chain(BWD_SPEC, arch="sm_90", backward=True)
    assert chain.backward
    names = [t.name for t in chain.signature]
    params = ["0.weight", "0.bias", "2.weight", "2.bias"]
    expected = ["x"] + params + ["grad_y", "grad_x"] + ["grad_" + p for p in params]
    assert names == expected + (["workspace"] if chain.workspace_bytes else [])
    roles = {t.name: t.role_name for t in chain.signature}
    assert roles["x"] == "input" and roles["0.weight"] == "param"
    assert roles["grad_y"] == "grad_output" and roles["grad_x"] == "grad_input"
    assert roles["grad_2.bias"] == "grad_param"
    assert chain.tensor("grad_y").shape == (2, 4, 6, 6, 6)
    assert chain.tensor("grad_x").shape == (2, 3, 8, 8, 8)
    assert chain.tensor("grad_0.weight").shape == (4, 3, 3, 3, 3)
    if chain.workspace_bytes:
        assert chain.tensor("workspace").alignment == 256
    fj._check_backward_layout(chain, fusejit.canonical_spec(BWD_SPEC))  # the layout it binds
    forward = fusejit.Chain(BWD_SPEC, arch="sm_90")
    assert not forward.backward
    with pytest.raises(fusejit.FusejitError, match="not x, the parameters, grad_y"):
        fj._check_backward_layout(forward, fusejit.canonical_spec(BWD_SPEC))
    pointers = [256] * len(names)
    pointers[names.index("grad_x")] = 0
    with pytest.raises(fusejit.FusejitError, match="grad_x .grad_input. f32.2,3,8,8,8. is null"):
        chain.run_pointers(pointers)  # checked before any driver is needed


def test_backward_refusals_are_unimplemented():
    with pytest.raises(fusejit.FusejitError, match="f64") as e:
        fusejit.Chain("x:f64[1,3,8,8,8] | relu", arch="sm_90", backward=True)
    assert e.value.code == 12
    # conv_transpose3d with output_padding >= stride has one (its data gradient cropped).
    fusejit.Chain("x:f32[1,4,5,5,5] | conv_transpose3d(out=4,k=3,output_padding=1,"
                  "dilation=2) | relu", arch="sm_90", backward=True).release()
    with pytest.raises(fusejit.FusejitError, match="strategy") as e:
        fusejit.Chain("x:f32[1,3,8,8,8] | relu", arch="sm_90", strategy="elementwise",
                      backward=True)
    assert e.value.code == 3


def _refuse_backward(monkeypatch, why="no backward plan for dtype f64: only f32 chains have one"):
    def refuse(spec, device):
        raise _lib.FusejitError(12, why)
    monkeypatch.setattr(fj, "_compiled_backward", refuse)
    monkeypatch.setattr(fj, "_backward_warned", set())


@pytest.mark.parametrize("needs_x", [True, False])
def test_backward_without_a_fused_one_is_eagers_with_one_warning(monkeypatch, needs_x):
    _refuse_backward(monkeypatch)
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init), seed=4).double()
    fast = fj.fuse(model)
    st = fast.__dict__["_fusejit"]
    params = [fj._get(fast, path) for _, path in st.param_paths]
    x = torch.randn(*small, dtype=torch.float64, requires_grad=needs_x)
    y = model(x)
    g = torch.randn_like(y)
    y.backward(g)
    spec = fusejit.canonical_spec(fj._spec(st, x.detach().float()))
    before = dict(fj._stats)
    needs = [needs_x] + [True] * len(params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            gx, gps = fj._backward(spec, x.detach(), [p.detach() for p in params], g, needs)
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ours) == 1, ours
    assert "no fused backward for " + spec in ours[0] and "only f32 chains" in ours[0]
    assert fj._stats["eager_backward"] == before["eager_backward"] + 2
    assert fj._stats["fused_backward"] == before["fused_backward"]
    assert (gx is not None) == needs_x
    if needs_x:
        assert torch.allclose(gx, x.grad, rtol=1e-10, atol=1e-12)
    for p, gp in zip(params, gps):
        assert torch.allclose(gp, p.grad, rtol=1e-10, atol=1e-12)


def _pretend_cuda(monkeypatch):
    """The forward's checks pass for CPU tensors and the fused forward is PyTorch's evaluation,
    so that the module's decisions and autograd wiring run without a GPU."""
    monkeypatch.setattr(fj, "_why_not", lambda x, named: None)
    monkeypatch.setattr(fj, "_compiled_chain", lambda spec, device: object())
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: _chain.eager(fj._ops(spec), x, params))
    monkeypatch.setattr(fj, "_training_pair", lambda spec, device: None)  # no u to save here
    monkeypatch.setattr(fj, "_shape_mismatch", lambda chain, named: None)  # no signature here


def _pretend_training(monkeypatch):
    """_pretend_cuda, and calls needing gradients too: the fused forward's autograd op and its
    backward are PyTorch's evaluation of the chain."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    monkeypatch.setattr(fj, "_backward", lambda spec, x, params, grad, needs:
                        fj._eager_backward(spec, x, params, grad, needs))


def _pretend_exact(monkeypatch):
    """_pretend_training with the chains evaluated in float64 (forward and backward), rounded to
    their input's dtype: what the drop-in decides and wires is checked, not the CPU's fp32
    rounding."""
    _pretend_training(monkeypatch)

    def run(spec, x, params):
        return _chain.eager(fj._ops(spec), x.double(), [p.double() for p in params]).to(x.dtype)

    def backward(spec, x, params, grad, needs):
        gx, gps = fj._eager_backward(spec, x.double(), [p.double() for p in params],
                                     grad.double(), needs)
        return (None if gx is None else gx.to(x.dtype),
                [None if g is None else g.to(p.dtype) for g, p in zip(gps, params)])

    monkeypatch.setattr(fj, "_run", run)
    monkeypatch.setattr(fj, "_call_op", run)
    monkeypatch.setattr(fj, "_backward", backward)


def _pretend_with_the_autograd_function(monkeypatch):
    """_pretend_exact, but calls needing gradients through the drop-in's own autograd.Function
    (_ChainFunction, as on the GPU: it saves its inputs for the backward)."""
    real = fj._call_op
    _pretend_exact(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", real)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)
    monkeypatch.setattr(fj, "_CONSTANTS", {})


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _ConvNorm(nn.Module):
    def __init__(self, cin=4):
        super().__init__()
        self.conv = nn.Conv3d(cin, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return torch.relu(self.gn(F.silu(self.conv(x))))


@pytest.mark.parametrize("policy", ["fused", "auto"])
def test_an_input_with_other_channels_runs_the_original(monkeypatch, policy):
    """An input whose channels are not the model's makes a chain whose weights are not the
    parameters' shapes: the original forward runs (and raises PyTorch's error), with a warning
    naming the parameter; fusejit must never run it (it would read past the weights). The real
    compiled chain's signature is what the parameters are checked against."""
    monkeypatch.setattr(fj, "_why_not", lambda x, named: None)  # CPU tensors pass
    compiled = {}

    def compile_for_sm90(spec, device):
        if spec not in compiled:
            compiled[spec] = fusejit.Chain(spec, arch="sm_90")
        return compiled[spec]
    monkeypatch.setattr(fj, "_compiled_chain", compile_for_sm90)
    ran = []
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: ran.append(spec))
    monkeypatch.setattr(fj, "_decide", lambda self, st, spec, x, params, *a: "fused")
    model = randomized(_ConvNorm()).eval().requires_grad_(False)
    fast = fj.fuse(model, policy=policy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="channels"):
            fast(torch.randn(2, 5, 6, 7, 8))  # the model's conv takes 4
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert not ran
    assert len(ours) == 1 and "parameter 0.weight has shape [8, 4, 3, 3, 3]" in ours[0], ours
    assert "needs [8, 5, 3, 3, 3]" in ours[0]
    with pytest.raises(fj.Unsupported, match="parameter 0.weight has shape"):
        fj.fuse(model, strict=True, policy=policy)(torch.randn(2, 5, 6, 7, 8))
    fast(torch.randn(2, 4, 6, 7, 8))  # the right channels: fused
    assert ran == ["x:f32[2,4,6,7,8]" + fast.__dict__["_fusejit"].tail]


class _InstanceNormKeptMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 6, 3)
        self.norm = nn.InstanceNorm3d(6)

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x))).mean(dim=(-3, -2, -1), keepdim=True)


@pytest.mark.parametrize("make,shape", [
    (_InstanceNormKeptMean, (2, 4, 5, 6, 7)),
    (lambda: nn.Sequential(nn.ReLU(), nn.GroupNorm(3, 6, affine=False), nn.AdaptiveAvgPool3d(1)),
     (2, 6, 4, 5, 3)),
    (lambda: nn.Sequential(nn.Tanh(), nn.InstanceNorm3d(5, affine=True)), (2, 5, 3, 4, 5))])
def test_norms_without_weights_and_kept_means_run_fused(monkeypatch, make, shape):
    """A group_norm without weight and bias runs the chain's with weight 1 and bias 0 (tensors of
    the call's dtype and device, not model parameters: the state_dict stays the original's); a
    kept mean's output is viewed as the original returns it. The fused call (mocked: the chain's
    eager evaluation on the compiled chain's parameters) gives the model's output, and the
    gradients of that evaluation are the model's."""
    monkeypatch.setattr(fj, "_why_not", lambda x, named: None)  # CPU tensors pass
    monkeypatch.setattr(fj, "_compiled_chain",
                        lambda spec, device: fusejit.Chain(spec, arch="sm_90"))
    ran = []

    def run(spec, x, params):
        ran.append([tuple(p.shape) for p in params])
        return _chain.eager(_chain.ops_of(spec), x, params)
    monkeypatch.setattr(fj, "_run", run)
    monkeypatch.setattr(fj, "_decide", lambda self, st, spec, x, params, *a: "fused")
    model = randomized(make(), seed=2).double().eval().requires_grad_(False)
    keys = list(model.state_dict())
    fast = fj.fuse(model, strict=True)
    assert fj.is_fused(fast) and list(fast.state_dict()) == keys
    x = torch.randn(*shape, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = fast(x)
    want = model(x)
    assert len(ran) == 1 and y.shape == want.shape
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    st = fast.__dict__["_fusejit"]
    params = [p for _, p in fj._named_params(fast, st, x, x.dtype)]
    assert len(params) == _chain.param_count(_chain.ops_of(fj._spec(st, x.float())))
    xg = x.clone().requires_grad_(True)
    y = model(xg)
    g = torch.randn_like(y)
    y.backward(g)
    spec = fusejit.canonical_spec(fj._spec(st, x.float()))
    y_chain = _chain.eager(_chain.ops_of(spec), x, params)
    gx, _ = fj._eager_backward(spec, x, params, g.reshape(y_chain.shape),
                               [True] + [False] * len(params))
    assert torch.allclose(gx, xg.grad, rtol=1e-10, atol=1e-12)


def test_dropout_is_skipped_in_eval_mode_and_stops_the_chain_in_training(monkeypatch):
    """Dropout modules with p > 0 are the identity in eval mode: the whole chain runs there; in
    training mode (the default, and after .train()) they draw a random mask: the chain before the
    dropout runs fused, the dropout and what follows as PyTorch (no warning). strict=True runs
    the original there -- it raises, naming the module."""
    monkeypatch.setattr(fj, "_why_not", lambda x, named: None)
    monkeypatch.setattr(fj, "_compiled_chain",
                        lambda spec, device: fusejit.Chain(spec, arch="sm_90"))
    ran = []
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: ran.append(spec) or
                        _chain.eager(_chain.ops_of(spec), x, params))
    monkeypatch.setattr(fj, "_decide", lambda self, st, spec, x, params, *a: "fused")
    model = randomized(nn.Sequential(nn.Conv3d(3, 4, 3), nn.Dropout(0.5), nn.ReLU()))
    model.requires_grad_(False)
    fast = fj.fuse(model)
    x = torch.randn(2, 3, 5, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y1 = fast(x)  # training mode: the convolution fused, then a random mask
        fast.eval()
        y = fast(x)
    assert ran == ["x:f32[2,3,5,5,5] | conv3d(out=4,k=3)",
                   "x:f32[2,3,5,5,5] | conv3d(out=4,k=3) | relu"], ran
    assert torch.allclose(y, model(x), rtol=1e-6, atol=1e-6)
    conv = torch.relu(model[0](x))
    dropped = y1 == 0
    assert 0 < dropped.float().mean() < 1  # (about half)
    assert torch.allclose(y1[~dropped], 2 * conv[~dropped], rtol=1e-6, atol=1e-6)
    fast[1].train()  # one submodule back in training mode: the training chain again
    fast(torch.randn(2, 3, 5, 5, 6))
    assert ran[-1] == "x:f32[2,3,5,5,6] | conv3d(out=4,k=3)", ran
    with pytest.raises(fj.Unsupported, match="dropout module '1'"):
        fj.fuse(model, strict=True).train()(x)


def test_instance_norm_of_other_channels_runs_the_original(monkeypatch):
    """nn.InstanceNorm3d(affine=False) normalizes the input's channels whatever num_features says
    (PyTorch warns): the chain's constants are num_features long, so fusejit runs the original."""
    monkeypatch.setattr(fj, "_why_not", lambda x, named: None)
    monkeypatch.setattr(fj, "_compiled_chain",
                        lambda spec, device: fusejit.Chain(spec, arch="sm_90"))
    monkeypatch.setattr(fj, "_run", lambda *a: pytest.fail("ran fused"))
    monkeypatch.setattr(fj, "_decide", lambda self, st, spec, x, params, *a: "fused")
    fast = fj.fuse(nn.Sequential(nn.InstanceNorm3d(4)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fast(torch.randn(2, 8, 3, 3, 3))  # (4 groups of 8 channels compile)
    assert y.shape == (2, 8, 3, 3, 3)
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ours) == 1 and "parameter 0.weight has shape [4]" in ours[0], ours


class _Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 1)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("form", ["nn.ReLU6", "nn.Hardtanh", "F.relu6", "F.hardtanh",
                                  "clamp(min=0)", "clamp(max=0.5)", "torch.clamp",
                                  "written-out hardswish",
                                  "hardswish with torch.clamp"])
def test_hardtanh_gradients_at_the_bounds_are_pytorchs(monkeypatch, form):
    """nn.Hardtanh, nn.ReLU6 and their functions have clamp's values, but PyTorch's hardtanh
    backward passes the gradient only strictly inside the bounds, where clamp's includes them: a
    bf16 chain hits the bounds exactly often (gradient errors of 9e-2 against float64 where
    eager's were 5e-3, H200, session 27). They are the grammar's hardtanh (fused, forward and
    backward, with hardtanh's gradient); torch.clamp is clamp, and relu6 inside a written-out
    hardswish is hardswish (its gradient at +-3 is hardswish's). A clamp with only min (or only
    max) is the grammar's one-sided clamp, gradient 1 at the bound as PyTorch's (clamp(min=0) is
    not relu, whose gradient at 0 is 0). A hardswish written with torch.clamp has gradients -1/2
    and 3/2 at -3 and 3: no grammar op has those, so calls needing gradients run the original
    (with a warning naming the layer); calls without run fused."""
    _pretend_cuda(monkeypatch)
    ran = []
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: ran.append(spec) or
                        _chain.eager(fj._ops(spec), x, params))
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: ran.append(spec) or
                        _chain.eager(fj._ops(spec), x, params))
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    act = {"nn.ReLU6": nn.ReLU6(), "nn.Hardtanh": nn.Hardtanh(-0.5, 0.5),
           "F.relu6": _Lambda(F.relu6), "F.hardtanh": _Lambda(lambda v: F.hardtanh(v, -0.5, 0.5)),
           "clamp(min=0)": _Lambda(lambda v: v.clamp(min=0)),  # relu's values, not its kink
           "clamp(max=0.5)": _Lambda(lambda v: torch.clamp(v, max=0.5)),
           "torch.clamp": _Lambda(lambda v: torch.clamp(v, -0.5, 0.5)),
           "written-out hardswish": _Lambda(lambda v: v * F.relu6(v + 3) / 6),
           "hardswish with torch.clamp": _Lambda(lambda v: v * torch.clamp(v + 3, 0, 6) / 6),
           }[form]
    model = randomized(_Act(act))
    fast = fj.fuse(model, policy="fused")
    st = fast.__dict__["_fusejit"]
    exclusive = form == "hardswish with torch.clamp"
    op = {"nn.ReLU6": "hardtanh(min=0,max=6)", "F.relu6": "hardtanh(min=0,max=6)",
          "nn.Hardtanh": "hardtanh(min=-0.5,max=0.5)", "F.hardtanh": "hardtanh(min=-0.5,max=0.5)",
          "torch.clamp": "clamp(min=-0.5,max=0.5)", "written-out hardswish": "hardswish",
          "hardswish with torch.clamp": "hardswish", "clamp(min=0)": "clamp(min=0)",
          "clamp(max=0.5)": "clamp(max=0.5)"}[form]
    assert st.tail.endswith(" | " + op), st.tail
    assert (st.training_fallback is not None) == exclusive, st.training_fallback
    with torch.no_grad():
        fast(torch.randn(1, 3, 2, 2, 2))
    assert len(ran) == 1  # inference: fused either way
    # Inputs whose convolution output is exactly at the bounds: 1x1 conv with weight e_0 and
    # bias 0 passes channel 0 through.
    with torch.no_grad():
        model.conv.weight.zero_()
        model.conv.weight[:, 0] = 1.0
        model.conv.bias.zero_()
    x = torch.tensor([-0.5, 0.5, 0.0, 6.0, 3.0, -3.0, 0.25, 7.0]).reshape(1, 1, 2, 2, 2)
    x = torch.cat([x, torch.zeros_like(x), torch.zeros_like(x)], 1).requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast(x).sum().backward()
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    got = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    if exclusive:
        assert len(ran) == 1 and len(ours) == 1, ours
        assert "-1/2 at -3" in ours[0], ours
        assert torch.equal(got, x.grad)
    else:
        assert len(ran) == 2 and not ours, ours  # fused; its gradient is the grammar op's
        if op.startswith(("hardtanh", "clamp")):  # the fused backward here is _chain.eager's
            assert torch.equal(got, x.grad)


@pytest.mark.parametrize("where", ["forward", "forward_pre", "backward", "global"])
def test_hooks_on_submodules_run_the_original(monkeypatch, where):
    """A hook on a submodule runs only if that submodule is called, and the fused chain calls
    none: while one is registered, the original forward runs (with a warning naming it), on the
    checked path and on the fast path; once it is removed, the fused chain runs again."""
    _pretend_cuda(monkeypatch)
    ran = []
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: ran.append(spec) or
                        _chain.eager(fj._ops(spec), x, params))
    monkeypatch.setattr(fj, "_launch", lambda chain, x, ptrs: ran.append("fast path") or
                        torch.zeros(()))  # calls no submodule, as the fused chain
    model = randomized(_ConvNorm()).eval()
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(2, 4, 6, 7, 8)
    with torch.no_grad():
        fast(x)
        fast(x)  # the fast path is set up
    assert len(ran) == 2
    seen = []
    hook = lambda *args: seen.append(1)  # noqa: E731
    register = {"forward": fast.conv.register_forward_hook,
                "forward_pre": fast.conv.register_forward_pre_hook,
                "backward": fast.gn.register_full_backward_hook,
                "global": nn.modules.module.register_module_forward_hook}[where]
    handle = register(hook)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xg = x.clone().requires_grad_(where == "backward")
            y = fast(xg)
            if where == "backward":
                y.sum().backward()
            else:
                with torch.no_grad():
                    fast(x)  # the fast path sees the hook too
    finally:
        handle.remove()
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ran) == 2 and seen, (ran, seen)
    assert len(ours) == 1 and "hook" in ours[0], ours
    if where != "global":
        assert ("'%s'" % ("gn" if where == "backward" else "conv")) in ours[0]
    with torch.no_grad():
        fast(x)
    assert len(ran) == 3  # fused again


def test_training_without_a_fused_backward(monkeypatch):
    """auto: the original forward (the faster step), with a warning saying why; fused: the fused
    forward and the eager backward, warned once; strict: an error at the forward."""
    _pretend_cuda(monkeypatch)
    _refuse_backward(monkeypatch, why="no plan XYZ")
    cls, init, _, _, small = SEEDS["W2"]
    model = randomized(cls(*init), seed=5)
    x = torch.randn(*small)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = fj.fuse(model)  # policy auto, training mode
        y = auto(x)
        auto(x)
    assert "ChainFunction" not in type(y.grad_fn).__name__ and not auto.__dict__["_fusejit"].ready
    assert torch.equal(y, model(x))
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ours) == 1 and "no plan XYZ" in ours[0] and "original forward" in ours[0], ours

    with pytest.raises(fj.Unsupported, match="cannot differentiate.*no plan XYZ"):
        fj.fuse(model, strict=True, policy="fused")(x)

    before = fj._stats["eager_backward"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fj.fuse(model, policy="fused")(x)
        assert "ChainFunction" in type(y.grad_fn).__name__
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, list(model.parameters()), g)
    ours = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(ours) == 1 and "recomputed in strict fp32" in ours[0], ours
    assert fj._stats["eager_backward"] == before + 1
    want = torch.autograd.grad(model(x), list(model.parameters()), g)
    for got, w in zip(grads, want):
        assert torch.allclose(got, w, rtol=1e-4, atol=1e-5)


def test_training_calls_are_decided_as_steps(monkeypatch):
    """With a fused backward, a training call is decided as a training step (the gradients it
    needs and the backward); an eval-mode or no-grad call as inference; the fast path serves only
    the inference decision."""
    _pretend_cuda(monkeypatch)
    backward = object()
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: backward)
    calls = []

    def decide(self, st, spec, x, params, needs=None, backward=None, raw=None):
        calls.append((needs, backward))
        return "eager"
    monkeypatch.setattr(fj, "_decide", decide)
    cls, init, _, _, small = SEEDS["W4"]
    model = randomized(cls(*init))
    model.conv.bias.requires_grad_(False)
    fast = fj.fuse(model)
    x = torch.randn(*small)
    fast(x)
    assert calls[-1] == ([False, True, False, True, True], backward)
    fast(x.requires_grad_(True))
    assert calls[-1] == ([True, True, False, True, True], backward)
    fast.eval()
    fast(x)
    assert calls[-1] == (None, None)
    fast.train()
    with torch.no_grad():
        fast(x)
    assert calls[-1] == (None, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_check_references(dtype, monkeypatch):
    """The auto policy's training check (_measure_training, run here on the CPU with a fused
    backward that returns the chain's float32 gradients rounded to the dtype): the fused and
    original steps agree; a bf16 chain's gradients are checked against the chain's in float32
    (_float32_gradients), an f32 chain's against the original's backward."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_median_ms", lambda fn, reps: (fn(), 1.0)[1])
    cls, init, _, _, small = SEEDS["W4"]
    fast = fj.fuse(randomized(cls(*init)).to(dtype))
    st = fast.__dict__["_fusejit"]
    x = torch.randn(*small).to(dtype)
    spec = fj._spec(st, x)
    params = [get(fast) for get in st.getters]
    needs = [True] * (1 + len(params))

    real = fj._float32_gradients

    def launch_backward(chain, x, params, grad, saved=None):
        grads = [t.to(x.dtype) for t in real(spec, x, params, grad, needs)]
        return grads[0], grads[1:]
    monkeypatch.setattr(fj, "_launch_backward", launch_backward)
    used = []
    monkeypatch.setattr(fj, "_float32_gradients", lambda *a: used.append(a[0]) or real(*a))
    entry, why = fj._measure_training(fast, st, spec, x, params, needs, backward=object())
    assert why is None and entry["decision"] == "fused", (entry, why)
    assert used == ([spec] if dtype == torch.bfloat16 else []), used
    assert all(p.grad is None for p in fast.parameters())


def test_a_backward_through_the_fused_backward_is_refused(monkeypatch):
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    monkeypatch.setattr(fj, "_backward", lambda spec, x, params, grad, needs: (
        None, [torch.ones_like(p) for p in params]))
    cls, init, _, _, small = SEEDS["W4"]
    fast = fj.fuse(randomized(cls(*init)), policy="fused")
    y = fast(torch.randn(*small))
    g = torch.randn_like(y, requires_grad=True)
    (gw, *_) = torch.autograd.grad(y, list(fast.parameters()), g, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gw.sum().backward()


# ---- the policy store ------------------------------------------------------------------------

def test_policy_store_round_trip_and_integrity(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEJIT_DISABLE_TUNING", raising=False)
    key = {"spec": "x:f32[1,3,8,8,8] | relu", "device": "H100"}
    store = _policy.DecisionStore(str(tmp_path))
    store.put(key, "fused", {"fused_ms": 0.1, "eager_ms": 0.2})
    again = _policy.DecisionStore(str(tmp_path))  # another process
    assert again.get(key)["decision"] == "fused"
    (path,) = [p for p in (tmp_path / "policy").iterdir()]
    assert oct(os.stat(tmp_path / "policy").st_mode & 0o777) == "0o700"
    good = path.read_bytes()
    for bad in (good[:-10], good.replace(b"fused", b"eager"), b"", b"\x00" * 100):
        path.write_bytes(bad)
        fresh = _policy.DecisionStore(str(tmp_path))
        assert fresh.get(key) is None and fresh.rejected == 1
    # a valid entry copied under another key's name is refused
    other = {"spec": "x:f32[2,3,8,8,8] | relu", "device": "H100"}
    path.write_bytes(good)
    (tmp_path / "policy" / os.path.basename(_policy.DecisionStore(str(tmp_path))._path(
        _policy.DecisionStore.key_text(other)))).write_bytes(good)
    assert _policy.DecisionStore(str(tmp_path)).get(other) is None


def test_policy_store_refuses_linked_folders_and_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEJIT_DISABLE_TUNING", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    os.symlink(elsewhere, tmp_path / "cache" / "policy")
    store = _policy.DecisionStore(str(tmp_path / "cache"))
    assert store.folder is None
    store.put({"k": 1}, "eager", {})
    assert store.get({"k": 1})["decision"] == "eager"  # kept for the process
    assert list(elsewhere.iterdir()) == []
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")
    assert _policy.DecisionStore(str(tmp_path)).folder is None


# ---- installing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["python", "."])
def test_pip_install_puts_the_library_next_to_the_package(tmp_path, source):
    lib = fusejit.library_path()
    env = dict(os.environ, FUSEJIT_LIBRARY=lib)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                    "--no-deps", "--target", str(tmp_path / "site"), os.path.join(ROOT, source)],
                   check=True, env=env, cwd=str(tmp_path))
    assert (tmp_path / "site" / "fusejit" / "libfusejit.so.0").is_file()
    env.pop("FUSEJIT_LIBRARY")
    out = subprocess.run([sys.executable, "-c", "import fusejit; print(fusejit.library_path())"],
                         check=True, env=dict(env, PYTHONPATH=str(tmp_path / "site")),
                         cwd=str(tmp_path), stdout=subprocess.PIPE, universal_newlines=True)
    assert out.stdout.strip() == str(tmp_path / "site" / "fusejit" / "libfusejit.so.0")


class _Folded(nn.Module):
    """Per-channel factors folded into the convolution (a Parameter scale, a buffer shift: the
    bias-less convolution gets a bias) and into the group_norm (a one-value Parameter divisor)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1, bias=False)
        self.scale = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)
        self.register_buffer("shift", torch.randn(1, 8, 1, 1, 1))
        self.gn = nn.GroupNorm(2, 8)
        self.gain = nn.Parameter(torch.tensor(1.7))

    def forward(self, x):
        return torch.tanh(self.gn(self.conv(x) * self.scale + self.shift) / self.gain)


def test_per_channel_factors_fold_into_the_chain_parameters(monkeypatch):
    """The drop-in computes the folded weight and bias from the model's current tensors on each
    call (an in-place change of a factor is seen), and gradients reach the factors through them:
    the fused forward here is PyTorch's evaluation of the chain (_pretend_cuda), so the values
    and gradients are the chain's parameters' doing."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    torch.manual_seed(0)
    model = _Folded()
    fast = fj.fuse(model, policy="fused", strict=True)
    st = fast.__dict__["_fusejit"]
    assert st.tail.startswith(" | conv3d(out=8,k=3,padding=1) | group_norm"), st.tail
    assert sorted(st.folds) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert st.raw_paths == ["conv.weight", "scale", "shift", "gn.weight", "gain", "gn.bias"]
    for shape in ((1, 3, 5, 6, 7), (2, 3, 4, 5, 6)):  # a new shape: the checked path again
        x = torch.randn(*shape)
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
            model.shift.add_(0.25)  # seen by the next call
            model.gain.mul_(1.5)
    x = torch.randn(2, 3, 5, 5, 5, requires_grad=True)
    g = torch.randn(2, 8, 5, 5, 5)
    (fast(x) * g).sum().backward()
    got = [x.grad] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    (model(x) * g).sum().backward()
    want = [x.grad] + [p.grad for p in model.parameters()]
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name



def _record_chains(monkeypatch) -> list:
    """The fused chains run as PyTorch's evaluation of the chain (with _pretend_cuda); returns
    the list their specs are appended to, call by call."""
    specs = []

    def call_op(spec, x, params):
        specs.append(spec)
        return _chain.eager(fj._ops(spec), x, params)
    monkeypatch.setattr(fj, "_call_op", call_op)
    monkeypatch.setattr(fj, "_run", call_op)
    return specs


def _pretend_auto_policy(monkeypatch, tmp_path):
    """_pretend_cuda, and the auto policy's timing, store and backward runnable on the CPU: every
    timing 1 ms, decisions stored below tmp_path, the fused backward PyTorch's of the chain."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_median_ms", lambda fn, reps: (fn(), 1.0)[1])
    monkeypatch.setattr(fj, "_store", _policy.DecisionStore(str(tmp_path)))
    monkeypatch.setattr(fj, "_decision_key", lambda spec, device: {"spec": spec})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: types.SimpleNamespace(
        spec=spec))
    monkeypatch.setattr(fj, "_backward", lambda spec, x, params, grad, needs:
                        fj._eager_backward(spec, x, params, grad, needs))
    monkeypatch.setattr(fj, "_launch_backward", lambda chain, x, params, grad, saved=None:
                        fj._eager_backward(chain.spec, x, params, grad, [True] * (1 + len(params))))

class _PoolHead(nn.Module):
    """conv -> group_norm -> relu, then what the grammar has not: a max pool and a Linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(8 * 8, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.gn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


@pytest.mark.parametrize("policy", ["fused", "auto"])
def test_partial_fusion_runs_the_rest_of_forward_as_pytorch(monkeypatch, tmp_path, policy):
    """A model that goes on past the grammar: the chain fuses its start, the rest (max pool,
    flatten, Linear) runs as the model's own code on the chain's output, on the live module
    (a replaced head is seen); outputs and every gradient, the head's included, are the
    original's; the auto policy times and checks the whole forward and training step (timings
    pretended equal here, so it keeps the fused one). strict=True refuses the model."""
    _pretend_auto_policy(monkeypatch, tmp_path)
    with pytest.raises(fj.Unsupported, match="MaxPool3d"):
        fj.fuse(_PoolHead(), strict=True)
    torch.manual_seed(0)
    model = randomized(_PoolHead())
    fast = fj.fuse(model, policy=policy)
    st = fast.__dict__["_fusejit"]
    assert st.tail == " | conv3d(out=8,k=3,padding=1) | group_norm(groups=2,eps=1e-5) | relu"
    assert "layer 'pool' (nn.MaxPool3d)" in st.rest_from, st.rest_from
    x = torch.randn(2, 3, 4, 4, 4)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
    if policy == "auto":
        assert st.last_decision["decision"] == "fused", st.last_decision
    xg = torch.randn(2, 3, 4, 4, 4, requires_grad=True)  # (another shape key: the checked path)
    g = torch.randn(2, 5)
    (fast(xg) * g).sum().backward()
    if policy == "auto":
        assert st.last_decision["pass"] == "train" and st.last_decision["decision"] == "fused"
    got = [xg.grad] + [p.grad.clone() for p in model.parameters()]
    xg.grad = None
    model.zero_grad()
    (model(xg) * g).sum().backward()
    want = [xg.grad] + [p.grad for p in model.parameters()]
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
    model.fc = nn.Linear(8 * 8, 3)  # the rest reads the live module
    with torch.no_grad():
        y = fast(torch.randn(1, 3, 4, 4, 4))
    assert y.shape == (1, 3)


def test_the_auto_policy_checks_folded_models_by_their_own_parameters(monkeypatch, tmp_path):
    """A model with folded factors is timed and checked (training step) with autograd through
    the folds, for the model's own tensors (the chain's computed parameters are not the
    original forward's): the two steps agree, and the fused one is kept at equal timings."""
    _pretend_auto_policy(monkeypatch, tmp_path)
    torch.manual_seed(0)
    model = _Folded()
    fast = fj.fuse(model)  # policy auto
    st = fast.__dict__["_fusejit"]
    x = torch.randn(2, 3, 4, 5, 6, requires_grad=True)
    (fast(x) * torch.randn(2, 8, 4, 5, 6)).sum().backward()
    assert st.last_decision["pass"] == "train", st.last_decision
    assert st.last_decision["decision"] == "fused", st.last_decision
    assert all(p.grad is not None for p in model.parameters())


class _ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.shortcut = nn.Conv3d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x))) + self.shortcut(x)


def test_partial_fusion_of_a_residual_block(monkeypatch):
    """The rest reads the call's input too (a shortcut): values and gradients (x's through both
    paths) are the original's."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    monkeypatch.setattr(fj, "_backward", lambda spec, x, params, grad, needs:
                        fj._eager_backward(spec, x, params, grad, needs))
    torch.manual_seed(0)
    model = randomized(_ResidualBlock())
    fast = fj.fuse(model, policy="fused")
    assert fast.__dict__["_fusejit"].rest is not None
    x = torch.randn(2, 4, 4, 5, 6, requires_grad=True)
    g = torch.randn(2, 4, 4, 5, 6)
    y = fast(x)
    assert torch.allclose(y, model(x), rtol=1e-5, atol=1e-6)
    (y * g).sum().backward()
    got = [x.grad] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    (model(x) * g).sum().backward()
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got,
                          [x.grad] + [p.grad for p in model.parameters()]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name


def test_a_failing_rest_of_forward_falls_back_to_the_original(monkeypatch):
    """Where the rest of a partially fused forward raises but the original forward runs, the
    call returns the original's result with one warning and the module runs the original from
    then on; where the original raises too (the call is wrong), that error is the caller's."""
    _pretend_cuda(monkeypatch)
    model = randomized(_ResidualBlock())
    fast = fj.fuse(model, policy="fused")
    st = fast.__dict__["_fusejit"]

    def broken(module, y, x):
        raise RuntimeError("simulated")
    st.rest = broken
    x = torch.randn(1, 4, 3, 4, 5)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        y = fast(x)
        assert torch.equal(y, model(x))
        fast(torch.randn(1, 4, 3, 4, 5))
    msgs = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(msgs) == 1 and "simulated" in msgs[0], msgs
    assert "simulated" in st.unsupported
    fast2 = fj.fuse(model, policy="fused")
    fast2.__dict__["_fusejit"].rest = broken
    with pytest.raises(RuntimeError), torch.no_grad():  # the original's own error: 3 channels
        fast2(torch.randn(1, 3, 3, 4, 5))


class _BatchNormed(nn.Module):
    """conv (no bias) -> BatchNorm3d -> relu -> group_norm -> InstanceNorm3d with running
    statistics -> tanh: in eval mode both running-statistics norms fold into the op before them."""

    def __init__(self, bn=None):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1, bias=False)
        self.bn = bn if bn is not None else nn.BatchNorm3d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm3d(8, affine=True, track_running_stats=True)

    def forward(self, x):
        return torch.tanh(self.inorm(self.gn(torch.relu(self.bn(self.conv(x))))))


def _random_norm_stats(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm3d, nn.InstanceNorm3d)) and m.track_running_stats:
                m.running_mean.copy_(torch.randn(m.num_features) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.num_features) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features))


def _grads(model, fwd, x, g):
    x = x.detach().requires_grad_(True)
    model.zero_grad()
    (fwd(x) * g).sum().backward()
    return [x.grad] + [p.grad.clone() for p in model.parameters()]


def test_batch_norms_fold_in_eval_mode_and_run_as_pytorch_in_training(monkeypatch):
    """Eval mode: nn.BatchNorm3d and a running-statistics nn.InstanceNorm3d fold into the
    convolution's and the group_norm's weight and bias (the bias-less convolution gets one);
    values and gradients (the norms' weight and bias too) are the original's. Training mode: the
    chain stops before the batch norm, which runs as PyTorch with the batch's statistics and
    updates its running ones exactly as the original does. strict=True raises for training-mode
    calls, and refuses norms that always use batch statistics or follow a nonlinearity."""
    _pretend_training(monkeypatch)
    torch.manual_seed(0)
    model = randomized(_BatchNormed())
    _random_norm_stats(model)
    model.eval()
    fast = fj.fuse(model, policy="fused", strict=True)
    st = fast.__dict__["_fusejit"]
    assert st.tail == (" | conv3d(out=8,k=3,padding=1) | relu | group_norm(groups=2,eps=1e-5) "
                       "| tanh"), st.tail
    assert sorted(st.folds) == ["0.bias", "0.weight", "2.bias", "2.weight"], st.folds
    assert st.running_norms == ["bn", "inorm"]
    x = torch.randn(2, 3, 5, 6, 7)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
        model.bn.running_var.mul_(2.0)  # in place: seen by the next call
        x2 = torch.randn(1, 3, 5, 6, 7)  # (another shape: the checked path, as on the CPU)
        assert torch.allclose(fast(x2), model(x2), rtol=1e-5, atol=1e-6)
    g = torch.randn(2, 8, 5, 6, 7)
    got, want = _grads(model, fast, x, g), _grads(model, model, x, g)
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
    # training mode, strict: the call raises, naming the batch norm
    model.train()
    with pytest.raises(fj.Unsupported, match="batch norm 'bn' is in training mode"):
        fast(x)
    # training mode, not strict: the chain before the batch norm, the rest as PyTorch
    loose = fj.fuse(model, policy="fused")
    model.eval()
    with torch.no_grad():  # (the folded tensors kept: the cache the later eval call checks)
        x3 = torch.randn(1, 3, 4, 5, 6)
        assert torch.allclose(loose(x3), model(x3), rtol=1e-5, atol=1e-6)
    model.train()
    twin = copy.deepcopy(model)
    y, want_y = loose(x), twin(x)
    assert torch.allclose(y, want_y, rtol=1e-5, atol=1e-6)
    for a, b in zip(model.buffers(), twin.buffers()):  # running statistics updated once, alike
        assert torch.equal(a, b)
    alt = loose.__dict__["_fusejit"].training_state
    assert alt.tail == " | conv3d(out=8,k=3,padding=1,bias=false)", alt.tail
    assert "nn.BatchNorm3d in training mode" in alt.rest_from, alt.rest_from
    got, want = _grads(model, loose, x, g), _grads(twin, twin, x, g)
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
    model.eval()  # back to the folded chain, with the running statistics training changed
    with torch.no_grad():
        x4 = torch.randn(1, 3, 4, 5, 7)
        assert torch.allclose(loose(x4), model(x4), rtol=1e-5, atol=1e-6)
    # refusals, each naming the problem
    with pytest.raises(fj.Unsupported, match="track_running_stats=False normalizes with the "
                                             "batch's statistics"):
        fj.fuse(_BatchNormed(nn.BatchNorm3d(8, track_running_stats=False)).eval(), strict=True)

    class AfterRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv3d(3, 8, 3), nn.BatchNorm3d(8)

        def forward(self, x):
            return self.bn(torch.relu(self.conv(x)))

    with pytest.raises(fj.Unsupported, match="a batch norm with running statistics is fused only "
                                             "right after the convolution or the group_norm"):
        fj.fuse(AfterRelu().eval(), strict=True)
    partial = fj.fuse(AfterRelu().eval())  # not strict: the convolution and relu fused
    assert partial.__dict__["_fusejit"].tail == " | conv3d(out=8,k=3) | relu"


def test_the_auto_policy_leaves_running_statistics_as_one_call_does(monkeypatch, tmp_path):
    """The auto policy's timing runs forwards many times; where a batch norm in training mode
    runs in them (in the rest of forward and in the original), its running statistics are put
    back: after the first call they are what one call of the original leaves."""
    _pretend_auto_policy(monkeypatch, tmp_path)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    torch.manual_seed(0)
    model = randomized(_BatchNormed())
    _random_norm_stats(model)
    twin = copy.deepcopy(model)
    fast = fj.fuse(model)  # training mode (the default)
    x = torch.randn(2, 3, 5, 6, 7, requires_grad=True)
    assert torch.allclose(fast(x), twin(x), rtol=1e-5, atol=1e-6)
    st = fast.__dict__["_fusejit"].training_state
    assert st.last_decision is not None and st.last_decision["pass"] == "train", st.last_decision
    for (name, a), b in zip(model.named_buffers(), twin.buffers()):
        assert torch.equal(a, b), name


def test_folded_parameters_are_kept_while_the_model_tensors_are_unchanged(monkeypatch):
    """Calls that cannot differentiate through the folds reuse the folded tensors while the
    model's tensors are the same at the same versions: an in-place change, a new Parameter or a
    batch norm's new running statistics make the next call compute them again; calls needing
    gradients compute them each time (their graph reaches the factors)."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    computed = []
    value = fj._recognize_module().Fold.value
    monkeypatch.setattr(fj._recognize_module().Fold, "value",
                        lambda self, get, c: computed.append(1) or value(self, get, c))
    torch.manual_seed(0)
    model = randomized(_Folded())
    fast = fj.fuse(model, policy="fused", strict=True)
    shapes = iter([(1, 3, 4, 4, 4 + i) for i in range(10)])  # (new shapes: the checked path)

    def call():
        x = torch.randn(*next(shapes))
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
        return len(computed)

    first = call()
    assert first == 4  # the conv's weight and bias, the group_norm's
    assert call() == first  # unchanged: kept
    with torch.no_grad():
        model.scale.mul_(1.5)
    assert call() == 2 * first  # changed in place: computed again
    model.gain = nn.Parameter(torch.tensor(0.8))
    assert call() == 3 * first  # a new Parameter
    assert call() == 3 * first
    model.scale.data = model.scale.detach() * 2  # no version bump; a new data pointer
    assert call() == 4 * first
    for shape in next(shapes), next(shapes):
        fast(torch.randn(*shape, requires_grad=True)).sum().backward()
    assert len(computed) == 6 * first  # gradients: computed each call
    assert model.scale.grad is not None


class _TwoBlocks(nn.Module):
    """conv -> group_norm -> relu, a max pool, then a second block (conv -> batch norm -> tanh)
    with a 1x1 convolution shortcut beside it, summed, then a Linear head: three chains."""

    def __init__(self):
        super().__init__()
        self.c1, self.g1, self.pool = nn.Conv3d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), \
            nn.MaxPool3d(2)
        self.c2, self.bn = nn.Conv3d(8, 8, 3, padding=1, bias=False), nn.BatchNorm3d(8)
        self.c3 = nn.Conv3d(8, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.pool(F.relu(self.g1(self.c1(x))))
        y = torch.tanh(self.bn(self.c2(x))) + self.c3(x)
        return self.fc(y.mean([2, 3, 4]))


@pytest.mark.parametrize("policy", ["fused", "auto"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_chains_in_the_rest_of_forward_run_fused(monkeypatch, tmp_path, mode, policy):
    """The rest of a partially fused forward fuses the further chains it has (each from a
    convolution: the second block, the shortcut), each through its own state; the batch norm
    folds in eval mode and stops its chain in training mode. Values and every gradient are the
    original's; strict=True refuses the model."""
    _pretend_auto_policy(monkeypatch, tmp_path)  # (timings all equal: auto keeps fused)
    # (every call on the checked path: the fast paths' launch needs a GPU)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)
    # (and a training decision timed through autograd: the direct backward launch needs one too)
    monkeypatch.setattr(fj, "_measure_training",
                        lambda self, st, spec, x, params, needs, backward:
                        fj._measure_training_autograd(self, st, spec, x,
                                                      [get(self) for get in st.getters]))
    specs = _record_chains(monkeypatch)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    torch.manual_seed(0)
    model = randomized(_TwoBlocks())
    _random_norm_stats(model)
    getattr(model, mode)()
    with pytest.raises(fj.Unsupported, match="MaxPool3d"):
        fj.fuse(model, strict=True)
    fast = fj.fuse(model, policy=policy)
    twin = copy.deepcopy(model)
    st = fj._mode_state(fast, fast.__dict__["_fusejit"])
    assert [s.tail for s in st.sub_states] == [
        " | conv3d(out=8,k=3,padding=1) | tanh" if mode == "eval" else
        " | conv3d(out=8,k=3,padding=1,bias=false)", " | conv3d(out=8,k=1)"]
    x = torch.randn(2, 3, 6, 6, 6)
    with torch.no_grad():
        assert torch.allclose(fast(x), twin(x), rtol=1e-5, atol=1e-6)
    assert len(set(specs)) == 3 and specs[-2].startswith("x:f32[2,8,3,3,3] | conv3d"), specs
    if policy == "auto":
        assert all(s.last_decision["decision"] == "fused" for s in st.sub_states)
    for a, b in zip(model.buffers(), twin.buffers()):
        assert torch.equal(a, b)
    g = torch.randn(2, 4)
    xg = torch.randn(2, 3, 6, 6, 7)  # (another shape: the checked paths)
    got, want = _grads(model, fast, xg, g), _grads(twin, twin, xg, g)
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name


def test_folded_batch_norms_are_computed_again_after_training_calls(monkeypatch):
    """A batch norm's training-mode forward updates its running statistics in place without
    bumping their versions; its num_batches_tracked counts the update, so the eval calls after
    it fold the new statistics (kept in between). The counter (int64) is not a parameter the
    call's dtype checks see."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_why_not", lambda x, named: next(
        ("%s is %s" % (n, p.dtype) for n, p in named if p.dtype != x.dtype), None))
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    torch.manual_seed(0)
    model = randomized(nn.Sequential(nn.Conv3d(3, 8, 3, bias=False), nn.BatchNorm3d(8),
                                     nn.ReLU()))
    _random_norm_stats(model)
    fast = fj.fuse(model, policy="fused")
    shapes = iter([(1, 3, 4, 5, 5 + i) for i in range(10)])  # (new shapes: the checked path)

    def check():  # (the folded convolution rounds apart from conv-then-normalize: 1e-4)
        x = torch.randn(*next(shapes))
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)

    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a fallback warns)
        check()
    st = fast.__dict__["_fusejit"]
    assert st.fold_cache is not None and st.folds_cacheable
    model.train()
    with torch.no_grad():
        fast(torch.randn(*next(shapes)))  # the batch norm updates its statistics
    model.eval()
    check()
    check()


class _BatchNormFirst(nn.Module):
    """Nothing to fuse at the start (a batch norm first, a grouped convolution), then chains."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm3d(3)
        self.grouped = nn.Conv3d(3, 6, 1, groups=3)
        self.conv, self.gn = nn.Conv3d(6, 8, 3, padding=1), nn.GroupNorm(2, 8)

    def forward(self, x):
        return F.silu(self.gn(self.conv(self.grouped(self.bn(x))))).mean([2, 3, 4])


def test_a_forward_with_nothing_to_fuse_at_its_start_fuses_its_chains(monkeypatch):
    """A forward whose first op is outside the grammar is all rest: its chains (from a
    convolution) run fused, in eval and in training mode; values and gradients are the
    original's; explain says so; strict=True refuses it."""
    _pretend_cuda(monkeypatch)
    specs = _record_chains(monkeypatch)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    with pytest.raises(fj.Unsupported, match="bn"):
        fj.fuse(_BatchNormFirst(), strict=True)
    torch.manual_seed(0)
    model = randomized(_BatchNormFirst())
    _random_norm_stats(model)
    fast = fj.fuse(model, policy="fused")
    assert fj.is_fused(fast)
    st = fast.__dict__["_fusejit"]
    assert st.chainless and [s.tail for s in st.sub_states] == [
        " | conv3d(out=8,k=3,padding=1) | group_norm(groups=2,eps=1e-5) | swish | "
        "mean(dims=[2,3,4])"], [s.tail for s in st.sub_states]
    assert "no chain at the start of forward" in fj.explain(fast, torch.randn(1, 3, 4, 4, 4))
    for i, mode in enumerate(["eval", "train"]):
        getattr(model, mode)()
        twin = copy.deepcopy(model)
        x = torch.randn(2, 3, 4, 5, 6 + i)
        with torch.no_grad():
            assert torch.allclose(fast(x), twin(x), rtol=1e-5, atol=1e-6)
        g = torch.randn(2, 8)
        xg = torch.randn(2, 3, 4, 5, 8 + i)
        got, want = _grads(model, fast, xg, g), _grads(twin, twin, xg, g)
        for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (mode, name)
    assert len(specs) == 4 and all("conv3d(out=8" in s for s in specs), specs


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("seed", range(16))
def test_random_networks_through_the_drop_in(monkeypatch, seed, mode):
    """Random multi-block networks (tests/python/random_nets.py): the drop-in (policy fused, not
    strict) gives the original's output, running statistics and every gradient, its chains run
    as PyTorch's evaluation of the chain here (_pretend_cuda), so what is checked is how the
    model is cut into chains and the rest."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    torch.manual_seed(seed)
    model = random_nets.randomize(random_nets.RandomNet(seed), seed)
    getattr(model, mode)()
    twin = copy.deepcopy(model)
    fast = fj.fuse(model, policy="fused")
    assert fj.is_fused(fast), fast.__dict__["_fusejit"].unsupported
    x = torch.randn(*model.shape)

    def seeded(fn):  # (training mode: the same dropout masks, drawn by the rest's PyTorch ops)
        def run(*args):
            torch.manual_seed(seed + 1)
            return fn(*args)
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a fallback to the original warns)
        with torch.no_grad():
            assert torch.allclose(seeded(fast)(x), seeded(twin)(x), rtol=1e-4, atol=1e-5)
        for a, b in zip(model.buffers(), twin.buffers()):
            assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
        g = torch.randn(twin(x).shape)
        got, want = _grads(model, seeded(fast), x, g), _grads(twin, seeded(twin), x, g)
    # (a convolution's bias before a norm has gradient 0 but for rounding: the tolerance is
    # the largest gradient's)
    scale = max(float(b.abs().max()) for b in want if b is not None)
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale), name


def test_copies_of_a_model_with_chains_in_the_rest_run_their_own_tensors(monkeypatch):
    """copy.deepcopy and pickle of a fused model whose rest has chains: the copy's chains (first
    and later) read the copy's own modules; changing the copy leaves the original's results."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    torch.manual_seed(0)
    model = randomized(_TwoBlocks()).eval()
    _random_norm_stats(model)
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(2, 3, 6, 6, 6)
    with torch.no_grad():
        before = fast(x)
        for copied in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
            st = copied.__dict__["_fusejit"]
            assert len(st.sub_states) == 2
            copied.c2.weight.mul_(2.0)
            copied.bn.running_var.mul_(3.0)
            plain = copy.deepcopy(model)
            plain.load_state_dict(copied.state_dict())
            assert torch.allclose(copied(x), plain(x), rtol=1e-5, atol=1e-6)
            assert not torch.allclose(copied(x), before, rtol=1e-3, atol=1e-3)
            assert torch.equal(fast(x), before)


class _FunctionalDropout(nn.Module):
    """F.dropout(x, p, self.training): torch.fx bakes self.training into the traced code."""

    def __init__(self):
        super().__init__()
        self.conv, self.gn = nn.Conv3d(3, 8, 3, padding=1), nn.GroupNorm(2, 8)

    def forward(self, x):
        x = F.dropout(torch.relu(self.gn(self.conv(x))), 0.5, self.training)
        return torch.tanh(x) * 2.0 if self.training else torch.tanh(x)


def test_a_forward_reading_self_training_is_traced_in_each_mode(monkeypatch):
    """A forward whose traced code depends on the mode (functional dropout with self.training,
    `if self.training`) gets a graph per mode, each traced in it: in eval mode the whole chain
    (dropout skipped), in training mode the chain stopping at the dropout, whichever mode the
    model was fused in; the model's modes are left as they were; strict=True refuses it (its
    training-mode forward is not one chain)."""
    _pretend_cuda(monkeypatch)
    specs = _record_chains(monkeypatch)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    assert fj._recognize_module().forward_reads_training(_FunctionalDropout())
    assert not fj._recognize_module().forward_reads_training(_TwoBlocks())
    for fused_in in ("train", "eval"):
        torch.manual_seed(0)
        model = getattr(randomized(_FunctionalDropout()), fused_in)()
        modes = [m.training for m in model.modules()]
        fast = fj.fuse(model, policy="fused")
        assert [m.training for m in model.modules()] == modes
        x = torch.randn(2, 3, 4, 5, 6)
        with torch.no_grad():
            fast.eval(), model.eval()
            assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
            assert specs[-1].endswith("| relu | tanh"), specs
            fast.train(), model.train()
            torch.manual_seed(1)
            y = fast(x)
            torch.manual_seed(1)
            assert torch.allclose(y, model(x), rtol=1e-5, atol=1e-6)
            # (the ops after the dropout: a chain of their own in the rest)
            assert specs[-2].endswith("| relu") and specs[-1].endswith("| tanh | mul(by=2)"), \
                specs
    with pytest.raises(fj.Unsupported, match="dropout"):
        fj.fuse(_FunctionalDropout().eval(), strict=True)


class _TracesInEvalOnly(nn.Module):
    """Its training-mode forward cannot be traced (a branch on a tensor's value)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        if self.training and x.sum() > 0:
            x = x * 2
        return x


def test_a_forward_traceable_in_one_mode_runs_the_original_in_the_other(monkeypatch):
    """Traced in eval mode only: eval calls fused, training-mode calls the original (with a
    warning), not the eval graph."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_call_op", lambda spec, x, params: _chain.eager(fj._ops(spec), x,
                                                                              params))
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    torch.manual_seed(0)
    model = randomized(_TracesInEvalOnly())
    assert fj._recognize_module().forward_reads_training(model)
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(1, 3, 5, 5, 5)
    fast.eval(), model.eval()
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
    fast.train(), model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
    assert any("fusejit runs the original" in str(w.message) for w in caught)


class _Attributes(nn.Module):
    """forward reads plain attributes (a factor, a list) and a submodule: the trace bakes them in."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.scaling_factor = 2.0
        self.act = nn.ReLU()
        self.limits = [0.5]

    def forward(self, x):
        return torch.clamp(self.act(self.conv(x) * self.scaling_factor), max=self.limits[0])


@pytest.mark.parametrize("made_by", ["fuse", "fused"])
def test_a_changed_attribute_or_submodule_recognizes_forward_again(monkeypatch, made_by):
    """Setting an attribute forward reads, changing a list it reads in place, replacing a
    submodule or a convolution's padding after fuse(): the next call runs the chain with the new
    value (it ran the old one), warning once per change; calls with nothing changed recognize
    nothing (the same state)."""
    _pretend_cuda(monkeypatch)
    specs = _record_chains(monkeypatch)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (no _launch here)
    torch.manual_seed(0)
    if made_by == "fuse":
        model = randomized(_Attributes()).eval()
        fast = fj.fuse(model, policy="fused").eval()
    else:
        fast = randomized(fj.fused(_Attributes, policy="fused")()).eval()
        model = _Attributes().eval()
        model.load_state_dict(fast.state_dict())
    x = torch.randn(2, 3, 6, 6, 6)
    changes = [
        ("scaling_factor", lambda m: setattr(m, "scaling_factor", 3.0), "mul(by=3)"),
        ("act", lambda m: setattr(m, "act", nn.Tanh()), "| tanh |"),
        ("limits", lambda m: m.limits.__setitem__(0, 0.25), "clamp(max=0.25)"),
        ("padding", lambda m: setattr(m.conv, "padding", (1, 1, 1)), "padding=1"),
    ]
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
        st = fast.__dict__["_fusejit"]
        fast(x)
        assert fast.__dict__["_fusejit"] is st  # nothing changed: nothing recognized
        for name, change, needle in changes:
            change(fast)
            if name != "padding" or model.conv is not fast.conv:  # (fuse: conv shared)
                change(model)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y = fast(x)
                fast(x)
            assert torch.allclose(y, model(x), rtol=1e-5, atol=1e-6), name
            assert needle in specs[-1], (name, specs[-1])
            said = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
            assert len(said) == 1 and "'%s'" % name in said[0], (name, said)


class _BiasThenActs(nn.Module):
    """A per-channel bias after the nonlinearity (the chain stops there), a group_norm chain
    after it (starting with a multiply by a number), and two ops on the Linear head's 2-D
    output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(8, 1, 1, 1))
        self.gn = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv(x)) + self.bias
        x = torch.sigmoid(F.gelu(self.gn(x * 0.5))).mean([2, 3, 4])
        return torch.tanh(torch.relu(self.fc(x)))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_ops_after_a_stop_run_as_a_chain_of_their_own(monkeypatch, mode):
    """In the rest of forward a run of ops without a convolution (a group_norm, or two ops or
    more) is a chain of its own: fused where its value is 5-D, the model's own code where it is
    not (the head's 2-D relu | tanh: its rank is known only at run time). Values and every
    gradient are the original's."""
    _pretend_cuda(monkeypatch)
    specs = _record_chains(monkeypatch)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: object())
    monkeypatch.setattr(fj, "_backward", lambda spec, x, params, grad, needs:
                        fj._eager_backward(spec, x, params, grad, needs))
    torch.manual_seed(0)
    model = getattr(randomized(_BiasThenActs()), mode)()
    fast = fj.fuse(model, policy="fused")
    st = fast.__dict__["_fusejit"]
    assert st.tail == " | conv3d(out=8,k=3,padding=1) | relu", st.tail
    assert [s.tail for s in st.sub_states] == [
        " | mul(by=0.5) | group_norm(groups=2,eps=1e-5) | gelu | sigmoid | mean(dims=[2,3,4])",
        " | relu | tanh"]
    x = torch.randn(2, 3, 5, 6, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fallback warns: the 2-D chain runs its own code)
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-6)
        assert [s.split(" | ")[0] for s in specs] == ["x:f32[2,3,5,6,7]", "x:f32[2,8,5,6,7]"]
        g = torch.randn(2, 4)
        got, want = _grads(model, fast, x, g), _grads(model, model, x, g)
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name


def test_explain_says_why_when_compiling_fails_with_any_error(monkeypatch):
    """explain() answers with text where the compile raises PyTorch's own errors too (a PyTorch
    built without CUDA: AssertionError), not only fusejit's."""
    def no_cuda(spec, device):
        raise AssertionError("Torch not compiled with CUDA enabled")
    monkeypatch.setattr(fj, "_compiled_chain", no_cuda)
    fast = fj.fuse(nn.Sequential(nn.Conv3d(3, 4, 3), nn.ReLU()))
    text = fj.explain(fast, torch.randn(1, 3, 5, 5, 5))
    assert text.startswith("not fused: AssertionError: Torch not compiled with CUDA"), text


def test_a_rest_failing_after_a_batch_norm_leaves_its_statistics_as_one_call_does(monkeypatch):
    """A rest that fails after a training-mode batch norm in it ran: the running statistics it
    changed are put back before the original forward runs (which updates them once)."""
    _pretend_cuda(monkeypatch)
    monkeypatch.setattr(fj, "_fast_call_ok", lambda *a, **k: False)  # (its launch needs a GPU)
    torch.manual_seed(0)
    model = randomized(_BatchNormed())
    _random_norm_stats(model)
    twin = copy.deepcopy(model)
    fast = fj.fuse(model, policy="fused")
    st = fast.__dict__["_fusejit"].training_state
    real = st.rest

    def fails_late(module, y, x):
        real(module, y, x)  # (the batch norm updates its statistics)
        raise RuntimeError("simulated")
    st.rest = fails_late
    x = torch.randn(2, 3, 5, 6, 7)
    with warnings.catch_warnings(record=True), torch.no_grad():
        warnings.simplefilter("always")
        assert torch.allclose(fast(x), twin(x), rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(model.named_buffers(), twin.buffers()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", sorted(kb_style_models.MODELS))
def test_kernelbench_style_models_through_the_drop_in(monkeypatch, name, mode):
    """KernelBench-style models (kb_style_models.py) cut into chains and the rest as on the GPU,
    the chains run as PyTorch's evaluation of their spec in float64, rounded to the model's dtype
    (_pretend_exact): kb_style_models.check on the CPU. (In fp32 the check measured PyTorch's CPU
    kernels against fusejit's tolerance instead of the drop-in: on torch 2.11 a scale folded into
    a transposed convolution's weight got its gradient from the CPU's fp32 weight gradient, 10x
    less accurate than on torch 1.13 and than fusejit's kernels, which the GPU test checks.)"""
    _pretend_with_the_autograd_function(monkeypatch)  # (the fast path's launch needs a GPU)
    kb_style_models.check(fj, name, mode, "cpu")


@pytest.mark.parametrize("case", ["norm constants", "folded batch norm"])
def test_a_call_under_inference_mode_leaves_training_working(monkeypatch, case):
    """What the drop-in keeps between calls (group_norm's weight 1 and bias 0, process-wide;
    folded parameters) is made of normal tensors even under torch.inference_mode (Lightning
    validates under it before training): a later call's backward saves them."""
    _pretend_with_the_autograd_function(monkeypatch)
    torch.manual_seed(0)
    if case == "norm constants":
        model = nn.Sequential(nn.Conv3d(3, 8, 3), nn.InstanceNorm3d(8), nn.Tanh())
    else:
        model = nn.Sequential(nn.Conv3d(3, 8, 3), nn.BatchNorm3d(8)).eval().requires_grad_(False)
    randomized(model)
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    x = torch.randn(2, 3, 6, 6, 6)
    with torch.inference_mode():
        assert torch.allclose(fast.eval()(x), model.eval()(x), atol=1e-5)
    if case == "norm constants":
        fast.train(), model.train()
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    for m, xi in zip((fast, model), xs):
        (m(xi) * torch.linspace(-1, 1, 4 ** 3 * 16).reshape(2, 8, 4, 4, 4)).sum().backward()
    assert torch.allclose(xs[0].grad, xs[1].grad, atol=1e-5)


def test_a_forward_assigning_to_its_module_runs_the_original(monkeypatch):
    """A forward that assigns to module attributes (a call counter, a feature kept for a loss)
    has effects the fused chain would not have: the original runs, with the reason; tracing
    leaves the attributes as they were."""
    _pretend_exact(monkeypatch)

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 8, 3)
            self.calls, self.feat = 0, None

        def forward(self, x):
            self.calls += 1
            x = self.conv(x)
            self.feat = x
            return torch.relu(x)

    model = Counting()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = fj.fuse(model, policy="fused")
        assert model.calls == 0 and model.feat is None  # (tracing ran forward once)
        y = fast(torch.randn(2, 3, 6, 6, 6))
    assert fast.calls == 1 and torch.equal(fast.feat.relu(), y)
    msg = fast.__dict__["_fusejit"].unsupported
    assert "assigns to attribute 'calls' of the model and attribute 'feat'" in msg, msg
    assert any("assigns to" in str(w.message) for w in caught)
    with pytest.raises(fj.Unsupported, match="assigns to"):
        fj.fuse(Counting(), strict=True)


def test_a_folded_factor_replaced_by_another_shape_runs_the_original(monkeypatch):
    """A per-channel factor replaced by a tensor of the same size but another shape ([1,1,1,1,C]
    broadcasts along W): the fold would apply it per channel; the original runs instead."""
    _pretend_exact(monkeypatch)

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 8, 3)
            self.scale = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)

        def forward(self, x):
            return torch.tanh(self.conv(x) * self.scale)

    fast = fj.fuse(Scaled().eval(), policy="fused")
    x = torch.randn(2, 3, 10, 10, 10)  # W = 8 = C
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast(x)
        fast.scale = nn.Parameter(torch.rand(1, 1, 1, 1, 8) + 0.5)
        got, want = fast(x), Scaled.forward(fast, x)
    assert torch.equal(got, want)
    assert any("has shape [1, 1, 1, 1, 8]" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]


def test_a_changed_dict_attribute_recognizes_forward_again(monkeypatch):
    """Numbers read from a dict attribute (self.cfg["scale"]) are baked into the chain like
    plain attributes: a change recognizes forward again."""
    _pretend_exact(monkeypatch)

    class Configured(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 8, 3)
            self.cfg = {"slope": 0.2, "scale": 2.0}

        def forward(self, x):
            return F.leaky_relu(self.conv(x), self.cfg["slope"]) * self.cfg["scale"]

    fast = fj.fuse(Configured().eval(), policy="fused")
    x = torch.randn(2, 3, 6, 6, 6)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast(x)
        fast.cfg["scale"] = -1.0
        got, want = fast(x), Configured.forward(fast, x)
    assert torch.allclose(got, want, atol=1e-6)
    assert "mul(by=-1)" in fast.__dict__["_fusejit"].tail


def test_a_forward_with_default_arguments_fuses_calls_that_leave_them(monkeypatch):
    """forward(self, x, scale=2.0) is traced with its defaults: calls with x alone run fused,
    calls giving the argument run the original (the chain has the default baked in)."""
    _pretend_exact(monkeypatch)
    ran = []
    run = fj._run
    monkeypatch.setattr(fj, "_run", lambda spec, x, params: ran.append(spec) or run(spec, x, params))

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 8, 3)

        def forward(self, x, scale=2.0, act=None):
            x = self.conv(x) * scale
            return x if act is None else act(x)

    model = randomized(Scaled()).eval()
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    assert fast.__dict__["_fusejit"].unsupported is None
    x = torch.randn(2, 3, 6, 6, 6)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.allclose(fast(x), model(x), rtol=1e-5, atol=1e-5) and len(ran) == 1
        assert ran[0].endswith("conv3d(out=8,k=3) | mul(by=2)")
        assert torch.allclose(fast(x, 3.0), model(x, 3.0), atol=1e-6)
        assert torch.allclose(fast(x, act=torch.tanh), model(x, act=torch.tanh), atol=1e-6)
    assert len(ran) == 1


def test_a_chain_in_the_rest_whose_input_is_changed_after_it_is_left_to_pytorch(monkeypatch):
    """A chain of its own in the rest (tanh | mul) saves its input for the backward; the rest
    then changes that input in place (PyTorch's tanh saved its output instead): the ops stay
    PyTorch's, and the backward runs as the original's."""
    _pretend_with_the_autograd_function(monkeypatch)

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 8, 3, padding=1)

        def forward(self, x):
            z = F.max_pool3d(self.conv(x), 2)
            w = torch.tanh(z) * 2.0
            z.add_(1.0)
            return w + z

    torch.manual_seed(0)
    model = Pooled()
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    assert not fast.__dict__["_fusejit"].sub_states
    xs = [torch.randn(2, 3, 8, 8, 8).requires_grad_(True) for _ in range(2)]
    xs[1].data.copy_(xs[0].data)
    for m, x in zip((fast, model), xs):
        m(x).sum().backward()
    assert torch.allclose(xs[0].grad, xs[1].grad, rtol=1e-5, atol=1e-5)


def test_explain_says_when_an_input_runs_the_original():
    """explain() for an input the call would not fuse (an integer dtype, a non-contiguous view)
    says so and why, instead of showing a plan or a KeyError."""
    fast = fj.fuse(nn.Sequential(nn.Conv3d(3, 8, 3), nn.ReLU()))
    text = fj.explain(fast, torch.zeros(2, 3, 5, 5, 5, dtype=torch.long))
    assert text.startswith("not fused for this input") and "torch.int64" in text, text
    assert "float64" in text
    text = fj.explain(fast, torch.zeros(2, 3, 5, 5, 5).transpose(2, 4))
    assert "not contiguous" in text, text
