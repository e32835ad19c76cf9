// templates/tune_compare.cuh: the autotuner's output check (tune/tuner.cc): how far a candidate
// configuration's output `a` is from the default configuration's output `b`, on the device, so
// that checking a candidate costs one pass over y instead of a copy to the host.
//
//   fj_tune_compare: grid = (any, 1, 1), block = (kCompareThreads, 1, 1), no dynamic shared;
//     reads  a, b: n floats each
//     writes partials[3 * blockIdx.x + {0, 1, 2}] = sums over the block's elements (a grid-stride
//       loop) of (a - b)^2, b^2, and the number of non-finite a, in double, reduced in a fixed
//       order (the host adds the gridDim.x partials in order).
// Compiles on its own (no Cfg).
#ifndef FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_
#define FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_

namespace fj {

constexpr int kCompareThreads = 256;

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace fj

extern "C" __global__ void __launch_bounds__(fj::kCompareThreads)
    fj_tune_compare(const float* __restrict__ a, const float* __restrict__ b, long long n,
                    double* __restrict__ partials) {
  double d2 = 0.0, b2 = 0.0, bad = 0.0;
  for (long long i = blockIdx.x * (long long)fj::kCompareThreads + threadIdx.x; i < n;
       i += (long long)gridDim.x * fj::kCompareThreads) {
    const float x = a[i], y = b[i];
    if (!isfinite(x)) {
      bad += 1.0;
      continue;
    }
    const double d = (double)x - (double)y;
    d2 += d * d;
    b2 += (double)y * (double)y;
  }
  __shared__ double s[3][fj::kCompareThreads / 32];
  d2 = fj::warp_sum_double(d2);
  b2 = fj::warp_sum_double(b2);
  bad = fj::warp_sum_double(bad);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s[0][warp] = d2;
    s[1][warp] = b2;
    s[2][warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    double sum = 0.0;
    for (int w = 0; w < fj::kCompareThreads / 32; ++w) sum += s[threadIdx.x][w];
    partials[3 * blockIdx.x + threadIdx.x] = sum;
  }
}

#endif  // FUSEJIT_TEMPLATES_TUNE_COMPARE_CUH_
