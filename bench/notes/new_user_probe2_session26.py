# More of a new user's usage of the drop-in: memory formats, views, no-grad inputs, inference
# mode, dtype/device moves after fuse(), state_dict round trips, pickling, double backward,
# torch.compile of a training step. Each case prints ok / a mismatch / the exception.
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/new_user_probe2_session26.py
import copy, io, pickle, traceback, warnings
import torch, torch.nn as nn
import fusejit.torch as fj

torch.backends.cudnn.allow_tf32 = False


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return torch.relu(self.gn(torch.nn.functional.silu(self.conv(x))))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / (b.norm() + 1e-300))


def fresh(seed=0):
    torch.manual_seed(seed)
    m = M().cuda()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return m


def case(name, fn):
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = fn()
        msgs = sorted({str(m.message)[:110] for m in w})
        print("%-34s %s %s" % (name, out, msgs[:2]), flush=True)
    except Exception as e:
        print("%-34s EXCEPTION %s" % (name, repr(e)[:300]), flush=True)


x0 = torch.randn(2, 4, 6, 7, 8, device="cuda")


def forward_err(fast, ref, x):
    with torch.no_grad():
        return "err %.1e" % rel(fast(x), ref.double()(x.double()))


case("channels_last_3d input", lambda: forward_err(fj.fuse(fresh(), policy="fused"), fresh(),
                                                   x0.to(memory_format=torch.channels_last_3d)))
case("non-contiguous input view", lambda: forward_err(
    fj.fuse(fresh(), policy="fused"), fresh(),
    torch.randn(2, 4, 6, 7, 16, device="cuda")[..., ::2]))
def inference_mode():
    f, r = fj.fuse(fresh(), policy="fused"), fresh()
    with torch.inference_mode():
        return forward_err(f, r, x0)


case("inference_mode", inference_mode)


def params_only_grad():
    f, r = fj.fuse(fresh(), policy="fused"), fresh().double()
    f(x0).sum().backward()
    r(x0.double()).sum().backward()
    return "grad err %.1e" % max(rel(a.grad, b.grad) for a, b in zip(f.parameters(), r.parameters()))


case("x without grad, params with", params_only_grad)


def half_after_fuse():
    f = fj.fuse(fresh(), policy="fused")
    f.half()
    r = fresh().half().double()
    with torch.no_grad():
        y = f(x0.half())
    return "dtype %s err %.1e" % (y.dtype, rel(y, r(x0.half().double())))


case("model.half() after fuse", half_after_fuse)


def cpu_after_fuse():
    f = fj.fuse(fresh(), policy="fused")
    f.cpu()
    with torch.no_grad():
        y = f(x0.cpu())
    return "device %s err %.1e" % (y.device, rel(y, fresh().cpu().double()(x0.cpu().double())))


case("model.cpu() after fuse", cpu_after_fuse)


def state_dict_roundtrip():
    f = fj.fuse(fresh(0), policy="fused")
    f(x0)
    f.load_state_dict(fresh(1).state_dict())
    with torch.no_grad():
        return "after load_state_dict err %.1e" % rel(f(x0), fresh(1).double()(x0.double()))


case("load_state_dict after calls", state_dict_roundtrip)


def save_load():
    f = fj.fuse(fresh(), policy="fused")
    buf = io.BytesIO()
    torch.save(f.state_dict(), buf)
    buf.seek(0)
    keys = list(torch.load(buf).keys())
    return "state_dict keys %s" % keys


case("torch.save(state_dict)", save_load)


def pickle_model():
    f = fj.fuse(fresh(), policy="fused")
    f(x0)
    g = pickle.loads(pickle.dumps(f))
    with torch.no_grad():
        return "unpickled err %.1e" % rel(g(x0), fresh().double()(x0.double()))


case("pickle the fused model", pickle_model)


def deepcopy_model():
    f = fj.fuse(fresh(), policy="fused")
    f(x0)
    g = copy.deepcopy(f)
    with torch.no_grad():
        g.conv.weight.mul_(2)
        return "copy err %.1e, original err %.1e" % (
            rel(g(x0), (lambda r: (r.conv.weight.data.mul_(2), r)[1])(fresh()).double()(x0.double())),
            rel(f(x0), fresh().double()(x0.double())))


case("deepcopy, then change the copy", deepcopy_model)


def replace_param():
    f = fj.fuse(fresh(0), policy="fused")
    f(x0)
    f.conv.weight = nn.Parameter(fresh(1).conv.weight.detach().clone())
    r = fresh(0)
    r.conv.weight = nn.Parameter(fresh(1).conv.weight.detach().clone())
    with torch.no_grad():
        return "err %.1e" % rel(f(x0), r.double()(x0.double()))


case("replace a Parameter after calls", replace_param)


def double_backward():
    f = fj.fuse(fresh(), policy="fused")
    x = x0.clone().requires_grad_(True)
    y = f(x).square().sum()
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    gx.sum().backward()
    r = fresh().double()
    xr = x0.double().requires_grad_(True)
    (gr,) = torch.autograd.grad(r(xr).square().sum(), xr, create_graph=True)
    gr.sum().backward()
    return "gx err %.1e, grad of grad err %.1e" % (
        rel(gx, gr), max(rel(a.grad, b.grad) for a, b in zip(f.parameters(), r.parameters())))


case("double backward (create_graph)", double_backward)


def compiled_training():
    f = fj.fuse(fresh(), policy="fused")
    step = torch.compile(lambda x: f(x).square().mean())
    x = x0.clone().requires_grad_(True)
    step(x).backward()
    r = fresh().double()
    xr = x0.double().requires_grad_(True)
    r(xr).square().mean().backward()
    return "gx err %.1e" % rel(x.grad, xr.grad)


case("torch.compile training step", compiled_training)


def batch_one_big():
    f = fj.fuse(fresh(), policy="fused")
    x = torch.randn(1, 4, 40, 48, 56, device="cuda")
    return forward_err(f, fresh(), x)


case("batch 1, larger volume", batch_one_big)


def varying_shapes():
    f = fj.fuse(fresh())  # auto
    errs = []
    for s in [(1, 4, 5, 5, 5), (3, 4, 9, 6, 7), (2, 4, 6, 7, 8), (1, 4, 5, 5, 5)]:
        x = torch.randn(*s, device="cuda")
        with torch.no_grad():
            errs.append(rel(f(x), fresh().double()(x.double())))
    return "max err %.1e over 4 shapes" % max(errs)


case("auto policy, shapes changing", varying_shapes)
print(fj._stats)
