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
// double partials and wgrad_reduce_kernel sums the chunks in a fixed order: deterministic.
#ifndef FUSEJIT_TEMPLATES_WGRAD_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "mma_tf32.cuh"
#include "wgrad_reduce.cuh"

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

// The staging both weight-gradient kernels share, for a block tile of BM rows x BN columns,
// kBK-long reduction steps and kThreads threads. Every load of a thread is at the same reduction
// offset tid % BK, so a thread decodes its r once per step; per column (b, tap) the channel offset
// and tap displacement are decoded once per block (Columns).
template <class Cfg, int BM, int BN, int BK, int kThreads>
struct WgStage {
  using G = WgGeom<Cfg>;
  static_assert(kThreads % BK == 0 && (BK * BN) % kThreads == 0, "whole loads per thread");
  static constexpr int kSLoads = BK * BN / kThreads;
  static constexpr int kTLoads = (BK * BM + kThreads - 1) / kThreads;
  static constexpr int kColStep = kThreads / BK;  // columns (and rows) between a thread's loads
  static constexpr int kQS = G::kQD * G::kQH * G::kQW;

  // colinfo[cc] for the block's columns c0 + cc: (b * kQS, the tap's d, h, w displacement);
  // b * kQS < 0: past the last column. All threads; the caller synchronizes after it.
  __device__ __forceinline__ static void Columns(int4* colinfo, int c0) {
    for (int cc = threadIdx.x; cc < BN; cc += kThreads) {
      const int col = c0 + cc, b = col / G::kKV, tap = col % G::kKV;
      const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH,
                kw = tap % Cfg::kKW;
      colinfo[cc] = make_int4(col < G::kNcol ? b * kQS : -1, kd * Cfg::kDilD, kh * Cfg::kDilH,
                              kw * Cfg::kDilW);
    }
  }

  // This thread's values of the step starting at r0 (reduction index r0 + tid % BK, zero past
  // r_end): sv[j] of S at column tid / BK + j * kColStep (gathered, zero outside S); tv[i] of T
  // at row m0 + (tid + i * kThreads) / BK (zero past the rows or the tile).
  __device__ __forceinline__ static void Load(const float* __restrict__ T,
                                              const float* __restrict__ S, const int4* colinfo,
                                              int r0, int r_end, int m0, float (&sv)[kSLoads],
                                              float (&tv)[kTLoads]) {
    const int tid = threadIdx.x, c_first = tid / BK;
    const int r = r0 + tid % BK;
    const bool ok = r < r_end;
    const int n = r / G::kPT, p = r % G::kPT;
    const int pd = p / (G::kTH * G::kTW), ph = (p / G::kTW) % G::kTH, pw = p % G::kTW;
    const int sbase = n * G::kB * kQS;
    const int qd0 = pd * Cfg::kSD - Cfg::kPD, qh0 = ph * Cfg::kSH - Cfg::kPH,
              qw0 = pw * Cfg::kSW - Cfg::kPW;
#pragma unroll
    for (int j = 0; j < kSLoads; ++j) {
      const int4 ci = colinfo[c_first + j * kColStep];
      const int qd = qd0 + ci.y, qh = qh0 + ci.z, qw = qw0 + ci.w;
      sv[j] = ok && ci.x >= 0 && qd >= 0 && qd < G::kQD && qh >= 0 && qh < G::kQH && qw >= 0 &&
                      qw < G::kQW
                  ? S[sbase + ci.x + (qd * G::kQH + qh) * G::kQW + qw]
                  : 0.f;
    }
    const int tbase = n * G::kA * G::kPT + p;
#pragma unroll
    for (int i = 0; i < kTLoads; ++i) {
      const int idx = tid + i * kThreads, a = m0 + idx / BK;
      tv[i] = ok && idx < BK * BM && a < G::kA ? T[tbase + a * G::kPT] : 0.f;
    }
  }
};

// Grid (ceil(kNcol / kBN), ceil(kA / kBM), kSplits); block kThreads = (kBM/kTM) * (kBN/kTN).
// part: [kSplits][kA][kNcol] doubles.
//
// Each kBK-step stages T[r0..r0+kBK) x [m0..m0+kBM) and the gathered S[r0..][c0..c0+kBN) in shared
// memory (WgStage). The next step's values are loaded into registers while the current step is
// computed (latency hidden without a second shared buffer). Thread (ty, tx) owns rows
// ty*4.. and columns tx*4 + g*(kBN/kTN*4) (groups of 4), read as float4.
template <class Cfg, class Tune>
__device__ void wgrad_partial_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                     double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  constexpr int BM = Tune::kBM, BN = Tune::kBN, BK = Tune::kBK, TM = Tune::kTM, TN = Tune::kTN;
  constexpr int kRowThreads = BM / TM, kColThreads = BN / TN;
  constexpr int kThreads = kRowThreads * kColThreads;
  constexpr int kGroups = TN / 4;               // float4 column groups per thread
  constexpr int kGroupStride = kColThreads * 4;  // columns between a thread's groups
  static_assert(kThreads == Tune::kThreads, "thread count agrees with the tile");
  static_assert(TM == 4 && TN % 4 == 0, "float4 shared-memory reads");
  using St = WgStage<Cfg, BM, BN, BK, kThreads>;
  constexpr int kSLoads = St::kSLoads, kTLoads = St::kTLoads, kColStep = St::kColStep;
  const float* __restrict__ T = G::kConv ? gu : x;
  const float* __restrict__ S = G::kConv ? x : gu;

  // Rows padded by 4 floats: the stores (consecutive threads at consecutive k) spread over banks.
  __shared__ __align__(16) float Ts[BK][BM + 4];
  __shared__ __align__(16) float Ss[BK][BN + 4];
  __shared__ int4 colinfo[BN];  // (b * kQS, tap's d, h, w displacement); b * kQS < 0: no column
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int rr = tid % BK, c_first = tid / BK;
  const int m0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
  const int r_begin = blockIdx.z * Tune::kChunk;
  const int r_end = min(r_begin + Tune::kChunk, G::kR);

  St::Columns(colinfo, c0);
  __syncthreads();

  float sv[kSLoads], tv[kTLoads];
  auto load = [&](int r0) { St::Load(T, S, colinfo, r0, r_end, m0, sv, tv); };

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

  if (r_begin < r_end) load(r_begin);
  for (int r0 = r_begin; r0 < r_end; r0 += BK) {
#pragma unroll
    for (int j = 0; j < kSLoads; ++j) Ss[rr][c_first + j * kColStep] = sv[j];
#pragma unroll
    for (int i = 0; i < kTLoads; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < BK * BM) Ts[rr][idx / BK] = tv[i];
    }
    __syncthreads();
    if (r0 + BK < r_end) load(r0 + BK);  // in flight while this step is computed
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 t = *reinterpret_cast<const float4*>(&Ts[k][ty * 4]);
      const float av[4] = {t.x, t.y, t.z, t.w};
      float bv[TN];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const float4 u = *reinterpret_cast<const float4*>(&Ss[k][tx * 4 + g * kGroupStride]);
        bv[g * 4] = u.x;
        bv[g * 4 + 1] = u.y;
        bv[g * 4 + 2] = u.z;
        bv[g * 4 + 3] = u.w;
      }
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
    const int a = m0 + ty * TM + i;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int col = c0 + tx * 4 + (j / 4) * kGroupStride + j % 4;
      if (a < G::kA && col < G::kNcol) out[static_cast<size_t>(a) * G::kNcol + col] = accd[i][j];
    }
  }
}

namespace wg {
// v = hi + lo for the 3xTF32 products. hi: v rounded to TF32 (nearest, ties away: cvt.rna's
// result for finite v, with two integer operations, where the conversion instruction runs at a
// quarter of their rate). lo: the exact remainder, whose low 13 bits the tensor cores ignore
// (truncated: an error of at most 2^-21 |v|, against 2^-22 rounded). A NaN v may give hi = -0;
// lo is then NaN, so NaN still propagates.
__device__ __forceinline__ void split(float v, unsigned& hi, unsigned& lo) {
  hi = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(v - __uint_as_float(hi));
}
// Shared-memory column of (row r, column c) in a row of a multiple of 8 columns: the column XOR
// (r / 4) % 8, so that a warp storing one column of 32 rows (pitch = 8 mod 32 floats) and a warp
// reading an mma fragment (rows k..k+3 or k+4..k+7, 8 consecutive columns) both hit 32 banks.
__device__ __forceinline__ int swz(int r, int c) { return c ^ ((r >> 2) & 7); }
}  // namespace wg

// A warp's accumulators in the tensor-core weight-gradient kernels: MI x NI mma tiles of 16 x 8.
// A k-step's products are summed in fp32 (f), then added into double (d) by flush().
template <int MI, int NI>
struct WgAcc {
  float f[MI][NI][4];
  double d[MI][NI][4];

  // fn(mi, ni, e) for every accumulator, unrolled.
  template <class F>
  __device__ __forceinline__ static void each(F fn) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) fn(mi, ni, e);
  }
  __device__ __forceinline__ void zero() {
    each([&](int mi, int ni, int e) {
      f[mi][ni][e] = 0.f;
      d[mi][ni][e] = 0.0;
    });
  }
  __device__ __forceinline__ void flush() {
    each([&](int mi, int ni, int e) {
      d[mi][ni][e] += f[mi][ni][e];
      f[mi][ni][e] = 0.f;
    });
  }
  // Writes d into out [rows][cols]: element e of tile (mi, ni) at row row0 + mi * 16 + g (+8
  // for e >= 2) and column col0(ni) + 2t (+1 for odd e), g = lane / 4, t = lane % 4; nothing
  // past the edges.
  template <class Col0>
  __device__ __forceinline__ void store(double* __restrict__ out, int rows, int cols, int row0,
                                        Col0 col0) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    each([&](int mi, int ni, int e) {
      const int a = row0 + mi * 16 + g + (e >= 2 ? 8 : 0);
      const int col = col0(ni) + 2 * t + (e & 1);
      if (a < rows && col < cols) out[static_cast<size_t>(a) * cols + col] = d[mi][ni][e];
    });
  }
};

// The warp layout of wgrad_mma_partial_kernel's BM x BN block tile (8 warps): two rows of warps
// for 64-row tiles, one otherwise; each warp owns kMI x kNI mma tiles of 16 x 8.
template <int BM, int BN>
struct WgMmaWarps {
  static_assert(BM == 16 || BM == 32 || BM == 64, "wgrad_mma: 16, 32 or 64 rows per block");
  static constexpr int kRows = BM == 64 ? 2 : 1;  // warps along the rows
  static constexpr int kCols = 8 / kRows;         // warps along the columns
  static constexpr int kMI = BM / kRows / 16;
  static constexpr int kNI = BN / kCols / 8;
  static_assert(kNI >= 1 && kNI * 8 * kCols == BN, "wgrad_mma: columns a multiple of 8 per warp");
  static_assert(kMI * kNI <= 8, "wgrad_mma: at most 8 mma tiles per warp (registers)");
};

// The same GEMM, staging and partials as wgrad_partial_kernel, the products on the tensor cores
// (mma.sync m16n8k8 TF32, sm_80 and later). Tune::kPrec3 = 1: fp32-accurate (3xTF32: both
// operands split into TF32 big and small parts, three products, the small ones first); 0: one
// TF32 product (precision tf32 asked for). Each kBK-step's products are summed by the tensor cores
// in fp32, then added into double accumulators, as the FFMA kernel does.
// Tune: kBM 16, 32 or 64; kBN a multiple of 64 (8 warps, WgMmaWarps); kBK 32; kThreads 256;
// kSplits, kChunk (a multiple of kBK) as for wgrad_partial_kernel; same grid and part.
template <class Cfg, class Tune>
__device__ void wgrad_mma_partial_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                         double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  constexpr int BM = Tune::kBM, BN = Tune::kBN, BK = 32, kThreads = 256;
  static_assert(Tune::kBK == BK && Tune::kThreads == kThreads,
                "wgrad_mma: k-steps of 32, 256 threads");
  static_assert(Tune::kChunk % BK == 0, "wgrad_mma: chunks of whole k-steps");
  using Wp = WgMmaWarps<BM, BN>;
  constexpr int MI = Wp::kMI, NI = Wp::kNI;
  using St = WgStage<Cfg, BM, BN, BK, kThreads>;
  constexpr int kSLoads = St::kSLoads, kTLoads = St::kTLoads;
  constexpr int kColStep = St::kColStep;     // columns (and rows) between a thread's loads
  // Pitches 8 or 24 mod 32 floats: with wg::swz, a warp's stores and fragment reads hit 32 banks.
  constexpr int kTP = BM + 8, kSP = BN + 8;
  static_assert(kTP % 16 == 8 && kSP % 16 == 8, "wgrad_mma: pitches 8 mod 16 floats");
  static_assert(kTLoads * kThreads == BK * BM, "wgrad_mma: whole T loads per thread");
  const float* __restrict__ T = G::kConv ? gu : x;
  const float* __restrict__ S = G::kConv ? x : gu;

  __shared__ __align__(16) float Ts[BK * kTP];
  __shared__ __align__(16) float Ss[BK * kSP];
  __shared__ int4 colinfo[BN];  // (b * kQS, tap's d, h, w displacement); b * kQS < 0: no column
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / Wp::kCols, wc = warp % Wp::kCols, g = lane >> 2, t = lane & 3;
  const int rr = tid % BK, c_first = tid / BK;
  const int m0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
  const int r_begin = blockIdx.z * Tune::kChunk;
  const int r_end = min(r_begin + Tune::kChunk, G::kR);

  St::Columns(colinfo, c0);
  __syncthreads();

  float sv[kSLoads], tv[kTLoads];
  auto load = [&](int r0) { St::Load(T, S, colinfo, r0, r_end, m0, sv, tv); };

  WgAcc<MI, NI> acc;
  acc.zero();

  if (r_begin < r_end) load(r_begin);
  for (int r0 = r_begin; r0 < r_end; r0 += BK) {
#pragma unroll
    for (int j = 0; j < kSLoads; ++j) {
      const int c = c_first + j * kColStep;
      Ss[rr * kSP + wg::swz(rr, c)] = sv[j];
    }
#pragma unroll
    for (int i = 0; i < kTLoads; ++i) {
      const int a = c_first + i * kColStep;
      Ts[rr * kTP + wg::swz(rr, a)] = tv[i];
    }
    __syncthreads();
    if (r0 + BK < r_end) load(r0 + BK);  // in flight while this step is computed
#pragma unroll
    for (int k8 = 0; k8 < BK; k8 += 8) {
      const int ka = k8 + t, kb = k8 + t + 4;
      unsigned ah[MI][4], al[MI][4], bh[NI][2], bl[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int row = wr * (MI * 16) + mi * 16 + g;
        const float v[4] = {Ts[ka * kTP + wg::swz(ka, row)], Ts[ka * kTP + wg::swz(ka, row + 8)],
                            Ts[kb * kTP + wg::swz(kb, row)], Ts[kb * kTP + wg::swz(kb, row + 8)]};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (Tune::kPrec3) {
            wg::split(v[e], ah[mi][e], al[mi][e]);
          } else {
            ah[mi][e] = tc_tf32(v[e]);
          }
        }
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = wc * (NI * 8) + ni * 8 + g;
        const float v[2] = {Ss[ka * kSP + wg::swz(ka, col)], Ss[kb * kSP + wg::swz(kb, col)]};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if constexpr (Tune::kPrec3) {
            wg::split(v[e], bh[ni][e], bl[ni][e]);
          } else {
            bh[ni][e] = tc_tf32(v[e]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          if constexpr (Tune::kPrec3) {
            tc_mma(acc.f[mi][ni], al[mi], bh[ni]);
            tc_mma(acc.f[mi][ni], ah[mi], bl[ni]);
          }
          tc_mma(acc.f[mi][ni], ah[mi], bh[ni]);
        }
      }
    }
    acc.flush();
    __syncthreads();
  }

  acc.store(part + static_cast<size_t>(blockIdx.z) * G::kA * G::kNcol, G::kA, G::kNcol,
            m0 + wr * (MI * 16), [&](int ni) { return c0 + wc * (NI * 8) + ni * 8; });
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): both kernels with the default configuration.
namespace fj_selftest {
struct WgSelfTune {
  static constexpr int kBM = 16, kBN = 128, kBK = 16, kTM = 4, kTN = 4, kThreads = 128;
  static constexpr int kSplits = 3, kChunk = 384;
};
extern "C" __global__ void wgrad_partial(const float* x, const float* gu, double* part) {
  fj::wgrad_partial_kernel<fj::DefaultConfig, WgSelfTune>(x, gu, part);
}
struct WgMmaSelfTune {
  static constexpr int kBM = 64, kBN = 128, kBK = 32, kTM = 4, kTN = 4, kThreads = 256;
  static constexpr int kSplits = 3, kChunk = 384, kPrec3 = 1;
};
extern "C" __global__ void wgrad_mma_partial(const float* x, const float* gu, double* part) {
  fj::wgrad_mma_partial_kernel<fj::DefaultConfig, WgMmaSelfTune>(x, gu, part);
}
// The few-row tiles: one row of warps, 16 rows x 192 columns and 32 x 64 in TF32.
struct WgMma16SelfTune : WgMmaSelfTune {
  static constexpr int kBM = 16, kBN = 192;
};
extern "C" __global__ void wgrad_mma16_partial(const float* x, const float* gu, double* part) {
  fj::wgrad_mma_partial_kernel<fj::DefaultConfig, WgMma16SelfTune>(x, gu, part);
}
struct WgMma32SelfTune : WgMmaSelfTune {
  static constexpr int kBM = 32, kBN = 64, kPrec3 = 0;
};
extern "C" __global__ void wgrad_mma32_partial(const float* x, const float* gu, double* part) {
  fj::wgrad_mma_partial_kernel<fj::DefaultConfig, WgMma32SelfTune>(x, gu, part);
}
extern "C" __global__ void wgrad_reduce(const double* part, float* gw) {
  fj::wgrad_reduce_kernel<fj::DefaultConfig, WgSelfTune>(part, gw);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_CUH_
