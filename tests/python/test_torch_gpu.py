"""fusejit.torch on a GPU: the seed models and random modules through the drop-in against float64,
outputs NaN-poisoned before each run and two runs bitwise identical; gradients against float64
autograd; torch.compile; CUDA graph capture and replay; two threads on two streams; the auto
policy. Skipped (with the reason) where torch has no CUDA device."""
import copy
import threading
import warnings

import pytest
import torch

import fusejit.torch as fj
from seed_models import SEEDS
from test_recognize import RandomChain

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


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-300))


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


@pytest.mark.parametrize("wid", sorted(SEEDS))
def test_gradients_match_float64_autograd(wid):
    cls, init, _, _, small = SEEDS[wid]
    model = randomized(cls(*init), seed=2).cuda()
    fast = fj.fuse(model, strict=True, policy="fused")
    x = torch.randn(*small, device="cuda", requires_grad=True)
    y = fast(x)
    g = torch.randn_like(y)
    y.backward(g)
    grads = [x.grad] + [p.grad for p in model.parameters()]
    ref_model = randomized(cls(*init), seed=2).cuda().double()
    xd = x.detach().double().requires_grad_(True)
    ref_model(xd).backward(g.double())
    refs = [xd.grad] + [p.grad for p in ref_model.parameters()]
    for got, want in zip(grads, refs):
        assert got is not None and not torch.isnan(got).any()
        assert rel_err(got, want) <= 1e-5, rel_err(got, want)


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


class BigConvRelu(torch.nn.Module):
    """Many channels and padding: fusejit's generic strategy, far slower than cuDNN here."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(32, 64, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_auto_policy_picks_the_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEJIT_DISABLE_TUNING", "1")  # decide afresh, not from a stored decision
    monkeypatch.setattr(fj, "_store", None)
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default, as users run it
    slow = fj.fuse(randomized(BigConvRelu()).cuda())
    x = torch.randn(8, 32, 24, 24, 24, device="cuda")
    with torch.no_grad():
        slow(x)
    d = slow.__dict__["_fusejit"].last_decision
    assert d["decision"] == "eager", d
    assert d["eager_ms"] < d["fused_ms"]

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
    xb = torch.randn(*small, device="cuda", dtype=torch.bfloat16)
    model_b = randomized(cls(*init)).cuda().to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        fj.fuse(model_b, policy="fused")(xb)
    msgs = [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
    assert len(msgs) == 1 and "bf16" in msgs[0], msgs


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


def test_auto_policy_trains_with_the_original_forward():
    """Until the fused backward exists, a training step is fastest as eager's own."""
    cls, init, _, _, small = SEEDS["W4"]
    model = randomized(cls(*init)).cuda()
    fast = fj.fuse(model)  # policy auto, training mode
    x = torch.randn(*small, device="cuda")
    y = fast(x)  # grad mode on, parameters require grad: the original forward
    assert "ChainFunction" not in type(y.grad_fn).__name__
    assert not fast.__dict__["_fusejit"].ready
    fast.eval()
    y = fast(x)  # eval mode: fused, with the recompute backward
    assert "ChainFunction" in type(y.grad_fn).__name__
    with torch.no_grad():
        fast.train()
        assert fast(x).grad_fn is None and fast.__dict__["_fusejit"].ready
