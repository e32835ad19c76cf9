// templates/moments_mean.cuh: finalize for "... | group_norm | mean" chains whose producer kernel
// wrote per-block per-channel moments of the pre-norm values (direct_conv_moments.cuh, or
// channel_moments_body below for chains without a convolution).
//
// Kernel: moments_mean_finalize<Cfg, Tune>(partials, gamma, beta, y)  (partials' type deduced)
//   One warp per sample n. Lane l merges, for channels c = l, l + 32, ..., the kBlocksPerSample
//   partials of channel c in block order (Chan, fixed order, in double) -> (count, m_c, M2_c);
//   lanes l, l + 32, ... merge the channels of group g = l in channel order -> (mu_g,
//   var_g = M2_g / count_g, biased as PyTorch), rstd_g.
//   Mean over the spatial dims of the affine group_norm output of channel c:
//     gamma_c * (m_c - mu_g) * rstd_g + beta_c        (exact identity: mean is linear)
//   Cfg::post (the ops after group_norm) must be the identity: a mean of a non-linear function of
//   the normalized values is not available from moments (the plan must not pick this kernel then).
//   kMean == kMeanSpatial writes y[n*C + c]; kMeanAll writes y[n] = (sum_c in order) / C.
//
// Host-side contract:
//   grid = dim3(Cfg::kN), block = dim3(32), no dynamic smem.
//   reads : partials [N][Tune::kBlocksPerSample][C] fj::MomentsD or fj::Moments (written by the
//           producer kernel, e.g. conv_moments<Cfg,Tune>, just before on the same stream);
//           gamma [C], beta [C] (group_norm weight, bias).
//   writes: y [N, C] (kMeanSpatial) or [N] (kMeanAll), every element.
// Requirements (static_assert): kGroups > 0, kC % kGroups == 0, kC <= 256 (shared arrays of
// doubles), kMean != kNoMean.
#ifndef FUSEJIT_TEMPLATES_MOMENTS_MEAN_CUH_
#define FUSEJIT_TEMPLATES_MOMENTS_MEAN_CUH_

#include "common.cuh"
#include "default_config.cuh"  // enums (kConv3d, kMeanAll, ...); include-guarded
#include "moments_util.cuh"

namespace fj {

// fj::MomentsD (common.cuh): one channel's moments of a block, in double (direct_conv_moments.cuh
// writes these: the finalize subtracts channel means that nearly cancel, m_c - mu_g, so a float
// mean rounded per block would show in the result).

// P: fj::Moments (float fields) or fj::MomentsD, deduced from `partials`.
template <class Cfg, class Tune, class P>
__device__ __forceinline__ void moments_mean_finalize(const P* __restrict__ partials,
                                                      const ElemT<Cfg>* __restrict__ gamma,
                                                      const ElemT<Cfg>* __restrict__ beta,
                                                      ElemT<Cfg>* __restrict__ y) {
  static_assert(Cfg::kGroups > 0 && Cfg::kC % Cfg::kGroups == 0, "moments_mean_finalize: needs group_norm");
  static_assert(Cfg::kC <= 256, "moments_mean_finalize: kC <= 256 (shared arrays of doubles, 4 per channel)");
  static_assert(Cfg::kMean == kMeanSpatial || Cfg::kMean == kMeanAll,
                "moments_mean_finalize: the chain must end with mean");
  constexpr int C = Cfg::kC, G = Cfg::kGroups, CPG = C / G, B = Tune::kBlocksPerSample;
  // The merges and the final combination run in double: the result is a mean of values that
  // nearly cancel within each group (m_c - mu_g), so fp32 rounding here would show in it.
  __shared__ double s_n[C], s_m[C], s_q[C], s_mu[G], s_rstd[G], s_out[C];
  const int n = blockIdx.x, lane = threadIdx.x;
  for (int c = lane; c < C; c += 32) {
    double cn, cm, cq;
    merge_block_moments(partials + (size_t)n * B * C + c, C, B, cn, cm, cq);
    s_n[c] = cn;
    s_m[c] = cm;
    s_q[c] = cq;
  }
  __syncwarp();
  for (int g = lane; g < G; g += 32) {
    double gn = 0, gm = 0, gq = 0;
    for (int k = 0; k < CPG; ++k) {
      const int c = g * CPG + k;
      const double total = gn + s_n[c];
      const double wb = total > 0 ? s_n[c] / total : 0;
      const double delta = s_m[c] - gm;
      gm += delta * wb;
      gq += s_q[c] + delta * delta * gn * wb;
      gn = total;
    }
    s_mu[g] = gm;
    s_rstd[g] = 1.0 / sqrt(gq / gn + (double)Cfg::kEps);
  }
  __syncwarp();
  for (int c = lane; c < C; c += 32) {
    const int g = c / CPG;
    const double v = (double)to_f32(gamma[c]) * ((s_m[c] - s_mu[g]) * s_rstd[g]) + to_f32(beta[c]);
    if constexpr (Cfg::kMean == kMeanSpatial) y[(size_t)n * C + c] = from_f32<ElemT<Cfg>>((float)v);
    else s_out[c] = v;
  }
  if constexpr (Cfg::kMean == kMeanAll) {
    __syncwarp();
    if (lane == 0) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += s_out[c];
      y[n] = from_f32<ElemT<Cfg>>((float)(s / C));
    }
  }
}

// The partials' producer for chains without a convolution ("... | group_norm | mean", strategy
// channel-moments-mean): block (b, c, n) reduces the moments of pre(x[n][c][s]) over its chunk of
// spatial points, s in [b*K, min(S, (b+1)*K)) with K = ceil(S / kBlocksPerSample), in double
// (each thread a strided share as sums shifted by its first value, merged in a fixed order) into
// partials[(n*B + b)*C + c] -- the
// layout moments_mean_finalize reads. x is read once.
// grid (Tune::kBlocksPerSample, kC, kN), block Tune::kThreads (a multiple of 32, <= 1024).
template <class Cfg, class Tune>
__device__ __forceinline__ void channel_moments_body(const ElemT<Cfg>* __restrict__ x,
                                                     MomentsD* __restrict__ partials) {
  static_assert(Cfg::kProducer == kNoProducer, "channel_moments_body: chains without a producer");
  static_assert(Tune::kThreads % 32 == 0 && Tune::kThreads <= 1024, "channel_moments: threads");
  constexpr long long S = (long long)Cfg::kD * Cfg::kH * Cfg::kW;
  constexpr int B = Tune::kBlocksPerSample;
  constexpr long long K = (S + B - 1) / B;
  __shared__ MomentsD scratch[32];
  const int b = blockIdx.x, c = blockIdx.y, n = blockIdx.z;
  const long long s0 = b * K, s1 = s0 + K < S ? s0 + K : S;
  const ElemT<Cfg>* row = x + ((long long)n * Cfg::kC + c) * S;
  // A thread's share as shifted sums (shift: its first value), no division per value; then its
  // moments, merged across the block in a fixed order.
  double shift = 0.0, sum = 0.0, sq = 0.0, count = 0.0;
  const long long first = s0 + threadIdx.x;
  if (first < s1) shift = (double)Cfg::pre(ldg_f32(row + first));
#pragma unroll 4
  for (long long s = first; s < s1; s += Tune::kThreads) {
    const double d = (double)Cfg::pre(ldg_f32(row + s)) - shift;
    sum += d;
    sq = fma(d, d, sq);
    count += 1.0;
  }
  MomentsD m{count, 0.0, 0.0};
  if (count > 0.0) {
    m.mean = shift + sum / count;
    m.m2 = fmax(sq - sum * (sum / count), 0.0);
  }
  m = block_reduce_moments(m, scratch);
  if (threadIdx.x == 0) partials[((long long)n * B + b) * Cfg::kC + c] = m;
}

#ifndef FJ_GENERATED
struct DefaultMeanConfig : DefaultConfig {
  static constexpr int kMean = kMeanSpatial;
  __device__ static float post(float v) { return v; }
};
struct DefaultMeanTune {
  static constexpr int kBlocksPerSample = 4;
  static constexpr int kThreads = 256;
};
#endif

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with the default configuration.
extern "C" __global__ void __launch_bounds__(32)
    moments_mean_selftest(const fj::MomentsD* p, const float* g, const float* b, float* y) {
  fj::moments_mean_finalize<fj::DefaultMeanConfig, fj::DefaultMeanTune>(p, g, b, y);
}
struct NoProducerMeanConfig : fj::DefaultMeanConfig {
  static constexpr int kProducer = fj::kNoProducer;
};
extern "C" __global__ void __launch_bounds__(256)
    channel_moments_selftest(const float* x, fj::MomentsD* p) {
  fj::channel_moments_body<NoProducerMeanConfig, fj::DefaultMeanTune>(x, p);
}
#endif

#endif  // FUSEJIT_TEMPLATES_MOMENTS_MEAN_CUH_
