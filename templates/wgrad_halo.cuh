// templates/wgrad_halo.cuh: the weight gradient on tensor cores for T with at most 32 channels
// (few output channels of a conv3d, few input channels of a conv_transpose3d), the GEMM of
// templates/wgrad.cuh (grad_w[a][b*kKV + tap] = sum_{n,p} T[n,a,p] * S[n,b, p*s - pad + tap*dil]).
//
// wgrad_mma_partial_kernel gathers every (point, column) operand from global memory: one load and
// its index arithmetic per tap. Here a k-step is a tile of T's grid (geom::WgradHalo: rh rows x seg
// points of one (n, d) plane), and the block stages, once per step, the T tile and the box of S
// all its taps read (the halo). The B operand of column (b, tap) at tile point (i, j) is then the
// halo value at a fixed offset per column plus a fixed offset per point: no per-tap loads.
//
// Both are copied with cp.async into a two-stage pipeline (the next step's copies in flight while
// this one is computed), then split once per value into (TF32 high, low) pairs that the fragments
// read (3xTF32 as in wgrad.cuh; one TF32 product when precision tf32 is asked for). Products of
// one k-step are summed in fp32 by the tensor cores, then added to
// double accumulators; each block writes its tile's double partials for one chunk of k-steps and
// wgrad_reduce_kernel sums the chunks in order: deterministic.
#ifndef FUSEJIT_TEMPLATES_WGRAD_HALO_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_HALO_CUH_

#include "geometry.cuh"
#include "wgrad.cuh"

namespace fj {

// Tune: kBM 16 or 32 (T channels per block), kBN a multiple of 64 up to 256 (columns per block),
// kRH, kSeg (the T tile), kSplits, kChunk (k-steps per chunk), kPrec3. Grid (ceil(kNcol / kBN),
// ceil(kA / kBM), kSplits); 256 threads; dynamic shared memory geom::WgradHalo::smem.
template <class Cfg, class Tune>
struct WgHaloGeom {
  using G = WgGeom<Cfg>;
  static constexpr geom::WgradHalo kH = geom::WgradHaloOf(
      Cfg::kN, G::kTD, G::kTH, G::kTW, Cfg::kKD, Cfg::kKH, Cfg::kKW, Cfg::kSH, Cfg::kSW, Cfg::kDilH,
      Cfg::kDilW, G::kB, Tune::kRH, Tune::kSeg, Tune::kBM, Tune::kBN);
  static constexpr int kBM = Tune::kBM, kBN = Tune::kBN, kRH = Tune::kRH, kSeg = Tune::kSeg;
  static constexpr int kBK = kH.bk, kHB = kH.hb, kWB = kH.wb, kSteps = kH.steps;
  static constexpr int kHH = kH.hh, kHW = kH.hw, kPlane = kH.plane, kHalo = kH.halo;
  static constexpr int kThreads = 256, kWarps = 8;
  static constexpr int kTP = kBM + 8;  // copied T tile pitch: 8 mod 16 floats (wg::swz)
  static constexpr int kStage = kBK * kTP + kHalo;  // floats of one pipeline stage
  // Split T tile pitch: 4 mod 16 pairs, so that a half-warp's A fragment (4 k x 4 rows) reads
  // 16 different 8-byte bank pairs.
  static constexpr int kSP = kBM + 4;
  static constexpr int kSplit = kBK * kSP + kHalo;      // (high, low) pairs of the split stage
  static constexpr int kMI = kBM / 16, kNI = kBN / 64;  // mma tiles per warp
  static_assert(kBM == 16 || kBM == 32, "wgrad_halo: 16 or 32 rows per block");
  static_assert(kBN % 64 == 0 && kNI >= 1 && kNI <= 4, "wgrad_halo: 64 to 256 columns per block");
  static_assert(kBK % 16 == 0 && kRH * kSeg <= kBK, "wgrad_halo: k-steps of whole mma k-slices");
  static_assert(2 * 4 * kStage + 8 * kSplit + 4 * kBK == kH.smem, "wgrad_halo: shared memory");
};

namespace wgh {
// 4-byte cp.async; src_size 0 (valid false) writes a zero.
__device__ __forceinline__ void cp_async4(unsigned dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
}  // namespace wgh

template <class Cfg, class Tune>
__device__ void wgrad_halo_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                  double* __restrict__ part) {
  using G = WgGeom<Cfg>;
  using H = WgHaloGeom<Cfg, Tune>;
  constexpr int BK = H::kBK, MI = H::kMI, NI = H::kNI, kTP = H::kTP;
  constexpr bool kPrec3 = Tune::kPrec3 != 0;
  constexpr int kTileK = H::kRH * H::kSeg;  // k-step points that are tile points
  const float* __restrict__ T = G::kConv ? gu : x;
  const float* __restrict__ S = G::kConv ? x : gu;

  // [split stage: T tile BK x kSP, halo kHalo; (high, low) pairs]
  // [two copy stages: T tile BK x kTP (swizzled), halo kHalo; floats] [k offsets: BK ints]
  extern __shared__ __align__(16) float wgh_smem[];
  uint2* split = reinterpret_cast<uint2*>(wgh_smem);
  float* copies = wgh_smem + 2 * H::kSplit;
  int* kofs = reinterpret_cast<int*>(copies + 2 * H::kStage);
  const unsigned copies_at = static_cast<unsigned>(__cvta_generic_to_shared(copies));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * H::kBM, c0 = blockIdx.x * H::kBN;
  const int b_lo = c0 / G::kKV;
  const int s_begin = blockIdx.z * Tune::kChunk;
  const int s_end = min(s_begin + Tune::kChunk, H::kSteps);

  // The k-step padding points are never copied to: zero them in both stages once.
  for (int i = tid; i < 2 * (BK - kTileK) * kTP; i += H::kThreads) {
    const int stage = i / ((BK - kTileK) * kTP), rem = i % ((BK - kTileK) * kTP);
    copies[stage * H::kStage + kTileK * kTP + rem] = 0.f;
  }
  // Halo offset of k-step point k (tile row k / kSeg, point k % kSeg); 0 for the padding points
  // (their T values are zero).
  for (int k = tid; k < BK; k += H::kThreads) {
    kofs[k] = k < kTileK ? (k / H::kSeg) * Cfg::kSH * H::kHW + (k % H::kSeg) * Cfg::kSW : 0;
  }

  // This thread's B columns: warp's n-tiles warp + 8 * ni, column g of each. Halo offset of the
  // column's tap at tile point (0, 0); 0 past the last column (its results are not stored).
  int cbase[NI];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = c0 + (warp + 8 * ni) * 8 + g;
    const int b = col / G::kKV, tap = col % G::kKV;
    const int kd = tap / (Cfg::kKH * Cfg::kKW), kh = (tap / Cfg::kKW) % Cfg::kKH,
              kw = tap % Cfg::kKW;
    cbase[ni] = col < G::kNcol ? (b - b_lo) * H::kPlane + (kd * H::kHH + kh * Cfg::kDilH) * H::kHW +
                                     kw * Cfg::kDilW
                               : 0;
  }

  // Copies step `step`'s T tile and halo into `stage` (cp.async, zeros outside the tensors), a
  // value per thread over each as a flat range (rows of 8 to 64 values would idle lanes).
  auto fetch = [&](int stage, int step) {
    const int wb = step % H::kWB, hb = (step / H::kWB) % H::kHB;
    const int pd = (step / (H::kWB * H::kHB)) % G::kTD, n = step / (H::kWB * H::kHB * G::kTD);
    const int ph0 = hb * H::kRH, pw0 = wb * H::kSeg;
    const unsigned t_at = copies_at + 4u * stage * H::kStage;
    const float* tn = T + (static_cast<long long>(n) * G::kA + m0) * G::kPT +
                      static_cast<long long>(pd) * G::kTH * G::kTW + ph0 * G::kTW + pw0;
    for (int e = tid; e < H::kBM * kTileK; e += H::kThreads) {
      const int k = e % kTileK, a = e / kTileK;  // k = tile row i * kSeg + point j
      const int i = k / H::kSeg, j = k % H::kSeg;
      const bool ok = m0 + a < G::kA && ph0 + i < G::kTH && pw0 + j < G::kTW;
      const float* src = tn + static_cast<long long>(a) * G::kPT + i * G::kTW + j;
      wgh::cp_async4(t_at + 4u * (k * kTP + wg::swz(k, a)), ok ? src : T, ok);
    }
    constexpr int kQHW = G::kQH * G::kQW, kQS = G::kQD * kQHW;
    const unsigned h_at = t_at + 4u * BK * kTP;
    const float* sn = S + (static_cast<long long>(n) * G::kB + b_lo) * kQS;
    const int qd0 = pd * Cfg::kSD - Cfg::kPD, qh0 = ph0 * Cfg::kSH - Cfg::kPH,
              qw0 = pw0 * Cfg::kSW - Cfg::kPW;
    for (int e = tid; e < H::kHalo; e += H::kThreads) {
      const int ww = e % H::kHW, row = e / H::kHW;  // row = (channel, kd, hh)
      const int cb = row / (Cfg::kKD * H::kHH), kd = (row / H::kHH) % Cfg::kKD, hh = row % H::kHH;
      const int qd = qd0 + kd * Cfg::kDilD, qh = qh0 + hh, qw = qw0 + ww;
      const bool ok = b_lo + cb < G::kB && qd >= 0 && qd < G::kQD && qh >= 0 && qh < G::kQH &&
                      qw >= 0 && qw < G::kQW;
      const float* src = sn + static_cast<long long>(cb) * kQS + qd * kQHW + qh * G::kQW + qw;
      wgh::cp_async4(h_at + 4u * e, ok ? src : S, ok);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  // Splits a copy stage into (TF32 high, low) pairs (low 0 in TF32 mode), each value once: the
  // T tile unswizzled into pitch kSP, the halo in place.
  auto split_stage = [&](int stage) {
    const float* ts = copies + stage * H::kStage;
    const float* hs = ts + BK * kTP;
    for (int e = tid; e < BK * H::kBM; e += H::kThreads) {
      const int k = e / H::kBM, a = e % H::kBM;
      uint2 p = make_uint2(0u, 0u);
      if constexpr (kPrec3) {
        wg::split(ts[k * kTP + wg::swz(k, a)], p.x, p.y);
      } else {
        p.x = tc_tf32(ts[k * kTP + wg::swz(k, a)]);
      }
      split[k * H::kSP + a] = p;
    }
    uint2* sh = split + BK * H::kSP;
    for (int e = tid; e < H::kHalo; e += H::kThreads) {
      uint2 p = make_uint2(0u, 0u);
      if constexpr (kPrec3) {
        wg::split(hs[e], p.x, p.y);
      } else {
        p.x = tc_tf32(hs[e]);
      }
      sh[e] = p;
    }
  };

  WgAcc<MI, NI> acc;
  acc.zero();

  if (s_begin < s_end) fetch(0, s_begin);
  for (int step = s_begin, stage = 0; step < s_end; ++step, stage ^= 1) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();  // this step's copies landed; the last step's split pairs are read
    if (step + 1 < s_end) fetch(stage ^ 1, step + 1);  // in flight while this step is computed
    split_stage(stage);
    __syncthreads();
    const uint2* st = split;
    const uint2* sh = split + BK * H::kSP;
#pragma unroll
    for (int k8 = 0; k8 < BK; k8 += 8) {
      const int ka = k8 + t, kb = k8 + t + 4;
      const int hka = kofs[ka], hkb = kofs[kb];
      unsigned ah[MI][4], al[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int row = mi * 16 + g;
        const uint2 v[4] = {st[ka * H::kSP + row], st[ka * H::kSP + row + 8], st[kb * H::kSP + row],
                            st[kb * H::kSP + row + 8]};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ah[mi][e] = v[e].x;
          al[mi][e] = v[e].y;
        }
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const uint2 b0 = sh[cbase[ni] + hka], b1 = sh[cbase[ni] + hkb];
        const unsigned bh[2] = {b0.x, b1.x}, bl[2] = {b0.y, b1.y};
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          if constexpr (kPrec3) {
            tc_mma(acc.f[mi][ni], al[mi], bh);
            tc_mma(acc.f[mi][ni], ah[mi], bl);
          }
          tc_mma(acc.f[mi][ni], ah[mi], bh);
        }
      }
    }
    acc.flush();
  }

  acc.store(part + static_cast<size_t>(blockIdx.z) * G::kA * G::kNcol, G::kA, G::kNcol, m0,
            [&](int ni) { return c0 + (warp + 8 * ni) * 8; });
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the default configuration, fp32-accurate and TF32.
namespace fj_selftest {
struct WgHaloSelfTune {
  static constexpr int kBM = 16, kBN = 128, kRH = 2, kSeg = 8;
  static constexpr int kSplits = 3, kChunk = 4, kPrec3 = 1;
};
extern "C" __global__ void wgrad_halo(const float* x, const float* gu, double* part) {
  fj::wgrad_halo_kernel<fj::DefaultConfig, WgHaloSelfTune>(x, gu, part);
}
struct WgHaloTf32SelfTune : WgHaloSelfTune {
  static constexpr int kBM = 32, kBN = 192, kPrec3 = 0;
};
extern "C" __global__ void wgrad_halo_tf32(const float* x, const float* gu, double* part) {
  fj::wgrad_halo_kernel<fj::DefaultConfig, WgHaloTf32SelfTune>(x, gu, part);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_HALO_CUH_
