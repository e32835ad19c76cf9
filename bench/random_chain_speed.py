#!/usr/bin/env python3
"""Random chains of the grammar (not the sweep's), as a new user would bring them: the drop-in
(`fusejit.torch.fuse(model, policy="fused")`) against PyTorch eager in the same dtype, forward
(and with --train the training step), same inputs, medians of CUDA-event timings with the L2
flushed, in one run on the GPU. f32 rows compare fusejit's fp32-accurate forward with strict-fp32
eager and with default (TF32) eager; bf16/f16 rows with eager in that dtype. Errors: relative L2
against float64 evaluation of the same values.

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/random_chain_speed.py [--count 40]
      [--seed 7] [--dtypes f32,bf16] [--train] [--reps 10] [--out rows.json]
"""
import argparse
import copy
import json
import math
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import build  # noqa: E402
from dtype_sweep import forward_row, train_row  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
CHANNELS = [1, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128]
ELEMENTWISE = ["relu", "leaky_relu(slope=0.1)", "sigmoid", "tanh", "swish", "hardswish", "gelu",
               "clamp(min=-0.5,max=0.5)"]


def out_size(n, k, s, p, d, transposed, op=0):
    if transposed:
        return (n - 1) * s - 2 * p + d * (k - 1) + op + 1
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def random_spec(rng):
    """A random valid chain with at most ~40 M output elements and ~60 GFLOP."""
    while True:
        n = rng.choice([1, 2, 4, 8, 16, 32])
        cin = rng.choice(CHANNELS)
        size = [rng.randint(6, 40) for _ in range(3)]
        if rng.random() < 0.5:
            size = [size[0]] * 3
        ops, c, out = [], cin, list(size)
        flops = 0
        kind = rng.random()
        if kind < 0.85:
            transposed = kind < 0.3
            cout = rng.choice(CHANNELS[2:])
            k = rng.choice([1, 2, 3, 3, 3, 4, 5])
            s = rng.choice([1, 1, 2]) if k > 1 else rng.choice([1, 1, 2])
            p = rng.randint(0, min(2, k - 1)) if k > 1 else 0
            d = 2 if k > 1 and rng.random() < 0.15 else 1
            op = rng.randint(0, s - 1) if transposed and s > 1 else 0
            out = [out_size(v, k, s, p, d, transposed, op) for v in size]
            if min(out) < 1:
                continue
            args = "out=%d,k=%d" % (cout, k)
            if s > 1:
                args += ",stride=%d" % s
            if p:
                args += ",padding=%d" % p
            if op:
                args += ",output_padding=%d" % op
            if d > 1:
                args += ",dilation=%d" % d
            ops.append("%s(%s)" % ("conv_transpose3d" if transposed else "conv3d", args))
            c = cout
            flops = 2 * n * cin * cout * k ** 3 * (math.prod(size if transposed else out))
        pre = rng.randint(0, 1)
        ops += rng.sample(ELEMENTWISE, pre)
        if rng.random() < 0.6:
            groups = [g for g in (1, 2, 4, 8, 16, 32) if c % g == 0]
            ops.append("group_norm(groups=%d)" % rng.choice(groups))
            ops += rng.sample(ELEMENTWISE, rng.randint(0, 1))
        if rng.random() < 0.3:
            ops.append(rng.choice(["mean(dims=[2,3,4])", "mean(dims=[1,2,3,4])"]))
        if not ops:
            continue
        elems = n * c * math.prod(out)
        if elems > 40e6 or n * cin * math.prod(size) > 40e6 or flops > 60e9 or elems < 1e4:
            continue
        return "x:f32[%d,%d,%d,%d,%d] | %s" % (n, cin, size[0], size[1], size[2], " | ".join(ops))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--specs", default="",
                    help="a file of f32 specs, one a line (ids R0, R1, ... in its order), "
                         "measured instead of --count random ones")
    args = ap.parse_args()
    if args.specs:
        with open(args.specs) as f:
            specs = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    else:
        rng = random.Random(args.seed)
        specs = [random_spec(rng) for _ in range(args.count)]
    rows = []
    for i, spec in enumerate(specs):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            torch.manual_seed(i)
            shape, model = build(spec)
            # PyTorch's default (random) conv init; build() draws GroupNorm's weight and bias
            model = model.cuda().to(dtype)
            ref = copy.deepcopy(model).double()
            fast = fj.fuse(copy.deepcopy(model), policy="fused")
            x = torch.randn(*shape, device="cuda").to(dtype)
            row = {"id": "R%d" % i, "dtype": dname,
                   "spec": spec.replace("x:f32", "x:" + dname, 1)}
            try:
                measure = train_row if args.train else forward_row
                row.update(measure(model, ref, fast, x, args.reps, strict_too=dname == "f32"))
                st = fast.__dict__["_fusejit"]
                row["fused_calls"] = fj._stats.copy()
                ref_ms = row.get("eager_strict_ms", row["eager_ms"])
                row["speedup"] = ref_ms / row["fused_ms"]
                row["speedup_vs_default"] = row["eager_ms"] / row["fused_ms"]
                try:
                    row["strategy"] = fj._compiled_chain(fj._spec(st, x), 0).strategy
                except Exception as e:  # noqa: BLE001
                    row["strategy"] = "n/a (%s)" % str(e)[:60]
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:300]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del model, ref, fast, x
            torch.cuda.empty_cache()
    ok = [r for r in rows if "speedup" in r]
    for dname in args.dtypes.split(","):
        rs = [r for r in ok if r["dtype"] == dname]
        if not rs:
            continue
        geo = math.exp(sum(math.log(r["speedup"]) for r in rs) / len(rs))
        geo_d = math.exp(sum(math.log(r["speedup_vs_default"]) for r in rs) / len(rs))
        print(json.dumps({"dtype": dname, "train": args.train, "rows": len(rs),
                          "geomean_vs_same_precision": geo, "geomean_vs_default_eager": geo_d,
                          "below_1": ["%s %.2fx" % (r["id"], r["speedup"]) for r in rs
                                      if r["speedup"] < 1],
                          "errors": [r["id"] for r in rows if "error" in r],
                          "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                          "date": time.strftime("%Y-%m-%d")}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
