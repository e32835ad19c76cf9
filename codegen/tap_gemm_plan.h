// codegen/tap_gemm_plan.h: a chain's convolution as a dense GEMM per tap and a gather
// (templates/tap_gemm.cuh; the composite is runtime/tap_gemm.h).
//
// For few output channels C and many input channels Cin, an implicit GEMM (tc-conv) gathers
// Cin x T input values for every output tile and moves them through the tensor cores for only C
// columns: x is re-read T times through L2. Instead, one 1x1x1 convolution with C x T outputs
// reads x once, Z = x * W' (a dense GEMM: M = input points, N = C x T, K = Cin), and each output
// value sums its T entries of Z (a gather, in a fixed order). The ops after the convolution run
// as their own chain on its output (small when C is).
#ifndef FUSEJIT_CODEGEN_TAP_GEMM_PLAN_H_
#define FUSEJIT_CODEGEN_TAP_GEMM_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

inline constexpr std::string_view kTapGemmStrategy = "tap-gemm";

// The parts of a chain run as tap GEMM + gather.
struct TapGemm {
  Chain gemm;               // x | conv3d(out=C*T, k=1, bias=False): Z, its output
  Chain rest;               // the convolution's output | the chain's later ops (ops empty: none)
  int64_t taps = 0;         // T
  double reuse = 0;         // T / stride volume: how often an implicit GEMM reads each input value
  size_t weight_bytes = 0;  // W' [C*T][Cin]
  size_t z_bytes = 0;       // Z [N][C*T][D][H][W]
  size_t conv_bytes = 0;    // the convolution's output (its own region when rest has ops)
};

// The decomposition of `chain`, or nullopt with `why` (when not null) saying why it does not
// apply: an f32 chain whose first op is conv3d or conv_transpose3d with at least 2 taps and 8
// input channels, Z under 2^31 elements and 2 GiB. REQUIRES: chain is valid.
std::optional<TapGemm> SplitTapGemm(const Chain& chain, std::string* why = nullptr);

// The planner's cost (units of LowestCost) of the whole composite: the GEMM's and the rest's
// lowest costs, the gather's and the weight's modeled time.
double TapGemmCost(const Chain& chain, const TapGemm& split, const PlanTarget& target);

// Whether the composite should replace the chain's own plan, whose strategy `own_strategy` has
// the cost `own_cost` (units of LowestCost); when it should, the reason (the modeled figures).
// Not when reuse < 2 (an implicit GEMM reads x about once already: the split only adds Z's round
// trip); else when TapGemmCost is below own_cost, x 1.6 with <= 8 output and >= 16 input channels.
std::optional<std::string> TapGemmBeatsOwnPlan(const Chain& chain, const TapGemm& split,
                                               const PlanTarget& target,
                                               std::string_view own_strategy, double own_cost);

// One kernel: W' (tensor `to`, [C*T][Cin]) from the chain's weight (tensor `from`, its shape).
Plan PlanTapWeight(const Chain& chain, const TapGemm& split, const std::string& from,
                   const std::string& to, const PlanTarget& target);

// One kernel: the convolution's output (tensor `to`) from Z (tensor `z`) and the chain's bias
// (tensor `bias`, when the convolution has one).
Plan PlanTapGather(const Chain& chain, const TapGemm& split, const std::string& z,
                   const std::string& bias, const std::string& to, const PlanTarget& target);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_TAP_GEMM_PLAN_H_
