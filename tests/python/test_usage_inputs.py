"""Inputs: batch sizes, layouts, dtypes, ranks, subclasses, zero-size batches."""
import warnings

import pytest
import torch
import torch.nn as nn

from gpu_pretend import fusejit_warnings
from usage_models import (ConvBN, ConvGN, ConvIN, ConvMean, ConvScale, ConvT, PoolHead, close, grads, pair,
                          same_grads, tensors, x_of)

MODELS = [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead, ConvMean, ConvT]


def both(orig, fast, x, grad=False, mode="eval"):
    getattr(orig, mode)(); getattr(fast, mode)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = [None, None]
        out = [None, None]
        for i, m in enumerate((orig, fast)):
            xi = x.detach().clone() if not grad else x.detach().clone().requires_grad_(True)
            if x.dim() == 5 and x.stride() != x.contiguous().stride():  # keep the layout
                xi = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
                xi.copy_(x)
                xi.requires_grad_(grad)
            try:
                with torch.set_grad_enabled(grad):
                    y = m(xi)
                    if grad:
                        _ = sum(t.float().square().sum() for t in tensors(y)).backward()
                out[i] = (y, xi.grad if grad else None, grads(m))
            except Exception as e:
                err[i] = e
    return out, err, fusejit_warnings(caught)


def check(orig, fast, x, grad=False, mode="eval", tol=1e-4):
    out, err, ours = both(orig, fast, x, grad, mode)
    assert (err[0] is None) == (err[1] is None), (repr(err[0])[:200], repr(err[1])[:300])
    if err[0] is not None:
        assert type(err[0]) is type(err[1]), (repr(err[0])[:200], repr(err[1])[:300])
        return ours, err
    (ya, ga, pa), (yb, gb, pb) = out
    close(yb, ya, tol)
    if grad:
        close(gb, ga, tol)
        same_grads(pb, pa, tol)
    return ours, None


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("grad", [False, True])
def test_batch_sizes_across_calls(gpu, cls, grad):
    orig, fast = pair(cls)
    for n in (1, 2, 1, 5, 2, 3):
        orig.zero_grad(); fast.zero_grad()
        check(orig, fast, x_of(shape=(n, 3, 8, 8, 8), seed=n), grad, "train" if grad else "eval")
    for s in ((2, 3, 9, 7, 8), (1, 3, 4, 4, 4), (2, 3, 8, 8, 8)):
        orig.zero_grad(); fast.zero_grad()
        check(orig, fast, x_of(shape=s, seed=3), grad, "train" if grad else "eval")


LAYOUTS = {
    # name: (base shape, view of the base)
    "permuted": ((2, 8, 8, 8, 3), lambda b: b.permute(0, 4, 1, 2, 3)),
    "transposed": ((2, 3, 8, 8, 8), lambda b: b.transpose(2, 4)),
    "sliced_batch": ((4, 3, 8, 8, 8), lambda b: b[1:3]),       # contiguous, offset 1536 floats
    "sliced_step": ((4, 3, 8, 8, 8), lambda b: b[::2]),
    "sliced_spatial": ((2, 3, 10, 8, 8), lambda b: b[:, :, 1:9]),
    "channels_last_3d": ((2, 3, 8, 8, 8), lambda b: b.to(memory_format=torch.channels_last_3d)),
    "expanded": ((1, 3, 8, 8, 8), lambda b: b.expand(2, 3, 8, 8, 8)),
    "offset1": ((2 * 3 * 512 + 1,), lambda b: b[1:].view(2, 3, 8, 8, 8)),  # misaligned
    "offset4": ((2 * 3 * 512 + 4,), lambda b: b[4:].view(2, 3, 8, 8, 8)),  # 16-byte aligned
}


def run_view(m, layout, grad, seed=0):
    shape, view = LAYOUTS[layout]
    base = x_of(shape=shape, seed=seed)
    if layout == "contiguous":
        pass
    base.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        x = view(base)
        y = m(x)
        if grad:
            sum(t.square().sum() for t in tensors(y)).backward()
    return y, base.grad, grads(m)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("grad", [False, True])
def test_non_contiguous_inputs(gpu, cls, layout, grad):
    orig, fast = pair(cls)
    mode = "train" if grad else "eval"
    getattr(orig, mode)()
    getattr(fast, mode)()
    shape, view = LAYOUTS[layout]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        # first a contiguous call (fast paths armed), then the layout twice, then contiguous
        for i in range(4):
            orig.zero_grad(); fast.zero_grad()
            if i in (0, 3):
                check(orig, fast, view(x_of(shape=shape)).contiguous(), grad, mode)
                continue
            ya, ga, pa = run_view(orig, layout, grad, seed=i)
            yb, gb, pb = run_view(fast, layout, grad, seed=i)
            close(yb, ya)
            if grad:
                close(gb, ga, 1e-4)
                same_grads(pb, pa)


@pytest.mark.parametrize("cls", MODELS)
def test_channels_last_model(gpu, cls):
    """the model converted to channels_last_3d (weights non-contiguous in NCDHW terms)."""
    if cls is ConvScale:
        pytest.skip("a 4-D parameter: PyTorch refuses .to(channels_last_3d) (probe artifact)")
    orig, fast = pair(cls)
    orig = orig.to(memory_format=torch.channels_last_3d)
    fast = fast.to(memory_format=torch.channels_last_3d)
    x = x_of().to(memory_format=torch.channels_last_3d)
    ours, _ = check(orig, fast, x)
    ours2, _ = check(orig, fast, x.contiguous(), grad=True, mode="train")


@pytest.mark.parametrize("cls", MODELS)
def test_input_requires_grad_in_eval(gpu, cls):
    orig, fast = pair(cls)
    orig.requires_grad_(False); fast.requires_grad_(False)
    for _ in range(3):
        check(orig, fast, x_of(), grad=True, mode="eval")


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
def test_other_dtype_input(gpu, cls, dtype):
    """a float32 model called on another dtype: PyTorch raises (dtype mismatch); the drop-in
    should raise the same kind of error (not run, not a cryptic one)."""
    orig, fast = pair(cls)
    x = x_of()
    x = (x > 0) if dtype is torch.bool else (x * 3).to(dtype)
    ours, err = check(orig, fast, x)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_model_of_other_dtype(gpu, cls, dtype):
    orig, fast = pair(cls)
    orig.to(dtype); fast.to(dtype)
    x = x_of(dtype=dtype)
    tol = 1e-4 if dtype is torch.float64 else 3e-2
    if dtype is not torch.float64:
        pytest.skip("(CPU half convs: PyTorch CPU lacks some; not probed)")
    check(orig, fast, x, tol=tol)
    check(orig, fast, x, grad=True, mode="train", tol=tol)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("shape", [(3, 8, 8, 8), (2, 3, 8, 8), (2, 3, 8, 8, 8, 1), (3, 8, 8),
                                   (2, 5, 8, 8, 8)])
def test_other_rank_or_channels(gpu, cls, shape):
    orig, fast = pair(cls)
    for _ in range(2):
        check(orig, fast, x_of(shape=shape))
        check(orig, fast, x_of(shape=shape), grad=True, mode="train")


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("grad", [False, True])
def test_zero_size_batch(gpu, cls, grad):
    orig, fast = pair(cls)
    check(orig, fast, x_of(), grad, "train" if grad else "eval")
    check(orig, fast, x_of(shape=(0, 3, 8, 8, 8)), grad, "train" if grad else "eval")
    check(orig, fast, x_of(), grad, "train" if grad else "eval")


class MyTensor(torch.Tensor):
    pass


class Logged(torch.Tensor):
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("sub", [MyTensor, Logged, nn.Parameter])
def test_tensor_subclass_input(gpu, cls, sub):
    orig, fast = pair(cls)
    x = x_of()
    xs = x.as_subclass(sub) if sub is not nn.Parameter else nn.Parameter(x.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        orig.eval(); fast.eval()
        with torch.no_grad():
            ya, yb = orig(xs), fast(xs)
            yb2 = fast(xs)
    close(yb, ya)
    close(yb2, ya)
    assert type(yb) is type(ya), (type(yb), type(ya))
