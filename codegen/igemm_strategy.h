// codegen/igemm_strategy.h: the tensor-core strategies for chains whose producer is expensive
// (many input channels): an implicit GEMM on Hopper's wgmma, either storing y directly (chains
// without group_norm or mean: igemm-store), or storing the pre-norm values into y and normalizing
// them in place (igemm-store-normalize), or, for chains ending in mean, reducing per-channel
// moments only (igemm-moments-mean). All tunable (wg, stages, async).
#ifndef FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_
#define FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_

#include <memory>
#include <vector>

#include "codegen/planner.h"

namespace fusejit::codegen {

// Appends igemm-store, igemm-store-normalize and igemm-moments-mean.
void AddIgemmStrategies(std::vector<std::unique_ptr<Strategy>>* out);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_
