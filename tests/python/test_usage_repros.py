"""Minimal repros of the drop-in defects the usage survey found. Each test asserts what the
original model does and fails on the drop-in as of 02123e7. They use conftest.py's `gpu` pretend
(CPU tensors count as CUDA; kernels evaluated as float64 PyTorch behind an opaque launch; fast
paths on; auto policy with every timing 1 ms):

    cd /work/survey2 && PYTHONPATH=/work/main/python:/work/main/tests/python:/work/survey2 \
        FUSEJIT_LIBRARY=/work/main/build/libfusejit.so /usr/bin/python3 -m pytest -q \
        -p no:cacheprovider repros.py
"""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

import fusejit.torch as fj
from gpu_pretend import fusejit_warnings
from usage_models import ConvDrop


class ConvRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


def conv_relu_gn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.GroupNorm(2, 8))


X = torch.randn(2, 3, 8, 8, 8, generator=torch.Generator().manual_seed(1))


# 1. policy="auto" (the default) times a training call whose rest has dropout by running the
# model's forward many times and comparing outputs that drew different masks.
def test_dropout_training_auto_policy_same_seed_same_output(gpu):
    """Original: from the same seed, the same masks and outputs. Drop-in: the first call's
    measurement draws ~14 extra masks (global RNG), so its output and every later one differ;
    warns 'the fused ... differs from the original forward by 7.4; running the original'."""
    torch.manual_seed(0)
    orig = ConvDrop().train()
    fast = fj.fuse(copy.deepcopy(orig)).train()
    torch.manual_seed(5)
    want = orig(X)
    torch.manual_seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fast(X)
    assert not fusejit_warnings(caught), fusejit_warnings(caught)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())


def test_dropout_decision_poisons_another_model(gpu):
    """The 'eager' decision from the dropout model's spurious disagreement is stored under the
    chain's spec: a plain conv | relu model (no dropout) then never fuses its training calls."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    fj.fuse(ConvDrop()).train()(X).sum().backward()
    torch.manual_seed(0)
    plain = fj.fuse(nn.Sequential(nn.Conv3d(3, 8, 3), nn.ReLU())).train()
    plain(X).sum().backward()
    assert "eager" not in plain.__dict__["_fusejit"].decided.values()


# 2. torch.jit.trace / torch.onnx.export: the launch is invisible to the tracer, which records
# only the output's torch.empty.
def test_jit_trace_no_grad(gpu):
    """Original: the trace computes the model. Drop-in: the trace returns uninitialized memory
    (values ~1e22 here) -- with check_trace=False, or after a warm-up call with the default
    check, only a TracerWarning."""
    orig = conv_relu_gn().eval()
    fast = fj.fuse(copy.deepcopy(orig))
    with torch.no_grad():
        fast(X)
        tr = torch.jit.trace(fast, (X,), check_trace=False)
        x2 = torch.randn(2, 3, 8, 8, 8)
        got, want = tr(x2), orig(x2)
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


@pytest.mark.skipif(not hasattr(torch.onnx, "export_to_pretty_string"),
                    reason="this torch has no export_to_pretty_string (test_jit_trace_no_grad "
                           "checks the same tracer)")
def test_onnx_export(gpu):
    """Drop-in: the exported graph has no inputs and one Constant node as its output."""
    orig = conv_relu_gn().eval()
    fast = fj.fuse(copy.deepcopy(orig))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = torch.onnx.export_to_pretty_string(fast, (X,))
    assert "inputs: [{name" in text and 'type: "Conv"' in text  # the graph takes x; has a Conv


# 3. A parameter the chain reads is removed or renamed after recognition.
@pytest.mark.parametrize("how", ["prune", "weight_norm", "bias_none"])
def test_parameter_removed_after_first_call(gpu, how):
    """Original: runs. Drop-in: KeyError: 'weight' (the fast path's getters read
    conv._parameters['weight']; prune renames it weight_orig, weight_norm to weight_g/weight_v)
    or AttributeError: 'NoneType' object has no attribute 'device' (bias = None)."""
    import torch.nn.utils.prune as prune
    fast = fj.fuse(conv_relu_gn()).eval()
    with torch.no_grad():
        fast(X)
    if how == "prune":
        prune.l1_unstructured(fast[0], "weight", amount=0.5)
    elif how == "weight_norm":
        torch.nn.utils.weight_norm(fast[0])
    else:
        fast[0].bias = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            got = fast(X)
        want = nn.Sequential.forward(fast, X)
    assert torch.allclose(got, want, atol=1e-5)


# 4. An attribute forward never reads, changed by the training loop on every step.
def test_unread_attribute_changed_every_step(gpu):
    """Drop-in: forward recognized again (torch.fx trace) on every call, and a warning per call
    ("recognizes ... again: attribute 'step' of the model (0, now 1) changed since it was
    recognized (the chain had its old value)") -- the chain never had it."""
    model = conv_relu_gn()
    model.step = 0
    fast = fj.fuse(model).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, 6):
            fast.step = i
            with torch.no_grad():
                fast(X)
    assert len(fusejit_warnings(caught)) <= 1, len(fusejit_warnings(caught))  # 5


# 5. Non-reentrant activation checkpointing around the first (measuring) training call.
def test_checkpoint_non_reentrant_first_call(gpu):
    """Original: fine. Drop-in (policy auto): the measurement's torch.autograd.grad runs under
    checkpoint's saved-tensor hooks -> RuntimeError 'You are calling backwards on a tensor that
    is never exposed' (torch 1.13; 2.x's checkpoint raises its own error here too, unverified).
    policy='fused', or a first call outside the checkpoint, works."""
    fast = fj.fuse(conv_relu_gn()).train()
    x = X.clone().requires_grad_(True)
    cp.checkpoint(fast, x, use_reentrant=False).square().sum().backward()
    assert x.grad is not None


# 6. fused() of a class that is already fused.
def test_fused_of_a_fused_class(gpu):
    """Drop-in: RecursionError on the first call (fused(type(fj.fuse(m))) alike); fuse() of a
    fused module handles it (_fusejit_original)."""
    m = fj.fused(fj.fused(ConvRelu))().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            m(X)


# 7. torch.jit.script: the original scripts, the fused module does not.
def test_jit_script(gpu):
    """Drop-in: torch.jit.frontend.NotSupportedError: Compiled functions can't take variable
    number of arguments (forward is _fused_forward(*args, **kwargs)); nn.Module's
    __prepare_scriptable__ could hand TorchScript the original module."""
    torch.manual_seed(0)
    orig = ConvRelu().eval()
    torch.jit.script(orig)
    s = torch.jit.script(fj.fuse(copy.deepcopy(orig)))
    with torch.no_grad():
        assert torch.allclose(s(X), orig(X), atol=1e-5)


# 8. A tensor subclass input (MONAI's MetaTensor, a __torch_function__ wrapper).
def test_tensor_subclass_output_type(gpu):
    """Original: the output is the input's subclass (__torch_function__ propagates it; MONAI's
    MetaTensor carries its affine/meta this way). Drop-in: a plain torch.Tensor (the kernel's
    output from torch.empty), the subclass's __torch_function__ never sees the chain's ops; the
    values are right. (The fast path already skips such inputs: type(x) is not torch.Tensor.)"""
    class Meta(torch.Tensor):
        pass
    orig = conv_relu_gn().eval()
    fast = fj.fuse(copy.deepcopy(orig))
    x = X.as_subclass(Meta)
    with torch.no_grad():
        assert type(orig(x)) is Meta
        assert type(fast(x)) is Meta, type(fast(x))
