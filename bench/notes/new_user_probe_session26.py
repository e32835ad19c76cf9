# A new user's models through the drop-in (default policy "auto" and "fused"), each in f32, bf16
# and f16, inference and a training step: outputs and gradients against the float64 model,
# relative L2; the fused call counts; any exception printed with its model. Not a test: a probe
# for what the suites do not cover.
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/new_user_probe_session26.py
import copy, traceback, warnings
import torch, torch.nn as nn, torch.nn.functional as F
import fusejit.torch as fj

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


class Seq(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


class Pool(nn.Module):  # global average pooling written as users write it
    def __init__(self, cin, c, g):
        super().__init__()
        self.conv = nn.Conv3d(cin, c, 3, padding="same", bias=False)
        self.gn = nn.GroupNorm(g, c)
        self.pool = nn.AdaptiveAvgPool3d(1)

    def forward(self, x):
        x = F.silu(self.conv(x))
        return self.pool(self.gn(x)).flatten(1)


class Inplace(nn.Module):
    def __init__(self, cin, c, g):
        super().__init__()
        self.conv = nn.ConvTranspose3d(cin, c, 4, stride=2, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.gn = nn.GroupNorm(g, c)

    def forward(self, x):
        x = self.conv(x)
        self.act(x)
        return F.hardtanh(self.gn(x), -2.0, 2.0)


CASES = [
    ("seq conv-gelu-gn", lambda: Seq(nn.Conv3d(5, 12, 3, padding=1), nn.GELU(), nn.GroupNorm(3, 12)), (3, 5, 9, 10, 11)),
    ("seq conv k1 s2", lambda: Seq(nn.Conv3d(16, 16, 1, stride=2), nn.LeakyReLU(0.3)), (2, 16, 7, 8, 9)),
    ("pool same", lambda: Pool(6, 10, 5), (4, 6, 8, 8, 8)),
    ("inplace convT", lambda: Inplace(4, 8, 2), (2, 4, 5, 6, 7)),
    ("seq dilated", lambda: Seq(nn.Conv3d(3, 7, 3, dilation=2, padding=2), nn.Tanh(), nn.GroupNorm(7, 7), nn.Sigmoid()), (1, 3, 13, 9, 17)),
    ("seq convT op", lambda: Seq(nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, output_padding=1), nn.Hardswish()), (3, 8, 5, 5, 5)),
    ("gn only", lambda: Seq(nn.SiLU(), nn.GroupNorm(4, 32), nn.ReLU6()), (2, 32, 6, 7, 8)),
    ("wide k5", lambda: Seq(nn.Conv3d(32, 40, 5, padding=2), nn.ReLU(), nn.GroupNorm(8, 40)), (2, 32, 12, 12, 12)),
]


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-300))


for name, make, shape in CASES:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for policy in ("auto", "fused"):
            try:
                torch.manual_seed(0)
                model = make().cuda()
                with torch.no_grad():
                    for p in model.parameters():
                        p.copy_(torch.randn_like(p) * 0.5)
                model = model.to(dtype)
                ref = copy.deepcopy(model).double()
                x = (torch.randn(*shape, device="cuda") * 2).to(dtype)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    fast = fj.fuse(copy.deepcopy(model), policy=policy)
                    with torch.no_grad():
                        y = fast(x)
                    xr = x.detach().double().requires_grad_(True)
                    yr = ref(xr)
                    e_fwd = rel(y, yr)
                    xg = x.detach().clone().requires_grad_(True)
                    yf = fast(xg)
                    g = torch.randn_like(yr)
                    yf.backward(g.to(dtype))
                    yr.backward(g)
                    e_gx = rel(xg.grad, xr.grad)
                    e_gp = max(rel(a.grad, b.grad) for a, b in zip(fast.parameters(), ref.parameters()))
                # eager in the same dtype, for scale
                xe = x.detach().clone().requires_grad_(True)
                ye = model(xe)
                ye.backward(g.to(dtype))
                e_eager = max(rel(ye, yr), rel(xe.grad, xr.grad),
                              max(rel(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters())))
                msgs = sorted({str(m.message)[:90] for m in w})
                ok = max(e_fwd, e_gx, e_gp) <= max(1e-5, 1.5 * e_eager)
                print("%-18s %-9s %-5s fwd %.1e gx %.1e gp %.1e eager %.1e %s %s" % (
                    name, str(dtype)[6:], policy, e_fwd, e_gx, e_gp, e_eager, "ok" if ok else "WORSE",
                    msgs[:1]), flush=True)
            except Exception as e:
                print("%-18s %-9s %-5s EXCEPTION %s" % (name, str(dtype)[6:], policy, repr(e)[:300]), flush=True)
                traceback.print_exc()
print(fj._stats if hasattr(fj, "_stats") else "")
