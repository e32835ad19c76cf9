// templates/mma_convt.cuh: conv_transpose3d with few input channels on tensor cores (mma.sync
// m16n8k16, fp16 inputs, fp32 accumulate; sm_80+), fp32-accurate through the F16x3 split (bf16 /
// f16 chains: one fp16 product), split by output phase; fused with the chain's ops, group_norm
// statistics and normalization (strategies mma-convt-recompute-normalize and mma-convt-direct,
// codegen/mma_convt_strategy.cc). The tensor-core counterpart of convt_group_norm.cuh's FFMA
// kernels, with the same passes and workspace:
//   1. mma_convt_moments     : the convolution + pre ops, per-block per-group moments (u too in a
//                              training forward), nothing else written;
//   2. group_norm_scale_shift (convt_group_norm.cuh): partials -> per (n, c) scale and shift;
//   3. mma_convt_norm_write  : the convolution again, y = post(pre(v) * a + b) written once.
//   or mma_convt_direct alone (no group_norm): y = pre(v) (and u) written once.
//
// Phases: output o = S*q + r takes tap k where (r + P - k*Dil) % S == 0, from input i = q +
// (r + P - k*Dil) / S (geometry.cuh ConvTTap / ConvTOff); no zero tap is visited.
// Block (b, n): sample n, output depths od = SD*qd + rd for qd in its chunk of ceil(D / SD) and
// every phase rd. The input depths qd + [min_off_d, max_off_d] sit in shared memory in a ring of
// kSlots planes (slot id % kSlots), CHANNELS-LAST with Cin padded to kCinP (a multiple of 4), as
// fp16 hi and lo parts of x*sx (sx a power of two per plane from its max|x|, so x*sx < 2^15), each
// row the points iw = min_off_w .. min_off_w + kWinP - 1 (zeros outside x).
// GEMM view, one warp per output row (od, oh), all SW w phases rw: M = q (ow = SW*q + rw; kMT
// tiles of 16, the last masked), N = channels (kNT tiles of 8, padded with zero weights), K =
// (kd, kh) taps of the row's phases (runtime loops) x (the phase rw's w taps, ci): kKS k16 steps,
// the phase's w-tap slot j = k / kCinP (slots past its taps: zero weights, finite reads). Physical
// K order as mma_conv_moments.cuh: thread t holds logical k {2t, 2t+1, 2t+8, 2t+9} = physical
// {4t .. 4t+3}, one 8-byte shared load of a row's A. Weights w*sw (sw a power of two from the
// global max|w|) as B fragments [kd][kh][rw][ks][nt][lane] uint4 {hi b0, hi b1, lo b0, lo b1}.
// Per k16 step: s = Alo*Bhi + Ahi*Blo + Ahi*Bhi in a zeroed short accumulator (the tensor cores
// truncate when adding), then acc += s * (1/(sx*sw)) with an FFMA; bf16/f16: s = Ahi*Bhi.
// Epilogue: moments from the fragments (pre(acc + bias), Chan merges in a fixed order); y and u
// through the warp's row buffer (all channels of the row, float), then coalesced streaming stores,
// one lane per output point.
//
// Host-side contract (launch in this order on one stream):
//   1. mma_convt_moments<Cfg, Tune>(x, weight, bias, partials, u):
//        grid = dim3(Tune::kStatBlocksPerSample, Cfg::kN), block = dim3(32 * Tune::kWarps),
//        dynamic shared memory MmaConvTGeom<Cfg, Tune>::kSharedBytes exactly (geometry.cuh
//        MmaConvTOf; the launcher raises the limit over 48 KiB);
//        reads x [N,Cin,Din,Hin,Win], weight [Cin,C,KD,KH,KW], bias [C];
//        writes partials: kN * kStatBlocksPerSample * kGroups fj::Moments, [N][blocks][G], every
//        entry (a block with no rows writes count 0); with u not null (the training forward)
//        every element of u [N,C,D,H,W] as f32 conv_transpose3d + bias.
//   2. group_norm_scale_shift<Cfg, Tune>(partials, gamma, beta, scale_shift, stats)
//      (convt_group_norm.cuh; stats, the saved group statistics, in a training forward).
//   3. mma_convt_norm_write<Cfg, Tune>(x, weight, bias, scale_shift, y): grid = dim3(Tune::
//        kWriteBlocksPerSample, Cfg::kN), the same block and shared memory; reads scale_shift
//        [N][C] float2; writes every element of y [N,C,D,H,W].
//   or mma_convt_direct<Cfg, Tune>(x, weight, bias, y, u): launched as 3 (no workspace); writes
//        every element of y and, with u not null, of u.
//   x, weight, bias and y are of the chain's element type ElemT<Cfg> (widened as loaded, y rounded
//   once); statistics in f32.
// Requirements (static_assert): sm_80+, kProducer == kConvTranspose3d, kBias, kC <= 32, kCin <=
// 16, kKS <= 4, SW * kMT * kNT * 4 <= 64 accumulators, shared memory within the architecture's
// opt-in limit; kGroups > 0 for passes 1 and 3, kGroups == 0 and no mean for the direct kernel.
#ifndef FUSEJIT_TEMPLATES_MMA_CONVT_CUH_
#define FUSEJIT_TEMPLATES_MMA_CONVT_CUH_

#include "common.cuh"
#include "convt_group_norm.cuh"  // group_norm_scale_shift, convt_store
#include "default_config.cuh"    // enums; include-guarded
#include "geometry.cuh"
#include "mma_conv_moments.cuh"  // mmm:: helpers (f16 split, mma16816, block_max)
#include "moments_util.cuh"

namespace fj {

// Default tuning (the generator passes its own struct with the same fields).
struct MmaConvTDefaultTune {
  static constexpr int kWarps = 8;
  static constexpr int kMinBlocksPerSM = 2;
  static constexpr int kStatBlocksPerSample = 2;
  static constexpr int kWriteBlocksPerSample = 2;
};

enum MmaConvTMode { kMmaConvTMoments = 0, kMmaConvTNormalize = 1, kMmaConvTDirect = 2 };

template <class Cfg, class Tune>
struct MmaConvTGeom {
  static constexpr int kThreads = 32 * Tune::kWarps;
  static constexpr geom::MmaConvT kG =
      geom::MmaConvTOf(Cfg::kCin, Cfg::kHin, Cfg::kC, Cfg::kW, Cfg::kKD, Cfg::kKH, Cfg::kKW,
                       Cfg::kSD, Cfg::kSW, Cfg::kPD, Cfg::kPW, Cfg::kDilD, Cfg::kDilW, Tune::kWarps,
                       /*split=*/is_same_v<ElemT<Cfg>, float>);
  static constexpr long long kSharedBytes = kG.shared_bytes;
};

namespace mct {

// geometry.cuh's ConvTTap / ConvTOff for device code (geometry.cuh has no CUDA keywords).
__device__ __forceinline__ bool tap(int r, int k, int p, int dil, int s) {
  return ((r + p - k * dil) % s + s) % s == 0;
}
__device__ __forceinline__ int off(int r, int k, int p, int dil, int s) {
  return (r + p - k * dil) / s;
}

// The j-th tap (kernel index) of dimension phase r, or -1 when the phase has fewer taps.
__device__ __forceinline__ int nth_tap(int r, int j, int K, int P, int dil, int S) {
  for (int k = 0; k < K; ++k) {
    if (!tap(r, k, P, dil, S)) continue;
    if (j-- == 0) return k;
  }
  return -1;
}

// Blocks per sample of the pass (the direct plan's tune has no kStatBlocksPerSample).
template <class Tune, int kMode>
__device__ constexpr int blocks_per_sample() {
  if constexpr (kMode == kMmaConvTMoments) {
    return Tune::kStatBlocksPerSample;
  } else {
    return Tune::kWriteBlocksPerSample;
  }
}

}  // namespace mct

// The moments pass's end: each thread's running channel moments (run_*) merged over lanes of the
// same t (same channels) in a fixed tree, then over warps and the group's channels in a fixed
// order, into partials [n][blockIdx.x][group]. All threads of the block (barrier inside).
template <class Cfg, class Tune, int NT>
__device__ __forceinline__ void mma_convt_merge(float run_n, float (&run_m)[2 * NT],
                                                float (&run_q)[2 * NT], float* s_red,
                                                Moments* __restrict__ partials) {
  constexpr int CP = 8 * NT, C = Cfg::kC;
  constexpr int kWarps = Tune::kWarps, kThreads = 32 * kWarps, BPS = Tune::kStatBlocksPerSample;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n = blockIdx.y;
  fragment_moments_to_shared<NT>(run_n, run_m, run_q, s_red, CP);
  __syncthreads();
  constexpr int Gn = Cfg::kGroups > 0 ? Cfg::kGroups : 1, CPG = C / Gn;
  for (int gr = tid; gr < Gn; gr += kThreads) {
    float cn = 0.f, cm = 0.f, cq = 0.f;
    for (int w = 0; w < kWarps; ++w)  // fixed order
      for (int c = gr * CPG; c < (gr + 1) * CPG; ++c) {
        const float* const r = s_red + (w * CP + c) * 3;
        const float wb = chan_weight(cn, r[0]);
        chan_merge_w(cm, cq, cn, r[1], r[2], wb);
        cn += r[0];
      }
    partials[((size_t)n * BPS + blockIdx.x) * Gn + gr] = Moments{cn, cm, cq};
  }
}

template <class Cfg, class Tune, int kMode>
__device__ __forceinline__ void mma_convt_body(const ElemT<Cfg>* __restrict__ x,
                                               const ElemT<Cfg>* __restrict__ weight,
                                               const ElemT<Cfg>* __restrict__ bias,
                                               const float2* __restrict__ scale_shift,
                                               Moments* __restrict__ partials,
                                               float* __restrict__ u, ElemT<Cfg>* __restrict__ y) {
  using Geo = MmaConvTGeom<Cfg, Tune>;
  constexpr geom::MmaConvT kG = Geo::kG;
  static_assert(Cfg::kProducer == kConvTranspose3d, "mma_convt: the producer must be convT");
  static_assert(Cfg::kBias, "mma_convt: needs a bias");
  static_assert(Cfg::kC <= 32 && Cfg::kCin <= 16, "mma_convt: at most 32 outputs, 16 inputs");
  static_assert(kG.ks <= 4, "mma_convt: a phase's w taps x Cin (padded to 4) at most 64");
  static_assert(kG.accumulators <= 64, "mma_convt: SW * kMT * kNT * 4 at most 64 accumulators");
  static_assert(Tune::kWarps >= 1 && Tune::kWarps <= 32, "mma_convt: 1..32 warps");
  static_assert(kG.shared_bytes <= kMmaMomentsSharedLimit,
                "mma_convt: dynamic shared memory over the architecture's limit");
  static_assert(kMode == kMmaConvTDirect ? (Cfg::kGroups == 0 && Cfg::kMean == kNoMean)
                                         : (Cfg::kGroups > 0 && Cfg::kMean == kNoMean),
                "mma_convt: group_norm (passes 1, 3) or elementwise ops only (direct)");
  constexpr int C = Cfg::kC, CP = (int)kG.cpad, NT = (int)kG.nt, MT = (int)kG.mt;
  constexpr int KS = (int)kG.ks, CinP = (int)kG.cinp, Slots = (int)kG.slots;
  constexpr int KD = Cfg::kKD, KH = Cfg::kKH, KW = Cfg::kKW, Cin = Cfg::kCin;
  constexpr int SD = Cfg::kSD, SH = Cfg::kSH, SW = Cfg::kSW;
  constexpr int Din = Cfg::kDin, Hin = Cfg::kHin, Win = Cfg::kWin;
  constexpr int D = Cfg::kD, H = Cfg::kH, W = Cfg::kW;
  constexpr int kPlane = Hin * Win;
  constexpr int kWarps = Tune::kWarps, kThreads = Geo::kThreads;
  constexpr int BPS = mct::blocks_per_sample<Tune, kMode>();
  constexpr bool kOneTerm = !is_same_v<ElemT<Cfg>, float>;  // see mma_conv_moments.cuh

  extern __shared__ __align__(16) unsigned char fj_mma_convt_smem[];
  unsigned char* const smem = fj_mma_convt_smem;
  const uint4* const s_b = reinterpret_cast<const uint4*>(smem);
  float2* const s_ab = reinterpret_cast<float2*>(smem + kG.b_bytes);  // [CP] scale, shift
  float* const s_bias = reinterpret_cast<float*>(s_ab + CP);          // [CP]
  float* const s_inv = s_bias + CP;                                   // [Slots]
  float* const s_red = s_inv + Slots;                                 // [warps][CP][3]
  float* const s_max = s_red + kWarps * CP * 3;                       // [32]
  unsigned char* const s_hi = smem + kG.hi_offset;
  unsigned char* const s_lo = smem + kG.lo_offset;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int n = blockIdx.y;
  float* const s_row = reinterpret_cast<float*>(smem + kG.rows_offset) + warp * C * kG.pitch;

  // ---- weights: scale, B fragments, bias, scale/shift ----
  constexpr int kWN = Cin * C * KD * KH * KW;
  float mw = 0.f;
  for (int i = tid; i < kWN; i += kThreads) mw = fmaxf(mw, fabsf(ldg_f32(weight + i)));
  const float sw = mmm::scale_for(mmm::block_max(mw, s_max));
  {
    uint4* const sb = reinterpret_cast<uint4*>(smem);
    for (int e = tid; e < (int)kG.slices * NT * 32; e += kThreads) {
      const int l = e & 31, st = e >> 5;
      const int nt = st % NT, slice = st / NT;
      const int ks = slice % KS, r = slice / KS;
      const int rw = r % SW, khd = r / SW;
      const int kh = khd % KH, kd = khd / KH;
      const int co = nt * 8 + (l >> 2), tt = l & 3;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int q = ks * 16 + 4 * tt + j, ci = q % CinP;
        const int kw = mct::nth_tap(rw, q / CinP, KW, Cfg::kPW, Cfg::kDilW, SW);
        v[j] = (kw >= 0 && ci < Cin && co < C)
                   ? ldg_f32(weight + (((ci * C + co) * KD + kd) * KH + kh) * KW + kw) * sw
                   : 0.f;
      }
      uint2 hi, lo;
      mmm::split4(v, hi, lo);
      sb[e] = make_uint4(hi.x, hi.y, lo.x, lo.y);
    }
    for (int c = tid; c < CP; c += kThreads) {
      s_bias[c] = c < C ? ldg_f32(bias + c) : 0.f;
      if constexpr (kMode == kMmaConvTNormalize) {
        s_ab[c] = c < C ? scale_shift[(size_t)n * C + c] : make_float2(0.f, 0.f);
      }
    }
  }

  // Per-lane A offsets (halfs) of phase rw's k step ks within a staged row: the staged point of
  // q = 0 for this lane's w-tap slot, times kCinP, plus its first channel.
  int aoff[SW][KS];
#pragma unroll
  for (int rw = 0; rw < SW; ++rw)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int q = ks * 16 + 4 * t;
      const int kw = mct::nth_tap(rw, q / CinP, KW, Cfg::kPW, Cfg::kDilW, SW);
      const int off = kw >= 0 ? mct::off(rw, kw, Cfg::kPW, Cfg::kDilW, SW) : (int)kG.min_off_w;
      aoff[rw][ks] = (off - (int)kG.min_off_w) * CinP + q % CinP;
    }

  const ElemT<Cfg>* __restrict__ xn = x + (size_t)n * Cin * Din * kPlane;
  // Stage input plane id (0 <= id < Din) into its slot (all threads; barriers inside).
  auto stage_plane = [&](int id) {
    const int slot = id % Slots;
    const ElemT<Cfg>* __restrict__ xp = xn + (size_t)id * kPlane;
    float m = 0.f;
    for (int i = tid; i < Cin * kPlane; i += kThreads) {
      const int ci = i / kPlane, r = i - ci * kPlane;
      m = fmaxf(m, fabsf(ldg_f32(xp + (size_t)ci * Din * kPlane + r)));
    }
    const float sx = mmm::scale_for(mmm::block_max(m, s_max));
    if (tid == 0) s_inv[slot] = 1.f / (sx * sw);  // powers of two: exact
    unsigned char* const ph = s_hi + slot * kG.plane_bytes;
    unsigned char* const pl = s_lo + slot * kG.plane_bytes;
    for (int p = tid; p < Hin * (int)kG.winp; p += kThreads) {
      const int h = p / (int)kG.winp, iw = (int)kG.min_off_w + (p - h * (int)kG.winp);
      const bool ok = iw >= 0 && iw < Win;
#pragma unroll
      for (int c4 = 0; c4 < CinP / 4; ++c4) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int ci = c4 * 4 + k;
          v[k] =
              (ok && ci < Cin) ? ldg_f32(xp + (size_t)ci * Din * kPlane + h * Win + iw) * sx : 0.f;
        }
        uint2 hi, lo;
        mmm::split4(v, hi, lo);
        const int off = 2 * (p * CinP + c4 * 4);
        *reinterpret_cast<uint2*>(ph + off) = hi;
        if constexpr (!kOneTerm) *reinterpret_cast<uint2*>(pl + off) = lo;
      }
    }
  };

  float run_n = 0.f, run_m[2 * NT], run_q[2 * NT];
#pragma unroll
  for (int k = 0; k < 2 * NT; ++k) run_m[k] = run_q[k] = 0.f;

  constexpr int Dq = (D + SD - 1) / SD;
  constexpr int kChunk = (Dq + BPS - 1) / BPS;
  const int q0 = blockIdx.x * kChunk, q1 = min(Dq, q0 + kChunk);
  int top = -(1 << 30);  // the highest input depth staged so far
  for (int qd = q0; qd < q1; ++qd) {
    const int lo_id = qd + (int)kG.min_off_d, hi_id = lo_id + Slots - 1;
    for (int id = max(max(lo_id, top + 1), 0); id <= min(hi_id, Din - 1); ++id) stage_plane(id);
    top = hi_id;
    __syncthreads();
    float bch[2 * NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      bch[2 * nt] = s_bias[nt * 8 + 2 * t];
      bch[2 * nt + 1] = s_bias[nt * 8 + 2 * t + 1];
    }
#pragma unroll 1
    for (int unit = warp; unit < SD * H; unit += kWarps) {
      const int rd = unit / H, oh = unit - rd * H, od = SD * qd + rd;
      if (od >= D) continue;  // warp-uniform
      const int rh = oh % SH, qh = oh / SH;
      float acc[SW][MT][NT][4];
#pragma unroll
      for (int rw = 0; rw < SW; ++rw)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[rw][mt][nt][i] = 0.f;
#pragma unroll 1
      for (int kd = 0; kd < KD; ++kd) {
        if (!mct::tap(rd, kd, Cfg::kPD, Cfg::kDilD, SD)) continue;
        const int id = qd + mct::off(rd, kd, Cfg::kPD, Cfg::kDilD, SD);
        if (id < 0 || id >= Din) continue;
        const int slot = id % Slots;
        const float inv = s_inv[slot];
#pragma unroll 1
        for (int kh = 0; kh < KH; ++kh) {
          if (!mct::tap(rh, kh, Cfg::kPH, Cfg::kDilH, SH)) continue;
          const int ih = qh + mct::off(rh, kh, Cfg::kPH, Cfg::kDilH, SH);
          if (ih < 0 || ih >= Hin) continue;
          const int row = slot * (int)kG.plane_bytes + ih * (int)kG.row_halfs * 2;
          const unsigned char* const rhp = s_hi + row;
          const unsigned char* const rlp = s_lo + row;
#pragma unroll
          for (int rw = 0; rw < SW; ++rw)
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
              uint4 bf[NT];
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                bf[nt] = s_b[((((kd * KH + kh) * SW + rw) * KS + ks) * NT + nt) * 32 + lane];
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                const int o0 = 2 * ((mt * 16 + g) * CinP + aoff[rw][ks]);
                const int o1 = o0 + 2 * 8 * CinP;
                const uint2 h0 = *reinterpret_cast<const uint2*>(rhp + o0);
                const uint2 h1 = *reinterpret_cast<const uint2*>(rhp + o1);
                uint2 l0 = make_uint2(0u, 0u), l1 = l0;
                if constexpr (!kOneTerm) {
                  l0 = *reinterpret_cast<const uint2*>(rlp + o0);
                  l1 = *reinterpret_cast<const uint2*>(rlp + o1);
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                  float s[4] = {0.f, 0.f, 0.f, 0.f};
                  if constexpr (!kOneTerm) {
                    mmm::mma16816(s, l0.x, l1.x, l0.y, l1.y, bf[nt].x, bf[nt].y);  // lo * hi
                    mmm::mma16816(s, h0.x, h1.x, h0.y, h1.y, bf[nt].z, bf[nt].w);  // hi * lo
                  }
                  mmm::mma16816(s, h0.x, h1.x, h0.y, h1.y, bf[nt].x, bf[nt].y);  // hi * hi
#pragma unroll
                  for (int i = 0; i < 4; ++i)
                    acc[rw][mt][nt][i] = fmaf(s[i], inv, acc[rw][mt][nt][i]);
                }
              }
            }
        }
      }

      // y and u: v = acc + bias through the warp's row buffer (all channels of the row), then
      // channel by channel with lanes along w: coalesced streaming stores. (Stores straight from
      // the fragments, stride SW, took 0.90 ms against 0.71 for W1's write pass.)
      if (kMode != kMmaConvTMoments || u != nullptr) {  // warp-uniform
#pragma unroll
        for (int rw = 0; rw < SW; ++rw)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int ow = SW * (mt * 16 + g + 8 * hh) + rw;
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int c = nt * 8 + 2 * t + e;
                  if (ow < W && c < C) {
                    s_row[c * kG.pitch + ow] = acc[rw][mt][nt][2 * hh + e] + bch[2 * nt + e];
                  }
                }
            }
        __syncwarp();
        const size_t row0 = (((size_t)n * C) * D + od) * (size_t)(H * W) + (size_t)oh * W;
#pragma unroll 2
        for (int c = 0; c < C; ++c) {
          const size_t base = row0 + (size_t)c * D * H * W;
          const float* const src = s_row + c * kG.pitch;
          float2 ab = make_float2(0.f, 0.f);
          if constexpr (kMode == kMmaConvTNormalize) ab = s_ab[c];
#pragma unroll
          for (int w0 = 0; w0 < W; w0 += 32) {
            const int w = w0 + lane;
            if (w0 + 32 <= W || w < W) {
              const float v = src[w];
              if (u != nullptr) __stcs(u + base + w, v);
              if constexpr (kMode == kMmaConvTNormalize) {
                convt_store<true>(y + base + w, Cfg::post(fmaf(Cfg::pre(v), ab.x, ab.y)));
              } else if constexpr (kMode == kMmaConvTDirect) {
                convt_store<true>(y + base + w, Cfg::pre(v));
              }
            }
          }
        }
        __syncwarp();  // the row buffer is rewritten by the next unit
      }
      // Moments of pre(acc + bias) over the thread's valid points (ow = SW*q + rw < W, q = mt*16
      // + g (+8)); channels nt*8 + 2t + e (padding channels too; never written out).
      if constexpr (kMode == kMmaConvTMoments) {
        float cnt = 0.f;
#pragma unroll
        for (int rw = 0; rw < SW; ++rw)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) cnt += SW * (mt * 16 + g + 8 * hh) + rw < W ? 1.f : 0.f;
        if (cnt > 0.f) {
          const float inv = 1.f / cnt, wb = cnt / (run_n + cnt);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float s = 0.f;
#pragma unroll
              for (int rw = 0; rw < SW; ++rw)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                  for (int hh = 0; hh < 2; ++hh) {
                    const bool ok = SW * (mt * 16 + g + 8 * hh) + rw < W;
                    const float v = Cfg::pre(acc[rw][mt][nt][2 * hh + e] + bch[2 * nt + e]);
                    acc[rw][mt][nt][2 * hh + e] = v;
                    s += ok ? v : 0.f;
                  }
              const float tm = s * inv;
              float q = 0.f;
#pragma unroll
              for (int rw = 0; rw < SW; ++rw)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                  for (int hh = 0; hh < 2; ++hh) {
                    const bool ok = SW * (mt * 16 + g + 8 * hh) + rw < W;
                    const float dv = ok ? acc[rw][mt][nt][2 * hh + e] - tm : 0.f;
                    q = fmaf(dv, dv, q);
                  }
              chan_merge_w(run_m[2 * nt + e], run_q[2 * nt + e], run_n, tm, q, wb);
            }
          run_n += cnt;
        }
      }
    }
    __syncthreads();  // the next qd's staging overwrites a plane
  }
  if constexpr (kMode == kMmaConvTMoments) {
    mma_convt_merge<Cfg, Tune, NT>(run_n, run_m, run_q, s_red, partials);
  }
}

template <class Cfg, class Tune>
__device__ __forceinline__ void mma_convt_moments(const ElemT<Cfg>* __restrict__ x,
                                                  const ElemT<Cfg>* __restrict__ weight,
                                                  const ElemT<Cfg>* __restrict__ bias,
                                                  Moments* __restrict__ partials,
                                                  float* __restrict__ u = nullptr) {
  mma_convt_body<Cfg, Tune, kMmaConvTMoments>(x, weight, bias, nullptr, partials, u, nullptr);
}

template <class Cfg, class Tune>
__device__ __forceinline__ void mma_convt_norm_write(const ElemT<Cfg>* __restrict__ x,
                                                     const ElemT<Cfg>* __restrict__ weight,
                                                     const ElemT<Cfg>* __restrict__ bias,
                                                     const float2* __restrict__ scale_shift,
                                                     ElemT<Cfg>* __restrict__ y) {
  mma_convt_body<Cfg, Tune, kMmaConvTNormalize>(x, weight, bias, scale_shift, nullptr, nullptr, y);
}

template <class Cfg, class Tune>
__device__ __forceinline__ void mma_convt_direct(const ElemT<Cfg>* __restrict__ x,
                                                 const ElemT<Cfg>* __restrict__ weight,
                                                 const ElemT<Cfg>* __restrict__ bias,
                                                 ElemT<Cfg>* __restrict__ y,
                                                 float* __restrict__ u = nullptr) {
  mma_convt_body<Cfg, Tune, kMmaConvTDirect>(x, weight, bias, nullptr, nullptr, u, y);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with convt_group_norm.cuh's transposed default.
extern "C" __global__ void __launch_bounds__(32 * fj::MmaConvTDefaultTune::kWarps,
                                             fj::MmaConvTDefaultTune::kMinBlocksPerSM)
    mma_convt_moments_selftest(const float* x, const float* w, const float* b, fj::Moments* p,
                               float* u) {
  fj::mma_convt_moments<fj::DefaultConvTConfig, fj::MmaConvTDefaultTune>(x, w, b, p, u);
}
extern "C" __global__ void __launch_bounds__(32 * fj::MmaConvTDefaultTune::kWarps,
                                             fj::MmaConvTDefaultTune::kMinBlocksPerSM)
    mma_convt_norm_write_selftest(const float* x, const float* w, const float* b, const float2* s,
                                  float* y) {
  fj::mma_convt_norm_write<fj::DefaultConvTConfig, fj::MmaConvTDefaultTune>(x, w, b, s, y);
}
extern "C" __global__ void __launch_bounds__(32 * fj::MmaConvTDefaultTune::kWarps,
                                             fj::MmaConvTDefaultTune::kMinBlocksPerSM)
    mma_convt_direct_selftest(const float* x, const float* w, const float* b, float* y, float* u) {
  fj::mma_convt_direct<fj::DefaultConvTDirectConfig, fj::MmaConvTDefaultTune>(x, w, b, y, u);
}
#endif

#endif  // FUSEJIT_TEMPLATES_MMA_CONVT_CUH_
