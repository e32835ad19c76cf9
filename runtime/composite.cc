#include "runtime/composite.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/bindings.h"

namespace fusejit::runtime {

absl::Status StepsBuilder::Add(std::string what, std::shared_ptr<CompiledChain> compiled,
                               const std::vector<std::pair<std::string, Step::Source>>& map) {
  Step step{std::move(what), std::move(compiled), {}};
  for (const TensorSpec& t : step.compiled->signature()) {
    auto it = std::find_if(map.begin(), map.end(),
                           [&](const auto& entry) { return entry.first == t.name; });
    Step::Source src;
    if (it != map.end()) {
      src = it->second;
    } else {
      src.tensor = IndexOf(*signature_, t.name);
      if (src.tensor < 0) {
        return absl::InternalError(
            absl::StrCat(step.what, ": its tensor ", t.name, " has no source in the composite"));
      }
    }
    // Bound to a tensor (not to a workspace region, which holds any type): the dtypes agree.
    if (src.tensor >= 0 && src.tensor < static_cast<int>(signature_->size())) {
      const TensorSpec& to = (*signature_)[src.tensor];
      if (to.role != TensorRole::kWorkspace && t.role != TensorRole::kWorkspace &&
          to.dtype != t.dtype) {
        return absl::InternalError(absl::StrCat(step.what, ": its ", DTypeName(t.dtype), " tensor ",
                                                t.name, " is bound to ", to.name, ", a ",
                                                DTypeName(to.dtype), " tensor"));
      }
    }
    step.sources.push_back(src);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

namespace {

class CompositeChain final : public CompiledChain {
 public:
  CompositeChain(CompositeInfo info, std::vector<Step> steps, std::vector<TensorSpec> signature)
      : info_(std::move(info)), steps_(std::move(steps)), signature_(std::move(signature)) {
    for (const Step& s : steps_) {
      const CompileStats& t = s.compiled->stats();
      stats_.plan_ms += t.plan_ms;
      stats_.codegen_ms += t.codegen_ms;
      stats_.nvrtc_ms += t.nvrtc_ms;
      if (stats_.source_path.empty()) stats_.source_path = t.source_path;
    }
    stats_.cache_hit = stats_.nvrtc_ms == 0;
    stats_.tune_origin = steps_.empty() ? "default"
                                        : steps_[info_.source_step].compiled->stats().tune_origin;
    for (const TensorSpec& t : signature_) {
      if (t.role == TensorRole::kWorkspace) workspace_bytes_ = t.bytes();
    }
  }

  const Chain& chain() const override { return info_.chain; }
  const std::string& arch() const override { return info_.arch; }
  const std::string& strategy() const override { return info_.strategy; }
  size_t cubin_bytes() const override {
    size_t n = 0;
    for (const Step& s : steps_) n += s.compiled->cubin_bytes();
    return n;
  }
  Shape output_shape() const override { return info_.output_shape; }
  const std::vector<TensorSpec>& signature() const override { return signature_; }
  std::vector<ParamSpec> params() const override { return ChainParams(info_.chain); }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  const CompileStats& stats() const override { return stats_; }
  const std::string& source() const override {
    return steps_[info_.source_step].compiled->source();
  }

  std::string Explain() const override {
    std::string s = info_.header;
    absl::StrAppend(&s, "tensors (bound by name):\n");
    for (absl::string_view line :
         absl::StrSplit(FormatSignature(signature_), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&s, "  ", line, "\n");
    }
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
  absl::Status Run(const Bindings& bindings, CUstream stream) override {
    if (!info_.forward) return ForwardOnly("Run");
    return RunNamed(bindings.Named(), stream);
  }
  absl::Status RunFirstKernels(const Bindings& bindings, CUstream stream, size_t count) override {
    if (!info_.forward) return ForwardOnly("RunFirstKernels");
    return RunFirstKernelsNamed(bindings.Named(), stream, count);
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
      return absl::InvalidArgumentError(absl::StrCat("RunFirstKernels: count ", count,
                                                     " exceeds the chain's ", kernel_count(),
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
        what, " binds a forward chain's fixed fields; this chain binds by name: use ",
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

  const CompositeInfo info_;
  const std::vector<Step> steps_;
  const std::vector<TensorSpec> signature_;
  CompileStats stats_;
  size_t workspace_bytes_ = 0;
};

}  // namespace

std::shared_ptr<CompiledChain> MakeComposite(CompositeInfo info, std::vector<Step> steps,
                                             std::vector<TensorSpec> signature) {
  return std::make_shared<CompositeChain>(std::move(info), std::move(steps), std::move(signature));
}

}  // namespace fusejit::runtime
