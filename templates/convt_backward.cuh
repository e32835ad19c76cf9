// templates/convt_backward.cuh: group_norm's backward sums for a chain whose producer is
// convt_group_norm.cuh's cheap transposed convolution (few input channels, at most 32 outputs,
// a bias), recomputing u = conv_transpose3d(x) + bias instead of reading it. The sums are
// backward.cuh's bwd_sums_kernel's:
//   gpart[(n*kC + c)*kSplit + b] = (sum g_h, sum g_h*zhat) over block b's points of slice (n, c),
//   g_h = grad_y * post'(h), zhat = (pre(u) - mean) * rstd.
// Why: bwd_sums reads u and grad_y (W1: 2 GB, 0.70 ms on the H100, DRAM-bound), while the
// forward's statistics pass computes the same convolution in 0.37 ms without memory traffic; here
// that arithmetic runs beside grad_y's 1 GB read instead of u's.
//
// Work: convt_group_moments's warp units (rows of one h phase, every channel, a lane's q values),
// block b of sample n taking units b*WPB + warp, + kStatBlocksPerSample*WPB, ... A unit's grad_y
// values are loaded into registers before its convolution, whose instructions hide their latency.
// Per unit, a lane's float sums over its points (per channel) are summed over the warp by a
// reduce-scatter (lane l ends with value l of [sum g_h per channel, sum g_h*zhat per channel],
// 32 at a time) and added in double to the lane's running sums; the warps' doubles are then
// summed in index order. Every sum in a fixed order: deterministic. u is recomputed by
// convt_unit, as the training forward computed the u it saved: the same values bit for bit.
//
// Host contract: grid (Tune::kStatBlocksPerSample, kN), block Tune::kThreads, dynamic shared
// memory ConvTGeom::kDynSmemBytes; BwdTune::kSplit == Tune::kStatBlocksPerSample (gpart's chunks
// per (n, c)). Reads x [N, Cin, Din, Hin, Win], weight [Cin, C, KD, KH, KW], bias [C], grad_y
// (y's shape, or the mean's), gamma, beta, and the group statistics: the training forward's
// stats [N][G][2] or, when null, zpart (bwd_moments). Writes every gpart entry of its blocks. f32.
#ifndef FUSEJIT_TEMPLATES_CONVT_BACKWARD_CUH_
#define FUSEJIT_TEMPLATES_CONVT_BACKWARD_CUH_

#include "backward.cuh"
#include "common.cuh"
#include "convt_group_norm.cuh"
#include "default_config.cuh"

namespace fj {

template <class Cfg, class Tune, class BwdTune, class GyT>
__device__ void convt_bwd_sums_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                      const float* __restrict__ bias, const GyT* __restrict__ gy,
                                      const float* __restrict__ gamma,
                                      const float* __restrict__ beta,
                                      const double2* __restrict__ zpart,
                                      const float* __restrict__ stats,
                                      double2* __restrict__ gpart) {
  convt_static_checks<Cfg>();
  static_assert(is_same_v<ElemT<Cfg>, float>, "convt_bwd_sums: the backward runs in f32");
  static_assert(BwdTune::kSplit == Tune::kStatBlocksPerSample,
                "convt_bwd_sums: gpart has one chunk per block of a sample");
  using T = ConvTGeom<Cfg, Tune>;
  using B = Bwd<Cfg, BwdTune>;
  constexpr int C = Cfg::kC, G = Cfg::kGroups, CPG = T::kCPG, SW = Cfg::kSW, RB = T::RB;
  constexpr int WPB = Tune::kThreads / 32;
  constexpr int kR = (2 * C + 31) / 32;  // rounds of 32 values: [sum g_h per c, sum g_h*zhat per c]
  extern __shared__ __align__(16) float fj_convt_smem[];
  float* s_w = fj_convt_smem;
  __shared__ double scratch[32];
  __shared__ float s_stats[G][2];  // mean, rstd
  __shared__ float s_gb[C][2];     // gamma, beta
  __shared__ double s_red[WPB][kR * 32];
  convt_load_weights<Cfg, Tune>(weight, bias, s_w);
  const int n = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = 0; g < G; ++g) {
    float mean, rstd;
    B::group_stats(zpart, stats, n, g, mean, rstd, scratch);
    if (threadIdx.x == 0) {
      s_stats[g][0] = mean;
      s_stats[g][1] = rstd;
    }
  }
  if (threadIdx.x < C) {
    s_gb[threadIdx.x][0] = gamma[threadIdx.x];
    s_gb[threadIdx.x][1] = beta[threadIdx.x];
  }
  __syncthreads();

  const float* __restrict__ xn = x + (size_t)n * Cfg::kCin * Cfg::kDin * Cfg::kHin * Cfg::kWin;
  double run[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) run[r] = 0.0;

  convt_for_each_unit<Cfg, Tune, Tune::kStatBlocksPerSample>([&](int od, int rh, int ub, int q) {
    // grad_y at the unit's points (0 outside the output), in flight during the convolution.
    float g[RB][SW][C];
#pragma unroll
    for (int k = 0; k < RB; ++k) {
      const int oh = Cfg::kSH * (ub * RB + k) + rh;
#pragma unroll
      for (int rw = 0; rw < SW; ++rw) {
        const int ow = SW * q + rw;
        const bool ok = oh < Cfg::kH && ow < Cfg::kW;
        const int s = ok ? (od * Cfg::kH + oh) * Cfg::kW + ow : 0;
#pragma unroll
        for (int co = 0; co < C; ++co) g[k][rw][co] = ok ? B::grad_y(gy, n * C + co, s) : 0.f;
      }
    }
    float acc[RB][SW][C];
    convt_unit<Cfg, Tune>(xn, s_w, od, rh, ub, q, acc);
    float v[kR][32];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i) v[r][i] = 0.f;
#pragma unroll
    for (int co = 0; co < C; ++co) {
      const float mean = s_stats[co / CPG][0], rstd = s_stats[co / CPG][1];
      const float ga = s_gb[co][0], be = s_gb[co][1];
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int k = 0; k < RB; ++k)
#pragma unroll
        for (int rw = 0; rw < SW; ++rw) {
          const float zh = (Cfg::pre(acc[k][rw][co]) - mean) * rstd;
          float d;
          Cfg::post_d(fmaf(zh, ga, be), d);
          const float gh = g[k][rw][co] * d;
          s1 += gh;
          s2 = fmaf(gh, zh, s2);
        }
      v[co / 32][co % 32] = s1;
      v[(C + co) / 32][(C + co) % 32] = s2;
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) run[r] += warp_reduce_scatter32(v[r]);
  });
#pragma unroll
  for (int r = 0; r < kR; ++r) s_red[warp][r * 32 + lane] = run[r];
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    double s1 = 0, s2 = 0;
    for (int w = 0; w < WPB; ++w) {
      s1 += s_red[w][c];
      s2 += s_red[w][C + c];
    }
    gpart[((size_t)n * C + c) * BwdTune::kSplit + blockIdx.x] = make_double2(s1, s2);
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): convt_group_norm.cuh's transposed default configuration.
namespace fj_selftest {
struct ConvTBwdSelfTune : fj::ConvTGroupNormTune {};
struct ConvTBwdSelfBwdTune {
  static constexpr int kSplit = ConvTBwdSelfTune::kStatBlocksPerSample, kBiasSplit = 3,
                       kThreads = 256;
};
extern "C" __global__ void __launch_bounds__(ConvTBwdSelfTune::kThreads,
                                             ConvTBwdSelfTune::kMinBlocksPerSM)
    convt_bwd_sums(const float* x, const float* w, const float* b, const float* gy,
                   const float* gamma, const float* beta, const double2* z, const float* st,
                   double2* p) {
  fj::convt_bwd_sums_kernel<fj::DefaultConvTConfig, ConvTBwdSelfTune, ConvTBwdSelfBwdTune>(
      x, w, b, gy, gamma, beta, z, st, p);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_CONVT_BACKWARD_CUH_
