// templates/tc_moments.cuh: the reductions after the tensor-core convolution (tc_conv.cuh):
// per-tile channel moments -> per-channel moments -> group statistics and means. Every merge is
// in a fixed order, in double, so runs are bitwise identical.
//
// ---- host-side contract -------------------------------------------------------------------
// T = kTiles (the GEMM's tiles per sample, template argument), G = Cfg::kGroups (0: no norm).
// gamma, beta and y are of the chain's element type ElemT<Cfg> (f32, bf16, f16; y rounded once
// from the fp32/double result); z, stats, rows are float/double workspaces.
//   tc_channel_merge_body<Cfg, T>(cpart, chm): grid ((kC + 7) / 8, kN), block 256.
//       cpart TcChannelMoments [kN][T][kC] -> chm TcChannelMoments [kN][kC], each channel's
//       tiles merged in tile order (Chan, double; lane-strided then a fixed shuffle tree).
//   tc_finalize_body<Cfg>(chm, gamma, beta, stats, y): grid kN, block 256, no dynamic smem
//       (static: 16 * G + 256 bytes).
//       G > 0: group g's channels merged in channel order -> mean, rstd (biased variance, as
//              PyTorch); stats (when not null) float2 [kN][G] = (mean, rstd).
//       y (when not null; the chain ends with mean and has no ops after group_norm):
//              per channel gamma_c (m_c - mu_g) rstd_g + beta_c (G > 0) or m_c (no norm);
//              kMeanSpatial: y [kN][kC]; kMeanAll: y [kN], the channel values summed in a
//              fixed tree order (double) / kC.
//   tc_row_mean_body<Cfg>(z, gamma, beta, stats, y, rows): grid kN*kC, block 256.
//       The mean over space of post(group_norm(z)) per (n, c): kMeanSpatial writes y [kN][kC];
//       kMeanAll writes rows double [kN][kC] for tc_mean_all_body.
//   tc_mean_all_body<Cfg>(rows, y): grid kN, block 256: y[n] = sum_c rows[n][c] / kC.
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_TC_MOMENTS_CUH_
#define FUSEJIT_TEMPLATES_TC_MOMENTS_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "tc_conv.cuh"

namespace fj {

__device__ __forceinline__ TcChannelMoments tc_merge(TcChannelMoments a, TcChannelMoments b) {
  const double n = a.count + b.count;
  if (b.count == 0) return a;
  if (a.count == 0) return b;
  const double delta = b.mean - a.mean, wb = b.count / n;
  TcChannelMoments r;
  r.count = n;
  r.mean = a.mean + delta * wb;
  r.m2 = a.m2 + b.m2 + delta * delta * a.count * wb;
  return r;
}

template <class Cfg, int kTiles>
__device__ __forceinline__ void tc_channel_merge_body(const TcChannelMoments* __restrict__ cpart,
                                                      TcChannelMoments* __restrict__ chm) {
  const int n = blockIdx.y, c = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (c >= Cfg::kC) return;  // whole warps only: no block-wide barrier below
  TcChannelMoments m = {0, 0, 0};
  const TcChannelMoments* p = cpart + (long long)n * kTiles * Cfg::kC + c;
  for (int t = lane; t < kTiles; t += 32) m = tc_merge(m, p[(long long)t * Cfg::kC]);
  for (int off = 16; off > 0; off >>= 1) {
    TcChannelMoments o;
    o.count = __shfl_down_sync(0xffffffffu, m.count, off);
    o.mean = __shfl_down_sync(0xffffffffu, m.mean, off);
    o.m2 = __shfl_down_sync(0xffffffffu, m.m2, off);
    m = tc_merge(m, o);
  }
  if (lane == 0) chm[(long long)n * Cfg::kC + c] = m;
}

template <class Cfg>
__device__ __forceinline__ void tc_finalize_body(const TcChannelMoments* __restrict__ chm,
                                                 const ElemT<Cfg>* __restrict__ gamma,
                                                 const ElemT<Cfg>* __restrict__ beta,
                                                 float* __restrict__ stats,
                                                 ElemT<Cfg>* __restrict__ y) {
  constexpr int G = Cfg::kGroups > 0 ? Cfg::kGroups : 1, C = Cfg::kC;
  using E = ElemT<Cfg>;
  __shared__ double s_mu[G], s_rstd[G];
  __shared__ double scratch[32];
  const int n = blockIdx.x;
  const TcChannelMoments* p = chm + (long long)n * C;
  if constexpr (Cfg::kGroups > 0) {
    constexpr int kCpg = C / G;
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
      TcChannelMoments m = {0, 0, 0};
      for (int c = g * kCpg; c < (g + 1) * kCpg; ++c) m = tc_merge(m, p[c]);
      const double var = m.count > 0 ? m.m2 / m.count : 0.0;
      const double rstd = 1.0 / sqrt(var + (double)Cfg::kEps);
      s_mu[g] = m.mean;
      s_rstd[g] = rstd;
      if (stats != nullptr) {
        stats[(n * G + g) * 2] = (float)m.mean;
        stats[(n * G + g) * 2 + 1] = (float)rstd;
      }
    }
    __syncthreads();
  }
  if (y == nullptr) return;
  double sum = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    double v = p[c].mean;
    if constexpr (Cfg::kGroups > 0) {
      const int g = c / (C / G);
      v = (double)to_f32(gamma[c]) * (v - s_mu[g]) * s_rstd[g] + (double)to_f32(beta[c]);
    }
    if (Cfg::kMean == kMeanSpatial) y[(long long)n * C + c] = store_as<E>((float)v);
    sum += v;
  }
  if (Cfg::kMean == kMeanAll) {
    sum = block_reduce_sum(sum, scratch);
    if (threadIdx.x == 0) y[n] = store_as<E>((float)(sum / C));
  }
}

template <class Cfg>
__device__ __forceinline__ void tc_row_mean_body(const float* __restrict__ z,
                                                 const ElemT<Cfg>* __restrict__ gamma,
                                                 const ElemT<Cfg>* __restrict__ beta,
                                                 const float* __restrict__ stats,
                                                 ElemT<Cfg>* __restrict__ y,
                                                 double* __restrict__ rows) {
  constexpr int S = Cfg::kD * Cfg::kH * Cfg::kW, G = Cfg::kGroups > 0 ? Cfg::kGroups : 1;
  __shared__ double scratch[32];
  const int row = blockIdx.x, c = row % Cfg::kC, n = row / Cfg::kC;
  const int seg = n * G + c / (Cfg::kC / G);
  const float sc = stats[seg * 2 + 1] * to_f32(gamma[c]);
  const float sh = to_f32(beta[c]) - stats[seg * 2] * sc;
  const float* zr = z + (long long)row * S;
  double sum = 0;
  for (int i = threadIdx.x; i < S; i += blockDim.x) sum += (double)Cfg::post(fmaf(zr[i], sc, sh));
  sum = block_reduce_sum(sum, scratch);
  if (threadIdx.x == 0) {
    if (Cfg::kMean == kMeanSpatial) {
      y[row] = store_as<ElemT<Cfg>>((float)(sum / S));
    } else {
      rows[row] = sum / S;
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void tc_mean_all_body(const double* __restrict__ rows,
                                                 ElemT<Cfg>* __restrict__ y) {
  __shared__ double scratch[32];
  const int n = blockIdx.x;
  double sum = 0;
  for (int c = threadIdx.x; c < Cfg::kC; c += blockDim.x) sum += rows[(long long)n * Cfg::kC + c];
  sum = block_reduce_sum(sum, scratch);
  if (threadIdx.x == 0) y[n] = store_as<ElemT<Cfg>>((float)(sum / Cfg::kC));
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the kernels with the default configuration.
extern "C" __global__ void __launch_bounds__(256)
    tc_channel_merge_selftest(const fj::TcChannelMoments* cpart, fj::TcChannelMoments* chm) {
  fj::tc_channel_merge_body<fj::DefaultConfig, 5>(cpart, chm);
}
extern "C" __global__ void __launch_bounds__(256)
    tc_finalize_selftest(const fj::TcChannelMoments* chm, const float* gamma, const float* beta,
                         float* stats, float* y) {
  fj::tc_finalize_body<fj::DefaultConfig>(chm, gamma, beta, stats, y);
}
extern "C" __global__ void __launch_bounds__(256)
    tc_row_mean_selftest(const float* z, const float* gamma, const float* beta,
                         const float* stats, float* y, double* rows) {
  fj::tc_row_mean_body<fj::DefaultConfig>(z, gamma, beta, stats, y, rows);
}
extern "C" __global__ void __launch_bounds__(256) tc_mean_all_selftest(const double* rows,
                                                                       float* y) {
  fj::tc_mean_all_body<fj::DefaultConfig>(rows, y);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_TC_MOMENTS_CUH_
