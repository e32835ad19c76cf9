// codegen/generic_strategies.h: the strategies that are correct for every valid chain.
#ifndef FUSEJIT_CODEGEN_GENERIC_STRATEGIES_H_
#define FUSEJIT_CODEGEN_GENERIC_STRATEGIES_H_

#include <memory>
#include <vector>

#include "codegen/planner.h"

namespace fusejit::codegen {

// Appends elementwise, reduce-mean, store-normalize, recompute-normalize and recompute-mean.
void AddGenericStrategies(std::vector<std::unique_ptr<Strategy>>* out);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_GENERIC_STRATEGIES_H_
