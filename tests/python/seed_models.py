"""The four seed models, copied verbatim from the shared models.py (shared/models.py beside the
repository checkout, as KernelBench writes them) so that the tests do not depend on paths outside the
repository. Only the classes are copied; SEEDS below gives their constructor arguments and input
shapes (the shapes smaller than the seed workloads', so the float64 checks stay fast on a CPU).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvTranspose3dSwishGroupNormHardSwish(nn.Module):  # W1
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, groups, eps, bias=True):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, bias=bias)
        self.group_norm = nn.GroupNorm(num_groups=groups, num_channels=out_channels, eps=eps)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.sigmoid(x) * x  # Swish
        x = self.group_norm(x)
        x = torch.nn.functional.hardswish(x)
        return x


class Conv3dHardSwishGroupNormMean(nn.Module):  # W2
    def __init__(self, in_channels, out_channels, kernel_size, num_groups=4, bias=True):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, bias=bias)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = F.hardswish(x)
        x = self.group_norm(x)
        x = torch.mean(x, dim=[2, 3, 4])
        return x


class ConvTranspose3dReLUGroupNorm(nn.Module):  # W3
    def __init__(self, in_channels, out_channels, kernel_size, groups, bias=False):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, bias=bias)
        self.relu = nn.ReLU()
        self.group_norm = nn.GroupNorm(num_groups=groups, num_channels=out_channels)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.relu(x)
        x = self.group_norm(x)
        return x


class Conv3dGroupNormMean(nn.Module):  # W4
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.group_norm(x)
        x = x.mean(dim=[1, 2, 3, 4])
        return x


# (Model class, constructor arguments as in models.py's W1..W4, the seed's spec text at the seed
# shape, a small input shape for the float64 check)
SEEDS = {
    "W1": (ConvTranspose3dSwishGroupNormHardSwish, (3, 16, 3, 2, 1, 4, 1e-5), (128, 3, 16, 32, 32),
           "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
           "group_norm(groups=4,eps=1e-5) | hardswish", (2, 3, 4, 5, 6)),
    "W2": (Conv3dHardSwishGroupNormMean, (3, 16, 4, 4), (1024, 3, 16, 32, 32),
           "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
           "mean(dims=[2,3,4])", (2, 3, 6, 7, 8)),
    "W3": (ConvTranspose3dReLUGroupNorm, (64, 128, 3, 8), (16, 64, 32, 32, 32),
           "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
           "group_norm(groups=8,eps=1e-5)", (2, 64, 3, 4, 3)),
    "W4": (Conv3dGroupNormMean, (3, 24, 3, 8), (128, 3, 24, 32, 32),
           "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
           "mean(dims=[1,2,3,4])", (2, 3, 5, 6, 7)),
}
