"""Random 3-D convolutional networks as users write them -- several conv blocks with batch,
group or instance norms, activations, poolings between them, residual sums with shortcuts, a
pooled Linear head or not -- for the drop-in's tests: the chains fusejit fuses are the blocks'
starts, the rest of forward runs as PyTorch with the later chains fused inside it.

RandomNet(seed) is deterministic in seed; RandomNet.shape is an input shape it takes.
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = [nn.ReLU, lambda: nn.ReLU(inplace=True), nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid,
               nn.Hardswish, nn.Mish, lambda: nn.LeakyReLU(0.1), nn.ELU, nn.Softplus,
               nn.Identity]


class Block(nn.Module):
    """conv (* factor) -> norm -> act, or with a residual: act(norm(conv(x)) + shortcut(x)); then
    maybe a per-channel scale, and 1 - tanh after it."""

    def __init__(self, rng, cin, c, residual, may_shrink=True):
        super().__init__()
        k = rng.choice([1, 3])
        stride = 1 if residual else rng.choice([1, 1, 2])
        if not may_shrink:  # (a norm needs more than one point a channel in training mode)
            stride = 1
        self.up = not residual and rng.random() < 0.2  # a transposed convolution doubling size
        self.conv = (nn.ConvTranspose3d(cin, c, 2, stride=2, bias=rng.random() < 0.5) if self.up
                     else nn.Conv3d(cin, c, k, stride=stride, padding=k // 2,
                                    bias=rng.random() < 0.5))
        norm = rng.choice(["batch", "group", "instance", "none"])
        self.norm = {"batch": lambda: nn.BatchNorm3d(c),
                     "group": lambda: nn.GroupNorm(2, c),
                     "instance": lambda: nn.InstanceNorm3d(c, affine=rng.random() < 0.5),
                     "none": nn.Identity}[norm]()
        self.act = rng.choice(ACTIVATIONS)()
        # a per-channel scale after the activation (the chain stops there: the rest applies it)
        self.scale = nn.Parameter(torch.ones(c, 1, 1, 1)) if rng.random() < 0.3 else None
        self.drop = nn.Dropout3d(0.2) if rng.random() < 0.2 else nn.Identity()
        self.residual = residual
        if residual:
            self.shortcut = nn.Conv3d(cin, c, 1) if cin != c else nn.Identity()
        # a Python-number factor between the convolution and the norm (it folds with a batch
        # norm); ops after the per-channel scale (a chain of their own in the rest)
        self.factor = rng.choice([None, None, 2.0, 0.5])
        self.tail = self.scale is not None and rng.random() < 0.5

    def forward(self, x):
        y = self.conv(x)
        y = self.norm(y * self.factor if self.factor is not None else y)
        y = self.act(y + self.shortcut(x)) if self.residual else self.act(y)
        y = self.drop(y)
        y = y * self.scale if self.scale is not None else y
        return 1 - torch.tanh(y) if self.tail else y


class RandomNet(nn.Module):
    def __init__(self, seed):
        super().__init__()
        rng = random.Random(seed)
        cin = rng.choice([2, 3, 4])
        self.shape = (2, cin, rng.randint(6, 9), rng.randint(6, 9), rng.randint(6, 9))
        blocks, self.pools = [], []
        c, size = cin, list(self.shape[2:])
        for i in range(rng.randint(1, 3)):
            out = rng.choice([4, 6, 8])
            blocks.append(Block(rng, c, out, residual=i > 0 and rng.random() < 0.4,
                                may_shrink=min(size) >= 4))
            stride = blocks[-1].conv.stride[0]
            size = ([2 * s for s in size] if blocks[-1].up else
                    [(s - 1) // stride + 1 for s in size])
            # (decided here: forward has no control flow on shapes, which tracing cannot follow)
            pool = rng.choice(["max", "avg", "none"]) if min(size) >= 4 else "none"
            if pool != "none":
                size = [s // 2 for s in size]
            self.pools.append(pool)
            c = out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c, 3) if rng.random() < 0.5 else None

    def forward(self, x):
        for block, pool in zip(self.blocks, self.pools):
            x = block(x)
            if pool == "max":
                x = F.max_pool3d(x, 2)
            elif pool == "avg":
                x = F.avg_pool3d(x, 2)
        if self.head is not None:
            x = self.head(x.mean([2, 3, 4]))
        return x


def randomize(model, seed):
    """Random weights (never zeros, norms' weights not 1 nor their biases 0) and running
    statistics."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (0.7 if p.dim() == 1 else 0.0))
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm3d, nn.InstanceNorm3d)) and m.track_running_stats:
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model
