// templates/cast.cuh: copies at the edges of composite plans.
//   cast_kernel: dtype conversion, the edges of a bf16/f16 chain run through its f32 plan
//     (runtime/dtype_adapter.h): the inputs and parameters are widened to f32 (exactly), the
//     outputs and gradients rounded to the chain's dtype once, at the end.
//   crop_kernel: the leading [kD][kH][kW] box of each of kRows [kSD][kSH][kSW] volumes (a data
//     gradient computed on a larger grid: runtime/backward.cc).
//
// Host-side contract: block = (kCastThreads); grid.x = any (grid-stride loop); `in` and `out`
// are 16-byte aligned and do not overlap; cast: kCount elements are converted; crop: every
// element of out is written, kD <= kSD, kH <= kSH, kW <= kSW.
#ifndef FUSEJIT_TEMPLATES_CAST_CUH_
#define FUSEJIT_TEMPLATES_CAST_CUH_

#include "dtype.cuh"

namespace fj {

constexpr int kCastThreads = 256;
constexpr int kCastVector = 8;  // elements per vector: 16 bytes of a 2-byte dtype
constexpr int kCastUnroll = 4;  // vectors per thread and step of the grid-stride loop

template <class Src, class Dst, long long kCount>
__device__ void cast_kernel(const Src* __restrict__ in, Dst* __restrict__ out) {
  struct alignas(sizeof(Src) * kCastVector) SrcVec { Src v[kCastVector]; };
  struct alignas(sizeof(Dst) * kCastVector) DstVec { Dst v[kCastVector]; };
  constexpr long long kVectors = kCount / kCastVector;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  // kCastUnroll vectors a thread and step, all loaded before the first is converted and stored
  // (several 16-byte loads in flight per thread: the pass is bound by memory latency otherwise).
  for (long long i = first; i < kVectors; i += stride * kCastUnroll) {
    SrcVec s[kCastUnroll];
#pragma unroll
    for (int u = 0; u < kCastUnroll; ++u) {
      if (i + u * stride < kVectors) s[u] = reinterpret_cast<const SrcVec*>(in)[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kCastUnroll; ++u) {
      if (i + u * stride < kVectors) {
        DstVec d;
#pragma unroll
        for (int j = 0; j < kCastVector; ++j) d.v[j] = from_f32<Dst>(to_f32(s[u].v[j]));
        reinterpret_cast<DstVec*>(out)[i + u * stride] = d;
      }
    }
  }
  for (long long i = kVectors * kCastVector + first; i < kCount; i += stride) {
    out[i] = from_f32<Dst>(to_f32(in[i]));
  }
}

template <class T, long long kRows, int kSD, int kSH, int kSW, int kD, int kH, int kW>
__device__ void crop_kernel(const T* __restrict__ in, T* __restrict__ out) {
  static_assert(kD <= kSD && kH <= kSH && kW <= kSW, "crop: the box must fit the source");
  constexpr long long kCount = kRows * kD * kH * kW;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < kCount; i += stride) {
    const int w = (int)(i % kW), h = (int)(i / kW % kH), d = (int)(i / ((long long)kW * kH) % kD);
    const long long r = i / ((long long)kW * kH * kD);
    out[i] = in[((r * kSD + d) * kSH + h) * kSW + w];
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): every conversion the adapter uses, with a count that has a tail.
namespace fj_selftest {
extern "C" __global__ void cast_bf16_f32(const fj::bf16_t* in, float* out) {
  fj::cast_kernel<fj::bf16_t, float, 1003>(in, out);
}
extern "C" __global__ void cast_f32_bf16(const float* in, fj::bf16_t* out) {
  fj::cast_kernel<float, fj::bf16_t, 1003>(in, out);
}
extern "C" __global__ void cast_f16_f32(const fj::f16_t* in, float* out) {
  fj::cast_kernel<fj::f16_t, float, 1003>(in, out);
}
extern "C" __global__ void cast_f32_f16(const float* in, fj::f16_t* out) {
  fj::cast_kernel<float, fj::f16_t, 1003>(in, out);
}
extern "C" __global__ void crop_f32(const float* in, float* out) {
  fj::crop_kernel<float, 6, 9, 8, 7, 8, 8, 5>(in, out);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_CAST_CUH_
