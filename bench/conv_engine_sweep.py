#!/usr/bin/env python3
"""The convolution-engine sweep (issue 13): chains outside the seed families, fusejit against
PyTorch side by side on the GPU machine, same inputs.

Rows cover Cin and C from 8 to 256 (counts that are not multiples of 8, 32 or 128 included),
kernel 1-5, stride 1-2, padding 0-2, dilation 1-2, conv3d and conv_transpose3d, with and without
group_norm and mean, batch 1 to 64, and group_norm-only chains. Each row times (medians of
CUDA-event timings, L2 flushed before each run; bench/compare_pytorch.py's helpers):
  fusejit fp32     `fusejit bench SPEC` (fp32-accurate, the planner's choice or --strategy)
  fusejit tf32     the same with --precision tf32
  eager            PyTorch defaults (cuDNN may use TF32 for convolutions)
  strict           eager with TF32 off
  compile          torch.compile (default mode; with --compile only: slow to build)
and the errors of every output against PyTorch in float64.

  python3 bench/conv_engine_sweep.py --fusejit ".gpu/run fusejit" [--compile] [--only S3,T2]
      [--strategy tc-conv] [--out rows.json]
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import errors, setup_row, time_cuda  # noqa: E402

C3 = "conv3d(out={o},k={k},stride={s},padding={p},dilation={d})"
CT = "conv_transpose3d(out={o},k={k},stride={s},padding={p},output_padding={op})"
ROWS = [
    # conv3d, padding 1 (the first examples) and around them
    ("S1", [16, 32, 32, 32, 32], C3 + " | relu | group_norm(groups=8)", dict(o=64, k=3, s=1, p=1, d=1)),
    ("S2", [16, 64, 32, 32, 32], C3 + " | swish", dict(o=64, k=3, s=1, p=1, d=1)),
    ("S3", [8, 16, 32, 32, 32], C3 + " | gelu | group_norm(groups=4)", dict(o=32, k=3, s=1, p=1, d=1)),
    ("S4", [4, 8, 48, 48, 48], C3 + " | relu", dict(o=16, k=3, s=1, p=1, d=1)),
    ("S5", [32, 24, 16, 16, 16], C3 + " | hardswish | group_norm(groups=6)", dict(o=48, k=3, s=1, p=1, d=1)),
    ("S6", [8, 12, 24, 24, 24], C3 + " | swish | group_norm(groups=5) | mean(dims=[2,3,4])", dict(o=20, k=3, s=1, p=1, d=1)),
    ("S7", [2, 128, 16, 16, 16], C3 + " | relu | group_norm(groups=16)", dict(o=256, k=3, s=1, p=1, d=1)),
    ("S8", [4, 256, 8, 8, 8], C3 + " | gelu", dict(o=256, k=3, s=1, p=1, d=1)),
    ("S9", [16, 40, 16, 16, 16], C3 + " | tanh | group_norm(groups=9)", dict(o=72, k=3, s=1, p=1, d=1)),
    ("S10", [1, 100, 16, 16, 16], C3 + " | group_norm(groups=10) | relu", dict(o=130, k=3, s=1, p=1, d=1)),
    ("S11", [64, 16, 8, 8, 8], C3 + " | relu | group_norm(groups=4) | mean(dims=[1,2,3,4])", dict(o=32, k=3, s=1, p=1, d=1)),
    ("S12", [16, 48, 16, 16, 16], C3 + " | swish | mean(dims=[2,3,4])", dict(o=96, k=3, s=1, p=1, d=1)),
    # kernel 1, 2, 5; stride 2; padding 0 and 2; dilation 2
    ("K1", [16, 64, 16, 32, 32], C3 + " | relu | group_norm(groups=8)", dict(o=128, k=1, s=1, p=0, d=1)),
    ("K2", [16, 20, 16, 32, 32], C3 + " | swish", dict(o=36, k=1, s=1, p=0, d=1)),
    ("K3", [8, 32, 32, 32, 32], C3 + " | gelu | group_norm(groups=8)", dict(o=64, k=2, s=2, p=0, d=1)),
    ("K4", [4, 16, 32, 32, 32], C3 + " | relu | group_norm(groups=4)", dict(o=32, k=5, s=1, p=2, d=1)),
    ("K5", [8, 32, 32, 32, 32], C3 + " | swish | group_norm(groups=8)", dict(o=64, k=3, s=2, p=1, d=1)),
    ("K6", [8, 24, 24, 24, 24], C3 + " | relu | group_norm(groups=4)", dict(o=40, k=3, s=1, p=2, d=2)),
    ("K7", [16, 8, 32, 32, 32], C3 + " | hardswish | mean(dims=[2,3,4])", dict(o=24, k=5, s=2, p=2, d=1)),
    ("K8", [32, 56, 12, 12, 12], C3 + " | relu | group_norm(groups=7) | swish", dict(o=56, k=3, s=1, p=0, d=1)),
    ("K9", [4, 200, 8, 8, 8], C3 + " | group_norm(groups=8)", dict(o=200, k=3, s=1, p=1, d=1)),
    ("K10", [2, 160, 12, 12, 12], C3 + " | swish | group_norm(groups=10) | mean(dims=[2,3,4])", dict(o=80, k=3, s=1, p=1, d=1)),
    ("K11", [8, 64, 16, 16, 16], C3 + " | relu", dict(o=64, k=4, s=2, p=1, d=1)),
    ("K12", [16, 30, 16, 16, 16], C3 + " | leaky_relu(slope=0.2) | group_norm(groups=5)", dict(o=50, k=3, s=1, p=1, d=2)),
    # conv_transpose3d
    ("T1", [8, 16, 24, 24, 24], CT + " | gelu | group_norm(groups=4)", dict(o=48, k=3, s=2, p=1, op=0)),
    ("T2", [8, 32, 16, 16, 16], CT + " | relu | group_norm(groups=8)", dict(o=64, k=4, s=2, p=1, op=0)),
    ("T3", [16, 64, 8, 8, 8], CT + " | swish", dict(o=32, k=2, s=2, p=0, op=0)),
    ("T4", [4, 128, 8, 8, 8], CT + " | relu | group_norm(groups=16)", dict(o=128, k=3, s=2, p=1, op=1)),
    ("T5", [16, 24, 16, 16, 16], CT + " | hardswish | group_norm(groups=4) | mean(dims=[2,3,4])", dict(o=24, k=3, s=1, p=1, op=0)),
    ("T6", [2, 48, 16, 16, 16], CT + " | tanh", dict(o=48, k=5, s=1, p=2, op=0)),
    ("T7", [32, 12, 12, 12, 12], CT + " | swish | group_norm(groups=3) | hardswish", dict(o=18, k=3, s=2, p=0, op=0)),
    ("T8", [1, 64, 16, 16, 16], CT + " | relu | group_norm(groups=8) | mean(dims=[1,2,3,4])", dict(o=96, k=3, s=2, p=1, op=1)),
    ("T9", [8, 40, 12, 12, 12], CT + " | gelu", dict(o=40, k=1, s=1, p=0, op=0)),
    ("T10", [16, 8, 16, 16, 16], CT + " | relu | group_norm(groups=2)", dict(o=16, k=4, s=2, p=1, op=0)),
    ("T11", [4, 96, 12, 12, 12], CT + " | swish | group_norm(groups=12)", dict(o=144, k=3, s=1, p=1, op=0)),
    ("T12", [64, 8, 8, 8, 8], CT + " | sigmoid | mean(dims=[2,3,4])", dict(o=32, k=3, s=2, p=1, op=1)),
    ("T13", [16, 16, 16, 32, 32], CT + " | relu | group_norm(groups=4)", dict(o=16, k=3, s=2, p=1, op=0)),
    ("T14", [32, 4, 16, 24, 24], CT + " | group_norm(groups=8)", dict(o=32, k=2, s=2, p=0, op=0)),
    # batch 1 and 64
    ("B1", [1, 32, 32, 32, 32], C3 + " | relu | group_norm(groups=8)", dict(o=64, k=3, s=1, p=1, d=1)),
    ("B2", [64, 16, 16, 16, 16], C3 + " | swish | group_norm(groups=8)", dict(o=32, k=3, s=1, p=1, d=1)),
    ("B3", [64, 32, 8, 8, 8], CT + " | relu | group_norm(groups=4)", dict(o=32, k=3, s=2, p=1, op=1)),
    ("B4", [1, 8, 64, 64, 64], C3 + " | gelu", dict(o=8, k=3, s=1, p=1, d=1)),
    # group_norm with elementwise ops only
    ("G1", [16, 64, 32, 32, 32], "group_norm(groups=8) | relu", {}),
    ("G2", [32, 32, 16, 32, 32], "swish | group_norm(groups=4) | hardswish", {}),
    ("G3", [8, 128, 16, 16, 16], "group_norm(groups=32) | gelu", {}),
    ("G4", [64, 24, 16, 16, 16], "relu | group_norm(groups=6) | mean(dims=[2,3,4])", {}),
]


def specs():
    for name, shape, ops, args in ROWS:
        yield name, "x:f32[%s] | %s" % (",".join(map(str, shape)), ops.format(**args))


def fusejit_bench(fusejit, spec, files, params, precision, strategy, reps, tmp):
    y_path = os.path.join(tmp, "y_%s.npy" % precision)
    cmd = fusejit + ["bench", spec, "--json", "--reps", str(reps), "--input", files,
                     "--output", y_path, "--precision", precision] + params
    if strategy:
        cmd += ["--strategy", strategy]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[:300]}, None
    return json.loads(proc.stdout.strip().splitlines()[-1]), y_path


def run_row(name, spec, fusejit, reps, do_compile, strategy, tmp):
    model, x, x_path, params = setup_row(name, spec, tmp)
    row = {"id": name, "spec": spec}
    with torch.no_grad():
        ref = model.double()(x.double())
        model.float()
        torch.backends.cudnn.allow_tf32 = True
        row["eager_ms"] = time_cuda(lambda: model(x), reps)
        row["eager_rel"], _ = errors(model(x), ref)
        torch.backends.cudnn.allow_tf32 = False
        row["strict_ms"] = time_cuda(lambda: model(x), reps)
        row["strict_rel"], _ = errors(model(x), ref)
        torch.backends.cudnn.allow_tf32 = True
        if do_compile:
            compiled = torch.compile(model)
            compiled(x)
            torch.cuda.synchronize()
            row["compile_ms"] = time_cuda(lambda: compiled(x), reps)
    for prec in ("fp32", "tf32"):
        result, y_path = fusejit_bench(fusejit, spec, x_path, params, prec, strategy, reps, tmp)
        if y_path is None:
            row[prec + "_error"] = result["error"]
            continue
        y = torch.from_numpy(np.load(y_path)).cuda()
        row[prec + "_ms"] = result["median_ms"]
        row[prec + "_plan"] = result["strategy"]
        row[prec + "_rel"], _ = errors(y, ref)
    return row


def fmt(row, key, f="%.3f"):
    return f % row[key] if key in row else "-"


def print_rows(rows):
    hdr = ("id", "spec", "fusejit fp32", "plan", "fp32 rel err", "strict fp32", "vs strict",
           "fusejit tf32", "tf32 rel err", "eager (TF32)", "compile", "vs best TF32")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        strict_ratio = r["strict_ms"] / r["fp32_ms"] if "fp32_ms" in r else float("nan")
        best_tf32 = min(r[k] for k in ("eager_ms", "compile_ms", "strict_ms") if k in r)
        tf32_ratio = best_tf32 / r["tf32_ms"] if "tf32_ms" in r else float("nan")
        print("| %s | `%s` | %s | %s | %s | %s | %.2fx | %s | %s | %s | %s | %.2fx |" % (
            r["id"], r["spec"], fmt(r, "fp32_ms"), r.get("fp32_plan", r.get("fp32_error", "-")),
            fmt(r, "fp32_rel", "%.1e"), fmt(r, "strict_ms"), strict_ratio, fmt(r, "tf32_ms"),
            fmt(r, "tf32_rel", "%.1e"), fmt(r, "eager_ms"), fmt(r, "compile_ms"), tf32_ratio))
    ok = [r for r in rows if "fp32_ms" in r and "tf32_ms" in r]
    if ok:
        g32 = math.exp(sum(math.log(r["strict_ms"] / r["fp32_ms"]) for r in ok) / len(ok))
        gtf = math.exp(sum(math.log(min(r[k] for k in ("eager_ms", "compile_ms", "strict_ms")
                                        if k in r) / r["tf32_ms"]) for r in ok) / len(ok))
        print("\ngeometric mean over %d rows: fp32-accurate vs strict fp32 %.2fx; tf32 vs best "
              "TF32 PyTorch %.2fx" % (len(ok), g32, gtf))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fusejit", default="fusejit", help="command that runs the fusejit CLI")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="also torch.compile (slow to build)")
    ap.add_argument("--strategy", help="force a fusejit strategy (default: the planner's)")
    ap.add_argument("--only", help="comma-separated row ids")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    fusejit = shlex.split(args.fusejit)
    print("torch %s, %s, cuDNN %s, %s" % (torch.__version__, torch.cuda.get_device_name(),
                                          torch.backends.cudnn.version(), time.strftime("%F")))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in specs():
            if only and name not in only:
                continue
            rows.append(run_row(name, spec, fusejit, args.reps, args.compile, args.strategy, tmp))
            r = rows[-1]
            print("%s fp32 %s (%s) tf32 %s | strict %s eager %s" % (
                name, fmt(r, "fp32_ms"), r.get("fp32_plan", r.get("fp32_error")), fmt(r, "tf32_ms"),
                fmt(r, "strict_ms"), fmt(r, "eager_ms")), flush=True)
    print()
    print_rows(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
