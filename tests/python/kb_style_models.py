"""KernelBench-level-2-style 3-D models (written from memory of the names and idioms: a
convolution then a chain of ops, many past the grammar) and probes of the recognizer's edges
(X_*), for the drop-in's tests: MODELS name -> (class, constructor args), inputs_for(name) ->
the input shapes. Small shapes (batch 2, 3 -> 8 channels, 8^3)."""
import copy
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import kb_more_models
import seed_models
from random_nets import randomize

B, CIN, COUT, S = 2, 3, 8, 8


class Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = torch.nn.functional.leaky_relu(x, negative_slope=0.01)
        x = torch.nn.functional.gelu(x)
        x = torch.sigmoid(x)
        x = x + self.bias
        return x


class Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, multiplier_shape, clamp_min, clamp_max):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.multiplier = nn.Parameter(torch.randn(multiplier_shape))
        self.instance_norm = nn.InstanceNorm3d(out_channels)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        x = self.conv(x)
        x = x * self.multiplier
        x = self.instance_norm(x)
        x = torch.clamp(x, self.clamp_min, self.clamp_max)
        x = x * self.multiplier
        x = torch.max(x, dim=1)[0]
        return x


# (the seed models W1-W4 are seed_models.py's classes)
ConvTranspose3d_Swish_GroupNorm_HardSwish = seed_models.ConvTranspose3dSwishGroupNormHardSwish


Conv3d_HardSwish_GroupNorm_Mean = seed_models.Conv3dHardSwishGroupNormMean


class Conv3d_LeakyReLU_Sum_Clamp_GELU(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, sum_tensor_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.sum_tensor = nn.Parameter(torch.randn(sum_tensor_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.leaky_relu(x, negative_slope=0.2)
        x = x + self.sum_tensor
        x = torch.clamp(x, min=-1.0, max=1.0)
        x = torch.nn.functional.gelu(x)
        return x


class Conv3d_Scaling_Tanh_Multiply_Sigmoid(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scaling_factor, bias_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.scaling_factor = nn.Parameter(torch.randn(bias_shape))
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = x * self.scaling_factor
        x = torch.tanh(x)
        x = x * self.bias
        x = torch.sigmoid(x)
        return x


class ConvTranspose3d_Scaling_AvgPool_BiasAdd_Scaling(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, scale1, scale2, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.scale1 = nn.Parameter(torch.tensor(scale1))
        self.avg_pool = nn.AvgPool3d(kernel_size=2)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale2 = nn.Parameter(torch.tensor(scale2))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x * self.scale1
        x = self.avg_pool(x)
        x = x + self.bias
        x = x * self.scale2
        return x


class Conv3d_GroupNorm_Min_Clamp_Dropout(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, min_value, max_value, dropout_p):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.norm = nn.GroupNorm(groups, out_channels)
        self.dropout = nn.Dropout(dropout_p)
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        x = self.conv(x)
        x = self.norm(x)
        x = torch.min(x, torch.tensor(self.min_value))
        x = torch.clamp(x, min=self.min_value, max=self.max_value)
        x = self.dropout(x)
        return x


class Conv3d_Mish_Tanh(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.mish(x)
        x = torch.tanh(x)
        return x


class Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.divisor = divisor
        self.max_pool = nn.MaxPool3d(pool_size)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.sum_dim = sum_dim

    def forward(self, x):
        x = self.conv(x)
        x = x / self.divisor
        x = self.max_pool(x)
        x = self.global_avg_pool(x)
        x = x + self.bias
        x = torch.sum(x, dim=self.sum_dim)
        return x


class ConvTranspose3d_Add_HardSwish(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x, add_input):
        x = self.conv_transpose(x)
        x = x + add_input
        x = x * torch.nn.functional.hardswish(x)
        return x


class ConvTranspose3d_BatchNorm_Subtract(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias=True):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, bias=bias)
        self.batch_norm = nn.BatchNorm3d(out_channels)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.batch_norm(x)
        x = x - torch.mean(x, dim=(2, 3, 4), keepdim=True)
        return x


class Conv3d_Softmax_MaxPool_MaxPool(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.pool1 = nn.MaxPool3d(pool_kernel_size)
        self.pool2 = nn.MaxPool3d(pool_kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.softmax(x, dim=1)
        x = self.pool1(x)
        x = self.pool2(x)
        return x


class ConvTranspose3d_Clamp_Min_Divide(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, min_value, divisor):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.min_value = min_value
        self.divisor = divisor

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.clamp(x, min=self.min_value)
        x = x / self.divisor
        return x


class ConvTranspose3d_LayerNorm_GELU_Scaling(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias=True, eps=1e-5,
                 scaling_factor=1.0):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, bias=bias)
        self.layer_norm = nn.LayerNorm(out_channels, eps=eps)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.layer_norm(x)  # (normalizes the last dim: W == out_channels here)
        x = torch.nn.functional.gelu(x)
        x = x * self.scaling_factor
        return x


class Conv3d_Min_Softmax(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dim):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.dim = dim

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, dim=self.dim)[0]
        x = torch.softmax(x, dim=1)
        return x


class ConvTranspose3d_BatchNorm_AvgPool_AvgPool(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.batch_norm = nn.BatchNorm3d(out_channels)
        self.avg_pool1 = nn.AvgPool3d(kernel_size=2)
        self.avg_pool2 = nn.AvgPool3d(kernel_size=2)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.batch_norm(x)
        x = self.avg_pool1(x)
        x = self.avg_pool2(x)
        return x


Conv3d_GroupNorm_Mean = seed_models.Conv3dGroupNormMean


class Conv3d_Max_LogSumExp_ReLU(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.max_pool = nn.MaxPool3d(kernel_size=2, stride=2)

    def forward(self, x):
        x = self.conv(x)
        x = self.max_pool(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.relu(x)
        return x


class ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, sum_weight,
                 norm_shape, pool_kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.sum_weight = nn.Parameter(torch.tensor(sum_weight))
        self.norm = nn.LayerNorm(norm_shape)
        self.avg_pool = nn.AvgPool3d(kernel_size=pool_kernel_size)
        self.gelu = nn.GELU()

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x + self.sum_weight
        x = self.norm(x)
        x = self.avg_pool(x)
        x = self.gelu(x)
        return x


class ConvTranspose3d_Multiply_Max_GlobalAvgPool_Clamp(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, scale, maxpool_kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.scale = scale
        self.maxpool = nn.MaxPool3d(kernel_size=maxpool_kernel_size)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.clamp_min = 0
        self.clamp_max = 1

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x * self.scale
        x = self.maxpool(x)
        x = self.global_avg_pool(x)
        x = torch.clamp(x, min=self.clamp_min, max=self.clamp_max)
        return x


class ConvTranspose3d_Mean_Add_Softmax_Tanh_Scaling(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias_shape, scaling_factor):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.mean(x, dim=1, keepdim=True)
        x = x + self.bias
        x = torch.softmax(x, dim=1)
        x = torch.tanh(x)
        x = x * self.scaling_factor
        return x


class ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale_factor, eps=1e-5, momentum=0.1):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size)
        self.scale_factor = scale_factor
        self.batch_norm = nn.BatchNorm3d(out_channels, eps=eps, momentum=momentum)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x * self.scale_factor
        x = self.batch_norm(x)
        x = self.global_avg_pool(x)
        return x


class ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        original_x = x.clone().detach()
        x = x + self.bias
        x = x + original_x
        x = x * original_x
        x = x + original_x
        return x


class ConvTranspose3d_Max_Max_Sum(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.max_pool1 = nn.MaxPool3d(kernel_size=2)
        self.max_pool2 = nn.MaxPool3d(kernel_size=3)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.max_pool1(x)
        x = self.max_pool2(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x


class ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, multiplier_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.multiplier = nn.Parameter(torch.randn(multiplier_shape))
        self.leaky_relu = nn.LeakyReLU(negative_slope=0.2)
        self.max_pool = nn.MaxPool3d(kernel_size=2)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.leaky_relu(x)
        x = x * self.multiplier
        x = self.leaky_relu(x)
        x = self.max_pool(x)
        return x


class ConvTranspose3d_Softmax_Sigmoid(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias=True):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding, bias=bias)
        self.softmax = nn.Softmax(dim=1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.softmax(x)
        x = self.sigmoid(x)
        return x


ConvTranspose3d_ReLU_GroupNorm = seed_models.ConvTranspose3dReLUGroupNorm


class ConvTranspose3d_AvgPool_Clamp_Softmax_Multiply(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, pool_kernel_size,
                 clamp_min, clamp_max):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.avg_pool = nn.AvgPool3d(pool_kernel_size)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.avg_pool(x)
        x = torch.clamp(x, self.clamp_min, self.clamp_max)
        x = torch.softmax(x, dim=1)
        x = x * 2
        return x


class ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, pool_kernel_size,
                 pool_stride, pool_padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.max_pool = nn.MaxPool3d(kernel_size=pool_kernel_size, stride=pool_stride, padding=pool_padding)
        self.subtract = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.max_pool(x)
        x = torch.softmax(x, dim=1)
        x = x - self.subtract.view(1, -1, 1, 1, 1)
        x = torch.sigmoid(x) * x  # Swish
        x = torch.max(x, dim=1)[0]
        return x


class ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp_Max(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = x * torch.sigmoid(x + 3) / 6
        x = x - self.bias
        x = torch.clamp(x, min=-1, max=1)
        x = torch.max(x, dim=1, keepdim=True)[0]
        return x


class Conv3d_HardSwish_ReLU_Softmax_Mean(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias=True):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, bias=bias)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.hardswish(x)
        x = torch.relu(x)
        x = torch.softmax(x, dim=1)
        x = torch.mean(x, dim=[2, 3, 4])
        return x


class Conv3d_InstanceNorm_Divide(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divide_by):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.instance_norm = nn.InstanceNorm3d(out_channels)
        self.divide_by = divide_by

    def forward(self, x):
        x = self.conv(x)
        x = self.instance_norm(x)
        x = x / self.divide_by
        return x


class Conv3d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.tanh = nn.Tanh()
        self.hard_swish = nn.Hardswish()

    def forward(self, x):
        x_conv = self.conv(x)
        x_norm = self.group_norm(x_conv)
        x_tanh = self.tanh(x_norm)
        x_hard_swish = self.hard_swish(x_tanh)
        x_res = x_conv + x_hard_swish
        x_logsumexp = torch.logsumexp(x_res, dim=1, keepdim=True)
        return x_logsumexp


class Conv3d_GELU_GlobalAvgPool(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.gelu(x)
        x = torch.nn.functional.adaptive_avg_pool3d(x, 1)
        x = x.squeeze(-1).squeeze(-1).squeeze(-1)
        return x


class Conv3d_BatchNorm_ReLU_Dropout_F(nn.Module):
    """the F.dropout(x, p, training=self.training) idiom, inplace ReLU module"""
    def __init__(self, in_channels, out_channels, kernel_size, dropout_p):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm3d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.dropout_p = dropout_p

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = self.relu(x)
        x = F.dropout(x, p=self.dropout_p, training=self.training)
        return x


class Conv3d_Dropout_Mean_Softmax(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dropout_p):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        x = self.conv(x)
        x = self.dropout(x)
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.softmax(x, dim=2)
        return x


class Conv3d_Subtract_Subtract_Mish_Sum(nn.Module):
    """subtract per-channel bias broadcast as (1, C, 1, 1, 1) after conv, a second subtract of
    a float, mish, then sum over channels"""
    def __init__(self, in_channels, out_channels, kernel_size, subtract_value_1, subtract_value_2):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=2, padding=1)
        self.sub = nn.Parameter(torch.randn(1, out_channels, 1, 1, 1))
        self.subtract_value_1 = subtract_value_1
        self.subtract_value_2 = subtract_value_2

    def forward(self, x):
        x = self.conv(x)
        x = x - self.sub
        x = x - self.subtract_value_1
        x = x - self.subtract_value_2
        x = torch.nn.functional.mish(x)
        x = torch.sum(x, dim=[2, 3, 4])
        return x


class ConvTranspose3d_GELU_GroupNorm_Dilated_Swish(nn.Module):
    """dilation, nn.SiLU module, GroupNorm(affine=False), a scalar Parameter multiply"""
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2,
                                                 padding=1, dilation=2)
        self.gelu = nn.GELU(approximate="tanh")
        self.gn = nn.GroupNorm(groups, out_channels, affine=False)
        self.silu = nn.SiLU()
        self.alpha = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.gelu(x)
        x = self.gn(x)
        x = self.silu(x)
        x = x * self.alpha
        return x


class Conv3d_Tanh_Scale_BiasAdd_Max(nn.Module):
    """conv with padding='same', then a broadcast bias from a python-side torch.randn buffer"""
    def __init__(self, in_channels, out_channels, kernel_size, scaling_factor, bias_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding="same")
        self.scaling_factor = scaling_factor
        self.register_buffer("bias", torch.randn(bias_shape))
        self.max_pool = nn.MaxPool3d(2)

    def forward(self, x):
        x = self.conv(x)
        x = torch.tanh(x)
        x = x * self.scaling_factor
        x = x + self.bias
        x = self.max_pool(x)
        return x


# name -> (class, init args, input shapes)
C1 = (COUT, 1, 1, 1)
MODELS = {
    "Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd": (Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd, (CIN, COUT, 3, C1)),
    "Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max": (Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max,
                                                         (CIN, COUT, 3, C1, -1.0, 1.0)),
    "ConvTranspose3d_Swish_GroupNorm_HardSwish": (ConvTranspose3d_Swish_GroupNorm_HardSwish, (CIN, COUT, 3, 2, 1, 4, 1e-5)),
    "Conv3d_HardSwish_GroupNorm_Mean": (Conv3d_HardSwish_GroupNorm_Mean, (CIN, COUT, 3)),
    "Conv3d_LeakyReLU_Sum_Clamp_GELU": (Conv3d_LeakyReLU_Sum_Clamp_GELU, (CIN, COUT, 3, C1)),
    "Conv3d_Scaling_Tanh_Multiply_Sigmoid": (Conv3d_Scaling_Tanh_Multiply_Sigmoid, (CIN, COUT, 3, 2, C1)),
    "ConvTranspose3d_Scaling_AvgPool_BiasAdd_Scaling": (ConvTranspose3d_Scaling_AvgPool_BiasAdd_Scaling,
                                                        (CIN, COUT, 3, 2, 1, 0.5, 1.0, C1)),
    "Conv3d_GroupNorm_Min_Clamp_Dropout": (Conv3d_GroupNorm_Min_Clamp_Dropout, (CIN, COUT, 3, 4, 0.0, 1.0, 0.2)),
    "Conv3d_Mish_Tanh": (Conv3d_Mish_Tanh, (CIN, COUT, 3)),
    "Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum": (Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum,
                                                    (CIN, COUT, 3, 2.0, (2, 2, 2), C1, 1)),
    "ConvTranspose3d_Add_HardSwish": (ConvTranspose3d_Add_HardSwish, (CIN, COUT, 3, 2, 1, 1, C1)),
    "ConvTranspose3d_BatchNorm_Subtract": (ConvTranspose3d_BatchNorm_Subtract, (CIN, COUT, 3, 2, 1)),
    "Conv3d_Softmax_MaxPool_MaxPool": (Conv3d_Softmax_MaxPool_MaxPool, (CIN, COUT, 3, 2)),
    "ConvTranspose3d_Clamp_Min_Divide": (ConvTranspose3d_Clamp_Min_Divide, (CIN, COUT, 3, 2, 1, -1.0, 2.0)),
    "ConvTranspose3d_LayerNorm_GELU_Scaling": (ConvTranspose3d_LayerNorm_GELU_Scaling,
                                               (CIN, COUT, 4, 2, 1, True, 1e-5, 1.0)),  # W out = 16
    "Conv3d_Min_Softmax": (Conv3d_Min_Softmax, (CIN, COUT, 3, 2)),
    "ConvTranspose3d_BatchNorm_AvgPool_AvgPool": (ConvTranspose3d_BatchNorm_AvgPool_AvgPool, (CIN, COUT, 3, 2, 1, C1)),
    "Conv3d_GroupNorm_Mean": (Conv3d_GroupNorm_Mean, (CIN, COUT, 3, 4)),
    "Conv3d_Max_LogSumExp_ReLU": (Conv3d_Max_LogSumExp_ReLU, (CIN, COUT, 3, 1, 1)),
    "ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU": (ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU,
                                                   (CIN, COUT, 3, 2, 1, 1, 1.0, (COUT,), (2, 2, 2))),
    "ConvTranspose3d_Multiply_Max_GlobalAvgPool_Clamp": (ConvTranspose3d_Multiply_Max_GlobalAvgPool_Clamp,
                                                         (CIN, COUT, 3, 2, 1, 0.5, 2)),
    "ConvTranspose3d_Mean_Add_Softmax_Tanh_Scaling": (ConvTranspose3d_Mean_Add_Softmax_Tanh_Scaling,
                                                      (CIN, COUT, 3, 1, 1, (1, 1, 1, 1), 2.0)),
    "ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool": (ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool, (CIN, COUT, 3, 2.0)),
    "ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd": (ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd,
                                                             (CIN, COUT, 3, 2, 1, 1, C1)),
    "ConvTranspose3d_Max_Max_Sum": (ConvTranspose3d_Max_Max_Sum, (CIN, COUT, 3, 2, 1)),
    "ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max": (ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max,
                                                         (CIN, COUT, 3, 2, 1, 1, C1)),
    "ConvTranspose3d_Softmax_Sigmoid": (ConvTranspose3d_Softmax_Sigmoid, (CIN, COUT, 3, 2, 1, 1)),
    "ConvTranspose3d_ReLU_GroupNorm": (ConvTranspose3d_ReLU_GroupNorm, (CIN, COUT, 3, 4)),
    "ConvTranspose3d_AvgPool_Clamp_Softmax_Multiply": (ConvTranspose3d_AvgPool_Clamp_Softmax_Multiply,
                                                       (CIN, COUT, 3, 2, 1, 1, 2, 0.0, 1.0)),
    "ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max": (ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max,
                                                           (CIN, COUT, 3, 2, 1, 1, 2, 2, 0)),
    "ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp_Max": (ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp_Max,
                                                               (CIN, COUT, 3, 2, 1, (1, 1, 1, 1))),
    "Conv3d_HardSwish_ReLU_Softmax_Mean": (Conv3d_HardSwish_ReLU_Softmax_Mean, (CIN, COUT, 3)),
    "Conv3d_InstanceNorm_Divide": (Conv3d_InstanceNorm_Divide, (CIN, COUT, 3, 2.0)),
    "Conv3d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp": (Conv3d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp,
                                                              (CIN, COUT, 3, 4)),
    "Conv3d_GELU_GlobalAvgPool": (Conv3d_GELU_GlobalAvgPool, (CIN, COUT, 3)),
    "Conv3d_BatchNorm_ReLU_Dropout_F": (Conv3d_BatchNorm_ReLU_Dropout_F, (CIN, COUT, 3, 0.3)),
    "Conv3d_Dropout_Mean_Softmax": (Conv3d_Dropout_Mean_Softmax, (CIN, COUT, 3, 0.2)),
    "Conv3d_Subtract_Subtract_Mish_Sum": (Conv3d_Subtract_Subtract_Mish_Sum, (CIN, COUT, 3, 0.5, 0.2)),
    "ConvTranspose3d_GELU_GroupNorm_Dilated_Swish": (ConvTranspose3d_GELU_GroupNorm_Dilated_Swish, (CIN, COUT, 3, 4)),
    "Conv3d_Tanh_Scale_BiasAdd_Max": (Conv3d_Tanh_Scale_BiasAdd_Max, (CIN, COUT, 3, 2.0, C1)),
}


def inputs_for(name):
    if name == "ConvTranspose3d_Add_HardSwish":
        # convT k3 s2 p1 op1: 8 -> 16
        return [(B, CIN, S, S, S), (B, COUT, 2 * S, 2 * S, 2 * S)]
    if name == "ConvTranspose3d_LayerNorm_GELU_Scaling":
        # convT k4 s2 p1: 4 -> 8 (= out_channels), so LayerNorm(out_channels) fits the last dim
        return [(B, CIN, 4, 4, 4)]
    if name == "ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU":
        # convT k3 s2 p1 op1: 4 -> 8 = out_channels
        return [(B, CIN, 4, 4, 4)]
    return [(B, CIN, S, S, S)]

# ------------------------------------------------------------------------------------------------
# Extra probes (not KernelBench names): idioms users bring, aimed at the recognizer's edges.
class X_MeanDims23(nn.Module):
    """mean over [3,4] only: no fusejit mean (the chain stops before it)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return x.mean(dim=[3, 4])


class X_ConsecutiveMeans(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = torch.tanh(self.conv(x))
        return x.mean(-1).mean(-1, keepdim=True).mean(2)


class X_FoldEverything(nn.Module):
    """conv(bias=False), / P, + P, rsub P - x, GroupNorm(affine=False), * P, + P"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3, bias=False)
        self.scale = nn.Parameter(torch.rand(COUT, 1, 1, 1) + 0.5)
        self.shift = nn.Parameter(torch.randn(1, COUT, 1, 1, 1))
        self.p = nn.Parameter(torch.randn(COUT, 1, 1, 1))
        self.gn = nn.GroupNorm(4, COUT, affine=False)
        self.gamma = nn.Parameter(torch.randn(COUT, 1, 1, 1))
        self.beta = nn.Parameter(torch.randn(()))

    def forward(self, x):
        x = self.conv(x)
        x = x / self.scale
        x = x + self.shift
        x = self.p - x
        x = self.gn(x)
        x = x * self.gamma
        x = x + self.beta
        return F.silu(x)


class X_GroupNorm_BatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.gn = nn.GroupNorm(2, COUT)
        self.bn = nn.BatchNorm3d(COUT)

    def forward(self, x):
        return torch.relu(self.bn(self.gn(self.conv(x))))


class X_InstanceNormRunning(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.inorm = nn.InstanceNorm3d(COUT, affine=True, track_running_stats=True)

    def forward(self, x):
        return F.gelu(self.inorm(self.conv(x)))


class X_BatchNormNoAffineMomentumNone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3, bias=False)
        self.bn = nn.BatchNorm3d(COUT, affine=False, momentum=None)

    def forward(self, x):
        return F.elu(self.bn(self.conv(x)), alpha=0.5)


class X_ClampHardswish(nn.Module):
    """hardswish written with torch.clamp: gradients at +-3 differ (training_fallback)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = self.conv(x)
        return x * torch.clamp(x + 3, 0, 6) / 6


class X_InPlaceMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.scale = nn.Parameter(torch.randn(COUT, 1, 1, 1))

    def forward(self, x):
        x = self.conv(x)
        x *= self.scale
        x += 1.0
        x.clamp_(max=2.0)
        x.relu_()
        return x


class X_InPlaceResidual(nn.Module):
    """an in-place ReLU module whose input is read again: eager gives 2 * relu(y)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.conv(x)
        z = self.relu(y)
        return y + z


class X_InPlaceDiscardedThenReuse(nn.Module):
    """an in-place op with its result discarded, then the mutated value used twice"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.act = nn.LeakyReLU(0.1, inplace=True)

    def forward(self, x):
        y = self.conv(x)
        self.act(y)
        return y * torch.sigmoid(y)


class X_TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(CIN, COUT, 3, padding=1)
        self.bn1 = nn.BatchNorm3d(COUT)
        self.pool = nn.MaxPool3d(2)
        self.conv2 = nn.Conv3d(COUT, COUT, 3, padding=1)
        self.gn2 = nn.GroupNorm(4, COUT)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.drop(F.silu(self.gn2(self.conv2(x))))
        return x.mean(dim=[2, 3, 4])


class X_ResidualInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(COUT, COUT, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x


class X_SequentialBody(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(CIN, COUT, 3), nn.BatchNorm3d(COUT), nn.ReLU(inplace=True),
                                 nn.Dropout3d(0.2))

    def forward(self, x):
        return self.net(x)


class X_FDropoutDefaultTraining(nn.Module):
    """F.dropout(x, 0.2): training=True by default, drops in eval mode too"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = F.dropout(x, 0.2)
        return torch.sigmoid(x)


class X_ManyActivationsA(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, (3, 1, 3), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2))
        self.sp = nn.Softplus(beta=2, threshold=10)

    def forward(self, x):
        x = self.conv(x)
        x = self.sp(x)
        x = F.elu(x, alpha=0.5)
        x = F.selu(x)
        x = F.hardtanh(x, -0.5, 0.5)
        x = F.relu6(x * 8)
        x = F.celu(x, alpha=1.5)
        return x


class X_ManyActivationsB(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(CIN, COUT, 2, stride=2)

    def forward(self, x):
        x = self.conv(x)
        x = F.logsigmoid(x)
        x = F.softsign(x)
        x = F.tanhshrink(x * 3)
        x = F.hardsigmoid(-x)
        x = F.gelu(x, approximate="tanh")
        x = F.leaky_relu(x - 0.5, 0.1, True)
        return x


class X_SameEvenKernel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 4, padding="same")

    def forward(self, x):
        return torch.relu(self.conv(x))


class X_GroupedConvT(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(4, COUT, 3, groups=2)

    def forward(self, x):
        return torch.relu(self.conv(x))


class X_ReflectPad(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3, padding=1, padding_mode="reflect")

    def forward(self, x):
        return torch.relu(self.conv(x))


class X_BiasC11(nn.Module):
    """a bias of shape (C,1,1): broadcasts along D (not per channel) -- must not fold"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(S, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)


class X_PlainTensorAttr(nn.Module):
    """a plain tensor attribute (not a Parameter or buffer)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.scale = torch.randn(COUT, 1, 1, 1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return x * self.scale


class X_ViewAfterMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.fc = nn.Linear(COUT, 4)

    def forward(self, x):
        x = F.hardswish(self.conv(x))
        x = torch.mean(x, dim=[2, 3, 4], keepdim=True)
        x = x.view(x.size(0), -1)
        return self.fc(x)


class X_TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = self.conv(x)
        if self.training:
            x = x * 0.5
        return torch.tanh(x)


class X_TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return x, x.mean()


class X_FunctionalInstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = self.conv(x)
        x = F.instance_norm(x)
        return torch.relu(x)


class X_WhereLeaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = self.conv(x)
        return torch.where(x > 0, x, x * 0.1)


class X_FrozenBNTrain(nn.Module):
    """fine-tuning idiom: model.train() but the batch norm kept in eval (its train() keeps it)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.bn = nn.BatchNorm3d(COUT)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))

    def train(self, mode=True):
        super().train(mode)
        self.bn.eval()
        return self


class X_FrozenConvWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.conv.weight.requires_grad_(False)
        self.gn = nn.GroupNorm(4, COUT)

    def forward(self, x):
        return torch.relu(self.gn(self.conv(x)))


class X_RsubConst(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = torch.sigmoid(self.conv(x))
        x = 1 - x
        return torch.tanh(x)


class X_MinTensorAfterConv(nn.Module):
    """torch.min(x, torch.tensor(v)) / torch.max(x, torch.tensor(v)): elementwise clamps"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)

    def forward(self, x):
        x = self.conv(x)
        x = torch.max(x, torch.tensor(-0.5))
        x = torch.min(x, torch.tensor(0.5))
        return F.gelu(x)


class X_SumDims234(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.gn = nn.GroupNorm(4, COUT)

    def forward(self, x):
        x = F.mish(self.gn(self.conv(x)))
        return torch.sum(x, dim=[2, 3, 4])


class X_SumConvTKept(nn.Module):
    """a sum after a strided transposed convolution: the count is its output's D*H*W"""
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(CIN, COUT, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).sum(dim=(-3, -2, -1), keepdim=True)


class X_SumMixedWithMeans(nn.Module):
    """means and sums mixed: the count is the summed axes' sizes only"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3, stride=(1, 2, 1), padding=(2, 1, 0), dilation=(2, 1, 1))
        self.gn = nn.GroupNorm(2, COUT)

    def forward(self, x):
        x = torch.tanh(self.gn(self.conv(x)))
        return x.mean(dim=[3, 4]).sum(2).sum(1, keepdim=True)


class X_ScaleThenBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.bn = nn.BatchNorm3d(COUT)

    def forward(self, x):
        x = self.conv(x) / 2.0
        return torch.relu(self.bn(x))


class X_DropoutModuleMidChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.gn = nn.GroupNorm(4, COUT)
        self.dropout = nn.Dropout(0.3)

    def forward(self, x):
        x = self.dropout(torch.relu(self.conv(x)))
        return torch.tanh(self.gn(x)).mean(dim=[2, 3, 4])


class X_DoubleModel(nn.Module):
    """run in float64 by the tests (FLOAT64_MODELS)"""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(CIN, COUT, 3)
        self.gn = nn.GroupNorm(4, COUT)

    def forward(self, x):
        return F.silu(self.gn(self.conv(x)))


EXTRA = {
    "X_MeanDims23": (X_MeanDims23, ()),
    "X_ConsecutiveMeans": (X_ConsecutiveMeans, ()),
    "X_FoldEverything": (X_FoldEverything, ()),
    "X_GroupNorm_BatchNorm": (X_GroupNorm_BatchNorm, ()),
    "X_InstanceNormRunning": (X_InstanceNormRunning, ()),
    "X_BatchNormNoAffineMomentumNone": (X_BatchNormNoAffineMomentumNone, ()),
    "X_ClampHardswish": (X_ClampHardswish, ()),
    "X_InPlaceMix": (X_InPlaceMix, ()),
    "X_InPlaceResidual": (X_InPlaceResidual, ()),
    "X_InPlaceDiscardedThenReuse": (X_InPlaceDiscardedThenReuse, ()),
    "X_TwoBlocks": (X_TwoBlocks, ()),
    "X_ResidualInput": (X_ResidualInput, ()),
    "X_SequentialBody": (X_SequentialBody, ()),
    "X_FDropoutDefaultTraining": (X_FDropoutDefaultTraining, ()),
    "X_ManyActivationsA": (X_ManyActivationsA, ()),
    "X_ManyActivationsB": (X_ManyActivationsB, ()),
    "X_SameEvenKernel": (X_SameEvenKernel, ()),
    "X_GroupedConvT": (X_GroupedConvT, ()),
    "X_ReflectPad": (X_ReflectPad, ()),
    "X_BiasC11": (X_BiasC11, ()),
    "X_PlainTensorAttr": (X_PlainTensorAttr, ()),
    "X_ViewAfterMean": (X_ViewAfterMean, ()),
    "X_TrainingBranch": (X_TrainingBranch, ()),
    "X_TupleOut": (X_TupleOut, ()),
    "X_FunctionalInstanceNorm": (X_FunctionalInstanceNorm, ()),
    "X_WhereLeaky": (X_WhereLeaky, ()),
    "X_FrozenBNTrain": (X_FrozenBNTrain, ()),
    "X_FrozenConvWeight": (X_FrozenConvWeight, ()),
    "X_RsubConst": (X_RsubConst, ()),
    "X_MinTensorAfterConv": (X_MinTensorAfterConv, ()),
    "X_SumDims234": (X_SumDims234, ()),
    "X_SumConvTKept": (X_SumConvTKept, ()),
    "X_SumMixedWithMeans": (X_SumMixedWithMeans, ()),
    "X_ScaleThenBN": (X_ScaleThenBN, ()),
    "X_DropoutModuleMidChain": (X_DropoutModuleMidChain, ()),
    "X_DoubleModel": (X_DoubleModel, ()),
}
MODELS.update(EXTRA)
MODELS.update(kb_more_models.NEW_MODELS)
MODELS.update(kb_more_models.MORE_MODELS)
_kb_inputs_for = inputs_for  # (the KernelBench models' shapes)


def inputs_for(name):
    more = kb_more_models.new_inputs_for(name)
    if more is not None:
        return more
    if name == "X_ResidualInput":
        return [(B, COUT, S, S, S)]
    if name == "X_GroupedConvT":
        return [(B, 4, S, S, S)]
    return _kb_inputs_for(name)


FLOAT64_MODELS = {"X_DoubleModel"}  # the tests run these in float64
# F.dropout(x, p) without training= draws masks in eval mode too: no two calls agree
RANDOM_IN_EVAL = {"X_FDropoutDefaultTraining"}
# Models whose original forward fails on CUDA as written (a plain CPU tensor attribute, which
# .cuda() does not move): the drop-in runs the original, which raises its own error
FAILS_ON_CUDA = {"X_PlainTensorAttr"}


def _folded_factors(fast) -> set:
    """The model paths of the factors folded into chain parameters, in any of the fused module's
    states (its chain, the training-mode one, the chains in the rest)."""
    st = fast.__dict__.get("_fusejit")
    states, out = [st], set()
    while states:
        s = states.pop()
        if s is None:
            continue
        out.update(step[1] for f in s.folds.values() for step in f.steps if step[1] is not None)
        states += [getattr(s, "training_state", None)] + list(getattr(s, "sub_states", []))
    return out


def has_dropout(model) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / (b.norm() + 1e-300))


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for e in v for t in _tensors(e)]
    return []


def check(fj, name, mode, device):
    """Model `name` through the drop-in `fj` (fusejit.torch), policy fused, on `device` (the GPU
    tests: "cuda"; the CPU tests, where the chains run as PyTorch's evaluation: "cpu"). eval --
    output against float64 (at most 1e-5 or 4x strict fp32 PyTorch's error), two calls bitwise
    equal where fusejit ran; train -- every gradient
    against float64 (NaN-poisoned: written; at most 1e-5 of its norm floored at 1e-3 of the
    largest, or 4x PyTorch's error; one that is 0 in float64 -- a convolution bias before an
    instance norm -- at most 1e-6 of the largest gradient's norm: rounding, fusejit's up to 8x
    PyTorch's there), the buffers as PyTorch leaves them. Models with dropout in training mode: run and written, not compared
    (PyTorch draws their masks)."""
    cls, args = MODELS[name]
    torch.manual_seed(0)
    dtype = torch.float64 if name in FLOAT64_MODELS else torch.float32
    model = getattr(randomize(cls(*args), 1).to(device=device, dtype=dtype), mode)()
    ins = [torch.randn(*s, device=device, dtype=dtype) for s in inputs_for(name)]
    ref, eager = copy.deepcopy(model).double(), copy.deepcopy(model)
    fast = fj.fuse(model, policy="fused")
    if name in FAILS_ON_CUDA and device != "cpu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                fast(*ins)
            except RuntimeError as e:
                assert "same device" in str(e), e
                return
        raise AssertionError("the original forward ran on CUDA")
    fused = fast.__dict__["_fusejit"].unsupported is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (models past the grammar's reach warn)
        if mode == "eval":
            with torch.no_grad():
                y1, y2 = _tensors(fast(*ins)), _tensors(fast(*ins))
                want = _tensors(ref(*[i.double() for i in ins]))
                base = _tensors(eager(*ins))
            assert not any(torch.isnan(y).any() for y in y1)
            if name in RANDOM_IN_EVAL:
                return
            assert not fused or all(torch.equal(a, b) for a, b in zip(y1, y2))
            for a, b, e in zip(y1, want, base):
                assert rel_err(a, b) <= max(1e-5, 4 * rel_err(e, b)), (rel_err(a, b), rel_err(e, b))
            return
        xs = [i.clone().requires_grad_(True) for i in ins]
        ys = _tensors(fast(*xs))
        gs = [torch.randn_like(y) for y in ys]
        sum((y * g).sum() for y, g in zip(ys, gs)).backward()
        got = [x.grad for x in xs] + [p.grad for p in model.parameters()]
        assert not any(t is not None and torch.isnan(t).any() for t in ys + got)
        if has_dropout(model):
            return
        xd = [i.detach().double().requires_grad_(True) for i in ins]
        sum((y * g.double()).sum() for y, g in zip(_tensors(ref(*xd)), gs)).backward()
        xe = [i.detach().clone().requires_grad_(True) for i in ins]
        sum((y * g).sum() for y, g in zip(_tensors(eager(*xe)), gs)).backward()
    wants = [x.grad for x in xd] + [p.grad for p in ref.parameters()]
    eagers = [x.grad for x in xe] + [p.grad for p in eager.parameters()]
    scale = max(float(b.norm()) for b in wants if b is not None)
    names = ["x%d" % i for i in range(len(xs))] + [n for n, _ in model.named_parameters()]
    folded = _folded_factors(fast)
    for n, a, b, e in zip(names, got, wants, eagers):
        assert (a is None) == (b is None), n
        if b is None:
            continue
        err, eager_err = float((a.double() - b).norm()), float((e.double() - b).norm())
        if float(b.norm()) <= 1e-9 * scale:  # 0 in float64 (a bias before a norm): rounding only
            assert err <= 1e-6 * scale, (n, err, eager_err, scale)
            continue
        # A factor folded into a weight gets its gradient from the chain's weight gradient,
        # contracted with the weight: where that cancels (a per-channel scale before a
        # training-mode batch norm, which undoes it but for eps) its error is the weight
        # gradient's rounding, up to 1e-6 of the largest gradient, not a fraction of its own.
        if n in folded and err <= 1e-6 * scale:
            continue
        assert err <= max(1e-5 * max(float(b.norm()), 1e-3 * scale), 4 * eager_err), \
            (n, err, eager_err)
    for (n, a), b in zip(model.named_buffers(), eager.buffers()):
        assert not a.is_floating_point() or rel_err(a, b) <= 1e-5, n
