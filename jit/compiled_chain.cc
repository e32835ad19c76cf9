#include "jit/compiled_chain.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusejit::jit {

CompiledChainImpl::CompiledChainImpl(Chain chain, codegen::Plan plan, std::string arch,
                                     std::string source, std::string cubin, CompileStats stats)
    : chain_(std::move(chain)),
      plan_(std::move(plan)),
      arch_(std::move(arch)),
      source_(std::move(source)),
      cubin_(std::move(cubin)),
      stats_(std::move(stats)),
      params_(ChainParams(chain_)) {}

std::string CompiledChainImpl::Explain() const {
  std::string s = absl::StrCat("chain: ", FormatChain(chain_), "\n");
  absl::StrAppend(&s, "output: ", FormatShape(OutputShape(chain_)), "\n");
  absl::StrAppend(&s, "arch: ", arch_, "\n");
  std::vector<std::string> params;
  for (const ParamSpec& p : params_) params.push_back(p.name + FormatShape(p.shape));
  absl::StrAppend(&s, "parameters: ", params.empty() ? "(none)" : absl::StrJoin(params, " "), "\n");
  absl::StrAppend(&s, codegen::ExplainPlan(plan_));
  absl::StrAppend(&s, "source: ",
                  stats_.source_path.empty()
                      ? "not dumped (set FUSEJIT_DUMP_DIR or --dump DIR to write it)"
                      : stats_.source_path,
                  "\n");
  return s;
}

absl::StatusOr<const CompiledChainImpl::Loaded*> CompiledChainImpl::LoadedForCurrentContext() {
  absl::StatusOr<const DriverApi*> driver = Driver();
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
  absl::StatusOr<std::unique_ptr<LoadedModule>> module = LoadedModule::Load(cubin_);
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

absl::Status CompiledChainImpl::CheckBindings(const Bindings& b) const {
  if (!b.input) return absl::InvalidArgumentError("bindings: input (x) is null");
  if (!b.output) return absl::InvalidArgumentError("bindings: output (y) is null");
  if (plan_.workspace_bytes > 0 && !b.workspace) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bindings: workspace is null but this plan needs ", plan_.workspace_bytes,
        " bytes (CompiledChain::workspace_bytes(); fusejit::Workspace::Allocate allocates it)"));
  }
  if (b.workspace % 256 != 0) {
    return absl::InvalidArgumentError("bindings: workspace must be 256-byte aligned");
  }
  // Kernels use 16-byte vector loads and stores; cuMemAlloc and every CUDA allocator give 256.
  if (b.input % 16 != 0 || b.output % 16 != 0) {
    return absl::InvalidArgumentError(
        "bindings: input and output must be 16-byte aligned (as cuMemAlloc returns them)");
  }
  for (const ParamSpec& p : params_) {
    auto it = b.params.find(p.name);
    if (it == b.params.end() || !it->second) {
      return absl::InvalidArgumentError(absl::StrCat("bindings: parameter ", p.name,
                                                     FormatShape(p.shape), " is missing"));
    }
    if (it->second % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bindings: parameter ", p.name, " must be 16-byte aligned"));
    }
  }
  for (const auto& [name, ptr] : b.params) {
    bool known = false;
    for (const ParamSpec& p : params_) known |= p.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const ParamSpec& p : params_) names.push_back(p.name);
      return absl::InvalidArgumentError(
          absl::StrCat("bindings: unknown parameter '", name, "'; this chain takes ",
                       names.empty() ? "none" : absl::StrJoin(names, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::Status CompiledChainImpl::RunFirstKernels(const Bindings& bindings, CUstream stream,
                                                size_t count) {
  if (count > plan_.kernels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RunFirstKernels: count ", count,
                                                   " exceeds the plan's ", plan_.kernels.size(),
                                                   " kernels"));
  }
  if (absl::Status s = CheckBindings(bindings); !s.ok()) return s;
  absl::StatusOr<const Loaded*> loaded = LoadedForCurrentContext();
  if (!loaded.ok()) return loaded.status();
  const DriverApi* driver = *Driver();

  for (size_t i = 0; i < plan_.constant_copies.size(); ++i) {
    const codegen::ConstantCopy& c = plan_.constant_copies[i];
    FUSEJIT_CU_RETURN_IF_ERROR(
        driver->cuMemcpyDtoDAsync((*loaded)->constants[i], bindings.params.at(c.param), c.bytes,
                                  stream),
        absl::StrCat("copying ", c.param, " to __constant__ ", c.symbol));
  }
  std::vector<CUdeviceptr> values;
  std::vector<void*> args;
  for (size_t i = 0; i < count; ++i) {
    const codegen::KernelLaunch& k = plan_.kernels[i];
    values.assign(k.args.size(), 0);
    args.assign(k.args.size(), nullptr);
    for (size_t a = 0; a < k.args.size(); ++a) {
      const codegen::KernelArg& arg = k.args[a];
      switch (arg.kind) {
        case codegen::KernelArg::Kind::kInput: values[a] = bindings.input; break;
        case codegen::KernelArg::Kind::kOutput: values[a] = bindings.output; break;
        case codegen::KernelArg::Kind::kParam:
          values[a] = arg.param.empty() ? 0 : bindings.params.at(arg.param);
          break;
        case codegen::KernelArg::Kind::kWorkspace:
          values[a] = bindings.workspace + arg.offset;
          break;
      }
      args[a] = &values[a];
    }
    if (absl::Status s = Launch((*loaded)->functions[i], k.grid, k.block, k.shared_bytes, stream,
                                args.data());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("launching ", k.symbol, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace fusejit::jit
