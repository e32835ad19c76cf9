// runtime/training.cc: fusejit::CompileTrainingForward -- a forward that also writes u, the
// convolution's output (a tensor of the signature), so that CompileBackwardFromSaved
// (runtime/backward.cc) reads u instead of recomputing the convolution. Either the chain's own
// fused plan storing u on the side (codegen::SaveProducerOutput, where its strategy can), or a
// composite of two forward chains: the producer alone writing u, then the ops after it reading u
// and writing y (workspace: the larger of the two steps', shared: they run one after the other
// on one stream).
#include "runtime/training.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "runtime/bindings.h"
#include "runtime/composite.h"
#include "runtime/dtype_adapter.h"
#include "runtime/stages.h"
#include "tune/tuning_db.h"

namespace fusejit {
namespace runtime {

namespace {

// The untuned plan Compile runs a bf16/f16 `chain` with natively (PlanInItsDType's choice by the
// cost models alone: the f32 chain planned for the same target, its precision included);
// FailedPrecondition where it runs through its f32 plan between casts.
absl::StatusOr<codegen::Plan> NativeDTypePlan(const Chain& chain,
                                              const codegen::PlanTarget& target) {
  absl::StatusOr<codegen::Plan> f32 = codegen::MakePlan(AsF32(chain), target);
  if (!f32.ok()) return f32.status();
  if (!RunsNativelyByCost(chain, target, f32->strategy)) {
    return absl::FailedPreconditionError("runs through its f32 plan");
  }
  return codegen::MakePlan(chain, target);
}

}  // namespace

SaveDecision DecideSave(const Chain& chain, const codegen::PlanTarget& target) {
  SaveDecision d;
  if (!ValidateChain(chain).ok()) return d;
  if (chain.dtype != DType::kF32 && !RunsThroughF32(chain.dtype)) {
    d.why = absl::StrCat("no backward for ", DTypeName(chain.dtype), " chains");
    return d;
  }
  const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
  if (info.producer == nullptr) {
    d.why = "no convolution: nothing to recompute";
    return d;
  }
  if (info.producer_index + 1 >= static_cast<int>(chain.ops.size())) {
    d.why = "the convolution is the last op: its output is y";
    return d;
  }
  // bf16, f16: only the dtype's own plan writing u (f32: the f32 backward between casts reads
  // it), where Compile runs the chain natively (NativeDTypePlan); there is no two-step form (the
  // producer chain's output would be u rounded to the dtype).
  const bool native = RunsThroughF32(chain.dtype);
  absl::StatusOr<codegen::Plan> plan =
      native ? NativeDTypePlan(chain, target) : codegen::MakePlan(chain, target);
  // The cost models' units are about picoseconds; printed as microseconds (as the planner does).
  if (plan.ok() && codegen::CanSaveProducerOutput(*plan)) {
    const double write = static_cast<double>(codegen::SavedProducerOutputSpec(chain).bytes()) / 3.0;
    // The backward recomputes u in f32, at the caller's precision.
    const double recompute = codegen::LowestCost(AsF32(codegen::ProducerChain(chain)), target);
    d.fused = true;
    d.saves = write < recompute;
    char costs[200];
    std::snprintf(costs, sizeof(costs),
                  "the fused forward (%s) can also write u: writing it costs %.1f model us, the "
                  "backward's recompute of the convolution %.1f",
                  plan->strategy.c_str(), write / 1e6, recompute / 1e6);
    d.why = absl::StrCat(
        costs, d.saves ? ": saving u costs less" : ": recomputing u in the backward is cheaper");
    return d;
  }
  if (native) {
    d.why = absl::StrCat(DTypeName(chain.dtype),
                         " chains save u only from their own plan writing it (f32), and ",
                         plan.ok() ? absl::StrCat("the ", plan->strategy, " plan cannot")
                                   : "it runs through its f32 plan between casts");
    return d;
  }
  const double fused = codegen::LowestCost(chain, target);
  const double tail = codegen::LowestCost(codegen::TailChain(chain), target);
  d.saves = tail < fused;
  char costs[160];
  std::snprintf(costs, sizeof(costs),
                "the ops after the convolution from u cost %.1f model us, the fused forward %.1f",
                tail / 1e6, fused / 1e6);
  d.why = absl::StrCat(costs, d.saves ? ": saving u spares the backward its recompute for less"
                                      : ": recomputing u in the backward is cheaper");
  return d;
}

namespace {

// The layout of u where `plan`, the chain's fused forward plan, saves it.
codegen::ULayout ULayoutOf(const Chain& chain, const Target& target, const codegen::Plan& plan) {
  return codegen::CanSaveURowsByChannel(plan) &&
                 codegen::BackwardReadsURowsByChannel(AsF32(chain), target.plan_target,
                                                      codegen::CanSaveStats(chain, plan))
             ? codegen::ULayout::kRowsByChannel
             : codegen::ULayout::kNCDHW;
}

}  // namespace

namespace {
// The target of a plan that also writes u for the backward (codegen::PlanTarget::keeps_u).
Target KeepingU(Target target) {
  target.plan_target.keeps_u = true;
  return target;
}
}  // namespace

SavedWithU TrainingForwardSavedWithU(const Chain& chain, const Target& target,
                                     const CompileOptions& options) {
  const SaveDecision d = DecideSave(chain, target.plan_target);
  if (!d.saves || !d.fused) return {};
  tune::TuningDb& tuning_db =
      options.tuning_db != nullptr ? *options.tuning_db : tune::TuningDb::Default();
  absl::StatusOr<std::optional<PlannedChain>> planned =
      PlanInItsDType(chain, KeepingU(target), options, tuning_db);
  if (!planned.ok() || !planned->has_value() || !codegen::CanSaveProducerOutput((*planned)->plan)) {
    return {};
  }
  const codegen::Plan& plan = (*planned)->plan;
  return {true, codegen::CanSaveStats(chain, plan), codegen::SavableMomentBlocks(chain, plan),
          ULayoutOf(chain, target, plan)};
}

namespace {

// The chain's own forward plan writing u on the side; FailedPrecondition where the plan chosen
// (a tuned configuration may name another strategy) cannot.
absl::StatusOr<std::shared_ptr<CompiledChain>> BuildFusedTrainingForward(
    const Chain& chain, const Target& target, const CompileOptions& options,
    const std::string& why) {
  tune::TuningDb& tuning_db =
      options.tuning_db != nullptr ? *options.tuning_db : tune::TuningDb::Default();
  absl::StatusOr<std::optional<PlannedChain>> in_dtype =
      PlanInItsDType(chain, KeepingU(target), options, tuning_db);
  if (!in_dtype.ok()) return in_dtype.status();
  if (!in_dtype->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        FormatChain(chain), " runs through its f32 plan between casts, which does not write u"));
  }
  std::optional<PlannedChain>& planned = *in_dtype;
  const bool stats = codegen::CanSaveStats(chain, planned->plan);  // before binding its slot
  const int moment_blocks = codegen::SavableMomentBlocks(chain, planned->plan);
  const codegen::ULayout layout = ULayoutOf(chain, target, planned->plan);
  if (absl::Status s = codegen::SaveProducerOutput(chain, &planned->plan, layout); !s.ok()) {
    return s;
  }
  const size_t u_bytes = codegen::SavedProducerOutputSpec(chain).bytes();
  absl::StrAppend(&planned->plan.choice,
                  "; training forward, saves for the backward: u, the "
                  "convolution's output (",
                  u_bytes, " bytes",
                  stats ? absl::StrCat(") and the group statistics (",
                                       codegen::SavedStatsSpec(chain).bytes(), " bytes")
                        : std::string(),
                  moment_blocks > 0
                      ? absl::StrCat(") and its per-block channel moments (",
                                     codegen::SavedMomentsSpec(chain, moment_blocks).bytes(),
                                     " bytes: the backward's sums of grad_y come from them")
                      : std::string(),
                  ", held until CompileBackwardFromSaved reads them), written by this plan: ", why);
  return BuildPlanned(*std::move(planned), options);
}

absl::StatusOr<std::shared_ptr<CompiledChain>> BuildTrainingForward(const Chain& chain,
                                                                    const CompileOptions& options,
                                                                    const std::string& why) {
  const Chain producer = codegen::ProducerChain(chain);
  const Chain tail = codegen::TailChain(chain);
  absl::StatusOr<std::shared_ptr<CompiledChain>> first = Compile(producer, options);
  if (!first.ok())
    return WithContext(first.status(), absl::StrCat("the producer (", FormatChain(producer), ")"));
  absl::StatusOr<std::shared_ptr<CompiledChain>> second = Compile(tail, options);
  if (!second.ok())
    return WithContext(second.status(), absl::StrCat("the ops after it (", FormatChain(tail), ")"));

  // x, the parameters, y, u, the workspace.
  std::vector<TensorSpec> sig = ForwardSignature(chain, 0);
  sig.push_back(codegen::SavedProducerOutputSpec(chain));
  const size_t ws_bytes = std::max((*first)->workspace_bytes(), (*second)->workspace_bytes());
  if (ws_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName),
                   TensorRole::kWorkspace,
                   DType::kF32,
                   {static_cast<int64_t>(ws_bytes)},
                   256});
  }
  const int ws = ws_bytes > 0 ? IndexOf(sig, kWorkspaceName) : -1;
  const Step::Source u{IndexOf(sig, codegen::kProducerOutputName), 0};
  StepsBuilder builder(&sig);
  if (absl::Status s =
          builder.Add(absl::StrCat("u = the producer's output: ", FormatChain(producer)), *first,
                      {{std::string(kOutputName), u}, {std::string(kWorkspaceName), {ws, 0}}});
      !s.ok()) {
    return s;
  }
  // The tail's parameters are the chain's after the producer, in the same order.
  std::vector<std::pair<std::string, Step::Source>> map = {{std::string(kInputName), u},
                                                           {std::string(kWorkspaceName), {ws, 0}}};
  const std::vector<ParamSpec> tail_params = ChainParams(tail);
  const std::vector<ParamSpec> all_params = ChainParams(chain);
  const size_t skip = all_params.size() - tail_params.size();
  for (size_t i = 0; i < tail_params.size(); ++i) {
    map.push_back({tail_params[i].name, {IndexOf(sig, all_params[skip + i].name), 0}});
  }
  if (absl::Status s = builder.Add(
          absl::StrCat("y = the ops after it, from u: ", FormatChain(tail)), *second, map);
      !s.ok()) {
    return s;
  }
  const size_t u_bytes = codegen::SavedProducerOutputSpec(chain).bytes();
  CompositeInfo info;
  info.chain = chain;
  info.arch = (*first)->arch();
  info.strategy = "training-forward";
  info.header =
      absl::StrCat("training forward of chain: ", FormatChain(chain), "\n", "arch: ", info.arch,
                   "\n", "saves for the backward: u, the producer's output (", u_bytes,
                   " bytes, held until CompileBackwardFromSaved reads it): ", why, "\n",
                   "workspace: ", ws_bytes, " bytes (shared by the two steps)\n");
  info.output_shape = OutputShape(chain);
  info.source_step = 0;
  return MakeComposite(std::move(info), std::move(builder.steps()), std::move(sig));
}

}  // namespace
}  // namespace runtime

bool TrainingForwardSaves(const Chain& chain, const CompileOptions& options) {
  if (!ValidateChain(chain).ok()) return false;
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  return target.ok() && runtime::DecideSave(chain, target->plan_target).saves;
}

absl::StatusOr<std::shared_ptr<CompiledChain>> CompileTrainingForward(
    const Chain& chain, const CompileOptions& options) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  if (!target.ok()) return target.status();
  const runtime::SaveDecision d = runtime::DecideSave(chain, target->plan_target);
  if (!d.saves) return Compile(chain, options);
  if (!options.strategy.empty() || !options.tune_config.empty()) {
    return absl::InvalidArgumentError(
        "CompileTrainingForward: options.strategy and options.tune_config name one forward plan; "
        "a training forward that saves u chooses its own (its plan writing u, or two plans: leave "
        "them empty)");
  }
  if (d.fused) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> fused =
        runtime::BuildFusedTrainingForward(chain, *target, options, d.why);
    if (fused.ok() || fused.status().code() != absl::StatusCode::kFailedPrecondition) return fused;
  }
  // bf16, f16 save only from their own plan (DecideSave): where the plan chosen cannot (a tuned
  // configuration of another strategy), Compile's forward; the backward then recomputes
  // (TrainingForwardSavedWithU says so to CompileBackwardFromSaved).
  if (runtime::RunsThroughF32(chain.dtype)) return Compile(chain, options);
  return runtime::BuildTrainingForward(chain, options, d.why);
}

}  // namespace fusejit
