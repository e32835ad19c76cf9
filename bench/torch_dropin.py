#!/usr/bin/env python3
"""The PyTorch drop-in measured on the GPU machine (its python3 has torch), in one run:

1. Per-call host overhead on a tiny chain: wall time per call of `fusejit.torch.fused(Model)` in a
   loop of back-to-back calls (host-bound: its kernels take microseconds), against eager's, and
   against the chain's kernel time (`fusejit bench SPEC --json`, given with --fusejit).
2. The four seed models (KernelBench's Model classes) through the drop-in (`fused(Model)`, default
   policy "auto"), against eager (PyTorch's default, TF32 convolutions), eager strict fp32 and
   torch.compile of the original model: medians of CUDA-event timings with the L2 cache flushed,
   same inputs, errors against float64.
3. First-call latency in a fresh process: a cold kernel cache (empty FUSEJIT_CACHE_DIR) against a
   warm one (the same folder again), policy "fused" (the compile alone) and "auto" (compile and
   the timing of both).

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/torch_dropin.py --fusejit ".gpu/run fusejit" [--out F.json]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import fusejit.torch as fj  # noqa: E402
from compare_pytorch import time_cuda  # noqa: E402  (L2 flushed, CUDA events, median)
from seed_models import SEEDS  # noqa: E402

def randomized(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "group_norm" in name and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "group_norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


TINY_SPEC = "x:f32[1,4,4,4,4] | conv3d(out=8,k=1) | relu"


def host_overhead(fusejit_cmd, calls=3000):
    model = Tiny().cuda()
    fast = fj.fuse(model, policy="fused")
    x = torch.randn(1, 4, 4, 4, 4, device="cuda")

    def per_call_us(f):
        with torch.no_grad():
            for _ in range(200):
                f(x)
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    f(x)
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    st = fast.__dict__["_fusejit"]
    spec = fj._spec(st, x)
    chain = fj._compiled_chain(spec, 0)
    params = [fj._get(fast, p) for _, p in st.param_paths]
    y = torch.empty(chain.signature[-1].shape, device="cuda")
    ptrs = [x.data_ptr()] + [p.data_ptr() for p in params] + [y.data_ptr()]
    stream = torch.cuda.current_stream().cuda_stream
    row = {
        "spec": spec,
        "fused_us": per_call_us(fast),
        "eager_us": per_call_us(model),
        "c_abi_run_us": per_call_us(lambda _: chain.run_pointers(ptrs, stream)),
        # where the rest goes: the forward without nn.Module's __call__, and one output allocation
        "forward_fn_us": per_call_us(lambda t: fj._fused_forward(fast, t)),
        "torch_empty_us": per_call_us(lambda _: torch.empty(chain.signature[-1].shape,
                                                            device="cuda")),
        "fused_with_grad_us": None,
    }
    xg = x.clone().requires_grad_(True)
    t0 = time.perf_counter()
    for _ in range(calls // 3):
        fast(xg)
    torch.cuda.synchronize()
    row["fused_with_grad_us"] = (time.perf_counter() - t0) / (calls // 3) * 1e6
    if fusejit_cmd:
        out = subprocess.run(shlex.split(fusejit_cmd) + ["bench", TINY_SPEC, "--json"],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        row["kernel_us"] = json.loads(out)["median_ms"] * 1e3
    return row


def seeds(reps):
    rows = []
    for wid in sorted(SEEDS):
        cls, init, shape, _, _ = SEEDS[wid]
        torch.manual_seed(0)
        model = randomized(cls(*init), 1).cuda()
        ModelNew = fj.fused(cls)
        new = ModelNew(*init).cuda()
        new.load_state_dict(model.state_dict())
        x = torch.rand(*shape, device="cuda")
        with torch.no_grad():
            ref = model.double()(x.double())
            model.float()
            t0 = time.perf_counter()
            y = new(x)  # first call: compile (or cache hit) and the auto policy's timing
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            row = {"id": wid, "first_call_ms": first_ms,
                   "decision": new.__dict__["_fusejit"].last_decision}
            row["dropin_ms"] = time_cuda(lambda: new(x), reps)
            row["dropin_err"] = rel_err(new(x), ref)
            torch.backends.cudnn.allow_tf32 = True
            row["eager_ms"] = time_cuda(lambda: model(x), reps)
            row["eager_err"] = rel_err(model(x), ref)
            torch.backends.cudnn.allow_tf32 = False
            row["strict_ms"] = time_cuda(lambda: model(x), reps)
            row["strict_err"] = rel_err(model(x), ref)
            torch.backends.cudnn.allow_tf32 = True
            compiled = torch.compile(model)
            compiled(x)
            row["compile_ms"] = time_cuda(lambda: compiled(x), reps)
            best = min(row["eager_ms"], row["strict_ms"], row["compile_ms"])
            row["speedup_vs_best"] = best / row["dropin_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del model, new, x, ref, y
        torch.cuda.empty_cache()
    return rows


FIRST_CALL = r"""
import sys, time, torch
sys.path[:0] = [%r, %r]
import fusejit.torch as fj
from seed_models import SEEDS
cls, init, shape, _, _ = SEEDS[%r]
model = fj.fused(cls, policy=%r)(*init).cuda()
x = torch.rand(*shape, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
with torch.no_grad():
    model(x)
torch.cuda.synchronize()
print((time.perf_counter() - t0) * 1e3)
"""


def first_calls():
    rows = []
    py = os.path.join(HERE, "..", "python")
    tests = os.path.join(HERE, "..", "tests", "python")
    for wid in ("W1", "W4"):
        for policy in ("fused", "auto"):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, FUSEJIT_CACHE_DIR=cache)
                times = []
                for _ in range(2):  # cold, then warm
                    out = subprocess.run([sys.executable, "-c",
                                          FIRST_CALL % (py, tests, wid, policy)],
                                         env=env, stdout=subprocess.PIPE,
                                         universal_newlines=True, check=True).stdout
                    times.append(float(out.split()[-1]))
            row = {"id": wid, "policy": policy, "cold_ms": times[0], "warm_ms": times[1]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fusejit", default="", help="command running the fusejit CLI")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: overhead,seeds,first")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d")}
    if "overhead" not in skip:
        result["overhead"] = host_overhead(args.fusejit)
        print(json.dumps(result["overhead"]), flush=True)
    if "seeds" not in skip:
        result["seeds"] = seeds(args.reps)
    if "first" not in skip:
        result["first_call"] = first_calls()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
