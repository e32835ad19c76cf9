"""fusejit.torch on a GPU: the seed models and random modules through the drop-in against float64,
outputs NaN-poisoned before each run and two runs bitwise identical; the fused backward's
gradients against float64 autograd (NaN-poisoned too, bitwise stable), and the eager fallback for
chains without one; torch.compile (inference and training); CUDA graph capture and replay; two
threads on two streams; the auto policy for inference and training calls. Skipped (with the
reason) where torch has no CUDA device."""
import copy
import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit.torch as fj
import kb_style_models
import random_nets
from seed_models import SEEDS
from test_recognize import RandomChain, eager_backward_refusal

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to torch")


@pytest.fixture(autouse=True)
def poisoned_and_strict_fp32():
    fj._poison_outputs = True
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    fj._poison_outputs = False
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def randomized(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def f64(model):
    """A float64 copy of `model` (the original keeps its float32 storage: graphs hold pointers)."""
    return copy.deepcopy(model).double()


rel_err = kb_style_models.rel_err  # relative L2 error of a against b


def check_forward(model, x, rel=1e-5, atol=1e-5):
    """Fused (forced) output vs the float64 module, fully written, bitwise stable."""
    fast = fj.fuse(model, strict=True, policy="fused")
    with torch.no_grad():
        y1 = fast(x)
        y2 = fast(x)
        ref = f64(model)(x.double())
    assert not torch.isnan(y1).any(), "output not fully written (NaN poison survived)"
    assert torch.equal(y1, y2), "two runs differ"
    assert rel_err(y1, ref) <= rel, rel_err(y1, ref)
    assert torch.allclose(y1.double(), ref, rtol=atol, atol=atol)
    return fast


@pytest.mark.parametrize("wid", sorted(SEEDS))
@pytest.mark.parametrize("size", ["small", "seed"])
def test_seed_models_through_the_drop_in(wid, size):
    cls, init, shape, _, small = SEEDS[wid]
    ModelNew = fj.fused(cls, strict=True, policy="fused")
    torch.manual_seed(0)
    model = randomized(ModelNew(*init), seed=1).cuda()
    x = torch.rand(*(shape if size == "seed" else small), device="cuda")
    plain = randomized(cls(*init), seed=1).cuda().double()  # float64 through PyTorch's modules
    with torch.no_grad():
        y = model(x)
        ref = plain(x.double())
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) <= 1e-5
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(24))
def test_random_modules(seed):
    model = randomized(RandomChain(seed), seed).cuda()
    x = torch.randn(*model.shape, device="cuda")
    check_forward(model, x)


# ---- gradients -----------------------------------------------------------------------------------

class ConvReluNormMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.gn(torch.relu(self.conv(x))).mean(dim=[2, 3, 4])


class ConvTransposeStride2Gelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return F.gelu(self.up(x))


class GroupNormOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 8, eps=1e-3)

    def forward(self, x):
        return self.gn(x)


class WideOutputPadding(nn.Module):
    """conv_transpose3d with output_padding >= stride (dilation allows it): the data gradient is a
    conv3d on a grid larger than x, cropped."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 4, 3, stride=1, output_padding=1, dilation=2)

    def forward(self, x):
        return torch.relu(self.up(x))


# name -> (a new float32 module, input shape): the seeds at their small shapes and a few more
GRAD_CASES = dict(
    {wid: (lambda c=SEEDS[wid]: c[0](*c[1]), SEEDS[wid][4]) for wid in SEEDS},
    **{"conv3d-relu-gn-mean": (ConvReluNormMean, (2, 4, 6, 7, 8)),
       "convT-s2-gelu": (ConvTransposeStride2Gelu, (2, 4, 4, 5, 6)),
       "gn-only": (GroupNormOnly, (2, 8, 5, 6, 7)),
       "convT-wide-output-padding": (WideOutputPadding, (2, 4, 5, 5, 5))})


def check_gradients(model, shape, needs_x=True, fused_backward=True, seed=0):
    """The drop-in (policy fused) trained one step on loss = (y * g).sum(), random g: x.grad and
    every parameter's .grad against float64 autograd of a float64 copy (rel <= 1e-5, fully
    written: the gradients are NaN-poisoned before the run); which backward ran; two more
    backward runs of one graph bitwise identical."""
    ref = f64(model)
    fast = fj.fuse(model, strict=fused_backward, policy="fused")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, device="cuda", generator=gen).requires_grad_(needs_x)
    before = dict(fj._stats)
    y = fast(x)
    fn = y.grad_fn  # (through the view of a mean with keepdim=True)
    if type(fn).__name__ == "ViewBackward0":
        fn = fn.next_functions[0][0]
    assert "ChainFunction" in type(fn).__name__
    g = torch.randn(y.shape, device="cuda", generator=gen)
    (y * g).sum().backward()
    ran = "fused_backward" if fused_backward else "eager_backward"
    assert fj._stats[ran] == before[ran] + 1, (fj._stats, before)
    names = ["x"] + [n for n, _ in model.named_parameters()]
    got = [x.grad] + [p.grad for p in model.parameters()]
    xd = x.detach().double().requires_grad_(needs_x)
    (ref(xd) * g.double()).sum().backward()
    want = [xd.grad] + [p.grad for p in ref.parameters()]
    for name, a, b in zip(names, got, want):
        if name == "x" and not needs_x:
            assert a is None
            continue
        assert a is not None and not torch.isnan(a).any(), name + ": not written in full"
        # relative to the reference's norm, floored at 1e-3 of the upstream gradient's: a
        # gradient that is zero in exact arithmetic (a convolution bias before a group_norm of
        # one channel a group, e.g. InstanceNorm3d) holds only rounding noise in both
        err = float((a.double() - b).norm()) / max(float(b.norm()), 1e-3 * float(g.norm()))
        assert err <= 1e-5, (name, err)
    inputs = ([x] if needs_x else []) + list(model.parameters())
    y = fast(x)
    first = torch.autograd.grad(y, inputs, g, retain_graph=True)
    second = torch.autograd.grad(y, inputs, g)
    for a, b in zip(first, second):
        assert torch.equal(a, b), "two backward runs differ"


class ConvInstanceNormKeptMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.norm = nn.InstanceNorm3d(8)  # affine=False, no running statistics

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x))).mean(dim=[2, 3, 4], keepdim=True)


class ConvTInstanceNormAffine(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1)
        self.norm = nn.InstanceNorm3d(6, affine=True)

    def forward(self, x):
        return F.gelu(self.norm(self.up(x)))


class FunctionalNormAllMeanKept(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3)

    def forward(self, x):
        # (an op between the norm and the mean: the mean of normalized values alone is ~0)
        return torch.sigmoid(F.group_norm(torch.tanh(self.conv(x)), 4)).mean([1, 2, 3, 4],
                                                                             keepdim=True)


# name -> (a new float32 module, input shape): group_norm without weight and bias, instance norm,
# means keeping their dimensions (Recognized.norm_constants, Recognized.out_dims)
NORM_CASES = {
    "conv-instance-norm-kept-mean": (ConvInstanceNormKeptMean, (2, 4, 6, 7, 8)),
    "convT-instance-norm-affine": (ConvTInstanceNormAffine, (2, 4, 4, 5, 6)),
    "functional-norm-kept-mean": (FunctionalNormAllMeanKept, (3, 4, 7, 6, 5)),
    "norm-affine-false-pool": (lambda: nn.Sequential(nn.SiLU(), nn.GroupNorm(2, 8, affine=False),
                                                     nn.Hardswish(), nn.AdaptiveAvgPool3d(1)),
                               (2, 8, 5, 6, 7)),
}


@pytest.mark.parametrize("case", sorted(NORM_CASES))
def test_norms_without_affine_and_kept_means(case):
    """Forward (fused, strict) and gradients against float64 with the original's output shape; the
    state_dict is the original's (the constants are not parameters); bf16 runs fused too."""
    make, shape = NORM_CASES[case]
    torch.manual_seed(0)
    model = randomized(make(), seed=5).cuda()
    keys = list(model.state_dict())
    x = torch.randn(*shape, device="cuda")
    with torch.no_grad():
        want_shape = model(x).shape
    fast = check_forward(model, x)
    with torch.no_grad():
        assert fast(x).shape == want_shape
    assert list(fast.state_dict()) == keys
    check_gradients(model, shape)
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    f16 = fj.fuse(m16, strict=True, policy="fused")
    x16 = x.to(torch.bfloat16)
    with torch.no_grad():
        y = f16(x16)
        assert y.shape == want_shape and y.dtype == torch.bfloat16
        assert rel_err(y, f64(m16)(x16.double())) <= 1e-2


class ScaledConvNormMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.scale = 2.0

    def forward(self, x):
        x = torch.relu(self.conv(x) * self.scale)
        return (self.gn(x) + 0.5).mean(dim=[2, 3, 4])


class Scaled(nn.Module):
    def __init__(self, inner, c):
        super().__init__()
        self.inner, self.c = inner, c

    def forward(self, x):
        return self.inner(x) * self.c


class ConvTDividedNormScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 6, 3, stride=2)

    def forward(self, x):
        x = F.gelu(self.up(x) / 3)
        x = F.group_norm(x, 3)
        x *= -1.5
        return x - 0.25


# name -> (a new float32 module, input shape): constant multiplies, divides, adds and subtracts
SCALAR_CASES = {
    "scaled-conv-norm-mean": (ScaledConvNormMean, (2, 4, 6, 7, 8)),
    "convT-divided-norm-scaled": (ConvTDividedNormScaled, (2, 4, 4, 5, 6)),
    "few-in-convT-scaled": (lambda: Scaled(nn.Sequential(
        nn.ConvTranspose3d(3, 16, 3, stride=2, padding=1), nn.SiLU(), nn.GroupNorm(4, 16),
        nn.Hardswish()), 0.7), (2, 3, 5, 6, 7)),
}


@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_constant_arithmetic_runs_fused(case):
    """x * c, x / c, x + c, x - c as mul / add ops: forward (fused, strict) and gradients against
    float64."""
    make, shape = SCALAR_CASES[case]
    torch.manual_seed(0)
    model = randomized(make(), seed=6).cuda()
    fast = check_forward(model, torch.randn(*shape, device="cuda"))
    assert any(op.startswith(("mul(", "add(")) for op in fast.__dict__["_fusejit"].tail.split(" | "))
    check_gradients(model, shape)


class ChannelScaled(nn.Module):
    """KernelBench-style: a learnable per-channel scale and shift after the convolution (no
    bias of its own), a per-channel gain after the norm, smooth activations."""

    def __init__(self, transposed=False, act=F.mish):
        super().__init__()
        self.conv = (nn.ConvTranspose3d(4, 8, 3, stride=2, bias=False) if transposed
                     else nn.Conv3d(4, 8, 3, padding=1, bias=False))
        self.scale = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)
        self.shift = nn.Parameter(torch.randn(1, 8, 1, 1, 1))
        self.norm = nn.GroupNorm(2, 8)
        self.gain = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)
        self.act = act

    def forward(self, x):
        x = self.conv(x) * self.scale + self.shift
        x = self.norm(F.elu(x, 0.7))
        return self.act(self.gain - x / self.gain)


# name -> (a new float32 module, input shape): per-channel parameters folded, smooth activations
CHANNEL_CASES = {
    "conv-mish": (lambda: ChannelScaled(), (2, 4, 6, 7, 8)),
    "convT-softplus": (lambda: ChannelScaled(True, lambda x: F.softplus(x, 2.0, 1.0)),
                       (2, 4, 4, 5, 6)),
    "conv-selu-hardsigmoid": (lambda: ChannelScaled(False, lambda x: F.hardsigmoid(F.selu(x))),
                              (2, 4, 5, 6, 7)),
    "conv-gelu_tanh-softsign": (lambda: ChannelScaled(False, lambda x: F.softsign(
        F.gelu(x, approximate="tanh"))), (2, 4, 5, 6, 7)),
    "convT-celu-logsigmoid-tanhshrink": (lambda: ChannelScaled(True, lambda x: F.tanhshrink(
        F.logsigmoid(F.celu(x, 0.6)))), (2, 4, 4, 5, 6)),
}


@pytest.mark.parametrize("case", sorted(CHANNEL_CASES))
def test_per_channel_parameters_fold_and_smooth_activations(case):
    """Per-channel Parameter multiplies / adds right after the convolution and the group_norm
    are folded into their weight and bias, mish / softplus / elu / selu / hardsigmoid run as chain
    ops: the forward (fused, strict) and every gradient (scale, shift and gain included) against
    float64; the fast path serves the next calls, and a new value of a factor is seen."""
    make, shape = CHANNEL_CASES[case]
    torch.manual_seed(0)
    model = randomized(make(), seed=8).cuda()
    with torch.no_grad():  # keep the divisor away from zero
        model.gain.copy_(model.gain.abs() + 0.5)
    fast = check_forward(model, torch.randn(*shape, device="cuda"))
    st = fast.__dict__["_fusejit"]
    # (the group_norm is op 2: conv3d | elu | group_norm | ...)
    assert set(st.folds) == {"0.weight", "0.bias", "2.weight", "2.bias"}, st.folds
    check_gradients(model, shape)
    x = torch.randn(*shape, device="cuda")
    with torch.no_grad():
        fast(x)
        model.scale.mul_(2.0)  # in place: the next call computes the folded weight again
        y = fast(x)
        ref = f64(model)(x.double())
    assert rel_err(y, ref) <= 1e-5, rel_err(y, ref)


class PoolHead(nn.Module):
    """Goes on past the grammar: conv -> group_norm -> mish fused, max pool and Linear in PyTorch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(8 * 3 * 3 * 4, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(F.mish(self.gn(self.conv(x)))), 1))


class ResidualBlock(nn.Module):
    """conv -> group_norm -> relu fused; the shortcut and the sum read the input after it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.shortcut = nn.Conv3d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x))) + self.shortcut(x)


@pytest.mark.parametrize("policy", ["fused", "auto"])
@pytest.mark.parametrize("make", [PoolHead, ResidualBlock], ids=["pool-head", "residual"])
def test_partial_fusion(make, policy):
    """The fusable start of a forward fused, the rest run as PyTorch on its output (and the
    input): forward and every gradient (the rest's too) against float64, fully written (the
    chain's output is poisoned before its run), two runs bitwise equal."""
    torch.manual_seed(0)
    model = randomized(make(), seed=9).cuda()
    fast = fj.fuse(model, policy=policy)
    assert fast.__dict__["_fusejit"].rest is not None
    x = torch.randn(2, 4, 6, 6, 8, device="cuda")
    with torch.no_grad():
        y1, y2 = fast(x), fast(x)
        ref = f64(model)(x.double())
    assert not torch.isnan(y1).any() and torch.equal(y1, y2)
    assert rel_err(y1, ref) <= 1e-5, rel_err(y1, ref)
    xg = x.clone().requires_grad_(True)
    g = torch.randn(ref.shape, device="cuda")
    (fast(xg) * g).sum().backward()
    got = [xg.grad] + [p.grad for p in model.parameters()]
    ref_model = f64(model)
    xd = x.double().requires_grad_(True)
    (ref_model(xd) * g.double()).sum().backward()
    want = [xd.grad] + [p.grad for p in ref_model.parameters()]
    for name, a, b in zip(["x"] + [n for n, _ in model.named_parameters()], got, want):
        assert a is not None and not torch.isnan(a).any(), name
        assert rel_err(a, b) <= 1e-5, (name, rel_err(a, b))


def check_model(model, fast, x):
    """The drop-in `fast` of `model` against model's float64 copy on x: output (eval mode: two
    runs bitwise equal too), the running statistics the call leaves, and every gradient
    (NaN-poisoned: checked written; rel <= 1e-5, the norm floored at 1e-3 of the largest, or at
    most 4x strict fp32 PyTorch's error: a convolution's bias before a norm has gradient 0 but
    for rounding, which PyTorch's float32 shares). In training mode the
    model's dropout masks are drawn apart from the copy's, so only models without dropout."""
    model.zero_grad(set_to_none=True)
    ref = f64(model)
    if not model.training:
        with torch.no_grad():
            y1, y2 = fast(x), fast(x)
            want = ref(x.double())
        assert torch.equal(y1, y2) and rel_err(y1, want) <= 1e-5, rel_err(y1, want)
    xg = x.clone().requires_grad_(True)
    y = fast(xg)
    xd = x.double().requires_grad_(True)
    want = ref(xd)
    assert not torch.isnan(y).any() and rel_err(y, want) <= 1e-5, rel_err(y, want)
    for a, b in zip(model.buffers(), ref.buffers()):
        assert rel_err(a, b) <= 1e-5
    g = torch.randn(y.shape, device="cuda")
    (y * g).sum().backward()
    (want * g.double()).sum().backward()
    got = [xg.grad] + [p.grad for p in model.parameters()]
    wants = [xd.grad] + [p.grad for p in ref.parameters()]
    eager = copy.deepcopy(ref).float()  # strict fp32 PyTorch: the floor for rounding-only gradients
    xe = x.clone().requires_grad_(True)
    (eager(xe) * g).sum().backward()
    eagers = [xe.grad] + [p.grad for p in eager.parameters()]
    scale = max(float(b.norm()) for b in wants)
    for name, a, b, e in zip(["x"] + [n for n, _ in model.named_parameters()], got, wants, eagers):
        assert a is not None and not torch.isnan(a).any(), name
        err, eager_err = float((a - b).norm()), float((e.double() - b).norm())
        assert err <= max(1e-5 * max(float(b.norm()), 1e-3 * scale), 4 * eager_err), \
            (name, rel_err(a, b), err, eager_err)


class BatchNormed(nn.Module):
    """conv (no bias) -> BatchNorm3d -> act -> group_norm -> tanh, or a transposed conv -> batch
    norm -> gelu: in eval mode the batch norms fold into the convolution."""

    def __init__(self, transposed=False):
        super().__init__()
        self.transposed = transposed
        self.conv = (nn.ConvTranspose3d(4, 8, 3, stride=2, padding=1, bias=False) if transposed
                     else nn.Conv3d(4, 8, 3, padding=1, bias=False))
        self.bn = nn.BatchNorm3d(8)
        if not transposed:
            self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        x = self.bn(self.conv(x))
        return F.gelu(x) if self.transposed else torch.tanh(self.gn(F.silu(x)))


def _norm_stats(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.copy_(torch.randn(8, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(8, generator=g) + 0.5)
    return model


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "convT"])
def test_batch_norms_fold_in_eval_mode(transposed):
    """Eval mode: the batch norm folded into the convolution, forward (fused, strict) and every
    gradient (the batch norm's weight and bias too) against float64. Training mode: the chain
    stops before the batch norm, which runs as PyTorch: forward, gradients and the running
    statistics it leaves against float64."""
    torch.manual_seed(0)
    model = _norm_stats(randomized(BatchNormed(transposed), seed=10), 11).cuda().eval()
    shape = (2, 4, 5, 6, 7)
    fast = check_forward(model, torch.randn(*shape, device="cuda"))
    assert set(fast.__dict__["_fusejit"].folds) == {"0.weight", "0.bias"}
    check_gradients(model, shape)
    model.train()
    loose = fj.fuse(model, policy="fused")
    check_model(model, loose, torch.randn(*shape, device="cuda"))
    assert loose.__dict__["_fusejit"].training_state.rest is not None


class TwoBlocks(nn.Module):
    """Three chains: conv -> group_norm -> relu (the first), a max pool, then conv -> batch norm
    -> tanh and a 1x1 convolution shortcut (chains in the rest), summed, a Linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.g1, self.pool = nn.Conv3d(4, 8, 3, padding=1), nn.GroupNorm(2, 8), \
            nn.MaxPool3d(2)
        self.c2, self.bn = nn.Conv3d(8, 8, 3, padding=1, bias=False), nn.BatchNorm3d(8)
        self.c3 = nn.Conv3d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.g1(self.c1(x))))
        y = torch.tanh(self.bn(self.c2(x))) + self.c3(x)
        return self.fc(y.mean([2, 3, 4]))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_chains_in_the_rest_of_forward(mode):
    """The chains after the first run fused in the rest (their own states): forward and every
    gradient against float64, two runs bitwise equal; in training mode the batch norm runs as
    PyTorch and its running statistics match float64's."""
    torch.manual_seed(0)
    model = _norm_stats(randomized(TwoBlocks(), seed=12), 13).cuda()
    getattr(model, mode)()
    fast = fj.fuse(model, policy="fused")
    st = fj._mode_state(fast, fast.__dict__["_fusejit"])
    assert len(st.sub_states) == 2 and all(s.unsupported is None for s in st.sub_states)
    check_model(model, fast, torch.randn(2, 4, 6, 8, 10, device="cuda"))


class NormFirst(nn.Module):
    """Nothing to fuse at the start (a batch norm, a grouped 1x1 convolution), then a chain."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm3d(4)
        self.grouped = nn.Conv3d(4, 8, 1, groups=4)
        self.conv, self.gn = nn.Conv3d(8, 8, 3, padding=1), nn.GroupNorm(2, 8)

    def forward(self, x):
        return F.silu(self.gn(self.conv(self.grouped(self.bn(x))))).mean([2, 3, 4])


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_a_forward_with_nothing_to_fuse_at_its_start(mode):
    """Its chain (from the convolution on) runs fused in the rest: forward and every gradient
    against float64, two runs bitwise equal."""
    torch.manual_seed(0)
    model = randomized(NormFirst(), seed=14).cuda()
    with torch.no_grad():
        model.bn.running_var.copy_(torch.rand(4) + 0.5)
    getattr(model, mode)()
    fast = fj.fuse(model, policy="fused")
    st = fast.__dict__["_fusejit"]
    assert st.chainless and len(st.sub_states) == 1
    check_model(model, fast, torch.randn(2, 4, 6, 7, 8, device="cuda"))


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("seed", range(8))
def test_random_networks(seed, mode):
    """Random multi-block networks (random_nets.py) through the drop-in, policy fused: output,
    running statistics and every gradient against the float64 model (training mode: networks
    with dropout are checked in eval mode only -- their masks are PyTorch's, drawn apart)."""
    torch.manual_seed(seed)
    model = random_nets.randomize(random_nets.RandomNet(seed), seed).cuda()
    getattr(model, mode)()
    if mode == "train" and any(isinstance(m, nn.Dropout3d) for m in model.modules()):
        pytest.skip("dropout masks in training mode")
    fast = fj.fuse(model, policy="fused")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a fallback to the original warns)
        check_model(model, fast, torch.randn(*model.shape, device="cuda"))


def test_training_calls_save_the_convolution_output():
    """A training call of a chain with ops after its convolution runs the training forward (u
    saved) and the backward reading u (no recompute); one without a convolution recomputes
    nothing and runs the plain pair. Both match float64 autograd (check_gradients)."""
    for case, saves in (("W3", True), ("conv3d-relu-gn-mean", True), ("gn-only", False)):
        make, shape = GRAD_CASES[case]
        torch.manual_seed(0)
        before = fj._stats["saved_backward"]
        check_gradients(randomized(make(), seed=4).cuda(), shape)
        # check_gradients runs three backwards: the checked one and the two bitwise-compared
        assert fj._stats["saved_backward"] == before + (3 if saves else 0), (case, fj._stats)


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_fused_backward_matches_float64_autograd(case):
    make, shape = GRAD_CASES[case]
    torch.manual_seed(0)
    check_gradients(randomized(make(), seed=2).cuda(), shape)


def test_fused_backward_of_parameters_only():
    """x not requiring grad (a first layer): the parameters' gradients, x.grad left None."""
    make, shape = GRAD_CASES["W2"]
    check_gradients(randomized(make(), seed=3).cuda(), shape, needs_x=False)


@pytest.mark.parametrize("seed", range(12))
def test_random_modules_gradients(seed):
    model = randomized(RandomChain(seed), seed).cuda()
    st = fj.fuse(model).__dict__["_fusejit"]
    if st.training_fallback is not None:
        # hardtanh / relu6: their gradient at the bounds is not clamp's, so calls needing
        # gradients run the original (test_torch_cpu.py checks the values at the bounds).
        x = torch.randn(*model.shape, device="cuda", requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fj.FusejitWarning)
            y = fj.fuse(model, policy="fused")(x)
        assert "ChainFunction" not in type(y.grad_fn).__name__
        with torch.no_grad():  # calls without gradients run fused
            assert fj.fuse(model, policy="fused")(x).grad_fn is None
        return
    refusal = eager_backward_refusal(model, model.shape)
    if refusal is not None:
        pytest.skip("PyTorch's own backward refuses this model (no reference): " + refusal)
    spec = fj._spec(st, torch.empty(model.shape, device="cuda"))
    has_fused = fj._backward_or_why(spec, 0)[0] is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fj.FusejitWarning)  # chains without a fused backward
        check_gradients(model, model.shape, fused_backward=has_fused, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", ["nn.ReLU6", "nn.Hardtanh", "torch.clamp", "clamp(min=0)"])
def test_hardtanh_and_clamp_gradients_at_their_bounds(act, dtype):
    """nn.ReLU6 / nn.Hardtanh run fused as the grammar's hardtanh, forward and backward: at inputs
    exactly on a bound their gradient is 0 (PyTorch's hardtanh backward), torch.clamp's 1. A 1x1
    identity convolution passes x through exactly, so every third point sits on a bound. The
    drop-in's gradients equal PyTorch's own in the same dtype at the bounds (same 0/1 mask) and
    are within 1e-5 (f32) of float64 autograd. A clamp with only min=0 is the one-sided clamp
    (gradient 1 at 0, where relu's is 0; the points at 1 are inside)."""
    lo, hi, mod = {"nn.ReLU6": (0.0, 6.0, nn.ReLU6()),
                   "nn.Hardtanh": (-0.5, 0.5, nn.Hardtanh(-0.5, 0.5)),
                   "torch.clamp": (-0.5, 0.5, None),
                   "clamp(min=0)": (0.0, 1.0, None)}[act]

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(4, 4, 1, bias=False)
            self.act = mod
            self.gn = nn.GroupNorm(2, 4)

        def forward(self, x):
            x = self.conv(x)
            if self.act is not None:
                x = self.act(x)
            else:
                x = torch.clamp(x, lo, hi) if act == "torch.clamp" else x.clamp(min=0)
            return self.gn(x)

    model = randomized(M()).cuda()
    with torch.no_grad():
        model.conv.weight.copy_(torch.eye(4).reshape(4, 4, 1, 1, 1))
    model = model.to(dtype)
    st = fj.fuse(model).__dict__["_fusejit"]
    assert st.training_fallback is None
    assert ("hardtanh(min=%g,max=%g)" % (lo, hi) if act.startswith("nn.") else
            "clamp(min=0) |" if act == "clamp(min=0)" else "clamp(") in st.tail
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.rand(2, 4, 5, 6, 7, device="cuda", generator=gen) * (hi - lo) * 1.5 + lo - 0.25
    x.view(-1)[0::6] = lo
    x.view(-1)[3::6] = hi
    x = x.to(dtype).requires_grad_(True)
    g = torch.randn(2, 4, 5, 6, 7, device="cuda", generator=gen).to(dtype)
    fast = fj.fuse(model, strict=True, policy="fused")
    y = fast(x)
    assert "ChainFunction" in type(y.grad_fn).__name__
    (y.float() * g.float()).sum().backward()
    got = x.grad.clone()
    x.grad = None
    (model(x).float() * g.float()).sum().backward()
    want = x.grad.clone()
    on = torch.zeros_like(got, dtype=torch.bool)
    on.view(-1)[0::6] = True
    on.view(-1)[3::6] = True
    inside = not act.startswith("nn.")
    assert bool((got[on] != 0).all()) == inside and bool((want[on] != 0).all()) == inside
    if dtype == torch.float32:
        xd = x.detach().double().requires_grad_(True)
        (f64(model)(xd) * g.double()).sum().backward()
        assert rel_err(got, xd.grad) <= 1e-5, rel_err(got, xd.grad)


def test_a_chain_without_fused_backward(monkeypatch):
    """auto: training calls run the original forward; fused: the fused forward with the eager
    backward (strict fp32); a warning says why, once each. (Every f32 chain has a fused backward:
    the library's refusal is simulated, as for an f64 chain.)"""
    def refuse(spec, device):
        raise fj._lib.FusejitError(12, "no backward plan (simulated: output_padding)")
    monkeypatch.setattr(fj, "_compiled_backward", refuse)
    monkeypatch.setattr(fj, "_backward_warned", set())
    model = randomized(WideOutputPadding()).cuda()
    shape = (2, 4, 5, 5, 5)
    x = torch.randn(*shape, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = fj.fuse(model)
        y = auto(x)
        auto(x)
        assert "ChainFunction" not in type(y.grad_fn).__name__
        check_gradients(model, shape, fused_backward=False)
    msgs = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(msgs) == 2, msgs
    assert all("output_padding" in m for m in msgs), msgs
    assert "original forward" in msgs[0] and "strict fp32" in msgs[1], msgs
    with pytest.raises(fj.Unsupported, match="output_padding"):
        fj.fuse(model, strict=True, policy="fused")(x)


def test_torch_compile_trains_with_the_fused_backward():
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init), seed=4).cuda()
    ref = f64(model)
    compiled = torch.compile(fj.fuse(model, strict=True, policy="fused"), fullgraph=True)
    x = torch.randn(*small, device="cuda", requires_grad=True)
    before = fj._stats["fused_backward"]
    y = compiled(x)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    assert fj._stats["fused_backward"] == before + 1
    xd = x.detach().double().requires_grad_(True)
    (ref(xd) * g.double()).sum().backward()
    for a, b in zip([x.grad] + [p.grad for p in model.parameters()],
                    [xd.grad] + [p.grad for p in ref.parameters()]):
        assert rel_err(a, b) <= 1e-5, rel_err(a, b)


def test_torch_compile_keeps_the_fused_op():
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model, strict=True, policy="fused")
    x = torch.randn(*small, device="cuda")
    compiled = torch.compile(fast, fullgraph=True)  # fullgraph: a graph break is an error
    with torch.no_grad():
        y = compiled(x)
        ref = f64(model)(x.double())
    assert rel_err(y, ref) <= 1e-5
    explanation = torch._dynamo.explain(fast)(x)
    assert explanation.graph_break_count == 0
    assert "fusejit.chain" in str(explanation.graphs[0].graph) or "fusejit" in str(
        explanation.graphs[0].code)


def test_cuda_graph_capture_and_replay():
    cls, init, _, _, small = SEEDS["W2"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model, strict=True, policy="fused")
    static_x = torch.randn(*small, device="cuda")
    with torch.no_grad():
        fast(static_x)  # compile and load before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = fast(static_x)
        reference = f64(model)
        for seed in range(3):
            static_x.copy_(torch.randn(*small, device="cuda", generator=torch.Generator(
                device="cuda").manual_seed(seed)))
            graph.replay()
            torch.cuda.synchronize()
            ref = reference(static_x.double())
            assert rel_err(static_y, ref) <= 1e-5


def test_two_threads_on_two_streams():
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model, strict=True, policy="fused")
    xs = [torch.randn(*small, device="cuda") for _ in range(2)]
    with torch.no_grad():
        refs = [f64(model)(x.double()) for x in xs]
    results, errors = [None, None], []

    def work(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(20):
                    results[i] = fast(xs[i])
            stream.synchronize()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for y, ref in zip(results, refs):
        assert rel_err(y, ref) <= 1e-5


class SmallGridWideConv(torch.nn.Module):
    """200 channels on an 8^3 grid (the sweep's K9): fusejit's fp32-accurate tc-conv, 2x slower
    than cuDNN's TF32 here (H100, 2026-11-26: 0.20 against 0.10 ms)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(200, 200, 3, padding=1)
        self.gn = torch.nn.GroupNorm(8, 200)

    def forward(self, x):
        return self.gn(self.conv(x))


def test_auto_policy_picks_the_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")  # decide afresh, not from a stored decision
    monkeypatch.setattr(fj, "_store", None)
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default, as users run it
    # K9's chain, where cuDNN's TF32 and fusejit's fp32-accurate plan are close (0.08-0.45 ms
    # against 0.15-0.20 over runs on the H100): the decision follows the measured times.
    slow = fj.fuse(randomized(SmallGridWideConv()).cuda())
    x = torch.randn(4, 200, 8, 8, 8, device="cuda")
    with torch.no_grad():
        slow(x)
    d = slow.__dict__["_fusejit"].last_decision
    assert d["decision"] == ("fused" if d["fused_ms"] <= d["eager_ms"] else "eager"), d

    # The same chain with the original forward measured faster (the fused time measured first,
    # then the eager one): the policy keeps the original.
    times = iter([0.2, 0.1])
    monkeypatch.setattr(fj, "_median_ms", lambda fn, reps: (fn(), next(times))[1])
    monkeypatch.setattr(fj, "_store", None)  # not the decision the first module stored
    slow = fj.fuse(randomized(SmallGridWideConv()).cuda())
    with torch.no_grad():
        slow(x)
    d = slow.__dict__["_fusejit"].last_decision
    assert d["decision"] == "eager", d
    assert d["eager_ms"] < d["fused_ms"]
    monkeypatch.undo()
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")
    monkeypatch.setattr(fj, "_store", None)

    cls, init, shape, _, _ = SEEDS["W4"]
    fast = fj.fuse(randomized(cls(*init)).cuda())
    x = torch.rand(*shape, device="cuda")
    with torch.no_grad():
        fast(x)
    d = fast.__dict__["_fusejit"].last_decision
    assert d["decision"] == "fused", d
    assert d["fused_ms"] < d["eager_ms"]


def test_fallbacks_on_the_gpu_warn_once():
    cls, init, _, _, small = SEEDS["W1"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(*small, device="cuda").transpose(3, 4)  # not contiguous
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        y = fast(x)
        fast(x)
    msgs = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(msgs) == 1 and "not contiguous" in msgs[0]
    with torch.no_grad():  # the original forward ran (cuDNN's convT may differ in the last bit)
        assert torch.allclose(y, model(x), rtol=1e-5, atol=1e-6)


def test_parameter_changes_are_seen_by_later_calls():
    cls, init, _, _, small = SEEDS["W2"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model, strict=True, policy="fused")
    x = torch.randn(*small, device="cuda")
    with torch.no_grad():
        fast(x)
        fast(x)  # the fast path from here
        model.conv.weight = torch.nn.Parameter(model.conv.weight * 2)  # a new tensor
        model.group_norm.bias.add_(1.0)  # in place
        y = fast(x)
        ref = f64(model)(x.double())
    assert rel_err(y, ref) <= 1e-5
    y = fast(x)  # with grad after no-grad calls: the autograd path
    y.sum().backward()
    assert model.conv.weight.grad is not None and x.grad is None


def test_auto_policy_decides_training_steps_apart(monkeypatch):
    """A training call is timed as a step (fused forward + backward against the original forward +
    autograd), nothing accumulated into .grad by the timing, its decision followed and kept apart
    from the inference decision."""
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")  # decide afresh, not from a stored decision
    monkeypatch.setattr(fj, "_store", None)
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default, as users run it
    cls, init, shape, _, _ = SEEDS["W4"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model)  # policy auto, training mode
    st = fast.__dict__["_fusejit"]
    x = torch.rand(*shape, device="cuda")
    before = fj._stats["fused_backward"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", fj.FusejitWarning)  # no disagreement
        y = fast(x)
    d = st.last_decision
    print("training decision:", d)
    assert d["pass"] == "train" and d["spec"].startswith("x:f32[128,3,24,32,32]")
    assert (d["decision"] == "fused") == (d["fused_ms"] <= d["eager_ms"]), d
    assert all(p.grad is None for p in model.parameters())
    fused = "ChainFunction" in type(y.grad_fn).__name__
    assert fused == (d["decision"] == "fused")
    y.sum().backward()
    assert fj._stats["fused_backward"] == before + fused
    assert not st.ready  # the fast path waits for an inference decision
    fast(x)  # decided: no new measurement
    assert st.last_decision is d
    with torch.no_grad():
        fast(x)
    assert st.last_decision["pass"] == "inference" and st.ready
    print("inference decision:", st.last_decision)


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_auto_policy_training_agreement_at_seed_shapes(wid, monkeypatch):
    """The training measurement finds the fused step and the original's in agreement (its
    reference is strict fp32, so TF32 in the timed original raises no false alarm, as it would in
    W3's weight gradient)."""
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")
    monkeypatch.setattr(fj, "_store", None)
    torch.backends.cudnn.allow_tf32 = True
    cls, init, shape, _, _ = SEEDS[wid]
    fast = fj.fuse(randomized(cls(*init)).cuda())
    with warnings.catch_warnings():
        warnings.simplefilter("error", fj.FusejitWarning)
        fast(torch.rand(*shape, device="cuda"))
    d = fast.__dict__["_fusejit"].last_decision
    print(wid, "training step:", d)
    assert d["pass"] == "train" and (d["decision"] == "fused") == (d["fused_ms"] <= d["eager_ms"])


class ConvGeluNorm(nn.Module):
    """A chain whose training forward saves u (ops after the convolution)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(4, 8)

    def forward(self, x):
        return self.gn(F.gelu(self.conv(x)))


@pytest.mark.parametrize("make,channels",
                         [(ConvGeluNorm, 4), (GroupNormOnly, 8), (ConvTransposeStride2Gelu, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_fast_path_gives_the_checked_calls_results(make, channels, dtype):
    """The second training call of a shape, parameters and gradient mask takes the training fast
    path; its output and gradients are bitwise the first (checked) call's. A new gradient mask, a
    replaced parameter, a submodule hook, eval mode or autocast send the call back to the checked
    path (counted by _stats["fast_training"])."""
    model = randomized(make(), seed=3).cuda().to(dtype)
    fast = fj.fuse(model, strict=True, policy="fused")
    x = torch.rand(2, channels, 6, 7, 5, device="cuda").to(dtype).requires_grad_(True)
    torch.manual_seed(1)
    gy = torch.randn(fast(x).shape, device="cuda").to(dtype)

    def step():
        x.grad = None
        for p in fast.parameters():
            p.grad = None
        y = fast(x)
        y.backward(gy)
        return [y.detach()] + [t.grad.clone() for t in [x] + list(fast.parameters())]

    count = lambda: fj._stats["fast_training"]  # noqa: E731
    before = count()
    first = step()  # (the call that computed gy was checked: this one is fast already)
    assert count() == before + 1
    second = step()
    assert count() == before + 2
    for a, b in zip(first, second):
        assert not torch.isnan(a).any() and torch.equal(a, b)
    # another gradient mask: checked once, then fast
    x.requires_grad_(False)
    fast(x).backward(gy)
    assert count() == before + 2
    fast(x).backward(gy)
    assert count() == before + 3
    x.requires_grad_(True)
    # a replaced parameter: checked again
    name, p = next(iter(fast.named_parameters()))
    mod_name, _, leaf = name.rpartition(".")
    setattr(fast.get_submodule(mod_name), leaf, nn.Parameter(p.detach().clone()))
    again = step()
    assert count() == before + 3
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    step()
    assert count() == before + 4
    # a hook on a submodule: the original forward runs (and calls it)
    sub = [m for m in fast.modules() if m is not fast][0]
    calls = []
    h = sub.register_forward_hook(lambda *a: calls.append(1))
    try:  # (this module is strict: it refuses, a non-strict one runs the original)
        with pytest.raises(fj.Unsupported):
            fast(x)
    finally:
        h.remove()
    assert count() == before + 4 and not calls
    # eval mode with gradients: the checked path
    fast.eval()
    fast(x).backward(gy)
    assert count() == before + 4
    fast.train()
    step()
    assert count() == before + 5



@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", sorted(kb_style_models.MODELS))
def test_kernelbench_style_models(name, mode):
    """KernelBench-style models through the drop-in on the GPU: kb_style_models.check."""
    kb_style_models.check(fj, name, mode, "cuda")
