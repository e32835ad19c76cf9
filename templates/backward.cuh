// templates/backward.cuh: the backward pass of a chain's elementwise ops, group_norm and mean, and
// the sums behind the group_norm and conv-bias gradients.
//
// u is the producer's output (x itself without a producer), [kN, kC, kS] with kS = kD*kH*kW. The
// forward computed z = pre(u), h = group_norm(z) (affine: h = zhat*gamma + beta), y = post(h), then
// the optional mean. From grad_y these kernels compute grad_u, and the sums that give
// grad_gamma[c] = sum(g_h * zhat), grad_beta[c] = sum(g_h) and grad_bias[c] = sum(grad_u).
//
// Element types: u, gamma, beta, grad_y, grad_u and the parameter gradients are each read or
// written in the type the kernel is called with -- float, or a bf16/f16 chain's dtype where its
// backward runs natively (a chain without a convolution: x, the parameters and every gradient in
// the dtype) or reads grad_y as it is. Loads widen exactly (to_f32), stores round once (from_f32);
// all arithmetic is fp32 and every sum double, so a native 16-bit backward gives the f32
// backward's gradients of the same values, rounded.
//
// Work split: every (n, c) slice is cut into BwdTune::kSplit chunks of consecutive points; block b
// handles chunk b % kSplit of slice b / kSplit. Every sum is taken in double: per thread over a
// fixed set of points, across the block in a fixed tree, then over chunks, channels and samples in
// index order -- results are bitwise reproducible run to run (no atomics).
//
// Workspace (double2/double, one entry per (n, c, chunk), index (n*kC + c)*kSplit + chunk):
//   zpart (sum z, sum z^2)         bwd_moments   -> the group statistics (recomputed, in double;
//                                                   or read from the training forward's saved
//                                                   stats [N][G][2] (mean, rstd): no zpart)
//   gpart (sum g_h, sum g_h*zhat)  bwd_sums      -> group_norm's backward terms, grad_gamma/beta
//   (with no op after group_norm, bwd_moments_sums writes both in one pass, then bwd_sums_fix)
//   bpart (sum grad_u)             bwd_grad_u    -> grad of the conv bias
#ifndef FUSEJIT_TEMPLATES_BACKWARD_CUH_
#define FUSEJIT_TEMPLATES_BACKWARD_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "moments_util.cuh"

namespace fj {

template <class Cfg, class Tune>
struct Bwd {
  static constexpr int kS = Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kCg = Cfg::kGroups > 0 ? Cfg::kC / Cfg::kGroups : 1;
  static constexpr int kSplit = Tune::kSplit;
  static constexpr int kChunk = (kS + kSplit - 1) / kSplit;
  static_assert(Tune::kThreads % 32 == 0 && Tune::kThreads <= 1024, "whole warps");

  // The slice (n*kC + c) and the [begin, end) points of this block's chunk.
  __device__ static int slice() { return blockIdx.x / kSplit; }
  __device__ static int begin() { return (blockIdx.x % kSplit) * kChunk; }
  __device__ static int end() { return min(begin() + kChunk, kS); }

  // Visits this block's points [begin(), end()) in the order of the strided loop `for (i = first
  // + tid; i < end(); i += kThreads)` (points below begin() skipped), where first is the start of
  // the 128-byte line holding point begin() of the [kN*kC, kS] tensor: every warp access then
  // covers whole lines. (Starting at begin() itself, slices with kS % 32 != 0 -- all four seeds --
  // made every warp straddle two lines, and the DRAM moved 15-45% more bytes: W1's grad_u pass
  // read 2.89 GB for 2.0.) Calls load(i) for kUnroll points before use(i, loaded) for them: that
  // many loads in flight per thread. The point -> thread assignment depends on the shapes only, so
  // per-thread sums are reproducible.
  template <class Load, class Use>
  __device__ __forceinline__ static void for_each_point(Load load, Use use) {
    constexpr int kUnroll = 4;
    constexpr int kLine = 32;  // 4-byte elements of one 128-byte line
    using V = decltype(load(0));
    const int b = begin(), e = end();
    const int lead = static_cast<int>((static_cast<long long>(slice()) * kS + b) % kLine);
    for (int i0 = b - lead + threadIdx.x; i0 < e; i0 += kUnroll * Tune::kThreads) {
      V v[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int i = i0 + j * Tune::kThreads;
        if (i >= b && i < e) v[j] = load(i);
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int i = i0 + j * Tune::kThreads;
        if (i >= b && i < e) use(i, v[j]);
      }
    }
  }

  // grad_y at point s of slice nc, broadcast through the mean (PyTorch: grad / count), as float.
  // GyT: float, or the 16-bit dtype of a bf16/f16 chain's grad_y (read as it is: widening is
  // exact, so the result is the float copy's).
  template <class GyT>
  __device__ static float grad_y(const GyT* __restrict__ gy, int nc, int s) {
    if constexpr (Cfg::kMean == kMeanSpatial) {
      return to_f32(gy[nc]) / float(kS);
    } else if constexpr (Cfg::kMean == kMeanAll) {
      return to_f32(gy[nc / Cfg::kC]) / float(Cfg::kC * kS);
    } else {
      return to_f32(gy[static_cast<size_t>(nc) * kS + s]);
    }
  }

  // Mean and rstd of group g of sample n: the training forward's (stats [N][G][2], not null), or
  // from zpart in double; every thread gets them. REQUIRES: all threads of the block call it.
  __device__ static void group_stats(const double2* __restrict__ zpart,
                                     const float* __restrict__ stats, int n, int g, float& mean,
                                     float& rstd, double* scratch) {
    if (stats != nullptr) {  // block-uniform
      const float* const st = stats + 2 * (static_cast<size_t>(n) * Cfg::kGroups + g);
      mean = st[0];
      rstd = st[1];
      return;
    }
    constexpr int kParts = kCg * kSplit;
    const double2* p = zpart + (static_cast<size_t>(n) * Cfg::kC + g * kCg) * kSplit;
    double s = 0, ss = 0;
    for (int i = threadIdx.x; i < kParts; i += blockDim.x) {
      s += p[i].x;
      ss += p[i].y;
    }
    s = block_reduce_sum(s, scratch);
    ss = block_reduce_sum(ss, scratch);
    __shared__ float s_stats[2];
    if (threadIdx.x == 0) {
      const double count = static_cast<double>(kCg) * kS;
      const double m = s / count;
      const double var = fmax(ss / count - m * m, 0.0);  // biased, as group_norm's forward
      s_stats[0] = static_cast<float>(m);
      s_stats[1] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(Cfg::kEps)));
    }
    __syncthreads();
    mean = s_stats[0];
    rstd = s_stats[1];
  }

  // What grad_u at a point of group g of sample n needs besides u, grad_y and the channel's gamma
  // and beta: the group statistics and ma, mb = the group's means of gamma*g_h and gamma*g_h*zhat
  // (from gpart). REQUIRES: all threads of the block call it.
  struct GroupTerms {
    float mean, rstd, ma, mb;
  };
  template <class PT>
  __device__ static GroupTerms group_terms(const double2* __restrict__ zpart,
                                           const float* __restrict__ stats,
                                           const double2* __restrict__ gpart,
                                           const PT* __restrict__ gamma, int n, int g,
                                           double* scratch) {
    GroupTerms t;
    group_stats(zpart, stats, n, g, t.mean, t.rstd, scratch);
    constexpr int kParts = kCg * kSplit;
    const double2* p = gpart + (static_cast<size_t>(n) * Cfg::kC + g * kCg) * kSplit;
    double a = 0, b = 0;
    for (int i = threadIdx.x; i < kParts; i += blockDim.x) {
      const double gc = to_f32(gamma[g * kCg + i / kSplit]);
      a += gc * p[i].x;
      b += gc * p[i].y;
    }
    a = block_reduce_sum(a, scratch);
    b = block_reduce_sum(b, scratch);
    __shared__ float ab[2];
    if (threadIdx.x == 0) {
      const double count = static_cast<double>(kCg) * kS;
      ab[0] = static_cast<float>(a / count);
      ab[1] = static_cast<float>(b / count);
    }
    __syncthreads();
    t.ma = ab[0];
    t.mb = ab[1];
    return t;
  }

  // grad_u at one point from u and grad_y there. With group_norm (t: the point's group terms,
  // ga, be: its channel's gamma and beta): dz = rstd * (gamma*g_h - ma - zhat * mb), g_h =
  // grad_y * post'(h), grad_u = dz * pre'(u). Without: grad_u = grad_y * pre'(u).
  __device__ __forceinline__ static float grad_u_norm(float u, float gy, const GroupTerms& t,
                                                      float ga, float be) {
    float dp, d;
    const float zh = (Cfg::pre_d(u, dp) - t.mean) * t.rstd;
    Cfg::post_d(fmaf(zh, ga, be), d);
    const float gh = gy * d;
    return t.rstd * (ga * gh - t.ma - zh * t.mb) * dp;
  }
  __device__ __forceinline__ static float grad_u_plain(float u, float gy) {
    float dp;
    Cfg::pre_d(u, dp);
    return gy * dp;
  }
};

// zpart[slice chunk] = (sum z, sum z^2) with z = pre(u). Grid kN*kC*kSplit.
template <class Cfg, class Tune, class UT>
__device__ void bwd_moments_kernel(const UT* __restrict__ u, double2* __restrict__ zpart) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const UT* src = u + static_cast<size_t>(B::slice()) * B::kS;
  double s = 0, ss = 0;
  B::for_each_point([&](int i) { return to_f32(src[i]); },
                    [&](int, float v) {
                      const float z = Cfg::pre(v);
                      s += z;
                      ss += static_cast<double>(z) * z;
                    });
  s = block_reduce_sum(s, scratch);
  ss = block_reduce_sum(ss, scratch);
  if (threadIdx.x == 0) zpart[blockIdx.x] = make_double2(s, ss);
}

// gpart[slice chunk] = (sum g_h, sum g_h * zhat), g_h = grad_y * post'(h). Grid kN*kC*kSplit.
template <class Cfg, class Tune, class UT, class GyT, class PT>
__device__ void bwd_sums_kernel(const UT* __restrict__ u, const GyT* __restrict__ gy,
                                const PT* __restrict__ gamma, const PT* __restrict__ beta,
                                const double2* __restrict__ zpart, const float* __restrict__ stats,
                                double2* __restrict__ gpart) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const int nc = B::slice(), n = nc / Cfg::kC, c = nc % Cfg::kC;
  float mean, rstd;
  B::group_stats(zpart, stats, n, c / B::kCg, mean, rstd, scratch);
  const float ga = to_f32(gamma[c]), be = to_f32(beta[c]);
  const UT* src = u + static_cast<size_t>(nc) * B::kS;
  double s1 = 0, s2 = 0;
  B::for_each_point([&](int i) { return make_float2(to_f32(src[i]), B::grad_y(gy, nc, i)); },
                    [&](int, float2 v) {
                      const float zh = (Cfg::pre(v.x) - mean) * rstd;
                      float d;
                      Cfg::post_d(fmaf(zh, ga, be), d);
                      const float gh = v.y * d;
                      s1 += gh;
                      s2 += static_cast<double>(gh) * zh;
                    });
  s1 = block_reduce_sum(s1, scratch);
  s2 = block_reduce_sum(s2, scratch);
  if (threadIdx.x == 0) gpart[blockIdx.x] = make_double2(s1, s2);
}

// Chains with no op after group_norm (post' = 1, so g_h = grad_y needs no statistics; the planner
// launches this only then): one read of u and grad_y gives zpart and, in gpart, the raw sums
// (sum g_h, sum g_h * z) -- in place of bwd_moments + bwd_sums, which read u twice.
// bwd_sums_fix_kernel then turns sum g_h*z into sum g_h*zhat. Grid kN*kC*kSplit.
template <class Cfg, class Tune, class UT, class GyT>
__device__ void bwd_moments_sums_kernel(const UT* __restrict__ u, const GyT* __restrict__ gy,
                                        double2* __restrict__ zpart, double2* __restrict__ gpart) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const int nc = B::slice();
  const UT* src = u + static_cast<size_t>(nc) * B::kS;
  double s = 0, ss = 0, s1 = 0, s2 = 0;
  B::for_each_point([&](int i) { return make_float2(to_f32(src[i]), B::grad_y(gy, nc, i)); },
                    [&](int, float2 v) {
                      const float z = Cfg::pre(v.x);
                      s += z;
                      ss += static_cast<double>(z) * z;
                      s1 += v.y;
                      s2 += static_cast<double>(v.y) * z;
                    });
  s = block_reduce_sum(s, scratch);
  ss = block_reduce_sum(ss, scratch);
  s1 = block_reduce_sum(s1, scratch);
  s2 = block_reduce_sum(s2, scratch);
  if (threadIdx.x == 0) {
    zpart[blockIdx.x] = make_double2(s, ss);
    gpart[blockIdx.x] = make_double2(s1, s2);
  }
}

// In place of bwd_moments_sums where the training forward saved its per-block channel moments of
// z = pre(u) (codegen::kSavedMomentsName: partials[(n*kBlocks + b)*kC + c], the layout
// moments_mean_finalize reads, written by a "... | group_norm | mean" plan) and the chain ends in
// mean with no op after group_norm: grad_y is then one value g per (n, c) slice, so the sums
// follow from each channel's merged moments (n_c, m_c, M2_c; merge_block_moments, the forward's
// own merge) without reading u: sum z = n_c m_c, sum z^2 = M2_c + n_c m_c^2, sum g_h = g n_c,
// sum g_h*z = g n_c m_c. Chunk 0 of a slice holds them, its other chunks 0 (every reader sums a
// slice's chunks). bwd_sums_fix_kernel follows as after bwd_moments_sums. One thread per (n, c):
// grid ceil(kN*kC / Tune::kThreads), block Tune::kThreads.
template <class Cfg, class Tune, int kBlocks, class GyT>
__device__ void bwd_sums_from_moments_kernel(const Moments* __restrict__ partials,
                                             const GyT* __restrict__ gy,
                                             double2* __restrict__ zpart,
                                             double2* __restrict__ gpart) {
  static_assert(Cfg::kMean != kNoMean, "bwd_sums_from_moments: a chain ending in mean");
  static_assert(kBlocks >= 1, "bwd_sums_from_moments: at least one partial per channel");
  using B = Bwd<Cfg, Tune>;
  const int nc = blockIdx.x * blockDim.x + threadIdx.x;
  if (nc >= Cfg::kN * Cfg::kC) return;
  const int n = nc / Cfg::kC, c = nc % Cfg::kC;
  double cn, cm, cq;
  merge_block_moments(partials + static_cast<size_t>(n) * kBlocks * Cfg::kC + c, Cfg::kC, kBlocks,
                      cn, cm, cq);
  const double g = B::grad_y(gy, nc, 0);
  const double sum = cn * cm;
  for (int k = 0; k < B::kSplit; ++k) {
    const size_t at = static_cast<size_t>(nc) * B::kSplit + k;
    zpart[at] = k == 0 ? make_double2(sum, cq + sum * cm) : make_double2(0, 0);
    gpart[at] = k == 0 ? make_double2(g * cn, g * sum) : make_double2(0, 0);
  }
}

// After bwd_moments_sums: gpart's (sum g_h, sum g_h*z) -> (sum g_h, sum g_h*zhat), zhat = (z -
// mean) * rstd with the group's float statistics (those bwd_grad_u uses), in double:
// rstd * (sum g_h*z - mean * sum g_h). One block per (n, g), grid kN*kGroups.
template <class Cfg, class Tune>
__device__ void bwd_sums_fix_kernel(const double2* __restrict__ zpart,
                                    double2* __restrict__ gpart) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const int n = blockIdx.x / Cfg::kGroups, g = blockIdx.x % Cfg::kGroups;
  float mean, rstd;
  B::group_stats(zpart, nullptr, n, g, mean, rstd, scratch);
  constexpr int kParts = B::kCg * B::kSplit;
  double2* p = gpart + (static_cast<size_t>(n) * Cfg::kC + g * B::kCg) * B::kSplit;
  for (int i = threadIdx.x; i < kParts; i += blockDim.x) {
    const double2 v = p[i];
    p[i] = make_double2(v.x, static_cast<double>(rstd) * (v.y - static_cast<double>(mean) * v.x));
  }
}

// grad_u at every point; bpart[slice chunk] = sum grad_u when the conv has a bias (bpart non-null);
// gmax[slice chunk] = max |grad_u| over the chunk when gmax is non-null (fmaxf: NaNs skipped, as
// every absmax pass skips them), so that the weight gradient's scale needs no pass over grad_u.
// With group_norm: dz = rstd * (gamma*g_h - mean(gamma*g_h) - zhat * mean(gamma*g_h*zhat)), the
// group means from gpart; grad_u = dz * pre'(u). Without: grad_u = grad_y * pre'(u) (all the
// elementwise ops are `pre` then). Grid kN*kC*kSplit.
template <class Cfg, class Tune, class UT, class GyT, class PT, class GuT>
__device__ void bwd_grad_u_kernel(const UT* __restrict__ u, const GyT* __restrict__ gy,
                                  const PT* __restrict__ gamma, const PT* __restrict__ beta,
                                  const double2* __restrict__ zpart,
                                  const float* __restrict__ stats,
                                  const double2* __restrict__ gpart, GuT* __restrict__ gu,
                                  double* __restrict__ bpart, float* __restrict__ gmax) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const int nc = B::slice(), n = nc / Cfg::kC, c = nc % Cfg::kC;
  const UT* src = u + static_cast<size_t>(nc) * B::kS;
  GuT* dst = gu + static_cast<size_t>(nc) * B::kS;
  double sb = 0;
  float mx = 0.f;
  if constexpr (Cfg::kGroups > 0) {
    const typename B::GroupTerms t =
        B::group_terms(zpart, stats, gpart, gamma, n, c / B::kCg, scratch);
    const float ga = to_f32(gamma[c]), be = to_f32(beta[c]);
    B::for_each_point([&](int i) { return make_float2(to_f32(src[i]), B::grad_y(gy, nc, i)); },
                      [&](int i, float2 v) {
                        const float g_u = B::grad_u_norm(v.x, v.y, t, ga, be);
                        dst[i] = from_f32<GuT>(g_u);
                        sb += g_u;
                        mx = fmaxf(mx, fabsf(g_u));
                      });
  } else {
    B::for_each_point([&](int i) { return make_float2(to_f32(src[i]), B::grad_y(gy, nc, i)); },
                      [&](int i, float2 v) {
                        const float g_u = B::grad_u_plain(v.x, v.y);
                        dst[i] = from_f32<GuT>(g_u);
                        sb += g_u;
                        mx = fmaxf(mx, fabsf(g_u));
                      });
  }
  if (bpart != nullptr) {
    sb = block_reduce_sum(sb, scratch);
    if (threadIdx.x == 0) bpart[blockIdx.x] = sb;
  }
  if (gmax != nullptr) {  // block-uniform
    const double m = block_reduce_max(static_cast<double>(mx), scratch);
    if (threadIdx.x == 0) gmax[blockIdx.x] = static_cast<float>(m);
  }
}

// One block per channel c: grad_gamma[c], grad_beta[c] (from gpart) and grad_bias[c] (from
// bpart: Tune::kBiasSplit chunks per (n, c), kSplit's unless the bias partials came from another
// kernel, few_in_backward.cuh's), summed over samples and chunks in a fixed order; null outputs
// are skipped.
// Each is rounded to float, then (a 16-bit GpT) to GpT: the f32 backward's value, rounded.
template <class Cfg, class Tune, class GpT>
__device__ void bwd_param_grads_kernel(const double2* __restrict__ gpart,
                                       const double* __restrict__ bpart,
                                       GpT* __restrict__ grad_gamma, GpT* __restrict__ grad_beta,
                                       GpT* __restrict__ grad_bias) {
  using B = Bwd<Cfg, Tune>;
  __shared__ double scratch[32];
  const int c = blockIdx.x;
  double s1 = 0, s2 = 0, sb = 0;
  if (gpart != nullptr) {
    for (int i = threadIdx.x; i < Cfg::kN * B::kSplit; i += blockDim.x) {
      const size_t idx =
          (static_cast<size_t>(i / B::kSplit) * Cfg::kC + c) * B::kSplit + i % B::kSplit;
      s1 += gpart[idx].x;
      s2 += gpart[idx].y;
    }
  }
  if (bpart != nullptr) {
    constexpr int kBS = Tune::kBiasSplit;
    for (int i = threadIdx.x; i < Cfg::kN * kBS; i += blockDim.x) {
      sb += bpart[(static_cast<size_t>(i / kBS) * Cfg::kC + c) * kBS + i % kBS];
    }
  }
  s1 = block_reduce_sum(s1, scratch);
  s2 = block_reduce_sum(s2, scratch);
  sb = block_reduce_sum(sb, scratch);
  if (threadIdx.x == 0) {
    if (grad_gamma != nullptr) grad_gamma[c] = from_f32<GpT>(static_cast<float>(s2));
    if (grad_beta != nullptr) grad_beta[c] = from_f32<GpT>(static_cast<float>(s1));
    if (grad_bias != nullptr) grad_bias[c] = from_f32<GpT>(static_cast<float>(sb));
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): every kernel with the default configuration.
namespace fj_selftest {
struct BwdSelfTune {
  static constexpr int kSplit = 3, kBiasSplit = 3, kThreads = 256;
};
using C = fj::DefaultConfig;
struct MeanConfig : fj::DefaultConfig {  // "... | group_norm | mean(dims=[1,2,3,4])"
  static constexpr int kMean = fj::kMeanAll;
  __device__ static float post(float v) { return v; }
};
extern "C" __global__ void bwd_moments(const float* u, double2* z) {
  fj::bwd_moments_kernel<C, BwdSelfTune>(u, z);
}
extern "C" __global__ void bwd_sums(const float* u, const float* gy, const float* g, const float* b,
                                    const double2* z, const float* st, double2* p) {
  fj::bwd_sums_kernel<C, BwdSelfTune>(u, gy, g, b, z, st, p);
}
extern "C" __global__ void bwd_moments_sums(const float* u, const float* gy, double2* z,
                                            double2* p) {
  fj::bwd_moments_sums_kernel<C, BwdSelfTune>(u, gy, z, p);
}
extern "C" __global__ void bwd_sums_from_moments(const fj::Moments* m, const float* gy, double2* z,
                                                 double2* p) {
  fj::bwd_sums_from_moments_kernel<MeanConfig, BwdSelfTune, 2>(m, gy, z, p);
}
extern "C" __global__ void bwd_sums_fix(const double2* z, double2* p) {
  fj::bwd_sums_fix_kernel<C, BwdSelfTune>(z, p);
}
extern "C" __global__ void bwd_grad_u(const float* u, const float* gy, const float* g,
                                      const float* b, const double2* z, const float* st,
                                      const double2* p, float* gu, double* bp, float* gm) {
  fj::bwd_grad_u_kernel<C, BwdSelfTune>(u, gy, g, b, z, st, p, gu, bp, gm);
}
// grad_y in a 16-bit dtype (a bf16/f16 chain's backward reads it as it is).
extern "C" __global__ void bwd_grad_u_bf16(const float* u, const fj::bf16_t* gy, const float* g,
                                           const float* b, const double2* z, const float* st,
                                           const double2* p, float* gu, double* bp, float* gm) {
  fj::bwd_grad_u_kernel<C, BwdSelfTune>(u, gy, g, b, z, st, p, gu, bp, gm);
}
// A bf16 chain without a convolution, natively: x, gamma, beta, grad_y and the gradients in bf16.
extern "C" __global__ void bwd_moments_bf16(const fj::bf16_t* u, double2* z) {
  fj::bwd_moments_kernel<C, BwdSelfTune>(u, z);
}
extern "C" __global__ void bwd_sums_bf16(const fj::bf16_t* u, const fj::bf16_t* gy,
                                         const fj::bf16_t* g, const fj::bf16_t* b, const double2* z,
                                         const float* st, double2* p) {
  fj::bwd_sums_kernel<C, BwdSelfTune>(u, gy, g, b, z, st, p);
}
extern "C" __global__ void bwd_moments_sums_f16(const fj::f16_t* u, const fj::f16_t* gy, double2* z,
                                                double2* p) {
  fj::bwd_moments_sums_kernel<C, BwdSelfTune>(u, gy, z, p);
}
extern "C" __global__ void bwd_grad_u_native_bf16(const fj::bf16_t* u, const fj::bf16_t* gy,
                                                  const fj::bf16_t* g, const fj::bf16_t* b,
                                                  const double2* z, const float* st,
                                                  const double2* p, fj::bf16_t* gu, double* bp,
                                                  float* gm) {
  fj::bwd_grad_u_kernel<C, BwdSelfTune>(u, gy, g, b, z, st, p, gu, bp, gm);
}
extern "C" __global__ void bwd_param_grads_f16(const double2* p, const double* bp, fj::f16_t* gg,
                                               fj::f16_t* gb, fj::f16_t* gbias) {
  fj::bwd_param_grads_kernel<C, BwdSelfTune>(p, bp, gg, gb, gbias);
}
extern "C" __global__ void bwd_sums_from_moments_f16(const fj::Moments* m, const fj::f16_t* gy,
                                                     double2* z, double2* p) {
  fj::bwd_sums_from_moments_kernel<MeanConfig, BwdSelfTune, 2>(m, gy, z, p);
}
extern "C" __global__ void bwd_param_grads(const double2* p, const double* bp, float* gg,
                                           float* gb, float* gbias) {
  fj::bwd_param_grads_kernel<C, BwdSelfTune>(p, bp, gg, gb, gbias);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_BACKWARD_CUH_
