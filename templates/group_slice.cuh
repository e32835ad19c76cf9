// templates/group_slice.cuh: group_norm chains without a convolution and without mean whose
// (sample, group) slice fits in shared memory (strategy "slice-normalize",
// codegen/slice_normalize_strategy.cc): one block per (group, sample) loads pre(x) of its slice
// once into shared memory, reduces the group's mean and variance from there (two passes over
// shared memory, in double, fixed order), normalizes and writes y once. x is read once and y
// written once; the generic plans read x twice.
//
// Host-side contract:
//   grid (kGroups, kN), block Tune::kThreads (a multiple of 32, <= 1024), dynamic shared memory
//   SliceNormalize<Cfg>::kSmemBytes (the slice's floats; raise the attribute above 48 KB first).
//   reads : x [N, C, D, H, W] (ElemT<Cfg>), gamma [C], beta [C]
//   writes: y [N, C, D, H, W], every element.
//   y = post((pre(x) - mu_g) * rstd_g * gamma_c + beta_c), mu_g and the biased variance over the
//   group's C/G channels and D*H*W points, rstd_g = 1 / sqrt(var_g + eps), as PyTorch.
#ifndef FUSEJIT_TEMPLATES_GROUP_SLICE_CUH_
#define FUSEJIT_TEMPLATES_GROUP_SLICE_CUH_

#include "common.cuh"
#include "default_config.cuh"

namespace fj {

template <class Cfg>
struct SliceNormalize {
  static constexpr int kCg = Cfg::kC / Cfg::kGroups;              // channels per group
  static constexpr long long kS = (long long)Cfg::kD * Cfg::kH * Cfg::kW;  // points per channel
  static constexpr long long kSlice = kCg * kS;                   // values per (sample, group)
  static constexpr long long kSmemBytes = kSlice * 4;
  static_assert(Cfg::kProducer == kNoProducer, "slice_normalize: chains without a producer");
  static_assert(Cfg::kGroups > 0 && Cfg::kC % Cfg::kGroups == 0, "slice_normalize: group_norm");
  static_assert(Cfg::kMean == kNoMean, "slice_normalize: no mean");
  static_assert(kSmemBytes <= 227 * 1024, "slice_normalize: the slice must fit shared memory");
};

template <class Cfg, class Tune>
__device__ __forceinline__ void slice_normalize_body(const ElemT<Cfg>* __restrict__ x,
                                                     const ElemT<Cfg>* __restrict__ gamma,
                                                     const ElemT<Cfg>* __restrict__ beta,
                                                     ElemT<Cfg>* __restrict__ y) {
  using G = SliceNormalize<Cfg>;
  static_assert(Tune::kThreads % 32 == 0 && Tune::kThreads <= 1024, "slice_normalize: threads");
  extern __shared__ __align__(16) float slice[];
  __shared__ double scratch[32];
  __shared__ double stats[2];
  const int g = blockIdx.x, n = blockIdx.y;
  const long long base = ((long long)n * Cfg::kC + (long long)g * G::kCg) * G::kS;
  // Load pre(x) once; the sum for the mean on the way (double, each thread a strided share).
  double sum = 0.0;
  for (long long i = threadIdx.x; i < G::kSlice; i += Tune::kThreads) {
    const float v = Cfg::pre(ldg_f32(x + base + i));
    slice[i] = v;
    sum += (double)v;
  }
  sum = block_reduce_sum(sum, scratch);
  if (threadIdx.x == 0) stats[0] = sum / (double)G::kSlice;
  __syncthreads();
  const double mean = stats[0];
  double m2 = 0.0;
  for (long long i = threadIdx.x; i < G::kSlice; i += Tune::kThreads) {
    const double d = (double)slice[i] - mean;
    m2 = fma(d, d, m2);
  }
  m2 = block_reduce_sum(m2, scratch);
  if (threadIdx.x == 0) stats[1] = 1.0 / sqrt(m2 / (double)G::kSlice + (double)Cfg::kEps);
  __syncthreads();
  const float mu = (float)mean, rstd = (float)stats[1];
  // Channel by channel: the affine pair is loaded once per channel, no index division.
  for (int k = 0; k < G::kCg; ++k) {
    const int c = g * G::kCg + k;
    const float scale = rstd * to_f32(gamma[c]), shift = to_f32(beta[c]);
    const float* src = slice + (long long)k * G::kS;
    ElemT<Cfg>* dst = y + base + (long long)k * G::kS;
    for (long long s = threadIdx.x; s < G::kS; s += Tune::kThreads) {
      dst[s] = from_f32<ElemT<Cfg>>(Cfg::post((src[s] - mu) * scale + shift));
    }
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): a small chain's configuration.
namespace fj_selftest_slice {
struct Cfg : fj::DefaultConfig {
  static constexpr int kProducer = fj::kNoProducer;
  static constexpr int kN = 2, kC = 8, kCin = 8, kD = 3, kH = 4, kW = 5;
  static constexpr int kGroups = 2;
  static constexpr int kMean = fj::kNoMean;
};
struct Tune {
  static constexpr int kThreads = 128;
};
}  // namespace fj_selftest_slice
extern "C" __global__ void __launch_bounds__(128)
    slice_normalize_selftest(const float* x, const float* g, const float* b, float* y) {
  fj::slice_normalize_body<fj_selftest_slice::Cfg, fj_selftest_slice::Tune>(x, g, b, y);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_GROUP_SLICE_CUH_
