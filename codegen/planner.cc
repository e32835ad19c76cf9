#include "codegen/planner.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/fast_strategies.h"
#include "codegen/generic_strategies.h"
#include "codegen/igemm_strategy.h"

namespace fusejit::codegen {

const std::vector<std::unique_ptr<Strategy>>& AllStrategies() {
  static const auto* strategies = [] {
    auto* list = new std::vector<std::unique_ptr<Strategy>>();
    AddFastStrategies(list);
    AddIgemmStrategies(list);
    AddGenericStrategies(list);
    return list;
  }();
  return *strategies;
}

absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              std::string_view strategy) {
  std::vector<std::string> applicable;
  const Strategy* best = nullptr;
  double best_cost = std::numeric_limits<double>::infinity();
  for (const auto& s : AllStrategies()) {
    if (!s->Applies(chain, target)) continue;
    applicable.emplace_back(s->name());
    if (!strategy.empty()) {
      if (s->name() == strategy) best = s.get();
      continue;
    }
    const double cost = s->Cost(chain, target);
    if (cost < best_cost) {
      best_cost = cost;
      best = s.get();
    }
  }
  if (!best) {
    if (strategy.empty()) {
      return absl::InternalError(
          absl::StrCat("no strategy applies to ", FormatChain(chain), " (a planner bug)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "strategy '", std::string(strategy), "' does not apply to this chain; applicable: ",
        absl::StrJoin(applicable, ", ")));
  }
  return best->MakePlan(chain, target);
}

}  // namespace fusejit::codegen
