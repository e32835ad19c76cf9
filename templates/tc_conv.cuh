// templates/tc_conv.cuh: the tensor-core convolution engine (strategy family "tc-*",
// codegen/tc_conv_strategy.cc): an implicit GEMM on mma.sync (sm_80 and later) for conv3d and
// conv_transpose3d of any channel counts, kernel, stride, padding, dilation and output_padding,
// with the chain's pre-norm ops fused into its epilogue.
//
// The GEMM: rows = output points of one sample, columns = output channels, k = (tap, input
// channel). A transposed convolution is split into output phases (o % stride per dim): within a
// phase every output point uses the same taps, so each phase is a dense GEMM over only the taps
// that reach it (no multiply by a structural zero). One description serves both producers: for
// phase point q (per dim) and tap k,
//     input coordinate  i = q * kMul + off(k)      (conv: kMul = stride, off = k*dil - pad;
//                                                   transposed: kMul = 1,
//                                                   off = (p + pad - k*dil) / stride, taps with
//                                                   (p + pad - k*dil) % stride == 0 only)
//     output coordinate o = q * kOStride + p        (conv: kOStride = 1, p = 0;
//                                                   transposed: kOStride = stride)
// Precision: Fixed::kPrec == kTcPrec3xTF32 (fp32-accurate) splits both operands into TF32
// big + small parts and runs three products (small*big + big*small + big*big); kTcPrecTF32 runs
// one TF32 product; kTcPrec16 (bf16/f16 chains) keeps x and the weights in the chain's 16-bit
// dtype and runs one m16n8k16 product (exact in fp32, twice TF32's rate, half the bytes).
// The operands live in shared memory as 32-bit words either way (TcOpT: a float, or two 16-bit
// values), so tiles, pitches, ldmatrix addressing and cp.async segments are the same in bytes;
// only the k a word holds differs (TcShape::kElemsPerWord).
//
// ---- host-side contract -------------------------------------------------------------------
// Template parameters: Cfg (the chain), Fixed {kPrec, kOut, kWarpsM, kWarpsN}, Tune {kBM, kBN,
// kBK, kStages}. TcShape<Cfg, Fixed, Tune> holds every derived size; static_asserts below
// list what must hold (the strategy checks each before compiling).
// Kernel bodies, in launch order:
//   tc_prep_body: grid TcShape::kPrepBlocks, block 256, no dynamic smem.
//       x [N][Cin][Sin] -> xcl [N][Sin][kCinPad] (TcOpT; channels-last, zero-padded channels;
//       32 x 32 tiles through shared memory, or a point a thread below 32 channels);
//       weight -> wt [kTaps][kCPad][kCinPad] (TcOpT, zero-padded; 3xTF32: big parts, wts the
//       small);
//       zeroes the kCounters split-K tile counters.
//   Split-K (kSplit > 1): kpart holds kN*kTiles*kCTiles*kSplit*kBM*kBN floats.
//   tc_conv_body: grid (TcShape::kTiles, kCTiles * kSplit, kN), block kThreads, dynamic smem
//       TcShape::kSmemBytes. Tile t of a sample covers min(kBM, M_p - m0) points of one phase.
//       Epilogue: v = pre(acc + bias[c]); then by Fixed::kOut
//         kTcStoreFinal    dst[n][c][o] = v                        (the chain's y)
//         kTcStorePreNorm  dst[n][c][o] = v, cpart = tile moments  (y or a workspace)
//         kTcMomentsOnly   cpart = tile moments (nothing full-size)
//       cpart: TcChannelMoments [kN][kTiles][kC] (count, mean, m2 of v over the tile's points).
//       u: null, or (the training forward: codegen::SaveProducerOutput binds it) where the
//       convolution's output acc + bias[c] is stored as well, float [n][c][o] (ULayout::kNCDHW).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_TC_CONV_CUH_
#define FUSEJIT_TEMPLATES_TC_CONV_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "mma_tf32.cuh"

namespace fj {

enum TcPrec { kTcPrecTF32 = 0, kTcPrec3xTF32 = 1, kTcPrec16 = 2 };
enum TcOut { kTcStoreFinal = 0, kTcStorePreNorm = 1, kTcMomentsOnly = 2 };

struct TcChannelMoments {
  double count, mean, m2;
};

// The element type of tc_conv_body's dst: the chain's y in its dtype for kTcStoreFinal (rounded
// once), else float pre-norm values (y itself for f32 chains, a workspace otherwise).
template <class Cfg, class Fixed>
using TcDstT = Select<Fixed::kOut == kTcStoreFinal, ElemT<Cfg>, float>;

// The GEMM operands' element type: the chain's 16-bit dtype for kTcPrec16, else float.
template <class Cfg, class Fixed>
using TcOpT = Select<Fixed::kPrec == kTcPrec16, ElemT<Cfg>, float>;

// Per-dimension geometry of the GEMM (see the file comment).
struct TcDim {
  int in, out, k, stride, pad, dil;
  bool transposed;
  __host__ __device__ constexpr int phases() const { return transposed ? stride : 1; }
  // Output points of phase p: o in [0, out) with o % stride == p.
  __host__ __device__ constexpr int extent(int p) const {
    return transposed ? (p < out ? (out - p + stride - 1) / stride : 0) : out;
  }
  __host__ __device__ constexpr int mul() const { return transposed ? 1 : stride; }
  __host__ __device__ constexpr int ostride() const { return transposed ? stride : 1; }
  // Whether tap k reaches phase p, and its input offset.
  __host__ __device__ constexpr bool reaches(int p, int kk) const {
    return transposed ? (((p + pad - kk * dil) % stride) + stride) % stride == 0 : true;
  }
  __host__ __device__ constexpr int offset(int p, int kk) const {
    return transposed ? (p + pad - kk * dil) / stride : kk * dil - pad;
  }
};

// Host-computed geometry (codegen/tc_conv_strategy.cc's TcGeometry: launch grids and shared
// memory), when Fixed carries it: TcShape checks at compile time that host and device agree.
template <class...>
using tc_void_t = void;
template <class F, class = void>
struct TcHostGeometry {
  static constexpr bool kGiven = false;
  static constexpr int kTiles = 0, kSmemBytes = 0, kPrepBlocks = 0;
};
template <class F>
struct TcHostGeometry<F, tc_void_t<decltype(F::kHostTiles)>> {
  static constexpr bool kGiven = true;
  static constexpr int kTiles = F::kHostTiles, kSmemBytes = F::kHostSmemBytes,
                       kPrepBlocks = F::kHostPrepBlocks;
};

// Fixed::kFlush16 when the plan names it (1: flush kTcPrec16's sums in short runs), else 0.
template <class F, class = void>
struct TcFlush16Of {
  static constexpr bool value = false;
};
template <class F>
struct TcFlush16Of<F, tc_void_t<decltype(F::kFlush16)>> {
  static constexpr bool value = F::kFlush16 != 0;
};

template <class Cfg, class Fixed, class Tune>
struct TcShape {
  static constexpr bool kTransposed = Cfg::kProducer == kConvTranspose3d;
  __host__ __device__ static constexpr TcDim DimD() {
    return {Cfg::kDin, Cfg::kD, Cfg::kKD, Cfg::kSD, Cfg::kPD, Cfg::kDilD, kTransposed};
  }
  __host__ __device__ static constexpr TcDim DimH() {
    return {Cfg::kHin, Cfg::kH, Cfg::kKH, Cfg::kSH, Cfg::kPH, Cfg::kDilH, kTransposed};
  }
  __host__ __device__ static constexpr TcDim DimW() {
    return {Cfg::kWin, Cfg::kW, Cfg::kKW, Cfg::kSW, Cfg::kPW, Cfg::kDilW, kTransposed};
  }
  // kBK counts 32-bit words of a k-step's shared rows; kBKE the k (elements) they hold.
  static constexpr bool kNative = Fixed::kPrec == kTcPrec16;
  static constexpr int kElemsPerWord = kNative ? 2 : 1;
  static constexpr int kVec = 4 * kElemsPerWord;  // elements per 16-byte segment
  static constexpr int kBM = Tune::kBM, kBN = Tune::kBN, kBK = Tune::kBK;
  static constexpr int kBKE = kBK * kElemsPerWord;
  static constexpr int kWarpsM = Fixed::kWarpsM, kWarpsN = Fixed::kWarpsN, kStages = Tune::kStages;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
  static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;
  // Input channels padded to whole 16-byte segments only: k = tap * kCinPad + ci runs over the
  // phase's taps back to back, a k-step (kBK wide) may span several taps, and only the last
  // k-step of a tile is partly zero (the taps' end).
  static constexpr int kCinPad = (Cfg::kCin + kVec - 1) / kVec * kVec;
  static constexpr int kCPad = (Cfg::kC + kBN - 1) / kBN * kBN;
  static constexpr int kPitch = kBK + 4;  // words per shared row (conflict-free frags)
  static constexpr bool kSplit = Fixed::kPrec == kTcPrec3xTF32;
  static constexpr int kBTiles = kSplit ? 2 : 1;  // weight tiles per stage: big (and small)
  static constexpr int kStageFloats = (kBM + kBTiles * kBN) * kPitch;
  // 3xTF32: products accumulate in a short run, added to the accumulator every kFlush k8 steps
  // (the tensor cores' accumulation truncates; short runs keep its bias below fp32 rounding).
  static constexpr int kFlush = kBK / 8 < 2 ? kBK / 8 : 2;
  // kTcPrec16: the products go straight into the accumulator, unless the sums are flushed
  // (TcFlush16Of<Fixed>: where the training forward keeps u for the backward, as igemm's 16-bit
  // sums are, codegen/igemm_strategy.cc's PrecisionOf): short runs of kFlush k16 steps as above.
  static constexpr bool kRun = kSplit || (kNative && TcFlush16Of<Fixed>::value);
  static constexpr int kEpilogueFloats = 2 * kWarpsM * kBN + kBN;
  static constexpr int kSmemBytes =
      4 * (kStages * kStageFloats > kEpilogueFloats ? kStages * kStageFloats : kEpilogueFloats);
  static constexpr int kTaps = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static constexpr int kSin = Cfg::kDin * Cfg::kHin * Cfg::kWin;
  static constexpr int kS = Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kPhases = DimD().phases() * DimH().phases() * DimW().phases();
  static constexpr int kSegsPerRow = kBK / 4;  // 16-byte segments per shared row
  static constexpr int kALoads = kBM * kSegsPerRow / kThreads;
  __host__ __device__ static constexpr int points(int phase) {
    const int pw = phase % DimW().phases(), ph = phase / DimW().phases() % DimH().phases(),
              pd = phase / (DimW().phases() * DimH().phases());
    return DimD().extent(pd) * DimH().extent(ph) * DimW().extent(pw);
  }
  __host__ __device__ static constexpr int tiles_before(int phase) {
    int t = 0;
    for (int p = 0; p < phase; ++p) t += (points(p) + kBM - 1) / kBM;
    return t;
  }
  static constexpr int kTiles = tiles_before(kPhases);  // per sample, over every phase
  // Prep: x tiles of 32 points x 32 channels -- or, with fewer than 32 padded channels (kNarrowPrep),
  // 256 points a block, one a thread -- then weight blocks (grid-stride).
  static constexpr bool kNarrowPrep = kCinPad < 32;
  static constexpr int kPrepXBlocks =
      kNarrowPrep ? Cfg::kN * ((kSin + 255) / 256)
                  : Cfg::kN * ((kSin + 31) / 32) * ((kCinPad + 31) / 32);
  static constexpr long long kWeightElems = (long long)kTaps * kCPad * kCinPad;
  static constexpr int kPrepWBlocks =
      (int)((kWeightElems + 255) / 256 < 1024 ? (kWeightElems + 255) / 256 : 1024);
  static constexpr int kPrepBlocks = kPrepXBlocks + kPrepWBlocks;
  // Split-K: Tune::kSplit CTAs share a tile's k-steps; each stores its partial accumulators, and
  // the last to finish (an integer counter per tile) sums them in split order and runs the
  // epilogue, so the result does not depend on which finished last.
  static constexpr int kSplitK = Tune::kSplit;
  static constexpr int kCTiles = kCPad / kBN;
  static constexpr int kCounters = kSplitK > 1 ? Cfg::kN * kTiles * kCTiles : 0;
  static constexpr int kAccPerThread = kMI * kNI * 4;

  static_assert(Cfg::kProducer == kConv3d || Cfg::kProducer == kConvTranspose3d,
                "tc_conv: the chain needs a convolution");
  static_assert(kBK == 8 || kBK == 16 || kBK == 32, "tc_conv: kBK is 8, 16 or 32");
  static_assert(!kNative || is_same_v<ElemT<Cfg>, bf16_t> || is_same_v<ElemT<Cfg>, f16_t>,
                "tc_conv: kTcPrec16 is for bf16 and f16 chains");
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0 && kMI >= 1 && kNI >= 1,
                "tc_conv: warp tiles are multiples of 16 x 8");
  static_assert((kBM * kSegsPerRow) % kThreads == 0 && kALoads >= 1,
                "tc_conv: A tile segments divide among the threads");
  static_assert(kStages >= 2, "tc_conv: at least two stages");
  static_assert(kWarpM == Tune::kWarpRows, "tc_conv: Fixed::kWarpsM must be kBM / kWarpRows");
  using Host = TcHostGeometry<Fixed>;
  static_assert(!Host::kGiven || Host::kTiles == kTiles, "tc_conv: host and device tile counts differ");
  static_assert(!Host::kGiven || Host::kSmemBytes == kSmemBytes,
                "tc_conv: host and device shared-memory sizes differ");
  static_assert(!Host::kGiven || Host::kPrepBlocks == kPrepBlocks,
                "tc_conv: host and device prep grids differ");
  static_assert(DimD().k <= 8 && DimH().k <= 8 && DimW().k <= 8, "tc_conv: kernel <= 8 per dim");
  static_assert(kTaps <= 512, "tc_conv: tap table");
  static_assert(Fixed::kOut == kTcStoreFinal || Cfg::kC <= 1 << 20, "tc_conv: channels");
};

// d = a * b.
__device__ __forceinline__ void tc_mma_zero(float* d, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
}
// One k8 step of a short run of sums (3xTF32, flushed 16-bit): products(run, first) adds the
// step's products into run (starting it afresh at the run's first step); at its last step the
// run is added to the accumulator acc.
template <class Products>
__device__ __forceinline__ void tc_run_step(float (&acc)[4], float (&run)[4], bool first, bool last,
                                            Products products) {
  products(run, first);
  if (last) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] += run[r];
  }
}
// Four 8x4 tf32 (8 x 16-byte) matrices from shared memory; lane i gives the row address of
// matrix i / 8, row i % 8, and receives word (lane / 4, lane % 4) of each.
__device__ __forceinline__ void tc_ldsm_x4(unsigned* r, const float* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// Two such matrices: lanes 0-15 give the row addresses (the others' are ignored).
__device__ __forceinline__ void tc_ldsm_x2(unsigned* r, const float* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}
// The B fragments of NI n8 tiles (k8 wide) whose shared rows start at bs (the lane's row address
// as tc_conv_body's b_row / b_col give it): two tiles per ldmatrix.x4, an odd last one by .x2.
template <int NI, int P>
__device__ __forceinline__ void tc_load_b(unsigned (&b)[NI][2], const float* bs) {
#pragma unroll
  for (int nj = 0; nj < NI / 2; ++nj) {
    unsigned r[4];
    tc_ldsm_x4(r, bs + nj * 16 * P);
    b[2 * nj][0] = r[0];
    b[2 * nj][1] = r[1];
    b[2 * nj + 1][0] = r[2];
    b[2 * nj + 1][1] = r[3];
  }
  if constexpr (NI % 2 == 1) tc_ldsm_x2(b[NI - 1], bs + (NI - 1) * 8 * P);
}

// 16-byte cp.async; fills zeros when !valid (src must still be a mapped address). kL1: through
// the L1 cache (.ca: the input, re-read by the next taps), else L2 only (.cg: the weights).
template <bool kL1 = false>
__device__ __forceinline__ void tc_cp_async16(float* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  if constexpr (kL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  }
}
__device__ __forceinline__ void tc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void tc_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// TF32 rounding (round to nearest, ties away) of v, as a float.
__device__ __forceinline__ float tc_round_tf32(float v) { return __uint_as_float(tc_tf32(v)); }

// x's value v as the GEMM's A operand holds it: TF32 rounded here once (the GEMM feeds the bits
// as they are); 3xTF32: as it is (split in the GEMM); 16-bit: x's own value (exact back from
// float).
template <class Sh, class OpT>
__device__ __forceinline__ OpT tc_prep_value(float v) {
  if constexpr (Sh::kNative) {
    return from_f32<OpT>(v);
  } else {
    return Sh::kSplit ? v : tc_round_tf32(v);
  }
}

// REQUIRES (3xTF32): wts points at kWeightElems floats; null otherwise.
template <class Cfg, class Fixed, class Tune>
__device__ __forceinline__ void tc_prep_body(const ElemT<Cfg>* __restrict__ x,
                                             const ElemT<Cfg>* __restrict__ w,
                                             TcOpT<Cfg, Fixed>* __restrict__ xcl,
                                             TcOpT<Cfg, Fixed>* __restrict__ wt,
                                             float* __restrict__ wts, int* __restrict__ counters) {
  using Sh = TcShape<Cfg, Fixed, Tune>;
  using OpT = TcOpT<Cfg, Fixed>;
  __shared__ float tile[32][33];
  if (Sh::kNarrowPrep && blockIdx.x < Sh::kPrepXBlocks) {
    // One point a thread: its channels read across the block (coalesced per channel), its row of
    // kCinPad words written as 16-byte segments (consecutive threads, consecutive rows).
    constexpr int kSBlocks = (Sh::kSin + 255) / 256;
    const int n = blockIdx.x / kSBlocks;
    const int s = blockIdx.x % kSBlocks * 256 + threadIdx.x;
    if (s >= Sh::kSin) return;
    const ElemT<Cfg>* src = x + (long long)n * Cfg::kCin * Sh::kSin + s;
    uint4* dst = reinterpret_cast<uint4*>(xcl + ((long long)n * Sh::kSin + s) * Sh::kCinPad);
#pragma unroll
    for (int g = 0; g < Sh::kCinPad / Sh::kVec; ++g) {
      alignas(16) OpT seg[Sh::kVec];
#pragma unroll
      for (int j = 0; j < Sh::kVec; ++j) {
        const int c = g * Sh::kVec + j;
        seg[j] = tc_prep_value<Sh, OpT>(c < Cfg::kCin ? to_f32(src[(long long)c * Sh::kSin]) : 0.f);
      }
      dst[g] = *reinterpret_cast<const uint4*>(seg);
    }
    return;
  }
  if (blockIdx.x < Sh::kPrepXBlocks) {
    constexpr int kSBlocks = (Sh::kSin + 31) / 32, kCBlocks = (Sh::kCinPad + 31) / 32;
    const int b = blockIdx.x;
    const int cb = b % kCBlocks, sb = b / kCBlocks % kSBlocks, n = b / (kCBlocks * kSBlocks);
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // 32 x 8
    const int s0 = sb * 32, c0 = cb * 32;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = c0 + ty + 8 * j, s = s0 + tx;
      tile[ty + 8 * j][tx] =
          c < Cfg::kCin && s < Sh::kSin ? to_f32(x[((long long)n * Cfg::kCin + c) * Sh::kSin + s])
                                        : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int s = s0 + ty + 8 * j, c = c0 + tx;
      if (s < Sh::kSin && c < Sh::kCinPad) {
        xcl[((long long)n * Sh::kSin + s) * Sh::kCinPad + c] =
            tc_prep_value<Sh, OpT>(tile[tx][ty + 8 * j]);
      }
    }
    return;
  }
  const long long stride = (long long)Sh::kPrepWBlocks * blockDim.x;
  constexpr long long kEnd =
      Sh::kWeightElems > Sh::kCounters ? Sh::kWeightElems : (long long)Sh::kCounters;
  for (long long i = (long long)(blockIdx.x - Sh::kPrepXBlocks) * blockDim.x + threadIdx.x;
       i < kEnd; i += stride) {
    if (i < Sh::kCounters) counters[i] = 0;  // split-K tile counters, every run
    if (i >= Sh::kWeightElems) continue;
    const int ci = (int)(i % Sh::kCinPad);
    const int co = (int)(i / Sh::kCinPad % Sh::kCPad);
    const int tap = (int)(i / ((long long)Sh::kCinPad * Sh::kCPad));
    float v = 0.f;
    if (ci < Cfg::kCin && co < Cfg::kC) {
      v = to_f32(Sh::kTransposed ? w[((long long)ci * Cfg::kC + co) * Sh::kTaps + tap]
                                 : w[((long long)co * Cfg::kCin + ci) * Sh::kTaps + tap]);
    }
    if constexpr (Sh::kNative) {
      wt[i] = from_f32<OpT>(v);  // exact: v is a weight of the dtype
    } else {
      const float big = tc_round_tf32(v);
      wt[i] = big;
      if (Sh::kSplit) wts[i] = tc_round_tf32(v - big);
    }
  }
}

template <class Cfg, class Fixed, class Tune>
__device__ __forceinline__ void tc_conv_body(
    const TcOpT<Cfg, Fixed>* __restrict__ xcl, const TcOpT<Cfg, Fixed>* __restrict__ wt,
    const float* __restrict__ wts, const ElemT<Cfg>* __restrict__ bias,
    TcDstT<Cfg, Fixed>* __restrict__ dst, TcChannelMoments* __restrict__ cpart,
    float* __restrict__ kpart, int* __restrict__ counters, float* __restrict__ u) {
  using Sh = TcShape<Cfg, Fixed, Tune>;
  constexpr int BM = Sh::kBM, BN = Sh::kBN, BK = Sh::kBK, P = Sh::kPitch, MI = Sh::kMI,
                NI = Sh::kNI;
  extern __shared__ __align__(16) float smem[];
  __shared__ int4 s_tap[Sh::kTaps];  // (off d, off h, off w, weight tap) of the phase's taps
  __shared__ int s_list[3][9];       // per dim: count, then the reaching taps' k
  const int n = blockIdx.z, nb = blockIdx.y % Sh::kCTiles, split = blockIdx.y / Sh::kCTiles;
  // The phase of this tile and the tile's first point within it.
  int phase = 0, first = 0;
  for (; phase < Sh::kPhases - 1; ++phase) {
    const int t = (Sh::points(phase) + BM - 1) / BM;
    if ((int)blockIdx.x < first + t) break;
    first += t;
  }
  const int pw = phase % Sh::DimW().phases(), ph = phase / Sh::DimW().phases() % Sh::DimH().phases(),
            pd = phase / (Sh::DimW().phases() * Sh::DimH().phases());
  const int qd_n = Sh::DimD().extent(pd), qh_n = Sh::DimH().extent(ph), qw_n = Sh::DimW().extent(pw);
  const int m_count = qd_n * qh_n * qw_n;
  const int m0 = ((int)blockIdx.x - first) * BM;
  if (threadIdx.x < 3) {
    const TcDim dim = threadIdx.x == 0 ? Sh::DimD() : threadIdx.x == 1 ? Sh::DimH() : Sh::DimW();
    const int p = threadIdx.x == 0 ? pd : threadIdx.x == 1 ? ph : pw;
    int cnt = 0;
    for (int kk = 0; kk < dim.k; ++kk) {
      if (dim.reaches(p, kk)) s_list[threadIdx.x][1 + cnt++] = kk;
    }
    s_list[threadIdx.x][0] = cnt;
  }
  __syncthreads();
  const int td = s_list[0][0], th = s_list[1][0], tw = s_list[2][0];
  const int taps = td * th * tw;
  for (int j = threadIdx.x; j < taps; j += blockDim.x) {
    const int jw = j % tw, jh = j / tw % th, jd = j / (tw * th);
    const int kd = s_list[0][1 + jd], kh = s_list[1][1 + jh], kw = s_list[2][1 + jw];
    s_tap[j] = make_int4(Sh::DimD().offset(pd, kd), Sh::DimH().offset(ph, kh),
                         Sh::DimW().offset(pw, kw), (kd * Cfg::kKH + kh) * Cfg::kKW + kw);
  }
  __syncthreads();

  // This thread's A-tile rows (input base coordinates; out of range rows never load).
  const int seg = threadIdx.x % Sh::kSegsPerRow;
  int bd[Sh::kALoads], bh[Sh::kALoads], bw[Sh::kALoads];
#pragma unroll
  for (int i = 0; i < Sh::kALoads; ++i) {
    const int m = m0 + (int)(threadIdx.x + i * Sh::kThreads) / Sh::kSegsPerRow;
    if (m < m_count) {
      const int qw = m % qw_n, qh = m / qw_n % qh_n, qd = m / (qw_n * qh_n);
      bd[i] = qd * Sh::DimD().mul();
      bh[i] = qh * Sh::DimH().mul();
      bw[i] = qw * Sh::DimW().mul();
    } else {
      bd[i] = -(1 << 28);  // fails every bounds check
      bh[i] = 0;
      bw[i] = 0;
    }
  }
  const TcOpT<Cfg, Fixed>* x_n = xcl + (long long)n * Sh::kSin * Sh::kCinPad;
  const int ksteps = (taps * Sh::kCinPad + Sh::kBKE - 1) / Sh::kBKE;
  const int k_per = (ksteps + Sh::kSplitK - 1) / Sh::kSplitK;
  const int k_begin = split * k_per < ksteps ? split * k_per : ksteps;
  const int k_end = k_begin + k_per < ksteps ? k_begin + k_per : ksteps;
  const int kcount = k_end - k_begin;

  // Stage k-step ks: every 16-byte segment finds its own tap (k / kCinPad) and channel; past the
  // phase's taps it is zero-filled.
  auto load_stage = [&](int stage, int ks) {
    float* as = smem + stage * Sh::kStageFloats;
    float* bs = as + BM * P;
    {
      const int kk = ks * Sh::kBKE + seg * Sh::kVec;
      const int j = kk / Sh::kCinPad, ci = kk - j * Sh::kCinPad;
      const bool kvalid = j < taps;
      const int4 tap = s_tap[kvalid ? j : 0];
#pragma unroll
      for (int i = 0; i < Sh::kALoads; ++i) {
        const int row = (int)(threadIdx.x + i * Sh::kThreads) / Sh::kSegsPerRow;
        const int id = bd[i] + tap.x, ih = bh[i] + tap.y, iw = bw[i] + tap.z;
        const bool ok = kvalid && (unsigned)id < (unsigned)Cfg::kDin &&
                        (unsigned)ih < (unsigned)Cfg::kHin && (unsigned)iw < (unsigned)Cfg::kWin;
        const void* src =
            ok ? x_n + (long long)((id * Cfg::kHin + ih) * Cfg::kWin + iw) * Sh::kCinPad + ci : xcl;
        tc_cp_async16<Tune::kInputL1>(as + row * P + seg * 4, src, ok);
      }
    }
    for (int s = threadIdx.x; s < Sh::kBTiles * BN * Sh::kSegsPerRow; s += Sh::kThreads) {
      const int tile = s / (BN * Sh::kSegsPerRow), r = s % (BN * Sh::kSegsPerRow);
      const int row = r / Sh::kSegsPerRow, sg = r % Sh::kSegsPerRow;
      const int kk = ks * Sh::kBKE + sg * Sh::kVec;
      const int j = kk / Sh::kCinPad, ci = kk - j * Sh::kCinPad;
      const bool kvalid = j < taps;
      const long long off =
          ((long long)s_tap[kvalid ? j : 0].w * Sh::kCPad + nb * BN + row) * Sh::kCinPad + ci;
      const void* src = !kvalid     ? (const void*)wt
                        : tile == 0 ? (const void*)(wt + off)
                                    : (const void*)(wts + off);
      tc_cp_async16(bs + (tile * BN + row) * P + sg * 4, src, kvalid);
    }
  };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp % Sh::kWarpsM, wn = warp / Sh::kWarpsM;
  const int g = lane >> 2, t = lane & 3;
  float acc[MI][NI][4];
  float run[Sh::kRun ? MI : 1][Sh::kRun ? NI : 1][4];  // the short run (3xTF32, flushed 16-bit)
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
  // ldmatrix row addresses (see tc_ldsm_x4): A 16x8 fragments, B two n8 x k8 fragments.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 4;

#pragma unroll
  for (int s = 0; s < Sh::kStages - 1; ++s) {
    if (s < kcount) load_stage(s, k_begin + s);
    tc_cp_commit();
  }
  for (int ks = 0; ks < kcount; ++ks) {
    tc_cp_wait<Sh::kStages - 2>();
    __syncthreads();
    const int next = ks + Sh::kStages - 1;
    if (next < kcount) load_stage(next % Sh::kStages, k_begin + next);
    tc_cp_commit();
    const float* stage = smem + (ks % Sh::kStages) * Sh::kStageFloats;
    const float* as = stage + (wm * Sh::kWarpM + a_row) * P + a_col;
    const float* bs = stage + (BM + wn * Sh::kWarpN + b_row) * P + b_col;
#pragma unroll
    for (int k8 = 0; k8 < BK; k8 += 8) {
      unsigned a[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) tc_ldsm_x4(a[mi], as + mi * 16 * P + k8);
      tc_load_b<NI, P>(b, bs + k8);
      // Where the sums run short (Sh::kRun): this k8 step's place in its run of kFlush steps.
      const bool first = (k8 / 8) % Sh::kFlush == 0;
      const bool last = (k8 / 8) % Sh::kFlush == Sh::kFlush - 1;
      if constexpr (Sh::kNative && Sh::kRun) {  // one k16 product, short runs
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            tc_run_step(acc[mi][ni], run[mi][ni], first, last, [&](float(&c)[4], bool zero) {
              if (zero) {
#pragma unroll
                for (int r = 0; r < 4; ++r) c[r] = 0.f;
              }
              tc_mma16<is_same_v<ElemT<Cfg>, f16_t>>(c, a[mi], b[ni]);
            });
          }
      } else if constexpr (Sh::kNative) {  // one k16 product per 32-byte slice
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni)
            tc_mma16<is_same_v<ElemT<Cfg>, f16_t>>(acc[mi][ni], a[mi], b[ni]);
      } else if constexpr (!Sh::kSplit) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) tc_mma(acc[mi][ni], a[mi], b[ni]);
      } else {
        unsigned bsm[NI][2], asm_[MI][4];
        tc_load_b<NI, P>(bsm, bs + BN * P + k8);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float v = __uint_as_float(a[mi][r]);
            a[mi][r] = tc_tf32(v);
            asm_[mi][r] = tc_tf32(v - __uint_as_float(a[mi][r]));
          }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            tc_run_step(acc[mi][ni], run[mi][ni], first, last, [&](float(&c)[4], bool zero) {
              if (zero) {
                tc_mma_zero(c, asm_[mi], b[ni]);
              } else {
                tc_mma(c, asm_[mi], b[ni]);
              }
              tc_mma(c, a[mi], bsm[ni]);
              tc_mma(c, a[mi], b[ni]);
            });
          }
      }
    }
  }
  tc_cp_wait<0>();
  __syncthreads();  // shared memory is reused by the epilogue

  if constexpr (Sh::kSplitK > 1) {
    // Store this split's partial tile (fragment order: coalesced), count it; the last CTA of the
    // tile sums every split's partial in split order.
    __shared__ int s_last;
    const long long tile_id = ((long long)n * Sh::kTiles + blockIdx.x) * Sh::kCTiles + nb;
    float* mine = kpart + ((tile_id * Sh::kSplitK + split) * Sh::kAccPerThread) * Sh::kThreads;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          mine[((mi * NI + ni) * 4 + r) * Sh::kThreads + threadIdx.x] = acc[mi][ni][r];
        }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(counters + tile_id, 1) == Sh::kSplitK - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const float* all = kpart + (tile_id * Sh::kSplitK * Sh::kAccPerThread) * Sh::kThreads;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int e = ((mi * NI + ni) * 4 + r) * Sh::kThreads + threadIdx.x;
          float sum = 0.f;
          for (int sp = 0; sp < Sh::kSplitK; ++sp) {
            sum += __ldcg(all + (long long)sp * Sh::kAccPerThread * Sh::kThreads + e);
          }
          acc[mi][ni][r] = sum;
        }
  }

  // ---- epilogue: bias + pre-ops, store and/or tile moments -----------------------------------
  // Output offsets of this thread's rows (-1: past the phase's points).
  int out_row[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm * Sh::kWarpM + mi * 16 + g + 8 * h;
      if (m < m_count) {
        const int qw = m % qw_n, qh = m / qw_n % qh_n, qd = m / (qw_n * qh_n);
        const int od = qd * Sh::DimD().ostride() + pd, oh = qh * Sh::DimH().ostride() + ph,
                  ow = qw * Sh::DimW().ostride() + pw;
        out_row[mi][h] = (od * Cfg::kH + oh) * Cfg::kW + ow;
      } else {
        out_row[mi][h] = -1;
      }
    }
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int co = nb * BN + wn * Sh::kWarpN + ni * 8 + 2 * t + e;
      const float b = Cfg::kBias && co < Cfg::kC ? to_f32(bias[co]) : 0.f;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& v = acc[mi][ni][2 * h + e];
          const long long at = ((long long)n * Cfg::kC + co) * Sh::kS + out_row[mi][h];
          if (u != nullptr && co < Cfg::kC && out_row[mi][h] >= 0) u[at] = v + b;
          v = Cfg::pre(v + b);
          if (Fixed::kOut != kTcMomentsOnly && co < Cfg::kC && out_row[mi][h] >= 0) {
            dst[at] = store_as<TcDstT<Cfg, Fixed>>(v);
          }
        }
    }
  if constexpr (Fixed::kOut != kTcStoreFinal) {
    // Per-channel moments over the tile's valid rows: sums in a fixed order (thread rows, lanes
    // of one column by xor-shuffle, warps by index), then the mean, then squared deviations.
    float* red = smem;                        // [kWarpsM][BN]
    float* tile_mean = smem + Sh::kWarpsM * BN;  // [BN]
    float* red2 = tile_mean + BN;             // [kWarpsM][BN]
    const int valid = m_count - m0 < BM ? m_count - m0 : BM;
    for (int pass = 0; pass < 2; ++pass) {
      float* r = pass == 0 ? red : red2;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = wn * Sh::kWarpN + ni * 8 + 2 * t + e;
          const float mu = pass == 0 ? 0.f : tile_mean[col];
          float s = 0.f;
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (out_row[mi][h] >= 0) {
                const float d = acc[mi][ni][2 * h + e] - mu;
                s += pass == 0 ? d : d * d;
              }
            }
          s += __shfl_xor_sync(0xffffffffu, s, 4);
          s += __shfl_xor_sync(0xffffffffu, s, 8);
          s += __shfl_xor_sync(0xffffffffu, s, 16);
          if (g == 0) r[wm * BN + col] = s;
        }
      __syncthreads();
      for (int col = threadIdx.x; col < BN; col += Sh::kThreads) {
        float s = 0.f;
        for (int i = 0; i < Sh::kWarpsM; ++i) s += r[i * BN + col];
        if (pass == 0) {
          tile_mean[col] = s / (float)valid;
        } else {
          const int co = nb * BN + col;
          if (co < Cfg::kC) {
            TcChannelMoments mom;
            mom.count = valid;
            mom.mean = tile_mean[col];
            mom.m2 = s;
            cpart[((long long)n * Sh::kTiles + blockIdx.x) * Cfg::kC + co] = mom;
          }
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the kernels with the default configuration.
namespace fj_selftest {
struct TcFixed {
  static constexpr int kPrec = fj::kTcPrec3xTF32, kOut = fj::kTcStorePreNorm;
  static constexpr int kWarpsM = 4, kWarpsN = 1;
};
struct TcTune {
  static constexpr int kBM = 128, kBN = 32, kBK = 8, kStages = 3, kSplit = 2, kWarpRows = 32;
  static constexpr bool kInputL1 = true;
};
using Sh = fj::TcShape<fj::DefaultConfig, TcFixed, TcTune>;
}  // namespace fj_selftest
extern "C" __global__ void __launch_bounds__(256)
    tc_prep_selftest(const float* x, const float* w, float* xcl, float* wt, float* wts,
                     int* counters) {
  fj::tc_prep_body<fj::DefaultConfig, fj_selftest::TcFixed, fj_selftest::TcTune>(x, w, xcl, wt,
                                                                                 wts, counters);
}
extern "C" __global__ void __launch_bounds__(fj_selftest::Sh::kThreads)
    tc_conv_selftest(const float* xcl, const float* wt, const float* wts, const float* bias,
                     float* y, fj::TcChannelMoments* cpart, float* kpart, int* counters,
                     float* u) {
  fj::tc_conv_body<fj::DefaultConfig, fj_selftest::TcFixed, fj_selftest::TcTune>(
      xcl, wt, wts, bias, y, cpart, kpart, counters, u);
}
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_TC_CONV_CUH_
