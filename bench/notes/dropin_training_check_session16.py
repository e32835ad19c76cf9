# Session 16 check: does the drop-in's training step take the saved pair, and what does the step
# cost in Python (CUDA events, and CPU wall time per step)?
import copy, os, sys, time
import torch
sys.path.insert(0, "tests/python"); sys.path.insert(0, "bench")
import fusejit.torch as fj
from compare_pytorch import time_cuda
from seed_models import SEEDS
from torch_dropin import randomized
for wid, dt in [("W3", torch.bfloat16), ("W4", torch.bfloat16), ("W4", torch.float32), ("W1", torch.bfloat16)]:
    cls, init, shape, _, _ = SEEDS[wid]
    torch.manual_seed(0)
    model = randomized(cls(*init), 1).cuda().to(dt)
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    x = torch.rand(*shape, device="cuda").to(dt).requires_grad_(True)
    with torch.no_grad():
        g = torch.randn(fast(x).shape, device="cuda").to(dt)
    ps = list(fast.parameters())
    step = lambda: torch.autograd.grad(fast(x), [x] + ps, g)
    before = dict(fj._stats); step(); torch.cuda.synchronize(); after = dict(fj._stats)
    ms = time_cuda(step, 5)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): step()
    cpu = (time.perf_counter() - t) / 10 * 1e3
    torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 10 * 1e3
    print(wid, dt, "stats delta", {k: after[k] - before[k] for k in after}, "step ms %.3f" % ms,
          "cpu enqueue ms/step %.3f wall ms/step %.3f" % (cpu, wall), flush=True)
