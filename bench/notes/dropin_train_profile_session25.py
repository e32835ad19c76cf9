# The drop-in's training step in bf16 on sweep rows (bench/conv_engine_sweep.py ids): where the time
# goes. Per row: the step timed with CUDA events (L2 flushed: the sweep's number), the host time of
# one step (20 steps enqueued back to back, no sync between them), and the GPU kernels' time per
# step from torch.profiler, for the drop-in (policy "fused") and eager.
#   PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/notes/dropin_train_profile_session25.py K4,S8
import copy, sys, time, torch
sys.path.insert(0, "bench")
import fusejit.torch as fj
from compare_pytorch import build, time_cuda
from conv_engine_sweep import specs
from torch.profiler import profile, ProfilerActivity

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
    print("==", name, spec, flush=True)
    for key, m in (("fused", fast), ("eager", model)):
        ps = list(m.parameters())

        def step():
            x.grad = None
            for p in ps:
                p.grad = None
            m(x).backward(g)

        ev = time_cuda(step, 10)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        kern = [(e.device_time_total / 5000.0, e.count / 5, e.key) for e in prof.key_averages()
                if e.device_time_total > 0]
        gpu = sum(k[0] for k in kern)
        print("%s: step %.3f ms (events, L2 flushed); host %.3f ms/step enqueue, %.3f with the "
              "drain; GPU kernels %.3f ms/step" % (key, ev, (t1 - t0) * 50, (t2 - t0) * 50, gpu))
        for t, c, k in sorted(kern, reverse=True)[:8]:
            print("    %7.3f ms  x%.0f  %s" % (t, c, k[:90]))
    print(fj._stats if hasattr(fj, "_stats") else "", flush=True)
