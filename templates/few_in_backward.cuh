// templates/few_in_backward.cuh: the backward of a convolution with few input channels --
// conv_transpose3d, or conv3d with stride 1 -- after grad_y's sums (backward.cuh's gpart), in one
// kernel: grad_u computed where it is used and never stored, the data gradient grad_x, the
// weight-gradient partials and the conv-bias partials. It replaces bwd_grad_u (grad_u's write),
// the weight-gradient GEMM and the data-gradient convolution (three passes over grad_u).
//
// Block: sample n, an x tile of kXD x kXH x kXW points (geom::FewInBwd). For each output channel
// c in turn the block stages grad_u[n, c] over the tile's output region in shared memory,
// computed from u and grad_y (Bwd::grad_u_norm / grad_u_plain); region points outside the output
// hold 0. Then each thread, for each of its x points i and every tap k (output o = a*i + b + k'*dil
// per axis, geom::FewInBwd's notation; a constant offset in the region):
//   grad_x[n, ci, i] += W(ci, c, k) * grad_u(o)         (registers, over every c)
//   wpart(ci, c, k)  += x[n, ci, i] * grad_u(o)        (per thread, then the warp, the block)
// W(ci, c, k) is w[ci][c][k] (conv_transpose3d) or w[c][ci][k] (conv3d). The weight partials of
// taps_per_chunk taps at a time (cin x taps <= 32) are summed over the warp by a reduce-scatter
// (lane l ends with partial l), over the warps in index order, and written as doubles in the
// weight's layout: part[block][weight], which wgrad_reduce_kernel sums over blocks.
// Bias: per axis, a tile owns the outputs from its region's start for a points per x point (the
// first tile from 0, the last to the end); the owning block adds grad_u(o) while staging it:
// bpart[(n*kC + c)*tiles + tile] (bwd_param_grads with kBiasSplit = tiles). Every sum in a fixed
// order: deterministic.
#ifndef FUSEJIT_TEMPLATES_FEW_IN_BACKWARD_CUH_
#define FUSEJIT_TEMPLATES_FEW_IN_BACKWARD_CUH_

#include "backward.cuh"
#include "common.cuh"
#include "default_config.cuh"
#include "geometry.cuh"

namespace fj {

template <class Cfg, class Tune>
struct FewInBwdGeom {
  static constexpr bool kT = Cfg::kProducer == kConvTranspose3d;
  static_assert(kT ||
                    (Cfg::kProducer == kConv3d && Cfg::kSD == 1 && Cfg::kSH == 1 && Cfg::kSW == 1),
                "few_in_backward: conv_transpose3d, or conv3d with stride 1");
  // Per axis: output o = kA*i + kB + k'*dil of x point i, tap k (geom::FewInBwd).
  static constexpr int kAD = geom::FewInBwdStep(kT, Cfg::kSD),
                       kAH = geom::FewInBwdStep(kT, Cfg::kSH),
                       kAW = geom::FewInBwdStep(kT, Cfg::kSW);
  static constexpr int kBD = geom::FewInBwdStart(kT, Cfg::kPD, Cfg::kKD, Cfg::kDilD),
                       kBH = geom::FewInBwdStart(kT, Cfg::kPH, Cfg::kKH, Cfg::kDilH),
                       kBW = geom::FewInBwdStart(kT, Cfg::kPW, Cfg::kKW, Cfg::kDilW);
  static constexpr geom::FewInBwd kG =
      geom::FewInBwdOf(kT, Cfg::kCin, Cfg::kC, Cfg::kDin, Cfg::kHin, Cfg::kWin, Cfg::kKD, Cfg::kKH,
                       Cfg::kKW, Cfg::kSD, Cfg::kSH, Cfg::kSW, Cfg::kPD, Cfg::kPH, Cfg::kPW,
                       Cfg::kDilD, Cfg::kDilH, Cfg::kDilW, Cfg::kOPD, Cfg::kOPH, Cfg::kOPW,
                       Cfg::kGroups, Tune::kXD, Tune::kXH, Tune::kXW, Tune::kThreads);
  static constexpr int kLD = kG.ld, kLH = kG.lh, kLW = kG.lw, kRegion = kG.region;
  static constexpr int kTilesD = (Cfg::kDin + Tune::kXD - 1) / Tune::kXD;
  static constexpr int kTilesH = (Cfg::kHin + Tune::kXH - 1) / Tune::kXH;
  static constexpr int kTilesW = (Cfg::kWin + Tune::kXW - 1) / Tune::kXW;
  static constexpr int kTiles = kG.tiles;
  static constexpr int kKV = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static constexpr int kTC = kG.taps_per_chunk, kChunks = kG.chunks;
  static constexpr int kP = kG.points_per_thread;
  static constexpr int kThreads = Tune::kThreads, kWarps = kThreads / 32;
  static constexpr int kWeights = Cfg::kCin * Cfg::kC * kKV;
  static_assert(kTC >= 1, "few_in_backward: at most 32 input channels");
  static_assert(kThreads % 32 == 0, "whole warps");
  // The (ci, c) pair's kKV taps in the weight: [Cin][C][k] or [C][Cin][k].
  __device__ static constexpr int weight(int ci, int c) {
    return kT ? ci * Cfg::kC + c : c * Cfg::kCin + ci;
  }
};

// Grid: kN * tiles blocks of Tune::kThreads, dynamic shared memory geom::FewInBwd::smem. x and w
// (conv weight [Cin, C, k]) read; u, gy, gamma, beta, zpart/stats and gpart as bwd_grad_u's, u
// laid out [N, D, H, C, W] where Tune has kURowsByChannel = true (URowsByChannel).
template <class Cfg, class BwdTune, class Tune, class GyT>
__device__ void bwd_few_in_kernel(const float* __restrict__ x, const float* __restrict__ u,
                                  const GyT* __restrict__ gy, const float* __restrict__ w,
                                  const float* __restrict__ gamma, const float* __restrict__ beta,
                                  const double2* __restrict__ zpart,
                                  const float* __restrict__ stats,
                                  const double2* __restrict__ gpart, float* __restrict__ gx,
                                  double* __restrict__ part, double* __restrict__ bpart) {
  using G = FewInBwdGeom<Cfg, Tune>;
  using B = Bwd<Cfg, BwdTune>;
  constexpr int Ci = Cfg::kCin, C = Cfg::kC, P = G::kP, TC = G::kTC;
  constexpr int kXPts = Tune::kXD * Tune::kXH * Tune::kXW;
  constexpr int kSin = Cfg::kDin * Cfg::kHin * Cfg::kWin;
  extern __shared__ __align__(16) float fj_few_in_bwd_smem[];
  float* const region = fj_few_in_bwd_smem;
  float* const ws = fj_few_in_bwd_smem + G::kG.weights_offset;
  float* const wred = fj_few_in_bwd_smem + G::kG.partials_offset;  // [2][chunks][warps][32]
  float* const terms = fj_few_in_bwd_smem + G::kG.terms_offset;    // [groups][4]
  double* const bred =
      reinterpret_cast<double*>(fj_few_in_bwd_smem + G::kG.bias_offset);  // [C][warps]
  __shared__ double scratch[32];

  const int tile = blockIdx.x % G::kTiles, n = blockIdx.x / G::kTiles;
  const int td = tile / (G::kTilesH * G::kTilesW), th = (tile / G::kTilesW) % G::kTilesH,
            tw = tile % G::kTilesW;
  const int i0d = td * Tune::kXD, i0h = th * Tune::kXH, i0w = tw * Tune::kXW;
  // The region's first output point per axis, and where the tile's owned points end.
  const int lod = i0d * G::kAD + G::kBD, loh = i0h * G::kAH + G::kBH, low = i0w * G::kAW + G::kBW;
  const int ownd = td == G::kTilesD - 1 ? Cfg::kD : lod + Tune::kXD * G::kAD;
  const int ownh = th == G::kTilesH - 1 ? Cfg::kH : loh + Tune::kXH * G::kAH;
  const int ownw = tw == G::kTilesW - 1 ? Cfg::kW : low + Tune::kXW * G::kAW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int i = threadIdx.x; i < G::kWeights; i += blockDim.x) ws[i] = w[i];
  if constexpr (Cfg::kGroups > 0) {
    for (int g = 0; g < Cfg::kGroups; ++g) {
      const typename B::GroupTerms t = B::group_terms(zpart, stats, gpart, gamma, n, g, scratch);
      if (threadIdx.x == 0) {
        terms[4 * g] = t.mean;
        terms[4 * g + 1] = t.rstd;
        terms[4 * g + 2] = t.ma;
        terms[4 * g + 3] = t.mb;
      }
    }
  }

  // x point j of this thread: its tile coordinates; whether it is one of x's points (not past the
  // tile's points or x's end), with its offset in an (n, ci) slice of x.
  const auto x_point = [&](int j, int& qd, int& qh, int& qw, size_t& at) {
    const int q = threadIdx.x + j * G::kThreads;
    qd = q / (Tune::kXH * Tune::kXW);
    qh = (q / Tune::kXW) % Tune::kXH;
    qw = q % Tune::kXW;
    at = (static_cast<size_t>(i0d + qd) * Cfg::kHin + i0h + qh) * Cfg::kWin + i0w + qw;
    return q < kXPts && i0d + qd < Cfg::kDin && i0h + qh < Cfg::kHin && i0w + qw < Cfg::kWin;
  };
  // The weight partials of `channel` in red (its [chunks][warps][32] buffer): over the warps in
  // order, to part as doubles.
  const auto write_weight_partials = [&](const float* red, int channel) {
    for (int i = threadIdx.x; i < G::kChunks * 32; i += blockDim.x) {
      const int ch = i / 32, l = i % 32, tap = ch * TC + l % TC, ci = l / TC;
      if (l < Ci * TC && tap < G::kKV) {
        double s = 0;
        for (int wp = 0; wp < G::kWarps; ++wp) s += red[(ch * G::kWarps + wp) * 32 + l];
        part[static_cast<size_t>(blockIdx.x) * G::kWeights + G::weight(ci, channel) * G::kKV +
             tap] = s;
      }
    }
  };

  // This thread's x points: region offset of tap 0, x values, grad_x sums.
  int base[P];
  float xv[P][Ci], dx[P][Ci];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    int qd, qh, qw;
    size_t at;
    const bool in = x_point(j, qd, qh, qw, at);
    const int q = threadIdx.x + j * G::kThreads;
    base[j] = q < kXPts ? (qd * G::kAD * G::kLH + qh * G::kAH) * G::kLW + qw * G::kAW : 0;
#pragma unroll
    for (int ci = 0; ci < Ci; ++ci) {
      xv[j][ci] = in ? x[(static_cast<size_t>(n) * Ci + ci) * kSin + at] : 0.f;
      dx[j][ci] = 0.f;
    }
  }

#pragma unroll 1
  for (int c = 0; c < C; ++c) {
    __syncthreads();  // the previous channel's reads of the region are done
    // Stage grad_u[n, c] over the region; sum the owned points for the bias.
    float tmean = 0, trstd = 0, tma = 0, tmb = 0, ga = 0, be = 0;
    if constexpr (Cfg::kGroups > 0) {
      const int g = c / B::kCg;
      tmean = terms[4 * g];
      trstd = terms[4 * g + 1];
      tma = terms[4 * g + 2];
      tmb = terms[4 * g + 3];
      ga = gamma[c];
      be = beta[c];
    }
    const typename B::GroupTerms t{tmean, trstd, tma, tmb};
    const int nc = n * C + c;
    // u of (n, c): rows of kW points, kURow apart ([N, C, D, H, W], or [N, D, H, C, W] where
    // Tune has kURowsByChannel: codegen::ULayout).
    constexpr bool kURows = URowsByChannel<Tune>::value;
    constexpr int kURow = kURows ? C * Cfg::kW : Cfg::kW;
    const float* const uc = kURows ? u + static_cast<size_t>(n) * C * B::kS + c * Cfg::kW
                                   : u + static_cast<size_t>(nc) * B::kS;
    // grad_y of the slice, or its one value broadcast through the mean.
    constexpr bool kNoMeanGy = Cfg::kMean == kNoMean;
    const GyT* const gyc = kNoMeanGy ? gy + static_cast<size_t>(nc) * B::kS : gy;
    const float gy_mean = kNoMeanGy ? 0.f : B::grad_y(gy, nc, 0);
    float bsum = 0.f;
    // One region point: its (u, grad_y) (zeros outside the output) and flags; then its grad_u
    // into the region, added to the bias sum where the tile owns it.
    struct Point {
      float2 v;
      bool valid, own;
    };
    const auto load = [&](bool in_region, int ed, int eh, int ew) {
      const int od = lod + ed, oh = loh + eh, ow = low + ew;
      Point q;
      q.valid = in_region && static_cast<unsigned>(od) < static_cast<unsigned>(Cfg::kD) &&
                static_cast<unsigned>(oh) < static_cast<unsigned>(Cfg::kH) &&
                static_cast<unsigned>(ow) < static_cast<unsigned>(Cfg::kW);
      // The region starts at the tile's first owned point on every axis.
      q.own = od < ownd && oh < ownh && ow < ownw;
      const int row = od * Cfg::kH + oh, at = row * Cfg::kW + ow;
      q.v = q.valid ? make_float2(uc[row * kURow + ow], kNoMeanGy ? to_f32(gyc[at]) : gy_mean)
                    : make_float2(0.f, 0.f);
      return q;
    };
    const auto store = [&](const Point& q, int e) {
      float g = 0.f;
      if (q.valid) {
        if constexpr (Cfg::kGroups > 0) {
          g = B::grad_u_norm(q.v.x, q.v.y, t, ga, be);
        } else {
          g = B::grad_u_plain(q.v.x, q.v.y);
        }
        if (q.own) bsum += g;
      }
      region[e] = g;
    };
    // Whole warps along the region's rows: warp w takes rows w, w + kWarps, ... (kRowUnroll at a
    // time, their loads in flight together), lane l columns l + 32 j, j < kM.
    constexpr int kRows = G::kLD * G::kLH, kM = G::kLW / 32, kRem = G::kLW % 32;
    constexpr int kRowUnroll = kM == 0 ? 1 : (Tune::kUnroll + kM - 1) / kM;
    if constexpr (kM > 0) {
      for (int r0 = warp; r0 < kRows; r0 += kRowUnroll * G::kWarps) {
        Point q[kRowUnroll][kM];
#pragma unroll
        for (int i = 0; i < kRowUnroll; ++i) {
          const int r = r0 + i * G::kWarps;
          const int ed = r / G::kLH, eh = r % G::kLH;
#pragma unroll
          for (int j = 0; j < kM; ++j) {
            q[i][j] = load(r < kRows, ed, eh, lane + 32 * j);
          }
        }
#pragma unroll
        for (int i = 0; i < kRowUnroll; ++i) {
          const int r = r0 + i * G::kWarps;
          if (r < kRows) {
#pragma unroll
            for (int j = 0; j < kM; ++j) store(q[i][j], r * G::kLW + lane + 32 * j);
          }
        }
      }
    }
    // The remaining kRem columns of every row, a point per thread.
    if constexpr (kRem > 0) {
      constexpr int kPerThread = (kRows * kRem + G::kThreads - 1) / G::kThreads;
      constexpr int kU = kPerThread < Tune::kUnroll ? kPerThread : Tune::kUnroll;
      for (int e0 = threadIdx.x; e0 < kRows * kRem; e0 += kU * G::kThreads) {
        Point q[kU];
#pragma unroll
        for (int k = 0; k < kU; ++k) {
          const int e = e0 + k * G::kThreads, r = e / kRem;
          q[k] = load(e < kRows * kRem, r / G::kLH, r % G::kLH, kM * 32 + e % kRem);
        }
#pragma unroll
        for (int k = 0; k < kU; ++k) {
          const int e = e0 + k * G::kThreads, r = e / kRem;
          if (e < kRows * kRem) store(q[k], r * G::kLW + kM * 32 + e % kRem);
        }
      }
    }
    // The bias sum of this warp (fixed tree), kept per (c, warp).
    double bs = bsum;
    for (int off = 16; off > 0; off >>= 1) bs += __shfl_down_sync(0xffffffffu, bs, off);
    if (lane == 0) bred[c * G::kWarps + warp] = bs;
    __syncthreads();  // the region is staged

    // The previous channel's weight partials.
    if (c > 0) write_weight_partials(wred + ((c + 1) % 2) * G::kChunks * G::kWarps * 32, c - 1);

    float* const red = wred + (c % 2) * G::kChunks * G::kWarps * 32;
#pragma unroll
    for (int ch = 0; ch < G::kChunks; ++ch) {
      float acc[32];
#pragma unroll
      for (int l = 0; l < 32; ++l) acc[l] = 0.f;
#pragma unroll
      for (int tl = 0; tl < TC; ++tl) {
        const int tap = ch * TC + tl;
        if (G::kKV % TC == 0 || tap < G::kKV) {
          const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH,
                    kw = tap % Cfg::kKW;
          // k' per axis: k (conv_transpose3d) or kernel-1-k (conv3d).
          const int fd = G::kT ? kd : Cfg::kKD - 1 - kd, fh = G::kT ? kh : Cfg::kKH - 1 - kh,
                    fw = G::kT ? kw : Cfg::kKW - 1 - kw;
          const int off = (fd * Cfg::kDilD * G::kLH + fh * Cfg::kDilH) * G::kLW + fw * Cfg::kDilW;
          float wv[Ci];
#pragma unroll
          for (int ci = 0; ci < Ci; ++ci) wv[ci] = ws[G::weight(ci, c) * G::kKV + tap];
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const float g = region[base[j] + off];
#pragma unroll
            for (int ci = 0; ci < Ci; ++ci) {
              dx[j][ci] = fmaf(wv[ci], g, dx[j][ci]);
              acc[ci * TC + tl] = fmaf(xv[j][ci], g, acc[ci * TC + tl]);
            }
          }
        }
      }
      const float total = warp_reduce_scatter32(acc);
      red[(ch * G::kWarps + warp) * 32 + lane] = total;
    }
  }
  __syncthreads();
  // The last channel's weight partials, the bias partials.
  {
    write_weight_partials(wred + ((C - 1) % 2) * G::kChunks * G::kWarps * 32, C - 1);
    if (bpart != nullptr) {
      for (int c = threadIdx.x; c < C; c += blockDim.x) {
        double s = 0;
        for (int wp = 0; wp < G::kWarps; ++wp) s += bred[c * G::kWarps + wp];
        bpart[(static_cast<size_t>(n) * C + c) * G::kTiles + tile] = s;
      }
    }
  }
  // grad_x.
#pragma unroll
  for (int j = 0; j < P; ++j) {
    int qd, qh, qw;
    size_t at;
    if (x_point(j, qd, qh, qw, at)) {
#pragma unroll
      for (int ci = 0; ci < Ci; ++ci)
        gx[(static_cast<size_t>(n) * Ci + ci) * kSin + at] = dx[j][ci];
    }
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the kernel with a conv_transpose3d and a conv3d configuration.
namespace fj_selftest {
struct FewInBwdSelfCfg : fj::DefaultConfig {
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kCin = 3, kDin = 4, kHin = 5, kWin = 6;
  static constexpr int kC = 8, kD = 7, kH = 9, kW = 11;
  static constexpr int kSD = 2, kSH = 2, kSW = 2, kPD = 1, kPH = 1, kPW = 1;
};
struct FewInBwdSelfBwdTune {
  static constexpr int kSplit = 2, kBiasSplit = 4, kThreads = 256;
};
struct FewInBwdSelfTune {
  static constexpr int kXD = 2, kXH = 4, kXW = 6, kThreads = 64, kUnroll = 4;
};
extern "C" __global__ void bwd_few_in(const float* x, const float* u, const float* gy,
                                      const float* w, const float* g, const float* b,
                                      const double2* z, const float* st, const double2* p,
                                      float* gx, double* part, double* bp) {
  fj::bwd_few_in_kernel<FewInBwdSelfCfg, FewInBwdSelfBwdTune, FewInBwdSelfTune>(
      x, u, gy, w, g, b, z, st, p, gx, part, bp);
}
// conv3d (stride 1): the default configuration.
extern "C" __global__ void bwd_few_in_conv3d(const float* x, const float* u, const float* gy,
                                             const float* w, const float* g, const float* b,
                                             const double2* z, const float* st, const double2* p,
                                             float* gx, double* part, double* bp) {
  fj::bwd_few_in_kernel<fj::DefaultConfig, FewInBwdSelfBwdTune, FewInBwdSelfTune>(
      x, u, gy, w, g, b, z, st, p, gx, part, bp);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_FEW_IN_BACKWARD_CUH_
