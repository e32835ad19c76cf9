#!/usr/bin/env python3
"""The convolution-engine sweep's chains (bench/conv_engine_sweep.py ROWS) in bfloat16 (or
float16): the fusejit drop-in (policy "fused") against PyTorch eager in the same dtype, same
dtype-valued inputs and weights, in one run on the GPU. Medians of CUDA-event timings with the L2
flushed; errors (relative L2) against float64 evaluation of the same dtype values.

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/dtype_sweep.py [--dtype bf16] [--reps 10]
      [--only S1,T2] [--out rows.json]
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import build, time_cuda  # noqa: E402
from conv_engine_sweep import specs  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-300))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, spec in specs():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        shape, model = build(spec)
        model = model.cuda().eval().to(dtype)
        ref = copy.deepcopy(model).double()
        fast = fj.fuse(copy.deepcopy(model), policy="fused")
        x = torch.rand(*shape, device="cuda").to(dtype)
        with torch.no_grad():
            want = ref(x.double())
            row = {"id": name, "spec": spec.replace("x:f32", "x:" + args.dtype, 1)}
            row["fused_ms"] = time_cuda(lambda: fast(x), args.reps)
            row["fused_err"] = rel_err(fast(x), want)
            row["eager_ms"] = time_cuda(lambda: model(x), args.reps)
            row["eager_err"] = rel_err(model(x), want)
        row["speedup"] = row["eager_ms"] / row["fused_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del model, ref, fast, x, want
        torch.cuda.empty_cache()
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    worst = min(rows, key=lambda r: r["speedup"])
    summary = {"dtype": args.dtype, "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "geomean_speedup": geo, "worst": worst["id"], "worst_speedup": worst["speedup"],
               "below_1": [r["id"] for r in rows if r["speedup"] < 1],
               "err_not_above_torch": all(r["fused_err"] <= max(1.1 * r["eager_err"], 2.0 ** -8)
                                          for r in rows)}
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
