#!/usr/bin/env python3
"""Models written with the forms the drop-in fuses since the thirty-second session --
nn.InstanceNorm3d (affine or not), nn.GroupNorm(affine=False), F.group_norm without weights, a
mean with keepdim=True, nn.AdaptiveAvgPool3d(1) without flatten (rows N*), and arithmetic with
constants, x * c, x / c, x + c, x - c (rows S*), per-channel Parameters and new activations (rows
K*), models that go on past the grammar, fused in part (rows P*: strict=False), batch norms (rows
B*: folded in eval mode; in training mode the chain stops before them), several chains in one
forward (rows M*: the later ones in the rest of forward), ops after a stop as a chain of their own,
a factor folded with a batch norm, a mean over the channels (rows Q*), sums over the spatial
dimensions (rows U*) -- through `fusejit.torch.fuse(model,
policy="fused")` against the same model in PyTorch eager, same inputs, in one run on the GPU.
Medians of CUDA-event timings with the L2 flushed (compare_pytorch.time_cuda); errors (relative
L2) against the float64 model on the same values. f32 rows compare with strict-fp32 eager and
default (TF32) eager; bf16 rows with eager in bf16. --train times the training step (x and every
parameter require grad) instead of the forward.

  PYTHONPATH=python FUSEJIT_LIBRARY=... python3 bench/dropin_forms_speed.py [--dtypes f32,bf16]
      [--train] [--reps 10] [--only N1,S2] [--out rows.json]
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import fusejit.torch as fj  # noqa: E402
from dtype_sweep import forward_row, report, strict_fp32, train_row  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


class Chain(nn.Module):
    def __init__(self, *layers, tail=None):
        super().__init__()
        self.body = nn.Sequential(*layers)
        self.tail = tail

    def forward(self, x):
        x = self.body(x)
        return x if self.tail is None else self.tail(x)


class FunctionalNorm(nn.Module):
    def __init__(self, cin, c, groups):
        super().__init__()
        self.conv = nn.Conv3d(cin, c, 3, padding=1)
        self.groups = groups

    def forward(self, x):
        return F.silu(F.group_norm(self.conv(x), self.groups)).mean(dim=[2, 3, 4], keepdim=True)


class Scaled(nn.Module):
    """conv -> * a -> norm -> clamp -> * b, as users scale between layers."""

    def __init__(self, conv, norm, a, b):
        super().__init__()
        self.conv, self.norm, self.a, self.b = conv, norm, a, b

    def forward(self, x):
        return torch.clamp(self.norm(self.conv(x) * self.a), -1.0, 1.0) * self.b


class Shifted(nn.Module):
    def __init__(self, up, norm):
        super().__init__()
        self.up, self.norm = up, norm

    def forward(self, x):
        return self.norm(F.silu(self.up(x) / 2)) - 0.5


class NormScaledTanh(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return torch.tanh(self.norm(x) * 1.5)


class ChannelScaled(nn.Module):
    """conv -> * a per-channel Parameter -> instance norm -> clamp -> * 2 (KernelBench style)."""

    def __init__(self, cin, c):
        super().__init__()
        self.conv = nn.Conv3d(cin, c, 3)
        self.scale = nn.Parameter(torch.rand(c, 1, 1, 1) + 0.5)
        self.norm = nn.InstanceNorm3d(c)

    def forward(self, x):
        return torch.clamp(self.norm(self.conv(x) * self.scale), -1.0, 1.0) * 2.0


class BiasNormSoftplus(nn.Module):
    """conv_transpose -> + a per-channel bias Parameter -> group norm -> softplus."""

    def __init__(self, cin, c):
        super().__init__()
        self.up = nn.ConvTranspose3d(cin, c, 3, stride=2, padding=1)
        self.bias = nn.Parameter(torch.randn(1, c, 1, 1, 1) * 0.1)
        self.norm = nn.GroupNorm(8, c)

    def forward(self, x):
        return F.softplus(self.norm(self.up(x) + self.bias))


class PoolBlock(nn.Module):
    """conv -> group norm -> relu fused; the max pool after it runs as PyTorch (partial fusion)."""

    def __init__(self, cin, c, groups):
        super().__init__()
        self.conv, self.norm = nn.Conv3d(cin, c, 3, padding=1), nn.GroupNorm(groups, c)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        return self.pool(torch.relu(self.norm(self.conv(x))))


class Classifier(nn.Module):
    """conv -> gelu -> global average pool fused; the flatten and the Linear head after it."""

    def __init__(self, cin, c, classes):
        super().__init__()
        self.conv, self.pool = nn.Conv3d(cin, c, 3), nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(F.gelu(self.conv(x))), 1))


class Residual(nn.Module):
    """relu(group_norm(conv(x))) fused; the residual sum with the input after it."""

    def __init__(self, c, groups):
        super().__init__()
        self.conv, self.norm = nn.Conv3d(c, c, 3, padding=1), nn.GroupNorm(groups, c)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x))) + x


class NormSoftmax(nn.Module):
    """conv -> hardswish -> group norm fused; a softmax over the channels after it."""

    def __init__(self, cin, c, groups):
        super().__init__()
        self.conv, self.norm = nn.Conv3d(cin, c, 3), nn.GroupNorm(groups, c)

    def forward(self, x):
        return torch.softmax(self.norm(F.hardswish(self.conv(x))), dim=1)


class ConvBN(nn.Module):
    """conv (no bias) -> BatchNorm3d -> act: in eval mode the batch norm folds into the
    convolution; in training mode the chain is the convolution alone, the rest PyTorch's."""

    def __init__(self, conv, c, act):
        super().__init__()
        self.conv, self.bn, self.act = conv, nn.BatchNorm3d(c), act

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class TwoBlocks(nn.Module):
    """conv -> group norm -> relu, max pool, conv -> group norm -> relu, max pool: two chains
    (the second in the rest of forward), a VGG-style 3-D encoder."""

    def __init__(self, cin, c1, c2):
        super().__init__()
        self.c1, self.n1 = nn.Conv3d(cin, c1, 3, padding=1), nn.GroupNorm(8, c1)
        self.c2, self.n2 = nn.Conv3d(c1, c2, 3, padding=1), nn.GroupNorm(8, c2)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        x = self.pool(F.relu(self.n1(self.c1(x))))
        return self.pool(F.relu(self.n2(self.c2(x))))


class ResBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + x): a residual block of two convolutions with
    batch norms, as ResNets write it; the second conv is a chain in the rest."""

    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv3d(c, c, 3, padding=1, bias=False), nn.BatchNorm3d(c)
        self.c2, self.b2 = nn.Conv3d(c, c, 3, padding=1, bias=False), nn.BatchNorm3d(c)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + x)


class StrictRest(nn.Module):
    """`fast` called with cuDNN's TF32 off, so the PyTorch rest of a partially fused model runs
    in strict fp32 like the strict eager it is compared with (the fused chain is fp32-accurate
    either way)."""

    def __init__(self, fast):
        super().__init__()
        self.fast = fast

    def forward(self, x):
        return strict_fp32(lambda: self.fast(x))()


class SumClampGelu(nn.Module):
    """KernelBench's Conv3d_LeakyReLU_Sum_Clamp_GELU: a per-channel tensor added after the
    activation stops the chain; clamp -> gelu after it are a chain of their own (session 35)."""

    def __init__(self, cin, c):
        super().__init__()
        self.conv = nn.Conv3d(cin, c, 3)
        self.sum_tensor = nn.Parameter(torch.randn(c, 1, 1, 1))

    def forward(self, x):
        x = F.leaky_relu(self.conv(x), negative_slope=0.2) + self.sum_tensor
        return F.gelu(torch.clamp(x, min=-1.0, max=1.0))


class ScaleBNPool(nn.Module):
    """KernelBench's ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool: x * 2 between the
    convolution and the batch norm folds with it in eval mode (session 35)."""

    def __init__(self, cin, c):
        super().__init__()
        self.conv = nn.ConvTranspose3d(cin, c, 3, stride=2, padding=1, output_padding=1)
        self.bn, self.pool = nn.BatchNorm3d(c), nn.AdaptiveAvgPool3d(1)

    def forward(self, x):
        return self.pool(self.bn(self.conv(x) * 2.0))


class ChannelMean(nn.Module):
    """conv -> relu fused, then a mean over the channels (no fusejit mean): it refused the whole
    model before session 35."""

    def __init__(self, cin, c):
        super().__init__()
        self.conv = nn.Conv3d(cin, c, 3)

    def forward(self, x):
        return torch.tanh(torch.mean(torch.relu(self.conv(x)), dim=1, keepdim=True))


class NormSum(nn.Module):
    """A sum over the spatial dimensions (session 37: the chain's mean times the count; before,
    the sum ran after the chain as PyTorch)."""

    def __init__(self, conv, c, groups, keepdim=False):
        super().__init__()
        self.conv, self.norm, self.keepdim = conv, nn.GroupNorm(groups, c), keepdim

    def forward(self, x):
        return torch.sum(F.mish(self.norm(self.conv(x))), dim=[2, 3, 4], keepdim=self.keepdim)


def kept_mean(x):
    return x.mean(dim=[2, 3, 4], keepdim=True)


# id -> (model factory, input shape)
ROWS = {
    "N1": (lambda: Chain(nn.Conv3d(32, 64, 3, padding=1), nn.InstanceNorm3d(64), nn.LeakyReLU(0.2)),
           (8, 32, 32, 32, 32)),
    "N2": (lambda: Chain(nn.ConvTranspose3d(64, 32, 4, stride=2, padding=1),
                         nn.InstanceNorm3d(32, affine=True), nn.ReLU()), (4, 64, 16, 16, 16)),
    "N3": (lambda: Chain(nn.Conv3d(16, 32, 3), nn.GroupNorm(8, 32, affine=False), nn.SiLU(),
                         nn.AdaptiveAvgPool3d(1)), (16, 16, 24, 24, 24)),
    "N4": (lambda: Chain(nn.Conv3d(3, 16, 3), nn.ReLU(), tail=kept_mean), (32, 3, 32, 32, 32)),
    "N5": (lambda: Chain(nn.InstanceNorm3d(32), nn.GELU()), (8, 32, 32, 32, 32)),
    "N6": (lambda: Chain(nn.Conv3d(8, 8, 1), nn.InstanceNorm3d(8), nn.Hardswish()),
           (16, 8, 32, 32, 32)),
    "N7": (lambda: FunctionalNorm(24, 48, 6), (4, 24, 20, 20, 20)),
    "N8": (lambda: Chain(nn.Conv3d(4, 16, 3, stride=2, padding=1), nn.InstanceNorm3d(16),
                         nn.Tanh(), nn.AdaptiveAvgPool3d(1)), (32, 4, 48, 48, 48)),
    "S1": (lambda: Scaled(nn.Conv3d(3, 16, 3), nn.InstanceNorm3d(16), 0.5, 2.0),
           (128, 3, 16, 32, 32)),
    "S2": (lambda: Shifted(nn.ConvTranspose3d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64)),
           (4, 32, 16, 16, 16)),
    "S3": (lambda: NormScaledTanh(nn.GroupNorm(4, 32)), (16, 32, 16, 32, 32)),
    # per-channel parameters folded, smooth activations (session 33)
    "K1": (lambda: ChannelScaled(3, 16), (128, 3, 16, 32, 32)),
    "K2": (lambda: Chain(nn.Conv3d(3, 16, 3), nn.Mish(), nn.Tanh()), (16, 3, 16, 32, 32)),
    "K3": (lambda: BiasNormSoftplus(32, 64), (4, 32, 16, 16, 16)),
    "K4": (lambda: Chain(nn.Conv3d(8, 32, 3), nn.GroupNorm(4, 32), nn.ELU(), tail=kept_mean),
           (32, 8, 16, 16, 16)),
    # several chains: the second in the rest of forward
    "M1": (lambda: TwoBlocks(8, 32, 64), (8, 8, 32, 32, 32)),
    "M2": (lambda: ResBlock(32), (8, 32, 16, 16, 16)),
    # batch norms (running statistics) folded in eval mode; in training the chain stops there
    "B1": (lambda: ConvBN(nn.Conv3d(16, 32, 3, padding=1, bias=False), 32, nn.ReLU()),
           (16, 16, 32, 32, 32)),
    "B2": (lambda: ConvBN(nn.Conv3d(3, 16, 3, bias=False), 16, nn.SiLU()), (128, 3, 16, 32, 32)),
    "B3": (lambda: ConvBN(nn.ConvTranspose3d(32, 16, 3, stride=2, padding=1, output_padding=1,
                                             bias=False), 16, nn.GELU()), (8, 32, 16, 16, 16)),
    # partial fusion (strict=False): the fusable start fused, the rest run as PyTorch
    "P1": (lambda: PoolBlock(16, 32, 8), (16, 16, 32, 32, 32)),
    "P2": (lambda: Classifier(3, 16, 10), (128, 3, 16, 32, 32)),
    "P3": (lambda: Residual(32, 8), (8, 32, 32, 32, 32)),
    "P4": (lambda: NormSoftmax(3, 16, 4), (32, 3, 16, 32, 32)),
    # session 35: ops after a stop fused as a chain of their own, a factor folded with a batch
    # norm, a mean over the channels left to the rest
    "Q1": (lambda: SumClampGelu(3, 16), (128, 3, 16, 32, 32)),
    "Q2": (lambda: ScaleBNPool(32, 16), (8, 32, 16, 16, 16)),
    "Q3": (lambda: ChannelMean(3, 16), (128, 3, 16, 32, 32)),
    # session 37: sums fused as the chain's mean times the count
    "U1": (lambda: NormSum(nn.Conv3d(16, 32, 3, padding=1), 32, 4), (16, 16, 32, 32, 32)),
    "U2": (lambda: NormSum(nn.ConvTranspose3d(32, 16, 3, stride=2, padding=1, output_padding=1),
                           16, 4, keepdim=True), (8, 32, 16, 16, 16)),
}


def randomized(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (0.5 if p.dim() == 1 else 0.0))
        for m in model.modules():  # running statistics as a trained model has them
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated row ids")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    rows = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for rid, (make, shape) in ROWS.items():
            if only and rid not in only:
                continue
            torch.manual_seed(0)
            model = randomized(make(), 1).cuda().to(dtype)
            if not args.train:
                model.eval()
            ref = copy.deepcopy(model).double()
            partial = rid.startswith(("P", "B", "M", "Q"))
            fast = fj.fuse(copy.deepcopy(model), policy="fused", strict=not partial)
            if partial:
                st = fast.__dict__["_fusejit"]
                if st.running_norms:  # folded in eval mode, partial in training
                    st = st.training_state if args.train else st
                if not rid.startswith("Q"):
                    assert (st.rest is not None) == (rid.startswith(("P", "M")) or args.train), \
                        rid
                    assert any(s.tail.startswith(" | conv") for s in st.sub_states) == \
                        rid.startswith("M"), rid
                if dtype == torch.float32:
                    fast = StrictRest(fast)
            x = torch.randn(*shape, device="cuda").to(dtype)
            row = {"id": rid, "dtype": dname, "model": repr(model).replace("\n", " ")}
            fn = train_row if args.train else forward_row
            row.update(fn(model, ref, fast, x, args.reps, strict_too=dtype == torch.float32))
            best = row.get("eager_strict_ms", row["eager_ms"])
            row["speedup"] = best / row["fused_ms"]
            row["speedup_vs_default"] = row["eager_ms"] / row["fused_ms"]
            fused = fast.fast if isinstance(fast, StrictRest) else fast
            row["spec"] = fj._spec(fused.__dict__["_fusejit"], x)
            print(json.dumps(row), flush=True)
            rows.append(row)
            del model, ref, fast, x
            torch.cuda.empty_cache()
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    summary = {"train": args.train, "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "geomean_speedup": geo, "below_1": [(r["id"], r["dtype"]) for r in rows
                                                   if r["speedup"] < 1]}
    report(summary, rows, args.out)


if __name__ == "__main__":
    main()
