// codegen/fast_strategies.h: strategies for chains whose producer is cheap (few input channels):
// register-tiled direct convolutions that never store a full-size intermediate.
#ifndef FUSEJIT_CODEGEN_FAST_STRATEGIES_H_
#define FUSEJIT_CODEGEN_FAST_STRATEGIES_H_

#include <memory>
#include <vector>

#include "codegen/planner.h"

namespace fusejit::codegen {

std::unique_ptr<Strategy> MakeConvMomentsMeanStrategy();  // conv_moments_strategy.cc
std::unique_ptr<Strategy> MakeMmaMomentsMeanStrategy();   // mma_moments_strategy.cc
std::unique_ptr<Strategy> MakeConvTRecomputeStrategy();   // convt_strategy.cc
std::unique_ptr<Strategy> MakeConvTStoreStrategy();       // convt_strategy.cc
std::unique_ptr<Strategy> MakeConvTDirectStrategy();      // convt_strategy.cc
std::unique_ptr<Strategy> MakeMmaDirectStrategy();        // mma_moments_strategy.cc
std::unique_ptr<Strategy> MakeMmaConvTRecomputeStrategy();  // mma_convt_strategy.cc
std::unique_ptr<Strategy> MakeMmaConvTDirectStrategy();     // mma_convt_strategy.cc
std::unique_ptr<Strategy> MakeDirectFewOutStrategy();     // direct_few_out_strategy.cc
std::unique_ptr<Strategy> MakeChannelMomentsMeanStrategy();  // channel_moments_strategy.cc
std::unique_ptr<Strategy> MakeSliceNormalizeStrategy();      // slice_normalize_strategy.cc

// conv-moments-mean's modeled time of `in` (a chain it applies to) in the planner's cost units,
// before the factor its Cost applies outside its seed domain for the gap between that model and
// its measured times: the FFMA work mma-moments-mean's Cost stays below (its own model is
// measured against the unscaled value). conv_moments_strategy.cc.
double ConvMomentsModeledCost(const PlanInput& in);

// Appends conv-moments-mean, mma-moments-mean, convt-recompute-normalize,
// convt-store-normalize and direct-few-out.
void AddFastStrategies(std::vector<std::unique_ptr<Strategy>>* out);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_FAST_STRATEGIES_H_
