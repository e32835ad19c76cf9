# The drop-in's W3 bf16 training step: every CUDA kernel and its time per step (torch.profiler),
# and the step's wall time with and without the profiler.
import copy, sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests/python")
import fusejit.torch as fj
from seed_models import SEEDS
from torch_dropin import randomized
from torch.profiler import profile, ProfilerActivity
cls, init, shape, _, _ = SEEDS["W3"]
torch.manual_seed(0)
model = randomized(cls(*init), 1).cuda().to(torch.bfloat16)
fast = fj.fuse(copy.deepcopy(model), policy="fused")
x = torch.rand(*shape, device="cuda").to(torch.bfloat16).requires_grad_(True)
ps = list(fast.parameters())
with torch.no_grad():
    g = torch.randn(fast(x).shape, device="cuda").to(torch.bfloat16)
def step():
    return torch.autograd.grad(fast(x), [x] + ps, g)
for _ in range(3): step()
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
print("step (no L2 flush) median %.3f ms" % sorted(ts)[5])
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(5): step()
    torch.cuda.synchronize()
for ev in sorted(prof.key_averages(), key=lambda ev: -ev.device_time_total)[:25]:
    if ev.device_time_total > 0:
        print("%8.3f ms/step  %5.1f/step  %s" % (ev.device_time_total / 5000.0, ev.count / 5, ev.key[:100]))
print(fj._stats)
