// runtime/backward.cc: fusejit::CompileBackward. A chain's backward is up to three compiled steps
// (codegen/backward_plan.h) run in order on the caller's stream, sharing one workspace:
//
//   step 1  recompute u = producer(x)            the forward plan of ProducerChain(chain)
//   step 2  grad_y -> grad_u, parameter grads    codegen::PlanBackward
//   step 3  grad_x = data gradient of grad_u     the forward plan of DataGradientChain(chain)
//   step 4  (only where step 3's output is larger than x: conv_transpose3d with output_padding
//           >= stride) grad_x = the leading box of step 3's output    codegen::PlanCrop
//
// A convolution with few input channels (conv_transpose3d; conv3d with stride 1) gets step 2's
// fused form, which writes grad_x itself
// (codegen::BackwardPlanWritesGradX): no grad_u tensor, no steps 3 and 4.
//
// Steps 1 and 3 are ordinary forward chains, so they get the planner's fastest convolution (the
// tensor-core engine where it applies) and the kernel cache like any chain; step 3's plan reads
// the per-block maxima of |grad_u| that step 2 writes where it scales grad_u by its largest
// magnitude (codegen::ReadInputMaxima). Workspace layout: [u][grad_u][max|grad_u| per block][step
// 3's output, when cropped][scratch], scratch being the largest workspace any step needs (steps
// run one after another on one stream, so they share it).
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "cache/kernel_cache.h"
#include "codegen/backward_plan.h"
#include "codegen/cast_plan.h"
#include "codegen/chain_info.h"
#include "fusejit/fusejit.h"
#include "runtime/bindings.h"
#include "runtime/composite.h"
#include "runtime/dtype_adapter.h"
#include "runtime/stages.h"
#include "runtime/training.h"
#include "tune/tuning_db.h"

namespace fusejit {
namespace runtime {
namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Step 2 through the stages (the forward steps go through fusejit::Compile).
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackwardPlan(const Chain& chain,
                                                                   const Target& target,
                                                                   const CompileOptions& options,
                                                                   codegen::Plan plan) {
  PlannedChain planned{chain, target, std::move(plan), {}};
  planned.stats.tune_origin = "default";
  return BuildPlanned(std::move(planned), options);
}

// Step 3, the forward plan of the data-gradient chain `dc` on grad_u: the planner's, reading step
// 2's `maxima` per-block maxima of |grad_u| where it scales grad_u by its largest magnitude
// (codegen::ReadInputMaxima: no pass over grad_u for it).
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileDataGradient(const Chain& dc,
                                                                   const Target& target,
                                                                   const CompileOptions& options,
                                                                   int64_t maxima) {
  tune::TuningDb& tuning_db =
      options.tuning_db != nullptr ? *options.tuning_db : tune::TuningDb::Default();
  absl::StatusOr<PlannedChain> planned = PlanChain(dc, target, options, tuning_db);
  if (!planned.ok()) return planned.status();
  if (maxima < 1 || !codegen::CanReadInputMaxima(planned->plan)) return Compile(dc, options);
  if (absl::Status s = codegen::ReadInputMaxima(dc, &planned->plan, maxima); !s.ok()) return s;
  return BuildPlanned(*std::move(planned), options);
}

// from_saved: u is the signature's kSaved tensor (CompileTrainingForward wrote it), not step 1's.
// saved_by: what the training forward saved where another chain's forward (the bf16/f16 chain
// of this f32 one) decided it; null: this chain's (TrainingForwardSavedWithU).
// gemm_precision: the precision of the gradients' convolutions (step 2's weight gradient, step
// 3), where it differs from the caller's (bf16 chains: BackwardGemmPrecision); step 1's recompute
// of u keeps options.precision.
absl::StatusOr<std::shared_ptr<CompiledChain>> Build(
    const Chain& chain, const CompileOptions& options, bool from_saved,
    const SavedWithU* saved_by = nullptr, std::optional<Precision> gemm_precision = std::nullopt,
    DType grad_y_dtype = DType::kF32) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  if (!options.strategy.empty() || !options.tune_config.empty()) {
    return absl::InvalidArgumentError(
        "CompileBackward: options.strategy and options.tune_config name forward plans; leave them "
        "empty (the backward plans its steps itself)");
  }
  absl::StatusOr<Target> target = ResolveTarget(options);
  if (!target.ok()) return target.status();
  // What this chain's training forward saved (bf16, f16: only from its own plan, which a tuned
  // configuration of another strategy may not be).
  const SavedWithU saved = !from_saved ? SavedWithU{}
                           : saved_by != nullptr
                               ? *saved_by
                               : TrainingForwardSavedWithU(chain, *target, options);
  if (from_saved && saved_by == nullptr) {
    const SaveDecision d = DecideSave(chain, target->plan_target);
    const std::string why = !d.saves ? d.why
                            : RunsThroughF32(chain.dtype) && !saved.fused
                                ? "its tuned forward plan cannot write u"
                                : "";
    if (!why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CompileBackwardFromSaved: the training forward of ", FormatChain(chain),
                       " saves nothing (", why, "); use CompileBackward, which recomputes"));
    }
  }
  // bf16, f16 without a convolution: the backward kernels read and write the dtype themselves
  // (codegen::BackwardRunsNatively); grad_y in the chain's dtype too.
  if (codegen::BackwardRunsNatively(chain)) grad_y_dtype = chain.dtype;
  if (RunsThroughF32(chain.dtype) && !codegen::BackwardRunsNatively(chain)) {
    // bf16, f16 with a convolution: the f32 backward between casts
    // from_saved: reading what the dtype chain's own forward plan saved, in f32. grad_y is read
    // in the chain's dtype as it is (no f32 copy: it is as large as y).
    absl::StatusOr<std::shared_ptr<CompiledChain>> inner =
        Build(AsF32(chain), options, from_saved, from_saved ? &saved : nullptr,
              BackwardGemmPrecision(chain.dtype, options.precision), chain.dtype);
    if (!inner.ok()) return inner.status();
    return AdaptDType(chain, *std::move(inner), /*forward=*/false, *target, options);
  }
  if (chain.dtype == DType::kF64) {
    return absl::UnimplementedError(
        "no backward plan for f64 chains (their forward runs: the generic plans in double); "
        "dtypes with a backward: f32, bf16, f16");
  }
  const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
  const bool producer = info.producer != nullptr;
  // What the training forward saved with u (`saved`, above), and how it laid u out.
  const bool saved_stats = saved.stats;
  const codegen::ULayout u_layout = saved.u_layout;
  // The gradients' convolutions at gemm_precision (step 1 keeps the caller's).
  const Precision grad_precision = gemm_precision.value_or(options.precision);
  Target grad_target = *target;
  grad_target.plan_target.precision = grad_precision;
  absl::StatusOr<codegen::Plan> step2 = codegen::PlanBackward(
      chain, grad_target.plan_target, saved_stats, u_layout, saved.moment_blocks, grad_y_dtype);
  if (!step2.ok()) return WithContext(step2.status(), "the backward kernels");
  // Step 2 writes grad_x itself (the fused few-input-channel form): no grad_u, no step 3.
  const bool data_step = producer && !codegen::BackwardPlanWritesGradX(chain, *step2);
  absl::StatusOr<Chain> data_grad = data_step ? codegen::DataGradientChain(chain) : Chain{};
  if (!data_grad.ok()) return data_grad.status();
  // Step 3 on a grid larger than x (conv_transpose3d with output_padding >= stride): its output
  // goes to a workspace region, cropped into grad_x by step 4.
  const Shape full_grad_x = data_step ? OutputShape(*data_grad) : chain.input;
  const bool cropped = full_grad_x != chain.input;

  // The backward signature; the workspace entry is appended once its size is known.
  std::vector<TensorSpec> sig = BackwardSignature(chain, 0);
  sig[IndexOf(sig, kGradOutputName)].dtype = grad_y_dtype;
  if (from_saved) {  // u (and stats) after grad_y
    const std::vector<TensorSpec> specs =
        codegen::SavedTensorSpecs(chain, u_layout, saved_stats, saved.moment_blocks);
    sig.insert(sig.begin() + IndexOf(sig, kGradOutputName) + 1, specs.begin(), specs.end());
  }
  const int64_t u_bytes = NumElements(info.producer_shape) * 4;
  const int64_t full_bytes = cropped ? NumElements(full_grad_x) * 4 : 0;
  // Step 2 writes max|grad_u| per block with grad_u (codegen::kProducerGradMaximaName).
  int64_t gu_maxima = 0;
  for (const TensorSpec& t : step2->signature) {
    if (t.name == codegen::kProducerGradMaximaName) gu_maxima = t.shape[0];
  }
  const size_t u_off = 0, gu_off = producer && !from_saved ? Align256(u_bytes) : 0;
  const size_t gmax_off = data_step ? gu_off + Align256(u_bytes) : gu_off;
  const size_t full_off = gmax_off + Align256(gu_maxima * 4);
  const size_t scratch_off = full_off + Align256(full_bytes);
  const int workspace_index = static_cast<int>(sig.size());

  CompileOptions sub = options;  // the forward steps: the planner's choice
  CompileOptions grad_sub = options;  // step 3
  grad_sub.precision = grad_precision;
  StepsBuilder builder(&sig);
  auto add_step = [&](std::string what, std::shared_ptr<CompiledChain> compiled,
                      const std::vector<std::pair<std::string, Step::Source>>& map) {
    return builder.Add(std::move(what), std::move(compiled), map);
  };
  const Step::Source scratch{workspace_index, scratch_off};
  const Step::Source u = from_saved ? Step::Source{IndexOf(sig, codegen::kProducerOutputName), 0}
                                    : Step::Source{workspace_index, u_off};
  const Step::Source gu{workspace_index, gu_off};
  const Step::Source gmax{workspace_index, gmax_off};
  const Step::Source grad_x{IndexOf(sig, kGradInputName), 0};
  const Step::Source full{workspace_index, full_off};

  if (producer && !from_saved) {
    const Chain pc = codegen::ProducerChain(chain);
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(pc, sub);
    if (!c.ok()) return WithContext(c.status(), absl::StrCat("recomputing the producer (", FormatChain(pc), ")"));
    if (absl::Status s = add_step(absl::StrCat("recompute u, the producer's output: ", FormatChain(pc)),
                                  *c, {{std::string(kOutputName), u}, {std::string(kWorkspaceName), scratch}});
        !s.ok()) {
      return s;
    }
  }
  {
    absl::StatusOr<std::shared_ptr<CompiledChain>> c =
        CompileBackwardPlan(chain, grad_target, grad_sub, *std::move(step2));
    if (!c.ok()) return WithContext(c.status(), "the backward kernels");
    std::vector<std::pair<std::string, Step::Source>> map = {{std::string(kWorkspaceName), scratch}};
    if (producer) map.push_back({std::string(codegen::kProducerOutputName), u});
    if (data_step) map.push_back({std::string(codegen::kProducerGradName), gu});
    if (gu_maxima > 0) map.push_back({std::string(codegen::kProducerGradMaximaName), gmax});
    for (std::string_view name : {codegen::kSavedStatsName, codegen::kSavedMomentsName}) {
      if (IndexOf(sig, name) >= 0) map.push_back({std::string(name), {IndexOf(sig, name), 0}});
    }
    if (absl::Status s = add_step(data_step ? "grad_y -> grad_u (the producer output's gradient) "
                                              "and the parameter gradients"
                                            : "grad_y -> grad_x and the parameter gradients",
                                  *c, map);
        !s.ok()) {
      return s;
    }
  }
  if (data_step) {
    const Chain& dc = *data_grad;
    absl::StatusOr<std::shared_ptr<CompiledChain>> c =
        CompileDataGradient(dc, grad_target, grad_sub, gu_maxima);
    if (!c.ok()) return WithContext(c.status(), absl::StrCat("the data gradient (", FormatChain(dc), ")"));
    std::vector<std::pair<std::string, Step::Source>> map = {
        {std::string(kInputName), gu},
        {std::string(kOutputName), cropped ? full : grad_x},
        {std::string(kWorkspaceName), scratch}};
    for (const TensorSpec& t : (*c)->signature()) {
      if (t.name == codegen::kInputMaximaName) map.push_back({t.name, gmax});
    }
    if (absl::Status s = add_step(
            cropped ? absl::StrCat("the convolution's data gradient on a grid larger than x: ",
                                   FormatChain(dc), " on grad_u")
                    : absl::StrCat("grad_x = the convolution's data gradient: ", FormatChain(dc),
                                   " on grad_u"),
            *c, map);
        !s.ok()) {
      return s;
    }
  }
  if (cropped) {
    PlannedChain planned{*data_grad, *target,
                         codegen::PlanCrop("full", full_grad_x, "cropped", chain.input,
                                           DType::kF32, target->plan_target),
                         {}};
    planned.stats.tune_origin = "default";
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = BuildPlanned(std::move(planned), options);
    if (!c.ok()) return WithContext(c.status(), "cropping the data gradient");
    if (absl::Status s = add_step(absl::StrCat("grad_x = the leading ", FormatShape(chain.input),
                                               " box of the data gradient's ",
                                               FormatShape(full_grad_x)),
                                  *c, {{"full", full}, {"cropped", grad_x}});
        !s.ok()) {
      return s;
    }
  }
  std::vector<Step>& steps = builder.steps();
  size_t scratch_bytes = 0;
  for (const Step& s : steps) scratch_bytes = std::max(scratch_bytes, s.compiled->workspace_bytes());
  const size_t total = scratch_off + Align256(scratch_bytes);
  std::string layout = absl::StrCat("workspace: ", total, " bytes\n");
  if (producer && !from_saved) {
    absl::StrAppend(&layout, "  +", u_off, " ", u_bytes, " bytes: u (the producer's output)\n");
  }
  if (data_step) absl::StrAppend(&layout, "  +", gu_off, " ", u_bytes, " bytes: grad_u\n");
  if (gu_maxima > 0) {
    absl::StrAppend(&layout, "  +", gmax_off, " ", gu_maxima * 4, " bytes: max|grad_u| per block (",
                    gu_maxima, ")\n");
  }
  if (cropped) {
    absl::StrAppend(&layout, "  +", full_off, " ", full_bytes,
                    " bytes: the data gradient on its larger grid ", FormatShape(full_grad_x),
                    "\n");
  }
  absl::StrAppend(&layout, "  +", scratch_off, " ", scratch_bytes,
                  " bytes: scratch (the largest step workspace)\n");
  if (total > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(total)}, 256});
  } else {
    // No workspace: drop the steps' references to it (their workspaces are all empty).
    for (Step& s : steps) {
      for (Step::Source& src : s.sources) {
        if (src.tensor == workspace_index) src.tensor = -1;
      }
    }
  }
  CompositeInfo composite;
  composite.chain = chain;
  composite.arch = target->plan_target.arch;
  composite.strategy = from_saved ? "backward-from-saved" : "backward";
  composite.header = absl::StrCat(
      "backward of chain: ", FormatChain(chain), "\n", "arch: ", composite.arch, "\n",
      from_saved
          ? absl::StrCat("saved by the forward: u, the producer's output (", u_bytes, " bytes",
                         saved_stats ? ") and the group statistics (mean, "
                                       "rstd; not recomputed from u"
                                     : "",
                         saved.moment_blocks > 0 ? ") and the channel moments (grad_y's sums "
                                                   "without a pass over u"
                                                 : "",
                         ", CompileTrainingForward)\n")
          : std::string("saved by the forward: nothing (the backward "
                        "recomputes from x and the parameters)\n"),
      grad_precision != options.precision
          ? "the gradients' convolutions (weight and data gradient): TF32 class (each operand "
            "rounded to 11 significant bits, products exact, fp32 sums; the recompute of u "
            "keeps the caller's precision)\n"
          : "",
      layout);
  composite.output_shape = chain.input;  // grad_x
  composite.source_step = producer && !from_saved ? 1 : 0;  // the backward kernels'
  return MakeComposite(std::move(composite), std::move(steps), std::move(sig));
}

}  // namespace
}  // namespace runtime

namespace {
absl::StatusOr<std::shared_ptr<CompiledChain>> CachedBackward(const Chain& chain,
                                                              const CompileOptions& options,
                                                              bool from_saved) {
  // The forward steps are cached by Compile; this caches the assembled backward by everything its
  // steps depend on.
  struct Memory {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::shared_ptr<CompiledChain>> entries ABSL_GUARDED_BY(mu);
  };
  static auto* memory = new Memory();
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  if (!target.ok()) return target.status();
  const std::string key =
      absl::StrCat(ValidateChain(chain).ok() ? FormatChain(chain) : "", "|", from_saved, "|",
                   target->plan_target.arch, "|", target->plan_target.sm_count, "|",
                   static_cast<int>(options.precision), "|", runtime::DumpDir(options), "|",
                   target->device.name, "|", target->device.driver_version, "|", options.use_tuning,
                   "|", reinterpret_cast<uintptr_t>(options.kernel_cache), "|",
                   reinterpret_cast<uintptr_t>(options.tuning_db));
  if (options.use_cache && options.strategy.empty() && options.tune_config.empty()) {
    absl::MutexLock lock(&memory->mu);
    auto it = memory->entries.find(key);
    if (it != memory->entries.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<CompiledChain>> built = runtime::Build(chain, options, from_saved);
  if (!built.ok() || !options.use_cache) return built;
  absl::MutexLock lock(&memory->mu);
  auto [it, inserted] = memory->entries.emplace(key, *built);
  return it->second;
}
}  // namespace

absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackward(const Chain& chain,
                                                               const CompileOptions& options) {
  return CachedBackward(chain, options, /*from_saved=*/false);
}

absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackwardFromSaved(
    const Chain& chain, const CompileOptions& options) {
  return CachedBackward(chain, options, /*from_saved=*/true);
}

}  // namespace fusejit
