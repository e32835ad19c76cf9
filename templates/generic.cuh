// templates/generic.cuh: the generic kernels, correct for every chain fusejit accepts. Each thread
// evaluates the producer at one point (producer.cuh) and applies the chain's ops; reductions are
// split into kChunks blocks per segment whose partials are merged in a fixed order, so every run
// gives bitwise identical results. Plans (codegen/planner.cc) combine them:
//
//   elementwise        no group_norm, no mean   elementwise_kernel
//   reduce-mean        no group_norm, mean      mean_partial_kernel<false>, mean_finalize_kernel
//   store-normalize    group_norm, no mean      stats_kernel<true>, stats_finalize_kernel,
//                                               normalize_kernel<true>
//   recompute-normalize                         stats_kernel<false>, stats_finalize_kernel,
//                                               normalize_kernel<false>
//   recompute-mean     group_norm and mean      stats_kernel<false>, stats_finalize_kernel,
//                                               mean_partial_kernel<true>, mean_finalize_kernel
//
// Host-side contract (every kernel: block = (GenericTune::kBlock), a multiple of 32, the same for
// every kernel of a plan; no dynamic shared memory; x and y 16-byte aligned, as bindings check):
//   elementwise_kernel, normalize_kernel: grid.x = any (grid-stride loop over kN*kC*kD*kH*kW)
// kChunks (a template parameter of the reduction kernels) is the number of blocks per segment.
//   stats_kernel:         grid = (kN*kGroups, kChunks); partials: Moments[kN*kGroups*kChunks]
//   stats_finalize_kernel: grid.x*block >= kN*kGroups; stats: float2[kN*kGroups] = (mean, rstd)
//   mean_partial_kernel:  grid = (kN*kC, kChunks); partials: double[kN*kC*kChunks]
//   mean_finalize_kernel: grid.x*block >= number of outputs (kN*kC or kN)
#ifndef FUSEJIT_TEMPLATES_GENERIC_CUH_
#define FUSEJIT_TEMPLATES_GENERIC_CUH_

#include "default_config.cuh"
#include "producer.cuh"

namespace fj {

// The reductions' types for an arithmetic type: (count, mean, M2) partials and (mean, rstd).
template <class A>
struct StatsOf {
  using moments = Moments;
  using stats = float2;
};
template <>
struct StatsOf<double> {
  using moments = MomentsD;
  using stats = double2;
};

template <class Cfg>
struct Generic {
  static constexpr long long kSpatial = (long long)Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr long long kTotal = (long long)Cfg::kN * Cfg::kC * kSpatial;
  static constexpr int kGroupsOr1 = Cfg::kGroups > 0 ? Cfg::kGroups : 1;
  static constexpr int kCg = Cfg::kC / kGroupsOr1;  // channels per group
  // Range [begin, end) of chunk `chunk` of `chunks` of a segment of `length` elements.
  __device__ static void chunk_range(long long length, int chunk, int chunks, long long* begin,
                                     long long* end) {
    const long long per = (length + chunks - 1) / chunks;
    *begin = per * chunk;
    *end = *begin + per < length ? *begin + per : length;
  }
  using A = AccT<Cfg>;  // arithmetic: float, double for f64 chains
  using Mom = typename StatsOf<A>::moments;
  using Stat = typename StatsOf<A>::stats;
  // group_norm applied to a pre-norm value v of channel c of sample n.
  template <class T, class S>
  __device__ static A normalize(A v, int n, int c, const T* __restrict__ gamma,
                                const T* __restrict__ beta, const S* __restrict__ stats) {
    const S s = stats[n * kGroupsOr1 + c / kCg];
    return (v - s.x) * s.y * load_as<A>(gamma[c]) + load_as<A>(beta[c]);
  }
};

// Values evaluated ahead per thread by the generic loops: 4 without a producer (each value is a
// load: four in flight instead of one, measured 0.6 TB/s with one on a mean over 118 MB), 1 with
// a convolution (each value is a long summation already).
template <class Cfg>
inline constexpr int kAhead = Cfg::kProducer == kNoProducer ? 4 : 1;

// Calls use(i, load(i)) for i = first, first + stride, ... below end, in that order (so sums
// taken in `use` are in the order of a plain loop: the same bits), with the loads of kU
// consecutive i issued before their uses.
template <int kU, class Load, class Use>
__device__ __forceinline__ void strided_ahead(long long first, long long end, long long stride,
                                              Load load, Use use) {
  long long i = first;
  for (; i + (kU - 1) * stride < end; i += kU * stride) {
    decltype(load(i)) v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u] = load(i + u * stride);
#pragma unroll
    for (int u = 0; u < kU; ++u) use(i + u * stride, v[u]);
  }
  for (; i < end; i += stride) use(i, load(i));
}

// y = post(pre(producer(x))) for every element. Chains without group_norm and mean.
// Every kernel's x, weight, bias, gamma, beta and y are of the chain's element type ElemT<Cfg>
// (float, or bf16_t / f16_t): converted to float when loaded, rounded once when y is stored.
//
// Without a producer each thread moves 16-byte vectors (4 floats, 8 bf16/f16, 2 doubles; the
// same ops on each element: the same bits as one at a time); one element a thread reached
// 3.2 TB/s on a lone clamp over 155 MB where PyTorch's vectorized kernel reaches 4.0 (H200,
// session 30).
template <class Cfg>
__device__ void elementwise_vectors(const ElemT<Cfg>* __restrict__ x, ElemT<Cfg>* __restrict__ y) {
  using T = ElemT<Cfg>;
  constexpr int kV = 16 / sizeof(T);
  struct alignas(16) Vec { T v[kV]; };
  constexpr long long kVectors = Generic<Cfg>::kTotal / kV;
  const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const auto op = [](T v) { return store_as<T>(Cfg::post(Cfg::pre(load_as<AccT<Cfg>>(v)))); };
  strided_ahead<4>(
      first, kVectors, stride, [&](long long i) { return reinterpret_cast<const Vec*>(x)[i]; },
      [&](long long i, const Vec& in) {
        Vec out;
#pragma unroll
        for (int j = 0; j < kV; ++j) out.v[j] = op(in.v[j]);
        reinterpret_cast<Vec*>(y)[i] = out;
      });
  for (long long i = kVectors * kV + first; i < Generic<Cfg>::kTotal; i += stride) y[i] = op(x[i]);
}

template <class Cfg>
__device__ void elementwise_kernel(const ElemT<Cfg>* __restrict__ x,
                                   const ElemT<Cfg>* __restrict__ weight,
                                   const ElemT<Cfg>* __restrict__ bias, ElemT<Cfg>* __restrict__ y) {
  if constexpr (Cfg::kProducer == kNoProducer) {
    elementwise_vectors<Cfg>(x, y);
  } else {
    strided_ahead<kAhead<Cfg>>(
        blockIdx.x * (long long)blockDim.x + threadIdx.x, Generic<Cfg>::kTotal,
        (long long)gridDim.x * blockDim.x,
        [&](long long i) { return Cfg::pre(produce_at<Cfg>(x, weight, bias, i)); },
        [&](long long i, AccT<Cfg> v) { y[i] = store_as<ElemT<Cfg>>(Cfg::post(v)); });
  }
}

// Per-block moments of the pre-norm values of chunk blockIdx.y of group segment blockIdx.x
// (sample n = x / kGroups, group g = x % kGroups). With kStore, also writes the pre-norm values
// to y (in place of the output), for normalize_kernel<true>.
template <class Cfg, bool kStore, int kChunks>
__device__ void stats_kernel(const ElemT<Cfg>* __restrict__ x, const ElemT<Cfg>* __restrict__ weight,
                             const ElemT<Cfg>* __restrict__ bias, ElemT<Cfg>* __restrict__ y,
                             typename Generic<Cfg>::Mom* __restrict__ partials) {
  static_assert(!kStore || sizeof(ElemT<Cfg>) == 4, "stats_kernel: storing pre-norm values needs f32 y");
  using G = Generic<Cfg>;
  __shared__ typename G::Mom scratch[32];
  const long long seg_len = G::kCg * G::kSpatial;
  const long long seg_start = (long long)blockIdx.x * seg_len;  // groups are contiguous in NCDHW
  long long begin, end;
  G::chunk_range(seg_len, blockIdx.y, kChunks, &begin, &end);
  typename G::Mom m = {0, 0, 0};
  strided_ahead<kAhead<Cfg>>(
      begin + threadIdx.x, end, blockDim.x,
      [&](long long i) { return Cfg::pre(produce_at<Cfg>(x, weight, bias, seg_start + i)); },
      [&](long long i, typename G::A v) {
        if constexpr (kStore) y[seg_start + i] = v;
        moments_add(m, v);
      });
  m = block_reduce_moments(m, scratch);
  if (threadIdx.x == 0) partials[(long long)blockIdx.x * kChunks + blockIdx.y] = m;
}

// Merges the kChunks partials of each (sample, group) in chunk order into (mean, rstd).
template <class Cfg, int kChunks>
__device__ void stats_finalize_kernel(const typename Generic<Cfg>::Mom* __restrict__ partials,
                                      typename Generic<Cfg>::Stat* __restrict__ stats) {
  const int seg = blockIdx.x * blockDim.x + threadIdx.x;
  if (seg >= Cfg::kN * Generic<Cfg>::kGroupsOr1) return;
  typename Generic<Cfg>::Mom m = {0, 0, 0};
  for (int j = 0; j < kChunks; ++j) m = moments_merge(m, partials[seg * kChunks + j]);
  if constexpr (sizeof(typename Generic<Cfg>::A) == 8) {  // f64 chains
    const double var = m.count > 0.0 ? m.m2 / m.count : 0.0;
    stats[seg] = make_double2(m.mean, 1.0 / sqrt(var + Cfg::kEps));
  } else {
    const float var = m.count > 0.f ? m.m2 / m.count : 0.f;  // biased, as PyTorch's GroupNorm
    stats[seg] = make_float2(m.mean, 1.f / sqrtf(var + Cfg::kEps));
  }
}

// y = post(group_norm(v)) where v is the stored pre-norm value (kFromStore) or recomputed.
template <class Cfg, bool kFromStore>
__device__ void normalize_kernel(const ElemT<Cfg>* __restrict__ x,
                                 const ElemT<Cfg>* __restrict__ weight,
                                 const ElemT<Cfg>* __restrict__ bias,
                                 const ElemT<Cfg>* __restrict__ gamma,
                                 const ElemT<Cfg>* __restrict__ beta,
                                 const typename Generic<Cfg>::Stat* __restrict__ stats,
                                 ElemT<Cfg>* __restrict__ y) {
  static_assert(!kFromStore || sizeof(ElemT<Cfg>) == 4, "normalize_kernel: the stored pre-norm values are f32");
  using G = Generic<Cfg>;
  constexpr int kU = kFromStore ? 4 : kAhead<Cfg>;  // a stored value is a load
  strided_ahead<kU>(
      blockIdx.x * (long long)blockDim.x + threadIdx.x, G::kTotal,
      (long long)gridDim.x * blockDim.x,
      [&](long long i) -> typename G::A {
        if constexpr (kFromStore) return load_as<typename G::A>(y[i]);
        return Cfg::pre(produce_at<Cfg>(x, weight, bias, i));
      },
      [&](long long i, typename G::A v) {
        const int c = (int)((i / G::kSpatial) % Cfg::kC);
        const int n = (int)(i / (G::kSpatial * Cfg::kC));
        y[i] = store_as<ElemT<Cfg>>(Cfg::post(G::normalize(v, n, c, gamma, beta, stats)));
      });
}

// Per-block sums of the chain's final values over chunk blockIdx.y of plane blockIdx.x
// (n = x / kC, c = x % kC). kNorm: the chain has a group_norm (stats from stats_finalize_kernel).
// Sums are accumulated in double: a mean of group_norm outputs nearly cancels within each group,
// so fp32 sums would lose most of the result's digits.
template <class Cfg, bool kNorm, int kChunks>
__device__ void mean_partial_kernel(const ElemT<Cfg>* __restrict__ x,
                                    const ElemT<Cfg>* __restrict__ weight,
                                    const ElemT<Cfg>* __restrict__ bias,
                                    const ElemT<Cfg>* __restrict__ gamma,
                                    const ElemT<Cfg>* __restrict__ beta,
                                    const typename Generic<Cfg>::Stat* __restrict__ stats,
                                    double* __restrict__ partials) {
  __shared__ double scratch[32];
  using G = Generic<Cfg>;
  const int n = blockIdx.x / Cfg::kC, c = blockIdx.x % Cfg::kC;
  const long long plane = (long long)blockIdx.x * G::kSpatial;
  long long begin, end;
  G::chunk_range(G::kSpatial, blockIdx.y, kChunks, &begin, &end);
  double sum = 0;
  strided_ahead<kAhead<Cfg>>(
      begin + threadIdx.x, end, blockDim.x,
      [&](long long i) { return Cfg::pre(produce_at<Cfg>(x, weight, bias, plane + i)); },
      [&](long long, typename G::A v) {
        if constexpr (kNorm) v = G::normalize(v, n, c, gamma, beta, stats);
        sum += Cfg::post(v);
      });
  sum = block_reduce_sum(sum, scratch);
  if (threadIdx.x == 0) partials[(long long)blockIdx.x * kChunks + blockIdx.y] = sum;
}

// Sums partials in a fixed order (in double) and divides: y[n,c] (kMeanSpatial) or y[n] (kMeanAll).
template <class Cfg, int kChunks>
__device__ void mean_finalize_kernel(const double* __restrict__ partials,
                                     ElemT<Cfg>* __restrict__ y) {
  using G = Generic<Cfg>;
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int kPlanesPerOutput = Cfg::kMean == kMeanAll ? Cfg::kC : 1;
  constexpr int kOutputs = Cfg::kN * Cfg::kC / kPlanesPerOutput;
  if (o >= kOutputs) return;
  double sum = 0;
  const double* p = partials + (long long)o * kPlanesPerOutput * kChunks;
  for (int j = 0; j < kPlanesPerOutput * kChunks; ++j) sum += p[j];
  y[o] = store_as<ElemT<Cfg>>((typename G::A)(sum / ((double)G::kSpatial * kPlanesPerOutput)));
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate every kernel with the default configuration.
namespace fj_selftest {
using C = fj::DefaultConfig;
extern "C" __global__ void generic_elementwise(const float* x, const float* w, const float* b, float* y) {
  fj::elementwise_kernel<C>(x, w, b, y);
}
extern "C" __global__ void generic_stats(const float* x, const float* w, const float* b, float* y,
                                         fj::Moments* p) {
  fj::stats_kernel<C, true, 4>(x, w, b, y, p);
}
extern "C" __global__ void generic_stats_finalize(const fj::Moments* p, float2* s) {
  fj::stats_finalize_kernel<C, 4>(p, s);
}
extern "C" __global__ void generic_normalize(const float* x, const float* w, const float* b,
                                             const float* g, const float* be, const float2* s,
                                             float* y) {
  fj::normalize_kernel<C, false>(x, w, b, g, be, s, y);
}
extern "C" __global__ void generic_mean_partial(const float* x, const float* w, const float* b,
                                                const float* g, const float* be, const float2* s,
                                                double* p) {
  fj::mean_partial_kernel<C, true, 3>(x, w, b, g, be, s, p);
}
extern "C" __global__ void generic_mean_finalize(const double* p, float* y) {
  fj::mean_finalize_kernel<C, 3>(p, y);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_GENERIC_CUH_
