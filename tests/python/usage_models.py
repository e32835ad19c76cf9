"""Small models of the kinds the drop-in fuses, for the usage probes."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit.torch as fj

X_SHAPE = (2, 3, 8, 8, 8)


class ConvGN(nn.Module):  # conv | relu | group_norm : parameters used as they are
    def __init__(self, cin=3, cout=8, groups=2):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, 3, padding=1)
        self.gn = nn.GroupNorm(groups, cout)

    def forward(self, x):
        return self.gn(torch.relu(self.conv(x)))


class ConvScale(nn.Module):  # a per-channel factor folded into the convolution
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.scale = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)

    def forward(self, x):
        return torch.tanh(self.conv(x) * self.scale)


class ConvBN(nn.Module):  # batch norm folded in eval, stops the chain in training
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.bn = nn.BatchNorm3d(8)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))


class ConvIN(nn.Module):  # group_norm constants (no affine)
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.norm = nn.InstanceNorm3d(8)

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x)))


class PoolHead(nn.Module):  # a fused start, then a rest in PyTorch
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.gn(self.conv(x))))
        x = x.mean(dim=(2, 3, 4))
        return self.fc(x)


class ConvMean(nn.Module):  # ends in a mean
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.gn = nn.GroupNorm(4, 8)

    def forward(self, x):
        return F.hardswish(self.gn(self.conv(x))).mean(dim=(1, 2, 3, 4))


class ConvDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.drop = nn.Dropout(0.2)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.gn(self.drop(torch.relu(self.conv(x))))


class ConvT(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(3, 6, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(3, 6)

    def forward(self, x):
        return torch.sigmoid(self.gn(self.conv(x))) * 2.0


ALL = [ConvGN, ConvScale, ConvBN, ConvIN, PoolHead, ConvMean, ConvDrop, ConvT]


def make(cls, seed=0, *args, **kw):
    torch.manual_seed(seed)
    m = cls(*args, **kw)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # random weights everywhere (norm weights/biases not 1 / 0)
        for mod in m.modules():
            norm = isinstance(mod, (nn.GroupNorm, nn.BatchNorm3d, nn.InstanceNorm3d))
            for name, p in mod.named_parameters(recurse=False):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 +
                        (1.0 if norm and name == "weight" else 0.0))
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm3d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m


def pair(cls, seed=0, *args, **kw):
    """(original, fused twin with equal but separate parameters)."""
    orig = make(cls, seed, *args, **kw)
    return orig, fj.fuse(copy.deepcopy(orig))


def x_of(shape=X_SHAPE, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def tensors(y):
    if torch.is_tensor(y):
        return [y]
    return [t for v in y for t in tensors(v)]


def close(a, b, tol=1e-5):
    a, b = tensors(a), tensors(b)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.shape == v.shape, (u.shape, v.shape)
        assert u.dtype == v.dtype, (u.dtype, v.dtype)
        scale = max(1.0, float(v.detach().double().abs().max()) if v.numel() else 0.0)
        err = float((u.detach().double() - v.detach().double()).abs().max()) if u.numel() else 0.0
        assert err <= tol * scale, (err, scale)
    return True


def grads(m):
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in
            m.named_parameters()}


def same_grads(ga, gb, tol=1e-4):
    """every gradient within tol of the largest gradient's magnitude (floored at 1): a gradient
    that is 0 in exact arithmetic (a bias before a batch-statistics norm) is rounding noise."""
    assert ga.keys() == gb.keys()
    top = max([1.0] + [float(v.abs().max()) for v in gb.values() if v is not None and v.numel()])
    for k in ga:
        assert (ga[k] is None) == (gb[k] is None), k
        if ga[k] is not None:
            err = float((ga[k].double() - gb[k].double()).abs().max()) if ga[k].numel() else 0.0
            assert ga[k].shape == gb[k].shape, k
            assert err <= tol * top, (k, err, top)
