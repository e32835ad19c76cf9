// templates/tune_compare.cuh: the autotuner's output check (tune/tuner.cc): how far a candidate
// configuration's output `a` is from the default configuration's output `b`, on the device, so
// that checking a candidate costs one pass over y instead of a copy to the host.
//
//   fj_tune_compare_<dtype> (f32, f64, bf16, f16: the chain's output dtype): grid = (any, 1, 1),
//     block = (kCompareThreads, 1, 1), no dynamic shared;
//     reads  a, b: n values of the dtype each (compared in double)
//     writes partials[3 * blockIdx.x + {0, 1, 2}] = sums over the block's elements (a grid-stride
//       loop) of (a - b)^2, b^2, and the number of non-finite a, in double, reduced in a fixed
//       order (the host adds the gridDim.x partials in order).
// Compiles on its own (no Cfg; includes dtype.cuh).
#ifndef FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_
#define FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_

#include "dtype.cuh"

namespace fj {

constexpr int kCompareThreads = 256;

__device__ __forceinline__ double to_f64(double v) { return v; }
template <class T>
__device__ __forceinline__ double to_f64(T v) {
  return (double)to_f32(v);
}

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// One block's sums over a grid-stride share of the n values.
template <class T>
__device__ __forceinline__ void tune_compare_body(const T* __restrict__ a, const T* __restrict__ b,
                                                  long long n, double* __restrict__ partials) {
  double d2 = 0.0, b2 = 0.0, bad = 0.0;
  for (long long i = blockIdx.x * (long long)kCompareThreads + threadIdx.x; i < n;
       i += (long long)gridDim.x * kCompareThreads) {
    const double x = to_f64(a[i]), y = to_f64(b[i]);
    if (!isfinite(x)) {
      bad += 1.0;
      continue;
    }
    const double d = x - y;
    d2 += d * d;
    b2 += y * y;
  }
  __shared__ double s[3][kCompareThreads / 32];
  d2 = warp_sum_double(d2);
  b2 = warp_sum_double(b2);
  bad = warp_sum_double(bad);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s[0][warp] = d2;
    s[1][warp] = b2;
    s[2][warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    double sum = 0.0;
    for (int w = 0; w < kCompareThreads / 32; ++w) sum += s[threadIdx.x][w];
    partials[3 * blockIdx.x + threadIdx.x] = sum;
  }
}

}  // namespace fj

#define FJ_TUNE_COMPARE(name, T)                                                               \
  extern "C" __global__ void __launch_bounds__(fj::kCompareThreads)                           \
      fj_tune_compare_##name(const T* __restrict__ a, const T* __restrict__ b, long long n,    \
                             double* __restrict__ partials) {                                 \
    fj::tune_compare_body<T>(a, b, n, partials);                                               \
  }
FJ_TUNE_COMPARE(f32, float)
FJ_TUNE_COMPARE(f64, double)
FJ_TUNE_COMPARE(bf16, fj::bf16_t)
FJ_TUNE_COMPARE(f16, fj::f16_t)
#undef FJ_TUNE_COMPARE

#endif  // FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_
