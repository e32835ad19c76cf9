#include "runtime/tap_gemm.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "runtime/bindings.h"
#include "runtime/composite.h"

namespace fusejit::runtime {
namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The options of the composite's inner chains: the caller's, without the strategy or
// configuration that named tap-gemm.
CompileOptions Inner(const CompileOptions& options) {
  CompileOptions inner = options;
  inner.strategy.clear();
  inner.tune_config.clear();
  return inner;
}

// "3.weight" of the tail chain as the whole chain's name: op index + `shift`.
std::string ShiftedName(const std::string& name, int shift) {
  const size_t dot = name.find('.');
  return absl::StrCat(std::stoi(name.substr(0, dot)) + shift, name.substr(dot));
}

}  // namespace

absl::StatusOr<std::optional<std::string>> ChooseTapGemm(const Chain& chain, const Target& target,
                                                         const CompileOptions& options,
                                                         const PlannedChain* planned) {
  const bool named = options.strategy == codegen::kTapGemmStrategy;
  // A tuned configuration of the chain's own plan does not keep it: the tuner times the planner's
  // strategies, not this composite, and a chain where tap-gemm wins by 1.2-5x (BENCHMARKS.md,
  // thirtieth session) would get slower for having been tuned.
  if (!named && (!options.strategy.empty() || !options.tune_config.empty() || planned == nullptr ||
                 chain.dtype != DType::kF32)) {
    return std::optional<std::string>();
  }
  std::string why_not;
  const std::optional<codegen::TapGemm> split = codegen::SplitTapGemm(chain, &why_not);
  if (!split.has_value()) {
    if (named) return absl::InvalidArgumentError(absl::StrCat("strategy tap-gemm: ", why_not));
    return std::optional<std::string>();
  }
  if (named) {
    return std::optional<std::string>(
        absl::StrCat("asked for by name (model us ",
                     codegen::CostMicros(codegen::TapGemmCost(chain, *split, target.plan_target)),
                     ")"));
  }
  return codegen::TapGemmBeatsOwnPlan(chain, *split, target.plan_target, planned->plan.strategy,
                                      codegen::LowestCost(chain, target.plan_target));
}

absl::StatusOr<std::shared_ptr<CompiledChain>> CompileTapGemm(const Chain& chain,
                                                              const Target& target,
                                                              const CompileOptions& options,
                                                              const std::string& why) {
  const std::optional<codegen::TapGemm> split = codegen::SplitTapGemm(chain);
  if (!split.has_value()) return absl::InternalError("CompileTapGemm: the chain has no split");
  const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
  const bool has_rest = !split->rest.ops.empty();
  const CompileOptions inner = Inner(options);

  absl::StatusOr<std::shared_ptr<CompiledChain>> gemm = Compile(split->gemm, inner);
  if (!gemm.ok()) return WithContext(gemm.status(), "tap-gemm's GEMM");
  std::shared_ptr<CompiledChain> rest;
  if (has_rest) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> r = Compile(split->rest, inner);
    if (!r.ok()) return WithContext(r.status(), "tap-gemm's later ops");
    rest = *std::move(r);
  }

  // The workspace: W', Z, u (the convolution's output, when later ops read it), the GEMM's and
  // the later ops' workspaces.
  size_t offset = 0;
  std::string layout;
  const auto region = [&](const std::string& what, size_t bytes) {
    const size_t at = offset;
    absl::StrAppend(&layout, "  +", at, " ", bytes, " bytes: ", what, "\n");
    offset += Align256(bytes);
    return at;
  };
  const size_t w_at = region("W' [C x taps][Cin]", split->weight_bytes);
  const size_t z_at = region("Z [N][C x taps][input points]", split->z_bytes);
  const size_t u_at = has_rest ? region("u, the convolution's output", split->conv_bytes) : 0;
  const size_t gemm_ws = region("the GEMM's workspace", (*gemm)->workspace_bytes());
  const size_t rest_ws = has_rest ? region("the later ops' workspace", rest->workspace_bytes()) : 0;
  std::vector<TensorSpec> sig = ForwardSignature(chain, offset);
  const int ws = IndexOf(sig, kWorkspaceName);

  StepsBuilder builder(&sig);
  PlannedChain weight{
      chain,
      target,
      codegen::PlanTapWeight(chain, *split, info.weight_param, "w_taps", target.plan_target),
      {}};
  weight.stats.tune_origin = "default";
  absl::StatusOr<std::shared_ptr<CompiledChain>> weight_step =
      BuildPlanned(std::move(weight), options);
  if (!weight_step.ok()) return WithContext(weight_step.status(), "tap-gemm's weight");
  if (absl::Status s = builder.Add("W' from the weight", *weight_step, {{"w_taps", {ws, w_at}}});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = builder.Add(absl::StrCat("Z: ", FormatChain(split->gemm)), *gemm,
                                   {{"0.weight", {ws, w_at}},
                                    {"y", {ws, z_at}},
                                    {std::string(kWorkspaceName), {ws, gemm_ws}}});
      !s.ok()) {
    return s;
  }
  const int gemm_step = static_cast<int>(builder.steps().size()) - 1;
  PlannedChain gather{chain,
                      target,
                      codegen::PlanTapGather(chain, *split, "z", info.bias_param,
                                             has_rest ? "u" : "y", target.plan_target),
                      {}};
  gather.stats.tune_origin = "default";
  absl::StatusOr<std::shared_ptr<CompiledChain>> gather_step =
      BuildPlanned(std::move(gather), options);
  if (!gather_step.ok()) return WithContext(gather_step.status(), "tap-gemm's gather");
  std::vector<std::pair<std::string, Step::Source>> gather_map = {{"z", {ws, z_at}}};
  if (has_rest) gather_map.push_back({"u", {ws, u_at}});
  if (absl::Status s = builder.Add("the convolution's output from Z, its taps summed in order",
                                   *gather_step, gather_map);
      !s.ok()) {
    return s;
  }
  if (has_rest) {
    std::vector<std::pair<std::string, Step::Source>> rest_map = {
        {"x", {ws, u_at}}, {std::string(kWorkspaceName), {ws, rest_ws}}};
    for (const ParamSpec& p : ChainParams(split->rest)) {
      const std::string outer = ShiftedName(p.name, info.producer_index + 1);
      rest_map.push_back({p.name, {IndexOf(sig, outer), 0}});
    }
    if (absl::Status s =
            builder.Add(absl::StrCat("the later ops: ", FormatChain(split->rest)), rest, rest_map);
        !s.ok()) {
      return s;
    }
  }

  CompositeInfo ci;
  ci.chain = chain;
  ci.arch = target.plan_target.arch;
  ci.strategy = std::string(codegen::kTapGemmStrategy);
  ci.forward = true;
  ci.output_shape = OutputShape(chain);
  ci.source_step = gemm_step;
  ci.header = absl::StrCat("chain: ", FormatChain(chain), "\narch: ", ci.arch,
                           "\nstrategy: tap-gemm, the convolution as a dense GEMM per tap (Z = x "
                           "times W', ",
                           split->taps, " taps) and a gather\nwhy this plan: ", why,
                           "\nworkspace: ", offset, " bytes\n", layout);
  return MakeComposite(std::move(ci), std::move(builder.steps()), std::move(sig));
}

}  // namespace fusejit::runtime
