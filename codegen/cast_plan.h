// codegen/cast_plan.h: the plan of dtype conversion kernels (templates/cast.cuh), the edges of a
// bf16/f16 chain run through its f32 plan (runtime/dtype_adapter.h).
#ifndef FUSEJIT_CODEGEN_CAST_PLAN_H_
#define FUSEJIT_CODEGEN_CAST_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

// One conversion: `elements` values of tensor `from` (dtype `from_dtype`) into tensor `to`
// (dtype `to_dtype`). The names are the plan's own signature names.
struct Cast {
  std::string from;
  DType from_dtype = DType::kF32;
  std::string to;
  DType to_dtype = DType::kF32;
  int64_t elements = 0;
};

// One kernel per cast, in order; its signature lists each cast's `from` (role kInput) and `to`
// (role kOutput) with shape {elements}. `what` names the step in the plan's description.
// REQUIRES: casts non-empty; every pair of dtypes is one of f32 <-> bf16, f32 <-> f16.
Plan PlanCasts(const std::vector<Cast>& casts, const PlanTarget& target, const std::string& what);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_CAST_PLAN_H_
