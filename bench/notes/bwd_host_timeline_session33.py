#!/usr/bin/env python3
"""Where the host time of the drop-in's backward goes (session 33): timestamps (perf_counter)
at the points of one training step, medians over 300 steps, for S3 (no convolution) and a small
chain; the fusejit functions are wrapped, not changed.

  PYTHONPATH=python:bench FUSEJIT_LIBRARY=... python3 bench/notes/bwd_host_timeline_session33.py
"""
import statistics
import time
import torch
import fusejit.torch as fj
from fusejit import _lib
from dropin_forms_speed import ROWS, randomized

T = {}
now = time.perf_counter


def wrap(owner, name, tag, static=False):
    orig = getattr(owner, name)
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig

    def w(*a, **k):
        T[tag + ">"] = now()
        r = fn(*a, **k)
        T[tag + "<"] = now()
        return r
    setattr(owner, name, staticmethod(w) if static else w)


wrap(fj._ChainFunction, "backward", "bwd", static=True)
wrap(fj._ChainFunction, "forward", "fwd", static=True)
wrap(fj, "_backward", "_backward")
wrap(fj, "_launch_backward", "_launch_backward")
wrap(fj, "_aligned", "_aligned")
wrap(fj, "_new_output", "_new_output")
wrap(_lib.Chain, "run_pointers", "run_pointers")

for rid in ("S3",):
    for dtype in (torch.float32, torch.bfloat16):
        make, shape = ROWS[rid]
        model = randomized(make(), 0).cuda().to(dtype)
        fast = fj.fuse(model, policy="fused")
        x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(True)
        gy = torch.rand(model(x).shape, device="cuda").to(dtype)
        params = list(model.parameters())
        rows = []
        for i in range(320):
            torch.cuda.synchronize()
            T.clear()
            t0 = now()
            x.grad = None
            for p in params:
                p.grad = None
            y = fast(x)
            t1 = now()
            y.backward(gy)
            t2 = now()
            if i >= 20:
                rows.append(dict(T, t0=t0, t1=t1, t2=t2))
        print("==", rid, dtype, "(us from the step's start; medians of 300)")
        keys = sorted(rows[0], key=lambda k: statistics.median(r[k] - r["t0"] for r in rows))
        for k in keys:
            print("  %-22s %8.1f" % (k, statistics.median((r[k] - r["t0"]) * 1e6 for r in rows)))
