// templates/dtype.cuh: the storage types of fusejit's dtypes and their exact conversions to and
// from float (no cuda_fp16.h / cuda_bf16.h: bit operations and PTX cvt, so every NVRTC has them).
//
// Contract: to_f32 is exact for every dtype narrower than float; from_f32<T> rounds to nearest
// even, keeps NaN a NaN and infinities infinite, and overflows to infinity like PyTorch's
// conversions. f32 and f64 are the C++ types float and double.
#ifndef FUSEJIT_TEMPLATES_DTYPE_CUH_
#define FUSEJIT_TEMPLATES_DTYPE_CUH_

namespace fj {

struct bf16_t {  // bfloat16: the upper half of a float's bits
  unsigned short bits;
};
struct f16_t {  // IEEE binary16
  unsigned short bits;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(double v) { return (float)v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float((unsigned)v.bits << 16); }
__device__ __forceinline__ float to_f32(f16_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_f32<double>(float v) { return v; }
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // One instruction on sm_80+ (the same rounding; a NaN becomes the canonical quiet NaN).
  bf16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
  return h;
#else
  unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (overflows to infinity)
  return {(unsigned short)(u >> 16)};
#endif
}
template <>
__device__ __forceinline__ f16_t from_f32<f16_t>(float v) {
  f16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
  return h;
}

// A read-only load through the texture path (__ldg), as float.
__device__ __forceinline__ float ldg_f32(const float* p) { return __ldg(p); }
__device__ __forceinline__ float ldg_f32(const bf16_t* p) {
  return to_f32(bf16_t{__ldg(reinterpret_cast<const unsigned short*>(p))});
}
__device__ __forceinline__ float ldg_f32(const f16_t* p) {
  return to_f32(f16_t{__ldg(reinterpret_cast<const unsigned short*>(p))});
}

// is_same_v<A, B>: whether A and B are one type (no <type_traits> under NVRTC).
template <class A, class B>
struct IsSame {
  static constexpr bool value = false;
};
template <class A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};
template <class A, class B>
constexpr bool is_same_v = IsSame<A, B>::value;

// Select<B, A, C>: A when B, else C (std::conditional_t; no <type_traits> under NVRTC).
template <bool B, class A, class C>
struct SelectOf {
  using type = A;
};
template <class A, class C>
struct SelectOf<false, A, C> {
  using type = C;
};
template <bool B, class A, class C>
using Select = typename SelectOf<B, A, C>::type;

// ElemT<Cfg>: the element type of a chain's x, parameters and y -- Cfg::Elem when the generated
// Cfg declares one (bf16 and f16 chains run natively by the generic kernels), else float.
template <class...>
using void_t_ = void;
template <class C, class = void>
struct ElemOf {
  using type = float;
};
template <class C>
struct ElemOf<C, void_t_<typename C::Elem>> {
  using type = typename C::Elem;
};
template <class C>
using ElemT = typename ElemOf<C>::type;

// AccT<Cfg>: the arithmetic type of a chain's values: double for f64 chains, else float.
template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class C>
using AccT = typename AccOf<ElemT<C>>::type;

// A loaded element as the arithmetic type A, and an A value stored as element type T (rounded
// once, to nearest even).
template <class A, class T>
__device__ __forceinline__ A load_as(T v) {
  return to_f32(v);
}
template <>
__device__ __forceinline__ double load_as<double, double>(double v) {
  return v;
}
template <class T>
__device__ __forceinline__ T store_as(float v) {
  return from_f32<T>(v);
}
template <class T>
__device__ __forceinline__ T store_as(double v) {
  return v;
}
__device__ __forceinline__ float fma_(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_(double a, double b, double c) { return fma(a, b, c); }

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_DTYPE_CUH_
