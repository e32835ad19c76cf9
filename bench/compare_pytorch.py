#!/usr/bin/env python3
"""fusejit against PyTorch, side by side, on the GPU machine (its python3 has torch and numpy).

For each chain: builds the PyTorch module from the fusejit spec (nn.Sequential, so parameter names
match fusejit's: 0.weight, 2.bias, ...), draws random inputs and weights (x ~ U[0,1) like
torch.rand, conv weights with PyTorch's default init, GroupNorm weight ~ U[0.5,1.5] and bias ~
U[-0.5,0.5]: never the 1/0 defaults), writes them as .npy, and times on the same inputs:
  eager      PyTorch defaults (cuDNN may use TF32 for convolutions)
  strict     eager with TF32 off (fp32 convolutions)
  compile    torch.compile (default mode)           [seed chains only; --no-compile skips it]
  fusejit    `fusejit bench SPEC --input ... --param ... --output y.npy --json`
Every time is the median of CUDA-event timings after warm-up with the L2 cache flushed (256 MB
written) before each run. fusejit's output is checked against PyTorch in float64.

  python3 bench/compare_pytorch.py --fusejit .gpu/run\\ fusejit [--sweep] [--only W2,W4-f] [--out F]
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import torch
import torch.nn as nn

SEEDS = [
    ("W1", "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
           "group_norm(groups=4,eps=1e-5) | hardswish"),
    ("W2", "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
           "mean(dims=[2,3,4])"),
    ("W3", "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
           "group_norm(groups=8,eps=1e-5)"),
    ("W4", "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
           "mean(dims=[1,2,3,4])"),
]

# Other shapes of the same four chains: batch 1-1024, channels 3-256, kernel 1-5, strides 1-2.
W1 = "conv_transpose3d(out={o},k={k},stride={s},padding={p}) | swish | group_norm(groups={g}) | hardswish"
W2 = "conv3d(out={o},k={k},stride={s}) | hardswish | group_norm(groups={g}) | mean(dims=[2,3,4])"
W3 = "conv_transpose3d(out={o},k={k},bias=false) | relu | group_norm(groups={g})"
W4 = "conv3d(out={o},k={k},stride={s}) | group_norm(groups={g}) | mean(dims=[1,2,3,4])"
SWEEP = [
    ("W1-a", [1, 3, 16, 32, 32], W1, dict(o=16, k=3, s=2, p=1, g=4)),
    ("W1-b", [32, 3, 16, 32, 32], W1, dict(o=16, k=3, s=2, p=1, g=4)),
    ("W1-c", [128, 8, 8, 16, 16], W1, dict(o=32, k=3, s=2, p=1, g=8)),
    ("W1-d", [16, 4, 16, 16, 16], W1, dict(o=16, k=4, s=2, p=1, g=4)),
    ("W1-e", [64, 3, 8, 32, 32], W1, dict(o=8, k=2, s=2, p=0, g=2)),
    ("W1-f", [8, 16, 8, 16, 16], W1, dict(o=32, k=3, s=1, p=1, g=8)),
    ("W2-a", [1, 3, 16, 32, 32], W2, dict(o=16, k=4, s=1, g=4)),
    ("W2-b", [256, 3, 16, 32, 32], W2, dict(o=16, k=4, s=1, g=4)),
    ("W2-c", [512, 3, 8, 16, 16], W2, dict(o=32, k=3, s=1, g=8)),
    ("W2-d", [64, 8, 16, 16, 16], W2, dict(o=16, k=5, s=1, g=4)),
    ("W2-e", [128, 3, 16, 32, 32], W2, dict(o=16, k=1, s=1, g=4)),
    ("W2-f", [32, 16, 8, 16, 16], W2, dict(o=64, k=3, s=1, g=8)),
    ("W3-a", [4, 64, 16, 16, 16], W3, dict(o=128, k=3, g=8)),
    ("W3-b", [16, 32, 16, 16, 16], W3, dict(o=128, k=3, g=8)),
    ("W3-c", [2, 128, 16, 16, 16], W3, dict(o=256, k=3, g=16)),
    ("W3-d", [8, 64, 16, 16, 16], W3, dict(o=128, k=1, g=8)),
    ("W4-a", [1, 3, 24, 32, 32], W4, dict(o=24, k=3, s=1, g=8)),
    ("W4-b", [1024, 3, 8, 16, 16], W4, dict(o=24, k=3, s=1, g=8)),
    ("W4-c", [256, 3, 24, 32, 32], W4, dict(o=16, k=2, s=2, g=4)),
    ("W4-d", [64, 8, 16, 32, 32], W4, dict(o=24, k=3, s=1, g=8)),
    ("W4-e", [32, 3, 16, 64, 64], W4, dict(o=32, k=5, s=2, g=8)),
    ("W4-f", [16, 32, 16, 16, 16], W4, dict(o=256, k=3, s=1, g=32)),
]


def sweep_specs():
    for name, shape, ops, args in SWEEP:
        yield name, "x:f32[%s] | %s" % (",".join(map(str, shape)), ops.format(**args))


class Mean(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.mean(x, dim=self.dims)


def triple(v):
    v = json.loads(v) if v.startswith("[") else int(v)
    return tuple(v) if isinstance(v, list) else (v, v, v)


def build(spec):
    """nn.Sequential equivalent of a fusejit spec; returns (input shape, module)."""
    parts = [p.strip() for p in spec.split("|")]
    shape = [int(v) for v in re.match(r"x:f32\[(.*)\]", parts[0]).group(1).split(",")]
    mods, channels = [], shape[1]
    for op in parts[1:]:
        m = re.match(r"(\w+)(?:\((.*)\))?$", op)
        name, argtext = m.group(1), m.group(2) or ""
        args = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", argtext))
        if name in ("conv3d", "conv_transpose3d"):
            kw = dict(kernel_size=triple(args["k"]), stride=triple(args.get("stride", "1")),
                      padding=triple(args.get("padding", "0")),
                      dilation=triple(args.get("dilation", "1")),
                      bias=args.get("bias", "true") != "false")
            if name == "conv3d":
                mods.append(nn.Conv3d(channels, int(args["out"]), **kw))
            else:
                mods.append(nn.ConvTranspose3d(channels, int(args["out"]),
                                               output_padding=triple(args.get("output_padding", "0")),
                                               **kw))
            channels = int(args["out"])
        elif name == "group_norm":
            gn = nn.GroupNorm(int(args["groups"]), channels, eps=float(args.get("eps", "1e-5")))
            with torch.no_grad():
                gn.weight.uniform_(0.5, 1.5)
                gn.bias.uniform_(-0.5, 0.5)
            mods.append(gn)
        elif name == "mean":
            mods.append(Mean(json.loads(args["dims"])))
        else:
            mods.append({"relu": nn.ReLU(), "swish": nn.SiLU(), "silu": nn.SiLU(),
                         "hardswish": nn.Hardswish(), "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(),
                         "gelu": nn.GELU()}.get(name) or
                        (nn.LeakyReLU(float(args.get("slope", "0.01"))) if name == "leaky_relu"
                         else nn.Hardtanh(float(args["min"]), float(args["max"]))))
    return shape, nn.Sequential(*mods)


FLUSH = None


def time_cuda(fn, reps, warmup=3):
    """Median ms of fn() over reps, CUDA events, L2 flushed before each run."""
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    times = []
    for i in range(warmup + reps):
        FLUSH.fill_(1.0)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop))
    return float(np.median(times))


def errors(out, ref):
    out, ref = out.double(), ref.double()
    diff = (out - ref)
    rel = (diff.norm() / ref.norm()).item() if ref.norm() > 0 else float(diff.norm())
    if not torch.isfinite(out).all():
        rel = float("inf")
    return rel, diff.abs().max().item()


def setup_row(name, spec, tmp):
    """The row's module (on the GPU, eval), input x ~ U[0,1) seeded by the row id, and the .npy
    files fusejit reads: returns (model, x, x path, ["--param", "NAME=PATH", ...])."""
    torch.manual_seed(zlib.crc32(name.encode()))
    shape, model = build(spec)
    model = model.cuda().eval()
    x = torch.rand(*shape, device="cuda")
    x_path = os.path.join(tmp, "x.npy")
    np.save(x_path, x.cpu().numpy())
    params = []
    for pname, p in model.named_parameters():
        path = os.path.join(tmp, pname + ".npy")
        np.save(path, p.detach().cpu().numpy().astype(np.float32))
        params += ["--param", "%s=%s" % (pname, path)]
    return model, x, x_path, params


def run_one(name, spec, fusejit, reps, do_compile, precision, tmp):
    model, x, x_path, params = setup_row(name, spec, tmp)
    files = {"x": x_path}
    row = {"id": name, "spec": spec}
    with torch.no_grad():
        ref = model.double()(x.double())
        model.float()
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
        row["eager_ms"] = time_cuda(lambda: model(x), reps)
        row["eager_rel"], row["eager_abs"] = errors(model(x), ref)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        row["strict_ms"] = time_cuda(lambda: model(x), reps)
        row["strict_rel"], row["strict_abs"] = errors(model(x), ref)
        if do_compile:
            torch.backends.cudnn.allow_tf32 = True
            compiled = torch.compile(model)
            t0 = time.time()
            compiled(x)
            torch.cuda.synchronize()
            row["compile_build_s"] = time.time() - t0
            row["compile_ms"] = time_cuda(lambda: compiled(x), reps)
    y_path = os.path.join(tmp, "y.npy")
    cmd = fusejit + ["bench", spec, "--json", "--reps", str(reps), "--input", files["x"],
                     "--output", y_path, "--precision", precision] + params
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        row["fusejit_error"] = (proc.stderr or proc.stdout).strip()[:500]
        return row
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update({"fusejit_ms": result["median_ms"], "strategy": result["strategy"],
                "precision": precision, "fusejit_compile_ms": result["compile_ms"]})
    y = torch.from_numpy(np.load(y_path)).cuda()
    row["fusejit_rel"], row["fusejit_abs"] = errors(y, ref)
    best = min(v for k, v in row.items() if k in ("eager_ms", "strict_ms", "compile_ms"))
    row["speedup_vs_best_pytorch"] = best / row["fusejit_ms"]
    row["speedup_vs_eager"] = row["eager_ms"] / row["fusejit_ms"]
    return row


def print_table(rows, title):
    print("\n" + title)
    hdr = ("id", "fusejit ms", "plan", "eager ms", "strict ms", "compile ms", "vs best", "vs eager",
           "rel err", "max abs")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        if "fusejit_error" in r:
            print("| %s | error: %s |" % (r["id"], r["fusejit_error"].replace("\n", " ")[:200]))
            continue
        f = lambda k, fmt="%.3f": (fmt % r[k]) if k in r else "-"
        print("| %s | %s | %s%s | %s | %s | %s | %.2fx | %.2fx | %.1e | %.1e |" % (
            r["id"], f("fusejit_ms"), r["strategy"], " (tf32)" if r["precision"] == "tf32" else "",
            f("eager_ms"), f("strict_ms"), f("compile_ms"), r["speedup_vs_best_pytorch"],
            r["speedup_vs_eager"], r["fusejit_rel"], r["fusejit_abs"]))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fusejit", default="fusejit", help="command that runs the fusejit CLI")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sweep", action="store_true", help="also the 22 sweep shapes (eager only)")
    ap.add_argument("--no-seeds", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--tf32", action="store_true", help="also W3 in fusejit's opt-in TF32 mode")
    ap.add_argument("--out", help="write all rows as JSON here")
    ap.add_argument("--only", help="comma-separated ids (W2, W4-f, ...): run just these rows")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    keep = lambda name: only is None or name in only
    fusejit = shlex.split(args.fusejit)
    print("torch %s, %s, cuDNN %s" % (torch.__version__, torch.cuda.get_device_name(),
                                      torch.backends.cudnn.version()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_seeds:
            seed_rows = [run_one(n, s, fusejit, args.reps, not args.no_compile, "fp32", tmp)
                         for n, s in SEEDS if keep(n)]
            if args.tf32 and keep("W3"):
                seed_rows.append(run_one("W3", SEEDS[2][1], fusejit, args.reps, False, "tf32", tmp))
            print_table(seed_rows, "seed chains (fp32-accurate unless marked)")
            rows += seed_rows
        if args.sweep:
            sweep_rows = [run_one(n, s, fusejit, args.reps, False, "fp32", tmp)
                          for n, s in sweep_specs() if keep(n)]
            print_table(sweep_rows, "sweep (other shapes of the same chains)")
            rows += sweep_rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
