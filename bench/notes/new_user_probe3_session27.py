# A third round of a new user's usage of the drop-in (session 27): DataParallel, buffers, hooks,
# frozen parameters, gradient accumulation, an optimizer loop, autocast training under the auto
# policy, an output used twice, retain_graph. Each case prints ok / a mismatch / the exception.
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/new_user_probe3_session27.py
import copy, traceback, warnings
import torch, torch.nn as nn, torch.nn.functional as F
import fusejit.torch as fj

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return torch.relu(self.gn(F.silu(self.conv(x))))


class WithBuffer(M):
    """A buffer that the forward uses (outside the grammar) and one that it does not."""
    def __init__(self, use):
        super().__init__()
        self.use = use
        self.register_buffer("scale", torch.full((1, 8, 1, 1, 1), 0.5))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        y = super().forward(x)
        return y * self.scale if self.use else y


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / (b.norm() + 1e-300))


def init(m, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return m


def fresh(seed=0, cls=M, *a):
    return init(cls(*a).cuda(), seed)


def case(name, fn):
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = fn()
        msgs = sorted({str(m.message)[:110] for m in w})
        print("%-36s %s %s" % (name, out, msgs[:2]), flush=True)
    except Exception as e:
        print("%-36s EXCEPTION %s" % (name, repr(e)[:300]), flush=True)
        traceback.print_exc()


x0 = torch.randn(2, 4, 6, 7, 8, device="cuda")


def grads_err(f, r, x, loss=lambda y: y.square().sum()):
    """Training step through f (fused) and r (float64 copy): max rel error of every gradient."""
    xf = x.clone().requires_grad_(True)
    xr = x.double().requires_grad_(True)
    loss(f(xf)).backward()
    loss(r(xr)).backward()
    errs = [rel(xf.grad, xr.grad)]
    for (n, a), b in zip(f.named_parameters(), r.parameters()):
        if a.grad is None or b.grad is None:
            errs.append(0.0 if a.grad is None and b.grad is None else float("inf"))
        else:
            errs.append(rel(a.grad, b.grad))
    return max(errs)


def data_parallel():
    f = nn.DataParallel(fj.fuse(fresh(), policy="fused"))
    return "grad err %.1e" % grads_err(f, fresh().double(), x0)


case("nn.DataParallel(fused) (1 GPU)", data_parallel)


def buffers(use):
    def run():
        f = fj.fuse(fresh(0, WithBuffer, use), policy="fused")
        r = fresh(0, WithBuffer, use).double()
        with torch.no_grad():
            e = rel(f(x0), r(x0.double()))
        keys = sorted(f.state_dict().keys())
        return "err %.1e, buffers in state_dict %s" % (e, [k for k in keys if "scale" in k or
                                                            "steps" in k])
    return run


case("buffer used in forward", buffers(True))
case("buffer not used in forward", buffers(False))


def forward_hook():
    f = fj.fuse(fresh(), policy="fused")
    seen = []
    f.conv.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        f(x0)
    return "conv hook called %d times" % len(seen)


case("forward hook on a submodule", forward_hook)


def model_hook():
    f = fj.fuse(fresh(), policy="fused")
    seen = []
    f.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        f(x0)
    return "model hook called %d times" % len(seen)


case("forward hook on the model", model_hook)


def frozen_conv():
    f, r = fresh(), fresh().double()
    for m in (f, r):
        m.conv.weight.requires_grad_(False)
    f = fj.fuse(f, policy="fused")
    return "grad err %.1e, frozen grad %s" % (grads_err(f, r, x0), f.conv.weight.grad)


case("frozen conv weight", frozen_conv)


def accumulate():
    f, r = fj.fuse(fresh(), policy="fused"), fresh().double()
    x1 = torch.randn_like(x0)
    for x in (x0, x1):
        f(x).square().sum().backward()
        r(x.double()).square().sum().backward()
    return "accumulated grad err %.1e" % max(rel(a.grad, b.grad) for a, b in
                                             zip(f.parameters(), r.parameters()))


case("gradient accumulation (2 steps)", accumulate)


def optimizer_loop(policy):
    def run():
        f, r = fj.fuse(fresh(), policy=policy), fresh().double()
        of = torch.optim.SGD(f.parameters(), lr=0.05, momentum=0.9)
        orr = torch.optim.SGD(r.parameters(), lr=0.05, momentum=0.9)
        for i in range(5):
            x = torch.randn_like(x0)
            for m, o, xx in ((f, of, x), (r, orr, x.double())):
                o.zero_grad()
                m(xx).square().mean().backward()
                o.step()
        return "params after 5 SGD steps err %.1e" % max(
            rel(a, b) for a, b in zip(f.parameters(), r.parameters()))
    return run


case("optimizer loop, fused", optimizer_loop("fused"))
case("optimizer loop, auto", optimizer_loop("auto"))


def autocast_training(dtype):
    def run():
        f = fj.fuse(fresh())  # policy auto
        e = fresh()
        r = fresh().double()
        out = []
        for m in (f, e):
            x = x0.clone().requires_grad_(True)
            with torch.autocast("cuda", dtype=dtype):
                y = m(x)
            y.float().square().sum().backward()
            out.append((y, x.grad, [p.grad for p in m.parameters()]))
        xr = x0.double().requires_grad_(True)
        # float64 of the same values: the convolution's operands rounded to the autocast dtype
        yr = r(xr)
        yr.square().sum().backward()
        (yf, gf, pf), (ye, ge, pe) = out
        return "y %s vs eager %s; y err fused %.1e eager %.1e; grad x err fused %.1e eager %.1e" % (
            yf.dtype, ye.dtype, rel(yf, yr), rel(ye, yr), rel(gf, xr.grad), rel(ge, xr.grad))
    return run


case("autocast bf16 training, auto", autocast_training(torch.bfloat16))
case("autocast f16 training, auto", autocast_training(torch.float16))


def output_used_twice():
    f, r = fj.fuse(fresh(), policy="fused"), fresh().double()
    return "grad err %.1e" % grads_err(f, r, x0, loss=lambda y: (y * y).sum() + y.mean())


case("output used twice in the loss", output_used_twice)


def retain_graph():
    f, r = fj.fuse(fresh(), policy="fused"), fresh().double()
    xf = x0.clone().requires_grad_(True)
    y = f(xf).square().sum()
    y.backward(retain_graph=True)
    y.backward()
    xr = x0.double().requires_grad_(True)
    yr = r(xr).square().sum()
    yr.backward(retain_graph=True)
    yr.backward()
    return "grad err %.1e" % rel(xf.grad, xr.grad)


case("backward twice (retain_graph)", retain_graph)


def train_then_eval():
    f = fj.fuse(fresh())  # auto
    r = fresh().double()
    f.train()
    for _ in range(3):
        f(x0.clone().requires_grad_(True)).sum().backward()
    f.eval()
    with torch.no_grad():
        return "eval err %.1e after training calls" % rel(f(x0), r(x0.double()))


case("auto: train calls, then eval", train_then_eval)


def big_batch_grad():
    f, r = fj.fuse(fresh(), policy="fused"), fresh().double()
    x = torch.randn(16, 4, 12, 10, 14, device="cuda")
    return "grad err %.1e" % grads_err(f, r, x)


case("batch 16 training step", big_batch_grad)


def sequential_of_fused():
    head = lambda: init(nn.Sequential(nn.Conv3d(8, 6, 1), nn.GELU()).cuda(), 1)
    f = nn.Sequential(fj.fuse(fresh(0), policy="fused"), fj.fuse(head(), policy="fused"))
    r = nn.Sequential(fresh(0), head()).double()
    return "grad err %.1e" % grads_err(f, r, x0)


case("two fused modules in a Sequential", sequential_of_fused)


def fused_inside_parent():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = M()
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.block(x).mean(dim=[2, 3, 4]))

    p = init(Parent().cuda(), 0)
    r = copy.deepcopy(p).double()
    p.block = fj.fuse(p.block, policy="fused")
    return "grad err %.1e" % grads_err(p, r, x0)


case("fused block inside a parent", fused_inside_parent)


def fuse_parent():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = M()

        def forward(self, x):
            return self.block(x).mean(dim=[2, 3, 4])

    p = init(Parent().cuda(), 0)
    r = copy.deepcopy(p).double()
    f = fj.fuse(p, policy="fused")
    return "grad err %.1e" % grads_err(f, r, x0)


case("fuse a parent whose child is M", fuse_parent)


def channels_change_error():
    f = fj.fuse(fresh(), policy="fused")
    try:
        f(torch.randn(2, 5, 6, 7, 8, device="cuda"))
    except Exception as e:
        return "raised %s: %s" % (type(e).__name__, str(e)[:120])
    return "no error"


case("wrong channel count", channels_change_error)


def int_input_error():
    f = fj.fuse(fresh(), policy="fused")
    try:
        f(torch.randint(0, 3, (2, 4, 6, 7, 8), device="cuda"))
    except Exception as e:
        return "raised %s: %s" % (type(e).__name__, str(e)[:120])
    return "no error"


case("integer input", int_input_error)
print(fj._stats)
