// runtime/backward.cc: fusejit::CompileBackward. A chain's backward is up to three compiled steps
// (codegen/backward_plan.h) run in order on the caller's stream, sharing one workspace:
//
//   step 1  recompute u = producer(x)            the forward plan of ProducerChain(chain)
//   step 2  grad_y -> grad_u, parameter grads    codegen::PlanBackward
//   step 3  grad_x = data gradient of grad_u     the forward plan of DataGradientChain(chain)
//
// Steps 1 and 3 are ordinary forward chains, so they get the planner's fastest convolution (the
// tensor-core engine where it applies) and the kernel cache like any chain. Workspace layout:
// [u][grad_u][scratch], scratch being the largest workspace any step needs (steps run one after
// another on one stream, so they share it).
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "cache/kernel_cache.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "fusejit/fusejit.h"
#include "runtime/bindings.h"
#include "runtime/stages.h"
#include "tune/tuning_db.h"

namespace fusejit {
namespace runtime {
namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One compiled step and where each tensor of its signature comes from.
struct Step {
  std::string what;
  std::shared_ptr<CompiledChain> compiled;
  struct Source {
    int tensor = -1;    // index into the backward signature
    size_t offset = 0;  // bytes added to its pointer (workspace regions)
  };
  std::vector<Source> sources;  // one per compiled->signature() tensor
};

class BackwardChainImpl final : public CompiledChain {
 public:
  BackwardChainImpl(Chain chain, std::string arch, std::vector<Step> steps,
                    std::vector<TensorSpec> signature, std::string layout)
      : chain_(std::move(chain)),
        arch_(std::move(arch)),
        steps_(std::move(steps)),
        signature_(std::move(signature)),
        layout_(std::move(layout)) {
    for (const Step& s : steps_) {
      const CompileStats& t = s.compiled->stats();
      stats_.plan_ms += t.plan_ms;
      stats_.codegen_ms += t.codegen_ms;
      stats_.nvrtc_ms += t.nvrtc_ms;
      if (stats_.source_path.empty()) stats_.source_path = t.source_path;
    }
    stats_.cache_hit = stats_.nvrtc_ms == 0;
    stats_.tune_origin = "default";
    for (size_t i = 0; i < signature_.size(); ++i) {
      if (signature_[i].role == TensorRole::kWorkspace) workspace_bytes_ = signature_[i].bytes();
    }
  }

  const Chain& chain() const override { return chain_; }
  const std::string& arch() const override { return arch_; }
  const std::string& strategy() const override { return strategy_; }
  size_t cubin_bytes() const override {
    size_t n = 0;
    for (const Step& s : steps_) n += s.compiled->cubin_bytes();
    return n;
  }
  Shape output_shape() const override { return chain_.input; }  // grad_x
  const std::vector<TensorSpec>& signature() const override { return signature_; }
  std::vector<ParamSpec> params() const override { return ChainParams(chain_); }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  const CompileStats& stats() const override { return stats_; }
  const std::string& source() const override {
    for (const Step& s : steps_) {
      if (s.compiled->strategy() == "backward") return s.compiled->source();
    }
    return steps_.front().compiled->source();
  }

  std::string Explain() const override {
    std::string s = absl::StrCat("backward of chain: ", FormatChain(chain_), "\n");
    absl::StrAppend(&s, "arch: ", arch_, "\n", "tensors (bound by name):\n");
    for (absl::string_view line :
         absl::StrSplit(FormatSignature(signature_), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&s, "  ", line, "\n");
    }
    absl::StrAppend(&s, "saved by the forward: nothing (the backward recomputes from x and the "
                        "parameters)\n", layout_);
    for (size_t i = 0; i < steps_.size(); ++i) {
      absl::StrAppend(&s, "step ", i + 1, ": ", steps_[i].what, "\n");
      for (absl::string_view line :
           absl::StrSplit(steps_[i].compiled->Explain(), '\n', absl::SkipEmpty())) {
        absl::StrAppend(&s, "  | ", line, "\n");
      }
    }
    return s;
  }

  absl::Status Load() override {
    for (const Step& s : steps_) {
      if (absl::Status st = s.compiled->Load(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  absl::Status Run(const Bindings&, CUstream) override { return ForwardOnly("Run"); }
  absl::Status RunFirstKernels(const Bindings&, CUstream, size_t) override {
    return ForwardOnly("RunFirstKernels");
  }
  absl::Status RunNamed(const NamedBindings& bindings, CUstream stream) override {
    return RunFirstKernelsNamed(bindings, stream, kernel_count());
  }
  absl::Status RunTensors(const CUdeviceptr* tensors, size_t count, CUstream stream) override {
    if (absl::Status s = CheckTensors(signature_, tensors, count); !s.ok()) return s;
    return Enqueue(tensors, stream, kernel_count());
  }
  absl::Status RunFirstKernelsNamed(const NamedBindings& bindings, CUstream stream,
                                    size_t count) override {
    if (count > kernel_count()) {
      return absl::InvalidArgumentError(absl::StrCat("RunFirstKernelsNamed: count ", count,
                                                     " exceeds the backward's ", kernel_count(),
                                                     " kernels"));
    }
    absl::StatusOr<std::vector<CUdeviceptr>> tensors = ResolveBindings(signature_, bindings);
    if (!tensors.ok()) return tensors.status();
    return Enqueue(tensors->data(), stream, count);
  }
  size_t kernel_count() const override {
    size_t n = 0;
    for (const Step& s : steps_) n += s.compiled->kernel_count();
    return n;
  }
  std::string kernel_name(size_t i) const override {
    for (const Step& s : steps_) {
      if (i < s.compiled->kernel_count()) return s.compiled->kernel_name(i);
      i -= s.compiled->kernel_count();
    }
    return "";
  }

 private:
  absl::Status ForwardOnly(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " binds a forward chain's fixed fields; a backward chain binds by name: use ",
        what == std::string_view("Run") ? "RunNamed" : "RunFirstKernelsNamed", " with ",
        Names(signature_)));
  }

  // Runs the steps (the first `count` kernels of them) with pointers in signature order.
  absl::Status Enqueue(const CUdeviceptr* tensors, CUstream stream, size_t count) {
    std::vector<CUdeviceptr> ptrs;
    for (const Step& s : steps_) {
      if (count == 0) break;
      ptrs.clear();
      for (const Step::Source& src : s.sources) {
        ptrs.push_back(src.tensor < 0 ? 0 : tensors[src.tensor] + src.offset);
      }
      const size_t n = std::min(count, s.compiled->kernel_count());
      absl::Status st =
          n == s.compiled->kernel_count()
              ? s.compiled->RunTensors(ptrs.data(), ptrs.size(), stream)
              : s.compiled->RunFirstKernelsNamed(NamedOf(s, ptrs), stream, n);
      if (!st.ok()) return absl::Status(st.code(), absl::StrCat(s.what, ": ", st.message()));
      count -= n;
    }
    return absl::OkStatus();
  }
  static NamedBindings NamedOf(const Step& s, const std::vector<CUdeviceptr>& ptrs) {
    NamedBindings named;
    const std::vector<TensorSpec>& sig = s.compiled->signature();
    for (size_t i = 0; i < sig.size(); ++i) named[sig[i].name] = ptrs[i];
    return named;
  }

  const Chain chain_;
  const std::string arch_;
  const std::string strategy_ = "backward";
  const std::vector<Step> steps_;
  const std::vector<TensorSpec> signature_;
  const std::string layout_;
  CompileStats stats_;
  size_t workspace_bytes_ = 0;
};

std::string DumpDir(const CompileOptions& options) {
  if (!options.dump_dir.empty()) return options.dump_dir;
  const char* env = std::getenv("FUSEJIT_DUMP_DIR");
  return env ? env : "";
}

// Step 2 through the stages (the forward steps go through fusejit::Compile).
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackwardPlan(const Chain& chain,
                                                                   const Target& target,
                                                                   const CompileOptions& options) {
  absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(chain, target.plan_target);
  if (!plan.ok()) return plan.status();
  PlannedChain planned{chain, target, *std::move(plan), {}};
  planned.stats.tune_origin = "default";
  const std::string dump_dir = DumpDir(options);
  EmittedChain emitted = EmitChain(&planned, /*want_ptx=*/!dump_dir.empty());
  cache::KernelCache& kernel_cache =
      options.kernel_cache != nullptr ? *options.kernel_cache : cache::KernelCache::Default();
  absl::StatusOr<std::string> cubin =
      BuildCubin(planned, emitted, options.use_cache && dump_dir.empty() ? &kernel_cache : nullptr,
                 dump_dir, &planned.stats);
  if (!cubin.ok()) return cubin.status();
  return MakeCompiled(std::move(planned), std::move(emitted), *std::move(cubin));
}

absl::Status Context(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

absl::StatusOr<std::shared_ptr<CompiledChain>> Build(const Chain& chain,
                                                     const CompileOptions& options) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  if (!options.strategy.empty() || !options.tune_config.empty()) {
    return absl::InvalidArgumentError(
        "CompileBackward: options.strategy and options.tune_config name forward plans; leave them "
        "empty (the backward plans its steps itself)");
  }
  if (chain.dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat("no backward plan for dtype ",
                                                 DTypeName(chain.dtype),
                                                 ": only f32 chains have one"));
  }
  absl::StatusOr<Target> target = ResolveTarget(options);
  if (!target.ok()) return target.status();
  const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
  const bool producer = info.producer != nullptr;

  // The backward signature; the workspace entry is appended once its size is known.
  std::vector<TensorSpec> sig = BackwardSignature(chain, 0);
  const int64_t u_bytes = NumElements(info.producer_shape) * 4;
  const size_t u_off = 0, gu_off = producer ? Align256(u_bytes) : 0;
  const size_t scratch_off = producer ? gu_off + Align256(u_bytes) : 0;
  const int workspace_index = static_cast<int>(sig.size());

  CompileOptions sub = options;  // the forward steps: the planner's choice
  std::vector<Step> steps;
  auto add_step = [&](std::string what, std::shared_ptr<CompiledChain> compiled,
                      const std::vector<std::pair<std::string, Step::Source>>& map) -> absl::Status {
    Step step{std::move(what), std::move(compiled), {}};
    for (const TensorSpec& t : step.compiled->signature()) {
      Step::Source src;
      bool found = false;
      for (const auto& [name, s] : map) {
        if (name == t.name) {
          src = s;
          found = true;
        }
      }
      if (!found) {
        src.tensor = IndexOf(sig, t.name);
        if (src.tensor < 0) {
          return absl::InternalError(absl::StrCat(step.what, ": its tensor ", t.name,
                                                  " has no source in the backward"));
        }
      }
      step.sources.push_back(src);
    }
    steps.push_back(std::move(step));
    return absl::OkStatus();
  };
  const Step::Source scratch{workspace_index, scratch_off};
  const Step::Source u{workspace_index, u_off};
  const Step::Source gu{workspace_index, gu_off};

  if (producer) {
    const Chain pc = codegen::ProducerChain(chain);
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(pc, sub);
    if (!c.ok()) return Context(c.status(), absl::StrCat("recomputing the producer (", FormatChain(pc), ")"));
    if (absl::Status s = add_step(absl::StrCat("recompute u, the producer's output: ", FormatChain(pc)),
                                  *c, {{std::string(kOutputName), u}, {std::string(kWorkspaceName), scratch}});
        !s.ok()) {
      return s;
    }
  }
  {
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = CompileBackwardPlan(chain, *target, options);
    if (!c.ok()) return Context(c.status(), "the backward kernels");
    std::vector<std::pair<std::string, Step::Source>> map = {{std::string(kWorkspaceName), scratch}};
    if (producer) {
      map.push_back({std::string(codegen::kProducerOutputName), u});
      map.push_back({std::string(codegen::kProducerGradName), gu});
    }
    if (absl::Status s = add_step(producer ? "grad_y -> grad_u (the producer output's gradient) "
                                             "and the parameter gradients"
                                           : "grad_y -> grad_x and the parameter gradients",
                                  *c, map);
        !s.ok()) {
      return s;
    }
  }
  if (producer) {
    absl::StatusOr<Chain> dc = codegen::DataGradientChain(chain);
    if (!dc.ok()) return dc.status();
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(*dc, sub);
    if (!c.ok()) return Context(c.status(), absl::StrCat("the data gradient (", FormatChain(*dc), ")"));
    if (absl::Status s = add_step(absl::StrCat("grad_x = the convolution's data gradient: ",
                                               FormatChain(*dc), " on grad_u"),
                                  *c, {{std::string(kInputName), gu},
                                       {std::string(kOutputName), {IndexOf(sig, kGradInputName), 0}},
                                       {std::string(kWorkspaceName), scratch}});
        !s.ok()) {
      return s;
    }
  }
  size_t scratch_bytes = 0;
  for (const Step& s : steps) scratch_bytes = std::max(scratch_bytes, s.compiled->workspace_bytes());
  const size_t total = scratch_off + Align256(scratch_bytes);
  std::string layout = absl::StrCat("workspace: ", total, " bytes\n");
  if (producer) {
    absl::StrAppend(&layout, "  +", u_off, " ", u_bytes, " bytes: u (the producer's output)\n",
                    "  +", gu_off, " ", u_bytes, " bytes: grad_u\n");
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
  return std::shared_ptr<CompiledChain>(std::make_shared<BackwardChainImpl>(
      chain, target->plan_target.arch, std::move(steps), std::move(sig), std::move(layout)));
}

}  // namespace
}  // namespace runtime

absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackward(const Chain& chain,
                                                               const CompileOptions& options) {
  // The forward steps are cached by Compile; this caches the assembled backward by everything its
  // steps depend on.
  struct Memory {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::shared_ptr<CompiledChain>> entries ABSL_GUARDED_BY(mu);
  };
  static auto* memory = new Memory();
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  if (!target.ok()) return target.status();
  const std::string key = absl::StrCat(
      ValidateChain(chain).ok() ? FormatChain(chain) : "", "|", target->plan_target.arch, "|",
      target->plan_target.sm_count, "|", static_cast<int>(options.precision), "|",
      runtime::DumpDir(options), "|", target->device.name, "|", target->device.driver_version, "|",
      options.use_tuning, "|", reinterpret_cast<uintptr_t>(options.kernel_cache), "|",
      reinterpret_cast<uintptr_t>(options.tuning_db));
  if (options.use_cache && options.strategy.empty() && options.tune_config.empty()) {
    absl::MutexLock lock(&memory->mu);
    auto it = memory->entries.find(key);
    if (it != memory->entries.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<CompiledChain>> built = runtime::Build(chain, options);
  if (!built.ok() || !options.use_cache) return built;
  absl::MutexLock lock(&memory->mu);
  auto [it, inserted] = memory->entries.emplace(key, *built);
  return it->second;
}

}  // namespace fusejit
