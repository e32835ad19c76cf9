// templates/wgrad.cuh: the convolution weight gradient, a GEMM reduced over batch and space.
//
//   conv3d:           grad_w[co][ci][tap] = sum_{n,o} grad_u[n,co,o] * x[n,ci, o*s - p + tap*dil]
//   conv_transpose3d: grad_w[ci][co][tap] = sum_{n,i} x[n,ci,i] * grad_u[n,co, i*s - p + tap*dil]
//
// Both are grad_w[a][b][tap] = sum_{n,p} T[n,a,p] * S[n,b, p*s - pad + tap*dil] (zero outside S):
// T is the tensor on the grid the strided map starts from (kA channels), S the other (kB
// channels). GEMM rows: a (kA); columns: b*kKV + tap (kNcol, the weight's own layout); reduction:
// (n, p), kR = kN * |T grid|.
//
// FFMA with register tiles. Precision: each kBK-long run of products is summed in fp32, then added
// into double accumulators, so the error does not grow with kR (a seed's reduction is ~10^6-10^7
// long). The reduction is split into WgTune::kSplits chunks (grid z); each block writes its tile's
// double partials and wgrad_reduce_kernel sums the chunks in index order: deterministic.
#ifndef FUSEJIT_TEMPLATES_WGRAD_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_CUH_

#include "common.cuh"
#include "default_config.cuh"

namespace fj {

template <class Cfg>
struct WgGeom {
  static constexpr bool kConv = Cfg::kProducer == kConv3d;
  static constexpr int kA = kConv ? Cfg::kC : Cfg::kCin;
  static constexpr int kB = kConv ? Cfg::kCin : Cfg::kC;
  static constexpr int kTD = kConv ? Cfg::kD : Cfg::kDin;  // T's grid
  static constexpr int kTH = kConv ? Cfg::kH : Cfg::kHin;
  static constexpr int kTW = kConv ? Cfg::kW : Cfg::kWin;
  static constexpr int kQD = kConv ? Cfg::kDin : Cfg::kD;  // S's grid
  static constexpr int kQH = kConv ? Cfg::kHin : Cfg::kH;
  static constexpr int kQW = kConv ? Cfg::kWin : Cfg::kW;
  static constexpr int kPT = kTD * kTH * kTW;
  static constexpr int kKV = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static constexpr int kNcol = kB * kKV;
  static constexpr int kR = Cfg::kN * kPT;
};

// Grid (ceil(kNcol / kBN), ceil(kA / kBM), kSplits); block kThreads = (kBM/kTM) * (kBN/kTN).
// part: [kSplits][kA][kNcol] doubles.
template <class Cfg, class Tune>
__device__ void wgrad_partial_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                     double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  constexpr int BM = Tune::kBM, BN = Tune::kBN, BK = Tune::kBK, TM = Tune::kTM, TN = Tune::kTN;
  constexpr int kRowThreads = BM / TM, kColThreads = BN / TN;
  constexpr int kThreads = kRowThreads * kColThreads;
  static_assert(kThreads == Tune::kThreads, "thread count agrees with the tile");
  static_assert((BK * BN) % kThreads == 0, "whole S loads per thread");
  constexpr int kSLoads = BK * BN / kThreads;
  const float* __restrict__ T = G::kConv ? gu : x;
  const float* __restrict__ S = G::kConv ? x : gu;

  __shared__ float Ts[BK][BM];
  __shared__ float Ss[BK][BN];
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int m0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
  const int r_begin = blockIdx.z * Tune::kChunk;
  const int r_end = min(r_begin + Tune::kChunk, G::kR);

  // This thread's S load slots: fixed column (b, tap) and reduction offset rr per slot.
  int s_rr[kSLoads], s_cc[kSLoads], s_b[kSLoads], s_od[kSLoads], s_oh[kSLoads], s_ow[kSLoads];
  bool s_ok[kSLoads];
#pragma unroll
  for (int j = 0; j < kSLoads; ++j) {
    const int idx = tid + j * kThreads;
    s_rr[j] = idx % BK;
    s_cc[j] = idx / BK;
    const int col = c0 + s_cc[j];
    s_ok[j] = col < G::kNcol;
    const int b = col / G::kKV, tap = col % G::kKV;
    const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH, kw = tap % Cfg::kKW;
    s_b[j] = b;
    s_od[j] = kd * Cfg::kDilD - Cfg::kPD;
    s_oh[j] = kh * Cfg::kDilH - Cfg::kPH;
    s_ow[j] = kw * Cfg::kDilW - Cfg::kPW;
  }

  float acc[TM][TN];
  double accd[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      acc[i][j] = 0.f;
      accd[i][j] = 0.0;
    }
  }

  for (int r0 = r_begin; r0 < r_end; r0 += BK) {
    for (int idx = tid; idx < BK * BM; idx += kThreads) {
      const int rr = idx % BK, mm = idx / BK, r = r0 + rr, a = m0 + mm;
      float v = 0.f;
      if (r < r_end && a < G::kA) {
        const int n = r / G::kPT, p = r % G::kPT;
        v = T[(n * G::kA + a) * G::kPT + p];
      }
      Ts[rr][mm] = v;
    }
#pragma unroll
    for (int j = 0; j < kSLoads; ++j) {
      const int r = r0 + s_rr[j];
      float v = 0.f;
      if (s_ok[j] && r < r_end) {
        const int n = r / G::kPT, p = r % G::kPT;
        const int pd = p / (G::kTH * G::kTW), ph = (p / G::kTW) % G::kTH, pw = p % G::kTW;
        const int qd = pd * Cfg::kSD + s_od[j], qh = ph * Cfg::kSH + s_oh[j],
                  qw = pw * Cfg::kSW + s_ow[j];
        if (qd >= 0 && qd < G::kQD && qh >= 0 && qh < G::kQH && qw >= 0 && qw < G::kQW) {
          v = S[((n * G::kB + s_b[j]) * G::kQD + qd) * (G::kQH * G::kQW) + qh * G::kQW + qw];
        }
      }
      Ss[s_rr[j]][s_cc[j]] = v;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = Ts[k][ty + i * kRowThreads];
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = Ss[k][tx + j * kColThreads];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        accd[i][j] += acc[i][j];
        acc[i][j] = 0.f;
      }
    }
    __syncthreads();
  }

  double* out = part + static_cast<size_t>(blockIdx.z) * G::kA * G::kNcol;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int a = m0 + ty + i * kRowThreads;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int col = c0 + tx + j * kColThreads;
      if (a < G::kA && col < G::kNcol) out[static_cast<size_t>(a) * G::kNcol + col] = accd[i][j];
    }
  }
}

// grad_w[i] = sum over chunks of part[chunk][i], in chunk order. One thread per weight element.
template <class Cfg, class Tune>
__device__ void wgrad_reduce_kernel(const double* __restrict__ part, float* __restrict__ grad_w) {
  using G = WgGeom<Cfg>;
  constexpr int kTotal = G::kA * G::kNcol;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kTotal) return;
  double s = 0;
  for (int k = 0; k < Tune::kSplits; ++k) s += part[static_cast<size_t>(k) * kTotal + i];
  grad_w[i] = static_cast<float>(s);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): both kernels with the default configuration.
namespace fj_selftest {
struct WgSelfTune {
  static constexpr int kBM = 16, kBN = 64, kBK = 16, kTM = 2, kTN = 4, kThreads = 128;
  static constexpr int kSplits = 3, kChunk = 384;
};
extern "C" __global__ void wgrad_partial(const float* x, const float* gu, double* part) {
  fj::wgrad_partial_kernel<fj::DefaultConfig, WgSelfTune>(x, gu, part);
}
extern "C" __global__ void wgrad_reduce(const double* part, float* gw) {
  fj::wgrad_reduce_kernel<fj::DefaultConfig, WgSelfTune>(part, gw);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_CUH_
