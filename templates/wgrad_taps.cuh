// templates/wgrad_taps.cuh: wgrad_wgmma.cuh's weight-gradient GEMM with the staged operands
// shared by Tune::kTaps consecutive kw taps (stride 1 only). The one-tap kernel reads both
// operands from L2 once per tap (27 times for a 3x3x3 kernel); here a CTA stages a k-step of T
// once and one window of S rows, and each of its kTaps warpgroups multiplies them for its own tap.
//
// Why a window serves several taps: the prep kernel here lays T and S out on one extended grid E
// (geom::WgradTaps): T's value at its own point, S's point q at e = q + pad, zeros elsewhere. For
// stride 1 the S point of tap (kd, kh, kw) at T point p is p + tap*dil - pad, so on E its row is
// T's row + off(kd, kh, kw), off = (kd*dilD*pp + kh*dilH*EW) + kw*dilW: a constant. Tap kw0 + g
// reads window rows g*dilW .. g*dilW + 63. The wgmma descriptor of such a B operand starts inside
// a swizzle atom; the 128-byte swizzle is a function of the shared-memory address (checked on the
// H200, 2026-11-28: a start 1..7 rows into an atom with base offset 0 gives exact products).
//
// Loads: prep stores each 64-channel tile's rows contiguously, chunk c of row R at chunk
// c ^ (R % 8) -- the swizzle the row gets in shared memory when the copy lands R % 8 rows into an
// atom. So a k-step is a few bulk copies (cp.async.bulk, one thread, completion on an mbarrier):
// 64 rows of T per tile (and lows), the window of S per tile; no per-element address arithmetic.
//
// K: per (sample n, d < TD) plane its first steps_per_plane*64 rows, in k-steps of 64 (rows with
// w >= TW or h >= TH are zeros of T: about EW/TW times the products of T's own points; W3:
// 34/32). Precision, the partials and the
// reduction: as wgrad_wgmma.cuh; short runs of kFold k-steps, the wgmma of one k-step in flight
// across the barrier and the copies of the next.
//
// ---- host-side contract -------------------------------------------------------------------
// Tune: wgrad_wgmma.cuh's (kBN, kStages >= 3, kSplits, kChunk in K rows of the k-step sequence
// above, a multiple of 64 * kFold, kAbsmaxBlocks, kProducts, kGuMaxima) and kTaps (2 or 3).
// Workspace: absmax as wgrad_wgmma.cuh's; tp, sp: WgradTaps::t_bytes, s_bytes; part as
// wgrad_wgmma.cuh's. Kernels, in order on one stream:
//   1. wgrad_absmax_kernel<Cfg,Tune> (wgrad_wgmma.cuh).
//   2. wgrad_taps_prep_kernel<Cfg,Tune,0>(x, gu, absmax, tp): grid (ceil(rows/64), a_tiles),
//      block 256; <Cfg,Tune,1>(x, gu, absmax, sp): grid (ceil(rows/64), b_tiles), block 256.
//   3. wgrad_taps_kernel<Cfg,Tune>(tp, sp, absmax, part): grid (KD*KH*groups * b_ctas, a_tiles,
//      kSplits), block 128 * kTaps, dynamic smem WgradTaps::smem (raise the attribute). sm_90a.
//   4. wgrad_reduce_kernel<Cfg,Tune> (wgrad.cuh).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_WGRAD_TAPS_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_TAPS_CUH_

#include "wgrad_wgmma.cuh"

namespace fj {

template <class Cfg, class Tune>
struct WgTapsShape {
  using G = WgGeom<Cfg>;
  static constexpr int kProducts = WgProductsOf<Tune>::value;
  static constexpr int kTaps = Tune::kTaps;
  static constexpr geom::WgradTaps kE = geom::WgradTapsOf(
      Cfg::kN, G::kA, G::kB, G::kTD, G::kTH, G::kTW, Cfg::kKD, Cfg::kKH, Cfg::kKW, Cfg::kDilD,
      Cfg::kDilH, Cfg::kDilW, Tune::kBN, Tune::kStages, kProducts, kTaps);
  static constexpr int kLoHi = kProducts == 3 ? 2 : 1;
  // k-steps per short run: 2 with three products (24 truncating tensor-core additions per run),
  // 4 with one (a TF32-class result: 16 additions per run add a few 1e-6 relative at most).
  static constexpr int kFold = kProducts == 3 ? 2 : 4;
  static_assert(Cfg::kSD == 1 && Cfg::kSH == 1 && Cfg::kSW == 1, "wgrad_taps: stride 1 only");
  static_assert(kTaps >= 2 && kTaps <= 3, "wgrad_taps: 2 or 3 taps per CTA");
  static_assert(Tune::kStages >= 3, "wgrad_taps: 3 stages or more (two k-steps in use)");
  static_assert(Tune::kChunk % (geom::kWgradKStep * kFold) == 0, "wgrad_taps: whole short runs");
  static_assert(kE.smem <= 232448, "wgrad_taps: the stages exceed shared memory");
  static_assert(kE.rows < (1ll << 31), "wgrad_taps: too many rows for int");
};

namespace wgt {
// sm_90a only, like the wgmma: built for anything else these are no-ops (the kernel then traps at
// its first wgmma).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#ifdef FJ_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#ifdef FJ_HAS_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
#ifdef FJ_HAS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// Spins (inside the asm: no branch the compiler sees) until phase `parity` of `bar` completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#ifdef FJ_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned); the
// completion counts against `bar`'s transaction bytes.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
#ifdef FJ_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
}  // namespace wgt

// ---- 2. T (kWhich 0) or S (1) -> E's rows, fp16 highs (and lows), pre-swizzled -----------------
// A block (geom::kWgradPrepThreads threads) converts 64 rows x one 64-channel tile.
template <class Cfg, class Tune, int kWhich>
__device__ void wgrad_taps_prep_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                       const float* __restrict__ absmax,
                                       unsigned char* __restrict__ out) {
  using G = WgGeom<Cfg>;
  using Sh = WgTapsShape<Cfg, Tune>;
  constexpr geom::WgradTaps E = Sh::kE;
  constexpr bool kT = kWhich == 0;
  constexpr int C = kT ? G::kA : G::kB;
  constexpr int SD = kT ? G::kTD : G::kQD, SH = kT ? G::kTH : G::kQH, SW = kT ? G::kTW : G::kQW;
  // Where the source's point (0,0,0) sits on E: T at the origin, S shifted by the padding.
  constexpr int OffD = kT ? 0 : Cfg::kPD, OffH = kT ? 0 : Cfg::kPH, OffW = kT ? 0 : Cfg::kPW;
  __shared__ float red[32];
  __shared__ float tile[64][65];
  const float* src = (kT == G::kConv) ? gu : x;  // T is gu for conv3d, S is gu for convT
  const float s =
      ig::scale_from_partials(absmax + kWhich * Tune::kAbsmaxBlocks, Tune::kAbsmaxBlocks, red);
  const int r0 = blockIdx.x * 64, ct = blockIdx.y;
  // Thread t reads row r0 + t % 64 (decoded once) of channels ct*64 + t/64 + 4i.
  const int r = r0 + threadIdx.x % 64;
  const int plane = r / (int)E.pp, rem = r % (int)E.pp;
  const int n = plane / (int)E.ed, d = plane % (int)E.ed - OffD;
  const int h = rem / (int)E.ew - OffH, w = rem % (int)E.ew - OffW;
  const bool in =
      n < Cfg::kN && rem < E.eh * E.ew && d >= 0 && d < SD && h >= 0 && h < SH && w >= 0 && w < SW;
  const float* p0 =
      src + ((long long)(in ? n : 0) * C * SD + (in ? d : 0)) * (SH * SW) + (in ? h * SW + w : 0);
  // Every load of the thread issued before the first lands (16 in flight: a memory-bound pass).
  static_assert(geom::kWgradPrepThreads % 64 == 0, "wgrad_taps prep: whole rows of 64 threads");
#pragma unroll
  for (int k = 0; k < 64 / (geom::kWgradPrepThreads / 64); ++k) {
    const int c = threadIdx.x / 64 + k * (geom::kWgradPrepThreads / 64);
    const int ch = ct * 64 + c;
    tile[c][threadIdx.x % 64] = in && ch < C ? p0[(long long)ch * (SD * SH * SW)] : 0.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 8; i += geom::kWgradPrepThreads) {
    const int p = i / 8, j = i % 8, rw = r0 + p;
    if (rw >= E.rows) continue;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = tile[j * 8 + e][p];
    unsigned hi[4], lo[4];
    ig::split_f16x8(v, s, hi, lo);
    const long long row = (long long)ct * Sh::kLoHi * E.rows + rw;
    const int swz = (j ^ (rw & 7)) << 4;
    *reinterpret_cast<uint4*>(out + row * 128 + swz) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    if constexpr (Sh::kLoHi == 2) {
      *reinterpret_cast<uint4*>(out + (row + E.rows) * 128 + swz) =
          make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
}

// ---- 3. the GEMM: kTaps taps x 64 rows a x kBN columns b x one chunk of K per block -----------
template <class Cfg, class Tune>
__device__ void wgrad_taps_kernel(const unsigned char* __restrict__ tp,
                                  const unsigned char* __restrict__ sp,
                                  const float* __restrict__ absmax, double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  using Sh = WgTapsShape<Cfg, Tune>;
  constexpr geom::WgradTaps E = Sh::kE;
  constexpr int BN = Tune::kBN, NG = BN / 64, NT8 = BN / 8;
  constexpr int kStages = Tune::kStages, kTaps = Sh::kTaps, kFold = Sh::kFold;
  constexpr int kWinBytes = (int)E.window_rows * 128;  // one block of the S window in a stage
  constexpr bool kThree = Sh::kProducts == 3;
  constexpr int kLoHi = Sh::kLoHi;
  constexpr long long kTileBytes = E.rows * 128;  // one tile's highs (or lows) in tp / sp
  extern __shared__ __align__(1024) unsigned char wgt_smem_raw[];
  __shared__ float red[32];
  __shared__ __align__(8) unsigned long long full[kStages];              // a stage's copies landed
  const unsigned sbase = (ig::smem_u32(wgt_smem_raw) + 1023u) & ~1023u;  // swizzle atoms

  const int tid = threadIdx.x, wg = tid >> 7;
  const int tg = blockIdx.x / (int)E.b_ctas, bt = blockIdx.x % (int)E.b_ctas, at = blockIdx.y;
  const int kd = tg / ((int)E.groups * Cfg::kKH), kh = (tg / (int)E.groups) % Cfg::kKH;
  const int kw0 = (tg % (int)E.groups) * kTaps, kw = kw0 + wg;
  const long long off = ((long long)kd * Cfg::kDilD * E.pp + (long long)kh * Cfg::kDilH * E.ew) +
                        (long long)kw0 * Cfg::kDilW;
  const int s_begin = blockIdx.z * (Tune::kChunk / 64);
  const int s_end = min(s_begin + Tune::kChunk / 64, (int)E.steps);
  const int nks = s_end - s_begin;
  const unsigned full0 = ig::smem_u32(&full[0]);
  // B blocks of S channels that exist (the copies of the others are skipped; their columns are
  // never written).
  const int ng_valid = min(NG, (int)E.b_tiles - bt * NG);
  const unsigned tx_bytes = kLoHi * (64 * 128 + ng_valid * (int)E.window * 128);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) wgt::mbar_init(full0 + 8 * s, 1);
    wgt::mbar_init_fence();
  }
  const double inv_scale = wgw::inverse_scale<Tune>(absmax, red);
  __syncthreads();  // (also after the barriers' init)

  // Stage layout: A [lohi][64 rows x 128 B]; B [lohi][NG][window_rows x 128 B], the window
  // landing (its first row % 8) rows into its block, so that its rows keep prep's swizzle.
  // Thread 0 issues a k-step's copies. T's first row of k-step `step`, and the window's first S
  // row; k-steps past the chunk (padding to whole short runs) read T's zero rows.
  auto t_row = [&](int step) -> long long {
    if (step >= s_end) return E.zero_row;
    const int plane = step / (int)E.steps_per_plane, within = step % (int)E.steps_per_plane;
    return ((long long)(plane / G::kTD) * E.ed + plane % G::kTD) * E.pp + (long long)within * 64;
  };
  auto s_row = [&](int step) -> long long { return (step < s_end ? t_row(step) : 0) + off; };
  auto issue = [&](int slot, int ks) {
    const long long r0 = t_row(s_begin + ks), rb = s_row(s_begin + ks);
    const unsigned st = sbase + slot * (unsigned)E.stage_bytes, bar = full0 + 8 * slot;
    wgt::mbar_expect_tx(bar, tx_bytes);
#pragma unroll
    for (int lh = 0; lh < kLoHi; ++lh) {
      wgt::bulk_copy(st + lh * geom::kWgradOperandBytes,
                     tp + ((long long)at * kLoHi + lh) * kTileBytes + r0 * 128, 64 * 128, bar);
    }
    const unsigned b_st = st + kLoHi * geom::kWgradOperandBytes + (unsigned)(rb & 7) * 128;
    for (int g = 0; g < ng_valid; ++g) {
#pragma unroll
      for (int lh = 0; lh < kLoHi; ++lh) {
        wgt::bulk_copy(b_st + (lh * NG + g) * kWinBytes,
                       sp + ((long long)(bt * NG + g) * kLoHi + lh) * kTileBytes + rb * 128,
                       (unsigned)E.window * 128, bar);
      }
    }
  };

  float acc[1][NT8][4], shortacc[1][NT8][4];
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.f;
  }

  // The pipeline: k-step ks + kAhead is copied while ks is multiplied, and the wgmma of k-step ks
  // stay in flight into iteration ks + 1 (wait<1>): a slot is refilled two k-steps after its
  // wgmma were issued, once every warpgroup has waited for them (the barrier). The short-run
  // accumulator is drained and added into acc every kFold k-steps; the k-steps run to a multiple
  // of kFold, so that no wgmma sits on a divergent path (ptxas would serialize them). An idle
  // warpgroup (its tap past the kernel) multiplies too, unwritten.
  constexpr int kAhead = kStages - 2;
  const int nfold = (nks + kFold - 1) / kFold, nkp = nfold * kFold;
  if (tid == 0) {
    for (int s = 0; s < kAhead && s < nkp; ++s) issue(s, s);
  }
  for (int f = 0; f < nfold; ++f) {
#pragma unroll
    for (int i = 0; i < kFold; ++i) {
      const int ks = f * kFold + i, slot = ks % kStages;
      wgt::mbar_wait(full0 + 8 * slot, (ks / kStages) & 1);
      __syncthreads();
      // Slot (ks + kAhead) % kStages last held k-step ks - 2, whose wgmma every warpgroup waited
      // for.
      if (tid == 0 && ks + kAhead < nkp) issue((ks + kAhead) % kStages, ks + kAhead);

      const unsigned st = sbase + slot * (unsigned)E.stage_bytes;
      const unsigned a_hi = st, a_lo = st + geom::kWgradOperandBytes;
      const unsigned b_hi = st + kLoHi * geom::kWgradOperandBytes +
                            ((unsigned)(s_row(s_begin + ks) & 7) + wg * Cfg::kDilW) * 128;
      const unsigned b_lo = b_hi + NG * kWinBytes;
      igw::fence();
      // A run's first product overwrites.
      wgw::mma_kstep<BN, kThree>(shortacc, a_hi, a_lo, b_hi, b_lo, kWinBytes, i == 0 ? 0 : 1);
      igw::commit();
      if (i == kFold - 1) {
        wgw::drain_run(acc, shortacc);
      } else {
        igw::wait<1>();
      }
    }
  }
  if (kw >= Cfg::kKW) return;  // an idle warpgroup (after the last barrier)

  wgw::store_partials<Cfg, NT8>(acc, part + (long long)blockIdx.z * G::kA * G::kNcol, at * 64,
                                bt * BN, (kd * Cfg::kKH + kh) * Cfg::kKW + kw, inv_scale);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): a padded conv3d and a conv_transpose3d, both tile widths, both
// precisions.
namespace fj_selftest_wgrad_taps {
struct Conv : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 40, kDin = 6, kHin = 7, kWin = 9;
  static constexpr int kC = 72, kD = 6, kH = 7, kW = 9;
  static constexpr int kProducer = fj::kConv3d;
  static constexpr int kPD = 1, kPH = 1, kPW = 1;
};
using ConvT = fj_selftest_wgrad_wgmma::Cfg;  // a conv_transpose3d of 40 -> 72 channels
template <int kBNV, int kProductsV, int kTapsV>
struct Tune {
  static constexpr int kBN = kBNV, kStages = 3, kSplits = 4, kChunk = 1024, kAbsmaxBlocks = 264;
  static constexpr int kProducts = kProductsV, kTaps = kTapsV;
};
extern "C" __global__ void wgt_prep_t(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_taps_prep_kernel<Conv, Tune<128, 3, 3>, 0>(x, gu, absmax, out);
}
extern "C" __global__ void wgt_prep_s(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_taps_prep_kernel<Conv, Tune<128, 3, 3>, 1>(x, gu, absmax, out);
}
extern "C" __global__ void __launch_bounds__(384, 1)
    wgt_conv128(const unsigned char* tp, const unsigned char* sp, const float* absmax,
                double* part) {
  fj::wgrad_taps_kernel<Conv, Tune<128, 3, 3>>(tp, sp, absmax, part);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    wgt_convt64_one(const unsigned char* tp, const unsigned char* sp, const float* absmax,
                    double* part) {
  fj::wgrad_taps_kernel<ConvT, Tune<64, 1, 2>>(tp, sp, absmax, part);
}
}  // namespace fj_selftest_wgrad_taps
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_TAPS_CUH_
