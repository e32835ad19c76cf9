// codegen/few_in_backward_plan.h: the fused backward of a convolution with few input channels
// (templates/few_in_backward.cuh), part of the backward plan (codegen/backward_plan.h): which
// chains take it and its x tile. One kernel after group_norm's sums computes grad_u where it is
// used (never stored), grad_x, the weight-gradient partials and the conv-bias partials.
#ifndef FUSEJIT_CODEGEN_FEW_IN_BACKWARD_PLAN_H_
#define FUSEJIT_CODEGEN_FEW_IN_BACKWARD_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "codegen/chain_info.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {

// The kernel's x tile: xd x xh x xw points of one sample per block, and its geometry.
struct FewInTile {
  int64_t xd = 0, xh = 0, xw = 0;
  fj::geom::FewInBwd g{};
};

// The tile of least estimated time for the chain's fused backward; nullopt where the kernel does
// not apply, with *why (for the plan's description): the producer (a conv3d with a stride or
// padding beyond the kernel's reach), more than 4 input channels, more than 64 taps, more than 48
// taps per output point, or no tile's shared memory fits. REQUIRES: the chain has a producer.
std::optional<FewInTile> ChooseFewInTile(const Chain& chain, const ChainInfo& info,
                                         const PlanTarget& target, std::string* why);

// Appends the fused kernel (fj_bwd_few_in) and its weight-gradient reduction to `plan`: it reads
// x, `u` (the producer's output), grad_y, the conv weight, group_norm's weight and bias and the
// group terms (zpart_in, stats_in, the workspace offset gpart of grad_y's sums; null without
// group_norm), and writes grad_x, the conv weight's gradient and, at workspace offset bpart, the
// conv-bias partials per (n, c, tile) (null without a bias). u_rows_by_channel: u is laid out
// [N, D, H, C, W] (codegen::ULayout::kRowsByChannel), else [N, C, D, H, W].
void AddFewInBackward(const Chain& chain, const ChainInfo& info, const FewInTile& t,
                      const std::string& u, bool u_rows_by_channel, KernelArg zpart_in,
                      KernelArg stats_in, std::optional<size_t> gpart, std::optional<size_t> bpart,
                      Plan& plan);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_FEW_IN_BACKWARD_PLAN_H_
