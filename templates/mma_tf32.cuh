// templates/mma_tf32.cuh: the tensor-core primitives of the mma.sync kernels (sm_80 and later):
// rounding to TF32, the TF32 m16n8k8 product and the bf16/f16 m16n8k16 product. Used by
// tc_conv.cuh and wgrad.cuh.
#ifndef FUSEJIT_TEMPLATES_MMA_TF32_CUH_
#define FUSEJIT_TEMPLATES_MMA_TF32_CUH_

namespace fj {

// v rounded to TF32 (nearest, ties away), as the bits of a float.
__device__ __forceinline__ unsigned tc_tf32(float v) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return r;
}

// c += a * b (m16n8k8, TF32 operands, fp32 accumulators). Fragments: a[0..3] = A[g][t],
// A[g+8][t], A[g][t+4], A[g+8][t+4]; b[0..1] = B[t][g], B[t+4][g]; c[0..3] = C[g][2t],
// C[g][2t+1], C[g+8][2t], C[g+8][2t+1], with g = lane / 4, t = lane % 4.
__device__ __forceinline__ void tc_mma(float* c, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a * b (m16n8k16, bf16 (kF16 false) or f16 operands, fp32 accumulators). Each register
// holds two consecutive k of one row (A) or column (B): a[0..3] = A[g][2t..2t+1],
// A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]; b[0..1] = B[2t..2t+1][g], B[2t+8..][g]; c as
// tc_mma's. In bytes, the fragments of a 32-byte k-slice sit where tc_mma's do: one ldmatrix
// addressing serves both.
template <bool kF16>
__device__ __forceinline__ void tc_mma16(float* c, const unsigned* a, const unsigned* b) {
  if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_MMA_TF32_CUH_
