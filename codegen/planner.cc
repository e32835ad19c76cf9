#include "codegen/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/fast_strategies.h"
#include "codegen/generic_strategies.h"
#include "codegen/igemm_strategy.h"
#include "codegen/tc_conv_strategy.h"
#include "fmt/format.h"

namespace fusejit::codegen {

const std::vector<std::unique_ptr<Strategy>>& AllStrategies() {
  static const auto* strategies = [] {
    auto* list = new std::vector<std::unique_ptr<Strategy>>();
    AddFastStrategies(list);
    AddIgemmStrategies(list);
    AddTcConvStrategies(list);
    AddGenericStrategies(list);
    return list;
  }();
  return *strategies;
}

absl::Status CheckDTypeHasPlans(DType dtype) {
  // f32: every strategy. bf16, f16: the generic strategies natively; fusejit::Compile runs the
  // others' f32 plans between casts (runtime/dtype_adapter.h). f64: the generic strategies, in
  // double throughout.
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF64: return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("chains of dtype ", DTypeName(dtype),
                                               " have no plans; dtypes with plans: f32, bf16, "
                                               "f16, f64"));
}

PlanInput::PlanInput(Chain c, PlanTarget t)
    : chain(std::move(c)), target(std::move(t)), info(AnalyzeChain(chain)) {}

bool StrategyApplies(const Strategy& s, const Chain& chain, const PlanTarget& target) {
  return s.HandlesDType(chain.dtype) && s.Applies(PlanInput(chain, target));
}

namespace {
// The same for an analyzed chain.
bool StrategyApplies(const Strategy& s, const PlanInput& in) {
  return s.HandlesDType(in.chain.dtype) && s.Applies(in);
}
}  // namespace

namespace {

// The strategy named `strategy` when non-empty (error if unknown or not applicable), else the
// applicable strategy of lowest cost.
absl::StatusOr<const Strategy*> ChooseStrategy(const Chain& chain, const PlanTarget& target,
                                               std::string_view strategy) {
  if (absl::Status s = CheckDTypeHasPlans(chain.dtype); !s.ok()) return s;
  const PlanInput in(chain, target);
  std::vector<std::string> applicable;
  const Strategy* best = nullptr;
  double best_cost = std::numeric_limits<double>::infinity();
  for (const auto& s : AllStrategies()) {
    if (!StrategyApplies(*s, in)) continue;
    applicable.emplace_back(s->name());
    if (!strategy.empty()) {
      if (s->name() == strategy) best = s.get();
      continue;
    }
    const double cost = s->Cost(in);
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
  return best;
}

}  // namespace

// The planner's reason: every applicable strategy's estimated cost, lowest first (the units are
// the cost models', about picoseconds on an H100; printed as microseconds).
std::string CostRanking(const Chain& chain, const PlanTarget& target) {
  const PlanInput in(chain, target);
  std::vector<std::pair<double, std::string>> costs;
  for (const auto& s : AllStrategies()) {
    if (StrategyApplies(*s, in)) costs.emplace_back(s->Cost(in), s->name());
  }
  std::stable_sort(costs.begin(), costs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> parts;
  for (const auto& [cost, name] : costs) parts.push_back(fmt::format("{} {:.0f}", name, cost / 1e6));
  return absl::StrCat("lowest estimated cost of the applicable strategies (model us): ",
                      absl::StrJoin(parts, ", "));
}

int64_t CostMicros(double cost) { return static_cast<int64_t>(std::lround(cost / 1e6)); }

double LowestCost(const Chain& chain, const PlanTarget& target) {
  const PlanInput in(chain, target);
  double best = std::numeric_limits<double>::infinity();
  for (const auto& s : AllStrategies()) {
    if (StrategyApplies(*s, in)) best = std::min(best, s->Cost(in));
  }
  return best;
}

absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              std::string_view strategy) {
  absl::StatusOr<const Strategy*> best = ChooseStrategy(chain, target, strategy);
  if (!best.ok()) return best.status();
  const PlanInput in(chain, target);
  absl::StatusOr<Plan> plan = (*best)->MakePlan(in);
  if (plan.ok()) {
    plan->tune_config = (*best)->DefaultConfig(in).ToString();
    plan->choice = strategy.empty() ? CostRanking(chain, target) : "asked for by name";
  }
  return plan;
}

// ---- tuning: the Strategy defaults (no tunable parameters) ----------------------------------

TuneConfig Strategy::DefaultConfig(const PlanInput&) const { return {std::string(name()), {}}; }

std::vector<TuneParam> Strategy::TuneSpace(const PlanInput&) const { return {}; }

absl::Status Strategy::Validate(const PlanInput&, const TuneConfig& config) const {
  if (config.strategy != name()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tune config ", config.ToString(), " is not for strategy ", std::string(name())));
  }
  if (!config.values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(), ": ",
                                                   std::string(name()), " has no tunable parameters"));
  }
  return absl::OkStatus();
}

std::vector<TuneConfig> Strategy::Candidates(const PlanInput& in) const {
  return EnumerateConfigs(DefaultConfig(in), TuneSpace(in),
                          [&](const TuneConfig& c) { return Validate(in, c).ok(); });
}

absl::StatusOr<Plan> Strategy::MakeTunedPlan(const PlanInput& in, const TuneConfig& config) const {
  if (absl::Status s = Validate(in, config); !s.ok()) return s;
  return Build(in, config);
}

absl::StatusOr<Plan> Strategy::MakePlan(const PlanInput& in) const {
  return MakeTunedPlan(in, DefaultConfig(in));
}

// ---- tuning: free functions ----------------------------------------------------------------

const Strategy* FindStrategy(std::string_view name) {
  for (const auto& s : AllStrategies()) {
    if (s->name() == name) return s.get();
  }
  return nullptr;
}

absl::Status ValidateConfig(const Chain& chain, const PlanTarget& target,
                            const TuneConfig& config) {
  if (absl::Status s = CheckDTypeHasPlans(chain.dtype); !s.ok()) return s;
  const Strategy* s = FindStrategy(config.strategy);
  if (s == nullptr || !StrategyApplies(*s, chain, target)) {
    std::vector<std::string> applicable;
    for (const auto& t : AllStrategies()) {
      if (StrategyApplies(*t, chain, target)) applicable.emplace_back(t->name());
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "tune config ", config.ToString(), ": strategy '", config.strategy, "' ",
        s == nullptr ? "does not exist" : "does not apply to this chain", "; applicable: ",
        absl::StrJoin(applicable, ", ")));
  }
  return s->Validate(PlanInput(chain, target), config);
}

absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              const TuneConfig& config) {
  if (absl::Status s = ValidateConfig(chain, target, config); !s.ok()) return s;
  absl::StatusOr<Plan> plan =
      FindStrategy(config.strategy)->MakeTunedPlan(PlanInput(chain, target), config);
  if (plan.ok()) {
    plan->tune_config = config.ToString();
    plan->choice = "this tuning configuration (given, or measured by fusejit autotune)";
  }
  return plan;
}

absl::StatusOr<TuneConfig> DefaultTuneConfig(const Chain& chain, const PlanTarget& target,
                                             std::string_view strategy) {
  absl::StatusOr<const Strategy*> best = ChooseStrategy(chain, target, strategy);
  if (!best.ok()) return best.status();
  return (*best)->DefaultConfig(PlanInput(chain, target));
}

std::vector<TuneConfig> AllCandidates(const Chain& chain, const PlanTarget& target) {
  if (!CheckDTypeHasPlans(chain.dtype).ok()) return {};
  absl::StatusOr<TuneConfig> planner_default = DefaultTuneConfig(chain, target);
  const PlanInput in(chain, target);
  std::vector<std::pair<int, TuneConfig>> ranked;
  for (const auto& s : AllStrategies()) {
    if (!StrategyApplies(*s, in)) continue;
    const TuneConfig def = s->DefaultConfig(in);
    const bool chosen = planner_default.ok() && def == *planner_default;
    for (TuneConfig& c : s->Candidates(in)) {
      const int distance = c.Distance(def) + (chosen ? 0 : 1);
      ranked.emplace_back(distance, std::move(c));
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TuneConfig> out;
  for (auto& [distance, c] : ranked) out.push_back(std::move(c));
  return out;
}

}  // namespace fusejit::codegen
