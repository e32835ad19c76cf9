# Kernel breakdown of PyTorch eager's W3 training step in bf16 (CUDA time per kernel, ms/step).
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests/python")
from seed_models import SEEDS
from torch_dropin import randomized
from torch.profiler import profile, ProfilerActivity
wid, dn = sys.argv[1], sys.argv[2]
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dn]
cls, init, shape, _, _ = SEEDS[wid]
torch.manual_seed(0)
model = randomized(cls(*init), 1).cuda().to(dtype)
x = torch.rand(*shape, device="cuda").to(dtype).requires_grad_(True)
ps = list(model.parameters())
def step():
    y = model(x); return torch.autograd.grad(y, [x] + ps, torch.ones_like(y))
for _ in range(3): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5): step()
    torch.cuda.synchronize()
for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:14]:
    print("%8.3f ms/step  %5d  %s" % (e.device_time_total / 5000.0, e.count // 5, e.key[:110]))
