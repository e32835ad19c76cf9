import copy, sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests/python")
import fusejit.torch as fj
from seed_models import SEEDS
from torch_dropin import randomized, rel_err
cls, init, shape, _, _ = SEEDS["W3"]
torch.manual_seed(0)
model = randomized(cls(*init), 1).cuda().to(torch.float16)
ref = copy.deepcopy(model).double()
x = torch.rand(*shape, device="cuda").to(torch.float16)
with torch.no_grad():
    yshape = model(x).shape
g = torch.randn(yshape, device="cuda").to(torch.float16)
xd = x.double().requires_grad_(True)
rg = torch.autograd.grad(ref(xd), [xd] + list(ref.parameters()), g.double())
names = ["x"] + [n for n, _ in model.named_parameters()]
def report(tag, m, xx, gg):
    xg = xx.clone().requires_grad_(True)
    fg = torch.autograd.grad(m(xg), [xg] + list(m.parameters()), gg)
    print(tag, " ".join("%s %.3e" % (n, rel_err(a, r)) for n, a, r in zip(names, fg, rg)), flush=True)
report("f16 saved-u", fj.fuse(copy.deepcopy(model), policy="fused"), x, g)
report("f32 model on the f16 values", fj.fuse(copy.deepcopy(model).float(), policy="fused"), x.float(), g.float())
fj._training_pair = lambda spec, device: None
fj._compiled_train.clear(); fj._compiled_bwd_saved.clear()
report("f16 recompute", fj.fuse(copy.deepcopy(model), policy="fused"), x, g)
report("f32 recompute", fj.fuse(copy.deepcopy(model).float(), policy="fused"), x.float(), g.float())
