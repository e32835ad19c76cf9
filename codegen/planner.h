// codegen/planner.h: strategies turn a chain into a Plan; the planner picks one.
//
// A Strategy has a small contract (after MIOpen's solvers), every method asked about one
// PlanInput (the chain, analyzed once, and the target): Applies() says whether it can run a chain
// at all, Cost() ranks the applicable ones (a heuristic estimate in arbitrary units, lower is
// better), Build() makes the plan of a configuration. The planner takes the strategy named in the
// options, or the applicable one of lowest cost.
//
// Tuning: a strategy may have tunable parameters (TuneSpace), a heuristic DefaultConfig (what
// MakePlan builds), and a Validate that checks a configuration in C++ before anything is compiled
// (so no template static_assert can fire); MakeTunedPlan builds any valid configuration. The plan
// choice itself is tunable: AllCandidates() spans every applicable strategy.
#ifndef FUSEJIT_CODEGEN_PLANNER_H_
#define FUSEJIT_CODEGEN_PLANNER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/chain_info.h"
#include "codegen/plan.h"
#include "codegen/tune_config.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"

namespace fusejit::codegen {

// What a plan may depend on besides the chain.
struct PlanTarget {
  std::string arch;  // "sm_90"
  int sm_count = 132;  // used for grid sizing; the H100's count when the device is unknown
  Precision precision = Precision::kFp32;
  // The plan also writes u, the convolution's output, for a backward (a training forward): u is
  // then summed as accurately as an f32 chain's (in `precision`) even where the chain's own
  // output is rounded to 8 or 11 bits, since the backward's derivatives of kinked ops (relu,
  // hardswish, clamp) at u turn small errors in u into large ones in the gradients.
  bool keeps_u = false;
};

// What every Strategy method is asked about: a valid chain, the target, and the chain's analysis
// (AnalyzeChain, done once here rather than in every method). Not copyable: `info` points into
// `chain`.
struct PlanInput {
  PlanInput(Chain chain, PlanTarget target);
  PlanInput(const PlanInput&) = delete;
  PlanInput& operator=(const PlanInput&) = delete;

  const Chain chain;
  const PlanTarget target;
  const ChainInfo info;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  // Whether its kernels read and write tensors of `dtype` themselves (f32 for most; the generic
  // strategies also bf16 and f16, converting at their loads and stores).
  virtual bool HandlesDType(DType dtype) const { return dtype == DType::kF32; }
  // REQUIRES (of callers): HandlesDType(in.chain.dtype); StrategyApplies checks both.
  virtual bool Applies(const PlanInput& in) const = 0;
  // Every method below REQUIRES Applies(in).
  virtual double Cost(const PlanInput& in) const = 0;

  // Tuning. A strategy without tunable parameters keeps these defaults: its only configuration is
  // TuneConfig{name(), {}}.
  //
  // The heuristic configuration, the one MakePlan(in) builds; Validate() accepts it.
  virtual TuneConfig DefaultConfig(const PlanInput& in) const;
  // Each parameter and the values worth trying, in the configuration's parameter order.
  virtual std::vector<TuneParam> TuneSpace(const PlanInput& in) const;
  // OK when `config` is this strategy's, names its parameters in order, and passes the checks the
  // templates would make at compile time (shared memory, divisibility) and the register and grid
  // limits; InvalidArgument naming the failed check otherwise.
  virtual absl::Status Validate(const PlanInput& in, const TuneConfig& config) const;

  // The valid configurations of TuneSpace() (EnumerateConfigs): DefaultConfig() first, then by
  // how many parameters differ from it.
  std::vector<TuneConfig> Candidates(const PlanInput& in) const;
  // The plan for `config`: Validate()'s error when it is not valid, else Build().
  absl::StatusOr<Plan> MakeTunedPlan(const PlanInput& in, const TuneConfig& config) const;
  // The plan of DefaultConfig().
  absl::StatusOr<Plan> MakePlan(const PlanInput& in) const;

 protected:
  // The plan for a valid configuration. REQUIRES: Validate(in, config).ok().
  virtual absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const = 0;
};

// OK when some strategy has plans for chains of `dtype`; else Unimplemented naming the dtypes that
// have. Every planning entry point below checks it first.
absl::Status CheckDTypeHasPlans(DType dtype);

// s.HandlesDType(chain.dtype) && s.Applies(chain, target): what every planning entry point asks.
bool StrategyApplies(const Strategy& s, const Chain& chain, const PlanTarget& target);

// Every strategy, in a fixed order.
const std::vector<std::unique_ptr<Strategy>>& AllStrategies();

// The plan for `chain`: by the strategy named `strategy` when non-empty (error if unknown or not
// applicable, listing the ones that are), else the applicable strategy of lowest cost.
// REQUIRES: chain is valid.
absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              std::string_view strategy = "");

// The lowest estimated cost of the strategies applicable to `chain` (the cost models' units,
// about picoseconds on an H100; what MakePlan ranks by), infinity when none applies. Comparable
// across chains on the same target: runtime/training.cc weighs a chain against its parts with it.
// REQUIRES: chain is valid.
double LowestCost(const Chain& chain, const PlanTarget& target);

// A cost in those units as whole microseconds (explain's "model us").
int64_t CostMicros(double cost);

// The strategy named `name`, or nullptr.
const Strategy* FindStrategy(std::string_view name);

// OK when config's strategy exists and applies to the chain and the strategy's Validate() accepts
// the configuration; otherwise an error naming which (listing the applicable strategies).
absl::Status ValidateConfig(const Chain& chain, const PlanTarget& target, const TuneConfig& config);

// The plan for exactly `config`; ValidateConfig()'s error when it is not valid.
absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target,
                              const TuneConfig& config);

// The configuration MakePlan(chain, target, strategy) builds: the chosen strategy's default.
absl::StatusOr<TuneConfig> DefaultTuneConfig(const Chain& chain, const PlanTarget& target,
                                             std::string_view strategy = "");

// Every applicable strategy's Candidates(): the planner's default first; then, ordered by how far
// each is from its own strategy's default (another strategy counting one step), the rest. Every
// entry passes ValidateConfig().
std::vector<TuneConfig> AllCandidates(const Chain& chain, const PlanTarget& target);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_PLANNER_H_
