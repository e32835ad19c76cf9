"""The thirty-eighth session's survey (a new user's convolution variants, dtypes, normalizations and tails): each model
compared with its fused twin under the pretend GPU, outputs and gradients."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit.torch as fj
from gpu_pretend import CALLS, fusejit_warnings
from usage_models import close, grads, make, same_grads, tensors, x_of


def run(m, x, grad, mode):
    getattr(m, mode)()
    xi = x.detach().clone().requires_grad_(grad) if x.is_floating_point() else x.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.set_grad_enabled(grad):
                y = m(xi)
                if grad:
                    sum(t.float().square().sum() for t in tensors(y)).backward()
            return (y, xi.grad if grad else None, grads(m)), None, fusejit_warnings(caught)
        except Exception as e:
            return None, e, fusejit_warnings(caught)


def check(cls, x, grad=False, mode="eval", tol=1e-4, args=(), seed=0, dtype=None, fmt=None,
          calls=1):
    """orig vs fuse(deepcopy(orig)); returns (fast, fusejit warnings)."""
    orig = make(cls, seed, *args)
    if dtype is not None:
        orig.to(dtype)
    if fmt is not None:
        orig = orig.to(memory_format=fmt)
    fast = fj.fuse(copy.deepcopy(orig))
    ours = []
    for _ in range(calls):
        orig.zero_grad(); fast.zero_grad()
        ra, ea, _ = run(orig, x, grad, mode)
        rb, eb, w = run(fast, x, grad, mode)
        ours += w
        assert (ea is None) == (eb is None), (repr(ea)[:300], repr(eb)[:300])
        if ea is not None:
            assert type(ea) is type(eb), (repr(ea)[:300], repr(eb)[:300])
            continue
        (ya, ga, pa), (yb, gb, pb) = ra, rb
        close(yb, ya, tol)
        if grad:
            close(gb, ga, tol)
            same_grads(pb, pa, tol)
        # the model state (buffers) unchanged alike
        for (n, a), (_, b) in zip(orig.named_buffers(), fast.named_buffers()):
            assert a.shape == b.shape and a.dtype == b.dtype, n
            assert torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5), n
    return fast, ours


# ---- in-place first ops ------------------------------------------------------------------------

class PreActResidual(nn.Module):
    """a pre-activation residual block with an in-place activation first: eager's `+ x` reads
    the activated input (the activation changed x)."""
    def __init__(self):
        super().__init__()
        self.act = nn.LeakyReLU(0.1, inplace=True)
        self.gn = nn.GroupNorm(1, 3)
        self.conv = nn.Conv3d(3, 3, 3, padding=1)

    def forward(self, x):
        out = self.conv(self.gn(self.act(x)))
        return out + x


class InPlaceFirstChain(nn.Module):
    """a chain that starts with an in-place activation of the model's input"""
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(1, 3)

    def forward(self, x):
        return self.gn(F.leaky_relu(x, 0.2, inplace=True))


class ConvBNReLUInplacePool(nn.Module):
    """the common classifier tail: conv, batch norm, nn.ReLU(inplace=True), global pool"""
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8),
                                  nn.ReLU(inplace=True), nn.AdaptiveAvgPool3d(1), nn.Flatten())

    def forward(self, x):
        return self.body(x)


class PoolConvLeakyInplaceResidual(nn.Module):
    """a chain in the rest (leaky_relu | group_norm) starting with an in-place activation of a
    value the rest reads again (`+ y`: eager adds the activated y)"""
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool3d(2)
        self.conv = nn.Conv3d(3, 3, 3, padding=1)
        self.gn = nn.GroupNorm(1, 3)

    def forward(self, x):
        y = self.conv(self.pool(x))
        a = self.gn(F.leaky_relu(y, 0.2, inplace=True))
        return a + y


def _params_grad_step(m, x):
    """a training step where x needs no gradient (the usual one): output, parameter grads"""
    m.train(); m.zero_grad()
    y = m(x)
    y.square().sum().backward()
    return y.detach(), grads(m)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("cls", [PreActResidual, PoolConvLeakyInplaceResidual])
def test_inplace_first_op_input_read_by_rest(gpu, mode, cls):
    orig = make(cls)
    fast = fj.fuse(copy.deepcopy(orig))
    for seed in (1, 2):
        if mode == "eval":
            orig.eval(); fast.eval()
            with torch.no_grad():
                ya, yb = orig(x_of(seed=seed)), fast(x_of(seed=seed))
            close(yb, ya)
        else:
            (ya, ga), (yb, gb) = (_params_grad_step(orig, x_of(seed=seed)),
                                  _params_grad_step(fast, x_of(seed=seed)))
            close(yb, ya)
            same_grads(gb, ga)


def test_inplace_first_op_first_call(gpu):
    """the auto policy's first call times the original forward: it must not apply the in-place
    activation to the caller's tensor again and again (the fused chain then reads that)."""
    orig = make(InPlaceFirstChain).eval()
    fast = fj.fuse(copy.deepcopy(orig)).eval()
    for seed in (1, 2, 3):
        xa, xb = x_of(seed=seed), x_of(seed=seed)
        with torch.no_grad():
            ya, yb = orig(xa), fast(xb)
        close(yb, ya)
        # the caller's tensor: unchanged (the fused chain) or activated once (eager), no more
        assert torch.equal(xb, x_of(seed=seed)) or torch.equal(xb, xa)


def test_conv_bn_relu_inplace_pool_training(gpu):
    orig = make(ConvBNReLUInplacePool)
    fast = fj.fuse(copy.deepcopy(orig))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in (1, 2, 3):
            x = x_of(seed=seed)
            (ya, ga), (yb, gb) = _params_grad_step(orig, x), _params_grad_step(fast, x.clone())
            close(yb, ya)
            same_grads(gb, ga)
            for (n, a), (_, b) in zip(orig.named_buffers(), fast.named_buffers()):
                assert torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5), n
    assert not fusejit_warnings(caught)
    assert "not fused" not in fj.explain(fast, x_of())


# ---- lazy modules ------------------------------------------------------------------------------

class LazyConvGN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv3d(8, 3)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x)))


@pytest.mark.parametrize("grad", [False, True])
def test_lazy_conv_first_calls(gpu, grad):
    """nn.LazyConv3d: the first call materializes its weight (the original runs), later calls
    run fused -- without a warning that a chain 'had the old value' of in_channels (there was
    no chain)."""
    torch.manual_seed(0)
    orig = LazyConvGN()
    fast = fj.fuse(copy.deepcopy(orig))
    mode = "train" if grad else "eval"
    ours = []
    for i in range(3):
        orig.zero_grad(); fast.zero_grad()
        ra, ea, _ = run(orig, x_of(seed=i), grad, mode)
        rb, eb, w = run(fast, x_of(seed=i), grad, mode)
        ours += w
        assert ea is None and eb is None, (ea, eb)
        if i == 0:  # (the two materialized their weights from different draws)
            fast.load_state_dict(orig.state_dict())
            continue
        close(rb[0], ra[0])
        if grad:
            close(rb[1], ra[1], 1e-4)
            same_grads(rb[2], ra[2])
    assert not [w for w in ours if "again" in w], ours
    assert len(ours) <= 1, ours
    assert fj.explain(fast, x_of()).startswith("chain:")


# ---- sums in training --------------------------------------------------------------------------

class ConvTTanhSumKeep(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(3, 8, 2, stride=2)

    def forward(self, x):
        return torch.tanh(self.conv(x)).sum((-1, -2, -3), keepdim=True)


class ConvGNSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.gn = nn.GroupNorm(4, 8)

    def forward(self, x):
        return F.silu(self.gn(self.conv(x))).sum(dim=[1, 2, 3, 4])


@pytest.mark.parametrize("cls", [ConvTTanhSumKeep, ConvGNSum])
def test_sum_training_step_check(gpu, cls):
    """a training call of a model ending in a sum: the auto policy's check compares the fused
    backward of the chain's mean with PyTorch's of the sum -- the same upstream gradient must
    reach both (the chain's times the count), or every such model 'differs' and runs eager."""
    fast, ours = check(cls, x_of(), grad=True, mode="train", calls=2)
    assert not ours, ours
    assert CALLS["backward"] > 0  # the fused backward ran


# ---- a first call with NaN or inf in its input -------------------------------------------------

@pytest.mark.parametrize("cls", [ConvGNSum, ConvBNReLUInplacePool])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_first_input(gpu, cls, grad, bad):
    """The auto policy decides on the first call of each shape; where that call's input has a
    NaN or an inf (a corrupt volume, a diverging step), the fused and the original results have
    the same non-finite values. They agree: the decision (stored for every later call and other
    processes) must not become "eager" with a warning that they differ "by 0"."""
    orig = make(cls)
    fast = fj.fuse(copy.deepcopy(orig))
    x = x_of()
    x[0, 0, 0, 0, 0] = bad
    orig.train(grad); fast.train(grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.set_grad_enabled(grad):
            ya, yb = orig(x.clone()), fast(x.clone())
    assert torch.equal(ya.isnan(), yb.isnan())
    assert not fusejit_warnings(caught), fusejit_warnings(caught)
    decided = fast.__dict__["_fusejit"]
    decided = (decided.training_state or decided) if grad else decided
    assert set(decided.decided.values()) == {"fused"}, decided.decided
