// templates/gn_apply.cuh: group_norm finalize + in-place apply for plans that store the pre-norm
// values in y and emit per-tile partial moments (igemm_mma.cuh / igemm_wgmma.cuh, strategy
// igemm-store-normalize).
//
// ---- host-side contract -------------------------------------------------------------------
// Notation: S = kD*kH*kW, G = kGroups (> 0), kTiles = partial tiles per (n, g) (template arg).
//   partials: Moments {count, mean, m2} as 3 floats at ((n*G + g)*kTiles + tile)*3
//   stats:    2 floats per (n, g) at (n*G + g)*2: mean, rstd   (workspace, 8*kN*G bytes)
// Kernel bodies, in launch order (after the producer that wrote y and partials):
//   gn_finalize_body<Cfg, kTiles, kBN>  grid kN*G, block 256 (a multiple of 32, <= 1024), no
//        dynamic smem. Merges the partials of each (n, g) in a fixed order: its
//        geom::IgemmGroupPartsOf(g, kC/G, kBN) parts of kTiles each, contiguous at
//        (n*G + g)*IgemmGroupParts(kC, G, kBN)*kTiles (igemm_mma.cuh's layout; kBN = kC: one
//        part per group).
//   gn_apply_body<Cfg>  block GnApply<Cfg>::kThreads (__launch_bounds__ the same), grid
//        (GnApply<Cfg>::kBlocksPerRow, kN*kC) (so kN*kC <= 65535), no dynamic smem.
//        y[n,c,:] = post((y - mean) * rstd * gamma[c] + beta[c]) in place (f32 chains).
//   gn_apply_out_body<Cfg>  the same launch; reads the pre-norm values from a float workspace and
//        writes y in the chain's dtype (ElemT<Cfg>: bf16/f16 chains), rounding once.
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_GN_APPLY_CUH_
#define FUSEJIT_TEMPLATES_GN_APPLY_CUH_

#include "default_config.cuh"
#include "geometry.cuh"

namespace fj {

template <class Cfg>
struct GnApply {
  static constexpr int kS = Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kThreads = 128;  // small: co-resides with a GEMM CTA
  static constexpr int kVec = 4;  // float4 per thread per row chunk (when kS % 4 == 0)
  static constexpr bool kVector = kS % 4 == 0;
  static constexpr int kPerBlock = kVector ? kThreads * kVec * 4 : kThreads * kVec;
  static constexpr int kBlocksPerRow = (kS + kPerBlock - 1) / kPerBlock;
  static_assert(Cfg::kGroups > 0 && Cfg::kC % Cfg::kGroups == 0, "gn_apply: needs group_norm");
};

template <class Cfg, int kTiles, int kBN = Cfg::kC>
__device__ __forceinline__ void gn_finalize_body(const float* __restrict__ partials,
                                                 float* __restrict__ stats) {
  __shared__ Moments scratch[32];
  constexpr int kCg = Cfg::kC / Cfg::kGroups;
  constexpr int kParts = (int)geom::IgemmGroupParts(Cfg::kC, Cfg::kGroups, kBN);
  const int seg = blockIdx.x;  // n*G + g
  const int parts = (int)geom::IgemmGroupPartsOf(seg % Cfg::kGroups, kCg, kBN);
  const float* p = partials + (long long)seg * kParts * kTiles * 3;
  Moments m = moments_empty();
  for (int i = threadIdx.x; i < parts * kTiles; i += blockDim.x) {
    Moments b;
    b.count = p[i * 3];
    b.mean = p[i * 3 + 1];
    b.m2 = p[i * 3 + 2];
    m = moments_merge(m, b);
  }
  m = block_reduce_moments(m, scratch);
  if (threadIdx.x == 0) {
    const float var = m.count > 0.f ? m.m2 / m.count : 0.f;  // biased, as PyTorch
    stats[seg * 2] = m.mean;
    stats[seg * 2 + 1] = 1.f / sqrtf(var + Cfg::kEps);
  }
}

namespace gna {
// Four consecutive values of a row, stored as T.
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
template <class T>
__device__ __forceinline__ void store4(T* p, float4 v) {
  const unsigned lo = (unsigned)from_f32<T>(v.x).bits | ((unsigned)from_f32<T>(v.y).bits << 16);
  const unsigned hi = (unsigned)from_f32<T>(v.z).bits | ((unsigned)from_f32<T>(v.w).bits << 16);
  *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
}
}  // namespace gna

// y[n,c,:] = post((src - mean) * rstd * gamma[c] + beta[c]): src is float (the pre-norm
// values), y is ElemT<Cfg> (the same memory as src for f32 chains: in place).
template <class Cfg, class TOut>
__device__ __forceinline__ void gn_apply_rows(const ElemT<Cfg>* __restrict__ gamma,
                                              const ElemT<Cfg>* __restrict__ beta,
                                              const float* __restrict__ stats, const float* src,
                                              TOut* y) {
  using A = GnApply<Cfg>;
  const int row = blockIdx.y;  // n*kC + c
  const int c = row % Cfg::kC, n = row / Cfg::kC;
  const int seg = n * Cfg::kGroups + c / (Cfg::kC / Cfg::kGroups);
  const float mean = stats[seg * 2], rstd = stats[seg * 2 + 1];
  const float sc = rstd * to_f32(gamma[c]);
  const float sh = to_f32(beta[c]) - mean * sc;
  const float* sr = src + (long long)row * A::kS;
  TOut* yr = y + (long long)row * A::kS;
  if constexpr (A::kVector) {
    const float4* s4 = reinterpret_cast<const float4*>(sr);
    const int base = blockIdx.x * A::kThreads * A::kVec + threadIdx.x;
    float4 v[A::kVec];
#pragma unroll
    for (int k = 0; k < A::kVec; ++k) {
      const int i = base + k * A::kThreads;
      if (i < A::kS / 4) v[k] = s4[i];
    }
#pragma unroll
    for (int k = 0; k < A::kVec; ++k) {
      const int i = base + k * A::kThreads;
      if (i < A::kS / 4) {
        float4 o;
        o.x = Cfg::post(fmaf(v[k].x, sc, sh));
        o.y = Cfg::post(fmaf(v[k].y, sc, sh));
        o.z = Cfg::post(fmaf(v[k].z, sc, sh));
        o.w = Cfg::post(fmaf(v[k].w, sc, sh));
        gna::store4(yr + 4 * i, o);
      }
    }
  } else {
    const int base = blockIdx.x * A::kThreads * A::kVec + threadIdx.x;
#pragma unroll
    for (int k = 0; k < A::kVec; ++k) {
      const int i = base + k * A::kThreads;
      if (i < A::kS) yr[i] = store_as<TOut>(Cfg::post(fmaf(sr[i], sc, sh)));
    }
  }
}

// In place (f32 chains): y holds the pre-norm values and receives the output.
template <class Cfg>
__device__ __forceinline__ void gn_apply_body(const ElemT<Cfg>* __restrict__ gamma,
                                              const ElemT<Cfg>* __restrict__ beta,
                                              const float* __restrict__ stats, float* y) {
  gn_apply_rows<Cfg, float>(gamma, beta, stats, y, y);
}

// From a float workspace of pre-norm values into y of the chain's dtype (bf16/f16 chains).
template <class Cfg>
__device__ __forceinline__ void gn_apply_out_body(const ElemT<Cfg>* __restrict__ gamma,
                                                  const ElemT<Cfg>* __restrict__ beta,
                                                  const float* __restrict__ stats,
                                                  const float* __restrict__ pre,
                                                  ElemT<Cfg>* __restrict__ y) {
  gn_apply_rows<Cfg, ElemT<Cfg>>(gamma, beta, stats, pre, y);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the kernels with the default configuration.
extern "C" __global__ void __launch_bounds__(256)
    gn_finalize_selftest(const float* partials, float* stats) {
  fj::gn_finalize_body<fj::DefaultConfig, 7>(partials, stats);
}
// Groups across channel tiles (parts per group > 1).
extern "C" __global__ void __launch_bounds__(256)
    gn_finalize_parts_selftest(const float* partials, float* stats) {
  fj::gn_finalize_body<fj::DefaultConfig, 7, 3>(partials, stats);
}
extern "C" __global__ void __launch_bounds__(fj::GnApply<fj::DefaultConfig>::kThreads)
    gn_apply_selftest(const float* gamma, const float* beta, const float* stats, float* y) {
  fj::gn_apply_body<fj::DefaultConfig>(gamma, beta, stats, y);
}
namespace fj_selftest_gn_apply {
struct CfgBF16 : fj::DefaultConfig {
  using Elem = fj::bf16_t;
};
}  // namespace fj_selftest_gn_apply
extern "C" __global__ void __launch_bounds__(fj::GnApply<fj::DefaultConfig>::kThreads)
    gn_apply_out_selftest(const fj::bf16_t* gamma, const fj::bf16_t* beta, const float* stats,
                          const float* pre, fj::bf16_t* y) {
  fj::gn_apply_out_body<fj_selftest_gn_apply::CfgBF16>(gamma, beta, stats, pre, y);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_GN_APPLY_CUH_
