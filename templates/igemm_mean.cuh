// templates/igemm_mean.cuh: finalize of the tensor-core plan for chains ending in
// "... | group_norm | mean" (strategy "igemm-moments-mean", codegen/igemm_strategy.cc). The GEMM
// (igemm_wgmma_moments_body, Tune::kOut == kIgemmOutChannelMoments) wrote per-tile per-channel
// moments of the pre-norm values; nothing full-size exists. The mean over the spatial dims of the
// affine group_norm output of channel c is, exactly (mean is linear):
//     gamma_c * (m_c - mu_g) * rstd_g + beta_c
// with m_c the channel's mean, mu_g / var_g (biased, as PyTorch) the group's, rstd_g =
// 1/sqrt(var_g + eps). Cfg::post (ops after group_norm) must be the identity: the mean of a
// non-linear function of the normalized values does not follow from moments (the strategy does
// not apply then).
//
// ---- host-side contract -------------------------------------------------------------------
//   igemm_mean_finalize_body<Cfg, Tune>(channel_partials, gamma, beta, y)
//     grid kN, block IgemmMean<Cfg,Tune>::kThreads (256), no dynamic smem (static: 16*(kC +
//     kGroups) + 256 bytes, so kC <= 1024). Launched after the GEMM on the same stream.
//     reads : channel partials, IgemmChannelMoments [kN][IgemmShape<Cfg,Tune>::kTiles][kC]
//             (igemm_mma.cuh; tile t holds min(BM, S - t*BM) points);
//             gamma [kC], beta [kC] (group_norm weight and bias).
//     writes: y [kN, kC] (kMean == kMeanSpatial) or [kN] (kMeanAll), every element.
//   Per sample: each channel's tile moments are merged in tile order (Chan, double), each group's
//   channels in channel order (double); kMeanAll sums the channel means in a fixed tree order
//   (double) and divides by kC. Bitwise identical run to run.
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_IGEMM_MEAN_CUH_
#define FUSEJIT_TEMPLATES_IGEMM_MEAN_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "igemm_mma.cuh"

namespace fj {

template <class Cfg, class Tune>
struct IgemmMean {
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kThreads = 256;
  static_assert(Cfg::kGroups > 0 && Cfg::kC % Cfg::kGroups == 0, "igemm_mean: needs group_norm");
  static_assert(Cfg::kMean == kMeanSpatial || Cfg::kMean == kMeanAll,
                "igemm_mean: the chain must end with mean");
  static_assert(Cfg::kC <= 1024, "igemm_mean: at most 1024 channels (shared memory)");
  static_assert(Sh::kOut == kIgemmOutChannelMoments,
                "igemm_mean: the GEMM must write channel moments (Tune::kOut)");
};

template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_mean_finalize_body(
    const IgemmChannelMoments* __restrict__ cpart, const ElemT<Cfg>* __restrict__ gamma,
    const ElemT<Cfg>* __restrict__ beta, ElemT<Cfg>* __restrict__ y) {
  using E = ElemT<Cfg>;
  using M = IgemmMean<Cfg, Tune>;
  using Sh = typename M::Sh;
  constexpr int C = Cfg::kC, G = Cfg::kGroups, CPG = C / G, T = Sh::kTiles;
  // Doubles: the result is a mean of values that nearly cancel within each group (m_c - mu_g).
  __shared__ double s_m[C], s_q[C], s_mu[G], s_rstd[G];
  __shared__ double scratch[32];
  const int n = blockIdx.x;
  const IgemmChannelMoments* p = cpart + (long long)n * T * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    double cn = 0, cm = 0, cq = 0;
    for (int t = 0; t < T; ++t) {
      const IgemmChannelMoments b = p[(long long)t * C + c];
      const int rows = Sh::kS - t * Sh::kBM < Sh::kBM ? Sh::kS - t * Sh::kBM : Sh::kBM;
      const double total = cn + rows;
      const double wb = rows / total;
      const double delta = b.mean - cm;
      cm += delta * wb;
      cq += b.m2 + delta * delta * cn * wb;
      cn = total;
    }
    s_m[c] = cm;
    s_q[c] = cq;
  }
  __syncthreads();
  // Every channel holds kS values.
  constexpr double kCount = (double)Sh::kS;
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    double gn = 0, gm = 0, gq = 0;
    for (int k = 0; k < CPG; ++k) {
      const int c = g * CPG + k;
      const double total = gn + kCount;
      const double wb = kCount / total;
      const double delta = s_m[c] - gm;
      gm += delta * wb;
      gq += s_q[c] + delta * delta * gn * wb;
      gn = total;
    }
    s_mu[g] = gm;
    s_rstd[g] = 1.0 / sqrt(gq / gn + (double)Cfg::kEps);
  }
  __syncthreads();
  double sum = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int g = c / CPG;
    const double v =
        (double)to_f32(gamma[c]) * ((s_m[c] - s_mu[g]) * s_rstd[g]) + (double)to_f32(beta[c]);
    if constexpr (Cfg::kMean == kMeanSpatial) {
      y[(long long)n * C + c] = store_as<E>((float)v);
    } else {
      sum += v;
    }
  }
  if constexpr (Cfg::kMean == kMeanAll) {
    sum = block_reduce_sum<double>(sum, scratch);
    if (threadIdx.x == 0) y[n] = store_as<E>((float)(sum / C));
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): both mean modes, with a config that suits the GEMM shapes.
namespace fj_selftest_igemm_mean {
struct Cfg : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 32, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 256, kD = 4, kH = 5, kW = 6;
  static constexpr int kGroups = 16;
  static constexpr int kMean = fj::kMeanSpatial;
  __device__ static float post(float v) { return v; }
};
struct CfgAll : Cfg {
  static constexpr int kMean = fj::kMeanAll;
};
struct Tune {
  static constexpr int kPrec = fj::kPrecF16x3;
  static constexpr int kWarpsM = 4, kWarpsN = 1, kWM = 16, kWN = 128;
  static constexpr int kStages = 3, kFlushSteps = 2, kAbsmaxBlocks = 264;
  static constexpr int kOut = fj::kIgemmOutChannelMoments;
};
}  // namespace fj_selftest_igemm_mean
extern "C" __global__ void __launch_bounds__(256)
    igemm_mean_spatial_selftest(const fj::IgemmChannelMoments* p, const float* g, const float* b,
                                float* y) {
  fj::igemm_mean_finalize_body<fj_selftest_igemm_mean::Cfg, fj_selftest_igemm_mean::Tune>(p, g, b,
                                                                                          y);
}
extern "C" __global__ void __launch_bounds__(256)
    igemm_mean_all_selftest(const fj::IgemmChannelMoments* p, const float* g, const float* b,
                            float* y) {
  fj::igemm_mean_finalize_body<fj_selftest_igemm_mean::CfgAll, fj_selftest_igemm_mean::Tune>(
      p, g, b, y);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_IGEMM_MEAN_CUH_
