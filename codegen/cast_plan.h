// codegen/cast_plan.h: the plans of copies at the edges of composites (templates/cast.cuh): dtype
// conversions, the edges of a bf16/f16 chain run through its f32 plan (runtime/dtype_adapter.h),
// and crops (a data gradient computed on a larger grid: runtime/backward.cc).
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

// One kernel copying the leading box of tensor `from` (shape `from_shape`, 5-D) into tensor `to`
// (`to_shape`: the same N and C, each spatial extent at most from's), both of `dtype`; the
// signature lists them as kInput and kOutput.
// REQUIRES: to_shape fits in from_shape as described.
Plan PlanCrop(const std::string& from, const Shape& from_shape, const std::string& to,
              const Shape& to_shape, DType dtype, const PlanTarget& target);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_CAST_PLAN_H_
