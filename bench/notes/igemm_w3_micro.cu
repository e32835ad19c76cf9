// bench/explore_w3/micro.cu: ceilings that decide the W3 kernel design on the lent GPU.
//   1. mma.sync m16n8k16 f16->f32 and m16n8k8 tf32 throughput (registers only).
//   2. L2 -> SM bandwidth with cp.async 16 B into a shared-memory ring (the GEMM's load path),
//      for an L2-resident buffer read by every SM.
// Build: nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -o bench/explore_w3/bin/micro micro.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 2;                                                                            \
    }                                                                                      \
  } while (0)

template <int kAcc>
__global__ void mma_f16_loop(float* out, int iters) {
  float d[kAcc][4] = {};
  unsigned a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  unsigned b[2] = {threadIdx.x * 11u, threadIdx.x * 13u};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kAcc; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < kAcc; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == 1234.5f) out[0] = s;
}

template <int kAcc>
__global__ void mma_tf32_loop(float* out, int iters) {
  float d[kAcc][4] = {};
  unsigned a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  unsigned b[2] = {threadIdx.x * 11u, threadIdx.x * 13u};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kAcc; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < kAcc; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == 1234.5f) out[0] = s;
}

// Each block streams `bytes` from src (wrapping over `span` bytes, offset by block) through a
// 4-stage ring of 16 KB stages with cp.async.cg 16 B, like the GEMM's B loads.
__global__ void __launch_bounds__(256) l2_stream(const unsigned char* src, size_t span,
                                                 size_t bytes, float* out) {
  extern __shared__ __align__(128) unsigned char sm[];
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(sm));
  constexpr int kStage = 16384, kStages = 4;
  const size_t nst = bytes / kStage;
  size_t off = (size_t)blockIdx.x * 65536 % span;
  for (size_t s = 0; s < nst + kStages - 1; ++s) {
    if (s < nst) {
      const unsigned dst = base + (s % kStages) * kStage;
      for (int i = threadIdx.x; i < kStage / 16; i += 256) {
        const unsigned char* p = src + (off + (size_t)i * 16) % span;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + i * 16), "l"(p));
      }
      off = (off + kStage) % span;
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 3;\n" ::);
    __syncthreads();
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  if (threadIdx.x == 0 && sm[5] == 77 && sm[9000] == 13) out[0] = 1.f;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  float* out;
  CK(cudaMalloc(&out, 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_it = [&](auto launch) {
    launch();
    cudaDeviceSynchronize();
    std::vector<float> t;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return (double)t[2];
  };
  const int iters = 20000;
  for (int warps : {4, 8, 16}) {
    const int blocks = sms;
    double ms = time_it([&] { mma_f16_loop<8><<<blocks, warps * 32>>>(out, iters); });
    double flop = 2.0 * 16 * 8 * 16 * 8 * (double)iters * warps * blocks;
    double ms2 = time_it([&] { mma_tf32_loop<8><<<blocks, warps * 32>>>(out, iters); });
    double flop2 = 2.0 * 16 * 8 * 8 * 8 * (double)iters * warps * blocks;
    printf("mma.sync %2d warps/SM: f16 m16n8k16 %.1f TFLOP/s, tf32 m16n8k8 %.1f TFLOP/s\n", warps,
           flop / ms / 1e9, flop2 / ms2 / 1e9);
  }
  CK(cudaGetLastError());
  CK(cudaFuncSetAttribute(l2_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
  unsigned char* buf;
  const size_t big = 256ull << 20;
  CK(cudaMalloc(&buf, big));
  CK(cudaMemset(buf, 1, big));
  for (size_t span : {(size_t)1 << 20, (size_t)8 << 20, (size_t)32 << 20, big}) {
    const size_t per_block = 64ull << 20;
    for (int bps : {1, 2}) {
      const int blocks = sms * bps;
      double ms = time_it(
          [&] { l2_stream<<<blocks, 256, 65536>>>(buf, span, per_block / bps, out); });
      printf("cp.async stream: span %4zu MB, %d block(s)/SM: %.2f TB/s\n", span >> 20, bps,
             (double)per_block * sms / ms / 1e9);
    }
  }
  CK(cudaGetLastError());
  return 0;
}
