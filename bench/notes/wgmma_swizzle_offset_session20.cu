// Microtest: wgmma m64n64k16 f16, A and B MN-major SW128; B starts `sh` 128-byte rows into a
// swizzle atom. Variant bo: descriptor base_offset field 0 or (addr>>7)&7.
#include <cstdio>
#include <cuda_fp16.h>
__device__ unsigned long long desc(unsigned saddr, unsigned lbo, unsigned bo) {
  unsigned long long d = (unsigned long long)((saddr >> 4) & 0x3FFFu);
  d |= (unsigned long long)((lbo >> 4) & 0x3FFFu) << 16;
  d |= (unsigned long long)(1024 >> 4) << 32;
  d |= (unsigned long long)(bo & 7) << 49;
  d |= 1ull << 62;
  return d;
}
__global__ void k(const float* A, const float* B, float* D, int sh, int bomode) {
  // A: [16 k][64 m], B: [32 rows][64 n]
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned base;
  base = (unsigned)__cvta_generic_to_shared(raw);
  base = (base + 1023) & ~1023u;
  unsigned char* p = raw + (base - (unsigned)__cvta_generic_to_shared(raw));
  unsigned char* pa = p;          // 2 atoms (16 rows)
  unsigned char* pb = p + 4096;   // 4 atoms (32 rows)
  for (int i = threadIdx.x; i < 16 * 64; i += 128) {
    int kk = i / 64, m = i % 64;
    __half* h = (__half*)(pa + kk * 128 + (((m / 8) ^ (kk % 8)) << 4)) + m % 8;
    *h = __float2half(A[i]);
  }
  for (int i = threadIdx.x; i < 32 * 64; i += 128) {
    int r = i / 64, n = i % 64;
    __half* h = (__half*)(pb + r * 128 + (((n / 8) ^ (r % 8)) << 4)) + n % 8;
    *h = __float2half(B[i]);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0;
  unsigned sa = base, sb = base + 4096 + sh * 128;
  unsigned long long da = desc(sa, 2048, 0);
  unsigned long long db = desc(sb, 4096, bomode ? (sb >> 7) & 7 : 0);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(0)
      : "memory");
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) {
      int m = 16 * warp + lane / 4 + (e >= 2 ? 8 : 0), n = 8 * j + 2 * (lane % 4) + (e & 1);
      D[m * 64 + n] = d[j * 4 + e];
    }
}
int main() {
  float hA[16 * 64], hB[32 * 64], hD[64 * 64];
  for (int i = 0; i < 16 * 64; ++i) hA[i] = (i * 7 % 13) - 6;
  for (int i = 0; i < 32 * 64; ++i) hB[i] = (i * 5 % 11) - 5;
  float *A, *B, *D;
  cudaMalloc(&A, sizeof hA); cudaMalloc(&B, sizeof hB); cudaMalloc(&D, sizeof hD);
  cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice);
  cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 20000);
  for (int bo = 0; bo < 2; ++bo)
    for (int sh = 0; sh < 8; ++sh) {
      k<<<1, 128, 20000>>>(A, B, D, sh, bo);
      cudaError_t e = cudaMemcpy(hD, D, sizeof hD, cudaMemcpyDeviceToHost);
      if (e) { printf("err %s\n", cudaGetErrorString(e)); return 1; }
      int bad = 0;
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 64; ++n) {
          float r = 0;
          for (int kk = 0; kk < 16; ++kk) r += hA[kk * 64 + m] * hB[(kk + sh) * 64 + n];
          bad += r != hD[m * 64 + n];
        }
      printf("base_offset_mode=%d shift=%d mismatches=%d\n", bo, sh, bad);
    }
}
