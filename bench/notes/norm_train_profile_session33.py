#!/usr/bin/env python3
"""Why S3's training step (GroupNorm(4,32) -> *1.5 -> tanh on [16,32,16,32,32], no convolution)
runs slower through the drop-in than eager (session 33): the kernels of one fused and one eager
step under torch.profiler (CUDA time per kernel), f32 and bf16.

  PYTHONPATH=python:bench FUSEJIT_LIBRARY=... python3 bench/notes/norm_train_profile_session33.py
"""
import sys
import torch
import torch.nn as nn
from torch.profiler import profile, ProfilerActivity
import fusejit.torch as fj
from dropin_forms_speed import ROWS, randomized

for rid in (sys.argv[1:] or ["S3"]):
    for dtype in (torch.float32, torch.bfloat16):
        make, shape = ROWS[rid]
        model = randomized(make(), 0).cuda().to(dtype)
        fast = fj.fuse(model, policy="fused")
        x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(True)
        gy = torch.rand(model(x).shape, device="cuda").to(dtype)
        for name, m in (("fused", fast), ("eager", model)):
            def step():
                x.grad = None
                for p in model.parameters():
                    p.grad = None
                m(x).backward(gy)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            print("==", rid, dtype, name)
            for e in prof.key_averages():
                if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0:
                    t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                    if t > 0:
                        print("  %8.1f us  x%d  %s" % (t, e.count, e.key[:110]))
