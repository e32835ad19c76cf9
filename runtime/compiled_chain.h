// runtime/compiled_chain.h: the loaded, launchable form of a compiled chain (the implementation
// behind fusejit::CompiledChain; made by runtime::MakeCompiled, runtime/stages.h).
#ifndef FUSEJIT_RUNTIME_COMPILED_CHAIN_H_
#define FUSEJIT_RUNTIME_COMPILED_CHAIN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "codegen/plan.h"
#include "fusejit/fusejit.h"
#include "jit/driver.h"
#include "jit/module.h"

namespace fusejit::runtime {

class CompiledChainImpl final : public CompiledChain {
 public:
  // REQUIRES: `cubin` was compiled from the source emitted for (chain, plan) for `arch`.
  CompiledChainImpl(Chain chain, codegen::Plan plan, std::string arch, std::string source,
                    std::string cubin, CompileStats stats);

  const Chain& chain() const override { return chain_; }
  const std::string& arch() const override { return arch_; }
  const std::string& strategy() const override { return plan_.strategy; }
  size_t cubin_bytes() const override { return cubin_.size(); }
  Shape output_shape() const override { return OutputShape(chain_); }
  const std::vector<TensorSpec>& signature() const override { return signature_; }
  std::vector<ParamSpec> params() const override { return ChainParams(chain_); }
  size_t workspace_bytes() const override { return plan_.workspace_bytes; }
  const CompileStats& stats() const override { return stats_; }
  std::string Explain() const override;
  const std::string& source() const override { return source_; }
  const codegen::Plan& plan() const { return plan_; }
  const std::string& cubin() const { return cubin_; }

  absl::Status Load() override;
  absl::Status Run(const Bindings& bindings, CUstream stream) override {
    return RunFirstKernels(bindings, stream, plan_.kernels.size());
  }
  absl::Status RunNamed(const NamedBindings& bindings, CUstream stream) override;
  absl::Status RunTensors(const CUdeviceptr* tensors, size_t count, CUstream stream) override;
  size_t kernel_count() const override { return plan_.kernels.size(); }
  std::string kernel_name(size_t i) const override {
    return i < plan_.kernels.size() ? plan_.kernels[i].symbol : std::string();
  }
  absl::Status RunFirstKernels(const Bindings& bindings, CUstream stream, size_t count) override;
  absl::Status RunFirstKernelsNamed(const NamedBindings& bindings, CUstream stream,
                                    size_t count) override;

 private:
  // The module and resolved symbols in one CUDA context.
  struct Loaded {
    std::unique_ptr<jit::LoadedModule> module;
    std::vector<CUfunction> functions;  // one per plan kernel
    std::vector<CUdeviceptr> constants;  // one per plan constant copy
  };
  absl::StatusOr<const Loaded*> LoadedForCurrentContext();
  // Enqueues the first `count` kernels with pointers from Resolve().
  absl::Status Enqueue(const CUdeviceptr* tensors, CUstream stream, size_t count);

  const Chain chain_;
  const codegen::Plan plan_;
  const std::string arch_;
  const std::string source_;
  const std::string cubin_;
  const CompileStats stats_;
  const std::vector<TensorSpec> signature_;
  jit::LaunchOptions launch_options_;  // programmatic dependent launch on sm_90+
  // For each kernel's each argument: the signature index it binds (-1: a null pointer), plus a
  // byte offset (workspace regions). Derived once from plan_ and signature_.
  struct ArgSource {
    int tensor = -1;
    size_t offset = 0;
  };
  std::vector<std::vector<ArgSource>> arg_sources_;
  std::vector<int> constant_sources_;  // signature index of each plan constant copy's param

  absl::Mutex mu_;
  absl::flat_hash_map<CUcontext, std::unique_ptr<Loaded>> loaded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_COMPILED_CHAIN_H_
