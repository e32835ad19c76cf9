// templates/tap_gemm.cuh: the two small kernels of a convolution computed as a dense GEMM per tap
// and a gather (runtime/tap_gemm.h): for few output channels and many input channels, where an
// implicit GEMM re-reads every input value once per tap and output tile.
//
//   Z[n][c*T + t][i] = sum_ci x[n][ci][i] * W'[c*T + t][ci]      (a 1x1x1 convolution: tc-conv)
//   y[n][c][o]       = bias[c] + sum_t Z[n][c*T + t][in(o, t)]   (tap_gather_kernel)
//
// T = kKD * kKH * kKW taps, t = (kd * kKH + kh) * kKW + kw (the weight's own order). Per dimension
// the input position a tap reads for output o:
//   conv3d:           i = o * stride - padding + k * dilation            (0 <= i < size)
//   conv_transpose3d: i * stride = o + padding - k * dilation            (divisible, 0 <= i < size)
//
//   tap_weight_kernel: W' [C*T][Cin] from the chain's weight, [C][Cin][T] (conv3d) or [Cin][C][T]
//     (conv_transpose3d).
//   tap_gather_kernel: one thread an output value; its taps summed in t order (deterministic), the
//     bias added last, as the implicit GEMM adds it.
//
// Host-side contract: block = (kTapThreads); grid.x = any (grid-stride loops); every element of the
// output is written; Z holds N * C * T * kD * kH * kW floats (fewer than 2^31).
#ifndef FUSEJIT_TEMPLATES_TAP_GEMM_CUH_
#define FUSEJIT_TEMPLATES_TAP_GEMM_CUH_

namespace fj {

constexpr int kTapThreads = 256;

template <int kC, int kCin, int kT, bool kTransposed>
__device__ void tap_weight_kernel(const float* __restrict__ w, float* __restrict__ wt) {
  constexpr int kCount = kC * kT * kCin;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kCount; i += gridDim.x * blockDim.x) {
    const int ci = i % kCin, t = i / kCin % kT, c = i / (kCin * kT);
    wt[i] = kTransposed ? w[(ci * kC + c) * kT + t] : w[(c * kCin + ci) * kT + t];
  }
}

// Geometry: the chain's convolution (kS* stride, kP* padding, kL* dilation) from an input
// [kD][kH][kW] to an output [kOD][kOH][kOW], kRows = N * C output volumes.
template <bool kTransposed, long long kRows, int kC, int kD, int kH, int kW, int kOD, int kOH,
          int kOW, int kKD, int kKH, int kKW, int kSD, int kSH, int kSW, int kPD, int kPH, int kPW,
          int kLD, int kLH, int kLW, bool kBias>
__device__ void tap_gather_kernel(const float* __restrict__ z, const float* __restrict__ bias,
                                  float* __restrict__ y) {
  constexpr int kT = kKD * kKH * kKW;
  constexpr long long kCount = kRows * kOD * kOH * kOW;
  constexpr long long kPlane = (long long)kD * kH * kW;
  // The input position of output o and tap k along one dimension, or -1 when there is none.
  auto in_pos = [](int o, int k, int s, int p, int l, int size) {
    int i;
    if (kTransposed) {
      const int num = o + p - k * l;
      if (num < 0 || num % s != 0) return -1;
      i = num / s;
    } else {
      i = o * s - p + k * l;
    }
    return (i >= 0 && i < size) ? i : -1;
  };
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < kCount; e += stride) {
    const int ow = (int)(e % kOW), oh = (int)(e / kOW % kOH),
              od = (int)(e / ((long long)kOW * kOH) % kOD);
    const long long row = e / ((long long)kOW * kOH * kOD);  // n * kC + c
    const int c = (int)(row % kC);
    const float* zrow = z + row * kT * kPlane;  // Z[n][c*T][...]
    float acc = 0.f;
#pragma unroll 1
    for (int kd = 0; kd < kKD; ++kd) {
      const int id = in_pos(od, kd, kSD, kPD, kLD, kD);
      if (id < 0) continue;
#pragma unroll 1
      for (int kh = 0; kh < kKH; ++kh) {
        const int ih = in_pos(oh, kh, kSH, kPH, kLH, kH);
        if (ih < 0) continue;
        const float* zt = zrow + (long long)((kd * kKH + kh) * kKW) * kPlane + (id * kH + ih) * kW;
#pragma unroll
        for (int kw = 0; kw < kKW; ++kw) {
          const int iw = in_pos(ow, kw, kSW, kPW, kLW, kW);
          if (iw >= 0) acc += zt[kw * kPlane + iw];
        }
      }
    }
    if (kBias) acc += bias[c];
    y[e] = acc;
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): both weight orders, a strided conv3d and a transposed gather.
namespace fj_selftest {
extern "C" __global__ void tap_weight_conv(const float* w, float* wt) {
  fj::tap_weight_kernel<4, 24, 27, false>(w, wt);
}
extern "C" __global__ void tap_weight_convt(const float* w, float* wt) {
  fj::tap_weight_kernel<4, 24, 8, true>(w, wt);
}
extern "C" __global__ void tap_gather_conv(const float* z, const float* b, float* y) {
  fj::tap_gather_kernel<false, 8, 4, 9, 10, 11, 5, 3, 6, 3, 3, 3, 2, 2, 2, 1, 0, 1, 1, 2, 1, true>(
      z, b, y);
}
extern "C" __global__ void tap_gather_convt(const float* z, const float* b, float* y) {
  fj::tap_gather_kernel<true, 8, 4, 5, 6, 7, 10, 12, 14, 2, 2, 2, 2, 2, 2, 0, 0, 0, 1, 1, 1, false>(
      z, b, y);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_TAP_GEMM_CUH_
