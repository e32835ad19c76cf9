#!/usr/bin/env python3
"""tc-conv's 8-channel tile (bn=8, one mma n8 tile) against the 16-channel one on chains with at
most 8 output channels, and PyTorch eager in the same precision, on the GPU (session 28).

For each spec and mode (f32 fp32-accurate vs strict-fp32 eager, f32 TF32 vs default-TF32 eager,
bf16 vs bf16 eager): `fusejit bench --config` with the planner's tc-conv configuration and with
bn replaced by 16 (medians of CUDA events, L2 flushed), and eager's median on the same shapes.

  python3 bench/notes/tc_narrow_tile_session28.py --fusejit ".gpu/run fusejit" [--reps 30]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from compare_pytorch import build, time_cuda  # noqa: E402

SPECS = [
    "x:f32[16,128,22,16,27] | conv_transpose3d(out=4,k=3,stride=2,padding=1,output_padding=1) | group_norm(groups=4)",
    "x:f32[8,64,24,24,24] | conv3d(out=8,k=3,padding=1) | relu | group_norm(groups=2)",
    "x:f32[16,64,20,20,20] | conv3d(out=6,k=3,stride=2,padding=1) | mean(dims=[2,3,4])",
    "x:f32[4,48,16,16,16] | conv_transpose3d(out=8,k=3,stride=2,padding=1,output_padding=1) | gelu | group_norm(groups=4)",
    "x:f32[8,96,16,16,16] | conv3d(out=3,k=5,padding=2) | tanh",
    "x:f32[8,32,32,32,32] | conv3d(out=4,k=3,padding=1) | swish",
    "x:f32[4,64,32,32,32] | conv3d(out=8,k=1) | hardswish | group_norm(groups=4)",
]
MODES = [("fp32", "f32", False), ("tf32", "f32", True), ("fp32", "bf16", False)]


def cli(fusejit, args):
    out = subprocess.run(shlex.split(fusejit) + args, capture_output=True, text=True)
    return out.stdout, out.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fusejit", default="fusejit")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    for spec32 in SPECS:
        for precision, dt, tf32 in MODES:
            spec = spec32.replace("x:f32", "x:" + dt, 1)
            row = {"spec": spec, "precision": precision if dt == "f32" else dt}
            text, err = cli(args.fusejit, ["explain", spec, "--precision", precision])
            m = re.search(r"config: (\S+)", text)
            plan = re.search(r"^plan: (\S+)", text, re.M)
            row["plan"] = plan.group(1) if plan else None
            if not m or not m.group(1).startswith("tc-conv:"):
                row["note"] = "not tc-conv: " + (m.group(1) if m else err.strip()[-200:])
                print(json.dumps(row), flush=True)
                continue
            cfg = m.group(1)
            for bn in (8, 16):
                c = re.sub(r"bn=\d+", "bn=%d" % bn, cfg)
                out, err = cli(args.fusejit, ["bench", spec, "--json", "--reps", str(args.reps),
                                              "--precision", precision, "--config", c])
                try:
                    row["bn%d_ms" % bn] = json.loads(out)["median_ms"]
                except Exception:
                    row["bn%d_error" % bn] = (out + err).strip()[-300:]
            row["config"] = cfg
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.manual_seed(0)
            shape, model = build(spec32)
            model = model.cuda().eval().to(torch.bfloat16 if dt == "bf16" else torch.float32)
            x = torch.rand(*shape, device="cuda").to(next(model.parameters()).dtype)
            with torch.no_grad():
                row["eager_ms"] = time_cuda(lambda: model(x), args.reps)
            for bn in (8, 16):
                if "bn%d_ms" % bn in row:
                    row["speedup_bn%d" % bn] = row["eager_ms"] / row["bn%d_ms" % bn]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
