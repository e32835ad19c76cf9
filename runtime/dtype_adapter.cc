#include "runtime/dtype_adapter.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/cast_plan.h"
#include "codegen/planner.h"
#include "codegen/tune_config.h"
#include "fusejit/chain.h"
#include "runtime/bindings.h"
#include "runtime/composite.h"

namespace fusejit::runtime {
namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

bool IsRead(TensorRole role) {
  return role == TensorRole::kInput || role == TensorRole::kParam ||
         role == TensorRole::kGradOutput;
}

// A cast step's plan through the stages, or nothing when there are no casts.
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileCasts(const Chain& f32_chain,
                                                            const std::vector<codegen::Cast>& casts,
                                                            const Target& target,
                                                            const CompileOptions& options,
                                                            const std::string& what) {
  PlannedChain planned{f32_chain, target, codegen::PlanCasts(casts, target.plan_target, what), {}};
  planned.stats.tune_origin = "default";
  return BuildPlanned(std::move(planned), options);
}

}  // namespace

bool RunsThroughF32(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF16; }

absl::Status CheckDTypeCompiles(DType dtype) {
  if (RunsThroughF32(dtype)) return absl::OkStatus();
  return codegen::CheckDTypeHasPlans(dtype);
}

CompileOptions InnerOptions(const CompileOptions& options) {
  CompileOptions inner = options;
  inner.precision = Precision::kTf32;
  return inner;
}

Precision BackwardGemmPrecision(DType dtype, Precision caller) {
  return RunsThroughF32(dtype) ? Precision::kTf32 : caller;
}

Chain AsF32(const Chain& chain) {
  Chain c = chain;
  c.dtype = DType::kF32;
  return c;
}

bool RunsNatively(std::string_view f32_strategy, DType dtype) {
  const codegen::Strategy* strategy = codegen::FindStrategy(f32_strategy);
  return strategy != nullptr && strategy->HandlesDType(dtype);
}

double CastCost(const Chain& chain) {
  double elements = static_cast<double>(NumElements(chain.input) + NumElements(OutputShape(chain)));
  int kernels = 2;
  for (const ParamSpec& p : ChainParams(chain)) {
    elements += static_cast<double>(NumElements(p.shape));
    ++kernels;
  }
  constexpr double kBytesPerMicro = 3e6, kMicrosPerKernel = 2.0, kUnitsPerMicro = 1e6;
  return (6.0 * elements / kBytesPerMicro + kMicrosPerKernel * kernels) * kUnitsPerMicro;
}

bool RunsNativelyByCost(const Chain& chain, const codegen::PlanTarget& target,
                        std::string_view f32_strategy, std::string* why) {
  if (RunsNatively(f32_strategy, chain.dtype)) return true;
  const double native = codegen::LowestCost(chain, target);
  const double f32 = codegen::LowestCost(AsF32(chain), target);
  const double casts = CastCost(chain);
  if (!(native < f32 + casts)) return false;
  if (why != nullptr) {
    const auto micros = [](double units) { return static_cast<int64_t>(std::lround(units / 1e6)); };
    *why = absl::StrCat("its own plan, model us ", micros(native), ", below the f32 chain's plan (",
                        std::string(f32_strategy), ", ", micros(f32), ") between casts (",
                        micros(casts), ")");
  }
  return true;
}

absl::StatusOr<std::optional<PlannedChain>> PlanInItsDType(const Chain& chain, const Target& target,
                                                           const CompileOptions& options,
                                                           tune::TuningDb& tuning_db) {
  if (!RunsThroughF32(chain.dtype)) {
    absl::StatusOr<PlannedChain> planned = PlanChain(chain, target, options, tuning_db);
    if (!planned.ok()) return planned.status();
    return std::optional<PlannedChain>(*std::move(planned));
  }
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  // A named configuration names the strategy (and is checked against the chain it runs on: this
  // one when its strategy handles the dtype, else the f32 chain); otherwise the f32 chain's plan
  // picks it.
  std::string strategy_name, choice;
  bool by_cost = false;  // the f32 plan was chosen by the cost models (nothing named or tuned)
  if (!options.tune_config.empty()) {
    absl::StatusOr<codegen::TuneConfig> given = codegen::TuneConfig::Parse(options.tune_config);
    if (!given.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tune config ", options.tune_config, ": ", given.status().message()));
    }
    strategy_name = given->strategy;
    choice = "the configuration given";
  } else {
    absl::StatusOr<PlannedChain> f32 =
        PlanChain(AsF32(chain), target, InnerOptions(options), tuning_db);
    if (!f32.ok()) return f32.status();
    strategy_name = f32->plan.strategy;
    choice = absl::StrCat("the f32 chain's plan (", f32->plan.choice, ")");
    by_cost = options.strategy.empty() && f32->stats.tune_origin == "default";
  }
  std::string cost_note;
  if (by_cost ? !RunsNativelyByCost(chain, target.plan_target, strategy_name, &cost_note)
              : !RunsNatively(strategy_name, chain.dtype)) {
    return std::nullopt;
  }
  // The configuration is the dtype chain's own (a tuned one for this chain, else the default for
  // its precision: tc-conv and igemm multiply bf16/f16 in one 16-bit product and tile for that),
  // unless the caller named one.
  CompileOptions effective = options;
  std::string native_choice, native_note;
  if (options.strategy.empty() && options.tune_config.empty()) {
    native_note = cost_note.empty() ? absl::StrCat("; natively in ", DTypeName(chain.dtype), " (",
                                                   choice, " is ", strategy_name, ")")
                                    : absl::StrCat("; natively in ", DTypeName(chain.dtype), " (",
                                                   cost_note, ")");
  } else {
    effective.strategy = strategy_name;
    native_choice = absl::StrCat(choice, ", run natively in ", DTypeName(chain.dtype));
  }
  absl::StatusOr<PlannedChain> planned = PlanChain(chain, target, effective, tuning_db);
  if (!planned.ok()) return planned.status();
  if (!native_choice.empty()) planned->plan.choice = native_choice;
  planned->plan.choice += native_note;
  return std::optional<PlannedChain>(*std::move(planned));
}

absl::StatusOr<std::shared_ptr<CompiledChain>> AdaptDType(const Chain& chain,
                                                          std::shared_ptr<CompiledChain> inner,
                                                          bool forward, const Target& target,
                                                          const CompileOptions& options) {
  const DType dtype = chain.dtype;
  const Chain f32_chain = AsF32(chain);
  const std::vector<TensorSpec>& inner_sig = inner->signature();

  // The composite's signature: the f32 chain's tensors in the chain's dtype; workspace last.
  std::vector<TensorSpec> sig;
  std::vector<std::pair<std::string, Step::Source>> inner_map;  // inner tensor -> f32 copy
  std::vector<codegen::Cast> in_casts, out_casts;
  std::vector<size_t> copy_offsets;
  std::string layout;
  size_t offset = 0;
  // Bound as they are, without an f32 copy: the training forward's saved f32 tensors, and tensors
  // the inner chain reads in the chain's own dtype (a backward's grad_y).
  const auto as_is = [&](const TensorSpec& t) {
    return t.role == TensorRole::kSaved || t.dtype == dtype;
  };
  std::vector<std::string> read_as_is;
  for (const TensorSpec& t : inner_sig) {
    if (t.role == TensorRole::kWorkspace) continue;
    if (as_is(t)) {
      sig.push_back(t);
      if (t.role != TensorRole::kSaved) read_as_is.push_back(t.name);
      continue;
    }
    TensorSpec outer = t;
    outer.dtype = dtype;
    sig.push_back(outer);
    const int64_t elements = NumElements(t.shape);
    const std::string copy = absl::StrCat(t.name, ".f32");
    if (IsRead(t.role)) {
      in_casts.push_back({t.name, dtype, copy, DType::kF32, elements});
    } else {
      out_casts.push_back({copy, DType::kF32, t.name, dtype, elements});
    }
    copy_offsets.push_back(offset);
    absl::StrAppend(&layout, "  +", offset, " ", elements * 4, " bytes: ", copy, "\n");
    offset += Align256(static_cast<size_t>(elements) * 4);
  }
  const size_t inner_offset = offset;
  const size_t total = inner_offset + Align256(inner->workspace_bytes());
  absl::StrAppend(&layout, "  +", inner_offset, " ", inner->workspace_bytes(),
                  " bytes: the f32 chain's workspace\n");
  const int workspace = static_cast<int>(sig.size());
  sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                 {static_cast<int64_t>(total)}, 256});

  // Each tensor's f32 copy, by the copy's name and by the inner tensor's name.
  std::vector<std::pair<std::string, Step::Source>> copies;
  for (size_t i = 0, j = 0; i < inner_sig.size(); ++i) {
    const TensorSpec& t = inner_sig[i];
    if (t.role == TensorRole::kWorkspace) {
      inner_map.push_back({t.name, {workspace, inner_offset}});
      continue;
    }
    if (as_is(t)) {  // bound directly: no f32 copy
      inner_map.push_back({t.name, {IndexOf(sig, t.name), 0}});
      continue;
    }
    const Step::Source src{workspace, copy_offsets[j++]};
    copies.push_back({absl::StrCat(t.name, ".f32"), src});
    inner_map.push_back({t.name, src});
  }

  StepsBuilder builder(&sig);
  const std::string from = absl::StrCat(DTypeName(dtype), " to f32");
  if (!in_casts.empty()) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> casts =
        CompileCasts(f32_chain, in_casts, target, options, absl::StrCat("widen the inputs ", from));
    if (!casts.ok()) return casts.status();
    if (absl::Status s = builder.Add(absl::StrCat("widen every input to f32 (exact)"), *casts, copies);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = builder.Add(
          absl::StrCat("the f32 ", forward ? "chain" : "backward", ": ", FormatChain(f32_chain)),
          inner, inner_map);
      !s.ok()) {
    return s;
  }
  const int inner_step = static_cast<int>(builder.steps().size()) - 1;
  bool saved = false;
  for (const TensorSpec& t : inner_sig) saved |= t.role == TensorRole::kSaved;
  if (!out_casts.empty()) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> casts = CompileCasts(
        f32_chain, out_casts, target, options,
        absl::StrCat("round the outputs to ", DTypeName(dtype)));
    if (!casts.ok()) return casts.status();
    if (absl::Status s = builder.Add(absl::StrCat("round every output to ", DTypeName(dtype),
                                                  " (nearest even)"),
                                     *casts, copies);
        !s.ok()) {
      return s;
    }
  }

  CompositeInfo info;
  info.chain = chain;
  info.arch = target.plan_target.arch;
  info.strategy = inner->strategy();
  info.forward = forward;
  info.output_shape = inner->output_shape();
  info.source_step = inner_step;
  info.header = absl::StrCat(
      forward ? "chain: " : "backward of chain: ", FormatChain(chain), "\n", "arch: ", info.arch,
      "\n", "dtype ", DTypeName(dtype), ": the f32 ", forward ? "plan" : "backward",
      " between casts (inputs widened to f32 exactly; arithmetic and statistics in f32; outputs "
      "rounded to ",
      DTypeName(dtype), " once; ",
      forward
          ? absl::StrCat("the convolution of x and the weights on TF32 tensor cores, exact for ",
                         DTypeName(dtype), " operands")
          : "the precision of each convolution below",
      saved ? "; f32 saved tensors bound as the training forward wrote them" : "",
      read_as_is.empty() ? ""
                         : absl::StrCat("; ", absl::StrJoin(read_as_is, ", "), " read in ",
                                        DTypeName(dtype), " as it is, widened at each load"),
      ")\n", "workspace: ", total, " bytes\n", layout);
  return MakeComposite(std::move(info), std::move(builder.steps()), std::move(sig));
}

}  // namespace fusejit::runtime
