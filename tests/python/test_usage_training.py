"""Training-loop usage: the same script on the original and on the drop-in twin, compared step by
step (outputs, gradients, parameters, buffers)."""
import copy
import io
import inspect
import pickle
import warnings

import pytest
import torch
import torch.nn as nn

import fusejit.torch as fj
from gpu_pretend import CALLS, fusejit_warnings
from usage_models import (ConvBN, ConvDrop, ConvGN, ConvIN, ConvMean, ConvScale, ConvT, PoolHead, close, make, pair,
                          tensors, x_of)

TRAINABLE = [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead, ConvMean, ConvT]


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def same_state(a, b, tol=1e-4):
    assert a.keys() == b.keys()
    for k in a:
        if a[k].dtype.is_floating_point:
            close(a[k], b[k], tol)
        else:
            assert torch.equal(a[k], b[k]), k


def twin_run(cls, script, seed=0, tol=1e-4):
    """script(model, step_log) on both; compares every logged value and the final state."""
    orig, fast = pair(cls, seed)
    logs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (orig, fast):
            log = []
            torch.manual_seed(123)
            script(m, log)
            logs.append(log)
    ours = fusejit_warnings(caught)
    assert len(logs[0]) == len(logs[1])
    for i, (a, b) in enumerate(zip(logs[1], logs[0])):
        if isinstance(a, dict):
            same_state(a, b, tol)
        elif a is None or b is None:
            assert a is None and b is None, i
        else:
            close(a, b, tol)
    same_state(state(fast), state(orig), tol)
    return orig, fast, ours


def _loss(y):
    return sum((t.float() ** 2).mean() for t in tensors(y))


@pytest.mark.parametrize("cls", TRAINABLE)
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_optimizer_loop(gpu, cls, opt_name, set_to_none):
    if opt_name == "adam" and cls in (ConvBN, ConvIN):
        pytest.skip("conv bias before a batch-statistics norm: gradient is rounding noise, "
                    "Adam amplifies it (probe artifact)")
    def script(m, log):
        m.train()
        opt = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) if opt_name == "sgd"
               else torch.optim.Adam(m.parameters(), lr=1e-2))
        for step in range(4):
            x = x_of(seed=step)
            opt.zero_grad(set_to_none=set_to_none)
            y = m(x)
            log.append(y.detach())
            _loss(y).backward()
            opt.step()
            log.append(state(m))
        with torch.no_grad():
            log.append(m.eval()(x_of(seed=9)))
    # (Adam turns near-zero gradient entries' rounding into steps of ~lr: looser there)
    _, _, ours = twin_run(cls, script, tol=1e-3 if opt_name == "adam" else 1e-4)
    assert not ours, ours
    if cls is not PoolHead:
        assert CALLS["training_forward"] + CALLS["run"] > 0


@pytest.mark.parametrize("cls", TRAINABLE)
def test_gradient_accumulation_and_clip(gpu, cls):
    def script(m, log):
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            for micro in range(3):
                x = x_of(shape=(1, 3, 8, 8, 8), seed=10 * step + micro)
                (_loss(m(x)) / 3).backward()
            log.append(grads_list(m))
            n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            log.append(n.detach().reshape(1))
            opt.step()
            opt.zero_grad()
    twin_run(cls, script)


def grads_list(m):
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros(1)
            for p in m.parameters()]


@pytest.mark.parametrize("cls", TRAINABLE + [ConvDrop])
def test_train_eval_switching(gpu, cls):
    """train step, validation under no_grad, validation WITHOUT no_grad (a common slip: eval
    mode, grads on), train step again; twice, so the fast paths serve the second round."""
    def script(m, log):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for rnd in range(2):
            m.train()
            if cls is not ConvDrop:
                y = m(x_of(seed=rnd))
                _loss(y).backward()
                log.append(y.detach())
                opt.step()
                opt.zero_grad()
            m.eval()
            with torch.no_grad():
                log.append(m(x_of(seed=5)))
            y = m(x_of(seed=6))  # eval, grad enabled, parameters require grad
            log.append(y.detach())
            assert y.requires_grad
            _loss(y).backward()  # (an eval-mode loss backward: fine-tuning with frozen BN)
            log.append(grads_list(m))
            opt.zero_grad()
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, PoolHead])
def test_frozen_layers(gpu, cls):
    """requires_grad_(False) on the convolution after a first step (freeze the backbone), then
    unfrozen again."""
    def script(m, log):
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(5):
            if step == 1:
                m.conv.requires_grad_(False)
            if step == 3:
                m.conv.requires_grad_(True)
            opt.zero_grad(set_to_none=True)
            y = m(x_of(seed=step))
            _loss(y).backward()
            log.append([p.grad.detach().clone() if p.grad is not None else torch.zeros(1)
                        for p in m.parameters()])
            opt.step()
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead])
def test_all_frozen_input_grad(gpu, cls):
    """a frozen model used as a loss (perceptual loss): parameters frozen, gradient w.r.t. x."""
    def script(m, log):
        m.eval().requires_grad_(False)
        for step in range(3):
            x = x_of(seed=step).requires_grad_(True)
            y = m(x)
            _loss(y).backward()
            log.append(x.grad)
        m.train()
        x = x_of(seed=7).requires_grad_(True)
        _loss(m(x)).backward()
        log.append(x.grad)
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_parameter_replaced(gpu, cls, mode):
    """model.conv.weight = nn.Parameter(...) between calls (weight surgery / reinit)."""
    def script(m, log):
        getattr(m, mode)()
        for step in range(4):
            if step == 2:
                g = torch.Generator().manual_seed(5)
                m.conv.weight = nn.Parameter(torch.randn(m.conv.weight.shape, generator=g) * 0.2)
            if step == 3:
                m.conv.bias = nn.Parameter(torch.zeros_like(m.conv.bias) + 0.3)
            x = x_of(seed=step).requires_grad_(True)
            y = m(x)
            log.append(y.detach())
            _loss(y).backward()
            log.append(x.grad)
            log.append(m.conv.weight.grad.clone())
            m.zero_grad()
            with torch.no_grad():
                log.append(m(x_of(seed=step)))
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_load_state_dict_between_calls(gpu, cls, mode):
    other = make(cls, seed=7).state_dict()

    def script(m, log):
        getattr(m, mode)()
        for step in range(3):
            with torch.no_grad():
                log.append(m(x_of(seed=step)))
            x = x_of(seed=step).requires_grad_(True)
            _loss(m(x)).backward()
            log.append(x.grad)
            m.load_state_dict(other)
            if step == 1:  # strict=False with a subset, and assign through state_dict tensors
                sd = m.state_dict()
                sd["conv.weight"].mul_(0.5)
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead])
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copy_after_training(gpu, cls, how):
    """copy after some training steps (fast paths ready, decisions made), then keep training the
    copy and the original independently."""
    def script(m, log):
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(2):
            _loss(m(x_of(seed=step))).backward()
            opt.step()
            opt.zero_grad()
        if how == "deepcopy":
            c = copy.deepcopy(m)
        elif how == "pickle":
            c = pickle.loads(pickle.dumps(m))
        else:
            buf = io.BytesIO()
            torch.save(m, buf)
            buf.seek(0)
            c = torch.load(buf, weights_only=False) if "weights_only" in \
                inspect.signature(torch.load).parameters else torch.load(buf)
        assert fj.is_fused(c) == fj.is_fused(m)
        opt2 = torch.optim.SGD(c.parameters(), lr=0.05)
        for step in range(2):
            _loss(c(x_of(seed=10 + step))).backward()
            opt2.step()
            opt2.zero_grad()
        log.append(state(c))
        log.append(state(m))  # unchanged by the copy's training
        c.eval()
        with torch.no_grad():
            log.append(c(x_of(seed=3)))
            log.append(m.eval()(x_of(seed=3)))
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead, ConvDrop])
def test_state_dict_round_trip(gpu, cls):
    orig = make(cls, 3)
    Fused = fj.fused(cls)
    f = Fused()
    assert list(f.state_dict()) == list(orig.state_dict())
    f.load_state_dict(orig.state_dict())
    back = cls()
    back.load_state_dict(f.state_dict())
    same_state(state(back), state(orig), 0)
    fast = fj.fuse(orig)
    assert list(fast.state_dict()) == list(orig.state_dict())
    assert [n for n, _ in fast.named_buffers()] == [n for n, _ in orig.named_buffers()]
    assert [n for n, _ in fast.named_modules()] == [n for n, _ in orig.named_modules()]
    f.eval(); orig.eval()
    with torch.no_grad():
        close(f(x_of()), orig(x_of()))


class ConvBNDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.bn = nn.BatchNorm3d(8)
        self.drop = nn.Dropout3d(0.3)
        self.conv2 = nn.Conv3d(8, 4, 1)

    def forward(self, x):
        return torch.relu(self.conv2(self.drop(F.silu(self.bn(self.conv(x))))))


import torch.nn.functional as F  # noqa: E402


@pytest.mark.parametrize("cls", [ConvBN, ConvBNDrop])
def test_frozen_batchnorm_finetune(gpu, cls):
    """model.train() then every BatchNorm back to eval (frozen statistics), the usual fine-tune."""
    def script(m, log):
        m.train()
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm3d):
                mod.eval()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(3):
            y = m(x_of(seed=step))
            log.append(y.detach())
            _loss(y).backward()
            log.append(grads_list(m))
            opt.step()
            opt.zero_grad()
    twin_run(cls, script)


@pytest.mark.parametrize("cls", [ConvDrop, ConvBNDrop])
def test_dropout_training_same_seed(gpu, cls):
    """training with dropout from the same seed: the original's masks, so the same outputs."""
    def script(m, log):
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(3):
            y = m(x_of(seed=step))
            log.append(y.detach())
            _loss(y).backward()
            opt.step()
            opt.zero_grad()
        log.append(torch.get_rng_state().double()[:64])
    _, _, ours = twin_run(cls, script)
    assert not ours, ours
