// codegen/weight_gradient_plan.h: the kernels of a convolution's weight gradient, part of the
// backward plan (codegen/backward_plan.h's step 2) -- a GEMM reduced over batch and space:
//
//   grad_w[a][b][tap] = sum_{n,p} T[n,a,p] * S[n,b, p*s - pad + tap*dil]   (zero outside S)
//
// (templates/wgrad.cuh's notation: conv3d T = grad_u, S = x; conv_transpose3d T = x, S = grad_u).
// AddWeightGradient picks the kernels by shape and architecture, each where it measured fastest:
//   - FFMA without im2col (wgrad_direct.cuh): conv3d with at most 4 input and 32 output channels,
//     a kernel 5 wide, stride 1 along w; sm_80 and later;
//   - wgmma, F16x3: sm_90, both channel counts 32 or more; with stride 1 and a kernel at least 2
//     wide 2-3 kw taps per CTA share the staged rows (wgrad_taps.cuh), else one tap per CTA
//     (wgrad_wgmma.cuh);
//   - mma.sync 3xTF32 on a tile of T's grid and the halo of S staged once (wgrad_halo.cuh): sm_80
//     and later, 8 to 32 GEMM rows, a halo that fits;
//   - mma.sync 3xTF32 gathering per tap, or FFMA register tiles below 8 rows and before sm_80
//     (wgrad.cuh).
// TF32 precision makes the tensor-core ones one TF32 product. Every one writes double partials per
// chunk of the reduction, which wgrad_reduce_kernel sums in a fixed order: deterministic.
#ifndef FUSEJIT_CODEGEN_WEIGHT_GRADIENT_PLAN_H_
#define FUSEJIT_CODEGEN_WEIGHT_GRADIENT_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "codegen/chain_info.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

// The weight gradient's GEMM: rows x cols (cols = s_channels * kv) over `reduction` (n, point)
// pairs (templates/wgrad.cuh's T, S notation).
struct WeightGradient {
  int64_t rows;        // T's channels (conv3d: output channels; conv_transpose3d: input ones)
  int64_t s_channels;  // S's channels
  int64_t kv;          // kernel taps
  int64_t reduction;   // n * T's points
  int64_t t_points, s_points;  // per sample
  Dims3 t_grid;                // T's grid (d, h, w)
  ConvAttrs conv;              // the producer's kernel, stride, padding, dilation
  int64_t cols() const { return s_channels * kv; }
};

// Per-block maxima of |grad_u| that the kernel writing grad_u leaves in the signature tensor
// `tensor` (float [count]): the wgmma engine's scale then needs no pass over grad_u.
struct GradUMaxima {
  std::string tensor;
  int64_t count = 0;
};

// Whether AddWeightGradient's engine for `wg` reads GradUMaxima (the wgmma one: its fp16 operands
// are scaled by the largest magnitude).
bool WeightGradientReadsGradUMaxima(const WeightGradient& wg, const Chain& chain,
                                    const PlanTarget& target);

// Appends the weight gradient's kernels and workspace to `plan`: they read x and the tensor `gu`
// (grad_u) -- and `maxima` where given (REQUIRES: WeightGradientReadsGradUMaxima) -- and write the
// gradient of the conv weight (info.weight_param).
void AddWeightGradient(const WeightGradient& wg, const Chain& chain, const ChainInfo& info,
                       const std::string& gu, const PlanTarget& target, Plan& plan,
                       std::optional<GradUMaxima> maxima = std::nullopt);

// The last kernel of every weight gradient (and of few_in_backward_plan.h's): grad_w (`weights`
// values) = the double partials at workspace offset `wpart` (part[chunk][weight], the weight's
// layout, WgTune::kSplits chunks) summed in a fixed order (wgrad_reduce_kernel).
void AddWeightGradientReduce(int64_t weights, const ChainInfo& info, size_t wpart, Plan& plan);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_WEIGHT_GRADIENT_PLAN_H_
