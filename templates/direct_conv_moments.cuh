// templates/direct_conv_moments.cuh: direct conv3d for few input channels, fused with the chain's
// pre-group_norm elementwise ops, producing per-block per-channel moments instead of the conv
// output. Used by chains "conv3d | ew* | group_norm | mean" (seed W2, W4): the mean of an affine
// group_norm output is gamma_c * (m_c - mu_g) * rstd_g + beta_c, so per-channel (count, mean, M2)
// are all that is needed (group moments follow by Chan merges in moments_mean.cuh).
//
// Kernel: conv_moments<Cfg, Tune>(x, weight, bias, partials)
//   Each thread computes tiles of kPH x kPW output points (consecutive h, w) for ALL kC output
//   channels in registers. It walks the tile's input rows (ci, kd, r) in a runtime loop with a
//   small body (one row of kWc inputs, fetched one row ahead with cp.async into a per-thread
//   shared-memory double buffer, then read into registers with 16-byte loads), and reads weights
//   from shared memory, copied and transposed ([ci,kd,kh,kw][C padded to 4]) by each block at
//   its start from the global weight pointer: one 16-byte broadcast load feeds 4*kPW FFMAs.
//   (Measured on the H100: weights in __constant__ memory were 2-3.5x slower -- on sm_90 ptxas
//   loads them with ULDC/LDC instead of using c[][] FFMA operands -- and fully unrolled
//   20-40 KB loop bodies ran at 37-50% of FFMA peak.)
//   kCSplit > 1 splits the channels over kCSplit consecutive warps (warp w computes channels
//   [(w % kCSplit) * C/kCSplit, ...) of the same tiles as its partner warps): fewer registers per
//   thread, more warps per SM, same 16-byte weight loads per FFMA.
//   Per tile it applies Cfg::pre to every output, takes the tile's per-channel mean/M2 and Chan-
//   merges it into the thread's running moments (one division per tile, shared by all channels).
//   At the end the block reduces (fixed order) and writes one Moments per channel.
//
// Host-side contract:
//   grid  = dim3(Tune::kBlocksPerSample, Cfg::kN), block = dim3(Tune::kThreads), no dynamic smem
//           (static shared, at most 48 KiB, static_assert'ed: 4*(Cin*KD*KH*KW*Cp + Cp) bytes of
//           weights (Cp = C rounded up to 4), 4*2*(C/kCSplit)*kThreads bytes of per-thread running
//           moments, 4*kXbufStride*kThreads bytes of per-thread cp.async input-row buffers, and
//           (kThreads/32)*(2C/kCSplit+1)*4 bytes for the reduction).
//   reads : x [N,Cin,Din,Hin,Win]; weight [C,Cin,KD,KH,KW], bias [C] (global pointers, as given).
//   writes: partials, a workspace of Cfg::kN * Tune::kBlocksPerSample * Cfg::kC fj::Moments
//           (12 bytes each), layout [N][kBlocksPerSample][C]; every entry is written each launch.
//   next  : moments_mean.cuh's moments_mean_finalize<Cfg, Tune> on the same stream.
// Requirements (static_assert): kProducer == kConv3d, kBias (bias may be a zero tensor); stride,
// padding and dilation are general (padding via zero-filled cp.async). Tiles: the last tile in h
// and w may be partial (masked in the statistics). Seed tunings (H100): W4 PH1 PW6, 128 threads,
// kMinBlocksPerSM 2, kBlocksPerSample 2; W2 PH1 PW6, 128 threads, kMinBlocksPerSM 3, 1 block/sample.
#ifndef FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_
#define FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_

#include "common.cuh"
#include "default_config.cuh"  // enums (kConv3d, kMeanAll, ...); include-guarded
#include "moments_util.cuh"

namespace fj {

// Default tuning (the generator passes its own struct with the same fields).
struct DirectConvTune {
  static constexpr int kThreads = 128;        // threads per block, multiple of 32
  static constexpr int kMinBlocksPerSM = 2;   // __launch_bounds__ second argument
  static constexpr int kPH = 1;               // outputs per thread along h
  static constexpr int kPW = 6;               // outputs per thread along w
  static constexpr int kBlocksPerSample = 2;  // grid.x: blocks sharing one sample
  static constexpr int kCSplit = 1;           // warps per tile slot; warp w does channel part w%kCSplit
};

template <class Cfg, class Tune>
struct DirectConvGeom {
  static constexpr int kC = Cfg::kC;
  static constexpr int kCS = Tune::kCSplit;            // channel parts
  static constexpr int kCs = Cfg::kC / Tune::kCSplit;  // channels per thread
  static constexpr int kSlots = Tune::kThreads / Tune::kCSplit;  // tiles per block round
  static constexpr int kCp = kCS == 1 ? (Cfg::kC + 3) / 4 * 4 : Cfg::kC;
  static constexpr int kKHW = Cfg::kKH * Cfg::kKW;
  static constexpr int kCK = Cfg::kCin * Cfg::kKD;
  static constexpr int kPH = Tune::kPH, kPW = Tune::kPW;
  // Input window of one tile for one (ci, kd): rows x cols.
  static constexpr int kR = (kPH - 1) * Cfg::kSH + (Cfg::kKH - 1) * Cfg::kDilH + 1;
  static constexpr int kWc = (kPW - 1) * Cfg::kSW + (Cfg::kKW - 1) * Cfg::kDilW + 1;
  static constexpr int kTH = (Cfg::kH + kPH - 1) / kPH;
  static constexpr int kTW = (Cfg::kW + kPW - 1) / kPW;
  static constexpr int kTiles = Cfg::kD * kTH * kTW;  // per sample
  static constexpr int kTilesPerBlock = (kTiles + Tune::kBlocksPerSample - 1) / Tune::kBlocksPerSample;
  static constexpr bool kPartialH = kTH * kPH != Cfg::kH;
  static constexpr bool kPartialW = kTW * kPW != Cfg::kW;
  static constexpr bool kPadD = Cfg::kPD != 0, kPadH = Cfg::kPH != 0, kPadW = Cfg::kPW != 0;
  static constexpr int kSmemW = kCK * kKHW * kCp + kCp;
  static constexpr int kScratch = (Tune::kThreads / 32) * (2 * kCs + 1);
  // Per-thread double buffer of one input row (kWc padded to 4), stride with an odd number of
  // 16-byte units so that 16-byte reads of 8 consecutive threads hit distinct banks.
  static constexpr int kWcP = (kWc + 3) / 4 * 4;
  static constexpr int kXbufStride = (2 * kWcP / 4) % 2 == 1 ? 2 * kWcP : 2 * kWcP + 4;
};

template <class Cfg, class Tune>
__device__ __forceinline__ void conv_moments(const float* __restrict__ x, const float* __restrict__ weight,
                 const float* __restrict__ bias, Moments* __restrict__ partials) {
  using G = DirectConvGeom<Cfg, Tune>;
  static_assert(Cfg::kProducer == kConv3d, "conv_moments: the chain's producer must be conv3d");
  static_assert(Cfg::kBias, "conv_moments: bias=false chains pass a zero bias tensor (not supported)");
  static_assert(Tune::kThreads % 32 == 0 && Tune::kThreads <= 1024, "kThreads: multiple of 32");
  static_assert(Cfg::kC % Tune::kCSplit == 0 && (Tune::kCSplit == 1 || G::kCs % 4 == 0),
                "conv_moments: kCSplit must split kC into parts of a multiple of 4 channels");
  static_assert(Tune::kThreads % (32 * Tune::kCSplit) == 0, "conv_moments: kThreads % (32*kCSplit)");
  static_assert(4 * (G::kSmemW + G::kScratch + (2 * G::kCs + G::kXbufStride) * Tune::kThreads) <= 48 * 1024,
                "conv_moments: static smem over 48 KiB (lower kThreads)");
  constexpr int C = G::kCs, PH = G::kPH, PW = G::kPW, KH = Cfg::kKH, KW = Cfg::kKW, KD = Cfg::kKD;
  constexpr int Din = Cfg::kDin, Hin = Cfg::kHin, Win = Cfg::kWin;

  __shared__ __align__(16) float s_w[G::kSmemW];
  __shared__ float s_red[G::kScratch];
  __shared__ float s_run[2 * G::kCs * Tune::kThreads];
  __shared__ __align__(16) float s_xbuf[G::kXbufStride * Tune::kThreads];  // per-thread row buffers
  const int buf_off = threadIdx.x * G::kXbufStride;
  const unsigned my_buf = (unsigned)__cvta_generic_to_shared(s_xbuf + buf_off);

  const int n = blockIdx.y;
  const int part = (threadIdx.x >> 5) % G::kCS;                      // warp-uniform channel part
  const int slot = (threadIdx.x >> 5) / G::kCS * 32 + (threadIdx.x & 31);
  {
    // s_w[((it*KH + kh)*KW + kw)*Cp + co] = weight[co][it][kh][kw]; bias at the end.
    for (int i = threadIdx.x; i < G::kCK * G::kKHW * G::kCp; i += Tune::kThreads) {
      const int co = i % G::kCp, r = i / G::kCp;  // r = it*KHW + khw
      s_w[i] = co < Cfg::kC ? __ldg(weight + co * (G::kCK * G::kKHW) + r) : 0.f;
    }
    for (int i = threadIdx.x; i < G::kCp; i += Tune::kThreads)
      s_w[G::kCK * G::kKHW * G::kCp + i] = i < Cfg::kC ? __ldg(bias + i) : 0.f;
    __syncthreads();
  }

  // Running moments of this thread live in shared memory (registers go to the accumulators):
  // s_run[c * kThreads + tid] = mean, s_run[(C + c) * kThreads + tid] = M2. Same count for all c.
  float run_n = 0.f;
  float* const my_run = s_run + threadIdx.x;
#pragma unroll
  for (int c = 0; c < 2 * C; ++c) my_run[c * Tune::kThreads] = 0.f;

  const float* __restrict__ xn = x + (size_t)n * Cfg::kCin * Din * Hin * Win;
  const int t_begin = blockIdx.x * G::kTilesPerBlock;
  const int t_end = min(t_begin + G::kTilesPerBlock, G::kTiles);

#pragma unroll 1
  for (int t = t_begin + slot; t < t_end; t += G::kSlots) {
    const int tw = t % G::kTW;
    const int th = (t / G::kTW) % G::kTH;
    const int d = t / (G::kTW * G::kTH);
    const int h0 = th * PH, w0 = tw * PW;

    float acc[C][PH][PW];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float b = s_w[G::kCK * G::kKHW * G::kCp + part * C + c];
#pragma unroll
      for (int ph = 0; ph < PH; ++ph)
#pragma unroll
        for (int pw = 0; pw < PW; ++pw) acc[c][ph][pw] = b;
    }

    const int id0 = d * Cfg::kSD - Cfg::kPD;
    const int ih0 = h0 * Cfg::kSH - Cfg::kPH;
    const int iw0 = w0 * Cfg::kSW - Cfg::kPW;

    // Runtime loop over the tile's input rows rho = (it = ci*KD + kd, r): a small loop body keeps
    // the instruction cache warm (fully unrolled bodies of 20-40 KB ran at 37-50% of FFMA peak).
    // Row rho+1 is fetched with cp.async into this thread's own double buffer in shared memory
    // while row rho is used: ptxas sank register prefetches (plain loads) to the end of the loop,
    // exposing the global-load latency every row.
    auto issue_row = [&](int rho) {
      const int it = rho / G::kR, r = rho - (rho / G::kR) * G::kR;
      const int ci = it / KD, kd = it - (it / KD) * KD;
      const int id = id0 + kd * Cfg::kDilD;
      const int ih = ih0 + r;
      bool rok = true;
      if constexpr (G::kPadD) rok = rok && id >= 0 && id < Din;
      if constexpr (G::kPadH) rok = rok && ih >= 0 && ih < Hin;
      int idc = id, ihc = ih;
      if constexpr (G::kPadD) idc = min(max(id, 0), Din - 1);
      if constexpr (G::kPadH || G::kPartialH) ihc = min(max(ih, 0), Hin - 1);
      const float* __restrict__ xp = xn + ((size_t)(ci * Din + idc) * Hin + ihc) * Win;
      const unsigned dst = my_buf + (unsigned)((rho & 1) * G::kWcP * 4);
#pragma unroll
      for (int cc = 0; cc < G::kWc; ++cc) {
        const int iw = iw0 + cc;
        int iwc = iw;
        if constexpr (G::kPadW || G::kPartialW) iwc = min(max(iw, 0), Win - 1);
        bool ok = rok;
        if constexpr (G::kPadW) ok = ok && iw >= 0 && iw < Win;
        const int src_bytes = (G::kPadD || G::kPadH || G::kPadW) ? (ok ? 4 : 0) : 4;  // 0: zero-fill
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * cc),
                     "l"(xp + iwc), "r"(src_bytes)
                     : "memory");
      }
    };
    // Opaque trip count: with a constant one nvcc fully unrolled this loop despite unroll 1.
    int kRows = G::kCK * G::kR;
    asm volatile("" : "+r"(kRows));
    issue_row(0);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#pragma unroll 1
    for (int rho = 0; rho < kRows; ++rho) {
      if (rho + 1 < kRows) issue_row(rho + 1);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // row rho has landed
      float xrow[G::kWcP];
      const float4* __restrict__ bp = reinterpret_cast<const float4*>(s_xbuf + buf_off + (rho & 1) * G::kWcP);
#pragma unroll
      for (int j = 0; j < G::kWcP / 4; ++j) {
        const float4 v = bp[j];
        xrow[4 * j] = v.x;
        xrow[4 * j + 1] = v.y;
        xrow[4 * j + 2] = v.z;
        xrow[4 * j + 3] = v.w;
      }
      const int it = rho / G::kR, r = rho - (rho / G::kR) * G::kR;
#pragma unroll
      for (int ph = 0; ph < PH; ++ph) {
        const int khd = r - ph * Cfg::kSH;  // kh * DilH, warp-uniform
        if (khd < 0 || khd % Cfg::kDilH != 0 || khd / Cfg::kDilH >= KH) continue;
        const int kh = khd / Cfg::kDilH;
        const float4* __restrict__ sp =
            reinterpret_cast<const float4*>(s_w + (it * KH + kh) * KW * G::kCp + part * C);
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          float wv[(C + 3) / 4 * 4];
#pragma unroll
          for (int j = 0; j < (C + 3) / 4; ++j) {
            const float4 q = sp[kw * (G::kCp / 4) + j];
            wv[4 * j] = q.x;
            wv[4 * j + 1] = q.y;
            wv[4 * j + 2] = q.z;
            wv[4 * j + 3] = q.w;
          }
#pragma unroll
          for (int co = 0; co < C; ++co)
#pragma unroll
            for (int pw = 0; pw < PW; ++pw)
              acc[co][ph][pw] = fmaf(xrow[pw * Cfg::kSW + kw * Cfg::kDilW], wv[co], acc[co][ph][pw]);
        }
      }
    }

    // Tile statistics of pre(conv) per channel, Chan-merged into the running moments.
    const int vh = G::kPartialH ? min(PH, Cfg::kH - h0) : PH;
    const int vw = G::kPartialW ? min(PW, Cfg::kW - w0) : PW;
    const float tcnt = (float)(vh * vw);
    const float inv = 1.f / tcnt;
    const float wb = tcnt / (run_n + tcnt);
#pragma unroll
    for (int co = 0; co < C; ++co) {
      float v[PH][PW];
      float s = 0.f;
#pragma unroll
      for (int ph = 0; ph < PH; ++ph)
#pragma unroll
        for (int pw = 0; pw < PW; ++pw) {
          v[ph][pw] = Cfg::pre(acc[co][ph][pw]);
          // Only the last tile row/column can be partial: ph / pw below these are always valid.
          const bool ok = ((G::kTH - 1) * PH + ph < Cfg::kH || ph < vh) &&
                          ((G::kTW - 1) * PW + pw < Cfg::kW || pw < vw);
          s += ok ? v[ph][pw] : 0.f;
        }
      const float tm = s * inv;
      float q = 0.f;
#pragma unroll
      for (int ph = 0; ph < PH; ++ph)
#pragma unroll
        for (int pw = 0; pw < PW; ++pw) {
          // Only the last tile row/column can be partial: ph / pw below these are always valid.
          const bool ok = ((G::kTH - 1) * PH + ph < Cfg::kH || ph < vh) &&
                          ((G::kTW - 1) * PW + pw < Cfg::kW || pw < vw);
          const float dv = ok ? v[ph][pw] - tm : 0.f;
          q = fmaf(dv, dv, q);
        }
      float rm = my_run[co * Tune::kThreads], rq = my_run[(C + co) * Tune::kThreads];
      chan_merge_w(rm, rq, run_n, tm, q, wb);
      my_run[co * Tune::kThreads] = rm;
      my_run[(C + co) * Tune::kThreads] = rq;
    }
    run_n += tcnt;
  }

  float run_mean[C], run_m2[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    run_mean[c] = my_run[c * Tune::kThreads];
    run_m2[c] = my_run[(C + c) * Tune::kThreads];
  }
  block_reduce_shared_count_store<C, G::kCS>(run_n, run_mean, run_m2, s_red,
                                             partials + ((size_t)n * Tune::kBlocksPerSample + blockIdx.x) * Cfg::kC);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with the default configuration.
extern "C" __global__ void __launch_bounds__(fj::DirectConvTune::kThreads,
                                             fj::DirectConvTune::kMinBlocksPerSM)
    direct_conv_moments_selftest(const float* x, const float* w, const float* b, fj::Moments* p) {
  fj::conv_moments<fj::DefaultConfig, fj::DirectConvTune>(x, w, b, p);
}
#endif

#endif  // FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_
