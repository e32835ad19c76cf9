#!/usr/bin/env python3
"""The convolution-engine sweep's chains (bench/conv_engine_sweep.py ROWS) in bfloat16 (or
float16): the fusejit drop-in (policy "fused") against PyTorch eager in the same dtype, same
dtype-valued inputs and weights, in one run on the GPU. Medians of CUDA-event timings with the L2
flushed; errors (relative L2) against float64 evaluation of the same dtype values.

With --train each row times the training step instead of the forward: x and every parameter
require grad, and the step is `y = model(x); y.backward(g)` (g ~ U[-1,1) in the dtype, gradients
cleared before each run); the error is the largest relative L2 error of x's and the parameters'
gradients against the float64 model's (same values, same g).

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/dtype_sweep.py [--dtype bf16] [--reps 10]
      [--train] [--only S1,T2] [--out rows.json]
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


def grad_err(a, b, gy):
    """rel_err of a gradient, its reference norm floored at 1e-3 of the upstream gradient's: a
    gradient that is zero in exact arithmetic (a convolution bias before a group_norm of one
    channel a group) holds only rounding noise in both, which rel_err would divide by ~0."""
    a, b = a.double(), b.double()
    floor = 1e-3 * float(gy.double().norm())
    return float((a - b).norm() / max(float(b.norm()), floor, 1e-300))


def strict_fp32(fn):
    """fn run with cuDNN's TF32 off (PyTorch's strict fp32), the flag restored after."""
    def run():
        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            return fn()
        finally:
            torch.backends.cudnn.allow_tf32 = old
    return run


def train_row(model, ref, fast, x, reps, strict_too=False):
    """The training step of `model` (eager) and `fast` (fused) on x: times and gradient errors
    against the float64 model `ref` (the same parameter values); strict_too: eager's step in
    strict fp32 as well ("eager_strict_ms")."""
    torch.manual_seed(1)
    xr = x.detach().requires_grad_(True)
    with torch.no_grad():
        gy = (torch.rand(model(xr).shape, device=x.device) * 2 - 1).to(x.dtype)
    xd = x.detach().double().requires_grad_(True)
    ref(xd).backward(gy.double())
    want = [xd.grad] + [p.grad for p in ref.parameters()]
    row = {}
    for key, m in (("fused", fast), ("eager", model)):
        params = list(m.parameters())  # nn.Parameters: they require grad already

        def step():
            xr.grad = None
            for p in params:
                p.grad = None
            m(xr).backward(gy)

        row[key + "_ms"] = time_cuda(step, reps)
        if strict_too and key == "eager":
            row["eager_strict_ms"] = time_cuda(strict_fp32(step), reps)
        step()
        got = [xr.grad] + [p.grad for p in params]
        row[key + "_err"] = max(grad_err(a, b, gy) for a, b in zip(got, want))
    return row


def forward_row(model, ref, fast, x, reps, strict_too=False):
    """The forward of `model` (eager) and `fast` (fused) on x: times and errors against the
    float64 model `ref`; strict_too: eager in strict fp32 as well ("eager_strict_*")."""
    row = {}
    with torch.no_grad():
        want = ref(x.double())
        row["fused_ms"] = time_cuda(lambda: fast(x), reps)
        row["fused_err"] = rel_err(fast(x), want)
        row["eager_ms"] = time_cuda(lambda: model(x), reps)
        row["eager_err"] = rel_err(model(x), want)
        if strict_too:
            row["eager_strict_ms"] = time_cuda(strict_fp32(lambda: model(x)), reps)
            row["eager_strict_err"] = rel_err(strict_fp32(lambda: model(x))(), want)
    return row


def report(summary, rows, out):
    """Prints the summary line; writes {"summary", "rows"} as JSON to `out` (when given)."""
    print(json.dumps(summary), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--train", action="store_true",
                    help="time the training step (forward + backward) instead of the forward")
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
        row = {"id": name, "spec": spec.replace("x:f32", "x:" + args.dtype, 1)}
        row.update((train_row if args.train else forward_row)(model, ref, fast, x, args.reps))
        row["speedup"] = row["eager_ms"] / row["fused_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del model, ref, fast, x
        torch.cuda.empty_cache()
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    worst = min(rows, key=lambda r: r["speedup"])
    summary = {"dtype": args.dtype, "train": args.train, "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "geomean_speedup": geo, "worst": worst["id"], "worst_speedup": worst["speedup"],
               "below_1": [r["id"] for r in rows if r["speedup"] < 1],
               "err_not_above_torch": all(r["fused_err"] <= max(1.1 * r["eager_err"], 2.0 ** -8)
                                          for r in rows)}
    report(summary, rows, args.out)


if __name__ == "__main__":
    main()
