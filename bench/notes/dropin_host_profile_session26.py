# Where the drop-in's host time goes in a training step (bf16 by default) on sweep rows
# (bench/conv_engine_sweep.py ids): cProfile of 50 steps enqueued back to back (policy "fused"),
# the top functions by own time, and the host time per step of the library's run calls alone.
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/dropin_host_profile_session26.py G4,K7
import copy, cProfile, io, pstats, sys, time, torch
sys.path.insert(0, "bench")
import fusejit.torch as fj
from fusejit import _lib
from compare_pytorch import build
from conv_engine_sweep import specs

ids = sys.argv[1].split(",")
dtype = torch.bfloat16 if len(sys.argv) < 3 else getattr(torch, sys.argv[2])
for name, spec in specs():
    if name not in ids:
        continue
    torch.manual_seed(0)
    shape, model = build(spec)
    model = model.cuda().to(dtype)
    fast = fj.fuse(copy.deepcopy(model), policy="fused")
    x = torch.rand(*shape, device="cuda").to(dtype).requires_grad_(True)
    with torch.no_grad():
        g = (torch.rand(model(x).shape, device="cuda") * 2 - 1).to(dtype)
    ps = list(fast.parameters())

    def step():
        x.grad = None
        for p in ps:
            p.grad = None
        fast(x).backward(g)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    # The library's run calls: wrap run_pointers of every compiled chain to time them on the host.
    spent = [0.0, 0]
    orig = _lib.Chain.run_pointers

    def timed(self, *a, **k):
        t = time.perf_counter()
        r = orig(self, *a, **k)
        spent[0] += time.perf_counter() - t
        spent[1] += 1
        return r

    _lib.Chain.run_pointers = timed
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    _lib.Chain.run_pointers = orig
    print("== %s %s: host %.3f ms/step enqueue; run_pointers %.3f ms/step in %.1f calls" %
          (name, spec, (t1 - t0) * 20, spent[0] * 20, spent[1] / 50.0), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        step()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue(), flush=True)
