#!/usr/bin/env python3
"""Host time of the drop-in's training step on a chain without a convolution (S3, session 33):
wall time per step back to back (no flush), and a cProfile of 200 fused steps (top by tottime).

  PYTHONPATH=python:bench FUSEJIT_LIBRARY=... python3 bench/notes/norm_train_host_session33.py
"""
import cProfile
import pstats
import sys
import time
import torch
import fusejit.torch as fj
from dropin_forms_speed import ROWS, randomized

rid = sys.argv[1] if len(sys.argv) > 1 else "S3"
make, shape = ROWS[rid]
for dtype in (torch.float32, torch.bfloat16):
    model = randomized(make(), 0).cuda().to(dtype)
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(True)
    gy = torch.rand(model(x).shape, device="cuda").to(dtype)
    params = list(model.parameters())
    for name, m in (("fused", fast), ("eager", model)):
        def step():
            x.grad = None
            for p in params:
                p.grad = None
            m(x).backward(gy)
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            step()
        host = (time.perf_counter() - t) / 200
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 200
        print("%s %s %s: host enqueue %.1f us/step, wall %.1f us/step" % (rid, dtype, name, host * 1e6, wall * 1e6))
        if name == "fused":
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                step()
            pr.disable()
            torch.cuda.synchronize()
            pstats.Stats(pr).sort_stats("tottime").print_stats(22)
