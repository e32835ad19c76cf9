"""bfloat16 and float16 models through fusejit.torch on a GPU (model.to(dtype), as users write
it): outputs and gradients in the model's dtype, NaN-poisoned before each run, two runs bitwise
identical, and their error against a float64 copy of the same (dtype-valued) parameters and input
no larger than PyTorch's own module's in that dtype, on the same inputs. Skipped without CUDA."""
import copy
import warnings

import pytest
import torch

import fusejit.torch as fj
import kb_style_models
from seed_models import SEEDS
from test_recognize import RandomChain, eager_backward_refusal
from test_torch_gpu import randomized, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to torch")

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# Unit roundoff: a tensor rounded once to the dtype is off by at most this (relative L2).
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@pytest.fixture(autouse=True)
def poisoned():
    fj._poison_outputs = True
    yield
    fj._poison_outputs = False


def check_dtype(model32, shape, dtype, seed=0, grads=True):
    """model32 (float32, CUDA) as `dtype`: fused forward (and backward) vs PyTorch's module in
    that dtype, both against float64 evaluation of the same dtype-valued parameters and input."""
    model = copy.deepcopy(model32).to(dtype)
    ref = copy.deepcopy(model).double()  # the dtype's values, exactly, in float64
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    fast = fj.fuse(model, strict=True, policy="fused")
    with torch.no_grad():
        y1 = fast(x)
        y2 = fast(x)
        want = ref(x.double())
        torch_y = model(x)
    assert y1.dtype == dtype
    assert not torch.isnan(y1).any(), "output not fully written (NaN poison survived)"
    assert torch.equal(y1, y2), "two runs differ"
    ours, theirs = rel_err(y1, want), rel_err(torch_y, want)
    assert ours <= max(1.1 * theirs, UNIT[dtype]), ("forward", ours, theirs)
    if not grads:
        return
    g = torch.randn(want.shape, device="cuda", generator=gen).to(dtype)
    xg = x.clone().requires_grad_(True)
    before = fj._stats["fused_backward"]
    (fast(xg).float() * g.float()).sum().backward()
    assert fj._stats["fused_backward"] == before + 1
    got = [xg.grad] + [p.grad for p in model.parameters()]
    xd = x.double().requires_grad_(True)
    (ref(xd) * g.double()).sum().backward()
    want_g = [xd.grad] + [p.grad for p in ref.parameters()]
    plain = copy.deepcopy(model)  # PyTorch's own backward in the dtype
    xp = x.clone().requires_grad_(True)
    (plain(xp).float() * g.float()).sum().backward()
    theirs_g = [xp.grad] + [p.grad for p in plain.parameters()]
    names = ["x"] + [n for n, _ in model.named_parameters()]
    # A per-channel factor folded into a weight (x * P after the convolution or group_norm) gets
    # its gradient from the chain's gradient of that weight, itself rounded to the dtype: two
    # roundings where PyTorch's has one, so up to two units.
    st = fast.__dict__["_fusejit"]
    factors = {step[1] for f in st.folds.values() for step in f.steps}
    for name, a, b, t in zip(names, got, want_g, theirs_g):
        assert a.dtype == dtype and not torch.isnan(a).any(), name + ": not written in full"
        ours, theirs = rel_err(a, b), rel_err(t, b)
        unit = UNIT[dtype] * (2 if name in factors else 1)
        assert ours <= max(1.1 * theirs, unit), (name, ours, theirs)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_seed_models_in_low_precision(wid, dtype):
    cls, init, _, _, small = SEEDS[wid]
    check_dtype(randomized(cls(*init)).cuda(), small, DTYPES[dtype])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("seed", range(10))
def test_random_modules_in_low_precision(seed, dtype):
    model = randomized(RandomChain(seed), seed).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fj.FusejitWarning)
        st = fj.fuse(model).__dict__["_fusejit"]
        spec = fj._spec(st, torch.empty(model.shape, device="cuda"))
    # A chain whose gradients run the original forward (training_fallback: clamp(min=0) as
    # relu, hardtanh) is checked forward only: check_dtype's strict fuse would refuse it.
    # ... and so is one whose PyTorch backward refuses an in-place op (no reference gradient).
    grads = st.training_fallback is None and fj._backward_or_why(spec, 0)[0] is not None and \
        eager_backward_refusal(model, model.shape) is None
    check_dtype(model, model.shape, DTYPES[dtype], seed=seed, grads=grads)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", ["X_SumDims234", "X_SumConvTKept", "X_SumMixedWithMeans"])
def test_sums_in_low_precision(name, dtype):
    """A sum is the chain's mean times the count, multiplied in the dtype: one rounding more
    than PyTorch's sum, within the tolerance of check_dtype."""
    cls, args = kb_style_models.MODELS[name]
    shape = kb_style_models.inputs_for(name)[0]
    check_dtype(randomized(cls(*args)).cuda(), shape, DTYPES[dtype])


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_float64_models_run_fused_in_double(wid):
    """model.double(): the fused forward (generic plans, double arithmetic) within 1e-12 of the
    float64 module evaluated on the CPU (PyTorch 2.11's CUDA float64 hardswish is itself off by
    3e-8: it is not the reference); the backward falls back to PyTorch's with one warning."""
    cls, init, _, _, small = SEEDS[wid]
    model = randomized(cls(*init)).cuda().double()
    x = torch.randn(*small, device="cuda", dtype=torch.float64)
    fast = fj.fuse(copy.deepcopy(model), strict=True, policy="fused")
    with torch.no_grad():
        y1, y2 = fast(x), fast(x)
        want = copy.deepcopy(model).cpu()(x.cpu()).cuda()
    assert y1.dtype == torch.float64 and not torch.isnan(y1).any() and torch.equal(y1, y2)
    assert rel_err(y1, want) <= 1e-12, rel_err(y1, want)
    lenient = fj.fuse(copy.deepcopy(model), policy="fused")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lenient(x.clone().requires_grad_(True)).sum().backward()
    msgs = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(msgs) == 1 and "f64" in msgs[0], msgs


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", ["W1", "W2", "W3", "W4", "conv-relu", "gn-only",
                                  "conv-instance-norm", "conv-instance-norm-affine"])
def test_autocast(case, dtype):
    """Under torch.autocast: the output dtype autocast gives, fully written, bitwise stable, and
    an error against float64 (of the float32 model on the float32 input) no larger than 1.1x
    autocast's own (or one rounding of the output); gradients reach the float32 parameters."""
    import torch.nn as nn
    D = DTYPES[dtype]
    if case in SEEDS:
        cls, init, _, _, small = SEEDS[case]
        model, shape = randomized(cls(*init)).cuda(), small
    elif case == "conv-relu":
        model = randomized(nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.ReLU())).cuda()
        shape = (2, 4, 8, 8, 8)
    elif case.startswith("conv-instance-norm"):  # (not on autocast's float32 list: output D)
        model = randomized(nn.Sequential(nn.Conv3d(4, 8, 3), nn.InstanceNorm3d(
            8, affine=case.endswith("affine")), nn.GELU())).cuda()
        shape = (2, 4, 7, 8, 6)
    else:
        model = randomized(nn.Sequential(nn.GroupNorm(2, 6), nn.SiLU())).cuda()
        shape = (2, 6, 5, 6, 7)
    x = torch.randn(shape, device="cuda")
    ref = copy.deepcopy(model).double()
    fast = fj.fuse(copy.deepcopy(model), strict=True, policy="fused")
    before = fj._stats["autocast"]
    with torch.no_grad():
        want = ref(x.double())
        with torch.autocast("cuda", dtype=D):
            y1, y2 = fast(x), fast(x)
            theirs = model(x)
    assert fj._stats["autocast"] == before + 2
    assert y1.dtype == theirs.dtype, (y1.dtype, theirs.dtype)
    assert not torch.isnan(y1).any() and torch.equal(y1, y2)
    ours, them = rel_err(y1, want), rel_err(theirs, want)
    assert ours <= max(1.1 * them, UNIT[D]), (ours, them)
    # training under autocast: gradients of the float32 parameters, float32
    with torch.autocast("cuda", dtype=D):
        loss = fast(x).float().square().sum()
    loss.backward()
    for p in fast.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32
        assert not torch.isnan(p.grad).any()


def _fused_closer_but_outside_the_bound(dt, seed):
    """(model, x) of a chain whose PyTorch 16-bit gradients and fusejit's differ beyond the auto
    policy's agreement bound while fusejit's are the closer to float64 (for this seed), or None."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, output_padding=1),
        torch.nn.Hardswish()).cuda()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    model = model.to(dt)
    x = (torch.randn(3, 8, 5, 5, 5, device="cuda") * 2).to(dt)
    g = torch.randn(3, 6, 10, 10, 10, device="cuda").to(dt)
    ref = copy.deepcopy(model).double()
    xd = x.double().requires_grad_(True)
    ref(xd).backward(g.double())
    want = [xd.grad] + [p.grad for p in ref.parameters()]
    plain = copy.deepcopy(model)
    xe = x.clone().requires_grad_(True)
    plain(xe).backward(g)
    theirs = [xe.grad] + [p.grad for p in plain.parameters()]
    forced = fj.fuse(copy.deepcopy(model), policy="fused")
    xf = x.clone().requires_grad_(True)
    forced(xf).backward(g)
    ours = [xf.grad] + [p.grad for p in forced.parameters()]
    outside = not all(fj._max_diff(a, b)[1] for a, b in zip(ours, theirs))
    closer = max(map(rel_err, ours, want)) < max(map(rel_err, theirs, want))
    return (model, x) if outside and closer else None


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_auto_policy_training_check_is_not_fooled_by_16bit_rounding(dtype, monkeypatch):
    """The auto policy's training check compares the fused gradients with the chain's evaluated in
    float32, not with PyTorch's 16-bit backward, which can be further from float64 than the check's
    bound allows. On a chain and values where PyTorch's gradients and fusejit's differ beyond that
    bound, fusejit's being the closer to float64 (the first of 12 seeds where they do; none is a
    failure), the check raises no warning and the decision follows the timings."""
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")  # decide afresh, not from a stored decision
    monkeypatch.setattr(fj, "_store", None)
    found = None
    for seed in range(12):
        found = _fused_closer_but_outside_the_bound(DTYPES[dtype], seed)
        if found is not None:
            break
    assert found is not None, "no seed gives gradients outside the bound: the premise is not met"
    model, x = found
    fast = fj.fuse(model)  # policy auto, training mode
    with warnings.catch_warnings():
        warnings.simplefilter("error", fj.FusejitWarning)  # no disagreement
        fast(x)
    d = fast.__dict__["_fusejit"].last_decision
    print(dtype, "seed", seed, "training decision:", d)
    assert d["pass"] == "train" and (d["decision"] == "fused") == (d["fused_ms"] <= d["eager_ms"])
