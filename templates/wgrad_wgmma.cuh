// templates/wgrad_wgmma.cuh: the convolution weight gradient on Hopper's warpgroup tensor cores
// (wgmma.mma_async, sm_90a), fp32-accurate by the F16x3 split. Same GEMM as wgrad.cuh:
//
//   grad_w[a][b][tap] = sum_{n,p} T[n,a,p] * S[n,b, p*s - pad + tap*dil]   (zero outside S)
//
// (WgGeom: conv3d T = grad_u, S = x; conv_transpose3d T = x, S = grad_u), computed as one GEMM per
// tap, M = a, N = b, K = the (n, p) pairs. Both operands are copied first into a channels-last
// encoding (prep), so that for one tap the K rows of a tile are whole 128-byte rows of channels:
// the loads are 16-byte cp.async copies (zero-filled where the tap falls outside S) and the tensor
// cores read both operands from shared memory in the MN-major ("transposed") layout wgmma allows
// for 16-bit types. No per-element gather, no im2col. For stride 1, wgrad_taps.cuh is this GEMM
// with the staged rows shared by 2-3 kw taps (the planner's choice there); it reuses kernels 1
// and 4 below.
//
// Precision: T*sT = Th + Tl and S*sS = Sh + Sl (fp16 each; sT, sS powers of two from max|T|,
// max|S|, ig::f16_scale_for), products Th*Sl + Tl*Sh + Th*Sh (kProducts 3, fp32-accurate); or
// Th*Sh alone (kProducts 1: the TF32 class, each operand rounded to fp16's 11 significant bits,
// ~5e-4 relative -- TF32's own rounding -- at the f16 rate, one product in three; the lows are
// neither written nor loaded nor staged). The tensor cores add with
// truncation, so each k-step's products (64 K rows) go into a short-run accumulator that is then
// added (fp32, round to nearest) into the block's accumulator; each block's sum over its chunk of
// K is scaled back by 1/(sT*sS) in double and written as a double partial. wgrad_reduce_kernel
// (wgrad.cuh) sums the chunks in index order: deterministic, no atomics.
//
// ---- host-side contract -------------------------------------------------------------------
// Tune: kBN (64 or 128: b columns per block), kStages (2..8), kSplits, kChunk (K rows per
// block, a multiple of 64), kAbsmaxBlocks (264), kProducts (3 or 1; optional, default 3: see
// Precision above), kGuMaxima (optional, default 0: see kernel 1). WgWgmmaShape<Cfg,Tune> gives
// the sizes below (a stage holds highs only with one product; the workspaces keep their layout,
// the lows unwritten).
// Workspace:
//   absmax  2*kAbsmaxBlocks floats   per-block max|T| then max|S|
//   tp      kTBytes   T channels-last: [n][p][a tile of 64][64 fp16 highs, 64 fp16 lows]
//   sp      kSBytes   S channels-last: [n][q][b tile of 64][64 fp16 highs, 64 fp16 lows]
//                     (channels past kA / kB are zeros)
//   part    kSplits * kA * kNcol doubles, as wgrad.cuh's (column b*kKV + tap)
// Kernels, in order on one stream:
//   1. wgrad_absmax_kernel<Cfg,Tune>(x, gu, gmax, absmax): grid kAbsmaxBlocks, block 256. gmax:
//      null (grad_u scanned), or Tune::kGuMaxima per-block maxima of |grad_u| written by the
//      kernel that wrote grad_u (backward.cuh's bwd_grad_u_kernel; grad_u then not read here).
//   2. wgrad_prep_kernel<Cfg,Tune,0>(x, gu, absmax, tp): grid (ceil(PT/64), kAT, kN), block 256;
//      wgrad_prep_kernel<Cfg,Tune,1>(x, gu, absmax, sp): grid (ceil(QS/64), kBT, kN), block 256.
//   3. wgrad_wgmma_kernel<Cfg,Tune>(tp, sp, absmax, part): grid (kKV * kBTiles, kAT, kSplits),
//      block 128 (one warpgroup), dynamic smem WgWgmmaShape::kSmemBytes (raise the attribute).
//      Needs an sm_90a build; built for anything else it compiles but traps when run.
//   4. wgrad_reduce_kernel<Cfg,Tune>(part, grad_w) (wgrad.cuh).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_WGRAD_WGMMA_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_WGMMA_CUH_

#include "geometry.cuh"
#include "igemm_wgmma.cuh"
#include "wgrad.cuh"

namespace fj {

// Tune::kGuMaxima where given, else 0: how many per-block maxima of |grad_u| the absmax pass
// reduces instead of reading grad_u (wgrad_absmax_kernel's gmax).
template <class Tune, class = void>
struct GuMaximaOf {
  static constexpr long long value = 0;
};
template <class Tune>
struct GuMaximaOf<Tune, decltype(void(Tune::kGuMaxima))> {
  static constexpr long long value = Tune::kGuMaxima;
};

// Tune::kProducts where given, else 3 (fp32-accurate).
template <class Tune, class = void>
struct WgProductsOf {
  static constexpr int value = 3;
};
template <class Tune>
struct WgProductsOf<Tune, decltype(void(Tune::kProducts))> {
  static constexpr int value = Tune::kProducts;
};

template <class Cfg, class Tune>
struct WgWgmmaShape {
  using G = WgGeom<Cfg>;
  static constexpr int kQS = G::kQD * G::kQH * G::kQW;  // S's points
  static constexpr int kProducts = WgProductsOf<Tune>::value;
  static constexpr geom::WgradWgmma kG =
      geom::WgradWgmmaOf(Cfg::kN, G::kA, G::kB, G::kPT, kQS, Tune::kBN, Tune::kStages, kProducts);
  static constexpr int kAT = kG.a_tiles, kBT = kG.b_tiles, kBTiles = kG.b_ctas;
  static constexpr int kBN = Tune::kBN;
  static constexpr int kGroupsN = kBN / 64;  // 64-channel tiles per block column
  static constexpr long long kTBytes = kG.t_bytes, kSBytes = kG.s_bytes;
  static constexpr int kOperandBytes = geom::kWgradOperandBytes;
  static constexpr int kStageBytes = kG.stage_bytes;
  static constexpr int kSmemBytes = kG.smem;
  static_assert(kProducts == 3 || kProducts == 1, "wgrad_wgmma: kProducts is 3 or 1");
  static_assert(kBN == 64 || kBN == 128, "wgrad_wgmma: kBN is 64 or 128");
  static_assert(Tune::kStages >= 2 && Tune::kStages <= 8, "wgrad_wgmma: 2 to 8 stages");
  static_assert(Tune::kChunk % geom::kWgradKStep == 0, "wgrad_wgmma: chunks of whole k-steps");
  static_assert(Tune::kAbsmaxBlocks == geom::kWgradAbsmaxBlocks,
                "wgrad_wgmma: the absmax pass has 264 blocks");
  static_assert((long long)G::kR < (1ll << 31), "wgrad_wgmma: reduction too long for int");
};

namespace wgw {
// Shared-memory descriptor of an MN-major operand in the 128-byte swizzle layout: per 64 M/N
// values a block of K rows of 128 bytes (8 rows = 1024 bytes apart = SBO), the 64-value blocks
// `lbo` bytes apart (LBO). Each 16-byte chunk c of row k sits at chunk c ^ (k % 8).
__device__ __forceinline__ unsigned long long desc_mn_sw128(unsigned saddr, unsigned lbo) {
  unsigned long long d = (unsigned long long)((saddr >> 4) & 0x3FFFu);
  d |= (unsigned long long)((lbo >> 4) & 0x3FFFu) << 16;
  d |= (unsigned long long)(1024 >> 4) << 32;
  d |= 1ull << 62;
  return d;
}

// D(64xN) (+)= A(64x16) * B(16xN), both fp16 from shared memory, both MN-major; fp32 accumulate.
// accumulate == 0: D = A*B.
template <int N>
__device__ __forceinline__ void mma_ss_f16_mn(float (&d)[1][N / 8][4], unsigned long long da,
                                              unsigned long long db, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma n: 64 or 128");
#ifdef FJ_HAS_WGMMA
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FJ_WG_D32
        ", %32, %33, p, 1, 1, 1, 1;\n}\n"
        : FJ_WG_OUT32(d)
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FJ_WG_D64
        ", %64, %65, p, 1, 1, 1, 1;\n}\n"
        : FJ_WG_OUT64(d)
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
  }
#else
  __trap();
#endif
}

// One k-step (64 K rows: four k16 slices) of products into d, both operands MN-major in shared
// memory: Th*Sl + Tl*Sh + Th*Sh (kThree) or Th*Sh. A's 64-value blocks kWgradOperandBytes
// apart, B's `b_lbo` apart. keep 0: the k-step's first product overwrites d (a short run starts).
template <int BN, bool kThree>
__device__ __forceinline__ void mma_kstep(float (&d)[1][BN / 8][4], unsigned a_hi, unsigned a_lo,
                                          unsigned b_hi, unsigned b_lo, unsigned b_lbo, int keep) {
#pragma unroll
  for (int k16 = 0; k16 < 4; ++k16) {
    const unsigned off = k16 * 16 * 128;  // 16 K rows
    const auto ah = desc_mn_sw128(a_hi + off, geom::kWgradOperandBytes);
    const auto bh = desc_mn_sw128(b_hi + off, b_lbo);
    const int k = k16 == 0 ? keep : 1;
    if constexpr (kThree) {
      const auto al = desc_mn_sw128(a_lo + off, geom::kWgradOperandBytes);
      const auto bl = desc_mn_sw128(b_lo + off, b_lbo);
      mma_ss_f16_mn<BN>(d, ah, bl, k);
      mma_ss_f16_mn<BN>(d, al, bh, 1);
      mma_ss_f16_mn<BN>(d, ah, bh, 1);
    } else {
      (void)a_lo;
      (void)b_lo;
      mma_ss_f16_mn<BN>(d, ah, bh, k);
    }
  }
}

// Ends a short run: waits for the warpgroup's wgmma and adds the run's accumulator into acc
// (fp32, round to nearest: the tensor cores' own additions truncate).
template <int NT8>
__device__ __forceinline__ void drain_run(float (&acc)[1][NT8][4], float (&run)[1][NT8][4]) {
  igw::wait<0>();
  igw::fence_operands(run);
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] += run[0][j][e];
  }
}

// 1/(sT*sS), the operands' scales from the absmax pass's per-block maxima (every thread of the
// block; block_max synchronizes).
template <class Tune>
__device__ __forceinline__ double inverse_scale(const float* __restrict__ absmax, float* red) {
  return 1.0 /
         ((double)ig::scale_from_partials(absmax, Tune::kAbsmaxBlocks, red) *
          (double)ig::scale_from_partials(absmax + Tune::kAbsmaxBlocks, Tune::kAbsmaxBlocks, red));
}

// A warpgroup's finished 64 x 8*NT8 accumulator (rows a0.., columns b0.. of one tap) times
// inv_scale into the double partials `out` of its chunk (column b * kKV + tap; rows and columns
// past the GEMM skipped). Accumulator (j, e): row 16*warp + lane/4 (+8 for e >= 2), column
// 8j + 2*(lane%4) + e%2.
template <class Cfg, int NT8>
__device__ __forceinline__ void store_partials(const float (&acc)[1][NT8][4], double* out, int a0,
                                               int b0, int tap, double inv_scale) {
  using G = WgGeom<Cfg>;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int a = a0 + 16 * warp + (lane >> 2) + (e >= 2 ? 8 : 0);
      const int b = b0 + 8 * j + 2 * (lane & 3) + (e & 1);
      if (a < G::kA && b < G::kB) {
        out[(long long)a * G::kNcol + b * G::kKV + tap] = (double)acc[0][j][e] * inv_scale;
      }
    }
  }
}

}  // namespace wgw

// ---- 1. max|T|, max|S| per block ----------------------------------------------------------------
// gmax: null, or Tune::kGuMaxima (> 0) per-block maxima of |grad_u| that bwd_grad_u_kernel wrote
// (backward.cuh), reduced here in place of a pass over grad_u (the same max: max is exact).
template <class Cfg, class Tune>
__device__ void wgrad_absmax_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                    const float* __restrict__ gmax, float* __restrict__ absmax) {
  using G = WgGeom<Cfg>;
  using Sh = WgWgmmaShape<Cfg, Tune>;
  __shared__ float red[32];
  const long long nt = (long long)Cfg::kN * G::kA * G::kPT;
  const long long ns = (long long)Cfg::kN * G::kB * Sh::kQS;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const float mx = ig::absmax_scan(x, G::kConv ? ns : nt, tid, stride);
  float mg = 0.f;
  if (gmax != nullptr) {
    for (long long i = tid; i < GuMaximaOf<Tune>::value; i += stride) mg = fmaxf(mg, gmax[i]);
  } else {
    mg = ig::absmax_scan(gu, G::kConv ? nt : ns, tid, stride);
  }
  float mt = G::kConv ? mg : mx, ms = G::kConv ? mx : mg;
  mt = ig::block_max(mt, red);
  ms = ig::block_max(ms, red);
  if (threadIdx.x == 0) {
    absmax[blockIdx.x] = mt;
    absmax[Tune::kAbsmaxBlocks + blockIdx.x] = ms;
  }
}

// ---- 2. T (kWhich 0) or S (1) -> channels-last fp16 highs and lows ------------------------------
// A block converts 64 points x one 64-channel tile of one sample.
template <class Cfg, class Tune, int kWhich>
__device__ void wgrad_prep_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                  const float* __restrict__ absmax,
                                  unsigned char* __restrict__ out) {
  using G = WgGeom<Cfg>;
  using Sh = WgWgmmaShape<Cfg, Tune>;
  constexpr bool kT = kWhich == 0;
  constexpr int C = kT ? G::kA : G::kB;
  constexpr int P = kT ? G::kPT : Sh::kQS;
  constexpr int CT = kT ? Sh::kAT : Sh::kBT;
  __shared__ float red[32];
  __shared__ float tile[64][65];
  const float* src = (kT == G::kConv) ? gu : x;  // T is gu for conv3d, S is gu for convT
  const float s =
      ig::scale_from_partials(absmax + kWhich * Tune::kAbsmaxBlocks, Tune::kAbsmaxBlocks, red);
  const int p0 = blockIdx.x * 64, ct = blockIdx.y, n = blockIdx.z;
  const float* base = src + (long long)n * C * P;
  // Every load of the thread issued before the first lands (16 in flight: a memory-bound pass).
#pragma unroll
  for (int k = 0; k < 64 * 64 / geom::kWgradPrepThreads; ++k) {
    const int i = threadIdx.x + k * geom::kWgradPrepThreads;
    const int c = ct * 64 + i / 64, p = p0 + i % 64;
    tile[i / 64][i % 64] = c < C && p < P ? base[(long long)c * P + p] : 0.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 8; i += geom::kWgradPrepThreads) {
    const int p = i / 8, j = i % 8;
    if (p0 + p >= P) continue;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = tile[j * 8 + e][p];
    unsigned hi[4], lo[4];
    ig::split_f16x8(v, s, hi, lo);
    unsigned char* row = out + (((long long)n * P + p0 + p) * CT + ct) * 256;
    *reinterpret_cast<uint4*>(row + j * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    if constexpr (Sh::kProducts == 3) {
      *reinterpret_cast<uint4*>(row + 128 + j * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
}

// ---- 3. the GEMM: one tap x 64 rows a x kBN columns b x one chunk of K per block ----------------
template <class Cfg, class Tune>
__device__ void wgrad_wgmma_kernel(const unsigned char* __restrict__ tp,
                                   const unsigned char* __restrict__ sp,
                                   const float* __restrict__ absmax, double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  using Sh = WgWgmmaShape<Cfg, Tune>;
  constexpr int BN = Sh::kBN, NG = Sh::kGroupsN, NT8 = BN / 8;
  constexpr int kStages = Tune::kStages;
  extern __shared__ __align__(1024) unsigned char wgw_smem_raw[];
  __shared__ float red[32];
  const unsigned sbase = (ig::smem_u32(wgw_smem_raw) + 1023u) & ~1023u;  // swizzle atoms

  const int tid = threadIdx.x;
  const int tap = blockIdx.x / Sh::kBTiles, bt = blockIdx.x % Sh::kBTiles, at = blockIdx.y;
  const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH, kw = tap % Cfg::kKW;
  const int dd = kd * Cfg::kDilD - Cfg::kPD, dh = kh * Cfg::kDilH - Cfg::kPH,
            dw = kw * Cfg::kDilW - Cfg::kPW;
  const int r_begin = blockIdx.z * Tune::kChunk;
  const int r_end = min(r_begin + Tune::kChunk, G::kR);
  const int nks = (r_end - r_begin + 63) / 64;

  const double inv_scale = wgw::inverse_scale<Tune>(absmax, red);

  // Loads: a K row is 16 chunks of 16 bytes per 64-channel tile (8 of highs, 8 of lows); thread
  // tid copies chunk tid % 16 of rows tid / 16 + 8i (i < 8), so a warp reads two whole rows of
  // each operand (coalesced) and writes them without bank conflicts. One product: the 8 chunks
  // of highs, chunk tid % 8 of rows tid / 8 + 16i (i < 4); the stage holds highs only.
  constexpr bool kThree = Sh::kProducts == 3;
  constexpr int kRowsPerPass = kThree ? 8 : 16;
  const int c16 = kThree ? tid & 15 : tid & 7, lohi = c16 >> 3, chunk = c16 & 7;
  const int row0 = kThree ? tid >> 4 : tid >> 3;
  auto load = [&](int slot, int ks) {
    const unsigned st = sbase + slot * Sh::kStageBytes;
    const unsigned a_dst = st + lohi * Sh::kOperandBytes;
    const unsigned b_dst =
        st + (kThree ? 2 : 1) * Sh::kOperandBytes + lohi * NG * Sh::kOperandBytes;
#pragma unroll 2
    for (int i = 0; i < 64 / kRowsPerPass; ++i) {
      const int krow = row0 + kRowsPerPass * i;
      const int r = r_begin + ks * 64 + krow;
      const bool ok = r < r_end;
      const int n = ok ? r / G::kPT : 0, p = ok ? r % G::kPT : 0;
      const int pd = p / (G::kTH * G::kTW), ph = (p / G::kTW) % G::kTH, pw = p % G::kTW;
      const int qd = pd * Cfg::kSD + dd, qh = ph * Cfg::kSH + dh, qw = pw * Cfg::kSW + dw;
      const bool in_s =
          ok && qd >= 0 && qd < G::kQD && qh >= 0 && qh < G::kQH && qw >= 0 && qw < G::kQW;
      const unsigned swz = ((chunk ^ (krow & 7)) << 4) + krow * 128;
      ig::cp_async16(a_dst + swz,
                     tp + (((long long)n * G::kPT + p) * Sh::kAT + at) * 256 + c16 * 16, ok);
      const long long q = in_s ? ((long long)qd * G::kQH + qh) * G::kQW + qw : 0;
      const unsigned char* ssrc = sp + ((long long)n * Sh::kQS + q) * Sh::kBT * 256 + c16 * 16;
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        const int btile = bt * NG + g;
        const bool okg = in_s && btile < Sh::kBT;
        ig::cp_async16(b_dst + g * Sh::kOperandBytes + swz, okg ? ssrc + btile * 256 : sp, okg);
      }
    }
  };

  float acc[1][NT8][4], shortacc[1][NT8][4];
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.f;
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nks) load(s, s);
    ig::cp_async_commit();
  }
  for (int ks = 0; ks < nks; ++ks) {
    const int slot = ks % kStages;
    ig::cp_async_wait<kStages - 2>();
    igw::fence_proxy_async();
    __syncthreads();
    // The slot the previous k-step read is free (its wgmma completed before this barrier).
    if (ks + kStages - 1 < nks) load((ks + kStages - 1) % kStages, ks + kStages - 1);
    ig::cp_async_commit();

    const unsigned st = sbase + slot * Sh::kStageBytes;
    const unsigned a_hi = st, a_lo = st + Sh::kOperandBytes;  // (a_lo, b_lo: three products)
    const unsigned b_hi = st + (kThree ? 2 : 1) * Sh::kOperandBytes,
                   b_lo = b_hi + NG * Sh::kOperandBytes;
    igw::fence();
    wgw::mma_kstep<BN, kThree>(shortacc, a_hi, a_lo, b_hi, b_lo, Sh::kOperandBytes, 0);
    igw::commit();
    wgw::drain_run(acc, shortacc);
  }
  ig::cp_async_wait<0>();

  wgw::store_partials<Cfg, NT8>(acc, part + (long long)blockIdx.z * G::kA * G::kNcol, at * 64,
                                bt * BN, tap, inv_scale);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): every kernel of a small conv_transpose3d, both tile widths.
namespace fj_selftest_wgrad_wgmma {
struct Cfg : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 40, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 72, kD = 8, kH = 9, kW = 10;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
};
template <int kBNV>
struct Tune {
  static constexpr int kBN = kBNV, kStages = 3, kSplits = 4, kChunk = 1024, kAbsmaxBlocks = 264;
};
extern "C" __global__ void wgw_absmax(const float* x, const float* gu, float* absmax) {
  fj::wgrad_absmax_kernel<Cfg, Tune<128>>(x, gu, nullptr, absmax);
}
struct TuneGuMaxima : Tune<128> {
  static constexpr int kGuMaxima = 1000;
};
extern "C" __global__ void wgw_absmax_gu_maxima(const float* x, const float* gmax, float* absmax) {
  fj::wgrad_absmax_kernel<Cfg, TuneGuMaxima>(x, nullptr, gmax, absmax);
}
extern "C" __global__ void wgw_prep_t(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_prep_kernel<Cfg, Tune<128>, 0>(x, gu, absmax, out);
}
extern "C" __global__ void wgw_prep_s(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_prep_kernel<Cfg, Tune<128>, 1>(x, gu, absmax, out);
}
extern "C" __global__ void wgw_gemm128(const unsigned char* tp, const unsigned char* sp,
                                       const float* absmax, double* part) {
  fj::wgrad_wgmma_kernel<Cfg, Tune<128>>(tp, sp, absmax, part);
}
extern "C" __global__ void wgw_gemm64(const unsigned char* tp, const unsigned char* sp,
                                      const float* absmax, double* part) {
  fj::wgrad_wgmma_kernel<Cfg, Tune<64>>(tp, sp, absmax, part);
}
struct TuneOne : Tune<128> {
  static constexpr int kProducts = 1;
};
extern "C" __global__ void wgw_prep_s_one(const float* x, const float* gu, const float* absmax,
                                          unsigned char* out) {
  fj::wgrad_prep_kernel<Cfg, TuneOne, 1>(x, gu, absmax, out);
}
extern "C" __global__ void wgw_gemm_one(const unsigned char* tp, const unsigned char* sp,
                                        const float* absmax, double* part) {
  fj::wgrad_wgmma_kernel<Cfg, TuneOne>(tp, sp, absmax, part);
}
}  // namespace fj_selftest_wgrad_wgmma
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_WGMMA_CUH_
