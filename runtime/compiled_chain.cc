#include "runtime/compiled_chain.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fusejit {

NamedBindings Bindings::Named() const {
  NamedBindings named(params.begin(), params.end());
  named[std::string(kInputName)] = input;
  named[std::string(kOutputName)] = output;
  if (workspace) named[std::string(kWorkspaceName)] = workspace;
  return named;
}

namespace runtime {

namespace {

int IndexOf(const std::vector<TensorSpec>& signature, std::string_view name) {
  for (size_t i = 0; i < signature.size(); ++i) {
    if (signature[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Names(const std::vector<TensorSpec>& signature) {
  std::vector<std::string> names;
  for (const TensorSpec& t : signature) names.push_back(t.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

CompiledChainImpl::CompiledChainImpl(Chain chain, codegen::Plan plan, std::string arch,
                                     std::string source, std::string cubin, CompileStats stats)
    : chain_(std::move(chain)),
      plan_(std::move(plan)),
      arch_(std::move(arch)),
      source_(std::move(source)),
      cubin_(std::move(cubin)),
      stats_(std::move(stats)),
      signature_(ForwardSignature(chain_, plan_.workspace_bytes)) {
  const int workspace = IndexOf(signature_, kWorkspaceName);
  for (const codegen::KernelLaunch& k : plan_.kernels) {
    std::vector<ArgSource>& sources = arg_sources_.emplace_back();
    for (const codegen::KernelArg& arg : k.args) {
      ArgSource& a = sources.emplace_back();
      switch (arg.kind) {
        case codegen::KernelArg::Kind::kInput: a.tensor = IndexOf(signature_, kInputName); break;
        case codegen::KernelArg::Kind::kOutput: a.tensor = IndexOf(signature_, kOutputName); break;
        case codegen::KernelArg::Kind::kParam:
          a.tensor = arg.param.empty() ? -1 : IndexOf(signature_, arg.param);
          break;
        case codegen::KernelArg::Kind::kWorkspace:
          a.tensor = workspace;
          a.offset = arg.offset;
          break;
      }
    }
  }
  for (const codegen::ConstantCopy& c : plan_.constant_copies) {
    constant_sources_.push_back(IndexOf(signature_, c.param));
  }
}

std::string CompiledChainImpl::Explain() const {
  std::string s = absl::StrCat("chain: ", FormatChain(chain_), "\n");
  absl::StrAppend(&s, "output: ", FormatShape(OutputShape(chain_)), "\n");
  absl::StrAppend(&s, "arch: ", arch_, "\n");
  std::vector<std::string> params;
  for (const TensorSpec& t : signature_) {
    if (t.role == TensorRole::kParam) params.push_back(t.name + FormatShape(t.shape));
  }
  absl::StrAppend(&s, "parameters: ", params.empty() ? "(none)" : absl::StrJoin(params, " "), "\n");
  absl::StrAppend(&s, "tensors (bound by name):\n");
  for (absl::string_view line : absl::StrSplit(FormatSignature(signature_), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&s, "  ", line, "\n");
  }
  if (!plan_.choice.empty()) absl::StrAppend(&s, "why this plan: ", plan_.choice, "\n");
  absl::StrAppend(&s, codegen::ExplainPlan(plan_));
  absl::StrAppend(&s, "source: ",
                  stats_.source_path.empty()
                      ? "not dumped (set FUSEJIT_DUMP_DIR or --dump DIR to write it)"
                      : stats_.source_path,
                  "\n");
  return s;
}

absl::StatusOr<const CompiledChainImpl::Loaded*> CompiledChainImpl::LoadedForCurrentContext() {
  absl::StatusOr<const jit::DriverApi*> driver = jit::Driver();
  if (!driver.ok()) return driver.status();
  CUcontext ctx = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR((*driver)->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) {
    return absl::FailedPreconditionError(
        "no current CUDA context: make one current (e.g. cuDevicePrimaryCtxRetain + "
        "cuCtxSetCurrent, or any CUDA runtime call) before running a chain");
  }
  absl::MutexLock lock(&mu_);
  auto it = loaded_.find(ctx);
  if (it != loaded_.end()) return it->second.get();

  auto loaded = std::make_unique<Loaded>();
  absl::StatusOr<std::unique_ptr<jit::LoadedModule>> module = jit::LoadedModule::Load(cubin_);
  if (!module.ok()) {
    return absl::Status(module.status().code(),
                        absl::StrCat("loading the ", arch_, " module of ", FormatChain(chain_),
                                     ": ", module.status().message()));
  }
  loaded->module = *std::move(module);
  for (const codegen::KernelLaunch& k : plan_.kernels) {
    absl::StatusOr<CUfunction> f = loaded->module->Function(k.symbol);
    if (!f.ok()) return f.status();
    loaded->functions.push_back(*f);
  }
  for (const codegen::ConstantCopy& c : plan_.constant_copies) {
    absl::StatusOr<CUdeviceptr> p = loaded->module->Global(c.symbol, c.bytes);
    if (!p.ok()) return p.status();
    loaded->constants.push_back(*p);
  }
  const Loaded* result = loaded.get();
  loaded_.emplace(ctx, std::move(loaded));
  return result;
}

absl::Status CompiledChainImpl::Load() { return LoadedForCurrentContext().status(); }

absl::StatusOr<std::vector<CUdeviceptr>> CompiledChainImpl::Resolve(
    const NamedBindings& bindings) const {
  std::vector<CUdeviceptr> tensors(signature_.size(), 0);
  std::vector<bool> bound(signature_.size(), false);
  for (const auto& [name, ptr] : bindings) {
    const int i = IndexOf(signature_, name);
    if (i < 0 && name == kWorkspaceName) continue;  // a workspace for a plan that needs none
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bindings: unknown tensor '", name,
                                                     "'; this chain binds ", Names(signature_)));
    }
    tensors[i] = ptr;
    bound[i] = true;
  }
  if (absl::Status s = CheckPointers(tensors.data(), &bound); !s.ok()) return s;
  return tensors;
}

absl::Status CompiledChainImpl::CheckPointers(const CUdeviceptr* tensors,
                                              const std::vector<bool>* bound) const {
  for (size_t i = 0; i < signature_.size(); ++i) {
    const TensorSpec& t = signature_[i];
    if (tensors[i] && tensors[i] % t.alignment == 0) continue;
    const std::string what =
        t.role == TensorRole::kWorkspace
            ? absl::StrCat(t.name, " (", t.bytes(),
                           " bytes; CompiledChain::workspace_bytes(), fusejit::Workspace::Allocate "
                           "allocates it)")
            : absl::StrCat(t.name, " (", TensorRoleName(t.role), ") ", DTypeName(t.dtype),
                           FormatShape(t.shape));
    if (!tensors[i]) {
      const bool missing = bound != nullptr && !(*bound)[i];
      return absl::InvalidArgumentError(
          absl::StrCat("bindings: ", what, missing ? " is missing" : " is null"));
    }
    return absl::InvalidArgumentError(absl::StrCat("bindings: ", what, " must be ", t.alignment,
                                                   "-byte aligned (as cuMemAlloc returns it)"));
  }
  return absl::OkStatus();
}

absl::Status CompiledChainImpl::RunTensors(const CUdeviceptr* tensors, size_t count,
                                           CUstream stream) {
  if (count != signature_.size() || (count > 0 && tensors == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("RunTensors: ", count, " pointers for the ",
                                                   signature_.size(), " tensors of the signature (",
                                                   Names(signature_), ")"));
  }
  if (absl::Status s = CheckPointers(tensors, nullptr); !s.ok()) return s;
  return Enqueue(tensors, stream, plan_.kernels.size());
}

absl::Status CompiledChainImpl::RunNamed(const NamedBindings& bindings, CUstream stream) {
  absl::StatusOr<std::vector<CUdeviceptr>> tensors = Resolve(bindings);
  if (!tensors.ok()) return tensors.status();
  return Enqueue(tensors->data(), stream, plan_.kernels.size());
}

absl::Status CompiledChainImpl::RunFirstKernels(const Bindings& bindings, CUstream stream,
                                                size_t count) {
  if (count > plan_.kernels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RunFirstKernels: count ", count,
                                                   " exceeds the plan's ", plan_.kernels.size(),
                                                   " kernels"));
  }
  absl::StatusOr<std::vector<CUdeviceptr>> tensors = Resolve(bindings.Named());
  if (!tensors.ok()) return tensors.status();
  return Enqueue(tensors->data(), stream, count);
}

absl::Status CompiledChainImpl::Enqueue(const CUdeviceptr* tensors, CUstream stream,
                                        size_t count) {
  absl::StatusOr<const Loaded*> loaded = LoadedForCurrentContext();
  if (!loaded.ok()) return loaded.status();
  const jit::DriverApi* driver = *jit::Driver();

  for (size_t i = 0; i < plan_.constant_copies.size(); ++i) {
    const codegen::ConstantCopy& c = plan_.constant_copies[i];
    FUSEJIT_CU_RETURN_IF_ERROR(
        driver->cuMemcpyDtoDAsync((*loaded)->constants[i], tensors[constant_sources_[i]], c.bytes,
                                  stream),
        absl::StrCat("copying ", c.param, " to __constant__ ", c.symbol));
  }
  std::vector<CUdeviceptr> values;
  std::vector<void*> args;
  for (size_t i = 0; i < count; ++i) {
    const codegen::KernelLaunch& k = plan_.kernels[i];
    const std::vector<ArgSource>& sources = arg_sources_[i];
    values.assign(k.args.size(), 0);
    args.assign(k.args.size(), nullptr);
    for (size_t a = 0; a < k.args.size(); ++a) {
      if (sources[a].tensor >= 0) values[a] = tensors[sources[a].tensor] + sources[a].offset;
      args[a] = &values[a];
    }
    if (absl::Status s = jit::Launch((*loaded)->functions[i], k.grid, k.block, k.shared_bytes,
                                     stream, args.data());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("launching ", k.symbol, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace runtime
}  // namespace fusejit
