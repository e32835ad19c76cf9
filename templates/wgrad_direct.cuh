// templates/wgrad_direct.cuh: the weight gradient of a conv3d with few input channels and at most
// 32 output channels, on FFMA with no im2col (planned by codegen::PlanBackward):
//
//   grad_w[c][ci][kd][kh][kw] = sum_{n,od,oh,ow} grad_u[n,c,od,oh,ow] *
//                               x[n,ci, od*sd - pd + kd*ld, oh*sh - ph + kh*lh, ow*sw - pw + kw*lw]
//
// A thread owns one (ci, kd, kh) and kCT output channels, all kKW taps along w: kCT x kKW
// accumulators. Per output point of its row it reads kCT values of grad_u (float4, the same for
// every thread of the warp: a broadcast) and the kKW x values its taps reach, then does kCT x kKW
// FFMA (with stride 1 along w, neighbouring points share all but one x value: unrolled, the
// loads are shared). Planned where it measured faster than the tensor-core halo kernel
// (wgrad_halo.cuh): kernels 5 wide (codegen/weight_gradient_plan.cc, ChooseDirectWgrad); it
// computes any width up to 7 (tested), 6 and 7 not yet timed.
//
// Block: a run of kPlanes (n, od) planes in turn (geom::WgradDirect). Per stage of kRows output
// rows it copies grad_u's rows channels-last (gs[r][ow][c]) and the x rows every (ci, kd) reaches
// (xs[ci][kd][row][col], zero outside x: the padding) into shared memory, with cp.async into two
// buffers: the next stage's copies are in flight while this one is computed (without that the
// kernel waited on its loads: W2 4.85 ms, against 3.02 with them). The block's threads are
// `copies` copies of the tasks (ci, kd, kh, channel group); copy k takes the stage rows k,
// k + copies, ... Products of a stage are summed in fp32, then added to double accumulators;
// at the end the copies' sums are added in order and written as doubles, part[block][weight] in
// the weight's layout, which wgrad_reduce_kernel sums over blocks in order: deterministic.
#ifndef FUSEJIT_TEMPLATES_WGRAD_DIRECT_CUH_
#define FUSEJIT_TEMPLATES_WGRAD_DIRECT_CUH_

#include "common.cuh"
#include "default_config.cuh"
#include "geometry.cuh"

namespace fj {

// Tune: kCT (output channels per thread: 4, 8 or 16), kRows (output rows per stage), kCopies,
// kPlanes ((n, od) planes per block), kThreads (geom::WgradDirect::threads).
template <class Cfg, class Tune>
struct WgDirectGeom {
  static_assert(Cfg::kProducer == kConv3d, "wgrad_direct: conv3d only");
  static constexpr geom::WgradDirect kG =
      geom::WgradDirectOf(Cfg::kCin, Cfg::kC, Cfg::kW, Cfg::kKD, Cfg::kKH, Cfg::kKW, Cfg::kSH,
                          Cfg::kSW, Cfg::kDilH, Cfg::kDilW, Tune::kCT, Tune::kRows, Tune::kCopies);
  static constexpr int kCT = Tune::kCT, kKW = Cfg::kKW, kR = Tune::kRows;
  static constexpr int kTasks = kG.tasks, kCopies = Tune::kCopies;
  static constexpr int kRin = kG.rows_in, kPitch = kG.pitch, kCpad = kG.cpad;
  static constexpr int kWeights = Cfg::kC * Cfg::kCin * Cfg::kKD * Cfg::kKH * Cfg::kKW;
  static_assert(kCT % 4 == 0 && kCT <= 16, "wgrad_direct: 4, 8 or 16 channels per thread");
  static_assert(Tune::kThreads == kG.threads, "wgrad_direct: threads as the geometry says");
};

// Grid ceil(kN * kD / kPlanes) blocks of Tune::kThreads, dynamic shared memory
// geom::WgradDirect::smem. x [N, Cin, Din, Hin, Win], gu (grad_u) [N, C, D, H, W].
template <class Cfg, class Tune>
__device__ void wgrad_direct_kernel(const float* __restrict__ x, const float* __restrict__ gu,
                                    double* __restrict__ part) {
  using G = WgDirectGeom<Cfg, Tune>;
  constexpr int CT = G::kCT, KW = G::kKW, R = G::kR;
  constexpr int kPlanesTotal = Cfg::kN * Cfg::kD;
  constexpr int kSx = Cfg::kDin * Cfg::kHin * Cfg::kWin, kSu = Cfg::kD * Cfg::kH * Cfg::kW;
  extern __shared__ __align__(16) float fj_wgrad_direct_smem[];
  // Two stage buffers of geom::WgradDirect::stage floats: gs [R][kW][kCpad] then xs
  // [Cin][KD][kRin][kPitch]; the copies' double sums reuse the memory after the last stage.
  double* const red = reinterpret_cast<double*>(fj_wgrad_direct_smem);

  // This thread's task: (ci, kd, kh, channel group) and copy; threads past the tasks only copy.
  const int task = threadIdx.x % G::kTasks, copy = threadIdx.x / G::kTasks;
  const bool worker = copy < G::kCopies;
  const int cg = task % G::kG.groups;
  const int kh = (task / G::kG.groups) % Cfg::kKH;
  const int kd = (task / (G::kG.groups * Cfg::kKH)) % Cfg::kKD;
  const int ci = task / (G::kG.groups * Cfg::kKH * Cfg::kKD);

  double dacc[CT][KW];
#pragma unroll
  for (int c = 0; c < CT; ++c) {
#pragma unroll
    for (int k = 0; k < KW; ++k) dacc[c][k] = 0.0;
  }

  // Stage s: plane p_begin + s / kStagesPerPlane, output rows from (s % kStagesPerPlane) * R.
  constexpr int kStagesPerPlane = (Cfg::kH + R - 1) / R;
  const int p_begin = blockIdx.x * Tune::kPlanes;
  const int p_end = p_begin + Tune::kPlanes < kPlanesTotal ? p_begin + Tune::kPlanes : kPlanesTotal;
  const int stages = (p_end - p_begin) * kStagesPerPlane;
  // Copies stage s into buffer b with 4-byte cp.async (zero-filled outside grad_u and x): gs
  // channels-last, xs[ci][kd][j][col] = x[n, ci, od*sd - pd + kd*ld, oh0*sh - ph + j, col - pw].
  const auto issue = [&](int st, int b) {
    const int pl = p_begin + st / kStagesPerPlane, oh0 = (st % kStagesPerPlane) * R;
    const int n = pl / Cfg::kD, od = pl % Cfg::kD;
    const unsigned base =
        static_cast<unsigned>(__cvta_generic_to_shared(fj_wgrad_direct_smem + b * G::kG.stage));
    // A warp per row (one division per row, not per value), its lanes along the row.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int row = warp; row < G::kCpad * R; row += warps) {
      const int c = row / R, r = row % R, oh = oh0 + r;
      const bool row_ok = c < Cfg::kC && oh < Cfg::kH;
      const float* const src = gu + (static_cast<size_t>(n) * Cfg::kC + (row_ok ? c : 0)) * kSu +
                               (static_cast<size_t>(od) * Cfg::kH + (row_ok ? oh : 0)) * Cfg::kW;
      const unsigned dst = base + 4u * (r * Cfg::kW * G::kCpad + c);
      for (int ow = lane; ow < Cfg::kW; ow += 32) {
        asm volatile(
            "cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4u * ow * G::kCpad),
            "l"(src + ow), "r"(row_ok ? 4 : 0));
      }
    }
    const unsigned xbase = base + 4u * G::kG.x_offset;
    for (int row = warp; row < Cfg::kCin * Cfg::kKD * G::kRin; row += warps) {
      const int j = row % G::kRin, kdi = (row / G::kRin) % Cfg::kKD;
      const int cii = row / (G::kRin * Cfg::kKD);
      const int id = od * Cfg::kSD - Cfg::kPD + kdi * Cfg::kDilD;
      const int ih = oh0 * Cfg::kSH - Cfg::kPH + j;
      const bool row_ok = static_cast<unsigned>(id) < static_cast<unsigned>(Cfg::kDin) &&
                          static_cast<unsigned>(ih) < static_cast<unsigned>(Cfg::kHin);
      const float* const src =
          x + (static_cast<size_t>(n) * Cfg::kCin + cii) * kSx +
          (static_cast<size_t>(row_ok ? id : 0) * Cfg::kHin + (row_ok ? ih : 0)) * Cfg::kWin;
      const unsigned dst = xbase + 4u * row * G::kPitch;
      for (int col = lane; col < G::kG.cols; col += 32) {
        const int iw = col - Cfg::kPW;
        const bool ok = row_ok && static_cast<unsigned>(iw) < static_cast<unsigned>(Cfg::kWin);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4u * col),
                     "l"(ok ? src + iw : x), "r"(ok ? 4 : 0));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };

  if (stages > 0) issue(0, 0);
  for (int st = 0; st < stages; ++st) {
    // The next stage's copies in flight while this one is computed.
    if (st + 1 < stages) {
      issue(st + 1, (st + 1) & 1);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    __syncthreads();  // every thread's copies of stage st have landed
    const float* const gs = fj_wgrad_direct_smem + (st & 1) * G::kG.stage;
    const float* const xs = gs + G::kG.x_offset;
    const int oh0 = (st % kStagesPerPlane) * R;
    if (worker) {
      float acc[CT][KW];
#pragma unroll
      for (int c = 0; c < CT; ++c) {
#pragma unroll
        for (int k = 0; k < KW; ++k) acc[c][k] = 0.f;
      }
      for (int r = copy; r < R && oh0 + r < Cfg::kH; r += G::kCopies) {
        const float* const xrow =
            xs + ((ci * Cfg::kKD + kd) * G::kRin + r * Cfg::kSH + kh * Cfg::kDilH) * G::kPitch;
        const float4* const grow =
            reinterpret_cast<const float4*>(gs + r * Cfg::kW * G::kCpad + cg * CT);
        // grad_u's channels of the next point loaded while this one's products are issued.
        float4 gn[CT / 4];
#pragma unroll
        for (int q = 0; q < CT / 4; ++q) gn[q] = grow[q];
#pragma unroll 4
        for (int ow = 0; ow < Cfg::kW; ++ow) {
          float g[CT];
#pragma unroll
          for (int q = 0; q < CT / 4; ++q) {
            g[4 * q] = gn[q].x;
            g[4 * q + 1] = gn[q].y;
            g[4 * q + 2] = gn[q].z;
            g[4 * q + 3] = gn[q].w;
          }
          const int next = ow + 1 < Cfg::kW ? ow + 1 : ow;
#pragma unroll
          for (int q = 0; q < CT / 4; ++q) gn[q] = grow[next * (G::kCpad / 4) + q];
#pragma unroll
          for (int k = 0; k < KW; ++k) {
            const float xv = xrow[ow * Cfg::kSW + k * Cfg::kDilW];
#pragma unroll
            for (int c = 0; c < CT; ++c) acc[c][k] = fmaf(g[c], xv, acc[c][k]);
          }
        }
      }
#pragma unroll
      for (int c = 0; c < CT; ++c) {
#pragma unroll
        for (int k = 0; k < KW; ++k) dacc[c][k] += static_cast<double>(acc[c][k]);
      }
    }
    __syncthreads();  // buffer st & 1 is free for stage st + 2
  }
  // The copies' sums, added in copy order, to part[block][c][ci][kd][kh][kw].
  if (worker) {
#pragma unroll
    for (int c = 0; c < CT; ++c) {
#pragma unroll
      for (int k = 0; k < KW; ++k)
        red[(copy * G::kTasks + task) * CT * KW + c * KW + k] = dacc[c][k];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G::kTasks * CT * KW; i += blockDim.x) {
    const int t = i / (CT * KW), c_local = (i / KW) % CT, k = i % KW;
    const int tcg = t % G::kG.groups, tkh = (t / G::kG.groups) % Cfg::kKH;
    const int tkd = (t / (G::kG.groups * Cfg::kKH)) % Cfg::kKD;
    const int tci = t / (G::kG.groups * Cfg::kKH * Cfg::kKD);
    const int c = tcg * CT + c_local;
    if (c >= Cfg::kC) continue;
    double s = 0;
    for (int cp = 0; cp < G::kCopies; ++cp)
      s += red[(cp * G::kTasks + t) * CT * KW + c_local * KW + k];
    part[static_cast<size_t>(blockIdx.x) * G::kWeights +
         (((static_cast<size_t>(c) * Cfg::kCin + tci) * Cfg::kKD + tkd) * Cfg::kKH + tkh) *
             Cfg::kKW +
         k] = s;
  }
}

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): a strided, padded, dilated conv3d.
namespace fj_selftest {
struct WgDirectSelfCfg : fj::DefaultConfig {
  static constexpr int kProducer = fj::kConv3d;
  static constexpr int kN = 2, kCin = 3, kDin = 6, kHin = 7, kWin = 9;
  static constexpr int kC = 10, kKD = 2, kKH = 3, kKW = 2;
  static constexpr int kSD = 1, kSH = 2, kSW = 1, kPD = 1, kPH = 1, kPW = 0;
  static constexpr int kDilD = 1, kDilH = 1, kDilW = 2;
  static constexpr int kD = 7, kH = 4, kW = 7;
};
struct WgDirectSelfTune {
  static constexpr int kCT = 8, kRows = 3, kCopies = 2, kPlanes = 3;
  static constexpr int kThreads =
      fj::geom::WgradDirectOf(3, 10, 7, 2, 3, 2, 2, 1, 1, 2, 8, 3, 2).threads;
};
extern "C" __global__ void wgrad_direct_alone(const float* x, const float* gu, double* part) {
  fj::wgrad_direct_kernel<WgDirectSelfCfg, WgDirectSelfTune>(x, gu, part);
}
}  // namespace fj_selftest
#endif  // FJ_GENERATED

#endif  // FUSEJIT_TEMPLATES_WGRAD_DIRECT_CUH_
