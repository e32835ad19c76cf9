# Per-gradient errors vs float64 of the W3 (and W1) drop-in in bf16/f16 and of PyTorch's module.
import copy, sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests/python")
import fusejit.torch as fj
from seed_models import SEEDS
from torch_dropin import randomized, rel_err
for wid in sys.argv[1].split(","):
  for dn in sys.argv[2].split(","):
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dn]
    cls, init, shape, _, _ = SEEDS[wid]
    torch.manual_seed(0)
    model = randomized(cls(*init), 1).cuda().to(dtype)
    ref = copy.deepcopy(model).double()
    x = torch.rand(*shape, device="cuda").to(dtype)
    with torch.no_grad():
        yshape = model(x).shape
    g = torch.randn(yshape, device="cuda").to(dtype)
    xd = x.double().requires_grad_(True)
    rg = torch.autograd.grad(ref(xd), [xd] + list(ref.parameters()), g.double())
    names = ["x"] + [n for n, _ in model.named_parameters()]
    def report(tag, m):
        xg = x.clone().requires_grad_(True)
        fg = torch.autograd.grad(m(xg), [xg] + list(m.parameters()), g)
        print(wid, dn, tag, " ".join("%s %.3e" % (n, rel_err(a, r)) for n, a, r in zip(names, fg, rg)), flush=True)
    report("fusejit", fj.fuse(copy.deepcopy(model), policy="fused"))
    report("pytorch", model)
    del ref, rg, xd
    torch.cuda.empty_cache()
