// codegen/planner.h: strategies turn a chain into a Plan; the planner picks one.
//
// A Strategy has a small contract (after MIOpen's solvers): Applies() says whether it can run a
// chain at all, Cost() ranks the applicable ones (a heuristic estimate in arbitrary units, lower is
// better), MakePlan() builds the plan. The planner takes the strategy named in the options, or the
// applicable one of lowest cost.
#ifndef FUSEJIT_CODEGEN_PLANNER_H_
#define FUSEJIT_CODEGEN_PLANNER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/plan.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"

namespace fusejit::codegen {

// What a plan may depend on besides the chain.
struct PlanTarget {
  std::string arch;  // "sm_90"
  int sm_count = 132;  // used for grid sizing; the H100's count when the device is unknown
  Precision precision = Precision::kFp32;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  virtual bool Applies(const Chain& chain, const PlanTarget& target) const = 0;
  virtual double Cost(const Chain& chain, const PlanTarget& target) const = 0;
  // REQUIRES: Applies(chain, target).
  virtual absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const = 0;
};

// Every strategy, in a fixed order.
const std::vector<std::unique_ptr<Strategy>>& AllStrategies();

// The plan for `chain`: by the strategy named `strategy` when non-empty (error if unknown or not
// applicable, listing the ones that are), else the applicable strategy of lowest cost.
// REQUIRES: chain is valid.
absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              std::string_view strategy = "");

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_PLANNER_H_
