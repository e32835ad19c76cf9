// templates/mma_conv_moments.cuh: conv3d on tensor cores (mma.sync m16n8k16, fp16 inputs, fp32
// accumulate; sm_80+), fp32-accurate through the F16x3 split, fused with the chain's pre-norm
// elementwise ops, producing per-block per-channel moments (strategy "mma-moments-mean",
// codegen/mma_moments_strategy.cc). Same output as direct_conv_moments.cuh's conv_moments, read
// by moments_mean.cuh's moments_mean_finalize: chains "conv3d | ew* | group_norm | mean" with few
// input channels (seeds W2, W4).
//
// Kernel: mma_conv_moments<Cfg, Tune>(x, weight, bias, partials, u)
//   Block (b, n) computes the output planes od in [b*kChunk, min(kD, (b+1)*kChunk)) of sample n.
//   Input staging: the input planes id that the current od needs (id = od*SD - PD + kd*DilD) sit
//   in shared memory, in a ring of kSlots = (KD-1)*DilD + 1 plane slots (slot id % kSlots; a
//   plane still needed by the next od stays), CHANNELS-LAST with Cin padded to kCinP (a multiple
//   of 4), as fp16 high and low parts of x*sx: hi = half(x*sx), lo = half(x*sx - hi), each row
//   of kWinP points starting at iw = -PW (points outside the input are zeros). sx is a power of
//   two chosen per plane from the plane's max|x| (block reduction), so x*sx < 2^15.
//   GEMM view, one warp per output row (od, oh): M = the row's points ow (kMT tiles of 16, the
//   last masked), N = channels (kNT tiles of 8), K = (kd, kh, kw, ci). For fixed (kd, kh) the
//   K slice (kw, ci) of output point ow is kw*kCinP + ci, padded to kKS*16 with ZERO weights
//   (the staged neighbours read there are finite). Physical K order inside a k16 step: thread t
//   (lane & 3) holds logical k {2t, 2t+1, 2t+8, 2t+9} = physical {4t .. 4t+3}, so its A
//   registers (a0, a2) of a row are one 8-byte shared load and its B registers are stored in
//   that order too (one 16-byte load gives b0, b1 of hi and lo).
//   Weights: w*sw, sw a power of two from the global max|w| (each block computes it), split
//   into fp16 hi/lo, in shared memory as B fragments [kd][kh][ks][nt][lane] uint4 {hi b0, hi b1,
//   lo b0, lo b1}.
//   Per (kd, kh, ks) and 16-point tile: s = Alo*Bhi + Ahi*Blo + Ahi*Bhi (three mma from a zeroed
//   short accumulator: the tensor cores truncate when adding, so the sums are kept short) then
//   acc += s * (1/(sx_plane*sw)) with an fp32 FFMA (round to nearest). bf16 / f16 chains: their
//   16-bit values are fp16 values once scaled (the low parts are zeros), so s = Ahi*Bhi alone.
//   Tune::kPack = 1 (no d/h padding): K packed over the whole kernel instead, in groups of 4
//   channels of one tap (kd, kh, kw): lane t of k16 step ks takes group 4 ks + t, reading its
//   own row/point (per-lane shared-memory offsets), kKSP = ceil(groups / 4) steps per row (W4:
//   7 instead of 9); the steps mix planes, so x has one scale per block, from max|x| over the
//   planes the block reads (read once at the start). Tune::kUnrollKH unrolls the kh loop (kPack
//   0) or the k-step loop (kPack 1).
//   Staging after a block's first od with SD == 1 (and DilD == 1 or KD == 1): the one new plane
//   is loaded into registers before the previous od's rows and converted after them.
//   Epilogue per row: pre(acc + bias) for the valid points (ow < kW), per-channel row mean/M2,
//   Chan-merged into the thread's running moments (2*kNT channels per thread, one count). At
//   the end lanes with the same channels merge (shfl, fixed order), then warps in warp order.
//
// Host-side contract:
//   grid  = dim3(Tune::kBlocksPerSample, Cfg::kN), block = dim3(32 * Tune::kWarps),
//   dynamic shared memory = MmaMomentsGeom<Cfg, Tune>::kSharedBytes bytes, exactly (the host
//           computes the same: kBBytes = KD*KH*kKS*kNT*512 of B fragments, then 4*kFloats
//           (kSlots inverse scales, kC biases, kWarps*kC*3 reduction, 32 max scratch) rounded up
//           to 16, then 2 * kSlots planes of kPlaneBytes = round16(2*Hin*kWinP*kCinP); over
//           48 KiB the launcher raises the kernel's limit). static_assert'ed <= the opt-in limit
//           per block of the architecture (227 KiB sm_90, 163 KiB sm_80/87, 99 KiB sm_86/89).
//   reads : x [N,Cin,Din,Hin,Win]; weight [C,Cin,KD,KH,KW], bias [C] (global pointers).
//   writes: partials, Cfg::kN * Tune::kBlocksPerSample * Cfg::kC fj::Moments, layout
//           [N][kBlocksPerSample][C], every entry each launch (a block with no planes writes
//           count 0); u, when not null (the training forward: codegen::SaveProducerOutput), the
//           convolution's output acc + bias (before the ops) as float [N][C][D][H][W], every
//           element.
//   next  : moments_mean.cuh's moments_mean_finalize<Cfg, Tune> (reads Tune::kBlocksPerSample).
//   Tune fields: kWarps, kMinBlocksPerSM (the wrapper's __launch_bounds__), kBlocksPerSample,
//   kUnrollKH, kPack (MmaMomentsDefaultTune).
// Requirements (static_assert): sm_80+, kProducer == kConv3d, kBias, kC % 8 == 0, kC <= 32,
//   kW <= 64 (kMT <= 4), KW*kCinP <= 64 (kKS <= 4), 1 <= kBlocksPerSample <= kD, 1 <= kWarps
//   <= 32, kUnrollKH >= 1, kPack 0 or 1 (1: kPD == kPH == 0, kKSP <= 16), shared memory as
//   above. Measured (H100, 2026-11-22, fusejit bench, L2 flushed): W2 1.245 ms (kUnrollKH 2),
//   W4 0.220 ms (kPack 1); conv_moments (FFMA) 1.981 and 0.286 ms. Stride, padding and dilation are
//   general.
#ifndef FUSEJIT_TEMPLATES_MMA_CONV_MOMENTS_CUH_
#define FUSEJIT_TEMPLATES_MMA_CONV_MOMENTS_CUH_

#include "common.cuh"
#include "default_config.cuh"  // enums; include-guarded
#include "geometry.cuh"
#include "moments_util.cuh"

namespace fj {

// Default tuning (the generator passes its own struct with the same fields).
struct MmaMomentsDefaultTune {
  static constexpr int kWarps = 8;            // warps per block
  static constexpr int kMinBlocksPerSM = 2;   // __launch_bounds__ second argument
  static constexpr int kBlocksPerSample = 2;  // grid.x: blocks sharing one sample (od chunks)
  static constexpr int kUnrollKH = 1;         // unroll factor of the kh loop (>= 1)
  static constexpr int kPack = 0;             // 1: K packed over (kd, kh, kw), one scale per block
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kMmaMomentsSharedLimit = 227 * 1024;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870)
constexpr int kMmaMomentsSharedLimit = 163 * 1024;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890)
constexpr int kMmaMomentsSharedLimit = 99 * 1024;
#else
constexpr int kMmaMomentsSharedLimit = 48 * 1024;
#endif

template <class Cfg, class Tune>
struct MmaMomentsGeom {
  static constexpr int kThreads = 32 * Tune::kWarps;
  // The shared-memory layout, computed by the same function as the host's launch (geometry.cuh).
  static constexpr geom::MmaMoments kG =
      geom::MmaMomentsOf(Cfg::kCin, Cfg::kHin, Cfg::kC, Cfg::kW, Cfg::kKD, Cfg::kKH, Cfg::kKW,
                         Cfg::kSW, Cfg::kDilD, Cfg::kDilW, Tune::kWarps, Tune::kPack != 0);
  static constexpr int kCinP = kG.cinp;
  static constexpr int kMT = kG.mt;    // m16 tiles per output row
  static constexpr int kNT = kG.nt;    // n8 tiles
  static constexpr int kKS = kG.ks;    // k16 steps per (kd, kh)
  static constexpr int kKWR = kG.kwr;  // kw columns read (>= KW)
  static constexpr int kWinP = kG.winp;
  static constexpr int kRowHalfs = kG.row_halfs;
  static constexpr int kPlaneHalfs = kG.plane_halfs;
  static constexpr int kPlaneBytes = kG.plane_bytes;
  static constexpr int kSlots = kG.slots;
  // Packed K (Tune::kPack): groups of 4 channels of one tap (kd, kh, kw), kKSP k16 steps of 4
  // groups for the whole kernel instead of kKS steps per (kd, kh).
  static constexpr int kGroups4 = kG.groups4;
  static constexpr int kKSP = kG.ksp;
  static constexpr int kSlices = kG.slices;
  static constexpr int kChunk = (Cfg::kD + Tune::kBlocksPerSample - 1) / Tune::kBlocksPerSample;
  static constexpr int kBBytes = kG.b_bytes;
  static constexpr int kFloatOffset = kBBytes;
  static constexpr int kFloats = kG.floats;
  static constexpr int kHiOffset = kG.hi_offset;
  static constexpr int kLoOffset = kG.lo_offset;
  static constexpr long long kSharedBytes = kG.shared_bytes;
  // Prefetch: with SD == 1 and DilD == 1 (or KD == 1) each od after a block's first needs one
  // new plane; its x values (kPrefetchRegs per thread) are loaded into registers before the
  // previous od's rows are computed, and converted after them (the loads' latency hidden).
  static constexpr int kPointsPerThread = (Cfg::kHin * Cfg::kWin + kThreads - 1) / kThreads;
  static constexpr int kPrefetchRegs = Cfg::kCin * kPointsPerThread;
  static constexpr bool kPrefetch =
      Cfg::kSD == 1 && (Cfg::kDilD == 1 || Cfg::kKD == 1) && kPrefetchRegs <= 32;
};

namespace mmm {

__device__ __forceinline__ unsigned short f16_rn(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}
__device__ __forceinline__ float f16_f32(unsigned short h) {
  float v;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(v) : "h"(h));
  return v;
}
// Power of two s with max_abs * s < 2^15 (fp16 highs below 65504), 1 for 0 or non-finite.
__device__ __forceinline__ float scale_for(float max_abs) {
  if (!(max_abs > 0.f) || !(max_abs < 3.0e38f)) return 1.f;
  int e;
  frexpf(max_abs, &e);  // max_abs < 2^e
  return ldexpf(1.f, 15 - e);
}
// hi and lo fp16 parts of 4 values, packed as two 32-bit words each.
__device__ __forceinline__ void split4(const float (&v)[4], uint2& hi, uint2& lo) {
  unsigned short h[4], l[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    h[k] = f16_rn(v[k]);
    l[k] = f16_rn(v[k] - f16_f32(h[k]));
  }
  hi = make_uint2(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16));
  lo = make_uint2(l[0] | ((unsigned)l[1] << 16), l[2] | ((unsigned)l[3] << 16));
}
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host never plans this kernel below sm_80
#endif
}
// Block-wide max, the same value in every thread. scratch: 32 floats. Contains two barriers.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();  // scratch is reused by the next call
  return m;
}

}  // namespace mmm

template <class Cfg, class Tune, bool kDirect>
__device__ __forceinline__ void mma_conv_body(const ElemT<Cfg>* __restrict__ x,
                                              const ElemT<Cfg>* __restrict__ weight,
                                              const ElemT<Cfg>* __restrict__ bias,
                                              Moments* __restrict__ partials, float* __restrict__ u,
                                              ElemT<Cfg>* __restrict__ y);

template <class Cfg, class Tune>
__device__ __forceinline__ void mma_conv_moments(const ElemT<Cfg>* __restrict__ x,
                                                 const ElemT<Cfg>* __restrict__ weight,
                                                 const ElemT<Cfg>* __restrict__ bias,
                                                 Moments* __restrict__ partials,
                                                 float* __restrict__ u = nullptr) {
  mma_conv_body<Cfg, Tune, false>(x, weight, bias, partials, u, nullptr);
}

// The direct plan (mma-direct: conv3d | ew*, no group_norm, no mean): the same convolution, and
// each row's y = pre(acc + bias) written in the chain's dtype (rounded once) instead of moments;
// u as in mma_conv_moments. Same launch as mma_conv_moments; no partials.
template <class Cfg, class Tune>
__device__ __forceinline__ void mma_conv_direct(const ElemT<Cfg>* __restrict__ x,
                                                const ElemT<Cfg>* __restrict__ weight,
                                                const ElemT<Cfg>* __restrict__ bias,
                                                ElemT<Cfg>* __restrict__ y, float* __restrict__ u) {
  static_assert(Cfg::kGroups == 0 && Cfg::kMean == kNoMean,
                "mma_conv_direct: elementwise ops only (all of them pre ops)");
  mma_conv_body<Cfg, Tune, true>(x, weight, bias, nullptr, u, y);
}

// The kernels' shared body: kDirect writes y (mma_conv_direct), else the moments.
template <class Cfg, class Tune, bool kDirect>
__device__ __forceinline__ void mma_conv_body(const ElemT<Cfg>* __restrict__ x,
                                              const ElemT<Cfg>* __restrict__ weight,
                                              const ElemT<Cfg>* __restrict__ bias,
                                              Moments* __restrict__ partials, float* __restrict__ u,
                                              ElemT<Cfg>* __restrict__ y) {
  using G = MmaMomentsGeom<Cfg, Tune>;
  static_assert(Cfg::kProducer == kConv3d, "mma_conv_moments: the producer must be conv3d");
  static_assert(Cfg::kBias, "mma_conv_moments: needs a bias");
  static_assert(Cfg::kC % 8 == 0 && Cfg::kC <= 32, "mma_conv_moments: kC a multiple of 8, <= 32");
  static_assert(G::kMT <= 4, "mma_conv_moments: output rows of at most 64 points");
  static_assert(G::kKS <= 4, "mma_conv_moments: KW * Cin (padded to 4) at most 64");
  static_assert(Tune::kBlocksPerSample >= 1 && Tune::kBlocksPerSample <= Cfg::kD,
                "mma_conv_moments: 1 <= kBlocksPerSample <= kD");
  static_assert(Tune::kWarps >= 1 && Tune::kWarps <= 32, "mma_conv_moments: 1..32 warps");
  static_assert(Tune::kUnrollKH >= 1, "mma_conv_moments: kUnrollKH >= 1");
  static_assert(Tune::kPack == 0 || (Tune::kPack == 1 && Cfg::kPD == 0 && Cfg::kPH == 0 &&
                                     G::kKSP <= 16),
                "mma_conv_moments: kPack 1 needs no d/h padding and at most 16 packed k steps");
  static_assert(G::kSharedBytes <= kMmaMomentsSharedLimit,
                "mma_conv_moments: dynamic shared memory over the architecture's limit");
  constexpr int C = Cfg::kC, NT = G::kNT, MT = G::kMT, KS = G::kKS, CinP = G::kCinP;
  constexpr int KD = Cfg::kKD, KH = Cfg::kKH, KW = Cfg::kKW, Cin = Cfg::kCin;
  constexpr int Din = Cfg::kDin, Hin = Cfg::kHin, Win = Cfg::kWin;
  constexpr int kPlane = Hin * Win;  // floats per (ci, id) plane of x
  // A bf16 / f16 chain's x and weights, scaled by powers of two, are fp16 values already (up to
  // the fp16 subnormals, which the low parts would lose too): their low parts are zeros, and
  // one hi * hi product per step gives the F16x3 sum.
  constexpr bool kOneTerm = !is_same_v<ElemT<Cfg>, float>;

  extern __shared__ __align__(16) unsigned char fj_mma_moments_smem[];
  unsigned char* const smem = fj_mma_moments_smem;
  const uint4* const s_b = reinterpret_cast<const uint4*>(smem);
  float* const s_inv = reinterpret_cast<float*>(smem + G::kFloatOffset);
  float* const s_bias = s_inv + G::kSlots;
  float* const s_red = s_bias + C;
  float* const s_max = s_red + Tune::kWarps * C * 3;
  unsigned char* const s_hi = smem + G::kHiOffset;
  unsigned char* const s_lo = smem + G::kLoOffset;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int n = blockIdx.y;

  // ---- weights: scale, B fragments, bias ----
  constexpr int kWN = C * Cin * KD * KH * KW;
  float mw = 0.f;
  for (int i = tid; i < kWN; i += G::kThreads) mw = fmaxf(mw, fabsf(ldg_f32(weight + i)));
  const float sw = mmm::scale_for(mmm::block_max(mw, s_max));
  {
    uint4* const sb = reinterpret_cast<uint4*>(smem);
    for (int e = tid; e < G::kSlices * NT * 32; e += G::kThreads) {
      const int l = e & 31, st = e >> 5;
      const int nt = st % NT, slice = st / NT;
      const int ks = slice % KS, khd = slice / KS;
      const int kh = khd % KH, kd = khd / KH;
      const int co = nt * 8 + (l >> 2), tt = l & 3;
      float v[4];
      if constexpr (Tune::kPack) {  // slice = packed step; group gi = slice*4 + tt
        const int gi = slice * 4 + tt, c4 = gi % (CinP / 4), r = gi / (CinP / 4);
        const int pkw = r % KW, pkh = (r / KW) % KH, pkd = r / (KW * KH);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int ci = c4 * 4 + j;
          v[j] = (gi < G::kGroups4 && ci < Cin)
                     ? ldg_f32(weight + (((co * Cin + ci) * KD + pkd) * KH + pkh) * KW + pkw) * sw
                     : 0.f;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int q = ks * 16 + 4 * tt + j, kw = q / CinP, ci = q % CinP;
          v[j] = (kw < KW && ci < Cin)
                     ? ldg_f32(weight + (((co * Cin + ci) * KD + kd) * KH + kh) * KW + kw) * sw
                     : 0.f;
        }
      }
      uint2 hi, lo;
      mmm::split4(v, hi, lo);
      sb[e] = make_uint4(hi.x, hi.y, lo.x, lo.y);
    }
    for (int c = tid; c < C; c += G::kThreads) s_bias[c] = ldg_f32(bias + c);
  }

  // Per-lane A offsets (halfs) of k step ks within a staged row: physical k = ks*16 + 4t.
  int aoff[KS];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const int q = ks * 16 + 4 * t;
    aoff[ks] = (q / CinP) * Cfg::kDilW * CinP + q % CinP;
  }

  const int od_begin = blockIdx.x * G::kChunk;
  const int od_end = min(Cfg::kD, od_begin + G::kChunk);
  // kPack: one input scale for the block (a k step mixes planes), from max|x| over the planes
  // its ods read (no d padding then: ids [od_begin*SD, (od_end-1)*SD + (KD-1)*DilD]).
  float sx_block = 1.f;
  if constexpr (Tune::kPack) {
    float m = 0.f;
    if (od_begin < od_end) {
      const int id0 = od_begin * Cfg::kSD, id1 = (od_end - 1) * Cfg::kSD + (KD - 1) * Cfg::kDilD;
      const int per_ci = (id1 - id0 + 1) * kPlane;
      for (int ci = 0; ci < Cin; ++ci) {
        const ElemT<Cfg>* __restrict__ xp = x + (((size_t)n * Cin + ci) * Din + id0) * kPlane;
        for (int i = tid; i < per_ci; i += G::kThreads) m = fmaxf(m, fabsf(ldg_f32(xp + i)));
      }
    }
    sx_block = mmm::scale_for(mmm::block_max(m, s_max));
  }

  float run_n = 0.f, run_m[2 * NT], run_q[2 * NT];
#pragma unroll
  for (int k = 0; k < 2 * NT; ++k) run_m[k] = run_q[k] = 0.f;

  const ElemT<Cfg>* __restrict__ xn = x + (size_t)n * Cin * Din * kPlane;

  // Stage input plane id into its slot (all threads; barriers inside).
  auto stage_plane = [&](int id) {
    const int slot = id % G::kSlots;
    const ElemT<Cfg>* __restrict__ xp = xn + (size_t)id * kPlane;
    float sx = sx_block;
    if constexpr (!Tune::kPack) {
      float m = 0.f;
      for (int i = tid; i < Cin * kPlane; i += G::kThreads) {
        const int ci = i / kPlane, r = i - ci * kPlane;
        m = fmaxf(m, fabsf(ldg_f32(xp + (size_t)ci * Din * kPlane + r)));
      }
      sx = mmm::scale_for(mmm::block_max(m, s_max));
    }
    if (tid == 0) s_inv[slot] = 1.f / (sx * sw);  // powers of two: exact
    unsigned char* const ph = s_hi + slot * G::kPlaneBytes;
    unsigned char* const pl = s_lo + slot * G::kPlaneBytes;
    for (int p = tid; p < Hin * G::kWinP; p += G::kThreads) {
      const int h = p / G::kWinP, j = p - h * G::kWinP, iw = j - Cfg::kPW;
      const bool ok = iw >= 0 && iw < Win;
#pragma unroll
      for (int c4 = 0; c4 < CinP / 4; ++c4) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int ci = c4 * 4 + k;
          v[k] = (ok && ci < Cin) ? ldg_f32(xp + (size_t)ci * Din * kPlane + h * Win + iw) * sx : 0.f;
        }
        uint2 hi, lo;
        mmm::split4(v, hi, lo);
        const int off = 2 * (p * CinP + c4 * 4);
        *reinterpret_cast<uint2*>(ph + off) = hi;
        *reinterpret_cast<uint2*>(pl + off) = lo;
      }
    }
  };

  // Prefetch (G::kPrefetch): this thread's x values of plane id, points p = tid + k*kThreads.
  constexpr int kPT = G::kPointsPerThread;
  float pf[G::kPrefetch ? Cin : 1][G::kPrefetch ? kPT : 1];
  auto prefetch_plane = [&](int id) {
    const ElemT<Cfg>* __restrict__ xp = xn + (size_t)id * kPlane;
#pragma unroll
    for (int k = 0; k < kPT; ++k) {
      const int p = tid + k * G::kThreads;
#pragma unroll
      for (int ci = 0; ci < Cin; ++ci)
        pf[ci][k] = p < kPlane ? ldg_f32(xp + (size_t)ci * Din * kPlane + p) : 0.f;
    }
  };
  // Converts the prefetched plane id into its slot (all threads; barriers inside). The padding
  // points of every slot are zeros from the start (never written here).
  auto commit_plane = [&](int id) {
    const int slot = id % G::kSlots;
    float sx = sx_block;
    if constexpr (!Tune::kPack) {
      float m = 0.f;
#pragma unroll
      for (int k = 0; k < kPT; ++k)
#pragma unroll
        for (int ci = 0; ci < Cin; ++ci) m = fmaxf(m, fabsf(pf[ci][k]));
      sx = mmm::scale_for(mmm::block_max(m, s_max));
    }
    if (tid == 0) s_inv[slot] = 1.f / (sx * sw);
    unsigned char* const ph = s_hi + slot * G::kPlaneBytes;
    unsigned char* const pl = s_lo + slot * G::kPlaneBytes;
#pragma unroll
    for (int k = 0; k < kPT; ++k) {
      const int p = tid + k * G::kThreads;
      if (p >= kPlane) break;
      const int h = p / Win, q = h * G::kWinP + (p - h * Win) + Cfg::kPW;
      if (q - h * G::kWinP >= G::kWinP) continue;  // a column no output reads
#pragma unroll
      for (int c4 = 0; c4 < CinP / 4; ++c4) {
        float v[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int ci = c4 * 4 + kk;
          v[kk] = ci < Cin ? pf[ci < Cin ? ci : 0][k] * sx : 0.f;
        }
        uint2 hi, lo;
        mmm::split4(v, hi, lo);
        const int off = 2 * (q * CinP + c4 * 4);
        *reinterpret_cast<uint2*>(ph + off) = hi;
        *reinterpret_cast<uint2*>(pl + off) = lo;
      }
    }
  };
  if constexpr (G::kPrefetch) {  // zero every slot once: the padding points stay zero
    uint4* const z = reinterpret_cast<uint4*>(s_hi);
    for (int i = tid; i < 2 * G::kSlots * G::kPlaneBytes / 16; i += G::kThreads)
      z[i] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
  }

  // One output row (od, oh): conv sums (without bias) of the thread's fragment.
  auto conv_row = [&](int lo_id, int oh, float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
    if constexpr (Tune::kPack) {
      // Step ks, lane t: group gi = 4 ks + t = tap (kd, kh, kw), channels 4 c4 .. 4 c4 + 3, at
      // row (slot of id = lo_id + kd*DilD, ih = oh*SH + kh*DilH), point ow*SW + kw*DilW; the
      // padding groups (gi >= kGroups4, zero weights) read group 0's finite values.
      const float inv = 1.f / (sx_block * sw);
      // Unrolled kUnrollKH times (fully, ptxas hoisted loads and spilled).
#pragma unroll(Tune::kUnrollKH)
      for (int ks = 0; ks < G::kKSP; ++ks) {
        int gi = ks * 4 + t;
        if (gi >= G::kGroups4) gi = 0;
        const int c4 = gi % (CinP / 4), r = gi / (CinP / 4);
        const int kw = r % KW, kh = (r / KW) % KH, kd = r / (KW * KH);
        const int slot = (lo_id + kd * Cfg::kDilD) % G::kSlots;
        const int off = slot * G::kPlaneBytes +
                        (oh * Cfg::kSH + kh * Cfg::kDilH) * G::kRowHalfs * 2 +
                        2 * (kw * Cfg::kDilW * CinP + c4 * 4);
        uint4 bf[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) bf[nt] = s_b[(ks * NT + nt) * 32 + lane];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int o0 = off + 2 * (mt * 16 + g) * Cfg::kSW * CinP;
          const int o1 = o0 + 2 * 8 * Cfg::kSW * CinP;
          const uint2 h0 = *reinterpret_cast<const uint2*>(s_hi + o0);
          const uint2 h1 = *reinterpret_cast<const uint2*>(s_hi + o1);
          const uint2 l0 = *reinterpret_cast<const uint2*>(s_lo + o0);
          const uint2 l1 = *reinterpret_cast<const uint2*>(s_lo + o1);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            float sacc[4] = {0.f, 0.f, 0.f, 0.f};
            if constexpr (!kOneTerm) {
              mmm::mma16816(sacc, l0.x, l1.x, l0.y, l1.y, bf[nt].x, bf[nt].y);  // lo * hi
              mmm::mma16816(sacc, h0.x, h1.x, h0.y, h1.y, bf[nt].z, bf[nt].w);  // hi * lo
            }
            mmm::mma16816(sacc, h0.x, h1.x, h0.y, h1.y, bf[nt].x, bf[nt].y);  // hi * hi
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = fmaf(sacc[i], inv, acc[mt][nt][i]);
          }
        }
      }
    } else {
      // A runtime loop over kd, and kh unrolled kUnrollKH times: fully unrolled, ptxas hoisted the
      // loads of later slices and spilled (W4 at 128 registers); rolled (kUnrollKH 1): 117 and 90
      // registers for W4 and W2 without the prefetch registers, no spills.
#pragma unroll 1
      for (int kd = 0; kd < KD; ++kd) {
        const int id = lo_id + kd * Cfg::kDilD;
        if constexpr (Cfg::kPD != 0) {
          if (id < 0 || id >= Din) continue;
        }
        const int slot = id % G::kSlots;
        const float inv = s_inv[slot];
#pragma unroll(Tune::kUnrollKH)
        for (int kh = 0; kh < KH; ++kh) {
          const int ih = oh * Cfg::kSH - Cfg::kPH + kh * Cfg::kDilH;
          if constexpr (Cfg::kPH != 0) {
            if (ih < 0 || ih >= Hin) continue;
          }
          const int row = (slot * G::kPlaneBytes) + ih * G::kRowHalfs * 2;
          const unsigned char* const rh = s_hi + row;
          const unsigned char* const rl = s_lo + row;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            uint4 bf[NT];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) bf[nt] = s_b[(((kd * KH + kh) * KS + ks) * NT + nt) * 32 + lane];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const int o0 = 2 * ((mt * 16 + g) * Cfg::kSW * CinP + aoff[ks]);
              const int o1 = o0 + 2 * 8 * Cfg::kSW * CinP;
              const uint2 h0 = *reinterpret_cast<const uint2*>(rh + o0);
              const uint2 h1 = *reinterpret_cast<const uint2*>(rh + o1);
              const uint2 l0 = *reinterpret_cast<const uint2*>(rl + o0);
              const uint2 l1 = *reinterpret_cast<const uint2*>(rl + o1);
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                float s[4] = {0.f, 0.f, 0.f, 0.f};
                if constexpr (!kOneTerm) {
                  mmm::mma16816(s, l0.x, l1.x, l0.y, l1.y, bf[nt].x, bf[nt].y);  // lo * hi
                  mmm::mma16816(s, h0.x, h1.x, h0.y, h1.y, bf[nt].z, bf[nt].w);  // hi * lo
                }
                mmm::mma16816(s, h0.x, h1.x, h0.y, h1.y, bf[nt].x, bf[nt].y);  // hi * hi
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][nt][i] = fmaf(s[i], inv, acc[mt][nt][i]);
              }
            }
          }
        }
      }
    }
  };

  bool first = true;
  for (int od = od_begin; od < od_end; ++od) {
    const int lo_id = od * Cfg::kSD - Cfg::kPD;
    for (int kd = 0; kd < KD; ++kd) {
      const int id = lo_id + kd * Cfg::kDilD;
      if (id < 0 || id >= Din) continue;
      if (!first) {  // staged for the previous od?
        const int prev = id - (lo_id - Cfg::kSD);
        if (prev >= 0 && prev % Cfg::kDilD == 0 && prev / Cfg::kDilD < KD) continue;
        if constexpr (G::kPrefetch) {  // the one new plane, prefetched during the previous od
          commit_plane(id);
          continue;
        }
      }
      stage_plane(id);  // block-uniform
    }
    first = false;
    __syncthreads();
    if constexpr (G::kPrefetch) {  // the next od's new plane (see commit_plane above)
      const int nid = lo_id + 1 + (KD - 1) * Cfg::kDilD;
      if (od + 1 < od_end && nid >= 0 && nid < Din) prefetch_plane(nid);
    }
    float bch[2 * NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      bch[2 * nt] = s_bias[nt * 8 + 2 * t];
      bch[2 * nt + 1] = s_bias[nt * 8 + 2 * t + 1];
    }
#pragma unroll 1
    for (int oh = warp; oh < Cfg::kH; oh += Tune::kWarps) {
      float acc[MT][NT][4];
      conv_row(lo_id, oh, acc);
      // fn(offset, acc + bias) for each of the thread's valid points of the row: channel
      // nt*8 + 2t + e, point ow = mt*16 + g (+8), offset from the row's (channel 0) start.
      auto each_point = [&](auto fn) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int ow = mt * 16 + g + 8 * hh;
                if (ow < Cfg::kW) {
                  fn((size_t)(nt * 8 + 2 * t + e) * (Cfg::kD * Cfg::kH * Cfg::kW) + ow,
                     acc[mt][nt][2 * hh + e] + bch[2 * nt + e]);
                }
              }
      };
      const size_t row0 =
          (((size_t)n * C) * Cfg::kD + od) * (size_t)(Cfg::kH * Cfg::kW) + oh * Cfg::kW;
      if (u != nullptr) {  // the convolution's output for the backward (block-uniform)
        each_point([&](size_t o, float v) { u[row0 + o] = v; });
      }
      if constexpr (kDirect) {  // y = pre(acc + bias), every valid point of the row
        each_point([&](size_t o, float v) { y[row0 + o] = store_as<ElemT<Cfg>>(Cfg::pre(v)); });
        continue;
      }
      // Points of this thread: ow = mt*16 + g (+8 for i >= 2); channels nt*8 + 2t + (i & 1).
      float cnt = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        cnt += (mt * 16 + g < Cfg::kW) ? 1.f : 0.f;
        cnt += (mt * 16 + g + 8 < Cfg::kW) ? 1.f : 0.f;
      }
      if (cnt > 0.f) {
        const float inv = 1.f / cnt, wb = cnt / (run_n + cnt);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float v[MT][2];
            float s = 0.f;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                v[mt][hh] = Cfg::pre(acc[mt][nt][2 * hh + e] + bch[2 * nt + e]);
                s += (mt * 16 + g + 8 * hh < Cfg::kW) ? v[mt][hh] : 0.f;
              }
            const float tm = s * inv;
            float q = 0.f;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const float dv = (mt * 16 + g + 8 * hh < Cfg::kW) ? v[mt][hh] - tm : 0.f;
                q = fmaf(dv, dv, q);
              }
            chan_merge_w(run_m[2 * nt + e], run_q[2 * nt + e], run_n, tm, q, wb);
          }
        run_n += cnt;
      }
    }
    __syncthreads();  // the next od's staging overwrites planes
  }
  if constexpr (kDirect) return;

  // Lanes of the same t (same channels): merge over g in a fixed tree, then warps in order.
  fragment_moments_to_shared<NT>(run_n, run_m, run_q, s_red, C);
  __syncthreads();
  for (int c = tid; c < C; c += G::kThreads) {
    float cn = 0.f, cm = 0.f, cq = 0.f;
    for (int w = 0; w < Tune::kWarps; ++w) {  // fixed order
      const float* const r = s_red + (w * C + c) * 3;
      const float wb = chan_weight(cn, r[0]);
      chan_merge_w(cm, cq, cn, r[1], r[2], wb);
      cn += r[0];
    }
    partials[((size_t)n * Tune::kBlocksPerSample + blockIdx.x) * C + c] = Moments{cn, cm, cq};
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with the default configuration (kC 8).
extern "C" __global__ void __launch_bounds__(32 * fj::MmaMomentsDefaultTune::kWarps,
                                             fj::MmaMomentsDefaultTune::kMinBlocksPerSM)
    mma_conv_moments_selftest(const float* x, const float* w, const float* b, fj::Moments* p) {
  fj::mma_conv_moments<fj::DefaultConfig, fj::MmaMomentsDefaultTune>(x, w, b, p);
}
namespace fj_selftest_mma {
struct DirectCfg : fj::DefaultConfig {
  static constexpr int kGroups = 0, kMean = fj::kNoMean;
};
}  // namespace fj_selftest_mma
extern "C" __global__ void __launch_bounds__(32 * fj::MmaMomentsDefaultTune::kWarps,
                                             fj::MmaMomentsDefaultTune::kMinBlocksPerSM)
    mma_conv_direct_selftest(const float* x, const float* w, const float* b, float* y, float* u) {
  fj::mma_conv_direct<fj_selftest_mma::DirectCfg, fj::MmaMomentsDefaultTune>(x, w, b, y, u);
}
#endif

#endif  // FUSEJIT_TEMPLATES_MMA_CONV_MOMENTS_CUH_
