// templates/direct_conv_moments.cuh: direct conv3d for few input channels, fused with the chain's
// pre-group_norm elementwise ops, producing per-block per-channel moments instead of the conv
// output. Used by chains "conv3d | ew* | group_norm | mean" (seed W2, W4): the mean of an affine
// group_norm output is gamma_c * (m_c - mu_g) * rstd_g + beta_c, so per-channel (count, mean, M2)
// are all that is needed (group moments follow by Chan merges in moments_mean.cuh).
//
// Kernel: conv_moments<Cfg, Tune>(x, weight, bias, partials)
//   Each thread computes tiles of kPH x kPW output points (consecutive h, w) for the kC/kCSplit
//   output channels of its block's channel part in registers. It walks the tile's input rows
//   (ci, kd, r) in a runtime loop with a small body (one row of kWc inputs, fetched one row ahead
//   with cp.async into a per-thread shared-memory double buffer -- 16-byte copies where every
//   tile's rows start 16-byte aligned (kVecRow), else 4-byte ones -- then read into registers
//   with 16-byte loads), and reads weights from shared memory, copied and transposed
//   ([ci,kd,kh,kw][Cs padded to 4]) by each block at its start from the global weight pointer:
//   one 16-byte broadcast load feeds 4*kPW FFMAs.
//   (Measured on the H100: weights in __constant__ memory were 2-3.5x slower -- on sm_90 ptxas
//   loads them with ULDC/LDC instead of using c[][] FFMA operands -- and fully unrolled
//   20-40 KB loop bodies ran at 37-50% of FFMA peak.)
//   kCSplit > 1 splits the channels over the grid: block (b, n, p) computes channels
//   [p * Cs, (p + 1) * Cs), Cs = kC / kCSplit, and holds only those channels' weights: fewer
//   registers per thread and less shared memory per block (more channels, larger kernels).
//   kKSplit > 1 splits the reduction: kKSplit groups of kThreads/kKSplit threads (whole warps)
//   work on the same tiles, group p on the input rows of it = ci*KD + kd in
//   [p*Cin*KD/kKSplit, (p+1)*Cin*KD/kKSplit); after each round of tiles groups 1.. leave their
//   sums in shared memory and group 0 adds them in group order (more warps for chains with few
//   tiles and long reductions, same registers and loads per FFMA; two barriers a round).
//   Per tile it applies Cfg::pre to every output, takes the tile's per-channel mean/M2 and Chan-
//   merges it into the thread's running moments (one division per tile, shared by all channels).
//   At the end the block reduces (fixed order, in double) and writes one MomentsD per channel of
//   its part.
//
// Host-side contract:
//   grid  = dim3(Tune::kBlocksPerSample, Cfg::kN, Tune::kCSplit), block = dim3(Tune::kThreads),
//   dynamic shared memory = DirectConvGeom<Cfg, Tune>::kSharedBytes bytes, exactly (the host
//           computes the same sum: 4 * (kSmemW + kXbufStride*kThreads + 2*Cs*S +
//           (kKSplit-1)*Cs*kPH*kPW*S + kScratch), S = kThreads/kKSplit tile slots,
//           kSmemW = Cin*KD*KH*KW*Csp + Csp weights and bias (Csp = Cs rounded up to 4),
//           per-thread cp.async input-row buffers, per-slot running moments, K-part sums, and
//           (kThreads/32)*(2*Cs+1) doubles for the reduction; over 48 KiB the launcher raises the
//           kernel's dynamic shared memory limit). static_assert'ed <= kSharedLimit: the opt-in
//           limit per block of the architecture (227 KiB sm_90, 163 KiB sm_80/87, 99 KiB sm_86/89,
//           else 48 KiB).
//   reads : x [N,Cin,Din,Hin,Win]; weight [C,Cin,KD,KH,KW], bias [C] (global pointers, as given).
//   writes: partials, a workspace of Cfg::kN * Tune::kBlocksPerSample * Cfg::kC fj::MomentsD
//           (24 bytes each, 8-byte aligned), layout [N][kBlocksPerSample][C]; every entry is written each launch
//           (block (b, n, p) writes [n][b][p*Cs, (p+1)*Cs)).
//   next  : moments_mean.cuh's moments_mean_finalize<Cfg, Tune> on the same stream.
// Requirements (static_assert): kProducer == kConv3d, kBias (bias may be a zero tensor),
// kC % kCSplit == 0, kThreads % (32*kKSplit) == 0, kKSplit <= kCin*kKD, shared memory as above; stride, padding and dilation are
// general (padding via zero-filled cp.async). Tiles: the last tile in h and w may be partial
// (masked in the statistics). Seed tunings (H100): W4 PH1 PW6, 128 threads, kMinBlocksPerSM 2,
// kBlocksPerSample 2; W2 PH1 PW6, 128 threads, kMinBlocksPerSM 3, 1 block/sample.
#ifndef FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_
#define FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_

#include "common.cuh"
#include "default_config.cuh"  // enums (kConv3d, kMeanAll, ...); include-guarded
#include "moments_mean.cuh"  // fj::MomentsD (the finalize's input); include-guarded
#include "moments_util.cuh"

namespace fj {

// Default tuning (the generator passes its own struct with the same fields).
struct DirectConvTune {
  static constexpr int kThreads = 128;        // threads per block, multiple of 32
  static constexpr int kMinBlocksPerSM = 2;   // __launch_bounds__ second argument
  static constexpr int kPH = 1;               // outputs per thread along h
  static constexpr int kPW = 6;               // outputs per thread along w
  static constexpr int kBlocksPerSample = 2;  // grid.x: blocks sharing one sample
  static constexpr int kCSplit = 1;           // channel parts over grid.z (kC / kCSplit each)
  static constexpr int kKSplit = 1;           // K parts: threads of a tile slot, each some input rows
};

// Opt-in dynamic shared memory per block of the architecture being compiled for.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kSharedLimit = 227 * 1024;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870)
constexpr int kSharedLimit = 163 * 1024;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890)
constexpr int kSharedLimit = 99 * 1024;
#else
constexpr int kSharedLimit = 48 * 1024;
#endif

template <class Cfg, class Tune>
struct DirectConvGeom {
  static constexpr int kC = Cfg::kC;
  static constexpr int kCs = Cfg::kC / Tune::kCSplit;  // channels per block (and per thread)
  static constexpr int kCsp = (kCs + 3) / 4 * 4;       // padded to whole 16-byte weight loads
  static constexpr int kSlots = Tune::kThreads / Tune::kKSplit;  // tiles per block round
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
  // Every tile's input rows start 16-byte aligned (rows of a multiple of 4 floats, tile starts
  // kPW*kSW apart, a multiple of 4, no w padding): rows are fetched with 16-byte cp.async, a
  // quarter of the copy instructions (and of the L1 wavefronts) of 4-byte ones.
  static constexpr bool kVecRow = Cfg::kWin % 4 == 0 && (kPW * Cfg::kSW) % 4 == 0 && !kPadW;
  static constexpr int kSmemW = kCK * kKHW * kCsp + kCsp;
  static constexpr int kScratch = 2 * (Tune::kThreads / 32) * (2 * kCs + 1);  // doubles
  // Per-thread double buffer of one input row (kWc padded to 4), stride with an odd number of
  // 16-byte units so that 16-byte reads of 8 consecutive threads hit distinct banks.
  static constexpr int kWcP = (kWc + 3) / 4 * 4;
  static constexpr int kXbufStride = (2 * kWcP / 4) % 2 == 1 ? 2 * kWcP : 2 * kWcP + 4;
  // Dynamic shared memory, in this order (each part a multiple of 16 bytes before s_run):
  // weights+bias, input-row buffers, running moments (K part 0), K-part sums, reduction scratch.
  static constexpr int kXbufOffset = kSmemW;
  static constexpr int kRunOffset = kXbufOffset + kXbufStride * Tune::kThreads;
  static constexpr int kPartOffset = kRunOffset + 2 * kCs * kSlots;
  static constexpr int kRedOffset = kPartOffset + (Tune::kKSplit - 1) * kCs * kPH * kPW * kSlots;
  static_assert(kRedOffset % 2 == 0, "reduction scratch of doubles must be 8-byte aligned");
  static constexpr long long kSharedFloats = (long long)kRedOffset + kScratch;
  static constexpr long long kSharedBytes = 4 * kSharedFloats;
};

// Block reduction (fixed order, in double) of K moment sets per thread sharing one count;
// thread k < K writes set k of the block to out[k]. REQUIRES: blockDim.x multiple of 32, all
// threads call it; scratch holds (blockDim.x/32) * (2K+1) doubles.
template <int K>
__device__ __forceinline__ void block_reduce_moments_f64(float cnt_f, const float (&mean_f)[K],
                                                         const float (&m2_f)[K], double* scratch,
                                                         MomentsD* __restrict__ out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double cnt = cnt_f, mean[K], m2[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    mean[k] = mean_f[k];
    m2[k] = m2_f[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const double cb = __shfl_down_sync(0xffffffffu, cnt, off);
    const double total = cnt + cb;
    const double wb = total > 0 ? cb / total : 0.0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const double mb = __shfl_down_sync(0xffffffffu, mean[k], off);
      const double m2b = __shfl_down_sync(0xffffffffu, m2[k], off);
      const double delta = mb - mean[k];
      mean[k] += delta * wb;
      m2[k] += m2b + delta * delta * cnt * wb;
    }
    cnt = total;
  }
  if (lane == 0) {
    double* w = scratch + warp * (2 * K + 1);
    w[0] = cnt;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      w[1 + k] = mean[k];
      w[1 + K + k] = m2[k];
    }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    double n = 0, m = 0, q = 0;
    for (int v = 0; v < warps; ++v) {  // fixed order
      const double* w = scratch + v * (2 * K + 1);
      const double total = n + w[0];
      const double wb = total > 0 ? w[0] / total : 0.0;
      const double delta = w[1 + k] - m;
      m += delta * wb;
      q += w[1 + K + k] + delta * delta * n * wb;
      n = total;
    }
    out[k] = MomentsD{n, m, q};
  }
}

template <class Cfg, class Tune>
__device__ __forceinline__ void conv_moments(const float* __restrict__ x, const float* __restrict__ weight,
                 const float* __restrict__ bias, MomentsD* __restrict__ partials) {
  using G = DirectConvGeom<Cfg, Tune>;
  static_assert(Cfg::kProducer == kConv3d, "conv_moments: the chain's producer must be conv3d");
  static_assert(Cfg::kBias, "conv_moments: bias=false chains pass a zero bias tensor (not supported)");
  static_assert(Tune::kThreads % 32 == 0 && Tune::kThreads <= 1024, "kThreads: multiple of 32");
  static_assert(Tune::kCSplit >= 1 && Cfg::kC % Tune::kCSplit == 0,
                "conv_moments: kCSplit must divide kC");
  static_assert(Tune::kKSplit >= 1 && Tune::kThreads % (32 * Tune::kKSplit) == 0 &&
                    Tune::kKSplit <= Cfg::kCin * Cfg::kKD,
                "conv_moments: kKSplit must divide kThreads/32 and be at most kCin*kKD");
  static_assert(G::kSharedBytes <= kSharedLimit,
                "conv_moments: dynamic shared memory over the architecture's limit (lower kThreads "
                "or raise kCSplit)");
  constexpr int C = G::kCs, PH = G::kPH, PW = G::kPW, KH = Cfg::kKH, KW = Cfg::kKW, KD = Cfg::kKD;
  constexpr int Din = Cfg::kDin, Hin = Cfg::kHin, Win = Cfg::kWin;

  extern __shared__ __align__(16) float fj_conv_moments_smem[];
  float* const s_w = fj_conv_moments_smem;
  float* const s_xbuf = fj_conv_moments_smem + G::kXbufOffset;  // per-thread row buffers
  float* const s_run = fj_conv_moments_smem + G::kRunOffset;
  float* const s_part = fj_conv_moments_smem + G::kPartOffset;
  float* const s_red = fj_conv_moments_smem + G::kRedOffset;
  const int buf_off = threadIdx.x * G::kXbufStride;
  const unsigned my_buf = (unsigned)__cvta_generic_to_shared(s_xbuf + buf_off);

  const int n = blockIdx.y;
  const int c0 = blockIdx.z * G::kCs;  // first channel of this block's part
  const int slot = Tune::kKSplit == 1 ? (int)threadIdx.x : (int)threadIdx.x % G::kSlots;  // tile slot
  const int kpart = Tune::kKSplit == 1 ? 0 : (int)threadIdx.x / G::kSlots;  // K part, warp-uniform
  {
    // s_w[((it*KH + kh)*KW + kw)*Csp + c] = weight[c0 + c][it][kh][kw]; bias at the end. Copied
    // with cp.async (all of a thread's copies in flight at once), a warp covering 8 consecutive
    // taps of 4 channels: 32-byte pieces of the global weight rows, at most 4-way bank conflicts.
    constexpr int kK = G::kCK * G::kKHW, kKb = (kK + 7) / 8;
    const float* __restrict__ wp = weight + (size_t)c0 * kK;
    const unsigned s_w_addr = (unsigned)__cvta_generic_to_shared(s_w);
    for (int j = threadIdx.x; j < kKb * 8 * G::kCs; j += Tune::kThreads) {
      const int rb = j / (8 * G::kCs), rem = j - rb * (8 * G::kCs);
      const int co = rem >> 3, r = rb * 8 + (rem & 7);
      if (r < kK) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s_w_addr + 4u * (r * G::kCsp + co)),
                     "l"(wp + co * kK + r)
                     : "memory");
      }
    }
    if constexpr (G::kCsp != G::kCs) {
      constexpr int kPad = G::kCsp - G::kCs;
      for (int i = threadIdx.x; i < kK * kPad; i += Tune::kThreads)
        s_w[(i / kPad) * G::kCsp + G::kCs + i % kPad] = 0.f;
    }
    for (int i = threadIdx.x; i < G::kCsp; i += Tune::kThreads)
      s_w[kK * G::kCsp + i] = i < G::kCs ? __ldg(bias + c0 + i) : 0.f;
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
  }

  // Running moments of a K-part-0 thread live in shared memory (registers go to the
  // accumulators): s_run[c * kSlots + slot] = mean, s_run[(C + c) * kSlots + slot] = M2. Same
  // count for all c.
  float run_n = 0.f;
  float* const my_run = s_run + slot;
  if (kpart == 0) {
#pragma unroll
    for (int c = 0; c < 2 * C; ++c) my_run[c * G::kSlots] = 0.f;
  }

  const float* __restrict__ xn = x + (size_t)n * Cfg::kCin * Din * Hin * Win;
  const int t_begin = blockIdx.x * G::kTilesPerBlock;
  const int t_end = min(t_begin + G::kTilesPerBlock, G::kTiles);
  // This thread's input rows: (it, r) for it = ci*KD + kd in [it_begin, it_end) (its K part).
  const int it_begin = kpart * G::kCK / Tune::kKSplit;
  const int it_end = (kpart + 1) * G::kCK / Tune::kKSplit;

  // acc = bias (K part 0; else 0) + the conv sums of tile t over this thread's input rows.
  auto conv_tile = [&](int t, float (&acc)[C][PH][PW]) {
    const int tw = t % G::kTW;
    const int th = (t / G::kTW) % G::kTH;
    const int d = t / (G::kTW * G::kTH);
    const int h0 = th * PH, w0 = tw * PW;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float b = kpart == 0 ? s_w[G::kCK * G::kKHW * G::kCsp + c] : 0.f;
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
    const int row0 = it_begin * G::kR;
    auto issue_row = [&](int rho) {  // rho relative to row0; buffer rho & 1
      const int row = row0 + rho;
      const int it = row / G::kR, r = row - (row / G::kR) * G::kR;
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
      if constexpr (G::kVecRow) {
        // kWcP/4 aligned 16-byte pieces from iw0; a piece past the row end (partial last tile)
        // re-reads the row's last piece (those values only feed masked outputs).
#pragma unroll
        for (int q = 0; q < G::kWcP / 4; ++q) {
          int iw = iw0 + 4 * q;
          if constexpr (G::kPartialW) iw = min(iw, Win - 4);
          const int src_bytes = (G::kPadD || G::kPadH) ? (rok ? 16 : 0) : 16;  // 0: zero-fill
          asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + 16 * q),
                       "l"(xp + iw), "r"(src_bytes)
                       : "memory");
        }
        return;
      }
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
    int kRows = (it_end - it_begin) * G::kR;
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
      const int row = row0 + rho;
      const int it = row / G::kR, r = row - (row / G::kR) * G::kR;
#pragma unroll
      for (int ph = 0; ph < PH; ++ph) {
        const int khd = r - ph * Cfg::kSH;  // kh * DilH, warp-uniform
        if (khd < 0 || khd % Cfg::kDilH != 0 || khd / Cfg::kDilH >= KH) continue;
        const int kh = khd / Cfg::kDilH;
        const float4* __restrict__ sp =
            reinterpret_cast<const float4*>(s_w + (it * KH + kh) * KW * G::kCsp);
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          float wv[(C + 3) / 4 * 4];
#pragma unroll
          for (int j = 0; j < (C + 3) / 4; ++j) {
            const float4 q = sp[kw * (G::kCsp / 4) + j];
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
  };

  // Tile statistics of pre(conv) per channel, Chan-merged into the running moments.
  auto merge_tile = [&](int t, float (&acc)[C][PH][PW]) {
    const int tw = t % G::kTW;
    const int th = (t / G::kTW) % G::kTH;
    const int h0 = th * PH, w0 = tw * PW;
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
          const bool ok = ((G::kTH - 1) * PH + ph < Cfg::kH || ph < vh) &&
                          ((G::kTW - 1) * PW + pw < Cfg::kW || pw < vw);
          const float dv = ok ? v[ph][pw] - tm : 0.f;
          q = fmaf(dv, dv, q);
        }
      float rm = my_run[co * G::kSlots], rq = my_run[(C + co) * G::kSlots];
      chan_merge_w(rm, rq, run_n, tm, q, wb);
      my_run[co * G::kSlots] = rm;
      my_run[(C + co) * G::kSlots] = rq;
    }
    run_n += tcnt;
  };

  if constexpr (Tune::kKSplit == 1) {
#pragma unroll 1
    for (int t = t_begin + slot; t < t_end; t += G::kSlots) {
      float acc[C][PH][PW];
      conv_tile(t, acc);
      merge_tile(t, acc);
    }
  } else {
    // Rounds of kSlots tiles, the same count for every thread (barriers inside): K parts 1..
    // leave their sums in s_part, K part 0 adds them in part order (fixed: deterministic).
    constexpr int kAcc = C * PH * PW;
#pragma unroll 1
    for (int base = t_begin; base < t_end; base += G::kSlots) {
      const int t = base + slot;
      const bool active = t < t_end;
      float acc[C][PH][PW];
      if (active) conv_tile(t, acc);
      float* const flat = &acc[0][0][0];
      if (kpart > 0 && active) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s_part[((kpart - 1) * kAcc + i) * G::kSlots + slot] = flat[i];
      }
      __syncthreads();
      if (kpart == 0 && active) {
#pragma unroll 1
        for (int p = 1; p < Tune::kKSplit; ++p) {
#pragma unroll
          for (int i = 0; i < kAcc; ++i) flat[i] += s_part[((p - 1) * kAcc + i) * G::kSlots + slot];
        }
        merge_tile(t, acc);
      }
      __syncthreads();
    }
  }

  float run_mean[C], run_m2[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    run_mean[c] = kpart == 0 ? my_run[c * G::kSlots] : 0.f;
    run_m2[c] = kpart == 0 ? my_run[(C + c) * G::kSlots] : 0.f;
  }
  block_reduce_moments_f64<C>(
      run_n, run_mean, run_m2, reinterpret_cast<double*>(s_red),
      partials + ((size_t)n * Tune::kBlocksPerSample + blockIdx.x) * Cfg::kC + c0);
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with the default configuration.
extern "C" __global__ void __launch_bounds__(fj::DirectConvTune::kThreads,
                                             fj::DirectConvTune::kMinBlocksPerSM)
    direct_conv_moments_selftest(const float* x, const float* w, const float* b, fj::MomentsD* p) {
  fj::conv_moments<fj::DefaultConfig, fj::DirectConvTune>(x, w, b, p);
}
#endif

#endif  // FUSEJIT_TEMPLATES_DIRECT_CONV_MOMENTS_CUH_
