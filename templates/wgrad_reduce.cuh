// templates/wgrad_reduce.cuh: the last step of every weight gradient (wgrad.cuh, wgrad_halo.cuh,
// wgrad_wgmma.cuh, few_in_backward.cuh): grad_w = the sum of Tune::kSplits double partials,
// part[split][weight] in the weight's own layout, in a fixed order (deterministic). On its own so
// that a plan needing only this step does not parse the GEMM templates.
#ifndef FUSEJIT_TEMPLATES_WGRAD_REDUCE_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_REDUCE_CUH_

#include "common.cuh"
#include "default_config.cuh"

namespace fj {

// Grid ceil(weights / 32) blocks of 256 threads: 32 weights per block; warp j sums the splits j,
// j + 8, ... of its lane's weight in order, then the 8 warp sums are added in warp order.
template <class Cfg, class Tune>
__device__ void wgrad_reduce_kernel(const double* __restrict__ part, float* __restrict__ grad_w) {
  constexpr int kTotal = Cfg::kCin * Cfg::kC * Cfg::kKD * Cfg::kKH * Cfg::kKW;
  constexpr int kSlices = 8;
  __shared__ double sums[kSlices][32];
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int i = blockIdx.x * 32 + lane;
  double s = 0;
  if (i < kTotal) {
    for (int k = slice; k < Tune::kSplits; k += kSlices) {
      s += part[static_cast<size_t>(k) * kTotal + i];
    }
  }
  sums[slice][lane] = s;
  __syncthreads();
  if (slice == 0 && i < kTotal) {
    double t = 0;
#pragma unroll
    for (int j = 0; j < kSlices; ++j) t += sums[j][lane];
    grad_w[i] = static_cast<float>(t);
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests).
namespace fj_selftest {
struct WgReduceSelfTune {
  static constexpr int kSplits = 5;
};
extern "C" __global__ void wgrad_reduce_alone(const double* part, float* gw) {
  fj::wgrad_reduce_kernel<fj::DefaultConfig, WgReduceSelfTune>(part, gw);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_REDUCE_CUH_
