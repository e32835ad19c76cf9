// codegen/convt_strategy.h: convt-recompute-normalize's transposed convolution (convt_strategy.cc,
// templates/convt_group_norm.cuh) as the backward plan reuses it. The strategies themselves are
// made by fast_strategies.h.
#ifndef FUSEJIT_CODEGEN_CONVT_STRATEGY_H_
#define FUSEJIT_CODEGEN_CONVT_STRATEGY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "codegen/chain_info.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

// Most MACs a point (ChainInfo::macs_per_point) at which the backward recomputes u for grad_y's
// sums rather than reading it (templates/convt_backward.cuh): between W1's 10.1, where it pays,
// and 24, where it does not (H100, 2026-11-27; ChooseConvTSums has the figures).
inline constexpr double kConvTSumsMaxMacs = 16;

// The backward's grad_y sums on a recomputed u (templates/convt_backward.cuh's
// convt_bwd_sums_kernel): `launch` has its symbol, body, purpose, grid (blocks_per_sample, N),
// block, register bound and shared memory, and the arguments x, weight and bias (the caller
// appends grad_y, gamma, beta, zpart, stats and gpart); `tune` is its "ConvTTune" struct.
struct ConvTSums {
  KernelLaunch launch;
  TuneStruct tune;
  int64_t blocks_per_sample = 0;
};

// The kernel for `chain` on `target`, or nullopt with *why: the producer is not
// convt-recompute-normalize's (a biased conv_transpose3d with at most 32 outputs, followed by
// group_norm, on sm_80 or later), costs more than kConvTSumsMaxMacs MACs a point, or no launch
// shape fits.
std::optional<ConvTSums> ChooseConvTSums(const Chain& chain, const ChainInfo& info,
                                         const PlanTarget& target, std::string* why);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_CONVT_STRATEGY_H_
