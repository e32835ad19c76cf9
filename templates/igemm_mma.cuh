// templates/igemm_mma.cuh: stride-1 conv3d / conv_transpose3d as an implicit GEMM on the tensor
// cores (mma.sync), with the chain's pre-norm elementwise ops and per-tile group_norm partial
// statistics in the epilogue. Plan "store-normalize" for expensive producers: this kernel writes
// the pre-norm values into y, gn_apply.cuh then normalizes y in place.
//
// GEMM view: rows m = output points (n, od, oh, ow) of one sample, columns = output channels,
// reduction k = (tap, ci) with tap = (kd*kKH + kh)*kKW + kw of the ORIGINAL weight indexing.
// Output point o reads input point i = o + base + k*step per dimension, with
//   conv3d:           base = -P, step = +Dil
//   conv_transpose3d: base = +P, step = -Dil       (stride 1 only)
// and zero where i is outside the input.
//
// Precision (Tune::kPrec):
//   kPrecTF32x1  one TF32 product (opt-in "tf32" mode, ~3e-4 relative).
//   kPrecTF32x3  3xTF32: a = a_big + a_small, b likewise, big*big + big*small + small*big.
//   kPrecF16x3   fp32-accurate via fp16 pairs: x*sx = xh + xl, w*sw = wh + wl (fp16 each, sx/sw
//                powers of two chosen from max|x|, max|w| so nothing overflows or underflows),
//                xh*wh + xh*wl + xl*wh with m16n8k16 (twice the TF32 rate), result / (sx*sw).
// The tensor cores truncate (round toward zero) when they add into the accumulator, which biases
// long sums (~1e-5 relative for K = 1728). Tune::kFlushSteps > 0 keeps a short-run accumulator
// that is added (round-to-nearest FADD) into the main accumulator every kFlushSteps k-steps.
//
// ---- host-side contract -------------------------------------------------------------------
// Notation: S = kD*kH*kW, Sin = kDin*kHin*kWin, T = kKD*kKH*kKW, CB = kCin/32,
//           BM = Tune::kWarpsM*Tune::kWM, BN = Tune::kWarpsN*Tune::kWN, G = kGroups,
//           tiles = ceil(S / BM)  (IgemmShape<Cfg,Tune>::kTiles), P = Tune::kAbsmaxBlocks.
// Tune fields: kPrec, kWarpsM, kWarpsN, kWM, kWN, kStages, kFlushSteps, kAbsmaxBlocks, and
// optionally kMaxRegs (register cap of the GEMM kernels; 255 if absent).
// Workspace (bytes, IgemmShape<Cfg,Tune>::k*Bytes; each offset 256-aligned by the host):
//   xa      kN*Sin*kCin*4     x, channels-last [n][d][h][w][cb][32 lanes]:
//                             kPrecTF32x1: fp32 values rounded to TF32 (cvt.rna);
//                             kPrecTF32x3: fp32 values; kPrecF16x3: per (point, cb) 32 fp16
//                             highs then 32 fp16 lows of x*sx (128 bytes per (point, cb) always).
//   wb      T*kC*kCin*4       weights [tap][co][cb][32 lanes], same encodings as xa (w*sw).
//   absmax  2*P floats        per-block max|x| (first P) and max|w| (next P)   (F16x3 only)
//   scale   1 float           1/(sx*sw) (F16x3 only; written by igemm_prep_kernel block 0)
//   partials kN*G*tiles*3 floats  Moments {count, mean, m2} at ((n*G + g)*tiles + tile)*3
// Kernels, in launch order (one stream; or per chunk of samples, see below):
//   1. igemm_absmax_kernel<Cfg,Tune>(x, weight, absmax, nsamples)   (F16x3 only)
//        grid P, block 256, no dynamic smem. Reads x[0, nsamples) and all weights.
//   2. igemm_prep_kernel<Cfg,Tune>(x, weight, absmax, xa, wb, scale, nsamples)
//        grid nsamples*IgemmShape::kPrepXBlocksPerSample [+ IgemmShape::kPrepWBlocks to also
//        convert the weights], block 256, no dynamic smem (9 KB static). Writes xa, wb, scale.
//   3. one GEMM kernel, grid (tiles, kC/BN, kN), block IgemmShape::kThreads:
//      igemm_mma_kernel<Cfg,Tune>  (im2col rows from global each k-step; v1)
//        dynamic smem IgemmShape::kSmemBytes;
//      igemm_halo_kernel<Cfg,Tune> (input rows staged once per (kd, cb) in smem; v2)
//        dynamic smem HaloShape<Cfg,Tune>::kSmemBytes; needs BM <= kH*kW;
//      igemm_wgmma_kernel (igemm_wgmma.cuh, sm_90a; fastest on the H100).
//      (> 48 KB of dynamic smem: raise cudaFuncAttributeMaxDynamicSharedMemorySize first.)
//      Reads xa, wb, bias (if kBias), scale; writes y (pre-norm values pre(conv + bias), NCDHW)
//      and partials (G > 0; with G == 0 it writes y = post(pre(conv + bias)) and is the last).
//   4. gn_finalize_kernel, 5. gn_apply_kernel (gn_apply.cuh) with kTiles = tiles.
// Samples may be processed in chunks [n0, n0+ns): pass x + n0*kCin*Sin, xa + n0*Sin*kCin*4,
// nsamples = ns, absmax/scale slots of the chunk; GEMM grid.z = ns with xa, y, partials offset
// by n0 samples; finalize/apply likewise (weights converted once, by the first chunk's prep).
// Results are bitwise identical either way (no atomics; every merge has a fixed order).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_
#define FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_

#include "default_config.cuh"

namespace fj {

enum IgemmPrec { kPrecTF32x1 = 0, kPrecTF32x3 = 1, kPrecF16x3 = 2 };

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
// D (+)= A*B, m16n8k8 TF32. kZero: D = A*B (accumulator input ignored).
template <bool kZero>
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, const unsigned* b) {
  if constexpr (kZero) {
    asm(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
  } else {
    asm(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
// D (+)= A*B, m16n8k16 fp16 inputs, fp32 accumulate.
template <bool kZero>
__device__ __forceinline__ void mma_f16(float* d, const unsigned* a, const unsigned* b) {
  if constexpr (kZero) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
__device__ __forceinline__ unsigned to_tf32(unsigned bits) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
  return r;
}
// a = big + small with big = tf32(a); small keeps the rest (the tensor core reads its top bits).
__device__ __forceinline__ void split_tf32(unsigned a, unsigned& big, unsigned& small) {
  big = to_tf32(a);
  small = __float_as_uint(__uint_as_float(a) - __uint_as_float(big));
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
// v rounded to TF32 (cvt.rna) when kRound, else unchanged.
template <bool kRound>
__device__ __forceinline__ float tf32_if(float v) {
  if constexpr (kRound) return __uint_as_float(to_tf32(__float_as_uint(v)));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace ig

// Tune::kMaxRegs when the tuning names one (a register cap that leaves room for helper blocks
// of other kernels on the same SM), else 255.
template <class...>
using void_t = void;
template <class T, class = void>
struct MaxRegsOf {
  static constexpr int value = 255;
};
template <class T>
struct MaxRegsOf<T, void_t<decltype(T::kMaxRegs)>> {
  static constexpr int value = T::kMaxRegs;
};

// Compile-time shape of the implicit GEMM for a chain and a tuning.
template <class Cfg, class Tune>
struct IgemmShape {
  static constexpr bool kTransposed = Cfg::kProducer == kConvTranspose3d;
  static constexpr int kS = Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kSin = Cfg::kDin * Cfg::kHin * Cfg::kWin;
  static constexpr int kTaps = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static constexpr int kCB = Cfg::kCin / 32;
  static constexpr int kKSteps = kTaps * kCB;
  static constexpr int kBM = Tune::kWarpsM * Tune::kWM;
  static constexpr int kBN = Tune::kWarpsN * Tune::kWN;
  static constexpr int kThreads = 32 * Tune::kWarpsM * Tune::kWarpsN;
  static constexpr int kTiles = (kS + kBM - 1) / kBM;
  static constexpr int kGroupsOr1 = Cfg::kGroups > 0 ? Cfg::kGroups : 1;
  static constexpr int kCg = Cfg::kC / kGroupsOr1;
  static constexpr int kRowBytes = Cfg::kCin * 4;  // bytes per point in xa (and per co in wb)
  // Input-point offset per dimension: i = o + kBase + k*kStep.
  static constexpr int kBaseD = kTransposed ? Cfg::kPD : -Cfg::kPD;
  static constexpr int kBaseH = kTransposed ? Cfg::kPH : -Cfg::kPH;
  static constexpr int kBaseW = kTransposed ? Cfg::kPW : -Cfg::kPW;
  static constexpr int kStepD = kTransposed ? -Cfg::kDilD : Cfg::kDilD;
  static constexpr int kStepH = kTransposed ? -Cfg::kDilH : Cfg::kDilH;
  static constexpr int kStepW = kTransposed ? -Cfg::kDilW : Cfg::kDilW;
  static constexpr int kStageBytes = (kBM + kBN) * 128;
  static constexpr int kPipeBytes = Tune::kStages * kStageBytes;
  static constexpr int kEpiPitch = kBM + 4;  // floats per channel row of the epilogue tile
  static constexpr int kEpiBytes = kBN * kEpiPitch * 4;
  static constexpr int kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
  // Workspace sizes.
  static constexpr long long kXaBytes = (long long)Cfg::kN * kSin * Cfg::kCin * 4;
  static constexpr long long kWbBytes = (long long)kTaps * Cfg::kC * Cfg::kCin * 4;
  static constexpr long long kPartialFloats = (long long)Cfg::kN * kGroupsOr1 * kTiles * 3;
  // Prep grid: x in blocks of 32 points x all channels, weights in blocks of 256 (tap,co,cb,chunk8).
  static constexpr int kPrepPts = 32;
  static constexpr int kPrepXBlocksPerSample = (kSin + kPrepPts - 1) / kPrepPts;
  static constexpr int kPrepXBlocks = Cfg::kN * kPrepXBlocksPerSample;
  static constexpr int kWChunks = kTaps * Cfg::kC * kCB * 4;  // 8-lane chunks
  static constexpr int kPrepWBlocks = (kWChunks + 255) / 256;

  static_assert(Cfg::kProducer == kConv3d || Cfg::kProducer == kConvTranspose3d,
                "igemm_mma: the producer must be conv3d or conv_transpose3d");
  static_assert(Cfg::kSD == 1 && Cfg::kSH == 1 && Cfg::kSW == 1,
                "igemm_mma: stride 1 only (split strided transposed convs into phases first)");
  static_assert(Cfg::kCin % 32 == 0, "igemm_mma: kCin must be a multiple of 32");
  static_assert(Cfg::kC % kBN == 0, "igemm_mma: kC must be a multiple of the tile width BN");
  static_assert(kTaps <= 32, "igemm_mma: at most 32 kernel taps (validity masks are 32-bit)");
  static_assert(Tune::kWM % 16 == 0 && Tune::kWN % 16 == 0, "igemm_mma: warp tile multiple of 16");
  static_assert(kThreads % 8 == 0, "igemm_mma: threads a multiple of 8");
  static_assert(Cfg::kGroups == 0 || (Cfg::kC % Cfg::kGroups == 0 && kBN % kCg == 0),
                "igemm_mma: a group's channels must not straddle channel tiles");
  static_assert(Cfg::kMean == kNoMean, "igemm_mma: mean reductions are not supported here");
  static_assert(Tune::kStages >= 2, "igemm_mma: at least 2 pipeline stages");
  static_assert(Tune::kFlushSteps >= 0, "igemm_mma: kFlushSteps >= 0");
  static_assert((long long)kSin * Cfg::kCin * 4 < (1ll << 31), "igemm_mma: sample too large");
};

// ---- 1. max|x| and max|w| per block (F16x3 scale selection) --------------------------------
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_absmax_body(const float* __restrict__ x,
                                                  const float* __restrict__ weight,
                                                  float* __restrict__ absmax, int nsamples) {
  using Sh = IgemmShape<Cfg, Tune>;
  __shared__ float red[2][32];
  const long long nx = (long long)nsamples * Cfg::kCin * Sh::kSin;
  const long long nw = (long long)Sh::kTaps * Cfg::kC * Cfg::kCin;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  float mx = 0.f, mw = 0.f;
  if (nx % 4 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (long long i = tid; i < nx / 4; i += stride) {
      const float4 v = x4[i];
      mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  } else {
    for (long long i = tid; i < nx; i += stride) mx = fmaxf(mx, fabsf(x[i]));
  }
  for (long long i = tid; i < nw; i += stride) mw = fmaxf(mw, fabsf(weight[i]));
  mx = ig::warp_max(mx);
  mw = ig::warp_max(mw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    red[0][warp] = mx;
    red[1][warp] = mw;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    mx = lane < nwarps ? red[0][lane] : 0.f;
    mw = lane < nwarps ? red[1][lane] : 0.f;
    mx = ig::warp_max(mx);
    mw = ig::warp_max(mw);
    if (lane == 0) {
      absmax[blockIdx.x] = mx;
      absmax[gridDim.x + blockIdx.x] = mw;
    }
  }
}

template <class Cfg, class Tune>
__global__ void __launch_bounds__(256, 8) igemm_absmax_kernel(const float* __restrict__ x,
                                                           const float* __restrict__ weight,
                                                           float* __restrict__ absmax,
                                                           int nsamples) {
  igemm_absmax_body<Cfg, Tune>(x, weight, absmax, nsamples);
}

// ---- 2. x -> channels-last xa, weights -> wb (both in the operand encoding) -----------------
// Encodes 8 consecutive channel values into 16 bytes (TF32: 2 x 16 B of fp32 -> caller) ...
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_prep_body(const float* __restrict__ x,
                                                const float* __restrict__ weight,
                                                const float* __restrict__ absmax,
                                                unsigned char* __restrict__ xa,
                                                unsigned char* __restrict__ wb,
                                                float* __restrict__ scale_out, int nsamples) {
  using Sh = IgemmShape<Cfg, Tune>;
  constexpr bool kF16 = Tune::kPrec == kPrecF16x3;
  __shared__ float tile[Cfg::kCin][Sh::kPrepPts + 1];
  float sx = 1.f, sw = 1.f;
  if constexpr (kF16) {
    // Every block derives the same scales from the absmax partials (max is order-free),
    // reading them cooperatively.
    __shared__ float red[2][32];
    float mx = 0.f, mw = 0.f;
    for (int i = threadIdx.x; i < Tune::kAbsmaxBlocks; i += blockDim.x) {
      mx = fmaxf(mx, absmax[i]);
      mw = fmaxf(mw, absmax[Tune::kAbsmaxBlocks + i]);
    }
    mx = ig::warp_max(mx);
    mw = ig::warp_max(mw);
    if ((threadIdx.x & 31) == 0) {
      red[0][threadIdx.x >> 5] = mx;
      red[1][threadIdx.x >> 5] = mw;
    }
    __syncthreads();
    mx = 0.f;
    mw = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
      mx = fmaxf(mx, red[0][i]);
      mw = fmaxf(mw, red[1][i]);
    }
    sx = ig::f16_scale_for(mx);
    sw = ig::f16_scale_for(mw);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_out[0] = 1.f / (sx * sw);
  }
  const int b = blockIdx.x;
  const int xblocks = nsamples * Sh::kPrepXBlocksPerSample;
  if (b < xblocks) {
    const int n = b / Sh::kPrepXBlocksPerSample;
    const int p0 = (b % Sh::kPrepXBlocksPerSample) * Sh::kPrepPts;
    const float* xs = x + (long long)n * Cfg::kCin * Sh::kSin;
    // Load [kCin][32 points], coalesced along points.
    for (int i = threadIdx.x; i < Cfg::kCin * Sh::kPrepPts; i += blockDim.x) {
      const int c = i / Sh::kPrepPts, p = i % Sh::kPrepPts;
      tile[c][p] = p0 + p < Sh::kSin ? xs[(long long)c * Sh::kSin + p0 + p] : 0.f;
    }
    __syncthreads();
    unsigned char* out = xa + ((long long)n * Sh::kSin + p0) * Sh::kRowBytes;
    // Each (point, cb, 8-channel chunk j): 16 B of highs + 16 B of lows (F16), or 32 B (TF32).
    for (int i = threadIdx.x; i < Sh::kPrepPts * Sh::kCB * 4; i += blockDim.x) {
      const int p = i / (Sh::kCB * 4), cb = (i / 4) % Sh::kCB, j = i % 4;
      if (p0 + p >= Sh::kSin) continue;
      unsigned char* row = out + (long long)p * Sh::kRowBytes + cb * 128;
      const int c0 = cb * 32 + j * 8;
      if constexpr (kF16) {
        unsigned hi[4], lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          unsigned short h[2], l[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float v = tile[c0 + 2 * e + q][p] * sx;
            h[q] = ig::f32_to_f16_rn(v);
            l[q] = ig::f32_to_f16_rn(v - ig::f16_to_f32(h[q]));
          }
          hi[e] = (unsigned)h[0] | ((unsigned)h[1] << 16);
          lo[e] = (unsigned)l[0] | ((unsigned)l[1] << 16);
        }
        *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(row + 64 + j * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      } else {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = ig::tf32_if<Tune::kPrec == kPrecTF32x1>(tile[c0 + e][p]);
        *reinterpret_cast<float4*>(row + j * 32) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(row + j * 32 + 16) = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
  } else {
    const int i = (b - xblocks) * 256 + threadIdx.x;
    if (i >= Sh::kWChunks) return;
    // i -> (tap, co, cb, j): 8 input channels ci = cb*32 + j*8 .. +7.
    const int j = i % 4, cb = (i / 4) % Sh::kCB, co = (i / (4 * Sh::kCB)) % Cfg::kC;
    const int tap = i / (4 * Sh::kCB * Cfg::kC);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int ci = cb * 32 + j * 8 + e;
      v[e] = Sh::kTransposed ? weight[((long long)ci * Cfg::kC + co) * Sh::kTaps + tap]
                             : weight[((long long)co * Cfg::kCin + ci) * Sh::kTaps + tap];
    }
    unsigned char* row = wb + (((long long)tap * Cfg::kC + co) * Sh::kCB + cb) * 128;
    if constexpr (kF16) {
      unsigned hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        unsigned short h[2], l[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float s = v[2 * e + q] * sw;
          h[q] = ig::f32_to_f16_rn(s);
          l[q] = ig::f32_to_f16_rn(s - ig::f16_to_f32(h[q]));
        }
        hi[e] = (unsigned)h[0] | ((unsigned)h[1] << 16);
        lo[e] = (unsigned)l[0] | ((unsigned)l[1] << 16);
      }
      *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(row + 64 + j * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = ig::tf32_if<Tune::kPrec == kPrecTF32x1>(v[e]);
      *reinterpret_cast<float4*>(row + j * 32) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(row + j * 32 + 16) = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

template <class Cfg, class Tune>
__global__ void __launch_bounds__(256, 8) igemm_prep_kernel(const float* __restrict__ x,
                                                         const float* __restrict__ weight,
                                                         const float* __restrict__ absmax,
                                                         unsigned char* __restrict__ xa,
                                                         unsigned char* __restrict__ wb,
                                                         float* __restrict__ scale_out,
                                                         int nsamples) {
  igemm_prep_body<Cfg, Tune>(x, weight, absmax, xa, wb, scale_out, nsamples);
}

// ---- 3. the implicit GEMM ----------------------------------------------------------------
// Shared pieces of the two GEMM kernels: warp-level k-step on the tensor cores and the epilogue.
template <class Cfg, class Tune>
struct IgemmCore {
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kPrec = Tune::kPrec;
  static constexpr int BM = Sh::kBM, BN = Sh::kBN, NT = Sh::kThreads;
  static constexpr int MT = Tune::kWM / 16;  // m16 tiles per warp
  static constexpr int NT8 = Tune::kWN / 8;  // n8 tiles per warp
  static constexpr int kFlush = Tune::kFlushSteps;

  // One k-step (32 reduction elements of one tap, cb) into dst. A rows come from
  // aaddr(mi, chunk) (lane's ldmatrix row of m-tile mi, 16-byte chunk of the 128-byte row);
  // B rows from the swizzled B stage at sb. kFirst: the first products start from zero (a new
  // flush run) instead of accumulating.
  template <bool kFirst, class AAddr>
  __device__ __forceinline__ static void compute(const AAddr& aaddr, unsigned sb, int b_row0,
                                                 int q, int r8, float (&dst)[MT][NT8][4]) {
    if constexpr (kPrec == kPrecF16x3) {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        unsigned ah[MT][4], al[MT][4], bh[NT8][2], bl[NT8][2];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          ig::ldsm_x4(aaddr(mi, 2 * ks + (q >> 1)), ah[mi][0], ah[mi][1], ah[mi][2], ah[mi][3]);
          ig::ldsm_x4(aaddr(mi, 4 + 2 * ks + (q >> 1)), al[mi][0], al[mi][1], al[mi][2],
                      al[mi][3]);
        }
#pragma unroll
        for (int p = 0; p < NT8 / 2; ++p) {
          const unsigned row = sb + (b_row0 + p * 16) * 128;
          ig::ldsm_x4(row + (((2 * ks + (q & 1)) ^ r8) << 4), bh[2 * p][0], bh[2 * p][1],
                      bh[2 * p + 1][0], bh[2 * p + 1][1]);
          ig::ldsm_x4(row + (((4 + 2 * ks + (q & 1)) ^ r8) << 4), bl[2 * p][0], bl[2 * p][1],
                      bl[2 * p + 1][0], bl[2 * p + 1][1]);
        }
        // Product-major order: consecutive mma write different accumulators.
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni) {
            if (kFirst && ks == 0) {
              ig::mma_f16<true>(dst[mi][ni], al[mi], bh[ni]);
            } else {
              ig::mma_f16<false>(dst[mi][ni], al[mi], bh[ni]);
            }
          }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni) ig::mma_f16<false>(dst[mi][ni], ah[mi], bl[ni]);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni) ig::mma_f16<false>(dst[mi][ni], ah[mi], bh[ni]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        unsigned a[MT][4], b[NT8][2];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
          ig::ldsm_x4(aaddr(mi, 2 * ks + (q >> 1)), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
        for (int p = 0; p < NT8 / 2; ++p) {
          const unsigned row = sb + (b_row0 + p * 16) * 128;
          ig::ldsm_x4(row + (((2 * ks + (q & 1)) ^ r8) << 4), b[2 * p][0], b[2 * p][1],
                      b[2 * p + 1][0], b[2 * p + 1][1]);
        }
        if constexpr (kPrec == kPrecTF32x1) {
          // Operands were rounded to TF32 (round-to-nearest-away) by igemm_prep_kernel.
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int ni = 0; ni < NT8; ++ni) {
              if (kFirst && ks == 0) {
                ig::mma_tf32<true>(dst[mi][ni], a[mi], b[ni]);
              } else {
                ig::mma_tf32<false>(dst[mi][ni], a[mi], b[ni]);
              }
            }
        } else {
          unsigned as[MT][4], bs[NT8][2];
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e) ig::split_tf32(a[mi][e], a[mi][e], as[mi][e]);
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) ig::split_tf32(b[ni][e], b[ni][e], bs[ni][e]);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int ni = 0; ni < NT8; ++ni) {
              if (kFirst && ks == 0) {
                ig::mma_tf32<true>(dst[mi][ni], as[mi], b[ni]);
              } else {
                ig::mma_tf32<false>(dst[mi][ni], as[mi], b[ni]);
              }
              ig::mma_tf32<false>(dst[mi][ni], a[mi], bs[ni]);
              ig::mma_tf32<false>(dst[mi][ni], a[mi], b[ni]);
            }
        }
      }
    }
  }

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
        wb + (((long long)tap * Cfg::kC + co0) * Sh::kCB + cb) * 128 + ld_c * 16;
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

  // Epilogue: scale, bias, pre() (and post() without group_norm), stage as [BN][BM+4] in smem,
  // coalesced stores of the valid rows to y, per-(tile, group) moments into partials.
  // REQUIRES: all threads; smem free for reuse.
  __device__ __forceinline__ static void epilogue(float (&acc)[MT][NT8][4], unsigned char* smem,
                                                  float s, const float* __restrict__ bias,
                                                  float* __restrict__ y,
                                                  float* __restrict__ partials, int tile,
                                                  int co0, int n) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp % Tune::kWarpsM, warp_n = warp / Tune::kWarpsM;
    float* epi = reinterpret_cast<float*>(smem);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp_m * Tune::kWM + mi * 16 + g + ((e >> 1) << 3);
          const int col = warp_n * Tune::kWN + ni * 8 + 2 * t + (e & 1);
          float v = acc[mi][ni][e] * s;
          if constexpr (Cfg::kBias) v += bias[co0 + col];
          v = Cfg::pre(v);
          if constexpr (Cfg::kGroups == 0) v = Cfg::post(v);
          epi[col * Sh::kEpiPitch + row] = v;
        }
    __syncthreads();
    const int sp0 = tile * BM;
    const int valid = Sh::kS - sp0 < BM ? Sh::kS - sp0 : BM;
    constexpr int kWarps = NT / 32;
    for (int r = warp; r < BN; r += kWarps) {
      float* dst = y + ((long long)n * Cfg::kC + co0 + r) * Sh::kS + sp0;
      const float* srow = epi + r * Sh::kEpiPitch;
      if constexpr (Sh::kS % 4 == 0 && BM % 4 == 0) {
        for (int m = lane * 4; m < valid; m += 128)
          *reinterpret_cast<float4*>(dst + m) = *reinterpret_cast<const float4*>(srow + m);
      } else {
        for (int m = lane; m < valid; m += 32) dst[m] = srow[m];
      }
    }
    if constexpr (Cfg::kGroups > 0) {
      // Per-group moments of this tile: two passes per lane over its values (fixed order),
      // then a fixed Chan tree over the lanes.
      constexpr int kGroupsHere = BN / Sh::kCg;
      for (int gl = warp; gl < kGroupsHere; gl += kWarps) {
        float sum = 0.f;
        int cnt = 0;
        for (int c = 0; c < Sh::kCg; ++c) {
          const float* srow = epi + (gl * Sh::kCg + c) * Sh::kEpiPitch;
          for (int m = lane; m < valid; m += 32) {
            sum += srow[m];
            ++cnt;
          }
        }
        Moments mo;
        mo.count = (float)cnt;
        mo.mean = cnt > 0 ? sum / (float)cnt : 0.f;
        float m2 = 0.f;
        for (int c = 0; c < Sh::kCg; ++c) {
          const float* srow = epi + (gl * Sh::kCg + c) * Sh::kEpiPitch;
          for (int m = lane; m < valid; m += 32) {
            const float d = srow[m] - mo.mean;
            m2 += d * d;
          }
        }
        mo.m2 = m2;
        for (int off = 16; off > 0; off >>= 1) mo = moments_merge(mo, shfl_down(mo, off));
        if (lane == 0) {
          const int gg = co0 / Sh::kCg + gl;
          float* p = partials + (((long long)n * Cfg::kGroups + gg) * Sh::kTiles + tile) * 3;
          p[0] = mo.count;
          p[1] = mo.mean;
          p[2] = mo.m2;
        }
      }
    }
  }
};

namespace ig {
// A rows of the im2col stage: BM rows of 128 bytes, XOR-swizzled.
struct AAddrIm2col {
  unsigned row0;  // stage + (lane's row of m-tile 0) * 128
  int r8;
  __device__ __forceinline__ unsigned operator()(int mi, int chunk) const {
    return row0 + mi * 16 * 128 + ((chunk ^ r8) << 4);
  }
};
// A rows gathered from the halo stage: point p at halo + p * kHaloPitch (padded pitch, no
// swizzle needed: 8 consecutive points hit 8 different 16-byte bank groups).
template <int MT>
struct AAddrHalo {
  unsigned base;
  int hidx[MT];
  __device__ __forceinline__ unsigned operator()(int mi, int chunk) const {
    return base + hidx[mi] * 144 + chunk * 16;
  }
};
}  // namespace ig

// v1: im2col rows gathered from global memory each k-step.
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_mma_body(const unsigned char* __restrict__ xa,
                                               const unsigned char* __restrict__ wb,
                                               const float* __restrict__ bias,
                                               const float* __restrict__ scale,
                                               float* __restrict__ y,
                                               float* __restrict__ partials) {
  using K = IgemmCore<Cfg, Tune>;
  using Sh = typename K::Sh;
  constexpr int BM = K::BM, BN = K::BN, NT = K::NT, MT = K::MT, NT8 = K::NT8;
  constexpr int kFlush = K::kFlush;
  constexpr int kARows = BM * 8 / NT;
  static_assert((BM * 8) % NT == 0, "igemm_mma: tile rows * 8 chunks must divide among threads");
  extern __shared__ __align__(1024) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % Tune::kWarpsM, warp_n = warp / Tune::kWarpsM;
  const int tile = blockIdx.x, n = blockIdx.z, co0 = blockIdx.y * BN;
  const unsigned char* xs = xa + (long long)n * Sh::kSin * Sh::kRowBytes;
  const int ld_c = tid & 7, ld_r = tid >> 3, q = lane >> 3, r8 = lane & 7;
  const unsigned smem0 = ig::smem_u32(smem);
  const int a_row0 = warp_m * Tune::kWM + r8 + ((q & 1) << 3);
  const int b_row0 = warp_n * Tune::kWN + r8 + ((q >> 1) << 3);

  // Per-thread A load rows: chunk ld_c of rows ld_r + j*(NT/8); offset at tap 0 + validity.
  int a_off[kARows];
  unsigned a_mask[kARows];
#pragma unroll
  for (int j = 0; j < kARows; ++j) {
    const int r = ld_r + j * (NT / 8);
    const int sp = tile * BM + r;
    a_off[j] = 0;
    a_mask[j] = 0u;
    if (sp < Sh::kS) {
      const int od = sp / (Cfg::kH * Cfg::kW), oh = (sp / Cfg::kW) % Cfg::kH, ow = sp % Cfg::kW;
      const int id0 = od + Sh::kBaseD, ih0 = oh + Sh::kBaseH, iw0 = ow + Sh::kBaseW;
      a_off[j] = ((id0 * Cfg::kHin + ih0) * Cfg::kWin + iw0) * Sh::kRowBytes + ld_c * 16;
      unsigned m = 0u;
#pragma unroll
      for (int kd = 0; kd < Cfg::kKD; ++kd) {
        const int id = id0 + kd * Sh::kStepD;
#pragma unroll
        for (int kh = 0; kh < Cfg::kKH; ++kh) {
          const int ih = ih0 + kh * Sh::kStepH;
#pragma unroll
          for (int kw = 0; kw < Cfg::kKW; ++kw) {
            const int iw = iw0 + kw * Sh::kStepW;
            const bool ok = id >= 0 && id < Cfg::kDin && ih >= 0 && ih < Cfg::kHin && iw >= 0 &&
                            iw < Cfg::kWin;
            m |= (ok ? 1u : 0u) << ((kd * Cfg::kKH + kh) * Cfg::kKW + kw);
          }
        }
      }
      a_mask[j] = m;
    }
  }
  auto load_stage = [&](int ks, int slot) {
    const int tap = ks / Sh::kCB, cb = ks % Sh::kCB;
    const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH,
              kw = tap % Cfg::kKW;
    const int toff =
        ((kd * Sh::kStepD * Cfg::kHin + kh * Sh::kStepH) * Cfg::kWin + kw * Sh::kStepW) *
            Sh::kRowBytes +
        cb * 128;
    const unsigned sa = smem0 + slot * Sh::kStageBytes;
#pragma unroll
    for (int j = 0; j < kARows; ++j) {
      const int r = ld_r + j * (NT / 8);
      const bool ok = (a_mask[j] >> tap) & 1u;
      const unsigned char* src = ok ? xs + (a_off[j] + toff) : xa;
      ig::cp_async16(sa + r * 128 + ((ld_c ^ (r & 7)) << 4), src, ok);
    }
    K::load_b(sa + BM * 128, wb, tap, cb, co0, ld_r, ld_c);
  };

  float acc[MT][NT8][4];
  float part[MT][NT8][4];  // short-run accumulator (kFlush > 0 only)
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

#pragma unroll
  for (int s = 0; s < Tune::kStages - 1; ++s) {
    if (s < Sh::kKSteps) load_stage(s, s);
    ig::cp_async_commit();
  }
  for (int ks = 0; ks < Sh::kKSteps; ++ks) {
    ig::cp_async_wait<Tune::kStages - 2>();
    __syncthreads();
    const int nxt = ks + Tune::kStages - 1;
    if (nxt < Sh::kKSteps) load_stage(nxt, nxt % Tune::kStages);
    ig::cp_async_commit();
    const unsigned sa = smem0 + (ks % Tune::kStages) * Sh::kStageBytes;
    const ig::AAddrIm2col aaddr{sa + a_row0 * 128, r8};
    const unsigned sb = sa + BM * 128;
    if constexpr (kFlush > 0) {
      if (ks % kFlush == 0) {
        if (ks > 0) K::add_into(acc, part);
        K::template compute<true>(aaddr, sb, b_row0, q, r8, part);
      } else {
        K::template compute<false>(aaddr, sb, b_row0, q, r8, part);
      }
    } else {
      K::template compute<false>(aaddr, sb, b_row0, q, r8, acc);
    }
  }
  if constexpr (kFlush > 0) K::add_into(acc, part);
  ig::cp_async_wait<0>();
  __syncthreads();  // pipeline smem is reused by the epilogue
  K::epilogue(acc, smem, K::kPrec == kPrecF16x3 ? scale[0] : 1.f, bias, y, partials, tile, co0, n);
}

template <class Cfg, class Tune>
__global__ void __maxnreg__(MaxRegsOf<Tune>::value)
    igemm_mma_kernel(const unsigned char* __restrict__ xa, const unsigned char* __restrict__ wb,
                     const float* __restrict__ bias, const float* __restrict__ scale,
                     float* __restrict__ y, float* __restrict__ partials) {
  igemm_mma_body<Cfg, Tune>(xa, wb, bias, scale, y, partials);
}

// v2: the input rows a tile needs (its "halo") are loaded into shared memory once per
// (kd, cb) and reused by all kKH*kKW taps; the taps' A rows are gathered from there by
// ldmatrix's per-lane row addresses. Input planes that are entirely padding for the tile are
// skipped (no loads, no mma).
template <class Cfg, class Tune>
struct HaloShape {
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kSpanH = (Cfg::kKH - 1) * Cfg::kDilH;
  static constexpr int kSpanW = (Cfg::kKW - 1) * Cfg::kDilW;
  static constexpr int kRmin = Sh::kStepH < 0 ? (Cfg::kKH - 1) * Sh::kStepH : 0;
  static constexpr int kCmin = Sh::kStepW < 0 ? (Cfg::kKW - 1) * Sh::kStepW : 0;
  static constexpr int kHW = Cfg::kW + kSpanW;  // halo columns
  static constexpr int kRowsSpanned = (Sh::kBM - 1 + Cfg::kW - 1) / Cfg::kW + 1;
  static constexpr int kMaxSlots = kRowsSpanned + 2 * kSpanH;  // halo rows
  static constexpr int kPitch = 144;                          // bytes per halo point
  static constexpr int kHaloBytes = (kMaxSlots * kHW * kPitch + 127) / 128 * 128;
  static constexpr int kBStageBytes = Sh::kBN * 128;
  static constexpr int kPipeBytes = 2 * kHaloBytes + Tune::kStages * kBStageBytes;
  static constexpr int kSmemBytes = kPipeBytes > Sh::kEpiBytes ? kPipeBytes : Sh::kEpiBytes;
  static constexpr int kTapsHW = Cfg::kKH * Cfg::kKW;
  static_assert(Sh::kBM <= Cfg::kH * Cfg::kW, "igemm_halo: a tile must span at most 2 planes");
  static_assert(Cfg::kKD <= 8, "igemm_halo: kKD <= 8");
  static_assert(Tune::kStages - 1 <= kTapsHW,
                "igemm_halo: the next halo must be issued at least kStages-1 k-steps ahead");
};

template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_halo_body(const unsigned char* __restrict__ xa,
                                                const unsigned char* __restrict__ wb,
                                                const float* __restrict__ bias,
                                                const float* __restrict__ scale,
                                                float* __restrict__ y,
                                                float* __restrict__ partials) {
  using K = IgemmCore<Cfg, Tune>;
  using Sh = typename K::Sh;
  using Hs = HaloShape<Cfg, Tune>;
  constexpr int BM = K::BM, BN = K::BN, NT = K::NT, MT = K::MT, NT8 = K::NT8;
  constexpr int kFlush = K::kFlush;
  constexpr int kHWp = Cfg::kH * Cfg::kW;
  extern __shared__ __align__(1024) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % Tune::kWarpsM, warp_n = warp / Tune::kWarpsM;
  const int tile = blockIdx.x, n = blockIdx.z, co0 = blockIdx.y * BN;
  const unsigned char* xs = xa + (long long)n * Sh::kSin * Sh::kRowBytes;
  const int ld_c = tid & 7, ld_r = tid >> 3, q = lane >> 3, r8 = lane & 7;
  const unsigned smem0 = ig::smem_u32(smem);
  const unsigned halo0 = smem0, bstage0 = smem0 + 2 * Hs::kHaloBytes;
  const int b_row0 = warp_n * Tune::kWN + r8 + ((q >> 1) << 3);

  // Tile geometry: output rows of plane od0 from oh0 (segment A) and, if the tile crosses
  // into plane od1 = od0 + 1, rows 0..oh1 (segment B). Halo slots: A's rows, then B's.
  const int sp0 = tile * BM;
  const int spl = (sp0 + BM < Sh::kS ? sp0 + BM : Sh::kS) - 1;
  const int od0 = sp0 / kHWp, oh0 = (sp0 / Cfg::kW) % Cfg::kH;
  const int od1 = spl / kHWp, oh1 = (spl / Cfg::kW) % Cfg::kH;
  const bool two = od1 != od0;
  const int slotsA = (two ? Cfg::kH - 1 : oh1) - oh0 + 1 + Hs::kSpanH;
  const int slots = slotsA + (two ? oh1 + 1 + Hs::kSpanH : 0);
  // Active kd (the plane of some segment is inside the input), packed 4 bits each.
  unsigned kd_list = 0u;
  int nkd = 0;
#pragma unroll
  for (int kd = 0; kd < Cfg::kKD; ++kd) {
    const int ida = od0 + Sh::kBaseD + kd * Sh::kStepD, idb = od1 + Sh::kBaseD + kd * Sh::kStepD;
    const bool act = (ida >= 0 && ida < Cfg::kDin) || (two && idb >= 0 && idb < Cfg::kDin);
    if (act) {
      kd_list |= (unsigned)kd << (4 * nkd);
      ++nkd;
    }
  }
  const int nblocks = nkd * Sh::kCB;       // (kd, cb) halo blocks
  const int nks = nblocks * Hs::kTapsHW;  // k-steps

  // Lane's A rows: halo point of each of its m-tile rows at tap (0,0,0).
  ig::AAddrHalo<MT> aaddr;
  int hbase[MT];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    const int r = warp_m * Tune::kWM + mi * 16 + r8 + ((q & 1) << 3);
    const int sp = sp0 + r < spl ? sp0 + r : spl;  // rows past the end: any valid point
    const int od = sp / kHWp, oh = (sp / Cfg::kW) % Cfg::kH, ow = sp % Cfg::kW;
    const int slot0 = od == od0 ? oh - oh0 : slotsA + oh;
    hbase[mi] = (slot0 - Hs::kRmin) * Hs::kHW + ow - Hs::kCmin;
  }

  auto load_halo = [&](int blk, int hs) {
    const int kd = (kd_list >> (4 * (blk / Sh::kCB))) & 15u, cb = blk % Sh::kCB;
    const unsigned dst0 = halo0 + hs * Hs::kHaloBytes;
    const int total = slots * Hs::kHW * 8;
    for (int i = tid; i < total; i += NT) {
      const int ch = i & 7, p = i >> 3;
      const int slot = p / Hs::kHW, c = p - slot * Hs::kHW;
      const bool inA = slot < slotsA;
      const int od = inA ? od0 : od1;
      const int ih = (inA ? oh0 + slot : slot - slotsA) + Sh::kBaseH + Hs::kRmin;
      const int id = od + Sh::kBaseD + kd * Sh::kStepD;
      const int iw = c + Sh::kBaseW + Hs::kCmin;
      const bool ok = id >= 0 && id < Cfg::kDin && ih >= 0 && ih < Cfg::kHin && iw >= 0 &&
                      iw < Cfg::kWin;
      const unsigned char* src =
          ok ? xs + ((id * Cfg::kHin + ih) * Cfg::kWin + iw) * Sh::kRowBytes + cb * 128 + ch * 16
             : xa;
      ig::cp_async16(dst0 + p * Hs::kPitch + ch * 16, src, ok);
    }
  };
  auto load_b = [&](int ks, int slot) {
    const int blk = ks / Hs::kTapsHW, khw = ks % Hs::kTapsHW;
    const int kd = (kd_list >> (4 * (blk / Sh::kCB))) & 15u, cb = blk % Sh::kCB;
    K::load_b(bstage0 + slot * Hs::kBStageBytes, wb, kd * Hs::kTapsHW + khw, cb, co0, ld_r, ld_c);
  };

  float acc[MT][NT8][4];
  float part[MT][NT8][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  if (nks > 0) load_halo(0, 0);
#pragma unroll
  for (int s = 0; s < Tune::kStages - 1; ++s) {
    if (s < nks) load_b(s, s);
    ig::cp_async_commit();
  }
  for (int ks = 0; ks < nks; ++ks) {
    ig::cp_async_wait<Tune::kStages - 2>();
    __syncthreads();
    const int blk = ks / Hs::kTapsHW, khw = ks - blk * Hs::kTapsHW;
    const int nxt = ks + Tune::kStages - 1;
    if (nxt < nks) load_b(nxt, nxt % Tune::kStages);
    if (khw == 0 && blk + 1 < nblocks) load_halo(blk + 1, (blk + 1) & 1);
    ig::cp_async_commit();
    const int kh = khw / Cfg::kKW, kw = khw - kh * Cfg::kKW;
    const int toff = kh * Sh::kStepH * Hs::kHW + kw * Sh::kStepW;
    aaddr.base = halo0 + (blk & 1) * Hs::kHaloBytes;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) aaddr.hidx[mi] = hbase[mi] + toff;
    const unsigned sb = bstage0 + (ks % Tune::kStages) * Hs::kBStageBytes;
    if constexpr (kFlush > 0) {
      if (ks % kFlush == 0) {
        if (ks > 0) K::add_into(acc, part);
        K::template compute<true>(aaddr, sb, b_row0, q, r8, part);
      } else {
        K::template compute<false>(aaddr, sb, b_row0, q, r8, part);
      }
    } else {
      K::template compute<false>(aaddr, sb, b_row0, q, r8, acc);
    }
  }
  if constexpr (kFlush > 0) {
    if (nks > 0) K::add_into(acc, part);
  }
  ig::cp_async_wait<0>();
  __syncthreads();
  K::epilogue(acc, smem, K::kPrec == kPrecF16x3 ? scale[0] : 1.f, bias, y, partials, tile, co0, n);
}

template <class Cfg, class Tune>
__global__ void __maxnreg__(MaxRegsOf<Tune>::value)
    igemm_halo_kernel(const unsigned char* __restrict__ xa, const unsigned char* __restrict__ wb,
                      const float* __restrict__ bias, const float* __restrict__ scale,
                      float* __restrict__ y, float* __restrict__ partials) {
  igemm_halo_body<Cfg, Tune>(xa, wb, bias, scale, y, partials);
}

// A tuning that fits the default config (and W3-like shapes).
struct IgemmTuneDefault {
  static constexpr int kPrec = kPrecF16x3;
  static constexpr int kWarpsM = 2, kWarpsN = 4, kWM = 64, kWN = 32;
  static constexpr int kStages = 4;
  static constexpr int kFlushSteps = 2;
  static constexpr int kAbsmaxBlocks = 264;
};

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate every kernel with a config that suits these kernels.
namespace fj_selftest_igemm {
struct Cfg : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 32, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 32, kD = 8, kH = 9, kW = 10;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
  static constexpr int kGroups = 4;
};
struct Tune : fj::IgemmTuneDefault {
  static constexpr int kWarpsM = 2, kWarpsN = 1, kWM = 32, kWN = 32;
};
}  // namespace fj_selftest_igemm
template __global__ void fj::igemm_absmax_kernel<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune>(
    const float*, const float*, float*, int);
template __global__ void fj::igemm_prep_kernel<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune>(
    const float*, const float*, const float*, unsigned char*, unsigned char*, float*, int);
template __global__ void fj::igemm_mma_kernel<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune>(
    const unsigned char*, const unsigned char*, const float*, const float*, float*, float*);
template __global__ void fj::igemm_halo_kernel<fj_selftest_igemm::Cfg, fj_selftest_igemm::Tune>(
    const unsigned char*, const unsigned char*, const float*, const float*, float*, float*);
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_IGEMM_MMA_CUH_
