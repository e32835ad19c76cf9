#include "runtime/compiled_chain.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "jit/nvrtc.h"
#include "runtime/bindings.h"

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

// Whether kernels compiled for `arch` ("sm_90", "sm_90a", ...) are launched with programmatic
// stream serialization (programmatic dependent launch: a kernel's CTAs are scheduled while the
// previous kernel's last wave runs, hiding the gap between them; every generated kernel waits
// for its predecessor first, fj::grid_dependency_begin). sm_90 and later, unless the
// environment sets FUSEJIT_DISABLE_PDL=1 (for measuring it, or should a driver misbehave).
bool ProgrammaticLaunch(const std::string& arch) {
  static const bool disabled = [] {
    const char* env = std::getenv("FUSEJIT_DISABLE_PDL");
    return env != nullptr && std::string(env) == "1";
  }();
  const absl::StatusOr<int> number = jit::ArchNumber(arch);
  return !disabled && number.ok() && *number >= 90;
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
      signature_(plan_.signature.empty() ? ForwardSignature(chain_, plan_.workspace_bytes)
                                         : plan_.signature) {
  launch_options_.programmatic_serialization = ProgrammaticLaunch(arch_);
  const int workspace = IndexOf(signature_, kWorkspaceName);
  for (const codegen::KernelLaunch& k : plan_.kernels) {
    std::vector<ArgSource>& sources = arg_sources_.emplace_back();
    for (const codegen::KernelArg& arg : k.args) {
      ArgSource& a = sources.emplace_back();
      switch (arg.kind) {
        case codegen::KernelArg::Kind::kInput: a.tensor = IndexOf(signature_, kInputName); break;
        case codegen::KernelArg::Kind::kOutput: a.tensor = IndexOf(signature_, kOutputName); break;
        case codegen::KernelArg::Kind::kParam:
        case codegen::KernelArg::Kind::kTensor:
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

absl::Status CompiledChainImpl::RunTensors(const CUdeviceptr* tensors, size_t count,
                                           CUstream stream) {
  if (absl::Status s = CheckTensors(signature_, tensors, count); !s.ok()) return s;
  return Enqueue(tensors, stream, plan_.kernels.size());
}

absl::Status CompiledChainImpl::RunNamed(const NamedBindings& bindings, CUstream stream) {
  absl::StatusOr<std::vector<CUdeviceptr>> tensors = ResolveBindings(signature_, bindings);
  if (!tensors.ok()) return tensors.status();
  return Enqueue(tensors->data(), stream, plan_.kernels.size());
}

absl::Status CompiledChainImpl::RunFirstKernels(const Bindings& bindings, CUstream stream,
                                                size_t count) {
  return RunFirstKernelsNamed(bindings.Named(), stream, count);
}

absl::Status CompiledChainImpl::RunFirstKernelsNamed(const NamedBindings& bindings,
                                                     CUstream stream, size_t count) {
  if (count > plan_.kernels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RunFirstKernels: count ", count,
                                                   " exceeds the plan's ", plan_.kernels.size(),
                                                   " kernels"));
  }
  absl::StatusOr<std::vector<CUdeviceptr>> tensors = ResolveBindings(signature_, bindings);
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
                                     stream, args.data(), launch_options_);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("launching ", k.symbol, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace runtime
}  // namespace fusejit
