"""More usage: parametrizations, pruning, functional_call, saved-tensor hooks, ONNX/trace."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.parametrize as P
import torch.nn.utils.prune as prune

import fusejit.torch as fj
from gpu_pretend import fusejit_warnings
from usage_models import (ConvBN, ConvGN, ConvIN, ConvScale, PoolHead, close, grads, make, pair, same_grads,
                          tensors, x_of)

MODELS = [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead]


def sq(y):
    return sum(t.float().square().sum() for t in tensors(y))


class Sym(nn.Module):
    def forward(self, w):
        return w * 0.5 + 0.1


def _compare(orig, fast, mode, steps=2, tol=1e-4):
    getattr(orig, mode)(); getattr(fast, mode)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(steps):
            xa = x_of(seed=s).requires_grad_(True)
            xb = x_of(seed=s).requires_grad_(True)
            ya, yb = orig(xa), fast(xb)
            close(yb, ya, tol)
            sq(ya).backward(); sq(yb).backward()
            close(xb.grad, xa.grad, tol)
            same_grads(grads(fast), grads(orig), tol)
            orig.zero_grad(); fast.zero_grad()
            with torch.no_grad():
                close(fast(x_of(seed=s)), orig(x_of(seed=s)), tol)
    return fusejit_warnings(caught)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("when", ["before_fuse", "after_first_call"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_parametrization_on_conv_weight(gpu, cls, when, mode):
    orig = make(cls)
    P.register_parametrization(orig.conv, "weight", Sym())
    if when == "before_fuse":
        fast = fj.fuse(copy.deepcopy(orig))
    else:
        plain = make(cls)
        fast = fj.fuse(plain)
        with torch.no_grad():
            fast.eval()(x_of())
        P.register_parametrization(fast.conv, "weight", Sym())
    ours = _compare(orig, fast, mode)
    print(cls.__name__, when, mode, ours)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_prune_after_first_call(gpu, cls, mode):
    orig, fast = pair(cls)
    with torch.no_grad():
        fast.eval()(x_of()); orig.eval()(x_of())
    for m in (orig, fast):
        prune.l1_unstructured(m.conv, "weight", amount=0.5)
    ours = _compare(orig, fast, mode)
    for m in (orig, fast):
        prune.remove(m.conv, "weight")
    ours += _compare(orig, fast, mode)
    print(cls.__name__, mode, ours)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_weight_norm(gpu, cls, mode):
    orig, fast = pair(cls)
    with torch.no_grad():
        fast.eval()(x_of())
    for m in (orig, fast):
        torch.nn.utils.weight_norm(m.conv)
    _compare(orig, fast, mode)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_functional_call(gpu, cls, mode):
    """torch.func.functional_call (torch 2) / nn.utils.stateless.functional_call (1.13):
    parameters swapped for the call (MAML inner loops, model ensembling)."""
    fc = getattr(getattr(torch, "func", None), "functional_call", None) or \
        torch.nn.utils.stateless.functional_call
    orig, fast = pair(cls)
    getattr(orig, mode)(); getattr(fast, mode)()
    with torch.no_grad():
        fast(x_of()); fast(x_of())  # arm the fast paths
    res = []
    for m in (orig, fast):
        params = {k: (v.detach() * 1.5).requires_grad_(True) for k, v in m.named_parameters()}
        x = x_of(seed=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = fc(m, params, (x,))
            gs = torch.autograd.grad(sq(y), list(params.values()))
            with torch.no_grad():
                y2 = fc(m, {k: v.detach() * 0.5 for k, v in params.items()}, (x,))
                y3 = m(x)  # the module's own parameters again
        res.append((y.detach(), gs, y2, y3))
    for a, b in zip(res[1], res[0]):
        close(a, b, 1e-4)


@pytest.mark.parametrize("cls", MODELS)
def test_saved_tensors_hooks(gpu, cls):
    """activation offloading (save_on_cpu) / any saved_tensors_hooks around the first call."""
    orig, fast = pair(cls)
    res = []
    for m in (orig, fast):
        m.train()
        x = x_of().requires_grad_(True)
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (packed.append(1), t)[1],
                                                      lambda t: t):
            y = m(x)
        sq(y).backward()
        res.append((y.detach(), x.grad, grads(m)))
    close(res[1][0], res[0][0]); close(res[1][1], res[0][1], 1e-4)
    same_grads(res[1][2], res[0][2])


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, PoolHead])
def test_onnx_export(gpu, cls):
    """torch.onnx.export (the TorchScript-based exporter, torch 1.13's and dynamo=False in 2.x):
    the exported graph must take the input."""
    orig, fast = pair(cls)
    fast.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            text = torch.onnx.export_to_pretty_string(fast, (x_of(),))
        except Exception as e:
            pytest.xfail("error: %s: %s" % (type(e).__name__, str(e)[:150]))
        want = torch.onnx.export_to_pretty_string(orig.eval(), (x_of(),))
    assert "inputs: [{name" in text, "the exported graph takes no input"
    assert ('type: "Conv"' in text) == ('type: "Conv"' in want)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_bias_set_to_none_after_first_call(gpu, cls, mode):
    orig, fast = pair(cls)
    with torch.no_grad():
        fast.eval()(x_of()); fast(x_of())
    for m in (orig, fast):
        m.conv.bias = None
    _compare(orig, fast, mode)


@pytest.mark.parametrize("cls", [ConvGN, ConvBN])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_submodule_replaced_after_first_call(gpu, cls, mode):
    """model.conv = nn.Conv3d(...) (another kernel size), model.gn/bn = nn.Identity()."""
    orig, fast = pair(cls)
    with torch.no_grad():
        fast.eval()(x_of()); fast(x_of())
    for m in (orig, fast):
        torch.manual_seed(4)
        m.conv = nn.Conv3d(3, 8, 5, padding=2)
    _compare(orig, fast, mode)
    for m in (orig, fast):
        if cls is ConvGN:
            m.gn = nn.Identity()
        else:
            m.bn = nn.Identity()
    _compare(orig, fast, mode)
