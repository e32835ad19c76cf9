#!/usr/bin/env python3
"""Session 27: where a drop-in bf16 training step's time goes, against the library's own
`fusejit bench --grad` of the same chain. For each sweep row named: the step's median time
(dtype_sweep.py's train_row timing, L2 flushed), the host time to enqueue it (no flush, one
synchronize per 20 steps), and torch.profiler's CUDA kernels of 5 steps (fused and eager).

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/dropin_train_profile_session27.py \
      --only K7,K11,G3 [--dtype bf16]
"""
import argparse
import copy
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import build, time_cuda  # noqa: E402
from conv_engine_sweep import specs  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", required=True)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    only = args.only.split(",")
    for name, spec in specs():
        if name not in only:
            continue
        torch.manual_seed(0)
        shape, model = build(spec)
        model = model.cuda().eval().to(dtype)
        fast = fj.fuse(copy.deepcopy(model), policy="fused")
        x = torch.rand(*shape, device="cuda").to(dtype).requires_grad_(True)
        with torch.no_grad():
            gy = (torch.rand(model(x).shape, device="cuda") * 2 - 1).to(dtype)
        print("== %s %s (%s)" % (name, spec, args.dtype), flush=True)
        for key, m in (("fused", fast), ("eager", model)):
            params = list(m.parameters())

            def step():
                x.grad = None
                for p in params:
                    p.grad = None
                m(x).backward(gy)

            ms = time_cuda(step, args.reps)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            print("%s: step %.3f ms (flushed median); host enqueue %.3f ms/step, drained %.3f"
                  % (key, ms, (t1 - t0) / 20 * 1e3, (t2 - t0) / 20 * 1e3), flush=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            rows = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    r = rows.setdefault(e.name[:60], [0, 0.0])
                    r[0] += 1
                    r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            total = sum(v[1] for v in rows.values()) / 5 / 1e3
            print("  CUDA kernels: %.3f ms/step" % total)
            for k, v in sorted(rows.items(), key=lambda kv: -kv[1][1])[:14]:
                print("    %-60s %3d x  %.4f ms/step" % (k, v[0] // 5, v[1] / 5 / 1e3))
        del model, fast, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
