// Write-only micro-benchmark of W1's output store patterns (fourteenth session): does writing
// [N, 16, D, H, W] rows 63 wide, a warp per row of one h phase (convt_group_norm.cuh's units),
// cost more than the bytes? Standalone: nvcc -O3 -arch=sm_90 -o convt_store_micro convt_store_micro.cu
// Prints the median of 20 CUDA-event timings per pattern, L2 flushed before each. Results (H100,
// 2026-11-27) and what was tried in the kernels from them: w1_store_experiments_session14_2026-11-27.txt.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

constexpr int N = 128, C = 16;

// Pattern "units": warp unit u of a sample -> (od, rh, ub) as convt_unit_coords (ub fastest)
// or, kPhaseFastest, (od, ub, rh); lane q holds ow = 2q, 2q+1; per channel, two 32-float stores
// transposed through shuffles (ow = 32 e + lane), st.global.cs.
template <int D, int H, int W, bool kPhaseFastest, bool kStreaming>
__global__ void __launch_bounds__(256, 2) units(float* y) {
  constexpr int kUh = 32, kUnits = D * 2 * kUh, WPB = 8;
  constexpr size_t kPlane = (size_t)D * H * W;
  const int n = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* yn = y + (size_t)n * C * kPlane;
  for (int u = blockIdx.x * WPB + warp; u < kUnits; u += gridDim.x * WPB) {
    int od, rh, ub;
    if (kPhaseFastest) { rh = u % 2; ub = (u / 2) % kUh; od = u / (2 * kUh); }
    else { ub = u % kUh; rh = (u / kUh) % 2; od = u / (2 * kUh); }
    const int oh = 2 * ub + rh;
    if (oh >= H) continue;
    const float v0 = (float)(u * 2), v1 = (float)(u * 2 + 1);
#pragma unroll
    for (int co = 0; co < C; ++co) {
      float* row = yn + co * kPlane + ((size_t)od * H + oh) * W;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ow = 32 * e + lane, src = ow / 2, sel = ow % 2;
        const float a = __shfl_sync(0xffffffffu, v0 + co, src & 31);
        const float b = __shfl_sync(0xffffffffu, v1 + co, src & 31);
        const float out = sel ? b : a;
        if (ow < W) { if (kStreaming) __stcs(row + ow, out); else row[ow] = out; }
      }
    }
  }
}

// Pattern "pairs": a warp writes both h phases' rows 2p and 2p+1 of one (od), each channel's 126
// contiguous floats in four 32-float stores (what a unit of both phases would write).
template <int D, int H, int W>
__global__ void __launch_bounds__(256, 2) pairs(float* y) {
  constexpr int kPairs = (H + 1) / 2, kUnits = D * kPairs, WPB = 8;
  constexpr size_t kPlane = (size_t)D * H * W;
  const int n = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* yn = y + (size_t)n * C * kPlane;
  for (int u = blockIdx.x * WPB + warp; u < kUnits; u += gridDim.x * WPB) {
    const int p = u % kPairs, od = u / kPairs;
    const int len = (2 * p + 1 < H ? 2 : 1) * W;
#pragma unroll
    for (int co = 0; co < C; ++co) {
      float* span = yn + co * kPlane + ((size_t)od * H + 2 * p) * W;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 32 * e + lane;
        if (i < len) __stcs(span + i, (float)(u + co + i));
      }
    }
  }
}

// Pattern "spans": a warp writes kRows consecutive rows of one (od) per channel, contiguous, with
// stores aligned to 32-float lines (kAligned; the first and last masked) or from the span's start.
template <int D, int H, int W, int kRows, bool kAligned>
__global__ void __launch_bounds__(256, 2) spans(float* y) {
  constexpr int kGroups = (H + kRows - 1) / kRows, kUnits = D * kGroups, WPB = 8;
  constexpr size_t kPlane = (size_t)D * H * W;
  const int n = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* yn = y + (size_t)n * C * kPlane;
  for (int u = blockIdx.x * WPB + warp; u < kUnits; u += gridDim.x * WPB) {
    const int g = u % kGroups, od = u / kGroups;
    const int len = (g * kRows + kRows <= H ? kRows : H - g * kRows) * W;
    for (int co = 0; co < C; ++co) {
      float* span = yn + co * kPlane + ((size_t)od * H + g * kRows) * W;
      const int off = kAligned ? (int)((reinterpret_cast<size_t>(span) / 4) % 32) : 0;
      for (int e = 0; 32 * e - off < len; ++e) {
        const int i = 32 * e + lane - off;
        if (i >= 0 && i < len) __stcs(span + i, (float)(u + co + i));
      }
    }
  }
}

// The bytes alone: float4 stores over the whole tensor in order.
__global__ void linear(float4* y, size_t n4) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x)
    __stcs(y + i, make_float4(1.f, 2.f, 3.f, 4.f));
}

template <class F>
float time_it(F launch, char* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < 23; ++r) {
    cudaMemset(flush, r, flush_bytes);
    cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (r >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const size_t bytes = (size_t)N * C * 32 * 64 * 64 * 4;
  float* y; char* flush;
  if (cudaMalloc(&y, bytes) != cudaSuccess || cudaMalloc(&flush, 256 << 20) != cudaSuccess) return 1;
  const dim3 grid(4, N), block(256);
  printf("units 63 (W1)         %.4f ms\n", time_it([&] { units<31, 63, 63, false, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("units 64              %.4f ms\n", time_it([&] { units<32, 64, 64, false, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("units 63 phase-first  %.4f ms\n", time_it([&] { units<31, 63, 63, true, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("units 63 plain stores %.4f ms\n", time_it([&] { units<31, 63, 63, false, false><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("pairs 63              %.4f ms\n", time_it([&] { pairs<31, 63, 63><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("pairs 64              %.4f ms\n", time_it([&] { pairs<32, 64, 64><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 1 aligned        %.4f ms\n", time_it([&] { spans<31, 63, 63, 1, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 2 aligned        %.4f ms\n", time_it([&] { spans<31, 63, 63, 2, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 8 from start     %.4f ms\n", time_it([&] { spans<31, 63, 63, 8, false><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 8 aligned        %.4f ms\n", time_it([&] { spans<31, 63, 63, 8, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 63 aligned       %.4f ms\n", time_it([&] { spans<31, 63, 63, 63, true><<<grid, block>>>(y); }, flush, 256 << 20));
  printf("rows 63 from start    %.4f ms\n", time_it([&] { spans<31, 63, 63, 63, false><<<grid, block>>>(y); }, flush, 256 << 20));
  const size_t n63 = (size_t)N * C * 31 * 63 * 63 / 4;
  printf("linear (63's bytes)   %.4f ms\n", time_it([&] { linear<<<132 * 8, 256>>>((float4*)y, n63); }, flush, 256 << 20));
  printf("err: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
