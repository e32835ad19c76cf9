#!/usr/bin/env python3
"""Where the drop-in's training step spends host time on small chains (session 28): per-step
wall time over many back-to-back steps (host-bound when the kernels are tiny), the flushed
CUDA-event median (as bench/random_chain_speed.py --train measures), and a cProfile of the fused
steps, for a lone elementwise op and a small conv chain, f32 and bf16.

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/dropin_train_overhead_session28.py
"""
import cProfile
import os
import pstats
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import build, time_cuda  # noqa: E402

SPECS = ["x:f32[2,20,31,23,14] | gelu",
         "x:f32[2,6,39,37,28] | clamp(min=-0.5,max=0.5) | group_norm(groups=2) | hardswish",
         "x:f32[4,8,16,16,16] | conv3d(out=16,k=3,padding=1) | relu | group_norm(groups=4)"]


def main():
    for spec in SPECS:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            shape, model = build(spec)
            model = model.cuda().to(dtype)
            fast = fj.fuse(model, policy="fused")
            x = torch.rand(*shape, device="cuda").to(dtype).requires_grad_(True)
            gy = torch.rand(model(x).shape, device="cuda").to(dtype)
            params = list(model.parameters())
            for name, m in (("fused", fast), ("eager", model)):
                def step():
                    x.grad = None
                    for p in params:
                        p.grad = None
                    m(x).backward(gy)
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    step()
                host = (time.perf_counter() - t0) / 200 * 1e3
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / 200 * 1e3
                flushed = time_cuda(step, 20)
                print("%-5s %-4s host %.3f ms/step, back-to-back %.3f, flushed median %.3f  %s" % (
                    name, str(dtype)[6:], host, wall, flushed, spec), flush=True)
            if dtype == torch.float32 and spec == SPECS[0]:
                def steps():
                    for _ in range(200):
                        x.grad = None
                        fast(x).backward(gy)
                    torch.cuda.synchronize()
                prof = cProfile.Profile()
                prof.runcall(steps)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
