#!/usr/bin/env python3
"""One flushed training step of S3 (fused and eager, f32 and bf16) under torch.profiler with CPU
and CUDA activities: chrome traces written to $OUT (or .) for reading the host timeline (session 33).

  PYTHONPATH=python:bench FUSEJIT_LIBRARY=... python3 bench/notes/norm_train_trace_session33.py
"""
import os
import torch
from torch.profiler import profile, ProfilerActivity
import fusejit.torch as fj
from dropin_forms_speed import ROWS, randomized

out = os.environ.get("OUT", ".")
make, shape = ROWS["S3"]
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for tag, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
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
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                flush.fill_(1)
                with torch.profiler.record_function("step"):
                    step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(os.path.join(out, "s3_%s_%s.json" % (tag, name)))
        print("==", tag, name)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
