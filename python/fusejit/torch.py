"""fusejit for PyTorch: a model's forward computed by fused, shape-specialized kernels.

    import fusejit.torch
    ModelNew = fusejit.torch.fused(Model)        # same constructor, forward, parameters, outputs
    model = ModelNew(*init_args).cuda()
    y = model(x)

    fast = fusejit.torch.fuse(model)             # an existing instance (shares its Parameters)

How a call runs:
- The chain is recognized once from the model with torch.fx (fusejit._recognize), and again
  (with a warning, once per change) where a plain attribute forward's trace read or a submodule
  has changed since (fusejit._watch: `model.scale = 3.0`, `model.act = nn.Tanh()`).
- A call on a CUDA tensor compiles the chain for its shape, dtype and device on first use (later
  a cache hit), allocates the output and workspace with PyTorch's caching allocator and runs on
  torch.cuda.current_stream(): no synchronization, capturable in a CUDA graph.
- Under torch.autocast (bfloat16/float16) a call runs as autocast runs the chain (see
  _autocast_forward): the convolution's operands in the autocast dtype, group_norm and what
  follows in float32; fusejit computes in fp32 throughout and rounds only where the output dtype
  needs it.
- Where fusejit cannot run the call (CPU tensors, a dtype or shape without a plan,
  non-contiguous or misaligned input, a module outside the grammar) the original forward runs
  and a warning says why, once per reason; strict=True raises instead.
- policy="auto" (default): the first call of each shape (and pass: inference or training, below)
  times the fused chain against the original forward (CUDA events) and keeps the faster, a
  decision stored beside the tuning database for other processes on that kind of GPU
  (fusejit._policy). "fused" / "eager" force one.
- Gradients: when x or a parameter requires grad, backward runs fusejit's fused backward of the
  chain (compiled per shape and device like the forward and cached): it writes dL/dx and every
  dL/dparam in the chain's dtype and is deterministic (two backward runs give bitwise identical
  gradients). A chain with ops after its convolution, where saving pays (the planner's cost
  model; bfloat16/float16 chains where their own plan can write u), runs the training forward (fusejit::CompileTrainingForward) on such a call: it
  also saves the convolution's output u (float32, in the layout its plan stores it, kept for the
  backward like PyTorch's saved tensors) and, where its plan offers them, the group statistics (mean, rstd per sample and
  group) or, for chains ending in group_norm | mean, the per-block channel moments its mean came
  from, and the backward (CompileBackwardFromSaved) reads them instead of recomputing the
  convolution and the statistics. Otherwise (and under
  torch.compile's custom op) the backward recomputes what it needs from the saved input and
  parameters (fusejit::CompileBackward); the gradients agree to rounding (bitwise where only u is
  saved: the saved statistics are the forward's float32 ones, the recomputed ones come from
  sums in double), both within 1e-5 of float64.
- Dtypes: float32, bfloat16 and float16 run fused. A bf16/f16 chain computes in fp32 (statistics
  included) and rounds its output (or gradients) to its dtype once, so its error against float64
  is at most PyTorch's own in that dtype. float64 runs fused in double (the generic plans: one
  thread per output point); its backward is PyTorch's (no f64 backward plans).
  For a chain it has no backward plan for (float64) backward differentiates PyTorch's own
  evaluation of the chain (strict fp32, no TF32) recomputed from the saved input, with a
  warning saying why, once per chain;
  strict=True raises instead, at the forward of a training call. The backward builds no graph
  (once differentiable): a double backward through it is an error.
- Passes of the auto policy: an inference call (no gradients needed: torch.no_grad /
  inference_mode, nothing requiring grad, or a module in eval mode) is timed as the forward
  alone; a training call (gradients needed on a module in training mode, `.train()`, the
  default) as a whole step, fused forward + fused backward against the original forward +
  PyTorch's backward (nothing accumulated into .grad). A training call of a chain without a
  fused backward runs the original forward (fused forward + recomputed backward would be the
  slower step), with the warning above; policy="fused" runs the fused forward there and the
  recomputed backward.
- A call like an earlier checked one (same shape, dtype, device and parameter tensors; for a
  training call also the same gradient mask) skips the checks and the policy lookup: the
  inference fast path enqueues the chain, the training fast path the autograd op.
- A model with dropout modules (p > 0) runs fused in eval mode, where they are the identity; in
  training mode, where they draw random masks, the chain stops before the first (the dropout and
  what follows run as PyTorch, further chains fused there); strict=True: the original forward
  runs (with a warning, once).
- A forward that goes on past the grammar (strict=False) runs its fusable start fused and the
  rest as the model's own code, in which each further chain from a convolution runs fused through
  a state of its own (its plan, policy decisions and fast paths); a forward with nothing to fuse
  at its start is all rest.
- A batch norm with running statistics (nn.BatchNorm3d; nn.InstanceNorm3d with
  track_running_stats=True) right after the convolution or the group_norm is folded into its
  weight and bias in eval mode (gradients reach the batch norm's weight and bias). In training
  mode it normalizes with the batch's statistics and updates its running ones: those calls run
  the chain that stops before it, the batch norm and what follows as PyTorch (strict=True: they
  raise, as the whole forward is not fused).
- A group_norm without weight and bias (nn.GroupNorm(affine=False), nn.InstanceNorm3d) runs the
  chain's group_norm with weight 1 and bias 0: tensors fusejit keeps per (channels, dtype,
  device), not parameters of the model (its state_dict is unchanged). A mean with keepdim=True
  (or adaptive average pooling to 1 without flatten) gives the chain's [N,C] or [N] result viewed
  with the kept size-1 dimensions, as the original returns it.
- Registered as the custom op torch.ops.fusejit.chain (torch >= 2.4) with a fake implementation,
  so torch.compile keeps it in its graph.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
from typing import Dict, List, Optional, Tuple

import torch
import torch.fx
import torch.nn as nn
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from . import _chain, _lib, _policy
from ._watch import ModuleWatch

__all__ = ["fuse", "fused", "FusejitWarning", "Unsupported", "is_fused", "explain"]

POLICIES = ("auto", "fused", "eager")
_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.float64: "f64"}


class FusejitWarning(UserWarning):
    """fusejit ran the original module for a call, and why."""


def _recognize_module():
    from . import _recognize
    return _recognize


class Unsupported(Exception):
    """Raised with strict=True for a module or a call fusejit cannot run."""


# ---- compiled chains, per (spec, device) -----------------------------------------------------

_REFUSALS = (3, 12)  # FJ_INVALID_ARGUMENT, FJ_UNIMPLEMENTED: the chain has no plan here
_compiled_lock = threading.Lock()
_compiled = {}  # type: Dict[Tuple[str, int], object]   # a _lib.Chain, or a FusejitError
_compiled_bwd = {}  # type: Dict[Tuple[str, int], object]   # the same for the backward
_module_mod = nn.modules.module
# PyTorch's global module hooks (register_module_forward_hook, ...): the dicts themselves.
_global_hooks = [getattr(_module_mod, n) for n in (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
    "_global_backward_pre_hooks") if isinstance(getattr(_module_mod, n, None), dict)]
# Counters for tests and diagnostics: backward calls (autograd's, on real tensors) served by the
# fused backward and by the eager fallback; training calls served by the fast path.
_stats = {"fused_backward": 0, "eager_backward": 0, "autocast": 0, "saved_backward": 0,
          "fast_training": 0}
_ops_cache = {}  # type: Dict[str, list]


def _ops(spec: str):
    ops = _ops_cache.get(spec)
    if ops is None:
        ops = _ops_cache[spec] = _chain.ops_of(spec)
    return ops


def _compile_cached(cache: dict, spec: str, device: int, backward: bool, saved: bool = False):
    """The compiled chain of `spec` (its backward with backward=True) for CUDA device `device`,
    loaded there. Raises FusejitError; refusals of the chain itself (invalid, no plan) are
    remembered, so they are not recompiled on every call, other failures (driver, I/O) are tried
    again on the next call."""
    key = (spec, device)
    c = cache.get(key)
    if c is None:
        with _compiled_lock:
            c = cache.get(key)
            if c is None:
                try:
                    with torch.cuda.device(device):
                        c = _lib.Chain(spec, device=device, backward=backward, saved=saved)
                        c.load()
                    if backward:
                        _check_backward_layout(c, spec, saved)
                    elif saved:
                        _check_training_layout(c, spec)
                except _lib.FusejitError as e:
                    if e.code not in _REFUSALS:
                        raise
                    c = e
                cache[key] = c
    if isinstance(c, Exception):
        raise c
    return c


def _compiled_chain(spec: str, device: int):
    """The forward of `spec` for `device` (see _compile_cached)."""
    return _compile_cached(_compiled, spec, device, backward=False)


def _compiled_backward(spec: str, device: int):
    """The backward of `spec` for `device` (see _compile_cached); its signature is checked to be
    the layout _launch_backward binds."""
    return _compile_cached(_compiled_bwd, spec, device, backward=True)


def _check_backward_layout(chain, spec: str, saved: bool = False) -> None:
    """The backward signature _launch_backward relies on (fusejit/signature.h's
    BackwardSignature): x, the n parameters, grad_y, (saved=True: the SAVED tensors the training
    forward wrote -- u, and the group statistics where it saves them --,) grad_x, grad_<param>
    for each parameter in the same order, then the workspace when there is one.
    Raises FusejitError(12, FJ_UNIMPLEMENTED: this package cannot bind it, a refusal like a chain
    without a plan) otherwise."""
    sig = chain.signature
    n = _chain.param_count(_ops(spec))
    s = sum(1 for t in sig if t.role == _lib.ROLE_SAVED) if saved else 0
    roles = ([_lib.ROLE_INPUT] + [_lib.ROLE_PARAM] * n + [_lib.ROLE_GRAD_OUTPUT] +
             [_lib.ROLE_SAVED] * s + [_lib.ROLE_GRAD_INPUT] + [_lib.ROLE_GRAD_PARAM] * n +
             ([_lib.ROLE_WORKSPACE] if chain.workspace_bytes else []))
    ok = [t.role for t in sig] == roles and all(
        sig[n + 3 + s + i].name == "grad_" + sig[1 + i].name for i in range(n))
    if not ok:
        raise _lib.FusejitError(12, "the backward of %s has the signature %s, not x, the "
                                    "parameters, grad_y, grad_x, grad_<param>... this package "
                                    "binds" % (spec, sig))


def _check_training_layout(chain, spec: str) -> None:
    """A training forward's signature: the forward's (x, the n parameters, y), then -- where it
    saves them -- the SAVED tensors (u, and the group statistics or the channel moments where its
    plan saves them), then the workspace. Raises FusejitError(12) otherwise."""
    n = _chain.param_count(_ops(spec))
    roles = [t.role for t in chain.signature]
    head = [_lib.ROLE_INPUT] + [_lib.ROLE_PARAM] * n + [_lib.ROLE_OUTPUT]
    tail = [_lib.ROLE_WORKSPACE] if chain.workspace_bytes else []
    k = roles.count(_lib.ROLE_SAVED)
    if k > 3 or roles != head + [_lib.ROLE_SAVED] * k + tail:
        raise _lib.FusejitError(12, "the training forward of %s has the signature %s, not x, the "
                                    "parameters, y[, u] this package binds" % (spec, chain.signature))


_compiled_train = {}  # (spec, device) -> the training forward (or the refusal)
_compiled_bwd_saved = {}  # (spec, device) -> its backward reading u


def _training_pair(spec: str, device: int):
    """(training forward, backward reading its u) for `spec` on `device` where the library has
    them and the chain saves u (a chain with ops after its convolution, where the planner's
    cost model says saving pays), else None: the caller runs the plain forward and the
    recomputing backward, which give the same gradients. A found pair (or its absence) is
    remembered; a failure to compile is tried again on the next call."""
    if not _lib.has_training() or _backward_or_why(spec, device)[0] is None:
        return None  # (without a fused backward the caller differentiates PyTorch's forward)
    key = (spec, device)
    if key in _pairs:
        return _pairs[key]
    try:
        fwd = _compile_cached(_compiled_train, spec, device, backward=False, saved=True)
        pair = None
        if any(t.role == _lib.ROLE_SAVED for t in fwd.signature):
            pair = fwd, _compile_cached(_compiled_bwd_saved, spec, device, backward=True,
                                        saved=True)
    except _lib.FusejitError:
        return None
    _pairs[key] = pair
    return pair


_pairs = {}  # (spec, device) -> _training_pair's answer, once found


def _launch_training(fwd, x: torch.Tensor, params: List[torch.Tensor]):
    """Enqueues the training forward: returns (y, [the SAVED tensors: u, and the group statistics
    where it saves them]), all new and written in full."""
    device = x.device
    n = len(params)
    y = _new_output(fwd.signature[n + 1].shape, x.dtype, device)
    saved = [_new_output(t.shape, torch.float32, device)
             for t in fwd.signature if t.role == _lib.ROLE_SAVED]
    pointers = ([x.data_ptr()] + [p.data_ptr() for p in params] + [y.data_ptr()] +
                [t.data_ptr() for t in saved])
    if fwd.workspace_bytes:
        ws = _empty(fwd.workspace_bytes, dtype=torch.uint8, device=device)
        pointers.append(ws.data_ptr())  # freed after the enqueue: stream-ordered reuse is safe
    fwd.run_pointers(pointers, _stream(fwd.device))
    return y, saved


def _backward_or_why(spec: str, device: int):
    """(the compiled backward, None), or (None, why there is none)."""
    try:
        return _compiled_backward(spec, device), None
    except _lib.FusejitError as e:
        return None, str(e)


_backward_warned = set()  # (spec, consequence) already warned about


def _warn_no_fused_backward(spec: str, why: str, consequence: str) -> None:
    """The FusejitWarning that `spec` has no fused backward, once per spec and consequence."""
    if (spec, consequence) in _backward_warned:
        return
    _backward_warned.add((spec, consequence))
    warnings.warn("fusejit has no fused backward for %s: %s; %s" % (spec, why, consequence),
                  FusejitWarning, stacklevel=3)


_EAGER_GRADIENTS = ("its gradients are PyTorch's evaluation of the chain, recomputed in strict "
                    "fp32")
_EAGER_TRAINING = "training calls (policy auto) run the original forward"

_poison_outputs = False  # tests set it: outputs are filled with NaN before each run

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: int) -> int:
    """The current CUDA stream of `device` as a CUstream value."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def _new_output(shape, dtype, device) -> torch.Tensor:
    """A tensor fusejit writes in full (contiguous, 512-byte aligned by the caching allocator)."""
    if _poison_outputs:  # tests: NaN before the run, so an unwritten element shows
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return _empty(shape, dtype=dtype, device=device)


def _launch(chain, x: torch.Tensor, pointers: List[int]) -> torch.Tensor:
    """Allocates the output (and workspace) with PyTorch's caching allocator and enqueues `chain`
    on the current stream. `pointers`: x's and the parameters', in signature order (extended)."""
    device = x.device
    y = _new_output(chain.signature[len(pointers)].shape, x.dtype, device)
    pointers.append(y.data_ptr())
    if chain.workspace_bytes:
        ws = _empty(chain.workspace_bytes, dtype=torch.uint8, device=device)
        pointers.append(ws.data_ptr())  # freed after the enqueue: stream-ordered reuse is safe
    chain.run_pointers(pointers, _stream(chain.device))
    return y


def _run(spec: str, x: torch.Tensor, params: List[torch.Tensor]) -> torch.Tensor:
    """Runs the fused chain on x (CUDA, contiguous, aligned) and returns a new output tensor."""
    chain = _compiled_chain(spec, x.device.index)
    return _launch(chain, x, [x.data_ptr()] + [p.data_ptr() for p in params])


def _launch_backward(chain, x: torch.Tensor, params: List[torch.Tensor], grad: torch.Tensor,
                     saved: Optional[List[torch.Tensor]] = None
                     ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Enqueues the compiled backward `chain` on the current stream and returns (dL/dx,
    [dL/dparam]), every one of them new and written in full.
    REQUIRES: x, params (the forward's, in signature order) and grad (dL/dy, the output's shape)
    are contiguous tensors of the chain's dtype on chain's device with 16-byte aligned data (the
    forward's checks, and _aligned for grad); chain passed _check_backward_layout."""
    device = x.device
    sig = chain.signature
    n = len(params)
    saved = saved or []  # the backward reading a training forward's SAVED tensors: after grad_y
    s = len(saved)
    # grad_x, then grad_<param> for each parameter: signature entries n+2+s .. 2n+2+s
    grads = [_new_output(t.shape, x.dtype, device) for t in sig[n + 2 + s:2 * n + 3 + s]]
    pointers = [x.data_ptr()] + [p.data_ptr() for p in params] + [grad.data_ptr()]
    pointers += [t.data_ptr() for t in saved]
    pointers += [g.data_ptr() for g in grads]
    if chain.workspace_bytes:  # 256-byte alignment wanted; the caching allocator gives 512
        ws = _empty(chain.workspace_bytes, dtype=torch.uint8, device=device)
        pointers.append(ws.data_ptr())  # freed after the enqueue: stream-ordered reuse is safe
    chain.run_pointers(pointers, _stream(chain.device))
    return grads[0], grads[1:]


def _aligned(t: torch.Tensor, dtype) -> torch.Tensor:
    """`t` as a contiguous tensor of `dtype` (the chain's) with 16-byte aligned data (a copy only
    when needed: an upstream gradient is often an expanded view, e.g. of sum()'s)."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def _backward(spec: str, x: torch.Tensor, params: List[torch.Tensor], grad: torch.Tensor,
              needs: List[bool]):
    """(dL/dx, [dL/dparam]) of the chain at the saved x and params for the upstream gradient
    `grad`, None where `needs` (x's, then each parameter's) is False: fusejit's fused backward
    (which computes them all), else, for a chain without one, _eager_backward with a warning."""
    chain, why = _backward_or_why(spec, x.device.index)
    if chain is None:
        _warn_no_fused_backward(spec, why, _EAGER_GRADIENTS)
        _stats["eager_backward"] += 1
        return _eager_backward(spec, x, params, grad, needs)
    gx, gps = _launch_backward(chain, x, params, _aligned(grad, x.dtype))
    _stats["fused_backward"] += 1
    return (gx if needs[0] else None), [g if n else None for g, n in zip(gps, needs[1:])]


def _strict_fp32():
    """A context in which cuDNN's convolutions are strict fp32 (no TF32), other flags kept."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=torch.backends.cudnn.benchmark,
                                      deterministic=torch.backends.cudnn.deterministic,
                                      allow_tf32=False)


def _eager_backward(spec, x, params, grad, needs):
    """Gradients of PyTorch's own evaluation of the chain, in strict fp32 (no TF32): the fallback
    for chains without a fused backward. Computes only the gradients `needs` asks for (x's, then
    each parameter's); None for the others."""
    with torch.enable_grad(), _strict_fp32():
        xs = x.detach().requires_grad_(needs[0])
        ps = [p.detach().requires_grad_(n) for p, n in zip(params, needs[1:])]
        y = _chain.eager(_ops(spec), xs, ps)
        wrt = [t for t in [xs] + ps if t.requires_grad]
        grads = list(torch.autograd.grad(y, wrt, grad)) if wrt else []
    out = []
    for t in [xs] + ps:
        out.append(grads.pop(0) if t.requires_grad else None)
    return out[0], out[1:]


def _fake(spec, x, params):
    return x.new_empty(_chain.eager(_ops(spec), x, params).shape)


_custom_op = None
if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):  # torch >= 2.4
    @torch.library.custom_op("fusejit::chain", mutates_args=())
    def _chain_op(spec: str, x: torch.Tensor, params: List[torch.Tensor]) -> torch.Tensor:
        return _run(spec, x, params)

    @_chain_op.register_fake
    def _chain_op_fake(spec, x, params):
        return _fake(spec, x, params)

    def _setup_context(ctx, inputs, output):
        spec, x, params = inputs
        ctx.spec = spec
        ctx.n_params = len(params)
        ctx.save_for_backward(x, *params)

    # The backward as an op of its own, so that torch.compile's AOTAutograd traces it (with fake
    # tensors) into the backward graph and runs it on real ones: every gradient, dL/dx first.
    @torch.library.custom_op("fusejit::chain_backward", mutates_args=())
    def _chain_backward_op(spec: str, x: torch.Tensor, params: List[torch.Tensor],
                           grad: torch.Tensor) -> List[torch.Tensor]:
        gx, gps = _backward(spec, x, params, grad, [True] * (1 + len(params)))
        return [gx] + gps

    @_chain_backward_op.register_fake
    def _chain_backward_op_fake(spec, x, params, grad):
        return [x.new_empty(x.shape)] + [p.new_empty(p.shape) for p in params]

    def _op_backward(ctx, grad):
        x, *params = ctx.saved_tensors
        needs = list(ctx.needs_input_grad[1:2]) + [p.requires_grad for p in params]
        if len(ctx.needs_input_grad) > 2 and isinstance(ctx.needs_input_grad[2], (list, tuple)):
            needs = [ctx.needs_input_grad[1]] + list(ctx.needs_input_grad[2])
        gx, *gps = _chain_backward_op(ctx.spec, x, params, grad)
        return (None, gx if needs[0] else None,
                [g if n else None for g, n in zip(gps, needs[1:])])

    _chain_op.register_autograd(_op_backward, setup_context=_setup_context)
    _custom_op = _chain_op


class _ChainFunction(torch.autograd.Function):
    """The autograd path on torch without torch.library.custom_op."""

    @staticmethod
    def forward(ctx, spec, x, *params):
        ctx.spec = spec
        # A call whose backward will run: the training forward saves the convolution's output u
        # where it has one, and the backward reads u instead of recomputing the convolution.
        pair = _training_pair(spec, x.device.index) if any(ctx.needs_input_grad[1:]) else None
        ctx.backward_saved = None
        if pair is not None:
            y, saved = _launch_training(pair[0], x, list(params))
            ctx.backward_saved = pair[1]
            ctx.n_saved = len(saved)
            ctx.save_for_backward(x, *saved, *params)
            return y
        ctx.save_for_backward(x, *params)
        return _run(spec, x, list(params))

    @staticmethod
    @once_differentiable  # the fused backward builds no graph: differentiating it is an error
    def backward(ctx, grad):
        if ctx.backward_saved is not None:
            x, *rest = ctx.saved_tensors
            saved, params = rest[:ctx.n_saved], rest[ctx.n_saved:]
            gx, gps = _launch_backward(ctx.backward_saved, x, params, _aligned(grad, x.dtype),
                                       saved)
            _stats["fused_backward"] += 1
            _stats["saved_backward"] += 1
            needs = [bool(n) for n in ctx.needs_input_grad[1:]]
            return (None, gx if needs[0] else None) + tuple(
                g if need else None for g, need in zip(gps, needs[1:]))
        x, *params = ctx.saved_tensors
        needs = [bool(n) for n in ctx.needs_input_grad[1:]]
        gx, gps = _backward(ctx.spec, x, params, grad, needs)
        return (None, gx) + tuple(gps)


def _call_op(spec, x, params):
    """The fused chain with autograd: the registered custom op under torch.compile (so it stays
    in the graph), else the cheaper autograd.Function (the same forward and backward)."""
    if _custom_op is not None and _is_compiling():
        return _custom_op(spec, x, params)
    return _ChainFunction.apply(spec, x, *params)


def _find_is_compiling():
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling  # torch >= 2.3; dynamo treats it as a constant
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is not None and hasattr(dynamo, "is_compiling"):
        return dynamo.is_compiling
    return lambda: False


_is_compiling = _find_is_compiling()  # resolved once: it runs on every call
_is_autocast_enabled = torch.is_autocast_enabled
_is_grad_enabled = torch.is_grad_enabled
_empty = torch.empty


# ---- the auto policy ---------------------------------------------------------------------------

_store = None  # type: Optional[_policy.DecisionStore]
_store_lock = threading.Lock()


def _decisions():
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                try:
                    directory = _lib.cache_dir()
                except _lib.FusejitError:
                    directory = ""
                _store = _policy.DecisionStore(directory)
    return _store


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _decision_key(spec: str, device: int) -> dict:
    p = torch.cuda.get_device_properties(device)
    return {"fusejit": _lib.version(), "spec": spec, "device": p.name,
            "sms": p.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "tf32": bool(torch.backends.cudnn.allow_tf32)}


# ---- the fused module --------------------------------------------------------------------------

def _check_options(strict, policy) -> None:
    """fuse()'s and fused()'s options: ValueError / TypeError naming the one that is wrong."""
    if policy not in POLICIES:
        raise ValueError("policy=%r: write one of %s" % (policy, ", ".join(POLICIES)))
    if not isinstance(strict, bool):
        raise TypeError("strict=%r: write True or False" % (strict,))


class _State(object):
    """What a fused module keeps besides its (shared) parameters."""

    def __init__(self, model: Optional[nn.Module], original_forward, strict: bool, policy: str,
                 training_mode: bool = False, recognized=None):
        """The state of `model` (recognized here), or with `recognized` given, of that chain (a
        sub-chain of a partially fused forward: original_forward(module, y) is its own code)."""
        _check_options(strict, policy)
        self.original_forward = original_forward
        self.strict = strict
        self.policy = policy
        self.warned = set()
        self.lock = threading.RLock()  # (re-entered: a failing rest inside a measurement)
        # (spec, device, None for inference or the training call's gradient mask "0111") -> decision
        self.decided = {}  # type: Dict[Tuple[str, int, Optional[str]], str]
        self.tail = None  # " | op | op ...": the chain without its input
        self.chainless = False  # no chain at the start of forward: rest(module, x, x) is all
        self.param_paths = []  # type: List[Tuple[str, str]]  # (chain name, qualified name)
        self.unsupported = None  # type: Optional[str]
        self.training_fallback = None  # type: Optional[str]  # Recognized.training_fallback
        self.norm_constants = None  # Recognized.norm_constants: group_norm's weight 1, bias 0
        self.out_dims = None  # Recognized.out_dims: the model's view of the chain's output
        # Recognized.sum_count where the model sums (Recognized.sum_axes), else None; its values
        # by input shape in sum_counts
        self.sum_count = None
        self.sum_counts = {}  # type: Dict[torch.Size, int]
        self.dropout_modules = []  # Recognized.dropout_modules: fused only while all are in eval
        self.running_norms = []  # Recognized.running_norms: folded only while all are in eval
        self.mode_modules = []  # running_norms and dropout_modules: what training mode changes
        # The state of calls while one of mode_modules is in training mode (recognized with
        # training_mode=True: its chains stop before batch norms and dropout modules); None
        # under strict (such calls raise) and where there are none.
        self.training_state = None  # type: Optional[_State]
        # forward's traced code differs by mode (_recognize.forward_reads_training): the
        # training state serves every call of the module in training mode
        self.mode_traced = False
        self.norm_is_instance = False  # Recognized.norm_is_instance: autocast keeps it in D
        # Recognized.writes_input: the chain's own code changes its input in place (the
        # measurements run it on a copy)
        self.writes_input = False
        self.folds = {}  # Recognized.folds: chain parameters computed from the model's
        self.direct_paths = {}  # chain name -> model path of the parameters not folded
        self.fold_cache = None  # _folded_params: (raw tensors, their versions, params, key)
        self.folds_cacheable = True  # every Fold.cacheable
        self.watched = set()  # every Fold.watch: model tensors read only for their versions
        self.rest = None  # Recognized.rest: the rest of forward after the chain, or None
        self.rest_from = None  # Recognized.rest_from: why the chain stops there
        self.rest_ran = False  # the rest has run through once (_model_output)
        self.raw_paths = []  # the model parameters a call reads, in the order of `getters`
        self.chain_names = []  # the chain's parameter names but group_norm's constants, in order
        self.getters = []
        self.ready = {}
        self.ready_training = {}
        self.submodules = []  # every submodule, as the last checked call found them (hooks)
        self.last_decision = None  # type: Optional[dict]
        # The model's plain attributes and submodules at recognition (the model's own state
        # only: _attach; a change recognizes forward again, _fused_forward)
        self.watch = None  # type: Optional[ModuleWatch]
        try:
            # strict: the whole forward, or Unsupported; else the longest fusable start of it
            r = recognized if recognized is not None else _recognize_module().recognize(
                model, partial=not strict, training_mode=training_mode)
        except Exception as e:  # _recognize.Unsupported, or tracing failed
            if strict:
                raise Unsupported(str(e)) from e
            self.unsupported = str(e)
            return
        self.tail = "".join(" | " + op for op in r.ops)
        self.chainless = not r.ops  # (Recognized.sub_chains are all it fuses)
        self.training_fallback = r.training_fallback
        self.norm_constants = r.norm_constants
        self.out_dims = r.out_dims
        self.sum_count = r.sum_count if r.sum_axes else None
        self.dropout_modules = r.dropout_modules
        self.running_norms = r.running_norms
        self.mode_modules = r.running_norms + r.dropout_modules  # (see training_state)
        self.norm_is_instance = r.norm_is_instance
        self.writes_input = r.writes_input
        self.param_paths = sorted(r.param_paths.items(), key=lambda kv: _param_order(kv[0]))
        self.folds = r.folds
        self.folds_cacheable = all(f.cacheable for f in r.folds.values())
        self.watched = {path for f in r.folds.values() for path in f.watch}
        self.direct_paths = dict(self.param_paths)
        self.rest, self.rest_from = r.rest, r.rest_from
        self.chain_names = sorted(set(r.param_paths) | set(r.folds), key=_param_order)
        # The model parameters read: the chain's own, then those the folded ones are computed
        # from. Without folds they are the chain's parameters (but group_norm's constants).
        self.raw_paths = [path for _, path in self.param_paths]
        for name in self.chain_names:
            for path in r.folds[name].paths() if name in r.folds else []:
                if path not in self.raw_paths:
                    self.raw_paths.append(path)
        # Each parameter read as module._modules[...]._parameters[name] (plain dict lookups,
        # cheaper than attribute access through nn.Module.__getattr__), so a Parameter replaced
        # on the module is seen by the next call.
        buffers = set().union(*[f.buffers for f in r.folds.values()]) if r.folds else set()
        self.getters = [_param_getter(path, path in buffers) for path in self.raw_paths]
        # (shape, dtype, device) -> _Ready: calls already checked and decided, for the fast path
        self.ready = {}  # type: Dict[tuple, _Ready]
        # (shape, dtype, device, x's requires_grad, each parameter's) -> _ReadyTraining
        self.ready_training = {}  # type: Dict[tuple, _ReadyTraining]
        # The further chains in the rest of forward (Recognized.sub_chains), each with a state
        # of its own (its policy decisions, fast paths); the rest calls them fused from now on.
        self.sub_states = []  # type: List[_State]
        for sub in r.sub_chains:
            sub_st = _State(None, sub.forward, False, policy, recognized=sub.recognized)
            sub.run = functools.partial(_sub_chain_forward, sub_st)
            self.sub_states.append(sub_st)


# (value, channels, dtype, device) -> a [channels] tensor of `value`: group_norm's weight and bias
# where the model has none. Kept only when made outside CUDA graph capture (a fill captured into a
# graph runs only when the graph does) and outside torch.compile's tracing (a traced tensor).
_CONSTANTS = {}  # type: Dict[tuple, torch.Tensor]


def _normal_tensors(keep: bool):
    """A context making tensors that outlive the call normal ones where `keep` and the call runs
    under torch.inference_mode (inference tensors cannot be saved for the backward of a later
    call outside it: a kept constant or folded parameter would break training after one
    inference-mode call, as Lightning's validation makes); without gradients either way."""
    if keep and torch.is_inference_mode_enabled():
        return _InferenceOff()
    return contextlib.nullcontext()


class _InferenceOff(object):
    def __enter__(self):
        self.modes = (torch.inference_mode(False), torch.no_grad())
        for m in self.modes:
            m.__enter__()

    def __exit__(self, *exc):
        for m in reversed(self.modes):
            m.__exit__(*exc)
        return False


def _norm_constants(st: _State, x: torch.Tensor, dtype) -> List[torch.Tensor]:
    """[weight 1, bias 0] for the chain's group_norm where the model has no weight and bias
    (st.norm_constants; [] where it has them), of `dtype` on x's device: the last two chain
    parameters (group_norm's are the last; only a mean, which has none, follows it)."""
    if st.norm_constants is None:
        return []
    channels = st.norm_constants[2] or int(x.shape[1])
    out = []
    for value in (1.0, 0.0):
        key = (value, channels, dtype, x.device)
        t = _CONSTANTS.get(key)
        if t is None:
            keep = not _is_compiling() and not (x.is_cuda and
                                                torch.cuda.is_current_stream_capturing())
            # (kept ones made outside inference mode: an inference tensor cannot be saved for
            # a later call's backward)
            with _normal_tensors(keep):
                t = torch.full((channels,), value, dtype=dtype, device=x.device)
            if keep:
                _CONSTANTS[key] = t
        out.append(t)
    return out


def _chain_params(st: _State, raw: List[torch.Tensor], x: torch.Tensor, dtype
                  ) -> List[torch.Tensor]:
    """The chain's parameters, in signature order, from `raw` (the model's tensors at
    st.raw_paths): the model's Parameters themselves, or computed from them where per-channel
    ops are folded in (st.folds; differentiable torch ops), then group_norm's constants (of
    `dtype`) where the model has none."""
    if st.folds:
        params = _folded_params(st, raw, x, dtype)
    else:
        params = raw
    if st.norm_constants is not None:
        params = params + _norm_constants(st, x, dtype)
    return params


def _folded_params(st: _State, raw: List[torch.Tensor], x: torch.Tensor, dtype
                   ) -> List[torch.Tensor]:
    """_chain_params' computed part (st.folds). Computing the folds takes a few dozen small
    torch ops (~0.25 ms of host time a call), so where no gradient can flow through them (grad
    mode off, or no factor requiring grad) the result is kept in st.fold_cache and served while
    the model's tensors are the same objects at the same versions (an in-place change, an
    optimizer step or .copy_, bumps Tensor._version; `p.data = t` changes the data pointer; the
    cache holds the tensors, so another tensor cannot take one's place at its address). An
    in-place change through .data (`p.data.mul_(2)`) bumps no version and is not seen: PyTorch
    documents .data as hidden from autograd's tracking; `with torch.no_grad(): p.mul_(2)` is. Not kept inside graph capture or tracing,
    nor where a factor can change without a version bump (Fold.cacheable: a batch norm's running
    statistics do, but its num_batches_tracked, among the tensors read, counts each update)."""
    cacheable = st.folds_cacheable and (not _is_grad_enabled() or
                                        not any(p.requires_grad for p in raw))
    if cacheable:
        # (and their data pointers: `p.data = other` changes no version)
        versions = [(p._version, p.data_ptr()) for p in raw]
        c = st.fold_cache
        if c is not None and c[3] == (dtype, x.device) and c[1] == versions and \
                all(a is b for a, b in zip(c[0], raw)):
            return c[2]
    keep = cacheable and not _is_compiling() and not (
        x.is_cuda and torch.cuda.is_current_stream_capturing())
    by_path = dict(zip(st.raw_paths, raw))
    params = []
    with _normal_tensors(keep):
        for name in st.chain_names:
            f = st.folds.get(name)
            params.append(by_path[st.direct_paths[name]] if f is None else
                          f.value(by_path.__getitem__, f.channels or int(x.shape[1])))
    if keep:
        st.fold_cache = (list(raw), versions, params, (dtype, x.device))
    return params


def _chain_names(st: _State) -> List[str]:
    return st.chain_names + (list(st.norm_constants[:2]) if st.norm_constants is not None else [])


def _raw_params(self, st: _State) -> List[Tuple[str, torch.Tensor]]:
    """(model path, tensor) of every model parameter a call reads (st.raw_paths)."""
    return [(path, _get(self, path)) for path in st.raw_paths]


def _named_params(self, st: _State, x: torch.Tensor, dtype, raw=None
                  ) -> List[Tuple[str, torch.Tensor]]:
    """(chain name, tensor) of every chain parameter for a call on x (_chain_params)."""
    if raw is None:
        raw = _raw_params(self, st)
    return list(zip(_chain_names(st), _chain_params(st, [p for _, p in raw], x, dtype)))


# torch.utils.checkpoint's way to end a recomputation early (non-reentrant): not a failure
_CHECKPOINT_STOP = getattr(torch.utils.checkpoint, "_StopRecomputationError", ())


def _model_output(module, st: _State, x: torch.Tensor, y: torch.Tensor):
    """The chain's output y as the original forward returns it: times the count of the values
    summed where the model's mean is a sum (st.sum_count), viewed with the kept size-1
    dimensions of a mean with keepdim=True (st.out_dims), then, where the forward goes on past
    the chain, the rest of it run as the model's own code on `module` (st.rest), which may read
    the call's input x too."""
    if st.sum_count is not None:
        count = st.sum_counts.get(x.shape)
        if count is None:
            count = st.sum_counts[x.shape] = st.sum_count(x.shape)
        y = y * count
    if st.out_dims is not None:
        y = y.view([1 if d is None else y.shape[d] for d in st.out_dims])
    if st.rest is None:
        return y
    # Until the rest has run once, the module's buffers as they were before it (a batch norm in
    # training mode in the rest updates its running statistics; where the rest then fails, the
    # original forward runs and would update them a second time). Later failures are not
    # expected (the same code on the same shapes ran): no copies on every call.
    saved = None if st.rest_ran or _is_compiling() else [
        (b, b.clone()) for b in module.buffers()]
    try:
        y = st.rest(module, y, x)
        st.rest_ran = True
        return y
    except Exception as e:
        if _is_compiling() or isinstance(e, _CHECKPOINT_STOP):
            raise
        with torch.no_grad():
            for b, value in saved or []:
                if not torch.equal(b, value):
                    b.copy_(value)
        # The original forward decides whose error it is: it raises the same one where the call
        # itself is wrong; where it runs, the rest as fusejit cut it is at fault, and the module
        # runs the original from now on.
        y = st.original_forward(module, x)
        with st.lock:
            st.unsupported = ("running the rest of forward after the fused chain failed (%s: %s) "
                              "where the original forward runs" % (type(e).__name__, e))
            st.ready, st.ready_training = {}, {}
            st.warned.add(st.unsupported)  # (the later calls' _fallback: warned once)
        warnings.warn("fusejit runs the original %s forward: %s" % (type(module).__name__,
                                                                   st.unsupported),
                      FusejitWarning, stacklevel=3)
        return y


def _param_getter(path: str, buffer: bool = False):
    """m -> the Parameter (or, buffer=True, the registered buffer) at `path` of module m."""
    *mods, leaf = path.split(".")
    table = "_buffers" if buffer else "_parameters"
    if not mods:
        return lambda m: getattr(m, table)[leaf]
    if len(mods) == 1:
        (a,) = mods
        return lambda m: getattr(m._modules[a], table)[leaf]

    def get(m):
        for k in mods:
            m = m._modules[k]
        return getattr(m, table)[leaf]
    return get


def _param_order(name: str):
    index, _, kind = name.partition(".")
    return int(index), 0 if kind == "weight" else 1


def _get(module: nn.Module, path: str):
    *parents, leaf = path.split(".")
    for p in parents:
        module = getattr(module, p)
    return getattr(module, leaf)


def _why_not(x, params) -> Optional[str]:
    """Why fusejit cannot run this call (None when it can)."""
    if not x.is_cuda:
        return "the input is on %s, not a CUDA device" % x.device
    return _why_not_layout(x, params)


def _why_not_layout(x, params) -> Optional[str]:
    """_why_not but for the device: the rank, dtypes, layouts and alignments of x and params."""
    if x.dim() != 5:
        return "the input has %d dimensions; fusejit takes 5-D NCDHW input" % x.dim()
    if x.dtype not in _DTYPES:
        return "the input dtype %s is not one fusejit has (%s)" % (
            x.dtype, ", ".join(str(d).replace("torch.", "") for d in _DTYPES))
    if not x.is_contiguous():
        return "the input is not contiguous (fusejit would have to copy it)"
    if x.data_ptr() % 16:
        return "the input's data pointer is not 16-byte aligned (a view with an offset)"
    for name, p in params:
        if p.device != x.device or p.dtype != x.dtype:
            return "parameter %s is %s on %s, the input %s on %s" % (name, p.dtype, p.device,
                                                                     x.dtype, x.device)
        if not p.is_contiguous() or p.data_ptr() % 16:
            return "parameter %s is not contiguous and 16-byte aligned" % name
    return None


def _shape_mismatch(chain, named) -> Optional[str]:
    """Why the parameters do not fit `chain`, compiled for this input (None when they do): the
    chain takes its input channels from x, so an input with other channels than the model's
    layers make a chain whose weights have other shapes than the parameters (fusejit would read
    past them). The original forward then raises PyTorch's own error."""
    sig = chain.signature
    for i, (name, p) in enumerate(named):
        want = tuple(sig[1 + i].shape)
        if tuple(p.shape) != want:
            return ("parameter %s has shape %s, but for an input of shape %s the chain needs %s "
                    "(does the input have the channels the model was built for?)" %
                    (name, list(p.shape), list(sig[0].shape), list(want)))
    return None


def _any_hook(modules) -> bool:
    """Whether a global module hook or one on `modules` is registered (the fast path's check)."""
    return any(_global_hooks) or any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
        getattr(m, "_backward_pre_hooks", None) for m in modules)


def _hooked(self) -> Optional[str]:
    """Why hooks need the original forward (None when none do): a forward or backward hook on a
    submodule (or a global module hook) runs only when that submodule is called, and the fused
    chain calls none of them. The module's own hooks run either way (nn.Module.__call__)."""
    if any(_global_hooks):
        return "a global module hook is registered (nn.modules.module.register_module_*_hook)"
    for name, m in self.named_modules():
        if m is not self and _any_hook([m]):
            return ("submodule '%s' has a forward or backward hook, which runs only when the "
                    "original forward calls it" % name)
    return None


def _fallback(self, st: _State, reason: str, args, kwargs):
    if st.strict:
        raise Unsupported("fusejit cannot run this call of %s: %s" % (type(self).__name__, reason))
    if reason not in st.warned:
        st.warned.add(reason)
        warnings.warn("fusejit runs the original %s forward: %s" % (type(self).__name__, reason),
                      FusejitWarning, stacklevel=3)
    return st.original_forward(self, *args, **kwargs)


def _spec(st: _State, x) -> str:
    return "x:" + _DTYPES[x.dtype] + "[" + ",".join([str(int(s)) for s in x.shape]) + "]" + st.tail


def _decide(self, st: _State, spec: str, x, params, needs=None, backward=None, raw=None) -> str:
    """'fused' or 'eager' for this call. The auto policy measures on the first call of each
    (spec, device, pass) and keeps the decision for the module and, in the store, for other
    processes: an inference call (needs None) is timed as the forward alone, a training call
    (needs: which of x and the parameters need gradients; backward: the compiled backward) as
    forward + backward. A decision is "eager" also when the two disagree (with a warning)."""
    if st.policy != "auto":
        return st.policy
    mask = None if needs is None else "".join("1" if n else "0" for n in needs)
    key = (spec, x.device.index, mask)
    decision = st.decided.get(key)
    if decision is not None:
        return decision
    with st.lock:
        decision = st.decided.get(key)
        if decision is not None:
            return decision
        material = _decision_key(spec, x.device.index)
        if mask is not None:  # inference keys stay as they were: stored decisions still hold
            material.update({"pass": "train", "grad": mask})
        store = _decisions()
        entry = store.get(material)
        if entry is None and torch.cuda.is_current_stream_capturing():
            return "fused"  # no timing inside a graph capture; decide on a later call
        if entry is None:
            # (the timed forwards would update the running statistics of batch norms in
            # training mode many times: the module's buffers they changed are put back after;
            # only those: a copy into a buffer the call's own graph saved would break its
            # backward -- a sub-chain's decision inside the model's forward. By value: a batch
            # norm's update of its running statistics does not bump their _version.)
            saved = [(b, b.clone()) for b in self.buffers()]
            try:
                # (and the random number generators as they were: the timed forwards draw the
                # masks of dropout in the rest many times; the call itself draws them once)
                # (and under saved-tensor hooks of their own: the caller's, torch.utils.checkpoint's,
                # would pack the timed graphs' tensors as the call's)
                with torch.random.fork_rng(devices=[x.device.index] if x.is_cuda else []), \
                        torch.autograd.graph.saved_tensors_hooks(_same, _same):
                    entry, disagreement = _measure(self, st, spec, x, params, mask, needs,
                                                   backward, raw)
            finally:
                with torch.no_grad():
                    for b, value in saved:
                        if not torch.equal(b, value):
                            b.copy_(value)
            if not (disagreement and st.rest is not None):
                # (a disagreement through the rest of forward is this model's, not the spec's)
                store.put(material, entry["decision"], entry)
            if disagreement:
                warnings.warn("fusejit: %s; running the original" % disagreement, FusejitWarning)
        decision = entry["decision"]
        st.decided[key] = decision
        st.last_decision = dict(entry, spec=spec)
        return decision


def _same(t):
    return t


def _measure(self, st: _State, spec: str, x, params, mask, needs, backward, raw):
    if mask is None:
        return _measure_inference(self, st, spec, x, params)
    if st.folds or st.rest is not None:  # gradients of the model's own tensors
        return _measure_training_autograd(self, st, spec, x, raw)
    return _measure_training(self, st, spec, x, params, needs, backward)


class _Draws(object):
    """The random number generators' state (CPU and x's CUDA device) at construction, to put
    back before each of the two runs a measurement compares: both draw the same dropout masks
    in the rest of forward."""

    def __init__(self, x):
        self.device = x.device.index if x.is_cuda else None
        self.cpu = torch.get_rng_state()
        self.cuda = None if self.device is None else torch.cuda.get_rng_state(self.device)

    def reset(self):
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def _max_diff(got: torch.Tensor, want: torch.Tensor):
    """(max abs difference, whether it is within the auto policy's sanity bound: 1e-2 of want's
    largest magnitude + 1e-3, loose enough for TF32 in the original; for bfloat16 2^-4 of it,
    16 of its rounding units, since the original rounds to bf16 after every op). Non-finite
    values agree where both have them (a NaN in both, the same infinity): an input with a NaN
    or an inf gives them to both, and the decision taken on it holds for every later call."""
    if got.shape != want.shape:
        return float("inf"), False
    if not got.numel():
        return 0.0, True
    g, w = got.double(), want.double()
    both = (torch.isnan(g) & torch.isnan(w)) | (torch.isinf(w) & (g == w))
    # (elsewhere a non-finite value in one of them makes the difference NaN or inf: disagree)
    err = float(torch.where(both, torch.zeros_like(g), (g - w).abs()).max())
    finite = w[torch.isfinite(w)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    if err != err:  # NaN: a NaN in one of them only
        return float("inf"), False
    rel = 2.0 ** -4 if want.dtype == torch.bfloat16 else 1e-2
    return err, err <= rel * scale + 1e-3


def _tensors(y) -> List[torch.Tensor]:
    """The tensors of a forward's result (a tensor, or tuples / lists / dicts of them)."""
    if torch.is_tensor(y):
        return [y]
    if isinstance(y, dict):
        y = list(y.values())
    if isinstance(y, (tuple, list)):
        return [t for v in y for t in _tensors(v)]
    return []


def _max_diff_all(got, want):
    """_max_diff over every tensor of two forward results (the rest of a forward may return
    more than one); disagreeing structure is a disagreement."""
    a, b = _tensors(got), _tensors(want)
    if len(a) != len(b) or (not a and got != want):
        return float("inf"), False
    err, agree = 0.0, True
    for u, v in zip(a, b):
        e, ok = _max_diff(u, v)
        err, agree = max(err, e), agree and ok
    return err, agree


def _eager_input(st: _State, x: torch.Tensor) -> torch.Tensor:
    """x as a measurement gives it to the original forward: a copy where that code changes its
    input in place (st.writes_input: `nn.LeakyReLU(inplace=True)` first), which would otherwise
    change the caller's tensor on every timed run -- the one the fused call then reads -- or,
    where it needs gradients, fail on the measurement's leaf (clone() is differentiable: the
    gradients reach x as before)."""
    return x.clone() if st.writes_input else x


def _measure_inference(self, st: _State, spec: str, x, params):
    """(decision entry, why the two disagree or None): the fused forward (and the rest of
    forward after the chain, where there is one) against the original's."""
    fused = lambda: _model_output(self, st, x, _run(spec, x, params))  # noqa: E731
    draws = _Draws(x)
    with torch.no_grad():
        y_fused = fused()
        draws.reset()
        y_eager = st.original_forward(self, _eager_input(st, x))
        fused_ms = _median_ms(fused, 5)
        xe = _eager_input(st, x)  # (one copy for every timed run: its values do not matter)
        eager_ms = _median_ms(lambda: st.original_forward(self, xe), 5)
    err, agree = _max_diff_all(y_fused, y_eager)
    decision = "fused" if agree and fused_ms <= eager_ms else "eager"
    entry = {"pass": "inference", "fused_ms": fused_ms, "eager_ms": eager_ms,
             "max_abs_diff": err, "decision": decision}
    why = None if agree else ("the fused %s differs from the original forward by %g (max abs)" %
                              (spec, err))
    return entry, why


def _measure_training(self, st: _State, spec: str, x, params, needs, backward):
    """(decision entry, why the two disagree or None): a training step both ways, the fused
    forward + fused backward (which computes every gradient) against the original forward +
    PyTorch's backward of the gradients `needs` asks for, timed as the caller runs it; the
    outputs and gradients compared with the original's in strict fp32 (a bf16/f16 chain's
    gradients with the chain's evaluated in float32: _float32_gradients). Nothing is accumulated
    into .grad, and the global RNG is not used."""
    xs = x.detach().requires_grad_(bool(needs[0]))  # the timed graphs stop at x
    wrt = [t for t, n in zip([xs] + list(params), needs) if n]
    with torch.no_grad():
        y_fused = _run(spec, x, params)
    gen = torch.Generator(device=x.device)
    gen.manual_seed(0)
    g = torch.randn(y_fused.shape, generator=gen, device=x.device, dtype=x.dtype)
    # g is the upstream gradient of the model's output; where the model sums (st.sum_count), its
    # output is the chain's mean times the count, so the chain's upstream gradient is g times it
    gc = g
    if st.sum_count is not None:
        count = st.sum_counts.get(x.shape)
        if count is None:
            count = st.sum_counts[x.shape] = st.sum_count(x.shape)
        gc = g * count

    pair = _training_pair(spec, x.device.index)  # what a training call runs, where it can

    def fused_step():
        if pair is not None:
            _, saved = _launch_training(pair[0], x, params)
            return _launch_backward(pair[1], x, params, gc, saved)
        _run(spec, x, params)
        return _launch_backward(backward, x, params, gc)

    def eager_step():
        with torch.enable_grad():
            y = st.original_forward(self, _eager_input(st, xs))
            return y, torch.autograd.grad(y, wrt, g.view(y.shape))

    gx, gps = fused_step()
    fused_grads = [t for t, n in zip([gx] + gps, needs) if n]
    # The reference for the agreement check is the original step in strict fp32: TF32's error in
    # a weight gradient summed with cancellation (W3's) can exceed any useful bound. A bf16/f16
    # chain's gradients are checked against the chain's in float32 instead (_float32_gradients).
    if x.dtype in (torch.bfloat16, torch.float16):
        with torch.no_grad():
            y_eager = st.original_forward(self, _eager_input(st, xs))
        eager_grads = _float32_gradients(spec, x, params, gc, needs)
    else:
        with _strict_fp32():
            y_eager, eager_grads = eager_step()
    fused_ms = _median_ms(fused_step, 5)
    eager_ms = _median_ms(eager_step, 5)  # with the caller's settings, TF32 included
    err, agree = _max_diff(_model_output(self, st, x, y_fused), y_eager.detach())
    why = None if agree else ("the fused %s differs from the original forward by %g (max abs)" %
                              (spec, err))
    names = [n for n, need in zip(["x"] + ["parameter %d" % i for i in range(len(params))], needs)
             if need]
    grad_err = 0.0
    for name, got, want in zip(names, fused_grads, eager_grads):
        e, ok = _max_diff(got, want)
        grad_err = max(grad_err, e)
        if not ok and why is None:
            why = ("the fused backward of %s differs from PyTorch's in the gradient of %s by %g "
                   "(max abs)" % (spec, name, e))
    decision = "fused" if why is None and fused_ms <= eager_ms else "eager"
    entry = {"pass": "train", "fused_ms": fused_ms, "eager_ms": eager_ms, "max_abs_diff": err,
             "max_abs_grad_diff": grad_err, "decision": decision}
    return entry, why


def _measure_training_autograd(self, st: _State, spec: str, x, raw: List[torch.Tensor]):
    """_measure_training for a model whose chain parameters are computed from its own (folds)
    or whose forward goes on past the chain (st.rest): both steps differentiated by autograd --
    the fused forward through the chain's autograd op, the folds and the rest -- for x and the
    model's tensors the chain reads that need gradients, from the same random upstream
    gradients; compared (outputs and gradients) and timed as the caller runs them."""
    xs = x.detach().requires_grad_(x.requires_grad)  # the timed graphs stop at x
    wrt = ([xs] if xs.requires_grad else []) + [p for p in raw if p.requires_grad]
    gen = torch.Generator(device=x.device)
    gen.manual_seed(0)

    def step(forward):
        with torch.enable_grad():
            ys = [t for t in _tensors(forward()) if t.requires_grad]
        if not ys:
            return ys, [None] * len(wrt)
        gs = [torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) for t in ys]
        return ys, torch.autograd.grad(ys, wrt, gs, allow_unused=True)

    def fused():
        y = _call_op(spec, xs, _chain_params(st, raw, xs, xs.dtype))
        return _model_output(self, st, xs, y)

    eager = lambda: st.original_forward(self, _eager_input(st, xs))  # noqa: E731
    draws = _Draws(x)
    gen.manual_seed(0)
    y_fused, g_fused = step(fused)
    gen.manual_seed(0)
    draws.reset()
    # (the reference in strict fp32, as _measure_training's: TF32's error in a weight gradient
    # summed with cancellation can exceed any useful bound; timed below with the caller's)
    with _strict_fp32():
        y_eager, g_eager = step(eager)
    err, agree = _max_diff_all([t.detach() for t in y_fused], [t.detach() for t in y_eager])
    why = None if agree else ("the fused %s differs from the original forward by %g (max abs)" %
                              (spec, err))
    grad_err = 0.0
    # (16-bit gradients are not compared: PyTorch's own 16-bit backward rounds every intermediate
    # gradient and can be further from float64 than any useful bound; _measure_training compares
    # with the chain's float32 gradients instead, which need the chain's own parameters)
    for a, b in zip(g_fused, g_eager) if x.dtype not in (torch.bfloat16, torch.float16) else []:
        if a is None or b is None:
            e, ok = (0.0, True) if a is None and b is None else (float("inf"), False)
        else:
            e, ok = _max_diff(a, b)
        grad_err = max(grad_err, e)
        if not ok and why is None:
            why = "the fused backward of %s differs from PyTorch's by %g (max abs)" % (spec, e)
    fused_ms = _median_ms(lambda: step(fused), 5)
    eager_ms = _median_ms(lambda: step(eager), 5)
    decision = "fused" if why is None and fused_ms <= eager_ms else "eager"
    entry = {"pass": "train", "fused_ms": fused_ms, "eager_ms": eager_ms, "max_abs_diff": err,
             "max_abs_grad_diff": grad_err, "decision": decision}
    return entry, why


def _float32_gradients(spec: str, x: torch.Tensor, params: List[torch.Tensor], g: torch.Tensor,
                       needs: List[bool]) -> List[torch.Tensor]:
    """The gradients `needs` asks for, of the chain evaluated by PyTorch in strict fp32 from the
    same (bf16 or f16) values: the training check's reference for 16-bit chains. PyTorch's own
    16-bit backward rounds every intermediate gradient and can be further from float64 than the
    check's bound allows: a bf16 conv_transpose3d(k=4, stride=2) | relu | group_norm step's
    gradients were 7.7e-2 from float64 (relative L2) against fusejit's 2.9e-3 (H200,
    2026-11-29), and the check ran the original with a warning that fusejit's differed."""
    with torch.autocast(x.device.type, enabled=False):
        gx, gps = _eager_backward(spec, x.float(), [p.float() for p in params], g.float(), needs)
    return [t for t in [gx] + gps if t is not None]


class _Ready(object):
    """A (shape, dtype, device) whose calls were checked and decided: the fast path runs them
    while the parameters are still the tensors (data pointers) they were checked with."""
    __slots__ = ("chain", "eager", "param_ptrs")

    def __init__(self, chain, eager, param_ptrs):
        self.chain, self.eager, self.param_ptrs = chain, eager, param_ptrs


class _ReadyTraining(object):
    """A training call (module in training mode, gradients needed: `needs`, x's then each
    parameter's) of a (shape, dtype, device) that was checked and decided: the fast path runs it
    while the parameters are still the tensors it was checked with -- the autograd op on `spec`
    (decision "fused"), or the original forward ("eager")."""
    __slots__ = ("spec", "eager", "param_ptrs")

    def __init__(self, spec, eager, param_ptrs):
        self.spec, self.eager, self.param_ptrs = spec, eager, param_ptrs


def _active_dropout(self, st: _State) -> Optional[str]:
    """Why the call must run the original forward (None when it need not): a dropout module with
    p > 0 in training mode draws a random mask; in eval mode it is the identity, which the chain
    skips."""
    for path in st.dropout_modules:
        if (self.get_submodule(path) if path else self).training:
            return ("dropout module '%s' is in training mode (it draws a random mask, which the "
                    "fused chain does not); calls in eval mode (model.eval()) run fused" %
                    (path or type(self).__name__))
    return None


def _in_training(self, paths) -> Optional[str]:
    """The first of the submodules at `paths` in training mode; None when all are in eval."""
    for path in paths:
        if (self.get_submodule(path) if path else self).training:
            return path
    return None


def _mode_state(self, st: _State) -> _State:
    """The state this call of the module runs by: st, or where a folded batch norm or a skipped
    dropout module is in training mode, the chains that stop before them (st.training_state;
    st itself under strict)."""
    if st.training_state is not None and (
            (st.mode_traced and self.training) or _in_training(self, st.mode_modules) is not None):
        return st.training_state
    return st


def _fused_forward(self, *args, **kwargs):
    if isinstance(args, torch.fx.Proxy):  # (torch.fx traces forward(*args) with args a Proxy)
        raise TypeError("torch.fx cannot trace the forward of fused module %s (its arguments are "
                        "*args): trace the original model instead" % type(self).__name__)
    st = self.__dict__["_fusejit"]
    if _is_compiling():
        return _forward_with(self, st, args, kwargs)
    if torch.jit.is_tracing() or (args and isinstance(args[0], torch.fx.Proxy)):
        # (torch.jit.trace, ONNX export, torch.fx.symbolic_trace: tracers see PyTorch's ops only)
        return st.original_forward(self, *args, **kwargs)
    if args and isinstance(args[0], torch.Tensor) and type(args[0]) is not torch.Tensor and \
            not isinstance(args[0], nn.Parameter):
        return _fallback(self, st, "the input is a %s, a tensor subclass: the original forward "
                         "keeps its type and its __torch_function__" % type(args[0]).__name__,
                         args, kwargs)
    if st.watch is not None:
        changed = st.watch.changed()
        if changed is not None:
            st = _recognize_again(self, st, changed)
    return _forward_with(self, st, args, kwargs)


def _recognize_again(self, st: _State, changed: str) -> _State:
    """The state of `self` recognized afresh: `changed` (ModuleWatch.changed) was baked into the
    chain its forward was recognized as. Warns once per change described (a value set on every
    call recognizes every call: slow, and the warning says why)."""
    cls = type(self)._fusejit_original
    _attach(self, cls.forward, st.strict, st.policy, recognize_as=cls, ignore=st.watch.ignore)
    new = self.__dict__["_fusejit"]
    new.warned = st.warned
    if st.watch.last is not None and _signature(new) == _signature(st):
        # forward traces as before: the attribute is not read by it (a step counter); no
        # longer watched, so that setting it on every call costs nothing
        new.watch = ModuleWatch(self, st.watch.ignore | {st.watch.last})
        new.decided = st.decided
        return new
    if st.unsupported is not None:
        # (nothing was fused, so no chain had the old value: a lazy module's first call
        # materialized its weights, in_channels with them; a fix the user made)
        return new
    key = "recognized again: " + changed
    if key not in st.warned:
        st.warned.add(key)
        warnings.warn("fusejit recognizes %s's forward again: %s changed since it was recognized "
                      "(the chain had its old value)" % (type(self).__name__, changed),
                      FusejitWarning, stacklevel=4)
    return new


def _signature(st: Optional[_State]):
    """What a state runs, to compare two recognitions of one model: the traced code of forward,
    its chains (ops, folds, where they stop) and those of its training and sub-chain states."""
    if st is None:
        return None
    folds = tuple((k, f.role, tuple(tuple(step) for step in f.steps), f.axis, f.channels)
                  for k, f in sorted(st.folds.items()))
    return (getattr(st, "traced", None), st.tail, st.unsupported, st.rest_from, st.out_dims,
            st.norm_constants, folds, st.sum_count is not None,
            tuple(_signature(s) for s in getattr(st, "sub_states", [])),
            _signature(st.training_state))


def _sub_chain_forward(st: _State, module: nn.Module, y):
    """A sub-chain's call from the rest of forward: its chain run on `module` by its state; on a
    value that is not a 5-D tensor (known only now: a chain of elementwise ops after a flatten, an
    unbatched convolution) the chain's own code, as PyTorch runs it."""
    if type(y) is not torch.Tensor or y.dim() != 5:
        return st.original_forward(module, y)
    return _forward_with(module, st, (y,), {})


def _forward_with(self, st: _State, args, kwargs):
    """The fused forward of module `self` by state `st` (the model's, or a sub-chain's)."""
    st = _mode_state(self, st)
    if st.running_norms:
        path = _in_training(self, st.running_norms)
        if path is not None:  # (strict: there is no training state to run instead)
            return _fallback(self, st, "batch norm '%s' is in training mode (it normalizes with "
                                       "the batch's statistics and updates its running ones); "
                                       "calls in eval mode (model.eval()) run fused, the batch "
                                       "norm folded into the op before it" % path, args, kwargs)
    if st.chainless:  # nothing fused at the start: the forward is the rest, with its chains
        if st.unsupported is not None or len(args) != 1 or kwargs or \
                not isinstance(args[0], torch.Tensor):
            return _fallback(self, st, st.unsupported or "fusejit takes one tensor argument",
                             args, kwargs)
        return _model_output(self, st, args[0], args[0])
    if st.dropout_modules:
        reason = _active_dropout(self, st)
        if reason is not None:
            return _fallback(self, st, reason, args, kwargs)
    # The fast paths: a call like an earlier checked one (same shape, dtype, device, parameters;
    # for a call needing gradients also the same gradient mask, in training mode), not tracing,
    # no autocast, no submodule hooks. Other calls take the checked path.
    if not _is_compiling() and len(args) == 1 and not kwargs and type(args[0]) is torch.Tensor:
        x = args[0]
        # `raw`: the model parameters read (the chain's, or those its folded ones come from); the
        # fast paths hold while they are the tensors the call was checked with.
        try:
            raw = [g(self) for g in st.getters]
        except (KeyError, AttributeError):  # a parameter removed or renamed (pruning, ...)
            raw = None
        if raw is None or any(p is None for p in raw):  # (or set to None)
            return _parameters_changed(self, st, args, kwargs)
        if _is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in raw)):
            if not self.training:
                return _checked_forward(self, st, args, kwargs)
            ready = st.ready_training.get(
                (x.shape, x.dtype, x.device, x.requires_grad) +
                tuple(p.requires_grad for p in raw))
            if ready is None or not _fast_call_ok(st, x, raw, ready.param_ptrs):
                return _checked_forward(self, st, args, kwargs)
            if ready.eager:
                return st.original_forward(self, x)
            _stats["fast_training"] += 1
            params = _chain_params(st, raw, x, x.dtype)
            return _model_output(self, st, x, _ChainFunction.apply(ready.spec, x, *params))
        ready = st.ready.get((x.shape, x.dtype, x.device))
        if ready is not None:
            ptrs = [p.data_ptr() for p in raw]
            if _fast_call_ok(st, x, raw, ready.param_ptrs, ptrs):
                if ready.eager:
                    return st.original_forward(self, x)
                if st.folds or st.norm_constants is not None:
                    # (`params` holds the computed tensors until the chain is enqueued)
                    params = _chain_params(st, raw, x, x.dtype)
                    ptrs = [p.data_ptr() for p in params]
                ptrs.insert(0, x.data_ptr())
                return _model_output(self, st, x, _launch(ready.chain, x, ptrs))
    return _checked_forward(self, st, args, kwargs)


def _parameters_changed(self, st: _State, args, kwargs):
    """A call after a parameter the chain reads was removed, renamed or set to None (pruning,
    weight_norm applied, `conv.bias = None`): the model's forward recognized again where `st` is
    its own state; a sub-chain's own code otherwise."""
    top = self.__dict__.get("_fusejit")
    if top is not None and st in (top, top.training_state):
        missing = next((path for path, g in zip(st.raw_paths, st.getters)
                        if _get_or_none(g, self) is None), "?")
        return _forward_with(self, _recognize_again(
            self, top, "parameter '%s' of the model (removed, renamed or set to None)" % missing),
            args, kwargs)
    return st.original_forward(self, *args, **kwargs)


def _get_or_none(getter, module):
    try:
        return getter(module)
    except (KeyError, AttributeError):
        return None


def _fast_call_ok(st, x, params, param_ptrs, ptrs=None) -> bool:
    """Whether a call may take a fast path checked with parameters at `param_ptrs`: the same
    parameter tensors (`ptrs`: their data pointers, when the caller has them), x contiguous and
    16-byte aligned, no autocast, no submodule or global module hooks."""
    if ptrs is None:
        ptrs = [p.data_ptr() for p in params]
    return (ptrs == param_ptrs and not x.data_ptr() % 16 and x.is_contiguous() and
            not _is_autocast_enabled() and not _any_hook(st.submodules))


def _autocast_dtype():
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype("cuda")
    return torch.get_autocast_gpu_dtype()


def _autocast_forward(self, st, x, named, args, kwargs):
    """A call under torch.autocast (CUDA, bfloat16 or float16 D), as autocast runs the chain: the
    convolution's operands (x, its weight and bias) in D; group_norm, and every op after it, in
    float32 (autocast's float32 list), so the output is float32 with a group_norm and D without
    (a chain without a convolution stays float32).
    fusejit computes in fp32 throughout (it skips autocast's roundings between ops: its error is at
    most autocast's): with a group_norm it runs the f32 chain on x and the convolution's
    parameters rounded to D; without one, the D chain. An nn.InstanceNorm3d (a group_norm here) is
    not on autocast's float32 list: it and what follows run in D, so its chain is the D chain (its
    affine weight and bias rounded to D). The casts are differentiable (gradients
    reach float32 x and parameters as under autocast). Policy "eager" runs the original; otherwise
    the fused chain runs (no timing under autocast)."""
    dtype = _autocast_dtype()
    if st.policy == "eager":
        return st.original_forward(self, *args, **kwargs)
    if dtype not in (torch.bfloat16, torch.float16):
        return _fallback(self, st, "autocast to %s: fusejit has no plans for it" % dtype, args,
                         kwargs)
    if x.dtype not in (torch.float32, dtype) or any(p.dtype != torch.float32 for _, p in named):
        return _fallback(self, st, "autocast with a %s input and parameters of dtypes %s: fusejit "
                         "takes float32 parameters (and a float32 or %s input) under autocast" %
                         (x.dtype, sorted({str(p.dtype) for _, p in named}), dtype), args, kwargs)
    ops = [name for name, _ in _ops("x:f32[1,1,1,1,1]" + st.tail)]
    has_conv = ops[0] in ("conv3d", "conv_transpose3d")
    # (an instance norm is not on autocast's float32 list: it runs in D, as the ops after it)
    has_norm = "group_norm" in ops and not st.norm_is_instance
    n_norm = 2 if has_norm else 0  # group_norm's weight and bias: the last two parameters
    with torch.autocast("cuda", enabled=False):
        if not has_conv:  # no op autocast changes: the float32 chain
            xr, params = x.float(), [p for _, p in named]
        elif has_norm:  # the f32 chain on D-valued operands
            xr = x.to(dtype).float()
            params = [p.to(dtype).float() for _, p in named[:len(named) - n_norm]]
            params += [p for _, p in named[len(named) - n_norm:]]
        else:  # the D chain
            xr = x.to(dtype)
            params = [p.to(dtype) for _, p in named]
        reason = _why_not(xr, [(name, p) for (name, _), p in zip(named, params)])
        if reason is not None:
            return _fallback(self, st, reason, args, kwargs)
        spec = _spec(st, xr)
        try:
            chain = _compiled_chain(spec, xr.device.index)
        except _lib.FusejitError as e:
            return _fallback(self, st, str(e), args, kwargs)
        reason = _shape_mismatch(chain, named)
        if reason is not None:
            return _fallback(self, st, reason, args, kwargs)
        _stats["autocast"] += 1
        if _is_grad_enabled() and (xr.requires_grad or any(p.requires_grad for p in params)):
            return _model_output(self, st, x, _call_op(spec, xr, params))
        return _model_output(self, st, x, _run(spec, xr, params))


def _checked_forward(self, st, args, kwargs):
    """Every check, the compile and the policy decision; remembers the inference outcome in
    st.ready (the fast path's)."""
    if st.unsupported is not None:
        return _fallback(self, st, st.unsupported, args, kwargs)
    if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
        return _fallback(self, st, "fusejit takes one tensor argument", args, kwargs)
    x = args[0]
    autocast = x.is_cuda and _is_autocast_enabled()
    raw = _raw_params(self, st)
    st.submodules = [m for m in self.modules() if m is not self]
    if _any_hook(st.submodules):  # (the named walk, for the message, only then)
        return _fallback(self, st, _hooked(self), args, kwargs)
    if st.training_fallback is not None and _is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for _, p in raw)):
        return _fallback(self, st, st.training_fallback, args, kwargs)
    if _is_compiling():
        named = _named_params(self, st, x, x.dtype, raw)
        return _model_output(self, st, x, _call_op(_spec(st, x), x, [p for _, p in named]))
    if autocast:
        if st.folds:
            return _fallback(self, st, "autocast with per-channel parameters folded into the "
                             "convolution or group_norm (autocast rounds the convolution's "
                             "output before they apply): the original forward runs", args, kwargs)
        # (group_norm's constants in float32 under autocast, which runs group_norm in float32)
        named = _named_params(self, st, x, torch.float32, raw)
        return _autocast_forward(self, st, x, named, args, kwargs)
    # The model's parameters first (the folded ones are computed from them; but those only
    # watched for their versions: a batch norm's int64 num_batches_tracked), then the chain's.
    reason = _why_not(x, [(path, p) for path, p in raw if path not in st.watched])
    if reason is not None:
        return _fallback(self, st, reason, args, kwargs)
    try:
        named = _named_params(self, st, x, x.dtype, raw)
    except RuntimeError as e:  # a folded factor replaced by one of another shape
        return _fallback(self, st, "computing the folded parameters failed: %s" % e, args, kwargs)
    reason = _why_not(x, named)
    if reason is not None:
        return _fallback(self, st, reason, args, kwargs)
    params = [p for _, p in named]
    raw_ptrs = [p.data_ptr() for _, p in raw]
    # The gradients this call needs, x's then each parameter's; None: an inference call.
    needs = None
    if _is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        needs = [x.requires_grad] + [p.requires_grad for p in params]
    spec = _spec(st, x)
    device = x.device.index
    try:
        chain = _compiled_chain(spec, device)
    except _lib.FusejitError as e:
        return _fallback(self, st, str(e), args, kwargs)
    reason = _shape_mismatch(chain, named)
    if reason is not None:
        return _fallback(self, st, reason, args, kwargs)
    # A training call (gradients needed, module in training mode) is followed by a backward: its
    # fused backward is compiled now (a cache hit later), so that the auto policy can time the
    # step and strict=True can refuse a chain without one. Other calls needing gradients compile
    # it on their first backward.
    training = needs is not None and self.training
    backward = None
    if st.policy != "eager" and (training or (needs is not None and st.strict)):
        backward, why = _backward_or_why(spec, device)
        if backward is None:
            if st.strict:
                raise Unsupported("fusejit cannot differentiate this call of %s: %s" %
                                  (type(self).__name__, why))
            if st.policy == "auto":  # fused forward + recomputed backward: the slower step
                _warn_no_fused_backward(spec, why, _EAGER_TRAINING)
                return st.original_forward(self, x)
    step = training and backward is not None  # decided as a training step
    decision = _decide(self, st, spec, x, params, needs if step else None, backward,
                       [p for _, p in raw])
    # The fast path serves inference calls with the inference decision, once it is final.
    inference = st.policy if st.policy != "auto" else st.decided.get((spec, device, None))
    if inference is not None:
        st.ready[(x.shape, x.dtype, x.device)] = _Ready(chain, inference == "eager", raw_ptrs)
    # ... and training calls with this gradient mask, once their decision is final (a decision
    # taken inside a graph capture is not: it is timed on a later call).
    if step and (st.policy != "auto" or
                 (spec, device, "".join("1" if n else "0" for n in needs)) in st.decided):
        st.ready_training[(x.shape, x.dtype, x.device) + tuple(
            [x.requires_grad] + [p.requires_grad for _, p in raw])] = _ReadyTraining(
            spec, decision == "eager", raw_ptrs)
    if decision == "eager":
        return st.original_forward(self, x)
    if needs is not None:
        return _model_output(self, st, x, _call_op(spec, x, params))
    return _model_output(self, st, x, _run(spec, x, params))


def _plain_copy(model: nn.Module, cls: type) -> nn.Module:
    """A shallow copy of `model` as an instance of `cls`, sharing its parameters, buffers and
    submodules, without fusejit's state."""
    obj = cls.__new__(cls)
    obj.__dict__.update(model.__dict__)
    obj.__dict__.pop("_fusejit", None)
    return obj


def _attach(model: nn.Module, original_forward, strict: bool, policy: str,
            recognize_as=None, ignore=frozenset()) -> None:
    """Recognizes model's forward into its fusejit state (`ignore`: ModuleWatch's)."""
    subject = model
    if recognize_as is not None:  # trace the original class's forward, not the fused one
        subject = _plain_copy(model, recognize_as)
    rec = _recognize_module()
    # Each mode is traced in that mode: a forward whose traced code reads self.training
    # (F.dropout(x, p, self.training)) has a graph per mode (st.mode_traced: the training state
    # serves calls of the module in training mode).
    codes = rec.traced_code(subject)
    differs = codes[0] != codes[1]
    st = rec.in_mode(subject, False, lambda: _State(subject, original_forward, strict, policy))
    if (st.mode_modules and not strict) or differs:
        st.training_state = rec.in_mode(subject, True, lambda: _State(
            subject, original_forward, strict, policy, training_mode=not strict))
        st.mode_traced = differs
    st.watch = ModuleWatch(model, ignore)
    st.traced = codes
    model.__dict__["_fusejit"] = st


def _reduce_fused(self, protocol):
    """pickle (torch.save(model)), copy.copy and copy.deepcopy of a fused module: it is written as
    its original class (which pickle finds by name; the fused class has the same name but is not
    that object) and fused again when read, with the same strict and policy; the copy gets fusejit
    state of its own (its auto-policy decisions measured afresh, its kernels from the cache)."""
    original = type(self)._fusejit_original
    st = self.__dict__.get("_fusejit")
    strict, policy = (st.strict, st.policy) if st is not None else (False, "auto")
    made_by = "fused" if type(self).__dict__.get("_fusejit_made_by_fused") else "fuse"
    return (_refuse, (_plain_copy(self, original), strict, policy, made_by))


def _scriptable(self):
    """What torch.jit.script compiles for a fused module: the original class's module, sharing
    its parameters, buffers and submodules (TorchScript runs PyTorch's ops, not fusejit's)."""
    return _plain_copy(self, type(self)._fusejit_original)


def _refuse(plain: nn.Module, strict: bool, policy: str, made_by: str) -> nn.Module:
    """The fused module `_reduce_fused` wrote: `plain` (an instance of the original class) fused
    again, as fuse() made it, or as an instance of fused(its class, ...) did."""
    if made_by == "fuse":
        return fuse(plain, strict=strict, policy=policy)
    cls = type(plain)
    obj = _plain_copy(plain, fused(cls, strict=strict, policy=policy))
    _attach(obj, cls.forward, strict, policy, recognize_as=cls)
    return obj


_fused_classes = {}  # type: Dict[type, type]


def _fused_class(cls: type) -> type:
    """A subclass of `cls` whose forward is fused (no constructor of its own)."""
    sub = _fused_classes.get(cls)
    if sub is None:
        sub = type(cls.__name__, (cls,), {
            "forward": _fused_forward,
            "__module__": cls.__module__,
            "__qualname__": getattr(cls, "__qualname__", cls.__name__),
            "__doc__": cls.__doc__,
            "__reduce_ex__": _reduce_fused,
            "__prepare_scriptable__": _scriptable,
            "_fusejit_original": cls,
        })
        _fused_classes[cls] = sub
    return sub


def fuse(model: nn.Module, *, strict: bool = False, policy: str = "auto") -> nn.Module:
    """A module computing `model`'s forward with fusejit. It shares `model`'s Parameter objects,
    buffers and submodules (state_dict keys, optimizers, .to(), .train()/.eval() behave as on the
    original); `model` itself is left unchanged. strict=True raises Unsupported at once for a
    module outside the grammar (naming the layer and what the grammar accepts)."""
    if not isinstance(model, nn.Module):
        if isinstance(model, type) and issubclass(model, nn.Module):
            raise TypeError("fuse() takes a model (fuse(%s(...))); for the class write "
                            "fused(%s)" % (model.__name__, model.__name__))
        raise TypeError("fuse() takes an nn.Module, not %s" % type(model).__name__)
    _check_options(strict, policy)
    cls = getattr(type(model), "_fusejit_original", type(model))
    new = _plain_copy(model, _fused_class(cls))
    _attach(new, cls.forward, strict, policy, recognize_as=cls)
    return new


_fused_factories = {}  # type: Dict[Tuple[type, bool, str], type]


def fused(cls: type, *, strict: bool = False, policy: str = "auto") -> type:
    """A class with `cls`'s constructor signature whose instances are fused:
    `ModelNew = fusejit.torch.fused(Model)` is the drop-in replacement of `Model`. The same
    arguments give the same class (so an unpickled instance is an instance of it)."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        if isinstance(cls, nn.Module):
            raise TypeError("fused() takes a class (ModelNew = fused(%s)); for an instance "
                            "write fuse(model)" % type(cls).__name__)
        raise TypeError("fused() takes an nn.Module subclass, not %s" % type(cls).__name__)
    cls = getattr(cls, "_fusejit_original", cls)  # (fused(fused(M)) is fused(M))
    _check_options(strict, policy)
    key = (cls, bool(strict), policy)
    made = _fused_factories.get(key)
    if made is None:
        made = _fused_factories[key] = _make_fused(cls, bool(strict), policy)
    return made


def _make_fused(cls: type, strict: bool, policy: str) -> type:
    """fused()'s class for (cls, strict, policy): cls's constructor, then fusejit's state."""
    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **kwargs)
        _attach(self, cls.forward, strict, policy, recognize_as=cls)

    functools.update_wrapper(__init__, cls.__init__)
    try:
        __init__.__signature__ = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        pass
    return type(cls.__name__, (cls,), {
        "__init__": __init__,
        "forward": _fused_forward,
        "__module__": cls.__module__,
        "__qualname__": getattr(cls, "__qualname__", cls.__name__),
        "__doc__": cls.__doc__,
        "__reduce_ex__": _reduce_fused,
        "__prepare_scriptable__": _scriptable,
        "_fusejit_original": cls,
        "_fusejit_made_by_fused": True,
    })


def is_fused(model: nn.Module) -> bool:
    """True when `model` was made by fuse() or fused() and its chain was recognized."""
    st = model.__dict__.get("_fusejit")
    return st is not None and st.unsupported is None


def explain(model: nn.Module, x: torch.Tensor) -> str:
    """The plan fusejit runs for `model` on input `x` (`fusejit explain` text), or why none."""
    st = model.__dict__.get("_fusejit")
    if st is None:
        return "not a fused module (use fusejit.torch.fuse or fused)"
    st = _mode_state(model, st)
    if st.unsupported is not None:
        return "not fused: " + st.unsupported
    if st.chainless:
        text = "no chain at the start of forward\n"
    else:
        reason = _why_not_layout(x, []) if isinstance(x, torch.Tensor) else \
            "the input is a %s, not a tensor" % type(x).__name__
        if reason is not None:  # (a call with this input runs the original)
            return "not fused for this input: " + reason
        try:
            spec = _spec(st, x)
            text = _compiled_chain(spec, x.device.index if x.is_cuda else 0).explain()
        except _lib.FusejitError as e:
            return "not fused: " + str(e)
        except Exception as e:  # (an input of another dtype, a PyTorch without CUDA)
            return "not fused: %s: %s" % (type(e).__name__, e)
    if st.rest is not None:
        text += ("the rest of forward runs as PyTorch, after the chain (the chain stops there: "
                 "%s)\n" % st.rest_from)
        for i, sub in enumerate(st.sub_states):
            text += ("the rest runs chain %d fused (its own plan, on the value it reaches there; "
                     "%s):%s\n" % (i + 1, "its own policy decisions" if sub.unsupported is None
                                   else "not fused: " + sub.unsupported, sub.tail or ""))
    return text
