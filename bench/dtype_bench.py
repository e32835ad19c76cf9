#!/usr/bin/env python3
"""The seed models in bfloat16 and float16 (model.to(dtype), as users write it) through the
fusejit drop-in, against PyTorch in the same dtype, in one run on the GPU: eager and torch.compile
forward, and the training step (forward + backward of loss = (y * g).sum()). Medians of
CUDA-event timings with the L2 flushed; errors (relative L2) against float64 evaluation of the
same dtype-valued parameters and input.

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/dtype_bench.py [--reps 20] [--out F.json]
"""
import argparse
import copy
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import time_cuda  # noqa: E402  (L2 flushed, CUDA events, median)
from seed_models import SEEDS  # noqa: E402
from torch_dropin import randomized, rel_err  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
          "f64": torch.float64}


def train_step(model, x, g, params):
    y = model(x)
    return torch.autograd.grad(y, [x] + params, g)


def row_for(wid, dname, reps, train):
    dtype = DTYPES[dname]
    cls, init, shape, _, _ = SEEDS[wid]
    torch.manual_seed(0)
    model = randomized(cls(*init), 1).cuda().to(dtype)
    ref = copy.deepcopy(model).double()
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    x = torch.rand(*shape, device="cuda").to(dtype)
    row = {"id": wid, "dtype": dname}
    with torch.no_grad():
        want = ref(x.double())
        y = fast(x)
        row["fused_ms"] = time_cuda(lambda: fast(x), reps)
        row["fused_err"] = rel_err(y, want)
        row["eager_ms"] = time_cuda(lambda: model(x), reps)
        row["eager_err"] = rel_err(model(x), want)
        compiled = torch.compile(model)
        compiled(x)
        row["compile_ms"] = time_cuda(lambda: compiled(x), reps)
        row["compile_err"] = rel_err(compiled(x), want)
        del want, y
    row["speedup_vs_best"] = min(row["eager_ms"], row["compile_ms"]) / row["fused_ms"]
    if train:
        xg = x.clone().requires_grad_(True)
        g = torch.randn(row_shape(model, x), device="cuda").to(dtype)
        fparams = list(fast.parameters())
        mparams = list(model.parameters())
        fused_grads = train_step(fast, xg, g, fparams)
        row["train_fused_ms"] = time_cuda(lambda: train_step(fast, xg, g, fparams), reps)
        eager_grads = train_step(model, xg, g, mparams)
        row["train_eager_ms"] = time_cuda(lambda: train_step(model, xg, g, mparams), reps)
        xd = x.double().requires_grad_(True)
        ref_grads = torch.autograd.grad(ref(xd), [xd] + list(ref.parameters()), g.double())
        row["train_fused_err"] = max(rel_err(a, b) for a, b in zip(fused_grads, ref_grads))
        row["train_eager_err"] = max(rel_err(a, b) for a, b in zip(eager_grads, ref_grads))
        row["train_speedup"] = row["train_eager_ms"] / row["train_fused_ms"]
    print(json.dumps(row), flush=True)
    return row


def row_shape(model, x):
    with torch.no_grad():
        return model(x).shape


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-train", action="store_true", help="forward only")
    ap.add_argument("--ids", default="W1,W2,W3,W4")
    ap.add_argument("--dtypes", default="bf16,f16", help="comma list of f32, bf16, f16, f64 (f32: the fp32-accurate baseline)")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    for dname in args.dtypes.split(","):
        for wid in args.ids.split(","):
            result["rows"].append(row_for(wid, dname, args.reps, not args.no_train))
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
