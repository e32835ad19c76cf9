// templates/common.cuh: device helpers shared by every fusejit kernel template.
//
// Contract for templates: every kernel is `template <class Cfg> __global__ void ...`, reading all
// shape constants and the chain's elementwise ops from Cfg (see default_config.cuh for the fields).
// Generated sources define a Cfg struct, then #include the templates they use and instantiate the
// kernels with `extern "C"`-free explicit names via the FJ_KERNEL macro below.
// Arithmetic is IEEE fp32 (no fast-math): NVRTC's defaults (-prec-div, -prec-sqrt, no -ftz),
// except the few-ulp intrinsics named below in sigmoid, swish and hardswish.
#ifndef FUSEJIT_TEMPLATES_COMMON_CUH_
#define FUSEJIT_TEMPLATES_COMMON_CUH_

#include "dtype.cuh"

namespace fj {

// ---- elementwise ops (PyTorch semantics, fp32) -------------------------------------------------
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : 0.f; }
__device__ __forceinline__ float leaky_relu(float x, float slope) { return x > 0.f ? x : x * slope; }
// sigmoid, swish and hardswish are the hot ops of the fused chains (computed once or twice per
// output point): they use the hardware exp2 (as __expf: ~2 ulp plus |x| * 2^-24 from scaling x by
// log2 e; exp_neg_for_one_plus) and an approximate division (__fdividef: ~2 ulp; 0 once the divisor
// exceeds 2^126, where the exact result is below 1e-37), and hardswish multiplies by 1/6 instead of
// dividing. Each result stays within a few ulp of the correctly rounded one (the Gpu* tests hold
// them to 1e-6 relative L2 against float64), at about a third of the instructions of expf + IEEE
// division.
//
// exp_neg_for_one_plus(x) = e^-x for 1 + e^-x: the same bits as __expf(-x) (x * log2 e, then the
// hardware exp2) except that results below 2^-126 flush to 0 (ex2.approx.ftz), where 1 + e^-x is 1
// either way: two instructions where __expf(-x) takes five (its rescaling of subnormal results).
// W1: fj_bwd_few_in 1.242 -> 1.209 ms, forward 1.070 -> 1.053 ms (H100, 2026-11-27).
__device__ __forceinline__ float exp_neg_for_one_plus(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * -1.44269504088896341f));
  return r;
}
__device__ __forceinline__ float sigmoid(float x) {
  return __fdividef(1.f, 1.f + exp_neg_for_one_plus(x));
}
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ float swish(float x) {
  return __fdividef(x, 1.f + exp_neg_for_one_plus(x));
}
__device__ __forceinline__ float hardswish(float x) {
  return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
}
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ float clamp_min(float x, float lo) { return fmaxf(x, lo); }
__device__ __forceinline__ float clamp_max(float x, float hi) { return fminf(x, hi); }
// mish, softplus, elu (selu is elu with neg = alpha * scale, pos = scale), hardsigmoid: PyTorch's
// CUDA formulas with accurate expf / log1pf / tanhf / expm1f.
__device__ __forceinline__ float mish(float x) { return x * tanhf(log1pf(expf(x))); }
__device__ __forceinline__ float softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}
__device__ __forceinline__ float elu(float x, float neg, float pos) {
  return x > 0.f ? x * pos : expm1f(x) * neg;
}
__device__ __forceinline__ float hardsigmoid(float x) {
  return fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
}
// gelu_tanh, logsigmoid: PyTorch's CUDA formulas; softsign, tanhshrink: its composites; celu:
// elu's kernel with input scale inv = 1/alpha.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(inner));
}
__device__ __forceinline__ float logsigmoid(float x) {
  return fminf(x, 0.f) - log1pf(expf(-fabsf(x)));
}
__device__ __forceinline__ float softsign(float x) { return x / (1.f + fabsf(x)); }
__device__ __forceinline__ float tanhshrink(float x) { return x - tanhf(x); }
__device__ __forceinline__ float celu(float x, float alpha, float inv) {
  return x > 0.f ? x : expm1f(x * inv) * alpha;
}

// The same ops in double, for f64 chains (the generic kernels): accurate libm functions, PyTorch's
// double formulas.
__device__ __forceinline__ double relu(double x) { return x > 0.0 ? x : 0.0; }
__device__ __forceinline__ double leaky_relu(double x, double slope) { return x > 0.0 ? x : x * slope; }
__device__ __forceinline__ double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ double tanh_(double x) { return tanh(x); }
__device__ __forceinline__ double swish(double x) { return x / (1.0 + exp(-x)); }
__device__ __forceinline__ double hardswish(double x) { return x * fmin(fmax(x + 3.0, 0.0), 6.0) / 6.0; }
__device__ __forceinline__ double gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
__device__ __forceinline__ double clamp(double x, double lo, double hi) { return fmin(fmax(x, lo), hi); }
__device__ __forceinline__ double clamp_min(double x, double lo) { return fmax(x, lo); }
__device__ __forceinline__ double clamp_max(double x, double hi) { return fmin(x, hi); }
__device__ __forceinline__ double mish(double x) { return x * tanh(log1p(exp(x))); }
__device__ __forceinline__ double softplus(double x, double beta, double threshold) {
  return x * beta > threshold ? x : log1p(exp(x * beta)) / beta;
}
__device__ __forceinline__ double elu(double x, double neg, double pos) {
  return x > 0.0 ? x * pos : expm1(x) * neg;
}
__device__ __forceinline__ double hardsigmoid(double x) { return fmin(fmax(x + 3.0, 0.0), 6.0) / 6.0; }
__device__ __forceinline__ double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
__device__ __forceinline__ double logsigmoid(double x) { return fmin(x, 0.0) - log1p(exp(-fabs(x))); }
__device__ __forceinline__ double softsign(double x) { return x / (1.0 + fabs(x)); }
__device__ __forceinline__ double tanhshrink(double x) { return x - tanh(x); }
__device__ __forceinline__ double celu(double x, double alpha, double inv) {
  return x > 0.0 ? x : expm1(x * inv) * alpha;
}

// ---- their derivatives (the backward pass), PyTorch's values at the kinks -------------------
// relu'(0) = 0; leaky_relu'(0) = slope; clamp' = 1 on [lo, hi] bounds included, hardtanh' only
// on (lo, hi); hardswish' = 0
// at and below -3, x/3 + 1/2 on (-3, 3), 1 at and above 3 (PyTorch 2.11). sigmoid and swish use
// the forward's intrinsics (exp_neg_for_one_plus, __fdividef: a few ulp, far below the 1e-5
// gradient tolerance; the same 1 + e^-x as the forward's value, which the compiler then computes
// once; 1/inf = 0 at x < -88); the rest accurate expf/erff. The fused conv_transpose3d backward
// computes a point's gradient up to twice (tile halos), so these are on its critical path.
__device__ __forceinline__ float relu_d(float x) { return x > 0.f ? 1.f : 0.f; }
__device__ __forceinline__ float leaky_relu_d(float x, float slope) { return x > 0.f ? 1.f : slope; }
__device__ __forceinline__ float sigmoid_d(float x) {
  const float s = __fdividef(1.f, 1.f + exp_neg_for_one_plus(x));
  return s * (1.f - s);
}
__device__ __forceinline__ float tanh_d(float x) {
  const float t = tanhf(x);
  return 1.f - t * t;
}
__device__ __forceinline__ float swish_d(float x) {
  const float s = __fdividef(1.f, 1.f + exp_neg_for_one_plus(x));
  return s * (1.f + x * (1.f - s));
}
__device__ __forceinline__ float hardswish_d(float x) {
  return x <= -3.f ? 0.f : x < 3.f ? x * (1.f / 3.f) + 0.5f : 1.f;
}
__device__ __forceinline__ float gelu_d(float x) {
  return 0.5f * (1.f + erff(x * 0.70710678118654752f)) +
         x * expf(-0.5f * x * x) * 0.39894228040143268f;
}
__device__ __forceinline__ float clamp_d(float x, float lo, float hi) {
  return x >= lo && x <= hi ? 1.f : 0.f;
}
__device__ __forceinline__ float clamp_min_d(float x, float lo) { return x >= lo ? 1.f : 0.f; }
__device__ __forceinline__ float clamp_max_d(float x, float hi) { return x <= hi ? 1.f : 0.f; }
__device__ __forceinline__ float hardtanh_d(float x, float lo, float hi) {
  return x > lo && x < hi ? 1.f : 0.f;
}
__device__ __forceinline__ float mish_d(float x) {
  const float t = tanhf(log1pf(expf(x)));
  return t + x * (1.f / (1.f + expf(-x))) * (1.f - t * t);
}
__device__ __forceinline__ float softplus_d(float x, float beta, float threshold) {
  if (x * beta > threshold) return 1.f;
  const float z = expf(x * beta);
  return z / (z + 1.f);
}
// elu'(0) = neg (PyTorch: x <= 0 takes neg * e^x); selu passes neg = alpha * scale, pos = scale.
__device__ __forceinline__ float elu_d(float x, float neg, float pos) {
  return x > 0.f ? pos : neg * expf(x);
}
__device__ __forceinline__ float hardsigmoid_d(float x) {
  return x > -3.f && x < 3.f ? 1.f / 6.f : 0.f;
}
__device__ __forceinline__ float gelu_tanh_d(float x) {
  const float x2 = x * x;
  const float t = tanhf(0.7978845608028654f * (x + 0.044715f * x2 * x));
  return 0.5f * (1.f + t) +
         0.5f * x * (1.f - t * t) * 0.7978845608028654f * (1.f + 3.f * 0.044715f * x2);
}
// logsigmoid'(x) = sigmoid(-x), as PyTorch's backward computes it (z = e^-|x|).
__device__ __forceinline__ float logsigmoid_d(float x) {
  const float z = expf(-fabsf(x));
  return x < 0.f ? 1.f - z / (1.f + z) : z / (1.f + z);
}
__device__ __forceinline__ float softsign_d(float x) {
  const float d = 1.f + fabsf(x);
  return 1.f / (d * d);
}
__device__ __forceinline__ float tanhshrink_d(float x) {
  const float t = tanhf(x);
  return t * t;
}
// celu'(x) = e^(x/alpha) where x <= 0 (1 at 0), 1 above.
__device__ __forceinline__ float celu_d(float x, float inv) { return x > 0.f ? 1.f : expf(x * inv); }

// ---- programmatic dependent launch ----------------------------------------------------------
// The first statement of every generated kernel (codegen/emit.cc's wrappers). The runtime
// launches generated kernels on sm_90+ with programmatic stream serialization
// (jit::LaunchOptions), so a kernel's CTAs may be scheduled before the previous kernel of the
// stream has finished: griddepcontrol.wait blocks until that kernel has completed and its memory
// is visible (and, as every kernel waits here first, every kernel before it), so nothing after it
// reads or writes early. launch_dependents then lets the stream's next kernel be scheduled onto
// the SMs this grid frees, once all of its CTAs have started. Both are no-ops for a kernel
// launched without the attribute, and compiled out below sm_90.
__device__ __forceinline__ void grid_dependency_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- statistics: Welford/Chan, merged in a fixed order (deterministic) ----------------------
struct Moments {
  float count;
  float mean;
  float m2;  // sum of squared deviations from mean
};

__device__ __forceinline__ Moments moments_empty() { return {0.f, 0.f, 0.f}; }

__device__ __forceinline__ void moments_add(Moments& m, float x) {
  m.count += 1.f;
  float delta = x - m.mean;
  m.mean += delta / m.count;
  m.m2 += delta * (x - m.mean);
}

// Chan et al. merge of b into a. Deterministic for a fixed merge order.
__device__ __forceinline__ Moments moments_merge(Moments a, Moments b) {
  float n = a.count + b.count;
  if (n == 0.f) return a;
  float delta = b.mean - a.mean;
  float wb = b.count / n;
  Moments r;
  r.count = n;
  r.mean = a.mean + delta * wb;
  r.m2 = a.m2 + b.m2 + delta * delta * a.count * wb;
  return r;
}

__device__ __forceinline__ Moments shfl_down(Moments m, int offset) {
  Moments r;
  r.count = __shfl_down_sync(0xffffffffu, m.count, offset);
  r.mean = __shfl_down_sync(0xffffffffu, m.mean, offset);
  r.m2 = __shfl_down_sync(0xffffffffu, m.m2, offset);
  return r;
}

// Reduces one Moments per thread to thread 0 of the block, in a fixed tree order.
// REQUIRES: blockDim.x is a multiple of 32 and <= 1024; all threads of the block call it;
// `scratch` holds at least 32 Moments.
__device__ __forceinline__ Moments block_reduce_moments(Moments m, Moments* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) m = moments_merge(m, shfl_down(m, off));
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  m = lane < warps ? scratch[lane] : moments_empty();
  if (warp == 0) {
    for (int off = 16; off > 0; off >>= 1) m = moments_merge(m, shfl_down(m, off));
  }
  __syncthreads();  // scratch may be reused by the caller
  return m;
}

// Moments in double (f64 chains' statistics; the per-channel partials of direct_conv_moments.cuh),
// with the same fixed-order merges.
struct MomentsD {
  double count;
  double mean;
  double m2;  // sum of squared deviations from mean
};
__device__ __forceinline__ void moments_add(MomentsD& m, double x) {
  m.count += 1.0;
  double delta = x - m.mean;
  m.mean += delta / m.count;
  m.m2 += delta * (x - m.mean);
}
__device__ __forceinline__ MomentsD moments_merge(MomentsD a, MomentsD b) {
  double n = a.count + b.count;
  if (n == 0.0) return a;
  double delta = b.mean - a.mean;
  double wb = b.count / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.count * wb};
}
__device__ __forceinline__ MomentsD shfl_down(MomentsD m, int offset) {
  return {__shfl_down_sync(0xffffffffu, m.count, offset),
          __shfl_down_sync(0xffffffffu, m.mean, offset),
          __shfl_down_sync(0xffffffffu, m.m2, offset)};
}
__device__ __forceinline__ MomentsD block_reduce_moments(MomentsD m, MomentsD* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) m = moments_merge(m, shfl_down(m, off));
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  m = lane < warps ? scratch[lane] : MomentsD{0.0, 0.0, 0.0};
  if (warp == 0) {
    for (int off = 16; off > 0; off >>= 1) m = moments_merge(m, shfl_down(m, off));
  }
  __syncthreads();
  return m;
}

// Sum of one value per thread to thread 0 of the block, fixed order. Same REQUIRES as above.
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : T(0);
  if (warp == 0) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  __syncthreads();
  return v;
}

// Max of one value per thread (no NaN among them) to every thread of the block; max is exact and
// order-free. Same REQUIRES as above.
template <typename T>
__device__ __forceinline__ T block_reduce_max(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const T o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = scratch[0];
  for (int i = 1; i < warps; ++i) v = scratch[i] > v ? scratch[i] : v;
  __syncthreads();
  return v;
}

// Tune::kURowsByChannel where the tune struct has one, else false: whether a saved u is laid out
// [N, D, H, C, W] (the rows of every channel at one (d, h) side by side) instead of [N, C, D, H,
// W]. codegen::SaveProducerOutput adds the constant to the plans that store u so, and the backward
// plan to the kernel reading it (codegen::ULayout).
template <class Tune, class = void>
struct URowsByChannel {
  static constexpr bool value = false;
};
template <class Tune>
struct URowsByChannel<Tune, decltype(void(Tune::kURowsByChannel))> {
  static constexpr bool value = Tune::kURowsByChannel;
};

// The warp's sums of v[0..31] over its lanes, lane l getting the sum of v[l] (31 shuffles: each
// step keeps the half of the values whose index bit matches the lane's and adds the partner's).
template <int kHalf>
__device__ __forceinline__ void warp_reduce_scatter_step(float (&v)[32]) {
  const bool upper = (threadIdx.x & kHalf) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float keep = upper ? v[kHalf + j] : v[j];
    const float send = upper ? v[j] : v[kHalf + j];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kHalf);
  }
}
__device__ __forceinline__ float warp_reduce_scatter32(float (&v)[32]) {
  warp_reduce_scatter_step<16>(v);
  warp_reduce_scatter_step<8>(v);
  warp_reduce_scatter_step<4>(v);
  warp_reduce_scatter_step<2>(v);
  warp_reduce_scatter_step<1>(v);
  return v[0];
}

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_COMMON_CUH_
