// codegen/tc_conv_strategy.h: the tensor-core convolution engine (strategy "tc-conv"): an
// implicit GEMM on mma.sync for every conv3d / conv_transpose3d chain on sm_80 and later, with
// the chain's ops, group_norm and mean in its epilogue and tail. Tunable (bm, bn, bk, stages).
#ifndef FUSEJIT_CODEGEN_TC_CONV_STRATEGY_H_
#define FUSEJIT_CODEGEN_TC_CONV_STRATEGY_H_

#include <memory>
#include <vector>

#include "codegen/planner.h"

namespace fusejit::codegen {

// Appends tc-conv.
void AddTcConvStrategies(std::vector<std::unique_ptr<Strategy>>* out);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_TC_CONV_STRATEGY_H_
