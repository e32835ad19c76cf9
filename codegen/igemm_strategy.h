// codegen/igemm_strategy.h: the tensor-core strategy for chains whose producer is expensive (many
// input channels): an implicit GEMM on Hopper's wgmma, pre-norm values stored into y and
// normalized in place.
#ifndef FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_
#define FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_

#include <memory>
#include <vector>

#include "codegen/planner.h"

namespace fusejit::codegen {

// Appends igemm-store-normalize.
void AddIgemmStrategies(std::vector<std::unique_ptr<Strategy>>* out);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_IGEMM_STRATEGY_H_
