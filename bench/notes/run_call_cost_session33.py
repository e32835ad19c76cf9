#!/usr/bin/env python3
"""Host cost of the pieces of a drop-in training step (session 33), per call, back to back:
a ctypes no-op (fj_abi_version), fj_chain_spec (handle lookup), run_pointers of S3's forward
(3 kernels) and backward (4 kernels), torch.empty, a torch launch (x.neg_() on 1 KB), and
_ChainFunction.apply + backward as the drop-in calls them.

  PYTHONPATH=python:bench FUSEJIT_LIBRARY=... python3 bench/notes/run_call_cost_session33.py
"""
import ctypes
import time
import torch
import fusejit.torch as fj
from fusejit import _lib


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    return host * 1e6


spec = "x:f32[16,32,16,32,32] | group_norm(groups=4,eps=1e-5) | mul(by=1.5) | tanh"
small = "x:f32[2,8,4,4,4] | group_norm(groups=4,eps=1e-5) | mul(by=1.5) | tanh"
lib = _lib.library()
print("ctypes fj_abi_version: %.2f us" % per_call(lambda: lib.fj_abi_version()))
for s in (spec, small):
    x = torch.randn(*[int(v) for v in s.split("[")[1].split("]")[0].split(",")], device="cuda")
    w = torch.rand(32 if s == spec else 8, device="cuda") + 0.5
    b = torch.rand_like(w)
    fwd = fj._compiled_chain(s, 0)
    bwd, _ = fj._backward_or_why(s, 0)
    out = ctypes.c_char_p()
    print(s)
    print("  fj_chain_spec: %.2f us" % per_call(lambda: lib.fj_chain_spec(fwd._handle, ctypes.byref(out))))
    y = torch.empty_like(x)
    ws = torch.empty(max(fwd.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
    ptrs = [x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr()] + ([ws.data_ptr()] if fwd.workspace_bytes else [])
    print("  forward run_pointers (%s): %.2f us" % (fwd.strategy, per_call(lambda: fwd.run_pointers(ptrs))))
    gx, gw, gb = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    wsb = torch.empty(max(bwd.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
    bp = [x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), gx.data_ptr(), gw.data_ptr(), gb.data_ptr()] + ([wsb.data_ptr()] if bwd.workspace_bytes else [])
    print("  backward run_pointers: %.2f us" % per_call(lambda: bwd.run_pointers(bp)))
    print("  torch.empty like x: %.2f us" % per_call(lambda: torch.empty(x.shape, device="cuda")))
    xr = x.clone().requires_grad_(True)
    wr, br = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    gy = torch.rand_like(x)

    def step():
        xr.grad = wr.grad = br.grad = None
        fj._ChainFunction.apply(s, xr, wr, br).backward(gy)
    print("  _ChainFunction step: %.2f us" % per_call(step, 500))
    with torch.no_grad():
        print("  _ChainFunction.apply no grad: %.2f us" % per_call(lambda: fj._ChainFunction.apply(s, x, w, b), 500))
t = torch.zeros(256, device="cuda")
print("torch x.neg_() 1 KB: %.2f us" % per_call(lambda: t.neg_()))
