# Session 27: the bf16 training step of a chain with nn.Hardtanh through the drop-in: gradient
# errors against float64 (random_chain_speed --train found 9.2e-2 against eager's 4.6e-3: the
# backward passed the gradient at the bounds, PyTorch's hardtanh does not).
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/hardtanh_bounds_check_session27.py
import copy, os, sys, warnings
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusejit.torch as fj
from compare_pytorch import build

for spec in ["x:f32[2,6,39,37,28] | clamp(min=-0.5,max=0.5) | group_norm(groups=2) | hardswish",
             "x:f32[2,4,16,16,16] | conv3d(out=8,k=3,padding=1) | clamp(min=0,max=6) | group_norm(groups=2)"]:
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        shape, model = build(spec)  # clamp is built as nn.Hardtanh
        model = model.cuda().to(dtype)
        ref = copy.deepcopy(model).double()
        fast = fj.fuse(copy.deepcopy(model), policy="fused")
        x = torch.randn(*shape, device="cuda").to(dtype)
        gy = (torch.rand(model(x).shape, device="cuda") * 2 - 1).to(dtype)
        xd = x.double().requires_grad_(True)
        ref(xd).backward(gy.double())
        want = [xd.grad] + [p.grad for p in ref.parameters()]
        out = []
        for m in (fast, model):
            xr = x.clone().requires_grad_(True)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                m(xr).backward(gy)
            got = [xr.grad] + [p.grad for p in m.parameters()]
            out.append(max(float((a.double() - b).norm() / b.norm()) for a, b in zip(got, want)))
        print("%s %s: grad err fused %.1e eager %.1e; warnings %s" % (
            spec[:60], dtype, out[0], out[1], [str(m.message)[:90] for m in w][:1]), flush=True)
