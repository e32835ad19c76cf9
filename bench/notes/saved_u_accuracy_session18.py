# Training forwards of 16-bit chains: the saved u against float64 (rel L2), per strategy.
import torch, torch.nn.functional as F
import fusejit.torch as fj
torch.manual_seed(0)
C3 = lambda s, p: (lambda x, w, b: F.conv3d(x, w, b, stride=s, padding=p))
CT = lambda s, p: (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=s, padding=p))
cases = [
  ("x:f16[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)", CT(1, 0), False),
  ("x:bf16[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)", CT(1, 0), False),
  ("x:f16[4,32,16,16,16] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)", C3(1, 1), True),
  ("x:f16[8,16,16,32,32] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8) | mean(dims=[2,3,4])", C3(1, 1), True),
  ("x:f16[64,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | mean(dims=[2,3,4])", C3(1, 0), True),
  ("x:f16[8,16,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | relu | group_norm(groups=4)", CT(2, 1), True),
  ("x:f16[32,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | group_norm(groups=4) | hardswish", CT(2, 1), True),
]
dt = {"f16": torch.float16, "bf16": torch.bfloat16}
for spec, conv, bias in cases:
    d = dt[spec[2:spec.index("[")]]
    shape = [int(v) for v in spec[spec.index("[") + 1:spec.index("]")].split(",")]
    pair = fj._training_pair(spec, 0)
    if pair is None:
        print("no training pair:", spec, flush=True); continue
    fwd, _ = pair
    params = [t for t in fwd.signature if t.role == fj._lib.ROLE_PARAM]
    x = torch.rand(*shape, device="cuda").to(d)
    ps = [((torch.rand(*t.shape, device="cuda") - 0.5) * (0.2 if len(t.shape) > 1 else 1) + (1 if (len(t.shape) == 1 and i == (2 if bias else 1)) else 0)).to(d)
          for i, t in enumerate(params)]
    y, saved = fj._launch_training(fwd, x, ps)
    torch.cuda.synchronize()
    w = ps[0].double(); b = ps[1].double() if bias else None
    ref = conv(x.double(), w, b)
    u = saved[0]
    if tuple(u.shape) != tuple(ref.shape):  # [N, D, H, C, W] layout
        u = u.permute(0, 3, 1, 2, 4)
    e = ((u.double() - ref).norm() / ref.norm()).item()
    print("u rel L2 %.2e  strategy %s  %s" % (e, ",".join(l.split("plan:")[1].strip() for l in fwd.explain().splitlines() if "plan:" in l), spec), flush=True)
