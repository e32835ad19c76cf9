// templates/moments_util.cuh: Welford/Chan helpers for kernels that keep K sets of moments per
// thread (one per channel or per group) that all share ONE count (every set saw the same number
// of values). The Chan weight wb = nb / (na + nb) is then computed once and reused for all K sets,
// so merging costs no division per set. Fixed merge order everywhere: deterministic.
//
// No kernels here; included by direct_conv_moments.cuh, convt_group_norm.cuh and the mma kernels.
#ifndef FUSEJIT_TEMPLATES_MOMENTS_UTIL_CUH_
#define FUSEJIT_TEMPLATES_MOMENTS_UTIL_CUH_

#include "common.cuh"

namespace fj {

// Chan merge of (nb, mb, m2b) into (na, ma, m2a) given wb = nb / (na + nb) (0 when both empty).
__device__ __forceinline__ void chan_merge_w(float& ma, float& m2a, float na, float mb, float m2b,
                                             float wb) {
  const float delta = mb - ma;
  ma = fmaf(delta, wb, ma);
  m2a = m2a + m2b + delta * delta * (na * wb);
}

__device__ __forceinline__ float chan_weight(float na, float nb) {
  const float n = na + nb;
  return n > 0.f ? nb / n : 0.f;
}

// One channel's moments over the `blocks` per-block partials p[0], p[stride], ... (fj::Moments or
// fj::MomentsD), merged in block order by Chan's rule in double: (count, mean, M2). The merge
// behind moments_mean_finalize and bwd_sums_from_moments_kernel (backward.cuh), which must agree.
template <class P>
__device__ __forceinline__ void merge_block_moments(const P* __restrict__ p, int stride, int blocks,
                                                    double& cn, double& cm, double& cq) {
  cn = 0;
  cm = 0;
  cq = 0;
  for (int b = 0; b < blocks; ++b) {
    const P v = p[static_cast<size_t>(b) * stride];
    const double total = cn + (double)v.count;
    const double wb = total > 0 ? (double)v.count / total : 0;
    const double delta = (double)v.mean - cm;
    cm += delta * wb;
    cq += (double)v.m2 + delta * delta * cn * wb;
    cn = total;
  }
}

// Warp tree reduction (shfl_down, fixed order) of K moment sets sharing one count.
// Result valid in lane 0.
template <int K>
__device__ __forceinline__ void warp_reduce_shared_count(float& cnt, float (&mean)[K],
                                                         float (&m2)[K]) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float cb = __shfl_down_sync(0xffffffffu, cnt, off);
    const float wb = chan_weight(cnt, cb);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float mb = __shfl_down_sync(0xffffffffu, mean[k], off);
      const float m2b = __shfl_down_sync(0xffffffffu, m2[k], off);
      chan_merge_w(mean[k], m2[k], cnt, mb, m2b, wb);
    }
    cnt += cb;
  }
}

// The moments of an mma.sync m16n8 fragment's channels: thread (g = lane / 4, t = lane % 4) holds
// channels nt*8 + 2t + e as run_m/run_q[2*nt + e] with one count run_n. Merges them over the 8
// lanes g of each t in a fixed tree, then lanes t < 4 write channel c's (count, mean, M2) to
// s_red[(warp * stride + c) * 3 + {0, 1, 2}] (stride: the channels of a warp's row of s_red).
// The caller's barrier publishes them. REQUIRES: all lanes of the warp call it.
template <int NT>
__device__ __forceinline__ void fragment_moments_to_shared(float run_n, float (&run_m)[2 * NT],
                                                           float (&run_q)[2 * NT], float* s_red,
                                                           int stride) {
#pragma unroll
  for (int off = 16; off >= 4; off >>= 1) {
    const float cb = __shfl_down_sync(0xffffffffu, run_n, off);
    const float wb = chan_weight(run_n, cb);
#pragma unroll
    for (int k = 0; k < 2 * NT; ++k) {
      const float mb = __shfl_down_sync(0xffffffffu, run_m[k], off);
      const float qb = __shfl_down_sync(0xffffffffu, run_q[k], off);
      chan_merge_w(run_m[k], run_q[k], run_n, mb, qb, wb);
    }
    run_n += cb;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane < 4) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* const r = s_red + (warp * stride + nt * 8 + 2 * lane + e) * 3;
        r[0] = run_n;
        r[1] = run_m[2 * nt + e];
        r[2] = run_q[2 * nt + e];
      }
  }
}

// Block reduction of K moment sets sharing one count, where warp w holds the sets of part
// (w % SPLIT) of K*SPLIT sets in all (SPLIT = 1: every thread holds all K). Thread k < K*SPLIT
// writes set k of the block to out[k] as a Moments, merging the warps of its part in warp order.
// REQUIRES: blockDim.x multiple of 32*SPLIT, <= 1024; all threads call it;
// scratch holds (blockDim.x/32) * (2K+1) floats.
template <int K, int SPLIT = 1>
__device__ __forceinline__ void block_reduce_shared_count_store(float cnt, float (&mean)[K],
                                                                float (&m2)[K], float* scratch,
                                                                Moments* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  warp_reduce_shared_count<K>(cnt, mean, m2);
  if (lane == 0) {
    float* s = scratch + warp * (2 * K + 1);
    s[0] = cnt;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      s[1 + k] = mean[k];
      s[1 + K + k] = m2[k];
    }
  }
  __syncthreads();
  for (int kk = threadIdx.x; kk < K * SPLIT; kk += blockDim.x) {
    const int part = kk / K, k = kk - part * K;
    float n = 0.f, m = 0.f, q = 0.f;
    for (int w = part; w < warps; w += SPLIT) {  // fixed order
      const float* s = scratch + w * (2 * K + 1);
      const float nb = s[0];
      const float wb = chan_weight(n, nb);
      chan_merge_w(m, q, n, s[1 + k], s[1 + K + k], wb);
      n += nb;
    }
    out[kk] = Moments{n, m, q};
  }
}

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_MOMENTS_UTIL_CUH_
