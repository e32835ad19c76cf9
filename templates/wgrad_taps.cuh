// templates/wgrad_taps.cuh: wgrad_wgmma.cuh's weight-gradient GEMM with the staged operands
// shared by Tune::kTaps consecutive kw taps (stride 1 only). The one-tap kernel reads both
// operands from L2 once per tap (27 times for a 3x3x3 kernel); here a CTA stages a k-step of T
// once and one window of S rows, and each of its kTaps warpgroups multiplies them for its own tap.
//
// Why a window serves several taps: prep (wgrad_prep_kernel with kTaps > 1) lays T and S out on
// one extended grid E (geom::WgradTaps): T's value at its own point, S's point q at e = q + pad,
// zeros elsewhere. For stride 1 the S point of tap (kd, kh, kw) at T point p is p + tap*dil - pad,
// so on E its row is T's row + off(kd, kh, kw) with off = (kd*dilD*EH + kh*dilH)*EW + kw*dilW: a
// constant. Tap kw0 + g reads window rows g*dilW .. g*dilW + 63. The wgmma descriptor of such a B
// operand starts g*dilW 128-byte rows into a swizzle atom; the 128-byte swizzle is a function of
// the shared-memory address (checked on the H200, 2026-11-28: a start 1..7 rows into an atom with
// base offset 0 gives exact products), so the rows are written where the address says.
//
// K: per (sample n, d < TD) plane the TH*EW rows of E from h = 0 (rows with w >= TW are zeros of
// T: 1 + (KW-1)*dilW/TW of the work), in k-steps of 64; the last k-step of a plane reads T rows
// past it as zeros. Precision, the partials and the reduction: as wgrad_wgmma.cuh. Accumulation:
// the short runs are kFold k-steps long (below), and the wgmma of one k-step overlap the barrier
// and the loads of the next.
//
// ---- host-side contract -------------------------------------------------------------------
// Tune: wgrad_wgmma.cuh's, with kTaps (2 or 3) and kChunk in K rows (a multiple of 64) of the
// k-step sequence above (geom::WgradTaps::steps k-steps in all). Kernels 1, 2 and 4 are
// wgrad_wgmma.cuh's (prep writes E's grid: WgWgmmaShape::kTOut, kSOut points per sample).
//   3. wgrad_taps_kernel<Cfg,Tune>(tp, sp, absmax, part): grid (KD*KH*groups * kBTiles, kAT,
//      kSplits), block 128 * kTaps, dynamic smem WgradTaps::smem (raise the attribute).
// -----------------------------------------------------------------------------------------
#ifndef FUSEJIT_TEMPLATES_WGRAD_TAPS_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_TAPS_CUH_

#include "wgrad_wgmma.cuh"

namespace fj {

template <class Cfg, class Tune>
__device__ void wgrad_taps_kernel(const unsigned char* __restrict__ tp,
                                  const unsigned char* __restrict__ sp,
                                  const float* __restrict__ absmax, double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  using Sh = WgWgmmaShape<Cfg, Tune>;
  constexpr geom::WgradTaps E = Sh::kE;
  constexpr int BN = Sh::kBN, NG = Sh::kGroupsN, NT8 = BN / 8;
  constexpr int kStages = Tune::kStages, kTaps = Sh::kTaps, kThreads = 128 * kTaps;
  constexpr int WR = (int)E.window_rows, kWinBytes = WR * 128;
  constexpr bool kThree = Sh::kProducts == 3;
  constexpr int kLoHi = kThree ? 2 : 1;
  constexpr long long kRows = (long long)Cfg::kN * E.e_points;  // rows of either operand
  static_assert(kTaps >= 2 && kTaps <= 3, "wgrad_taps: 2 or 3 taps per CTA");
  static_assert(kStages >= 3, "wgrad_taps: 3 stages or more (two k-steps in use)");
  // k-steps per short run: 2 with three products (24 truncating tensor-core additions per run),
  // 4 with one (a TF32-class result: 16 additions per run add a few 1e-6 relative at most).
  constexpr int kFold = kThree ? 2 : 4;
  static_assert(kStages * E.stage_bytes + 1024 <= 232448, "wgrad_taps: stages exceed smem");
  extern __shared__ __align__(1024) unsigned char wgt_smem_raw[];
  __shared__ float red[32];
  const unsigned sbase = (ig::smem_u32(wgt_smem_raw) + 1023u) & ~1023u;  // swizzle atoms

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int tg = blockIdx.x / Sh::kBTiles, bt = blockIdx.x % Sh::kBTiles, at = blockIdx.y;
  const int kd = tg / ((int)E.groups * Cfg::kKH), kh = (tg / (int)E.groups) % Cfg::kKH;
  const int kw0 = (tg % (int)E.groups) * kTaps, kw = kw0 + wg;
  const bool active = kw < Cfg::kKW;  // this warpgroup's tap exists
  const long long off =
      ((long long)kd * Cfg::kDilD * E.eh + kh * Cfg::kDilH) * E.ew + (long long)kw0 * Cfg::kDilW;
  const int s_begin = blockIdx.z * (Tune::kChunk / 64);
  const int s_end = min(s_begin + Tune::kChunk / 64, (int)E.steps);
  const int nks = s_end - s_begin;

  const double inv_scale =
      1.0 /
      ((double)ig::scale_from_partials(absmax, Tune::kAbsmaxBlocks, red) *
       (double)ig::scale_from_partials(absmax + Tune::kAbsmaxBlocks, Tune::kAbsmaxBlocks, red));

  // Stage layout: A [lohi][64 rows x 128 B], then B [lohi][NG][WR rows x 128 B]. A 16-byte chunk
  // c of row k sits at chunk c ^ (k % 8) of its row (the 128-byte swizzle; WR % 8 == 0 keeps every
  // block's rows in phase).
  auto load = [&](int slot, int ks) {
    const int step = s_begin + ks;
    const int plane = step / (int)E.steps_per_plane, within = step % (int)E.steps_per_plane;
    const int n = plane / G::kTD, d = plane % G::kTD;
    const long long r0 = ((long long)n * E.ed + d) * E.eh * E.ew + (long long)within * 64;
    // T rows of this plane from r0; none past the chunk (the k-steps padded to whole runs).
    const int span = step < s_end ? G::kTH * (int)E.ew - within * 64 : 0;
    const unsigned st = sbase + slot * (unsigned)E.stage_bytes;
    constexpr int kChunks = 8 * kLoHi;  // 16-byte chunks per row and 64-channel tile
    for (int i = tid; i < 64 * kChunks; i += kThreads) {
      const int krow = i / kChunks, c16 = i % kChunks, lohi = c16 >> 3, chunk = c16 & 7;
      const bool ok = krow < span;
      const unsigned dst =
          st + lohi * geom::kWgradOperandBytes + krow * 128 + ((chunk ^ (krow & 7)) << 4);
      ig::cp_async16(dst, tp + ((r0 + (ok ? krow : 0)) * Sh::kAT + at) * 256 + c16 * 16, ok);
    }
    const unsigned b_st = st + kLoHi * geom::kWgradOperandBytes;
    for (int i = tid; i < WR * NG * kChunks; i += kThreads) {
      const int krow = i / (NG * kChunks), rest = i % (NG * kChunks);
      const int g = rest / kChunks, c16 = rest % kChunks, lohi = c16 >> 3, chunk = c16 & 7;
      const long long r = r0 + off + krow;
      const int btile = bt * NG + g;
      const bool ok = r < kRows && btile < Sh::kBT && step < s_end;
      const unsigned dst =
          b_st + (lohi * NG + g) * kWinBytes + krow * 128 + ((chunk ^ (krow & 7)) << 4);
      ig::cp_async16(dst, ok ? sp + (r * Sh::kBT + btile) * 256 + c16 * 16 : sp, ok);
    }
  };

  float acc[1][NT8][4], shortacc[1][NT8][4];
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.f;
  }

  // The pipeline: k-step ks + kAhead is loaded while ks is multiplied, and the wgmma of k-step ks
  // stay in flight into iteration ks + 1 (wait<1>): a slot is refilled two k-steps after its
  // wgmma were issued, once every warpgroup has waited for them (the barrier). The short-run
  // accumulator is drained and added into acc every kFold k-steps; the k-steps run to a multiple
  // of kFold (those past the chunk load zeros), so that no wgmma sits on a divergent path (ptxas
  // would serialize them). An idle warpgroup (tap past the kernel) multiplies too, unwritten.
  constexpr int kAhead = kStages - 2;
  const int nfold = (nks + kFold - 1) / kFold, nkp = nfold * kFold;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < nkp) load(s, s);
    ig::cp_async_commit();
  }
  for (int f = 0; f < nfold; ++f) {
#pragma unroll
    for (int i = 0; i < kFold; ++i) {
      const int ks = f * kFold + i, slot = ks % kStages;
      ig::cp_async_wait<kAhead - 1>();
      igw::fence_proxy_async();
      __syncthreads();
      // Slot (ks + kAhead) % kStages last held k-step ks - 2, whose wgmma every warpgroup waited
      // for.
      if (ks + kAhead < nkp) load((ks + kAhead) % kStages, ks + kAhead);
      ig::cp_async_commit();

      const unsigned st = sbase + slot * (unsigned)E.stage_bytes;
      const unsigned a_hi = st, a_lo = st + geom::kWgradOperandBytes;
      const unsigned b_hi = st + kLoHi * geom::kWgradOperandBytes + wg * Cfg::kDilW * 128,
                     b_lo = b_hi + NG * kWinBytes;
      igw::fence();
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16) {
        const unsigned koff = k16 * 16 * 128;  // 16 K rows
        const auto ah = wgw::desc_mn_sw128(a_hi + koff, geom::kWgradOperandBytes);
        const auto bh = wgw::desc_mn_sw128(b_hi + koff, kWinBytes);
        const int keep = i == 0 && k16 == 0 ? 0 : 1;  // a run's first product overwrites
        if constexpr (kThree) {
          const auto al = wgw::desc_mn_sw128(a_lo + koff, geom::kWgradOperandBytes);
          const auto bl = wgw::desc_mn_sw128(b_lo + koff, kWinBytes);
          wgw::mma_ss_f16_mn<BN>(shortacc, ah, bl, keep);
          wgw::mma_ss_f16_mn<BN>(shortacc, al, bh, 1);
          wgw::mma_ss_f16_mn<BN>(shortacc, ah, bh, 1);
        } else {
          (void)a_lo;
          (void)b_lo;
          wgw::mma_ss_f16_mn<BN>(shortacc, ah, bh, keep);
        }
      }
      igw::commit();
      if (i == kFold - 1) {
        igw::wait<0>();
        igw::fence_operands(shortacc);
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[0][j][e] += shortacc[0][j][e];
        }
      } else {
        igw::wait<1>();
      }
    }
  }
  ig::cp_async_wait<0>();
  if (!active) return;  // (after the last barrier)

  // Accumulator (j, e): row 16*warp + lane/4 (+8 for e >= 2), column 8j + 2*(lane%4) + e%2.
  const int tap = (kd * Cfg::kKH + kh) * Cfg::kKW + kw;
  double* out = part + (long long)blockIdx.z * G::kA * G::kNcol;
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int a = at * 64 + 16 * warp + (lane >> 2) + (e >= 2 ? 8 : 0);
      const int b = bt * BN + 8 * j + 2 * (lane & 3) + (e & 1);
      if (a < G::kA && b < G::kB) {
        out[(long long)a * G::kNcol + b * G::kKV + tap] = (double)acc[0][j][e] * inv_scale;
      }
    }
  }
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
struct ConvT : fj::DefaultConfig {
  static constexpr int kN = 2, kCin = 40, kDin = 6, kHin = 7, kWin = 8;
  static constexpr int kC = 72, kD = 8, kH = 9, kW = 10;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
};
template <int kBNV, int kProductsV, int kTapsV>
struct Tune {
  static constexpr int kBN = kBNV, kStages = 3, kSplits = 4, kChunk = 1024, kAbsmaxBlocks = 264;
  static constexpr int kProducts = kProductsV, kTaps = kTapsV;
};
extern "C" __global__ void wgt_prep_t(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_prep_kernel<Conv, Tune<128, 3, 3>, 0>(x, gu, absmax, out);
}
extern "C" __global__ void wgt_prep_s(const float* x, const float* gu, const float* absmax,
                                      unsigned char* out) {
  fj::wgrad_prep_kernel<Conv, Tune<128, 3, 3>, 1>(x, gu, absmax, out);
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
