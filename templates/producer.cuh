// templates/producer.cuh: the chain's producer evaluated at one output point, by direct summation.
// This is the general, correct-first path used by the generic plans: any conv3d or
// conv_transpose3d (stride, padding, dilation, output_padding), or no producer (reads x).
// Fast plans use their own tiled producers instead.
#ifndef FUSEJIT_TEMPLATES_PRODUCER_CUH_
#define FUSEJIT_TEMPLATES_PRODUCER_CUH_

#include "default_config.cuh"

namespace fj {

// Value of the producer's output at (n, c, d, h, w) -- before any elementwise op.
// x: [kN,kCin,kDin,kHin,kWin]; weight: conv3d [kC,kCin,kKD,kKH,kKW], conv_transpose3d
// [kCin,kC,kKD,kKH,kKW]; bias: [kC] (read only when Cfg::kBias).
// T: the tensors' element type (float, or bf16_t / f16_t for the generic kernels' native
// low-precision chains); values are converted to float as they are loaded.
// The value is of the chain's arithmetic type AccT<Cfg> (float; double for f64 chains).
template <class Cfg, class T>
__device__ __forceinline__ AccT<Cfg> produce(const T* __restrict__ x, const T* __restrict__ weight,
                                             const T* __restrict__ bias, int n, int c, int d,
                                             int h, int w) {
  using A = AccT<Cfg>;
  if constexpr (Cfg::kProducer == kNoProducer) {
    return load_as<A>(x[(((long long)(n * Cfg::kC + c) * Cfg::kD + d) * Cfg::kH + h) * Cfg::kW + w]);
  } else {
    constexpr bool kTransposed = Cfg::kProducer == kConvTranspose3d;
    constexpr int kTaps = Cfg::kKD * Cfg::kKH * Cfg::kKW;
    A acc = 0;
    for (int ci = 0; ci < Cfg::kCin; ++ci) {
      const T* xc = x + (long long)(n * Cfg::kCin + ci) * Cfg::kDin * Cfg::kHin * Cfg::kWin;
      const T* wc = kTransposed ? weight + (ci * Cfg::kC + c) * kTaps
                                    : weight + (c * Cfg::kCin + ci) * kTaps;
#pragma unroll
      for (int kd = 0; kd < Cfg::kKD; ++kd) {
        int id;
        if constexpr (kTransposed) {
          // od = id*S - P + kd*Dil  =>  id = (od + P - kd*Dil) / S when divisible.
          const int t = d + Cfg::kPD - kd * Cfg::kDilD;
          if (t < 0 || t % Cfg::kSD != 0) continue;
          id = t / Cfg::kSD;
        } else {
          id = d * Cfg::kSD - Cfg::kPD + kd * Cfg::kDilD;
        }
        if (id < 0 || id >= Cfg::kDin) continue;
#pragma unroll
        for (int kh = 0; kh < Cfg::kKH; ++kh) {
          int ih;
          if constexpr (kTransposed) {
            const int t = h + Cfg::kPH - kh * Cfg::kDilH;
            if (t < 0 || t % Cfg::kSH != 0) continue;
            ih = t / Cfg::kSH;
          } else {
            ih = h * Cfg::kSH - Cfg::kPH + kh * Cfg::kDilH;
          }
          if (ih < 0 || ih >= Cfg::kHin) continue;
          const T* xrow = xc + (id * Cfg::kHin + ih) * Cfg::kWin;
          const T* wrow = wc + (kd * Cfg::kKH + kh) * Cfg::kKW;
#pragma unroll
          for (int kw = 0; kw < Cfg::kKW; ++kw) {
            int iw;
            if constexpr (kTransposed) {
              const int t = w + Cfg::kPW - kw * Cfg::kDilW;
              if (t < 0 || t % Cfg::kSW != 0) continue;
              iw = t / Cfg::kSW;
            } else {
              iw = w * Cfg::kSW - Cfg::kPW + kw * Cfg::kDilW;
            }
            if (iw < 0 || iw >= Cfg::kWin) continue;
            acc = fma_(load_as<A>(xrow[iw]), load_as<A>(wrow[kw]), acc);
          }
        }
      }
    }
    if constexpr (Cfg::kBias) acc += load_as<A>(bias[c]);
    return acc;
  }
}

// Coordinates of a flat NCDHW index of the producer's output.
struct Coord {
  int n, c, d, h, w;
};

template <class Cfg>
__device__ __forceinline__ Coord decompose(long long i) {
  Coord r;
  r.w = (int)(i % Cfg::kW);
  i /= Cfg::kW;
  r.h = (int)(i % Cfg::kH);
  i /= Cfg::kH;
  r.d = (int)(i % Cfg::kD);
  i /= Cfg::kD;
  r.c = (int)(i % Cfg::kC);
  r.n = (int)(i / Cfg::kC);
  return r;
}

template <class Cfg, class T>
__device__ __forceinline__ AccT<Cfg> produce_at(const T* __restrict__ x, const T* __restrict__ weight,
                                            const T* __restrict__ bias, long long i) {
  if constexpr (Cfg::kProducer == kNoProducer) return load_as<AccT<Cfg>>(x[i]);  // i indexes x
  const Coord p = decompose<Cfg>(i);
  return produce<Cfg>(x, weight, bias, p.n, p.c, p.d, p.h, p.w);
}

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_PRODUCER_CUH_
