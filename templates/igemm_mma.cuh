// templates/igemm_mma.cuh: the shared pieces of the tensor-core implicit GEMM for stride-1
// conv3d / conv_transpose3d (strategies "igemm-store-normalize" and "igemm-moments-mean",
// codegen/igemm_strategy.cc): its compile-time shape, the operand prep kernels (x ->
// channels-last, weights -> [tap][co][ci], in the precision's encoding) and the two epilogues
// (Tune::kOut): kIgemmOutStoreY applies the chain's pre-norm elementwise ops, stores the pre-norm
// values into y and per-tile group_norm partial moments (y is then normalized in place by
// gn_apply.cuh); kIgemmOutChannelMoments stores nothing full-size, only per-tile per-channel
// moments of the pre-norm values (igemm_mean.cuh turns them into the mean of the group_norm
// output). The main loop is igemm_wgmma.cuh. (Named for its first main loop, mma.sync, measured
// in bench/explore_w3/NOTES.md v1/v2 and since removed: git show 73da793:templates/igemm_mma.cuh.)
//
// GEMM view: rows m = output points (n, od, oh, ow) of one sample, columns = output channels,
// reduction k = (tap, ci) with tap = (kd*kKH + kh)*kKW + kw of the ORIGINAL weight indexing.
// Output point o reads input point i = o*str + base + k*step per dimension, with
//   conv3d:           str = stride, base = -P, step = +Dil
//   conv_transpose3d: str = 1,      base = +P, step = -Dil       (stride 1 only)
// and zero where i is outside the input.
//
// Precision (Tune::kPrec):
//   kPrecTF32x1  one TF32 product (opt-in "tf32" mode, ~3e-4 relative).
//   kPrecF16x3   fp32-accurate via fp16 pairs: x*sx = xh + xl, w*sw = wh + wl (fp16 each, sx/sw
//                powers of two chosen from max|x|, max|w| so nothing overflows or underflows),
//                xh*wh + xh*wl + xl*wh with fp16 tensor-core products (twice the TF32 rate),
//                result / (sx*sw).
//   kPrecBF16x1, kPrecF16x1  one bf16 / fp16 product: x and w are bf16 / f16 values (the chain's
//                dtype), exact in the operand encoding, products exact in fp32; with kFlushSteps
//                > 0 the sum is fp32-accurate.
//   kPrecF16x1Scaled  the TF32 class on fp16 tensor cores (an f32 chain's opt-in "tf32" mode):
//                x*sx and w*sw (sx, sw as kPrecF16x3's) rounded to fp16 -- 11 significant bits,
//                TF32's own rounding -- one product (the highs' of kPrecF16x3), result / (sx*sw);
//                the fp16 rate, twice TF32's. Encoded as kPrecF16x1 (64 channels a block).
// The tensor cores truncate (round toward zero) when they add into the accumulator, which biases
// long sums (~1e-5 relative for K = 1728). Tune::kFlushSteps > 0 keeps a short-run accumulator
// that is added (round-to-nearest FADD) into the main accumulator every kFlushSteps k-steps.
//
// ---- host-side contract -------------------------------------------------------------------
// Notation: S = kD*kH*kW, Sin = kDin*kHin*kWin, T = kKD*kKH*kKW,
//           CI = channels per 128-byte block: 64 for kPrecBF16x1/F16x1 (one 16-bit value per
//           channel), 32 otherwise; CB = ceil(kCin/CI) blocks (k-steps per tap), R = CB*128,
//           BM = Tune::kWarpsM*Tune::kWM, BN = Tune::kWarpsN*Tune::kWN, G = kGroups,
//           tiles = ceil(S / BM)  (IgemmShape<Cfg,Tune>::kTiles), P = Tune::kAbsmaxBlocks.
// Tune fields read here: kPrec, kWarpsM, kWarpsN, kWM, kWN, kStages, kFlushSteps, kAbsmaxBlocks,
// kOut (optional, IgemmOutOf: kIgemmOutStoreY when absent) (igemm_wgmma.cuh adds its own).
// Workspace (bytes, IgemmShape<Cfg,Tune>::k*Bytes; each offset 256-aligned by the host):
//   xa      kN*Sin*R          x, channels-last [n][d][h][w][cb][CI lanes] (IgemmShape::kXaBytes):
//                             kPrecTF32x1: 32 fp32 values rounded to TF32 (cvt.rna);
//                             kPrecBF16x1/F16x1: 64 values in the dtype;
//                             kPrecF16x3: per (point, cb) 32 fp16 highs then 32 fp16 lows of
//                             x*sx (128 bytes per (point, cb) always);
//                             channels past kCin (the last block's tail) are zeros.
//   wb      T*kCP*R           weights [tap][co][cb][CI lanes], same encodings as xa (w*sw),
//                             kCP = kC padded to whole BN tiles (zero weights).
//   absmax  2*P floats        per-block max|x| (first P) and max|w| (next P)   (F16x3 only)
//   scale   1 float           1/(sx*sw) (F16x3 only; written by igemm_prep_body's block 0)
//   kpart   kN*(kCP/BN)*tiles*split*BM*BN floats  (IgemmShape::kKPartFloats; split > 1 only)
//                             each split CTA's raw sums, added by the reduce kernel (wgmma.cuh)
//   kIgemmOutStoreY:
//   partials kN*G*GP*tiles*3 floats  Moments {count, mean, m2} of group g's channels in channel
//                     tile IgemmGroupFirstTile(g) + part over the tile's valid rows, at
//                     (((n*G + g)*GP + part)*tiles + tile)*3; GP = geom::IgemmGroupParts(kC, G,
//                     BN) (1 where every group lies inside a tile). A group's parts
//                     (IgemmGroupPartsOf of them) are contiguous: gn_finalize_body merges them.
//   kIgemmOutChannelMoments (IgemmShape::kChannelPartials IgemmChannelMoments, 16 bytes each):
//   channel partials  kN*tiles*kC {mean, m2} (doubles, computed in float within the tile) of
//                     pre(conv + bias) over the tile's valid rows (min(BM, S - tile*BM) of
//                     them), at (n*tiles + tile)*kC + c
// Kernel bodies, in launch order on one stream (the generated extern "C" __global__ wrappers
// call them):
//   1. igemm_absmax_body<Cfg,Tune>(x, weight, xmax, absmax[, nsamples = kN])   (scaled precisions)
//        grid P, block 256, no dynamic smem. Reads x (or, xmax given, Tune::kXMaxima maxima of
//        |x|: XMaximaOf) and all weights.
//   2. igemm_prep_body<Cfg,Tune>(x, weight, absmax, xa, wb, scale[, nsamples = kN])
//        grid kN*IgemmShape::kPrepXBlocksPerSample + IgemmShape::kPrepWBlocks, block 256, no
//        dynamic smem (at most kCinPad*33*4 + 256 bytes static: kCinPad*32*4 encoded,
//        kCinPad*66*2 packed -- so kCinPad = CB*CI <= 352; one channel block's where a sample
//        has few points: IgemmShape::kPrepCbPerBlock). Writes xa, wb and (F16x3) scale; absmax
//        and scale are not read or written with kPrecTF32x1 (may be null).
//   (nsamples < kN with x, xa offset to a chunk of samples converts only those; blocks past
//   nsamples*kPrepXBlocksPerSample convert the weights.)
//   3. the GEMM (igemm_wgmma.cuh, sm_90a), grid (tiles, ceil(kC/BN), kN), reading xa, wb, bias (if
//      kBias), scale (SplitOf<Tune> > 1: igemm_wgmma_split_body, grid z kN*split, writes kpart;
//      then igemm_wgmma_reduce_body / _reduce_moments_body, grid z kN, reads it, does the rest):
//      kIgemmOutStoreY: igemm_wgmma_body writes y (pre-norm values pre(conv + bias), NCDHW) and
//        partials; then 4. gn_finalize_body<Cfg, tiles, BN>, 5. gn_apply_body (gn_apply.cuh).
//      kIgemmOutChannelMoments: igemm_wgmma_moments_body writes the channel partials only; then
//        4. igemm_mean_finalize_body (igemm_mean.cuh).
// Results are bitwise identical run to run (no atomics; every merge has a fixed order).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_
#define FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_

#include "default_config.cuh"
#include "geometry.cuh"

namespace fj {

using geom::IgemmPrec;  // the precisions: geometry.cuh (shared with the planner)
using geom::kPrecBF16x1;
using geom::kPrecF16x1;
using geom::kPrecF16x1Scaled;
using geom::kPrecF16x3;
using geom::kPrecTF32x1;
// Operands of 16 bits (fp16 or bf16 tensor-core products) in every precision but TF32.
__host__ __device__ constexpr bool igemm_prec_16bit(int prec) { return prec != kPrecTF32x1; }
__host__ __device__ constexpr bool igemm_prec_x1(int prec) { return geom::IgemmPrecX1(prec); }
__host__ __device__ constexpr bool igemm_prec_scaled(int prec) {
  return geom::IgemmPrecScaled(prec);
}
// What the GEMM epilogue writes (Tune::kOut).
enum IgemmOut { kIgemmOutStoreY = 0, kIgemmOutChannelMoments = 1 };

// A tile's moments of one channel (kIgemmOutChannelMoments); the count is the tile's valid rows.
// Doubles: the mean of a group_norm output is a near-cancelling sum of channel means, so fp32
// rounding of per-tile sums would show in it.
struct IgemmChannelMoments {
  double mean;
  double m2;
};

namespace ig {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ unsigned to_tf32(unsigned bits) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
  return r;
}
__device__ __forceinline__ unsigned short f32_to_f16_rn(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
  float v;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(v) : "h"(h));
  return v;
}
// Power of two s with max_abs * s < 2^15 (fp16 highs stay below 65504), 1 for max_abs == 0.
__device__ __forceinline__ float f16_scale_for(float max_abs) {
  if (!(max_abs > 0.f) || !(max_abs < 3.0e38f)) return 1.f;
  int e;
  frexpf(max_abs, &e);  // max_abs < 2^e
  return ldexpf(1.f, 15 - e);
}
// The F16x3 encoding of 8 consecutive channels: v*scale = high + low, each rounded to fp16,
// packed two per word (channel 2e in the low half of word e).
__device__ __forceinline__ void split_f16x8(const float (&v)[8], float scale, unsigned (&hi)[4],
                                            unsigned (&lo)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    unsigned short h[2], l[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const float s = v[2 * e + q] * scale;
      h[q] = f32_to_f16_rn(s);
      l[q] = f32_to_f16_rn(s - f16_to_f32(h[q]));
    }
    hi[e] = (unsigned)h[0] | ((unsigned)h[1] << 16);
    lo[e] = (unsigned)l[0] | ((unsigned)l[1] << 16);
  }
}
// v rounded to TF32 (cvt.rna).
__device__ __forceinline__ float round_tf32(float v) {
  return __uint_as_float(to_tf32(__float_as_uint(v)));
}
// The largest v of the block; every thread gets it. REQUIRES: every thread of the block calls it,
// blockDim.x a multiple of 32; red: 32 floats of shared memory (free again on return).
__device__ __forceinline__ float block_max(float v, float* red) { return block_reduce_max(v, red); }
// max |v| over v[0..n) by this thread's share of a grid-stride loop (thread tid of `stride`),
// float4 loads where n allows (v 16-byte aligned).
__device__ __forceinline__ float absmax_scan(const float* __restrict__ v, long long n,
                                             long long tid, long long stride) {
  float m = 0.f;
  if (n % 4 == 0) {
    const float4* v4 = reinterpret_cast<const float4*>(v);
    const long long n4 = n / 4;
    long long i = tid;
    // Eight 16-byte loads in flight per thread, then the rest one at a time (max: any order).
    for (; i + 7 * stride < n4; i += 8 * stride) {
      float4 q[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) q[u] = v4[i + u * stride];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        m = fmaxf(m,
                  fmaxf(fmaxf(fabsf(q[u].x), fabsf(q[u].y)), fmaxf(fabsf(q[u].z), fabsf(q[u].w))));
      }
    }
    for (; i < n4; i += stride) {
      const float4 q = v4[i];
      m = fmaxf(m, fmaxf(fmaxf(fabsf(q.x), fabsf(q.y)), fmaxf(fabsf(q.z), fabsf(q.w))));
    }
  } else {
    for (long long i = tid; i < n; i += stride) m = fmaxf(m, fabsf(v[i]));
  }
  return m;
}
// The F16x3 scale of an operand from the absmax pass's n per-block maxima p[0..n), read by the
// whole block (max is order-free: every block derives the same scale). As block_max.
__device__ __forceinline__ float scale_from_partials(const float* __restrict__ p, int n,
                                                     float* red) {
  float m = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, p[i]);
  return f16_scale_for(block_max(m, red));
}

}  // namespace ig

template <class...>
using void_t = void;

// The element type of the kIgemmOutStoreY epilogue's y: without group_norm it is the chain's
// output (ElemT<Cfg>, rounded once: igemm-store); with group_norm it holds pre-norm values, f32
// (the chain's y for f32 chains, an fp32 workspace for bf16/f16 ones).
template <class Cfg>
using IgemmYT = Select<Cfg::kGroups == 0, ElemT<Cfg>, float>;

// Tune::kOut when the tuning names it, else kIgemmOutStoreY.
template <class T, class = void>
struct IgemmOutOf {
  static constexpr int value = kIgemmOutStoreY;
};
template <class T>
struct IgemmOutOf<T, void_t<decltype(T::kOut)>> {
  static constexpr int value = T::kOut;
};

// Tune::kSplit when the tuning names it, else 1: the reduction over (kd, cb) blocks split that
// many ways (igemm_wgmma.cuh's split and reduce kernels).
template <class T, class = void>
struct SplitOf {
  static constexpr int value = 1;
};
template <class T>
struct SplitOf<T, void_t<decltype(T::kSplit)>> {
  static constexpr int value = T::kSplit;
};

// Compile-time shape of the implicit GEMM for a chain and a tuning.
template <class Cfg, class Tune>
struct IgemmShape {
  static constexpr bool kTransposed = Cfg::kProducer == kConvTranspose3d;
  static constexpr int kBM = Tune::kWarpsM * Tune::kWM;
  static constexpr int kBN = Tune::kWarpsN * Tune::kWN;
  // Output channels padded to whole tiles (the store epilogue without group_norm only: the
  // padding's weights are zero and its rows are not stored).
  static constexpr int kCP = (Cfg::kC + kBN - 1) / kBN * kBN;
  // Sizes the host's launch uses too, from one function (geometry.cuh).
  // Output point o reads input o * kStr + kBase + k * kStep per dimension (kStr: conv3d's
  // stride; conv_transpose3d runs stride 1 only).
  static constexpr int kStrD = kTransposed ? 1 : Cfg::kSD;
  static constexpr int kStrH = kTransposed ? 1 : Cfg::kSH;
  static constexpr int kStrW = kTransposed ? 1 : Cfg::kSW;
  static constexpr geom::Igemm kG =
      geom::IgemmOf(Cfg::kD, Cfg::kH, Cfg::kW, Cfg::kDin, Cfg::kHin, Cfg::kWin, Cfg::kCin, kCP,
                    Cfg::kKD, Cfg::kKH, Cfg::kKW, Cfg::kDilH, Cfg::kDilW, kStrH, kStrW, kBM, kBN,
                    Tune::kStages, Tune::kPrec);
  static constexpr int kS = kG.s;
  static constexpr int kSin = kG.sin;
  static constexpr int kTaps = kG.taps;
  static constexpr int kCinBlock = kG.cin_block;  // channels per 128-byte block (one k-step)
  static constexpr int kCB = kG.cb;
  static constexpr int kCinPad = kCB * kG.cin_block;  // kCin padded to whole blocks (zeros)
  static constexpr int kSlices = kG.slices;  // wgmma k-slices per block (F16x3: of each half)
  static constexpr int kLastSlices = kG.last_slices;  // those the last block runs
  static constexpr int kChunks = kCinBlock / 8;  // 8-channel chunks per block
  static constexpr int kThreads = 32 * Tune::kWarpsM * Tune::kWarpsN;
  static constexpr int kTiles = kG.tiles;
  static constexpr int kGroupsOr1 = Cfg::kGroups > 0 ? Cfg::kGroups : 1;
  static constexpr int kCg = Cfg::kC / kGroupsOr1;
  static constexpr int kGroupParts = (int)geom::IgemmGroupParts(Cfg::kC, kGroupsOr1, kBN);
  static constexpr int kRowBytes = kG.row_bytes;  // bytes per point in xa (and per co in wb)
  // Input-point offset per dimension: i = o + kBase + k*kStep.
  static constexpr int kBaseD = kTransposed ? Cfg::kPD : -Cfg::kPD;
  static constexpr int kBaseH = kTransposed ? Cfg::kPH : -Cfg::kPH;
  static constexpr int kBaseW = kTransposed ? Cfg::kPW : -Cfg::kPW;
  static constexpr int kStepD = kTransposed ? -Cfg::kDilD : Cfg::kDilD;
  static constexpr int kStepH = kTransposed ? -Cfg::kDilH : Cfg::kDilH;
  static constexpr int kStepW = kTransposed ? -Cfg::kDilW : Cfg::kDilW;
  // The epilogue's shared memory (geom::IgemmOf's epi_bytes): column sums per warp along M, then
  // each column's mean and m2 (IgemmCore::column_moments: floats, 8 bytes reserved for each), or
  // a 16-bit output tile (IgemmCore::store_tile), whichever is larger.
  static constexpr int kEpiSumBytes = (Tune::kWarpsM + 2) * kBN * 8;
  static constexpr int kEpiStageBytes = kBN * (kBM + 8) * 2;
  static constexpr int kEpiBytes = kEpiSumBytes > kEpiStageBytes ? kEpiSumBytes : kEpiStageBytes;
  // Workspace sizes.
  static constexpr long long kXaBytes = (long long)Cfg::kN * kG.xa_bytes_per_sample;
  static constexpr long long kWbBytes = kG.wb_bytes;
  static constexpr long long kPartialFloats =
      (long long)Cfg::kN * kGroupsOr1 * kGroupParts * kTiles * 3;
  static constexpr long long kChannelPartials = (long long)Cfg::kN * kTiles * Cfg::kC;
  // Split parts (SplitOf<Tune> > 1): BM x BN sums per (sample, channel tile, tile, part).
  static constexpr int kSplit = SplitOf<Tune>::value;
  static constexpr long long kKPartFloats =
      kSplit > 1 ? (long long)Cfg::kN*(kCP / kBN) * kTiles* kSplit* kBM* kBN : 0;
  static constexpr int kOut = IgemmOutOf<Tune>::value;
  // Prep grid: x in blocks of 32 points x kPrepCbPerBlock channel blocks, weights in blocks of 256
  // (co,cb,chunk8,tap).
  static constexpr int kPrepPts = kG.prep_points;
  static constexpr int kPrepCbPerBlock = kG.prep_cb_per_block;  // channel blocks per x block
  static constexpr int kPrepXBlocksPerSample = kG.prep_x_blocks_per_sample;
  static constexpr int kPrepXBlocks = Cfg::kN * kPrepXBlocksPerSample;
  static constexpr int kWChunks = kTaps * kCP * kCB * kChunks;  // 8-lane chunks
  static constexpr int kPrepWBlocks = kG.prep_w_blocks;  // kWChunks / 256, rounded up

  static_assert(Tune::kPrec == kPrecTF32x1 || Tune::kPrec == kPrecF16x3 ||
                    Tune::kPrec == kPrecBF16x1 || Tune::kPrec == kPrecF16x1 ||
                    Tune::kPrec == kPrecF16x1Scaled,
                "igemm: precision kPrecTF32x1, kPrecF16x3, kPrecBF16x1, kPrecF16x1 or "
                "kPrecF16x1Scaled");
  static_assert(!igemm_prec_scaled(Tune::kPrec) || is_same_v<ElemT<Cfg>, float>,
                "igemm: the scaled fp16 encodings are for f32 chains");
  static_assert(Tune::kPrec != kPrecBF16x1 || is_same_v<ElemT<Cfg>, bf16_t>,
                "igemm: kPrecBF16x1 needs a bf16 chain (its values exact in the encoding)");
  static_assert(Tune::kPrec != kPrecF16x1 || is_same_v<ElemT<Cfg>, f16_t>,
                "igemm: kPrecF16x1 needs an f16 chain (its values exact in the encoding)");
  static_assert(Cfg::kProducer == kConv3d || Cfg::kProducer == kConvTranspose3d,
                "igemm: the producer must be conv3d or conv_transpose3d");
  static_assert(!kTransposed || (Cfg::kSD == 1 && Cfg::kSH == 1 && Cfg::kSW == 1),
                "igemm: conv_transpose3d stride 1 only (split strided ones into phases first)");
  static_assert(Tune::kWM % 16 == 0 && Tune::kWN % 16 == 0, "igemm: warp tile multiple of 16");
  static_assert(kThreads % 8 == 0, "igemm: threads a multiple of 8");
  static_assert(Cfg::kGroups == 0 || Cfg::kC % Cfg::kGroups == 0,
                "igemm: group_norm's groups must divide the channels");
  static_assert(kOut == kIgemmOutStoreY || kOut == kIgemmOutChannelMoments,
                "igemm: Tune::kOut is kIgemmOutStoreY or kIgemmOutChannelMoments");
  static_assert(Cfg::kMean == kNoMean || kOut == kIgemmOutChannelMoments,
                "igemm: a chain ending in mean needs the channel-moments epilogue (kOut)");
  static_assert(Tune::kStages >= 2, "igemm: at least 2 pipeline stages");
  static_assert(Tune::kFlushSteps >= 0, "igemm: kFlushSteps >= 0");
  static_assert((long long)kSin * kRowBytes < (1ll << 31), "igemm: sample too large");
};

// ---- 1. max|x| and max|w| per block (the scales of the fp16 encodings) -----------------------
// Tune::kXMaxima where given, else 0: how many per-block maxima of |x| the kernel that wrote x left
// in xmax (a backward's grad_u: codegen::ReadInputMaxima).
template <class Tune, class = void>
struct XMaximaOf {
  static constexpr long long value = 0;
};
template <class Tune>
struct XMaximaOf<Tune, decltype(void(Tune::kXMaxima))> {
  static constexpr long long value = Tune::kXMaxima;
};
// xmax: null (x is scanned), or XMaximaOf<Tune> maxima covering every value of x, reduced instead
// (the same max: max is exact, so the same scale and bitwise the same results).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_absmax_body(const float* __restrict__ x,
                                                  const float* __restrict__ weight,
                                                  const float* __restrict__ xmax,
                                                  float* __restrict__ absmax,
                                                  int nsamples = Cfg::kN) {
  using Sh = IgemmShape<Cfg, Tune>;
  __shared__ float red[32];
  const long long nx = (long long)nsamples * Cfg::kCin * Sh::kSin;
  const long long nw = (long long)Sh::kTaps * Cfg::kC * Cfg::kCin;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  float mx = 0.f, mw = 0.f;
  if (xmax != nullptr) {
    for (long long i = tid; i < XMaximaOf<Tune>::value; i += stride) mx = fmaxf(mx, xmax[i]);
  } else {
    mx = ig::absmax_scan(x, nx, tid, stride);
  }
  mw = ig::absmax_scan(weight, nw, tid, stride);
  mx = ig::block_max(mx, red);
  mw = ig::block_max(mw, red);
  if (threadIdx.x == 0) {
    absmax[blockIdx.x] = mx;
    absmax[gridDim.x + blockIdx.x] = mw;
  }
}

// ---- 2. x -> channels-last xa, weights -> wb (both in the operand encoding) -----------------
// x of a one-product 16-bit chain (kPrecBF16x1/F16x1): the values' bits copied channels-last,
// no conversion; a block moves kPrepPts (64) points of one sample, the channels of
// kPrepCbPerBlock 64-channel blocks from block cb0, loading two points per 32-bit word along
// each channel row where the rows are 4-byte aligned (S even). kPrecF16x1Scaled (an f32 chain):
// the same, each value x*sx rounded to fp16 on its way in.
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_prep_x_packed(const ElemT<Cfg>* __restrict__ x,
                                                    unsigned char* __restrict__ xa, int n, int p0,
                                                    int cb0, float sx) {
  using Sh = IgemmShape<Cfg, Tune>;
  constexpr int P = Sh::kPrepPts, kPitch = P + 2;  // even pitch: 32-bit words stay aligned
  constexpr int CI = Sh::kCinBlock * Sh::kPrepCbPerBlock;  // the block's channels
  __shared__ unsigned short tile[CI][kPitch];
  // Channel c of the tile is channel c0 + c of x (past kCin: zeros).
  const int c0 = cb0 * Sh::kCinBlock;
  const int cn = Cfg::kCin - c0 < CI ? Cfg::kCin - c0 : CI;
  const unsigned short* xs =
      reinterpret_cast<const unsigned short*>(x) + ((long long)n * Cfg::kCin + c0) * Sh::kSin;
  if constexpr (Tune::kPrec == kPrecF16x1Scaled && Sh::kSin % 4 == 0) {
    // Four points per 16-byte load (p0 + p and S multiples of 4: all four in range or none).
    const float* xf =
        reinterpret_cast<const float*>(x) + ((long long)n * Cfg::kCin + c0) * Sh::kSin;
#pragma unroll 8
    for (int i = threadIdx.x; i < CI * (P / 4); i += blockDim.x) {
      const int c = i / (P / 4), p = 4 * (i % (P / 4));
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c < cn && p0 + p < Sh::kSin) {
        v = *reinterpret_cast<const float4*>(xf + (long long)c * Sh::kSin + p0 + p);
      }
      *reinterpret_cast<unsigned*>(&tile[c][p]) = (unsigned)from_f32<f16_t>(v.x * sx).bits |
                                                  ((unsigned)from_f32<f16_t>(v.y * sx).bits << 16);
      *reinterpret_cast<unsigned*>(&tile[c][p + 2]) =
          (unsigned)from_f32<f16_t>(v.z * sx).bits |
          ((unsigned)from_f32<f16_t>(v.w * sx).bits << 16);
    }
  } else if constexpr (Tune::kPrec == kPrecF16x1Scaled) {
    const float* xf =
        reinterpret_cast<const float*>(x) + ((long long)n * Cfg::kCin + c0) * Sh::kSin;
    for (int i = threadIdx.x; i < CI * P; i += blockDim.x) {
      const int c = i / P, p = i % P;
      tile[c][p] = c < cn && p0 + p < Sh::kSin
                       ? from_f32<f16_t>(xf[(long long)c * Sh::kSin + p0 + p] * sx).bits
                       : (unsigned short)0;
    }
  } else if constexpr (Sh::kSin % 4 == 0) {
    // Four points per 8-byte load (p0 + p and S multiples of 4: all four in range or none).
#pragma unroll 8
    for (int i = threadIdx.x; i < CI * (P / 4); i += blockDim.x) {
      const int c = i / (P / 4), p = 4 * (i % (P / 4));
      const long long at = (long long)c * Sh::kSin + p0 + p;
      const uint2 w = c < cn && p0 + p < Sh::kSin ? *reinterpret_cast<const uint2*>(xs + at)
                                                  : make_uint2(0u, 0u);
      *reinterpret_cast<unsigned*>(&tile[c][p]) = w.x;
      *reinterpret_cast<unsigned*>(&tile[c][p + 2]) = w.y;
    }
  } else if constexpr (Sh::kSin % 2 == 0) {
    for (int i = threadIdx.x; i < CI * (P / 2); i += blockDim.x) {
      const int c = i / (P / 2), p = 2 * (i % (P / 2));
      const long long at = (long long)c * Sh::kSin + p0 + p;
      // p0 + p is even and S is even: both points are in range or neither.
      const unsigned w =
          c < cn && p0 + p < Sh::kSin ? *reinterpret_cast<const unsigned*>(xs + at) : 0u;
      *reinterpret_cast<unsigned*>(&tile[c][p]) = w;
    }
  } else {
    for (int i = threadIdx.x; i < CI * P; i += blockDim.x) {
      const int c = i / P, p = i % P;
      tile[c][p] =
          c < cn && p0 + p < Sh::kSin ? xs[(long long)c * Sh::kSin + p0 + p] : (unsigned short)0;
    }
  }
  __syncthreads();
  unsigned char* out = xa + ((long long)n * Sh::kSin + p0) * Sh::kRowBytes;
  // Each (point, 8-channel chunk j of the block's channels): 16 bytes at channel block cb0 +
  // j / kChunks; channels past kCin are the tile's zeros.
  constexpr int kJ = CI / 8;
  for (int i = threadIdx.x; i < P * kJ; i += blockDim.x) {
    const int p = i / kJ, j = i % kJ;
    if (p0 + p >= Sh::kSin) continue;
    unsigned v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = (unsigned)tile[j * 8 + 2 * e][p] | ((unsigned)tile[j * 8 + 2 * e + 1][p] << 16);
    }
    *reinterpret_cast<uint4*>(out + (long long)p * Sh::kRowBytes + cb0 * 128 + j * 16) =
        make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Encodes 8 consecutive channel values into 16 bytes (TF32: 2 x 16 B of fp32 -> caller) ...
// x of an f32 chain in the TF32 or F16x3 encoding (x*sx split into fp16 highs and lows): a
// block converts kPrepPts (32) points of sample n from p0, the channels of kPrepCbPerBlock
// 32-channel blocks from block cb0.
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_prep_x_encoded(const ElemT<Cfg>* __restrict__ x,
                                                     unsigned char* __restrict__ xa, int n, int p0,
                                                     int cb0, float sx) {
  using Sh = IgemmShape<Cfg, Tune>;
  constexpr bool kF16 = Tune::kPrec == kPrecF16x3;
  using E = ElemT<Cfg>;
  // [CI][32] floats (channel c of the tile is channel cb0*32 + c of x), point p of channel c at
  // bank (p + 2*(c/8) + c%8) % 32: conflict-free both for the loads (8 channels x 4 points a
  // warp) and for the encode (channel chunks x points a warp, each reading 8 channels of one
  // point).
  static_assert(Sh::kPrepPts == 32, "igemm prep: 32 points a block (the tile's swizzle)");
  static_assert(Sh::kCinBlock == 32,
                "igemm prep: 32-channel blocks in the TF32 and F16x3 encodings");
  constexpr int CI = Sh::kCinBlock * Sh::kPrepCbPerBlock;  // the block's channels
  __shared__ float tile[CI * 32];
  auto at = [](int c, int p) { return c * 32 + ((p + 2 * (c >> 3) + (c & 7)) & 31); };
  const int c0 = cb0 * Sh::kCinBlock;
  const int cn = Cfg::kCin - c0 < CI ? Cfg::kCin - c0 : CI;
  const E* xs = x + ((long long)n * Cfg::kCin + c0) * Sh::kSin;
  // Load [CI channels][32 points], coalesced along points; channels past kCin are zeros.
  if constexpr (is_same_v<E, float> && Sh::kSin % 4 == 0) {
    // Four points per 16-byte load (p0 + p and S multiples of 4: all four in range or none).
    constexpr int P4 = Sh::kPrepPts / 4;
#pragma unroll 8
    for (int i = threadIdx.x; i < CI * P4; i += blockDim.x) {
      const int c = i / P4, p = 4 * (i % P4);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c < cn && p0 + p < Sh::kSin) {
        v = *reinterpret_cast<const float4*>(xs + (long long)c * Sh::kSin + p0 + p);
      }
      tile[at(c, p)] = v.x;
      tile[at(c, p + 1)] = v.y;
      tile[at(c, p + 2)] = v.z;
      tile[at(c, p + 3)] = v.w;
    }
  } else {
    for (int i = threadIdx.x; i < CI * Sh::kPrepPts; i += blockDim.x) {
      const int c = i / Sh::kPrepPts, p = i % Sh::kPrepPts;
      tile[at(c, p)] =
          c < cn && p0 + p < Sh::kSin ? to_f32(xs[(long long)c * Sh::kSin + p0 + p]) : 0.f;
    }
  }
  __syncthreads();
  unsigned char* out = xa + ((long long)n * Sh::kSin + p0) * Sh::kRowBytes;
  // Each (point, channel block cb0 + b, 8-channel chunk j): 16 B of highs + 16 B of lows (F16x3),
  // or 32 B (TF32).
  constexpr int kJ = CI / 8;
  for (int i = threadIdx.x; i < Sh::kPrepPts * kJ; i += blockDim.x) {
    const int p = i / kJ, b = (i % kJ) / Sh::kChunks, j = i % Sh::kChunks;
    if (p0 + p >= Sh::kSin) continue;
    unsigned char* row = out + (long long)p * Sh::kRowBytes + (cb0 + b) * 128;
    const int c0 = b * Sh::kCinBlock + j * 8;
    if constexpr (kF16) {
      float v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = tile[at(c0 + e, p)];
      unsigned hi[4], lo[4];
      ig::split_f16x8(v, sx, hi, lo);
      *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(row + 64 + j * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    } else {
      float v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = ig::round_tf32(tile[at(c0 + e, p)]);
      *reinterpret_cast<float4*>(row + j * 32) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(row + j * 32 + 16) = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_prep_body(const ElemT<Cfg>* __restrict__ x,
                                                const ElemT<Cfg>* __restrict__ weight,
                                                const float* __restrict__ absmax,
                                                unsigned char* __restrict__ xa,
                                                unsigned char* __restrict__ wb,
                                                float* __restrict__ scale_out,
                                                int nsamples = Cfg::kN) {
  using Sh = IgemmShape<Cfg, Tune>;
  constexpr bool kF16 = Tune::kPrec == kPrecF16x3;
  constexpr bool kX1 = igemm_prec_x1(Tune::kPrec);
  constexpr bool kScaled1 = Tune::kPrec == kPrecF16x1Scaled;
  using E = ElemT<Cfg>;
  float sx = 1.f, sw = 1.f;
  if constexpr (igemm_prec_scaled(Tune::kPrec)) {
    __shared__ float red[32];
    sx = ig::scale_from_partials(absmax, Tune::kAbsmaxBlocks, red);
    sw = ig::scale_from_partials(absmax + Tune::kAbsmaxBlocks, Tune::kAbsmaxBlocks, red);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_out[0] = 1.f / (sx * sw);
  }
  const int b = blockIdx.x;
  const int xblocks = nsamples * Sh::kPrepXBlocksPerSample;
  if (b < xblocks) {
    // (n, point block, group of kPrepCbPerBlock channel blocks), the group fastest.
    constexpr int kGroups = Sh::kCB / Sh::kPrepCbPerBlock;
    const int n = b / Sh::kPrepXBlocksPerSample, r = b % Sh::kPrepXBlocksPerSample;
    const int p0 = (r / kGroups) * Sh::kPrepPts, cb0 = (r % kGroups) * Sh::kPrepCbPerBlock;
    if constexpr (kX1) {
      igemm_prep_x_packed<Cfg, Tune>(x, xa, n, p0, cb0, sx);
    } else {
      igemm_prep_x_encoded<Cfg, Tune>(x, xa, n, p0, cb0, sx);
    }
  } else {
    const int i = (b - xblocks) * 256 + threadIdx.x;
    if (i >= Sh::kWChunks) return;
    // i -> (co, cb, j, tap), the tap fastest: 8 input channels ci = cb*CI + j*8 .. +7 of one
    // tap. A warp's lanes read consecutive taps of the same (co, ci) rows (the weights' innermost
    // dimension: a few sectors per load instead of one sector per lane; S8's weights 2x faster).
    constexpr int kJ = Sh::kChunks;
    const int tap = i % Sh::kTaps, r = i / Sh::kTaps;
    const int j = r % kJ, cb = (r / kJ) % Sh::kCB, co = r / (kJ * Sh::kCB);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int ci = cb * Sh::kCinBlock + j * 8 + e;
      v[e] = co >= Cfg::kC || ci >= Cfg::kCin
                 ? 0.f  // padding channels: zero weights
                 : to_f32(Sh::kTransposed
                              ? weight[((long long)ci * Cfg::kC + co) * Sh::kTaps + tap]
                              : weight[((long long)co * Cfg::kCin + ci) * Sh::kTaps + tap]);
    }
    unsigned char* row = wb + (((long long)tap * Sh::kCP + co) * Sh::kCB + cb) * 128;
    if constexpr (kScaled1) {
      unsigned u[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        u[e] = (unsigned)from_f32<f16_t>(v[2 * e] * sw).bits |
               ((unsigned)from_f32<f16_t>(v[2 * e + 1] * sw).bits << 16);
      }
      *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(u[0], u[1], u[2], u[3]);
    } else if constexpr (kX1) {
      unsigned u[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        u[e] = (unsigned)from_f32<E>(v[2 * e]).bits | ((unsigned)from_f32<E>(v[2 * e + 1]).bits << 16);
      }
      *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(u[0], u[1], u[2], u[3]);
    } else if constexpr (kF16) {
      unsigned hi[4], lo[4];
      ig::split_f16x8(v, sw, hi, lo);
      *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(row + 64 + j * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = ig::round_tf32(v[e]);
      *reinterpret_cast<float4*>(row + j * 32) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(row + j * 32 + 16) = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

// ---- 3. pieces of the GEMM kernel (main loop: igemm_wgmma.cuh) --------------------------
// B stage loads, the flush of the short-run accumulator, the epilogue.
template <class Cfg, class Tune>
struct IgemmCore {
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kPrec = Tune::kPrec;
  static constexpr int BM = Sh::kBM, BN = Sh::kBN, NT = Sh::kThreads;
  static constexpr int MT = Tune::kWM / 16;  // m16 tiles per warp
  static constexpr int NT8 = Tune::kWN / 8;  // n8 tiles per warp
  static constexpr int kFlush = Tune::kFlushSteps;

  __device__ __forceinline__ static void add_into(float (&acc)[MT][NT8][4],
                                                  const float (&part)[MT][NT8][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[mi][ni][e];
  }

  // B stage of k-step (tap, cb): BN rows of 128 bytes, 16-byte chunks XOR-swizzled by row.
  __device__ __forceinline__ static void load_b(unsigned sb, const unsigned char* wb, int tap,
                                                int cb, int co0, int ld_r, int ld_c) {
    const unsigned char* wsrc =
        wb + (((long long)tap * Sh::kCP + co0) * Sh::kCB + cb) * 128 + ld_c * 16;
    if constexpr ((BN * 8) % NT == 0) {
#pragma unroll
      for (int j = 0; j < BN * 8 / NT; ++j) {
        const int r = ld_r + j * (NT / 8);
        ig::cp_async16(sb + r * 128 + ((ld_c ^ (r & 7)) << 4),
                       wsrc + (long long)r * Sh::kCB * 128, true);
      }
    } else {
#pragma unroll
      for (int j = 0; j < (BN * 8 + NT - 1) / NT; ++j) {
        const int r = ld_r + j * (NT / 8);
        if (r < BN)
          ig::cp_async16(sb + r * 128 + ((ld_c ^ (r & 7)) << 4),
                         wsrc + (long long)r * Sh::kCB * 128, true);
      }
    }
  }

  // ---- the epilogues, straight from the accumulator registers ---------------------------------
  // Element (mi, ni, e) of a thread's acc[MT][NT8][4] is tile row row_of(mi, e) (an output point
  // sp0 + row of the sample) and tile column col_of(ni, e) (channel co0 + col): the mma / wgmma
  // accumulator layout, rows g and g + 8 of each m16 tile and columns 2t and 2t + 1 of each n8
  // tile (g = lane / 4, t = lane % 4). One store instruction of a warp writes 4 channels x 8
  // consecutive points: four whole 32-byte sectors (f32), so no staging through shared memory.
  __device__ __forceinline__ static int row_of(int mi, int e) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return (warp % Tune::kWarpsM) * Tune::kWM + mi * 16 + (lane >> 2) + ((e >> 1) << 3);
  }
  __device__ __forceinline__ static int col_of(int ni, int e) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return (warp / Tune::kWarpsM) * Tune::kWN + ni * 8 + 2 * (lane & 3) + (e & 1);
  }
  // Whether tile column c is a real channel (not a padding channel past kC).
  __device__ __forceinline__ static bool col_real(int c, int co0) {
    return Cfg::kC % BN == 0 || co0 + c < Cfg::kC;
  }

  // acc <- acc * s + bias: the convolution's output u, in place.
  __device__ __forceinline__ static void to_conv_output(float (&acc)[MT][NT8][4], float s,
                                                        const ElemT<Cfg>* __restrict__ bias,
                                                        int co0) {
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int c2 = 0; c2 < 2; ++c2) {
        float b = 0.f;
        if constexpr (Cfg::kBias) {
          const int col = col_of(ni, c2);
          if (col_real(col, co0)) b = to_f32(bias[co0 + col]);
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& v = acc[mi][ni][2 * h + c2];
            v = Cfg::kBias ? fmaf(v, s, b) : v * s;
          }
      }
  }
  // acc <- f(acc) elementwise.
  template <class F>
  __device__ __forceinline__ static void apply(float (&acc)[MT][NT8][4], F f) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = f(acc[mi][ni][e]);
  }
  // Stores the tile's valid rows and real columns into out, a [N][C][S] tensor of Y (rounded once
  // where Y is 16-bit). f32, or S not a multiple of 4: straight from the registers. 16-bit Y with
  // S % 4 == 0: a store instruction from the registers would write half sectors (measured 2%
  // slower), so the tile is staged as Y in smem ([BN][BM + 8], kEpiBytes covers it) and each warp
  // stores whole channel rows, 8 bytes a lane. REQUIRES: all threads (16-bit staged: smem free
  // for reuse; returns after a __syncthreads).
  template <class Y>
  __device__ __forceinline__ static void store_tile(const float (&acc)[MT][NT8][4],
                                                    Y* __restrict__ out, int n, int co0, int sp0,
                                                    int valid, unsigned char* smem) {
    if constexpr (sizeof(Y) == 2 && Sh::kS % 4 == 0 && BM % 4 == 0) {
      constexpr int kPitch = BM + 8;  // Y values per staged channel row
      static_assert(BN * kPitch * 2 <= Sh::kEpiBytes, "igemm epilogue: 16-bit stage too large");
      Y* stage = reinterpret_cast<Y*>(smem);
      __syncthreads();  // smem's previous readers are done
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            stage[col_of(ni, e) * kPitch + row_of(mi, e)] = store_as<Y>(acc[mi][ni][e]);
      __syncthreads();
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      for (int r = warp; r < BN; r += NT / 32) {
        if (!col_real(r, co0)) break;  // padding channels: so are the warp's next rows
        unsigned short* dst = reinterpret_cast<unsigned short*>(
            out + ((long long)n * Cfg::kC + co0 + r) * Sh::kS + sp0);
        const unsigned short* srow = reinterpret_cast<const unsigned short*>(stage + r * kPitch);
        for (int m = lane * 4; m < valid; m += 128)
          *reinterpret_cast<uint2*>(dst + m) = *reinterpret_cast<const uint2*>(srow + m);
      }
      __syncthreads();  // the stage is read before smem is reused
      return;
    }
    Y* base = out + ((long long)n * Cfg::kC + co0 + col_of(0, 0)) * Sh::kS + sp0 + row_of(0, 0);
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int c2 = 0; c2 < 2; ++c2) {
        if (!col_real(col_of(ni, c2), co0)) continue;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (row_of(mi, 2 * h) < valid)
              base[(long long)(ni * 8 + c2) * Sh::kS + mi * 16 + 8 * h] =
                  store_as<Y>(acc[mi][ni][2 * h + c2]);
          }
      }
  }

  // The sums a[j] (j < 2*NT8: column col_of(j / 2, j % 2) of this thread) over the 8 lanes of
  // equal t (lane bits 2-4: the rows), reduce-scattered: afterwards a[i], i < NT8/4, holds the
  // sum for j = jbase() + i. Fixed order (deterministic). REQUIRES: the whole warp.
  template <int W, int kOff>
  __device__ __forceinline__ static void scatter_step(float* a) {
    const bool hi = (threadIdx.x & kOff) != 0;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float send = hi ? a[i] : a[i + W];
      const float keep = hi ? a[i + W] : a[i];
      a[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
    }
  }
  __device__ __forceinline__ static void sum_over_rows(float (&a)[2 * NT8]) {
    static_assert(NT8 % 4 == 0, "igemm epilogue: 32 or more columns per warp");
    scatter_step<NT8, 16>(a);
    scatter_step<NT8 / 2, 8>(a);
    scatter_step<NT8 / 4, 4>(a);
  }
  __device__ __forceinline__ static int jbase() {
    const int g = (threadIdx.x & 31) >> 2;
    return ((g >> 2) & 1) * NT8 + ((g >> 1) & 1) * (NT8 / 2) + (g & 1) * (NT8 / 4);
  }

  // Per tile column c: colsum(ni, c2) (this thread's sum for column col_of(ni, c2)) summed over
  // the warp's rows (sum_over_rows), then over the warps along M in order, times mul, into col[c]
  // (float[BN], shared memory). red: float[kWarpsM * BN] in shared memory. Ends with
  // __syncthreads(). REQUIRES: all threads.
  template <class ColSum>
  __device__ __forceinline__ static void columns_total(ColSum colsum, float* red, float* col,
                                                       float mul) {
    const int wm = (threadIdx.x >> 5) % Tune::kWarpsM;
    float a[2 * NT8];
#pragma unroll
    for (int i = 0; i < NT8; ++i)
#pragma unroll
      for (int c2 = 0; c2 < 2; ++c2) a[2 * i + c2] = colsum(i, c2);
    sum_over_rows(a);
    const int jb = jbase();
#pragma unroll
    for (int i = 0; i < NT8 / 4; ++i) {
      const int j = jb + i;
      red[wm * BN + col_of(j >> 1, j & 1)] = a[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < BN; c += NT) {
      float sum = 0;
#pragma unroll
      for (int w = 0; w < Tune::kWarpsM; ++w) sum += red[w * BN + c];
      col[c] = sum * mul;
    }
    __syncthreads();
  }

  // {mean, m2} of each tile column's valid rows (acc, as it is), in float: two passes (the mean,
  // then the squared deviations from it), into cmean[BN], cm2[BN] (shared memory), visible to all
  // threads on return. Columns that are not real get unspecified values.
  // red: float[kWarpsM * BN] shared. REQUIRES: all threads.
  __device__ __forceinline__ static void column_moments(const float (&acc)[MT][NT8][4], int valid,
                                                        float* red, float* cmean, float* cm2) {
    columns_total(
        [&](int ni, int c2) {
          float sum = 0;
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (row_of(mi, 2 * h) < valid) sum += acc[mi][ni][2 * h + c2];
          return sum;
        },
        red, cmean, 1.f / (float)valid);
    columns_total(
        [&](int ni, int c2) {
          const float mean = cmean[col_of(ni, c2)];
          float sum = 0;
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (row_of(mi, 2 * h) < valid) {
                const float d = acc[mi][ni][2 * h + c2] - mean;
                sum = fmaf(d, d, sum);
              }
          return sum;
        },
        red, cm2, 1.f);
  }

  // Sum over a warp, the same fixed butterfly order in every lane (all lanes get the result).
  __device__ __forceinline__ static float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
  }

  // The chain's pre-norm ops (y's values from u's).
  struct Pre {
    __device__ __forceinline__ float operator()(float v) const { return Cfg::pre(v); }
  };
  // The chain's ops when it has no group_norm (pre, then post).
  struct PrePost {
    __device__ __forceinline__ float operator()(float v) const { return Cfg::post(Cfg::pre(v)); }
  };

  // kIgemmOutChannelMoments epilogue: the pre-norm values pre(acc * s + bias) of the tile's valid
  // rows, per channel: {mean, m2} (column_moments in float: a tile's channel has at most BM
  // values; in double it measured the same within 10%, bench/notes/igemm_w3.md, and spilled) into
  // cpart[(n*kTiles + tile)*kC + co0 + c], where igemm_mean.cuh merges them in double. Nothing
  // else is written. REQUIRES: all threads; smem free for reuse.
  __device__ __forceinline__ static void epilogue_channel_moments(
      float (&acc)[MT][NT8][4], unsigned char* smem, float s, const ElemT<Cfg>* __restrict__ bias,
      IgemmChannelMoments* __restrict__ cpart, int tile, int co0, int n) {
    float* red = reinterpret_cast<float*>(smem);
    float* cmean = red + Tune::kWarpsM * BN;
    float* cm2 = cmean + BN;
    to_conv_output(acc, s, bias, co0);
    apply(acc, Pre{});
    const int sp0 = tile * BM;
    const int valid = Sh::kS - sp0 < BM ? Sh::kS - sp0 : BM;
    column_moments(acc, valid, red, cmean, cm2);
    IgemmChannelMoments* out = cpart + ((long long)n * Sh::kTiles + tile) * Cfg::kC + co0;
    for (int c = threadIdx.x; c < BN; c += NT)
      if (col_real(c, co0)) out[c] = IgemmChannelMoments{(double)cmean[c], (double)cm2[c]};
  }

  // kIgemmOutStoreY epilogue: scale, bias, pre() (and post() without group_norm), stored into y
  // from the registers; per-(tile, group) moments into partials. u non-null (the training
  // forward): acc * s + bias, the convolution's output, is stored into u (f32, the producer's
  // shape) as it is, and into y through pre() (and post()); the moments are pre()'s.
  // REQUIRES: all threads; smem free for reuse.
  __device__ __forceinline__ static void epilogue(float (&acc)[MT][NT8][4], unsigned char* smem,
                                                  float s, const ElemT<Cfg>* __restrict__ bias,
                                                  IgemmYT<Cfg>* __restrict__ y,
                                                  float* __restrict__ partials, int tile, int co0,
                                                  int n, float* __restrict__ u) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sp0 = tile * BM;
    const int valid = Sh::kS - sp0 < BM ? Sh::kS - sp0 : BM;
    to_conv_output(acc, s, bias, co0);
    if (u != nullptr) store_tile(acc, u, n, co0, sp0, valid, smem);
    apply(acc, Select<Cfg::kGroups == 0, PrePost, Pre>{});
    store_tile(acc, y, n, co0, sp0, valid, smem);
    if constexpr (Cfg::kGroups > 0) {
      // Each channel's {mean, m2} over the tile's valid rows (column_moments); then one warp per
      // part of a group in this tile merges its channels in channel order (all have `valid`
      // values: mean = the channels' means averaged, m2 = their m2 plus valid x the squared
      // deviations of their means, each a lane-strided sum and a fixed butterfly). A group wider
      // than the tile, or across a tile boundary, has one part per tile it touches
      // (gn_finalize_body merges them).
      float* red = reinterpret_cast<float*>(smem);
      float* cmean = red + Tune::kWarpsM * BN;
      float* cm2 = cmean + BN;
      column_moments(acc, valid, red, cmean, cm2);
      constexpr int kCg = Sh::kCg;
      constexpr int kWarps = NT / 32;
      const int c_end = Cfg::kC % BN != 0 && co0 + BN > Cfg::kC ? Cfg::kC : co0 + BN;
      const int g0 = co0 / kCg, g1 = (c_end - 1) / kCg;
      for (int g = g0 + warp; g <= g1; g += kWarps) {
        const int r0 = (g * kCg > co0 ? g * kCg : co0) - co0;
        const int r1 = ((g + 1) * kCg < c_end ? (g + 1) * kCg : c_end) - co0;
        float msum = 0.f;
        for (int r = r0 + lane; r < r1; r += 32) msum += cmean[r];
        const float gmean = warp_sum(msum) / (float)(r1 - r0);
        float dev = 0.f, m2sum = 0.f;
        for (int r = r0 + lane; r < r1; r += 32) {
          const float d = cmean[r] - gmean;
          dev = fmaf(d, d, dev);
          m2sum += cm2[r];
        }
        const float gm2 = fmaf((float)valid, warp_sum(dev), warp_sum(m2sum));
        if (lane == 0) {
          const int part = co0 / BN - (int)geom::IgemmGroupFirstTile(g, kCg, BN);
          float* p =
              partials +
              ((((long long)n * Cfg::kGroups + g) * Sh::kGroupParts + part) * Sh::kTiles + tile) *
                  3;
          p[0] = (float)valid * (float)(r1 - r0);
          p[1] = gmean;
          p[2] = gm2;
        }
      }
    }
  }
};

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the prep kernels in four precisions, with a config that suits them.
namespace fj_selftest_igemm {
struct Cfg : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 32, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 128, kD = 8, kH = 9, kW = 10;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
  static constexpr int kGroups = 4;
};
template <int kPrecV>
struct Tune {
  static constexpr int kPrec = kPrecV;
  static constexpr int kWarpsM = 4, kWarpsN = 1, kWM = 16, kWN = 128;
  static constexpr int kStages = 4, kFlushSteps = 2, kAbsmaxBlocks = 264;
};
}  // namespace fj_selftest_igemm
extern "C" __global__ void __launch_bounds__(256)
    igemm_absmax_selftest(const float* x, const float* w, float* absmax) {
  fj::igemm_absmax_body<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune<fj::kPrecF16x3>>(
      x, w, nullptr, absmax, fj_selftest_igemm::Cfg::kN);
}
extern "C" __global__ void __launch_bounds__(256, 8)
    igemm_prep_f16x3_selftest(const float* x, const float* w, const float* absmax,
                              unsigned char* xa, unsigned char* wb, float* scale) {
  fj::igemm_prep_body<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune<fj::kPrecF16x3>>(
      x, w, absmax, xa, wb, scale, fj_selftest_igemm::Cfg::kN);
}
extern "C" __global__ void __launch_bounds__(256, 8)
    igemm_prep_tf32_selftest(const float* x, const float* w, const float* absmax,
                             unsigned char* xa, unsigned char* wb, float* scale) {
  fj::igemm_prep_body<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune<fj::kPrecTF32x1>>(
      x, w, absmax, xa, wb, scale, fj_selftest_igemm::Cfg::kN);
}
extern "C" __global__ void __launch_bounds__(256, 8)
    igemm_prep_f16x1scaled_selftest(const float* x, const float* w, const float* absmax,
                                    unsigned char* xa, unsigned char* wb, float* scale) {
  fj::igemm_prep_body<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune<fj::kPrecF16x1Scaled>>(
      x, w, absmax, xa, wb, scale, fj_selftest_igemm::Cfg::kN);
}
namespace fj_selftest_igemm {
struct CfgBF16 : Cfg {
  using Elem = fj::bf16_t;
};
}  // namespace fj_selftest_igemm
extern "C" __global__ void __launch_bounds__(256, 8)
    igemm_prep_bf16x1_selftest(const fj::bf16_t* x, const fj::bf16_t* w, const float* absmax,
                               unsigned char* xa, unsigned char* wb, float* scale) {
  fj::igemm_prep_body<fj_selftest_igemm::CfgBF16, fj_selftest_igemm::Tune<fj::kPrecBF16x1>>(
      x, w, absmax, xa, wb, scale, fj_selftest_igemm::CfgBF16::kN);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_
