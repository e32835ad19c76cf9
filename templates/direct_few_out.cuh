// templates/direct_few_out.cuh: a direct convolution for few output channels (kC <= 8; <= 32 for a
// 1x1x1 kernel), such as
// the data gradient of a convolution whose input has few channels (its dual convolution maps many
// channels onto x's few). Chains: producer then elementwise ops (no group_norm, no mean).
//
// One thread computes kTH x kTW outputs (kTH consecutive rows along h, kTW consecutive outputs
// along w) for every output channel. For each input channel, kd tap and input row those outputs
// read it loads the row span into registers once and reuses it for every (output row, kh) pair
// reading that row, every kw tap and output channel (kTH > 1: stride 1 along h only); the weights
// sit in shared memory in [ci][kd][kh][kw][co] order (read as broadcasts). Sums are fp32 FMAs in a
// fixed order: deterministic.
//
// Input position of output o and tap k per dimension:
//   conv3d:                        o * stride - padding + k * dilation
//   conv_transpose3d (stride 1):   o + padding - k * dilation
#ifndef FUSEJIT_TEMPLATES_DIRECT_FEW_OUT_CUH_
#define FUSEJIT_TEMPLATES_DIRECT_FEW_OUT_CUH_

#include "common.cuh"
#include "default_config.cuh"

namespace fj {

template <class Cfg>
struct FewOut {
  static constexpr bool kConv = Cfg::kProducer == kConv3d;
  static_assert(kConv || (Cfg::kSD == 1 && Cfg::kSH == 1 && Cfg::kSW == 1),
                "direct_few_out: conv_transpose3d with stride 1 only");
  static constexpr int kStepD = kConv ? Cfg::kSD : 1, kStepH = kConv ? Cfg::kSH : 1,
                       kStepW = kConv ? Cfg::kSW : 1;
  static constexpr int kOffD = kConv ? -Cfg::kPD : Cfg::kPD, kOffH = kConv ? -Cfg::kPH : Cfg::kPH,
                       kOffW = kConv ? -Cfg::kPW : Cfg::kPW;
  static constexpr int kTapD = kConv ? Cfg::kDilD : -Cfg::kDilD,
                       kTapH = kConv ? Cfg::kDilH : -Cfg::kDilH,
                       kTapW = kConv ? Cfg::kDilW : -Cfg::kDilW;
  static constexpr int kKV = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static constexpr int kWeights = Cfg::kC * Cfg::kCin * kKV;
  static_assert(Cfg::kC <= 8 || (kKV == 1 && Cfg::kC <= 32),
                "direct_few_out: at most 8 output channels (32 for a 1x1x1 kernel)");
  static_assert(kWeights * 4 <= 48 * 1024, "direct_few_out: weights fit static shared memory");
};

// Grid-stride over (n, od, h tile, w tile). Tune: kTW outputs along w and kTH along h per thread.
template <class Cfg, class Tune>
__device__ void few_out_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ y) {
  using F = FewOut<Cfg>;
  constexpr int TW = Tune::kTW, TH = Tune::kTH, C = Cfg::kC, KW = Cfg::kKW, KH = Cfg::kKH;
  static_assert(TH == 1 || F::kStepH == 1, "direct_few_out: several rows per thread at stride 1");
  // Input rows of a thread's outputs, relative to the first output row's (kh = 0) row: th +
  // kh * kTapH, in [kRelMin, kRelMax].
  constexpr int kRelMin = F::kTapH < 0 ? (KH - 1) * F::kTapH : 0;
  constexpr int kRelMax = (TH - 1) + (F::kTapH > 0 ? (KH - 1) * F::kTapH : 0);
  constexpr int kAbsTapW = F::kTapW < 0 ? -F::kTapW : F::kTapW;
  constexpr int kMinTap = F::kTapW < 0 ? (KW - 1) * F::kTapW : 0;
  constexpr int kSpan = (TW - 1) * F::kStepW + (KW - 1) * kAbsTapW + 1;
  static_assert(kSpan <= 64, "direct_few_out: row span fits registers");
  __shared__ float ws[F::kWeights];
  for (int i = threadIdx.x; i < F::kWeights; i += blockDim.x) {
    // i in [ci][tap][co] order; the source is [co][ci][tap] (conv3d) or [ci][co][tap].
    const int co = i % C, tap = (i / C) % F::kKV, ci = i / (C * F::kKV);
    ws[i] = F::kConv ? w[(co * Cfg::kCin + ci) * F::kKV + tap] : w[(ci * C + co) * F::kKV + tap];
  }
  __syncthreads();

  constexpr int kTiles = (Cfg::kW + TW - 1) / TW, kHTiles = (Cfg::kH + TH - 1) / TH;
  constexpr long long kItems = static_cast<long long>(Cfg::kN) * Cfg::kD * kHTiles * kTiles;
  for (long long item = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
       item < kItems; item += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int tile = static_cast<int>(item % kTiles);
    long long rest = item / kTiles;
    const int oh = static_cast<int>(rest % kHTiles) * TH;  // the first of TH output rows
    rest /= kHTiles;
    const int od = static_cast<int>(rest % Cfg::kD);
    const int n = static_cast<int>(rest / Cfg::kD);
    const int ow0 = tile * TW;
    const int iw0 = ow0 * F::kStepW + F::kOffW + kMinTap;

    float acc[TH][C][TW];
#pragma unroll
    for (int r = 0; r < TH; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int t = 0; t < TW; ++t) acc[r][c][t] = 0.f;
    for (int ci = 0; ci < Cfg::kCin; ++ci) {
      for (int kd = 0; kd < Cfg::kKD; ++kd) {
        const int id = od * F::kStepD + F::kOffD + kd * F::kTapD;
        if (id < 0 || id >= Cfg::kDin) continue;
          // Unrolled where several rows make each row's kh a compile-time choice.
#pragma unroll(TH > 1 ? kRelMax - kRelMin + 1 : 1)
        for (int rel = kRelMin; rel <= kRelMax; ++rel) {
          const int ih = oh * F::kStepH + F::kOffH + rel;
          if (ih < 0 || ih >= Cfg::kHin) continue;
          const float* row =
              x + ((static_cast<size_t>(n) * Cfg::kCin + ci) * Cfg::kDin + id) * Cfg::kHin * Cfg::kWin +
              static_cast<size_t>(ih) * Cfg::kWin;
          float v[kSpan];
#pragma unroll
          for (int j = 0; j < kSpan; ++j) {
            const int iw = iw0 + j;
            v[j] = iw >= 0 && iw < Cfg::kWin ? row[iw] : 0.f;
          }
#pragma unroll
          for (int r = 0; r < TH; ++r) {  // output row oh + r reads this row at tap kh
            if ((rel - r) % F::kTapH != 0) continue;
            const int kh = (rel - r) / F::kTapH;
            if (kh < 0 || kh >= KH) continue;
            const float* wk = ws + ((ci * Cfg::kKD + kd) * KH + kh) * KW * C;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
#pragma unroll
              for (int c = 0; c < C; ++c) {
                const float wv = wk[kw * C + c];
#pragma unroll
                for (int t = 0; t < TW; ++t) {
                  acc[r][c][t] = fmaf(v[t * F::kStepW + kw * F::kTapW - kMinTap], wv, acc[r][c][t]);
                }
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < TH; ++r) {
      if (oh + r >= Cfg::kH) break;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float b = Cfg::kBias ? bias[c] : 0.f;
        float* out = y + ((static_cast<size_t>(n) * C + c) * Cfg::kD + od) * Cfg::kH * Cfg::kW +
                     static_cast<size_t>(oh + r) * Cfg::kW;
#pragma unroll
        for (int t = 0; t < TW; ++t) {
          if (ow0 + t < Cfg::kW) out[ow0 + t] = Cfg::pre(acc[r][c][t] + b);
        }
      }
    }
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): the kernel with the default configuration.
namespace fj_selftest {
struct FewOutSelfTune {
  static constexpr int kTW = 4, kTH = 2;
};
extern "C" __global__ void few_out(const float* x, const float* w, const float* b, float* y) {
  fj::few_out_kernel<fj::DefaultConfig, FewOutSelfTune>(x, w, b, y);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_DIRECT_FEW_OUT_CUH_
