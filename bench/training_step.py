#!/usr/bin/env python3
"""The training step (forward + backward) of fused chains: fusejit against PyTorch, side by side,
in one run on the GPU machine (its python3 has torch and numpy).

For each chain (the four seeds W1-W4 by default, or the --spec chains):

PyTorch   the chain as an nn.Sequential (bench/compare_pytorch.py's build/setup_row: x ~ U[0,1)
          like torch.rand, conv weights with PyTorch's default init, GroupNorm weight ~ U[0.5,1.5]
          and bias ~ U[-0.5,0.5]) and an upstream gradient g ~ U[-1,1). The timed step is
              x.grad = p.grad = None; y = model(x); y.backward(g)
          (x and every parameter require grad), median of --reps CUDA-event timings after
          warm-up, L2 flushed before each run (compare_pytorch.time_cuda), for
            eager     PyTorch defaults (cuDNN may use TF32 for convolutions)
            strict    eager with TF32 off (cudnn.allow_tf32 = cuda.matmul.allow_tf32 = False)
            compile   torch.compile(model), default mode, default TF32 settings (n/a on failure;
                      --no-compile skips it)
          extra memory: the peak allocated during one eager step minus what was allocated before it
          (intermediates, saved tensors, cuDNN workspace and the gradients themselves);
          gradient error of the strict fp32 step against the float64 model (same x, parameters
          and g): ||a-b||/||b||, for x.grad and the max over the parameters' gradients.
fusejit   `fusejit bench SPEC --grad --json --reps N --warmup 2 --input x.npy --param ...` on the
          same x and parameters (its grad_y is its own random draw, also U[-1,1)): forward_ms,
          backward_ms, step_ms (their sum, each a median with the L2 flushed; the training forward
          saving the convolution's output u where the chain has one, as the drop-in runs it) and
          its extra memory: the backward's workspace plus u (the gradients themselves not
          counted); with --kernels the
          backward's kernels timed one by one (differences of prefix medians).
          --check: `fusejit run SPEC' --grad --check --check-samples B --reps 0` on the chain with
          its batch replaced by B = --check-batch (default 2), so that every sample, and so every
          parameter gradient, is compared with fusejit's float64 CPU reference; the rel l2 column
          of each gradient is kept, the max reported.

The table compares fusejit (fp32-accurate, or TF32 with --precision tf32) with strict fp32 eager, the
PyTorch time of fp32-accurate's precision class, and with the fastest PyTorch time of any precision
(eager's TF32 default is tf32's class). --out writes every raw number as JSON.
Chains run one at a time and release their device memory before the next (W1/W2's outputs and
gradients are about 1 GB each); a failure in one row is reported in it and the other rows still run.

  python3 bench/training_step.py --fusejit ".gpu/run fusejit" [--spec SPEC ... | --sweep]
      [--only W1,W3 | --only S1,K9] [--reps 10]
      [--no-compile] [--check [--check-batch 2]] [--kernels] [--out rows.json]
"""
import argparse
import gc
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import SEEDS, errors, setup_row, time_cuda  # noqa: E402

GB = 1e9


def describe(e):
    """One line naming an exception, for a row's *_error field."""
    lines = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, lines[0][:300] if lines else "")


def worst(values):
    """The max of relative errors, NaN when any is NaN (max() would skip it depending on order)."""
    values = list(values)
    return float("nan") if any(v != v for v in values) else max(values)


# ----------------------------------------------------------------------------------------------
# PyTorch


def set_tf32(allowed):
    torch.backends.cudnn.allow_tf32 = allowed
    torch.backends.cuda.matmul.allow_tf32 = allowed


def make_step(fn, x, g, params):
    """The timed training step: drop the previous gradients, forward, backward from g."""
    def step():
        x.grad = None
        for p in params:
            p.grad = None
        fn(x).backward(g)
    return step


def step_memory(step, x, params):
    """Bytes allocated at the peak of one step beyond what was allocated before it."""
    x.grad = None
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def grad_errors(model, x, g, params):
    """Relative L2 errors of the strict fp32 gradients against the float64 model's: returns
    (x error, max over the parameters, {param name: error})."""
    set_tf32(False)
    step = make_step(model, x, g, params)
    step()
    g32 = {"x": x.grad.detach().clone()}
    g32.update({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    x.grad = None
    for p in params:
        p.grad = None
    model.double()
    try:
        x64 = x.detach().double().requires_grad_(True)
        model(x64).backward(g.double())
        rel = {"x": errors(g32.pop("x"), x64.grad)[0]}
        for n, p in model.named_parameters():
            rel[n] = errors(g32.pop(n), p.grad)[0]
        del x64
    finally:
        for p in params:
            p.grad = None
        model.float()
    per_param = {k: v for k, v in rel.items() if k != "x"}
    return rel["x"], worst(per_param.values()) if per_param else None, per_param


def free_device_memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pytorch_row(row, name, spec, reps, do_compile, tmp):
    """PyTorch's times, memory and gradient errors for one chain, filled into row as measured (so
    a failure keeps what came before it); the x and parameter .npy files it leaves in tmp, named
    by row["fusejit_inputs"], are fusejit's inputs."""
    model, x, x_path, param_flags = setup_row(name, spec, tmp)
    row["fusejit_inputs"] = ["--input", x_path] + param_flags
    params = list(model.parameters())
    for p in params:
        p.requires_grad_(True)
    x.requires_grad_(True)
    with torch.no_grad():
        out_shape = list(model(x).shape)
    g = torch.rand(out_shape, device="cuda") * 2 - 1
    row["output_shape"] = out_shape

    set_tf32(True)
    eager = make_step(model, x, g, params)
    row["eager_ms"] = time_cuda(eager, reps)
    row["eager_extra_bytes"] = step_memory(eager, x, params)
    set_tf32(False)
    row["strict_ms"] = time_cuda(eager, reps)
    row["strict_extra_bytes"] = step_memory(eager, x, params)
    x.grad = None
    for p in params:
        p.grad = None
    free_device_memory()

    try:
        row["strict_grad_rel_x"], row["strict_grad_rel_params"], row["strict_grad_rel_per_param"] = \
            grad_errors(model, x, g, params)
    except Exception as e:  # noqa: BLE001 (float64 out of memory, ...): the row goes on
        row["grad_error"] = describe(e)
    free_device_memory()
    params = list(model.parameters())  # the same objects after .double()/.float(), to be sure

    set_tf32(True)
    if do_compile:
        try:
            compiled = torch.compile(model)
            step = make_step(compiled, x, g, params)
            t0 = time.time()
            step()
            torch.cuda.synchronize()
            row["compile_build_s"] = time.time() - t0
            row["compile_ms"] = time_cuda(step, reps)
        except Exception as e:  # noqa: BLE001: torch.compile failures are reported as n/a
            row["compile_error"] = describe(e)
        finally:
            compiled = step = None
            x.grad = None
            for p in params:
                p.grad = None
            if hasattr(torch, "_dynamo"):
                torch._dynamo.reset()  # each row's module would otherwise count as a recompile


# ----------------------------------------------------------------------------------------------
# fusejit


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.lstrip().startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON object in the output")


def failure(proc):
    lines = (proc.stderr.strip() or proc.stdout.strip() or "exit %d" % proc.returncode).splitlines()
    return "exit %d: %s" % (proc.returncode, " ".join(lines[-3:])[:400])


def fusejit_bench(fusejit, spec, reps, kernels, inputs, timeout, recompute=False,
                  precision="fp32"):
    cmd = fusejit + ["bench", spec, "--grad", "--json", "--reps", str(reps), "--warmup", "2",
                     "--precision", precision]
    if recompute:
        cmd.append("--recompute")
    cmd += inputs + (["--kernels"] if kernels else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)
    if proc.returncode != 0:
        return {"fusejit_error": failure(proc)}
    r = last_json(proc.stdout)
    # Extra memory: the backward's workspace plus u, saved by the training forward and held
    # until the backward (0 where the backward recomputes it).
    out = {"fusejit_forward_ms": r["forward_ms"], "fusejit_backward_ms": r["backward_ms"],
           "fusejit_step_ms": r["step_ms"],
           "fusejit_extra_bytes": r["backward_workspace_bytes"] + r.get("saved_bytes", 0),
           "fusejit_saved_bytes": r.get("saved_bytes", 0),
           "fusejit_compile_ms": r.get("compile_ms"), "device": r.get("device")}
    if "kernels" in r:
        out["fusejit_backward_kernels"] = r["kernels"]
    return out


def with_batch(spec, batch):
    """The spec with the input's leading (batch) dimension at most `batch`."""
    m = re.match(r"(\s*x:f32\[)(\d+)", spec)
    if not m:
        raise ValueError("cannot find the batch dimension of " + spec)
    return spec[:m.start(2)] + str(min(batch, int(m.group(2)))) + spec[m.end(2):]


# `grad_x  4.234e-07  7.048e-12  9.743e-07  0 ok`: name, rel l2, max abs, max rel, unwritten, verdict
CHECK_LINE = re.compile(r"^(grad_\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(ok|FAIL)\s*$")


def fusejit_check(fusejit, spec, batch, timeout):
    small = with_batch(spec, batch)
    n = int(re.match(r"\s*x:f32\[(\d+)", small).group(1))
    cmd = fusejit + ["run", small, "--grad", "--check", "--check-samples", str(n), "--reps", "0"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)
    rel = {}
    for line in proc.stdout.splitlines():
        m = CHECK_LINE.match(line.strip())
        if m:
            rel[m.group(1)] = float(m.group(2))
    if proc.returncode not in (0, 1) or not rel:  # 1: the check ran and some gradient failed
        return {"check_error": failure(proc)}
    params = [v for k, v in rel.items() if k != "grad_x"]
    return {"check_spec": small, "check_pass": proc.returncode == 0, "check_rel_per_grad": rel,
            "check_rel_max": worst(rel.values()), "check_rel_x": rel.get("grad_x"),
            "check_rel_params": worst(params) if params else None}


# ----------------------------------------------------------------------------------------------
# rows and the table


def run_row(name, spec, fusejit, args, tmp):
    row = {"id": name, "spec": spec}
    try:
        pytorch_row(row, name, spec, args.reps, not args.no_compile, tmp)
    except Exception as e:  # noqa: BLE001: one failed row must not stop the others
        row["torch_error"] = describe(e)
        traceback.print_exc()
    free_device_memory()  # before fusejit's process needs the device memory
    inputs = row.pop("fusejit_inputs", [])
    try:
        row.update(fusejit_bench(fusejit, spec, args.reps, args.kernels, inputs, args.timeout,
                                 args.recompute, args.precision))
    except Exception as e:  # noqa: BLE001
        row["fusejit_error"] = describe(e)
    if args.check:
        try:
            row.update(fusejit_check(fusejit, spec, args.check_batch, args.timeout))
        except Exception as e:  # noqa: BLE001
            row["check_error"] = describe(e)
    for f in os.listdir(tmp):  # the .npy inputs of this row
        os.remove(os.path.join(tmp, f))
    if "fusejit_step_ms" in row:
        t = row["fusejit_step_ms"]
        if "strict_ms" in row:
            row["speedup_vs_strict"] = row["strict_ms"] / t
        best = [row[k] for k in ("eager_ms", "strict_ms", "compile_ms") if k in row]
        if best:
            row["speedup_vs_best"] = min(best) / t
    return row


def fmt(row, key, f="%.3f", scale=1.0):
    v = row.get(key)
    return f % (v * scale) if isinstance(v, (int, float)) else "n/a"


def progress(row):
    print("%s: fusejit %s ms (fwd %s + bwd %s) | eager %s strict %s compile %s ms%s" % (
        row["id"], fmt(row, "fusejit_step_ms"), fmt(row, "fusejit_forward_ms"),
        fmt(row, "fusejit_backward_ms"), fmt(row, "eager_ms"), fmt(row, "strict_ms"),
        fmt(row, "compile_ms"),
        "".join(" | %s: %s" % (k, row[k]) for k in sorted(row) if k.endswith("_error"))), flush=True)


def print_table(rows, check):
    hdr = ["id", "fusejit step ms (fwd+bwd)", "eager TF32 ms", "torch.compile ms",
           "eager strict ms", "vs strict fp32", "vs fastest PyTorch", "fusejit extra GB",
           "PyTorch eager extra GB"]
    if check:
        hdr.append("fusejit grad rel err (max)")
    hdr.append("PyTorch fp32 grad rel err x / params")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        cells = [r["id"],
                 "%s (%s+%s)" % (fmt(r, "fusejit_step_ms"), fmt(r, "fusejit_forward_ms"),
                                 fmt(r, "fusejit_backward_ms")),
                 fmt(r, "eager_ms"), fmt(r, "compile_ms"), fmt(r, "strict_ms"),
                 fmt(r, "speedup_vs_strict", "%.2fx"), fmt(r, "speedup_vs_best", "%.2fx"),
                 fmt(r, "fusejit_extra_bytes", "%.3f", 1 / GB),
                 fmt(r, "eager_extra_bytes", "%.3f", 1 / GB)]
        if check:
            cells.append(fmt(r, "check_rel_max", "%.1e") +
                         ("" if r.get("check_pass", True) else " FAIL"))
        cells.append("%s / %s" % (fmt(r, "strict_grad_rel_x", "%.1e"),
                                  fmt(r, "strict_grad_rel_params", "%.1e")))
        print("| " + " | ".join(cells) + " |")
    print()
    for r in rows:
        errs = ["%s: %s" % (k, r[k]) for k in sorted(r) if k.endswith("_error")]
        print("- %s: `%s`%s" % (r["id"], r["spec"], "".join("\n  - " + e for e in errs)))
    sys.stdout.flush()


def print_kernels(rows):
    print("\nfusejit backward kernels (median ms from differences of prefix medians, share of "
          "the backward):")
    for r in rows:
        ks = r.get("fusejit_backward_kernels")
        if not ks:
            continue
        print("%s (backward %.3f ms):" % (r["id"], r["fusejit_backward_ms"]))
        for k in ks:
            share = 100 * k["median_ms"] / r["fusejit_backward_ms"] if r["fusejit_backward_ms"] else 0
            print("  %-32s %9.4f ms %5.1f%%" % (k["name"], k["median_ms"], share))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fusejit", default="fusejit",
                    help='command that runs the fusejit CLI (e.g. ".gpu/run fusejit")')
    ap.add_argument("--spec", action="append",
                    help="a chain to run instead of the seeds (repeatable; rows S1, S2, ...)")
    ap.add_argument("--sweep", action="store_true",
                    help="the convolution-engine sweep's chains (bench/conv_engine_sweep.py, "
                         "rows S1-G4) instead of the seeds")
    ap.add_argument("--only", help="comma-separated seed or sweep ids (W1,W3; S1,K9): run just these")
    ap.add_argument("--reps", type=int, default=10, help="timed runs (median; default 10)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--check", action="store_true",
                    help="also check fusejit's gradients against float64 on a reduced batch")
    ap.add_argument("--check-batch", type=int, default=2,
                    help="batch of the --check chain: every sample is checked (default 2)")
    ap.add_argument("--kernels", action="store_true", help="time fusejit's backward kernels too")
    ap.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                    help="fusejit's precision: fp32-accurate (default; compare with strict fp32 "
                         "eager) or tf32 (compare with eager's TF32 default)")
    ap.add_argument("--recompute", action="store_true",
                    help="fusejit's plain forward and the backward recomputing the convolution "
                         "(fusejit bench --grad --recompute) instead of the training forward "
                         "saving its output")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per fusejit command")
    ap.add_argument("--out", help="write every row's raw numbers as JSON here")
    args = ap.parse_args()

    if args.spec:
        chains = [("S%d" % (i + 1), s) for i, s in enumerate(args.spec)]
    else:
        only = set(args.only.split(",")) if args.only else None
        if args.sweep:
            from conv_engine_sweep import specs as sweep_specs
            chains = list(sweep_specs())
        else:
            chains = SEEDS
        chains = [(n, s) for n, s in chains if only is None or n in only]
    fusejit = shlex.split(args.fusejit)
    header = "torch %s, %s, cuDNN %s, %s" % (torch.__version__, torch.cuda.get_device_name(),
                                             torch.backends.cudnn.version(), time.strftime("%F"))
    print(header, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in chains:
            rows.append(run_row(name, spec, fusejit, args, tmp))
            progress(rows[-1])
            if args.out:  # after every row, so that a crash keeps what was measured
                with open(args.out, "w") as f:
                    json.dump({"environment": header, "reps": args.reps, "rows": rows}, f, indent=1)
    print("\ntraining step (forward + backward of x and every parameter), medians of %d runs, "
          "L2 flushed" % args.reps)
    print_table(rows, args.check)
    if args.kernels:
        print_kernels(rows)


if __name__ == "__main__":
    main()
