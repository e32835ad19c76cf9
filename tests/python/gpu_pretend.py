"""A pretend GPU for the drop-in's usage tests (tests/python/test_usage_*.py, from the
thirty-seventh session's usage survey): closer to a GPU than test_torch_cpu's pretend. The
fixtures `gpu` and `gpu_nosaved` (conftest.py makes them available) install it.

What differs from the repo's pretend (which patches _why_not and _shape_mismatch to "fine" and
turns the fast paths off):
- _why_not is the real check except "not a CUDA device" (CPU tensors count as CUDA ones): 4-D,
  integer, non-contiguous and misaligned inputs take the real fallbacks.
- _compiled_chain / _compiled_backward compile the real chain for sm_90 (codegen only, cached):
  real signatures (so _shape_mismatch is real) and real refusals (no f64 backward plan, ...).
- the kernels (_run, _launch, _launch_training, _launch_backward) evaluate the chain as PyTorch
  in float64 rounded to the chain's dtype, after checking the contract a kernel relies on
  (it reads raw pointers): x and every parameter contiguous, of the chain's dtype and of the
  signature's shape. A violation is recorded (KERNEL_VIOLATIONS) and fails the test at teardown
  (on a GPU it would be a silent wrong result or a read past the end).
- the fast paths are on: _launch resolves its pointers back to the tensors the call just passed
  (_fast_call_ok and _chain_params are wrapped to register them).
- _training_pair gives a pair (training forward saving u + backward reading it) for chains with
  ops after a convolution, as the library does where saving pays: the saved-u autograd path runs.
- the auto policy's timing is pretended (all 1 ms: fused wins), its store under tmp_path.
"""

import pytest
import torch

import fusejit
import fusejit.torch as fj
from fusejit import _chain, _lib, _policy

KERNEL_VIOLATIONS = []
CALLS = {"run": 0, "launch": 0, "training_forward": 0, "backward": 0}
_COMPILED = {}
_REGISTRY = {}


class FakeSaved(object):
    def __init__(self, spec, backward):
        self.spec, self.backward = spec, backward


def _compile(spec, backward):
    key = (spec, backward)
    c = _COMPILED.get(key)
    if c is None:
        try:
            c = fusejit.Chain(spec, arch="sm_90", backward=backward)
        except _lib.FusejitError as e:
            if e.code not in fj._REFUSALS:
                raise
            c = e
        _COMPILED[key] = c
    if isinstance(c, Exception):
        raise c
    return c


def _violate(msg):
    KERNEL_VIOLATIONS.append(msg)


def _check_contract(spec, x, params, where):
    chain = _compile(spec, False)
    sig = chain.signature
    if tuple(x.shape) != tuple(sig[0].shape):
        _violate("%s: x shape %s, signature %s" % (where, tuple(x.shape), sig[0].shape))
    for t, s, name in [(x, sig[0], "x")] + [(p, sig[1 + i], sig[1 + i].name)
                                            for i, p in enumerate(params)]:
        if not t.is_contiguous():
            _violate("%s: %s not contiguous" % (where, name))
        if t.dtype != x.dtype:
            _violate("%s: %s is %s, x %s" % (where, name, t.dtype, x.dtype))
        if tuple(t.shape) != tuple(s.shape):
            _violate("%s: %s shape %s, signature %s" % (where, name, tuple(t.shape), s.shape))
        if t.device != x.device:
            _violate("%s: %s on %s" % (where, name, t.device))
    n = sum(1 for s in sig if s.role == _lib.ROLE_PARAM)
    if n != len(params):
        _violate("%s: %d params, signature %d" % (where, len(params), n))
    return chain


def _eval(spec, x, params):
    return _chain.eager(fj._ops(spec), x.double(), [p.double() for p in params]).to(x.dtype)


class _Untraced(object):
    """What a kernel launch is to torch.jit's tracer: invisible (ctypes)."""

    def __enter__(self):
        self.state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)

    def __exit__(self, *exc):
        torch._C._set_tracing_state(self.state)
        return False


def _run(spec, x, params):
    """the fused forward: its output allocated as fusejit allocates it (torch.empty, which the
    jit tracer records), then written by an invisible 'kernel'."""
    CALLS["run"] += 1
    _check_contract(spec, x, params, "_run")
    with _Untraced(), torch.no_grad():
        value = _eval(spec, x, params)
    y = fj._new_output(value.shape, x.dtype, x.device)
    with _Untraced(), torch.no_grad():
        y.copy_(value)
    return y


def _launch(chain, x, ptrs):
    CALLS["launch"] += 1
    tensors = []
    for p in ptrs:
        t = _REGISTRY.get(p)
        if t is None:
            _violate("_launch: pointer not registered")
            raise RuntimeError("pretend _launch: unknown pointer")
        tensors.append(t)
    if tensors[0] is not x:
        _violate("_launch: x pointer is not x")
    spec = chain.spec
    with torch.no_grad():
        return _run(spec, x, tensors[1:])


def _register(ts):
    for t in ts:
        if torch.is_tensor(t):
            _REGISTRY[t.data_ptr()] = t


def _grads_eager(spec, x, params, grad):
    gx, gps = fj._eager_backward(spec, x.double(), [p.double() for p in params], grad.double(),
                                 [True] * (1 + len(params)))
    return gx.to(x.dtype), [g.to(p.dtype) for g, p in zip(gps, params)]


def _launch_backward(chain, x, params, grad, saved=None):
    spec = chain.spec
    CALLS["backward"] += 1
    _check_contract(spec, x, params, "_launch_backward")
    if not grad.is_contiguous() or grad.dtype != x.dtype:
        _violate("_launch_backward: grad %s contiguous=%s" % (grad.dtype, grad.is_contiguous()))
    if isinstance(chain, FakeSaved) and not saved:
        _violate("_launch_backward: saved backward without saved tensors")
    return _grads_eager(spec, x, params, grad)


def _launch_training(fwd, x, params):
    CALLS["training_forward"] += 1
    y = _run(fwd.spec, x, params)
    with torch.no_grad():
        u = torch.zeros(3, dtype=torch.float32)  # stands for the convolution's output
    return y, [u]


def _training_pair(spec, device):
    if fj._backward_or_why(spec, device)[0] is None:
        return None
    ops = [name for name, _ in fj._ops(spec)]
    if ops[0] in ("conv3d", "conv_transpose3d") and len(ops) > 1:
        return FakeSaved(spec, False), FakeSaved(spec, True)
    return None


def install(monkeypatch, tmp_path, saved_pair=True):
    KERNEL_VIOLATIONS.clear()
    for k in CALLS:
        CALLS[k] = 0
    _REGISTRY.clear()
    monkeypatch.setattr(fj, "_why_not", fj._why_not_layout)  # (CPU tensors count as CUDA)
    monkeypatch.setattr(fj, "_compiled_chain", lambda spec, device: _compile(spec, False))
    monkeypatch.setattr(fj, "_compiled_backward", lambda spec, device: _compile(spec, True))
    monkeypatch.setattr(fj, "_run", _run)
    monkeypatch.setattr(fj, "_launch", _launch)
    monkeypatch.setattr(fj, "_launch_backward", _launch_backward)
    monkeypatch.setattr(fj, "_launch_training", _launch_training)
    monkeypatch.setattr(fj, "_training_pair", _training_pair if saved_pair else
                        (lambda spec, device: None))
    real_ok = fj._fast_call_ok

    def fast_call_ok(st, x, params, param_ptrs, ptrs=None):
        _REGISTRY.clear()
        _register([x] + list(params))
        return real_ok(st, x, params, param_ptrs, ptrs)
    monkeypatch.setattr(fj, "_fast_call_ok", fast_call_ok)
    real_cp = fj._chain_params

    def chain_params(st, raw, x, dtype):
        out = real_cp(st, raw, x, dtype)
        _register(out)
        return out
    monkeypatch.setattr(fj, "_chain_params", chain_params)
    monkeypatch.setattr(fj, "_CONSTANTS", {})
    monkeypatch.setattr(fj, "_backward_warned", set())
    monkeypatch.setattr(fj, "_pairs", {})
    # the auto policy: every timing 1 ms (fused kept), decisions below tmp_path
    monkeypatch.setattr(fj, "_median_ms", lambda fn, reps: (fn(), 1.0)[1])
    monkeypatch.setattr(fj, "_store", _policy.DecisionStore(str(tmp_path)))
    monkeypatch.setattr(fj, "_decision_key", lambda spec, device: {"spec": spec})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    install(monkeypatch, tmp_path)
    yield
    assert not KERNEL_VIOLATIONS, KERNEL_VIOLATIONS[:5]


@pytest.fixture
def gpu_nosaved(monkeypatch, tmp_path):
    install(monkeypatch, tmp_path, saved_pair=False)
    yield
    assert not KERNEL_VIOLATIONS, KERNEL_VIOLATIONS[:5]


def fusejit_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, fj.FusejitWarning)]
