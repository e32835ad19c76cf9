// templates/igemm_wgmma.cuh: the main loop of the implicit GEMM (igemm_mma.cuh has its shape,
// prep kernels and epilogue) on Hopper's warpgroup tensor-core instructions (wgmma.mma_async,
// sm_90a):
//   - the input rows a tile needs (its "halo") are loaded into shared memory once per (kd, cb)
//     and reused by all kKH*kKW taps; input planes entirely in the padding for the tile are
//     skipped (no loads, no mma);
//   - each warpgroup (4 warps) owns 64 output points x BN channels (BN = 128, or 64 for narrow
//     layers: wgmma n = BN);
//   - a k-step is one 128-byte channel block of one tap (igemm_mma.cuh's CB): 32 channels
//     (TF32: four k8 wgmma; F16x3: two k16 slices of three products each) or 64 (BF16x1/F16x1:
//     four k16 wgmma); with one product, the last block runs only its slices that hold
//     channels (geom::IgemmSliceChannels: e.g. 2 of 4 for 32 bf16 channels);
//   - A (the gathered input rows) is loaded from the halo by ldmatrix into registers in the
//     wgmma register-fragment layout (identical to mma.m16n8k16 / m16n8k8 per warp) -- "RS"
//     wgmma, so the per-row gather stays free;
//   - B (weights) is read by the tensor cores straight from the shared-memory stage, whose
//     layout (128-byte rows, 16-byte chunks XOR row%8, 1024-byte aligned) is the canonical
//     K-major 128B-swizzle layout.
// Precisions as igemm_mma.cuh: kPrecTF32x1 (wgmma .tf32, m64nBNk8), kPrecF16x3 (wgmma .f16,
// m64nBNk16, three products, short-run accumulator flushed every kFlushSteps k-steps), or
// kPrecBF16x1 / kPrecF16x1 (wgmma .bf16 / .f16, one product; flushed the same way).
//
// ---- host-side contract -------------------------------------------------------------------
// Tune: kPrec, kWG (warpgroups per CTA), kStages (B stages), kFlushSteps, kAbsmaxBlocks, kAsync
// (0/1, see AsyncOf; optional), kOut (igemm_mma.cuh's IgemmOut; optional), kSplit (the
// reduction's (kd, cb) blocks split 1..geom::kIgemmMaxSplit ways, SplitOf; optional) and the fields
// igemm_mma.cuh reads, derived from them: kWarpsM = 4*kWG, kWarpsN = 1, kWM = 16, kWN = BN
// (IgemmWgmmaTune<> below fills them in; plans name IgemmPlanTune<Fixed, Tunables>, the same
// from two generated structs: Fixed {kPrec, kFlushSteps, kAbsmaxBlocks (264), kOut} and
// Tunables {kWG, kStages, kAsync, kBN}, the strategy's tunable parameters).
// BM = 64*kWG, BN = kBN, 128 or 64 (kC padded to whole tiles: zero weights, padding channels
// neither stored nor in any moments). Static requirements (besides igemm_mma.cuh's IgemmShape):
// BM <= kH*kW (a tile spans at most two output planes), kKD <= 8, kStages - 1 <= kKH*kKW,
// kStages >= 3 with kAsync, IgemmWgmmaShape<Cfg,Tune>::kSmemBytes within the device's opt-in
// shared memory (227 KB on the H100).
// Measured best for W3 on the H100 (bench/explore_w3/NOTES.md):
//   fp32-accurate: IgemmWgmmaTune<kPrecF16x3, 3, 7, 2> + kAsync = 1  (384 threads, 224 KB smem)
//   tf32:          IgemmWgmmaTune<kPrecTF32x1, 4, 5, 0> + kAsync = 1 (512 threads, 212 KB smem)
// Workspace, prep kernels, partials layout, launch order and gn_finalize/gn_apply: igemm_mma.cuh.
//   igemm_wgmma_body<Cfg,Tune>(xa, wb, bias, scale, y, partials, u)         (kIgemmOutStoreY)
//        (bias is ElemT<Cfg>; y is IgemmYT<Cfg>: without group_norm the chain's output in its
//        dtype, rounded once (igemm-store); with group_norm float pre-norm values -- the output
//        itself for f32 chains, a float workspace for bf16/f16 chains, normalized into the
//        output by gn_apply_out_body; u null, or (the training forward) where the convolution's
//        output is stored as well, f32)
//   igemm_wgmma_moments_body<Cfg,Tune>(xa, wb, bias, scale, channel partials)
//        (kIgemmOutChannelMoments; the chain may end in mean; nothing full-size written)
//   with SplitOf<Tune> = kSplit > 1 (the tunable "split") instead: igemm_wgmma_split_body(xa,
//        wb, kpart), grid z kN*kSplit, then igemm_wgmma_reduce_body(kpart, bias, scale, y,
//        partials, u) / igemm_wgmma_reduce_moments_body(kpart, bias, scale, channel partials),
//        grid z kN, dynamic smem IgemmShape::kEpiBytes
//        grid (IgemmShape::kTiles, ceil(kC/128), kN), block 128*kWG, __launch_bounds__(128*kWG, 1)
//        (several CTAs share an SM where shared memory and registers allow), dynamic smem
//        IgemmWgmmaShape<Cfg,Tune>::kSmemBytes (raise the attribute first). Needs an sm_90a
//        build (NVRTC --gpu-architecture=sm_90a); built for anything else it compiles, but prints
//        why and traps when run.
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_IGEMM_WGMMA_CUH_
#define FUSEJIT_TEMPLATES_IGEMM_WGMMA_CUH_

#include "igemm_mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FJ_HAS_WGMMA 1
#endif

namespace fj {

// A Tune for the wgmma kernel from its own parameters.
template <int kPrecV, int kWGV, int kStagesV, int kFlushV, int kAsyncV = 0,
          int kOutV = kIgemmOutStoreY, int kBNV = geom::kIgemmTileN, int kSplitV = 1>
struct IgemmWgmmaTune {
  static constexpr int kSplit = kSplitV;
  static constexpr int kPrec = kPrecV;
  static constexpr int kWG = kWGV;
  static constexpr int kWarpsM = 4 * kWGV, kWarpsN = 1, kWM = 16, kWN = kBNV;
  static constexpr int kStages = kStagesV;
  static constexpr int kFlushSteps = kFlushV;
  static constexpr int kAbsmaxBlocks = 264;
  static constexpr int kAsync = kAsyncV;
  static constexpr int kOut = kOutV;
};

// The Tune of a plan: the fixed fields (precision, flush, epilogue) and the tunable ones
// (warpgroups, stages, async, channel tile, split) from two generated structs.
template <class Fixed, class Tunables>
struct IgemmPlanTune
    : IgemmWgmmaTune<Fixed::kPrec, Tunables::kWG, Tunables::kStages, Fixed::kFlushSteps,
                     Tunables::kAsync, Fixed::kOut, Tunables::kBN, SplitOf<Tunables>::value> {
  static_assert(Fixed::kAbsmaxBlocks == 264, "igemm: the absmax pass has 264 blocks");
  static_assert(Tunables::kWG >= 1 && Tunables::kWG <= 4, "igemm_wgmma: 1 to 4 warpgroups");
  static_assert(Tunables::kAsync == 0 || Tunables::kAsync == 1, "igemm_wgmma: kAsync is 0 or 1");
  static_assert(Tunables::kBN == geom::kIgemmTileN || Tunables::kBN == geom::kIgemmTileNSmall,
                "igemm_wgmma: kBN is 128 or 64");
  static_assert(SplitOf<Tunables>::value >= 1 && SplitOf<Tunables>::value <= geom::kIgemmMaxSplit,
                "igemm_wgmma: kSplit in [1, geom::kIgemmMaxSplit]");
};

namespace igw {

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long desc_sw128(unsigned saddr) {
  unsigned long long d = (unsigned long long)((saddr >> 4) & 0x3FFFu);
  d |= (unsigned long long)(16 >> 4) << 16;    // leading byte offset (unused when swizzled)
  d |= (unsigned long long)(1024 >> 4) << 32;  // stride byte offset
  d |= 1ull << 62;                             // 128-byte swizzle
  return d;
}
__device__ __forceinline__ void fence() {
#ifdef FJ_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef FJ_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#ifdef FJ_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes (cp.async, st.shared) -> async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FJ_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Tell the compiler the accumulators change here (orders plain reads/writes of them against
// the asynchronous wgmma).
template <int NT8>
__device__ __forceinline__ void fence_operands(float (&d)[1][NT8][4]) {
#pragma unroll
  for (int j = 0; j < NT8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[0][j][e])::"memory");
}

// The accumulator operand lists: 32 (n = 64) or 64 (n = 128) floats per thread.
#define FJ_WG_D32                                                                            \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23," \
  "%24,%25,%26,%27,%28,%29,%30,%31}"
#define FJ_WG_D64                                                                            \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23," \
  "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,"  \
  "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define FJ_WG_OUT4(d, j) "+f"(d[0][j][0]), "+f"(d[0][j][1]), "+f"(d[0][j][2]), "+f"(d[0][j][3])
#define FJ_WG_OUT32(d)                                                                     \
  FJ_WG_OUT4(d, 0), FJ_WG_OUT4(d, 1), FJ_WG_OUT4(d, 2), FJ_WG_OUT4(d, 3), FJ_WG_OUT4(d, 4), \
      FJ_WG_OUT4(d, 5), FJ_WG_OUT4(d, 6), FJ_WG_OUT4(d, 7)
#define FJ_WG_OUT64(d)                                                                        \
  FJ_WG_OUT32(d), FJ_WG_OUT4(d, 8), FJ_WG_OUT4(d, 9), FJ_WG_OUT4(d, 10), FJ_WG_OUT4(d, 11),   \
      FJ_WG_OUT4(d, 12), FJ_WG_OUT4(d, 13), FJ_WG_OUT4(d, 14), FJ_WG_OUT4(d, 15)
// The operands after D: A (4 registers), the B descriptor and the accumulate flag.
#define FJ_WG_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
// One wgmma: D(64xN) (+)= A(64xK, registers) * B(KxN, smem desc), fp32 accumulate; accumulate
// == 0: D = A*B. INSTR names shape and types; SCALE_TRANS: ", 1, 1, 0" (16-bit types: scales and
// B's transpose) or ", 1, 1" (tf32). Operand numbers: N = 64: D %0-%31, A %32-%35, desc %36,
// flag %37; N = 128: %0-%63, %64-%67, %68, %69.
#define FJ_WG_MMA_ASM(INSTR, SCALE_TRANS, N)                                                   \
  if constexpr (N == 64) {                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned." \
                 "m64n64" INSTR " " FJ_WG_D32 ", {%32,%33,%34,%35}, %36, p" SCALE_TRANS ";\n}\n" \
                 : FJ_WG_OUT32(d)                                                              \
                 : FJ_WG_IN                                                                    \
                 : "memory");                                                                  \
  } else {                                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned." \
                 "m64n128" INSTR " " FJ_WG_D64 ", {%64,%65,%66,%67}, %68, p" SCALE_TRANS      \
                 ";\n}\n"                                                                      \
                 : FJ_WG_OUT64(d)                                                              \
                 : FJ_WG_IN                                                                    \
                 : "memory");                                                                  \
  }

// D(64xN) (+)= A(64x16, registers) * B(16xN, smem desc), fp16 in, fp32 accumulate.
// accumulate == 0: D = A*B. N = 64 or 128.
template <int N>
__device__ __forceinline__ void mma_f16(float (&d)[1][N / 8][4], const unsigned (&a)[4],
                                        unsigned long long desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma n: 64 or 128");
#ifdef FJ_HAS_WGMMA
  FJ_WG_MMA_ASM("k16.f32.f16.f16", ", 1, 1, 0", N)
#else
  __trap();
#endif
}
// The same with bf16 operands.
template <int N>
__device__ __forceinline__ void mma_bf16(float (&d)[1][N / 8][4], const unsigned (&a)[4],
                                         unsigned long long desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma n: 64 or 128");
#ifdef FJ_HAS_WGMMA
  FJ_WG_MMA_ASM("k16.f32.bf16.bf16", ", 1, 1, 0", N)
#else
  __trap();
#endif
}
// D(64xN) (+)= A(64x8, registers) * B(8xN, smem desc), tf32 in, fp32 accumulate.
template <int N>
__device__ __forceinline__ void mma_tf32(float (&d)[1][N / 8][4], const unsigned (&a)[4],
                                         unsigned long long desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma n: 64 or 128");
#ifdef FJ_HAS_WGMMA
  FJ_WG_MMA_ASM("k8.f32.tf32.tf32", ", 1, 1", N)
#else
  __trap();
#endif
}
// FJ_WG_D32/D64 and FJ_WG_OUT32/OUT64 stay defined: wgrad_wgmma.cuh's wgmma use them too.
#undef FJ_WG_MMA_ASM
#undef FJ_WG_IN

}  // namespace igw

// Halo geometry: the input rows of a tile's output rows, widened by the kernel's span.
template <class Cfg, class Tune>
struct HaloShape {
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kSpanH = (Cfg::kKH - 1) * Cfg::kDilH;
  static constexpr int kSpanW = (Cfg::kKW - 1) * Cfg::kDilW;
  static constexpr int kRmin = Sh::kStepH < 0 ? (Cfg::kKH - 1) * Sh::kStepH : 0;
  static constexpr int kCmin = Sh::kStepW < 0 ? (Cfg::kKW - 1) * Sh::kStepW : 0;
  static constexpr int kHW = Sh::kG.halo_cols;                // halo columns
  static constexpr int kRowsSpanned = Sh::kG.rows_spanned;
  static constexpr int kMaxSlots = Sh::kG.halo_rows;           // halo rows
  static constexpr int kPitch = geom::kIgemmHaloPitch;         // bytes per halo point
  static constexpr int kTapsHW = Cfg::kKH * Cfg::kKW;
  static_assert(Sh::kBM <= Cfg::kH * Cfg::kW, "igemm_wgmma: a tile must span at most 2 planes");
  static_assert(Cfg::kKD <= 8, "igemm_wgmma: kKD <= 8");
  static_assert(Tune::kStages - 1 <= kTapsHW,
                "igemm_wgmma: the next halo must be issued at least kStages-1 k-steps ahead");
};

namespace ig {
// A rows gathered from the halo: point p at halo + p * 144 (padded pitch, no swizzle needed:
// 8 consecutive points hit 8 different 16-byte bank groups).
template <int MT>
struct AAddrHalo {
  unsigned base;
  int hidx[MT];
  __device__ __forceinline__ unsigned operator()(int mi, int chunk) const {
    return base + hidx[mi] * 144 + chunk * 16;
  }
};
}  // namespace ig

template <class Cfg, class Tune>
struct IgemmWgmmaShape {
  using Hs = HaloShape<Cfg, Tune>;
  using Sh = IgemmShape<Cfg, Tune>;
  static constexpr int kHaloBytes = Sh::kG.halo_bytes;
  static constexpr int kBStageBytes = Sh::kG.b_stage_bytes;
  static constexpr int kPipeBytes = Sh::kG.pipe_bytes;
  static constexpr int kSmemBytes = Sh::kG.smem;  // the host's launch: the same function
  static_assert(Sh::kG.epi_bytes == Sh::kEpiBytes,
                "igemm_wgmma: host and template epilogue smem differ");
  static_assert((Sh::kBN == geom::kIgemmTileN || Sh::kBN == geom::kIgemmTileNSmall) &&
                    Tune::kWM == 16 && Tune::kWarpsN == 1 && Tune::kWarpsM == 4 * Tune::kWG,
                "igemm_wgmma: use IgemmWgmmaTune (warpgroup tile 64 x 128 or 64 x 64)");
  static_assert(Tune::kPrec == kPrecTF32x1 || Tune::kPrec == kPrecF16x3 ||
                    igemm_prec_x1(Tune::kPrec),
                "igemm_wgmma: precision TF32x1, F16x3, BF16x1, F16x1 or F16x1Scaled");
};

// Tune::kAsync when the tuning names it, else 0. 0: each k-step waits for its wgmma before
// the next barrier. 1: one k-step of wgmma stays in flight (A fragments double-buffered in
// registers, weights prefetched kStages-2 ahead), except at flush points.
template <class T, class = void>
struct AsyncOf {
  static constexpr int value = 0;
};
template <class T>
struct AsyncOf<T, void_t<decltype(T::kAsync)>> {
  static constexpr int value = T::kAsync;
};

template <class Cfg, class Tune>
struct IgemmWgmmaLoop {
  using K = IgemmCore<Cfg, Tune>;
  using Sh = typename K::Sh;
  using Hs = HaloShape<Cfg, Tune>;
  using Ws = IgemmWgmmaShape<Cfg, Tune>;
  static constexpr int BM = K::BM, BN = K::BN, NT = K::NT;
  static constexpr int kFlush = Tune::kFlushSteps;
  static constexpr bool kF16 = Tune::kPrec == kPrecF16x3;  // the split: three products, scaled
  static constexpr bool k16 = igemm_prec_16bit(Tune::kPrec);  // 16-bit operands, k16 per wgmma
  static constexpr bool kBF16 = Tune::kPrec == kPrecBF16x1;
  static constexpr int kSlices = Sh::kSlices;  // k16 (16-bit) or k8 (TF32) slices per k-step
  static_assert(kSlices == (kF16 ? 2 : 4), "igemm_wgmma: 2 (F16x3) or 4 k-slices per block");
  // Whether the last channel block's k-steps skip slices of padding only (one-product precisions:
  // geom::IgemmSliceChannels).
  static constexpr bool kPartialLast = Sh::kLastSlices < kSlices;
  static constexpr int kAsync = AsyncOf<Tune>::value;
  static constexpr int kAhead = kAsync ? Tune::kStages - 2 : Tune::kStages - 1;  // B prefetch
  static constexpr int kHWp = Cfg::kH * Cfg::kW;
  static constexpr int kSplit = SplitOf<Tune>::value;
  static_assert(kAhead >= 1, "igemm_wgmma: kAsync needs kStages >= 3");

  // kpart: per (sample, channel tile, tile, part) the CTA's accumulators in register order,
  // [NT8*4][NT] floats (consecutive threads at consecutive addresses); IgemmShape::kKPartFloats.
  __device__ __forceinline__ static long long part_base(int tile, int ctile, int n, int part) {
    return ((((long long)n * gridDim.y + ctile) * gridDim.x + tile) * kSplit + part) *
           (long long)(K::NT8 * 4 * NT);
  }
  __device__ __forceinline__ static void store_part(const float (&acc)[1][K::NT8][4],
                                                    float* __restrict__ kpart, int tile, int ctile,
                                                    int n, int part) {
    float* dst = kpart + part_base(tile, ctile, n, part) + threadIdx.x;
#pragma unroll
    for (int j = 0; j < K::NT8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[(j * 4 + e) * NT] = acc[0][j][e];
  }
  // acc = part 0 + part 1 + ... in part order. REQUIRES: the grid of the GEMM with z = kN.
  __device__ __forceinline__ static void sum_parts(float (&acc)[1][K::NT8][4],
                                                   const float* __restrict__ kpart, int tile,
                                                   int ctile, int n) {
    const float* src = kpart + part_base(tile, ctile, n, 0) + threadIdx.x;
#pragma unroll
    for (int j = 0; j < K::NT8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][j][e] = src[(j * 4 + e) * NT];
    for (int p = 1; p < kSplit; ++p) {
      src += K::NT8 * 4 * NT;
#pragma unroll
      for (int j = 0; j < K::NT8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] += src[(j * 4 + e) * NT];
    }
  }

  unsigned halo0, bstage0;
  const unsigned char* xs;
  const unsigned char* xa;
  const unsigned char* wb;
  int tid, co0, ld_c, ld_r, q;
  int od0, od1, oh0, slotsA, slots, nblocks, nks, hbase;
  int blk0;  // the first (kd, cb) block of this CTA's part of the reduction (split)
  unsigned kd_list;
  float acc[1][K::NT8][4];
  float part[1][K::NT8][4];
  unsigned abuf[2][4][4];  // [buffer][16-bit: hi k0, hi k1, lo k0, lo k1 | TF32: k0..k3][reg]

  __device__ __forceinline__ void load_halo(int blk, int hs) const {
    const int b = blk0 + blk;
    const int kd = (kd_list >> (4 * (b / Sh::kCB))) & 15u, cb = b % Sh::kCB;
    const unsigned dst0 = halo0 + hs * Ws::kHaloBytes;
    const int total = slots * Hs::kHW * 8;
    for (int i = tid; i < total; i += NT) {
      const int ch = i & 7, p = i >> 3;
      const int slot = p / Hs::kHW, c = p - slot * Hs::kHW;
      const bool inA = slot < slotsA;
      const int od = inA ? od0 : od1;
      const int ih = (inA ? oh0 * Sh::kStrH + slot : slot - slotsA) + Sh::kBaseH + Hs::kRmin;
      const int id = od * Sh::kStrD + Sh::kBaseD + kd * Sh::kStepD;
      const int iw = c + Sh::kBaseW + Hs::kCmin;
      const bool ok = id >= 0 && id < Cfg::kDin && ih >= 0 && ih < Cfg::kHin && iw >= 0 &&
                      iw < Cfg::kWin;
      const unsigned char* src =
          ok ? xs + ((id * Cfg::kHin + ih) * Cfg::kWin + iw) * Sh::kRowBytes + cb * 128 + ch * 16
             : xa;
      ig::cp_async16(dst0 + p * Hs::kPitch + ch * 16, src, ok);
    }
  }
  __device__ __forceinline__ void load_b(int ks, int slot) const {
    const int blk = blk0 + ks / Hs::kTapsHW, khw = ks % Hs::kTapsHW;
    const int kd = (kd_list >> (4 * (blk / Sh::kCB))) & 15u, cb = blk % Sh::kCB;
    K::load_b(bstage0 + slot * Ws::kBStageBytes, wb, kd * Hs::kTapsHW + khw, cb, co0, ld_r, ld_c);
  }
  __device__ __forceinline__ void fence_abuf(int b) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(abuf[b][i][e])::"memory");
  }

  // The products of one k-step: the first kLive k-slices of the stage (A from the halo by
  // ldmatrix into register buffer P, B from shared stage sb), committed as one wgmma group.
  template <int P, int kLive>
  __device__ __forceinline__ void products(const ig::AAddrHalo<1>& aaddr, unsigned sb, int ks) {
    unsigned(&a)[4][4] = abuf[P];
    if constexpr (k16) {
      // F16x3: two k16 slices, each a high (chunks 0-3) and a low (4-7) half; one product per
      // value (BF16x1/F16x1): four k16 slices of 64 packed channels.
#pragma unroll
      for (int k2 = 0; k2 < kLive; ++k2) {
        ig::ldsm_x4(aaddr(0, 2 * k2 + (q >> 1)), a[k2][0], a[k2][1], a[k2][2], a[k2][3]);
        if constexpr (kF16) {
          ig::ldsm_x4(aaddr(0, 4 + 2 * k2 + (q >> 1)), a[2 + k2][0], a[2 + k2][1], a[2 + k2][2],
                      a[2 + k2][3]);
        }
      }
      const bool first = kFlush > 0 && (ks % kFlush == 0);
      float(&dst)[1][K::NT8][4] = kFlush > 0 ? part : acc;
      if (first && ks > 0) {
        if constexpr (kAsync) igw::wait<0>();
        igw::fence_operands(part);
        K::add_into(acc, part);  // the finished run
      }
      igw::fence_operands(dst);
      igw::fence();
#pragma unroll
      for (int k2 = 0; k2 < kLive; ++k2) {
        const unsigned long long dh = igw::desc_sw128(sb + k2 * 32);
        const int acc_in = (first && k2 == 0) ? 0 : 1;
        if constexpr (kF16) {
          const unsigned long long dl = igw::desc_sw128(sb + 64 + k2 * 32);
          igw::mma_f16<BN>(dst, a[2 + k2], dh, acc_in);
          igw::mma_f16<BN>(dst, a[k2], dl, 1);
          igw::mma_f16<BN>(dst, a[k2], dh, 1);
        } else if constexpr (kBF16) {
          igw::mma_bf16<BN>(dst, a[k2], dh, acc_in);
        } else {
          igw::mma_f16<BN>(dst, a[k2], dh, acc_in);
        }
      }
      igw::commit();
    } else {
#pragma unroll
      for (int k4 = 0; k4 < kLive; ++k4) {
        ig::ldsm_x4(aaddr(0, 2 * k4 + (q >> 1)), a[k4][0], a[k4][1], a[k4][2], a[k4][3]);
      }
      igw::fence_operands(acc);
      igw::fence();
#pragma unroll
      for (int k4 = 0; k4 < kLive; ++k4) {
        igw::mma_tf32<BN>(acc, a[k4], igw::desc_sw128(sb + k4 * 32), 1);
      }
      igw::commit();
    }
  }

  // One k-step; P = register buffer of the A fragments (ks & 1 when kAsync).
  template <int P>
  __device__ __forceinline__ void step(int ks) {
    ig::cp_async_wait<kAhead - 1>();
    igw::fence_proxy_async();
    __syncthreads();  // stage ks visible; every warpgroup is past the k-step whose slot we refill
    const int blk = ks / Hs::kTapsHW, khw = ks - blk * Hs::kTapsHW;
    const int nxt = ks + kAhead;
    if (nxt < nks) load_b(nxt, nxt % Tune::kStages);
    if (khw == 0 && blk + 1 < nblocks) load_halo(blk + 1, (blk + 1) & 1);
    ig::cp_async_commit();
    const int kh = khw / Cfg::kKW, kw = khw - kh * Cfg::kKW;
    ig::AAddrHalo<1> aaddr;
    aaddr.base = halo0 + (blk & 1) * Ws::kHaloBytes;
    aaddr.hidx[0] = hbase + kh * Sh::kStepH * Hs::kHW + kw * Sh::kStepW;
    const unsigned sb = bstage0 + (ks % Tune::kStages) * Ws::kBStageBytes;
    // The last channel block runs only its slices that hold channels (CTA-uniform). Two
    // instantiations rather than a branch per slice: a branch inside the wgmma sequence made
    // ptxas inject warpgroup.arrive fences (C7519: "to allow use of registers in GMMA").
    if (kPartialLast && (blk0 + blk) % Sh::kCB == Sh::kCB - 1) {
      products<P, Sh::kLastSlices>(aaddr, sb, ks);
    } else {
      products<P, kSlices>(aaddr, sb, ks);
    }
    if constexpr (kAsync) {
      igw::wait<1>();   // the previous k-step's wgmma has finished ...
      fence_abuf(P ^ 1);  // ... so its A registers may be reused from here on
    } else {
      igw::wait<0>();
    }
    igw::fence_operands(acc);
    igw::fence_operands(part);
  }
};

// The epilogue Tune::kOut selects, from a CTA's sums (after the main loop or the split's adds).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_epilogue(
    float (&acc)[1][IgemmCore<Cfg, Tune>::NT8][4], unsigned char* smem,
    const float* __restrict__ scale, const ElemT<Cfg>* __restrict__ bias,
    IgemmYT<Cfg>* __restrict__ y, float* __restrict__ partials,
    IgemmChannelMoments* __restrict__ channel_partials, float* __restrict__ u, int tile, int co0,
    int n) {
  using L = IgemmWgmmaLoop<Cfg, Tune>;
  using K = typename L::K;
  // F16x3, F16x1Scaled: the products of x*sx and w*sw.
  const float s = igemm_prec_scaled(Tune::kPrec) ? scale[0] : 1.f;
  if constexpr (L::Sh::kOut == kIgemmOutChannelMoments) {
    K::epilogue_channel_moments(acc, smem, s, bias, channel_partials, tile, co0, n);
  } else {
    K::epilogue(acc, smem, s, bias, y, partials, tile, co0, n, u);
  }
}

// The GEMM for one (tile, channel tile, sample[, part of the split]) CTA, then the epilogue
// Tune::kOut selects (kSplit == 1) or its sums into kpart (kSplit > 1).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_run(const unsigned char* __restrict__ xa,
                                                const unsigned char* __restrict__ wb,
                                                const ElemT<Cfg>* __restrict__ bias,
                                                const float* __restrict__ scale,
                                                IgemmYT<Cfg>* __restrict__ y,
                                                float* __restrict__ partials,
                                                IgemmChannelMoments* __restrict__ channel_partials,
                                                float* __restrict__ u, float* __restrict__ kpart) {
  using L = IgemmWgmmaLoop<Cfg, Tune>;
  using K = typename L::K;
  using Sh = typename L::Sh;
  using Hs = typename L::Hs;
  using Ws = typename L::Ws;
  constexpr int BM = L::BM, BN = L::BN;
  constexpr int kHWp = L::kHWp;
  extern __shared__ __align__(1024) unsigned char smem[];
#if defined(__CUDA_ARCH__) && !defined(FJ_HAS_WGMMA)
  // Built without the sm_90a features (wgmma): refuse loudly instead of computing garbage.
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    printf("fusejit igemm_wgmma: this module was not compiled for sm_90a (wgmma needs "
           "--gpu-architecture=sm_90a); trapping\n");
  }
  __trap();
#endif

  L s;
  s.tid = threadIdx.x;
  const int lane = s.tid & 31, warp = s.tid >> 5;
  constexpr int kSplit = L::kSplit;
  const int tile = blockIdx.x, n = blockIdx.z / kSplit, part = blockIdx.z % kSplit;
  s.co0 = blockIdx.y * BN;
  s.xa = xa;
  s.wb = wb;
  s.xs = xa + (long long)n * Sh::kSin * Sh::kRowBytes;
  s.ld_c = s.tid & 7;
  s.ld_r = s.tid >> 3;
  s.q = lane >> 3;
  const int r8 = lane & 7;
  const unsigned smem0 = ig::smem_u32(smem);
  s.halo0 = smem0;
  s.bstage0 = smem0 + 2 * Ws::kHaloBytes;

  // Tile geometry: output planes od0 (rows oh0..) and, when the tile crosses into the next,
  // od1 (rows ..oh1); halo slots: the input rows those output rows read, plane A's then B's.
  const int sp0 = tile * BM;
  const int spl = (sp0 + BM < Sh::kS ? sp0 + BM : Sh::kS) - 1;
  s.od0 = sp0 / kHWp;
  s.oh0 = (sp0 / Cfg::kW) % Cfg::kH;
  s.od1 = spl / kHWp;
  const int oh1 = (spl / Cfg::kW) % Cfg::kH;
  const bool two = s.od1 != s.od0;
  s.slotsA = ((two ? Cfg::kH - 1 : oh1) - s.oh0) * Sh::kStrH + 1 + Hs::kSpanH;
  s.slots = s.slotsA + (two ? oh1 * Sh::kStrH + 1 + Hs::kSpanH : 0);
  s.kd_list = 0u;
  int nkd = 0;
#pragma unroll
  for (int kd = 0; kd < Cfg::kKD; ++kd) {
    const int ida = s.od0 * Sh::kStrD + Sh::kBaseD + kd * Sh::kStepD;
    const int idb = s.od1 * Sh::kStrD + Sh::kBaseD + kd * Sh::kStepD;
    const bool act = (ida >= 0 && ida < Cfg::kDin) || (two && idb >= 0 && idb < Cfg::kDin);
    if (act) {
      s.kd_list |= (unsigned)kd << (4 * nkd);
      ++nkd;
    }
  }
  // This CTA's blocks: part `part` of kSplit nearly equal runs of the tile's nkd*kCB blocks.
  s.blk0 = part * (nkd * Sh::kCB) / kSplit;
  s.nblocks = (part + 1) * (nkd * Sh::kCB) / kSplit - s.blk0;
  s.nks = s.nblocks * Hs::kTapsHW;
  {
    // This lane's ldmatrix row (warp w owns tile rows 16w..16w+15) -> halo point at tap 0.
    const int r = warp * 16 + r8 + ((s.q & 1) << 3);
    const int sp = sp0 + r < spl ? sp0 + r : spl;
    const int od = sp / kHWp, oh = (sp / Cfg::kW) % Cfg::kH, ow = sp % Cfg::kW;
    const int slot0 = od == s.od0 ? (oh - s.oh0) * Sh::kStrH : s.slotsA + oh * Sh::kStrH;
    s.hbase = (slot0 - Hs::kRmin) * Hs::kHW + ow * Sh::kStrW - Hs::kCmin;
  }
#pragma unroll
  for (int j = 0; j < K::NT8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s.acc[0][j][e] = 0.f;
      s.part[0][j][e] = 0.f;
    }

  if (s.nks > 0) s.load_halo(0, 0);
#pragma unroll
  for (int k = 0; k < L::kAhead; ++k) {
    if (k < s.nks) s.load_b(k, k);
    ig::cp_async_commit();
  }
  if constexpr (L::kAsync) {
    for (int ks = 0; ks < s.nks; ks += 2) {
      s.template step<0>(ks);
      if (ks + 1 < s.nks) s.template step<1>(ks + 1);
    }
    igw::wait<0>();
    igw::fence_operands(s.acc);
    igw::fence_operands(s.part);
  } else {
    for (int ks = 0; ks < s.nks; ++ks) s.template step<0>(ks);
  }
  if constexpr (L::k16 && L::kFlush > 0) {
    if (s.nks > 0) K::add_into(s.acc, s.part);
  }
  ig::cp_async_wait<0>();
  __syncthreads();
  if constexpr (kSplit > 1) {
    // A part of the reduction: the raw sums to kpart; igemm_wgmma_reduce_body adds the parts.
    L::store_part(s.acc, kpart, blockIdx.x, blockIdx.y, n, part);
  } else {
    igemm_wgmma_epilogue<Cfg, Tune>(s.acc, smem, scale, bias, y, partials, channel_partials, u,
                                    tile, s.co0, n);
  }
}

// kIgemmOutStoreY: pre-norm values into y, per-tile group moments into partials.
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_body(
    const unsigned char* __restrict__ xa, const unsigned char* __restrict__ wb,
    const ElemT<Cfg>* __restrict__ bias, const float* __restrict__ scale,
    IgemmYT<Cfg>* __restrict__ y, float* __restrict__ partials, float* __restrict__ u) {
  static_assert(IgemmOutOf<Tune>::value == kIgemmOutStoreY,
                "igemm_wgmma_body: Tune::kOut must be kIgemmOutStoreY");
  static_assert(SplitOf<Tune>::value == 1,
                "igemm_wgmma_body: kSplit 1 (else igemm_wgmma_split_body)");
  igemm_wgmma_run<Cfg, Tune>(xa, wb, bias, scale, y, partials, nullptr, u, nullptr);
}

// kIgemmOutChannelMoments: per-tile per-channel moments only (igemm_mean.cuh finalizes).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_moments_body(
    const unsigned char* __restrict__ xa, const unsigned char* __restrict__ wb,
    const ElemT<Cfg>* __restrict__ bias, const float* __restrict__ scale,
    IgemmChannelMoments* __restrict__ channel_partials) {
  static_assert(IgemmOutOf<Tune>::value == kIgemmOutChannelMoments,
                "igemm_wgmma_moments_body: Tune::kOut must be kIgemmOutChannelMoments");
  static_assert(SplitOf<Tune>::value == 1, "igemm_wgmma_moments_body: kSplit 1");
  igemm_wgmma_run<Cfg, Tune>(xa, wb, bias, scale, nullptr, nullptr, channel_partials, nullptr,
                             nullptr);
}

// kSplit > 1, either epilogue: the reduction over (kd, cb) blocks split kSplit ways (gridDim.z =
// kN*kSplit, z = n*kSplit + part); each CTA writes its raw sums into kpart
// (IgemmShape::kKPartFloats floats); then igemm_wgmma_reduce_body or _reduce_moments_body.
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_split_body(const unsigned char* __restrict__ xa,
                                                       const unsigned char* __restrict__ wb,
                                                       float* __restrict__ kpart) {
  static_assert(SplitOf<Tune>::value > 1, "igemm_wgmma_split_body: only for kSplit > 1");
  igemm_wgmma_run<Cfg, Tune>(xa, wb, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, kpart);
}

// kSplit > 1, the second kernel: adds the kSplit parts of one (tile, channel tile, sample) in
// part order (fixed: deterministic), then the epilogue. Launch: the GEMM's grid with gridDim.z =
// kN, its block, dynamic smem IgemmShape::kEpiBytes (raise the attribute above 48 KB).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_reduce_all(
    const float* __restrict__ kpart, const ElemT<Cfg>* __restrict__ bias,
    const float* __restrict__ scale, IgemmYT<Cfg>* __restrict__ y, float* __restrict__ partials,
    IgemmChannelMoments* __restrict__ channel_partials, float* __restrict__ u) {
  using L = IgemmWgmmaLoop<Cfg, Tune>;
  static_assert(L::kSplit > 1, "igemm_wgmma_reduce_body: only for kSplit > 1");
  extern __shared__ __align__(1024) unsigned char smem[];
  float acc[1][L::K::NT8][4];
  L::sum_parts(acc, kpart, blockIdx.x, blockIdx.y, blockIdx.z);
  igemm_wgmma_epilogue<Cfg, Tune>(acc, smem, scale, bias, y, partials, channel_partials, u,
                                  blockIdx.x, blockIdx.y * L::BN, blockIdx.z);
}
// kIgemmOutStoreY (as igemm_wgmma_body).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_reduce_body(const float* __restrict__ kpart,
                                                        const ElemT<Cfg>* __restrict__ bias,
                                                        const float* __restrict__ scale,
                                                        IgemmYT<Cfg>* __restrict__ y,
                                                        float* __restrict__ partials,
                                                        float* __restrict__ u) {
  static_assert(IgemmOutOf<Tune>::value == kIgemmOutStoreY,
                "igemm_wgmma_reduce_body: Tune::kOut must be kIgemmOutStoreY");
  igemm_wgmma_reduce_all<Cfg, Tune>(kpart, bias, scale, y, partials, nullptr, u);
}
// kIgemmOutChannelMoments (as igemm_wgmma_moments_body).
template <class Cfg, class Tune>
__device__ __forceinline__ void igemm_wgmma_reduce_moments_body(
    const float* __restrict__ kpart, const ElemT<Cfg>* __restrict__ bias,
    const float* __restrict__ scale, IgemmChannelMoments* __restrict__ channel_partials) {
  static_assert(IgemmOutOf<Tune>::value == kIgemmOutChannelMoments,
                "igemm_wgmma_reduce_moments_body: Tune::kOut must be kIgemmOutChannelMoments");
  igemm_wgmma_reduce_all<Cfg, Tune>(kpart, bias, scale, nullptr, nullptr, channel_partials,
                                    nullptr);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): both precisions, with a config that suits the kernel. Built for
// sm_90 rather than sm_90a it compiles, but traps when run.
namespace fj_selftest_igemm_wgmma {
struct Cfg : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 32, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 128, kD = 8, kH = 9, kW = 10;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
  static constexpr int kGroups = 4;
};
using TuneF16x3 = fj::IgemmWgmmaTune<fj::kPrecF16x3, 1, 4, 2, 1>;
using TuneTF32 = fj::IgemmWgmmaTune<fj::kPrecTF32x1, 1, 4, 0, 1>;
struct CfgBF16 : Cfg {
  using Elem = fj::bf16_t;
};
using TuneBF16 = fj::IgemmWgmmaTune<fj::kPrecBF16x1, 1, 4, 2, 1>;
struct CfgF16 : Cfg {
  using Elem = fj::f16_t;
};
using TuneF16x1 = fj::IgemmWgmmaTune<fj::kPrecF16x1, 1, 4, 0, 0>;
using TuneF16x1Scaled = fj::IgemmWgmmaTune<fj::kPrecF16x1Scaled, 1, 4, 0, 1>;
struct MeanCfg : Cfg {
  static constexpr int kMean = fj::kMeanAll;
};
using TuneMoments = fj::IgemmWgmmaTune<fj::kPrecF16x3, 1, 3, 2, 1, fj::kIgemmOutChannelMoments>;
struct Cfg64 : Cfg {
  static constexpr int kC = 64;
};
using TuneN64 = fj::IgemmWgmmaTune<fj::kPrecTF32x1, 1, 4, 0, 1, fj::kIgemmOutStoreY, 64>;
using TuneSplit = fj::IgemmWgmmaTune<fj::kPrecF16x3, 1, 4, 2, 1, fj::kIgemmOutStoreY, 128, 3>;
using TuneSplitMoments =
    fj::IgemmWgmmaTune<fj::kPrecTF32x1, 1, 4, 0, 1, fj::kIgemmOutChannelMoments, 64, 2>;
}  // namespace fj_selftest_igemm_wgmma
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_f16x1scaled_selftest(const unsigned char* xa, const unsigned char* wb,
                                     const float* bias, const float* scale, float* y,
                                     float* partials, float* u) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::Cfg, fj_selftest_igemm_wgmma::TuneF16x1Scaled>(
      xa, wb, bias, scale, y, partials, u);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_f16x3_selftest(const unsigned char* xa, const unsigned char* wb, const float* bias,
                               const float* scale, float* y, float* partials, float* u) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::Cfg, fj_selftest_igemm_wgmma::TuneF16x3>(
      xa, wb, bias, scale, y, partials, u);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_tf32_selftest(const unsigned char* xa, const unsigned char* wb, const float* bias,
                              const float* scale, float* y, float* partials) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::Cfg, fj_selftest_igemm_wgmma::TuneTF32>(
      xa, wb, bias, scale, y, partials, nullptr);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_bf16x1_selftest(const unsigned char* xa, const unsigned char* wb,
                                const fj::bf16_t* bias, const float* scale, float* y,
                                float* partials) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::CfgBF16, fj_selftest_igemm_wgmma::TuneBF16>(
      xa, wb, bias, scale, y, partials, nullptr);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_f16x1_selftest(const unsigned char* xa, const unsigned char* wb,
                               const fj::f16_t* bias, const float* scale, float* y,
                               float* partials) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::CfgF16, fj_selftest_igemm_wgmma::TuneF16x1>(
      xa, wb, bias, scale, y, partials, nullptr);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_n64_selftest(const unsigned char* xa, const unsigned char* wb, const float* bias,
                             const float* scale, float* y, float* partials) {
  fj::igemm_wgmma_body<fj_selftest_igemm_wgmma::Cfg64, fj_selftest_igemm_wgmma::TuneN64>(
      xa, wb, bias, scale, y, partials, nullptr);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_moments_selftest(const unsigned char* xa, const unsigned char* wb,
                                 const float* bias, const float* scale,
                                 fj::IgemmChannelMoments* cpart) {
  fj::igemm_wgmma_moments_body<fj_selftest_igemm_wgmma::MeanCfg,
                               fj_selftest_igemm_wgmma::TuneMoments>(xa, wb, bias, scale, cpart);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_split_selftest(const unsigned char* xa, const unsigned char* wb, float* kpart) {
  fj::igemm_wgmma_split_body<fj_selftest_igemm_wgmma::Cfg, fj_selftest_igemm_wgmma::TuneSplit>(
      xa, wb, kpart);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_reduce_selftest(const float* kpart, const float* bias, const float* scale, float* y,
                                float* partials, float* u) {
  fj::igemm_wgmma_reduce_body<fj_selftest_igemm_wgmma::Cfg, fj_selftest_igemm_wgmma::TuneSplit>(
      kpart, bias, scale, y, partials, u);
}
extern "C" __global__ void __launch_bounds__(128, 1)
    igemm_wgmma_reduce_moments_selftest(const float* kpart, const float* bias, const float* scale,
                                        fj::IgemmChannelMoments* cpart) {
  fj::igemm_wgmma_reduce_moments_body<fj_selftest_igemm_wgmma::MeanCfg,
                                      fj_selftest_igemm_wgmma::TuneSplitMoments>(kpart, bias, scale,
                                                                                 cpart);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_IGEMM_WGMMA_CUH_
