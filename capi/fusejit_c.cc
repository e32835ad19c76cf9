// capi/fusejit_c.cc: the C ABI (include/fusejit/fusejit_c.h) over the C++ API.
//
// Every entry point catches everything (no exception crosses the ABI), records the calling
// thread's last error, and checks handles against a registry of live chains, so a null, foreign or
// released handle is an error rather than undefined behaviour.
#include "fusejit/fusejit_c.h"

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache/kernel_cache.h"
#include "fusejit/fusejit.h"
#include "jit/device.h"
#include "jit/driver.h"

// The C role numbers are fusejit::TensorRole's (fj_chain_tensor passes them through).
static_assert(FJ_ROLE_INPUT == static_cast<int>(fusejit::TensorRole::kInput));
static_assert(FJ_ROLE_OUTPUT == static_cast<int>(fusejit::TensorRole::kOutput));
static_assert(FJ_ROLE_PARAM == static_cast<int>(fusejit::TensorRole::kParam));
static_assert(FJ_ROLE_WORKSPACE == static_cast<int>(fusejit::TensorRole::kWorkspace));
static_assert(FJ_ROLE_GRAD_OUTPUT == static_cast<int>(fusejit::TensorRole::kGradOutput));
static_assert(FJ_ROLE_GRAD_INPUT == static_cast<int>(fusejit::TensorRole::kGradInput));
static_assert(FJ_ROLE_GRAD_PARAM == static_cast<int>(fusejit::TensorRole::kGradParam));
static_assert(FJ_ROLE_SAVED == static_cast<int>(fusejit::TensorRole::kSaved));
static_assert(FJ_DTYPE_F32 == static_cast<int>(fusejit::DType::kF32));
static_assert(FJ_DTYPE_F16 == static_cast<int>(fusejit::DType::kF16));
static_assert(FJ_DTYPE_BF16 == static_cast<int>(fusejit::DType::kBF16));
static_assert(FJ_DTYPE_F64 == static_cast<int>(fusejit::DType::kF64));

struct fj_chain {
  std::shared_ptr<fusejit::CompiledChain> compiled;
  std::string spec;
  std::string strategy;
  std::string explain;
  std::vector<fusejit::TensorSpec> signature;
};

namespace {

thread_local std::string last_error;
thread_local std::string scratch;  // fj_canonical_spec's result

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return status.ok() ? FJ_UNKNOWN : static_cast<int>(status.code());
}

int Fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

int Ok() {
  last_error.clear();
  return FJ_OK;
}

// Live handles. A handle's chain is shared so that a release racing with a run is safe.
struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<const fj_chain*, std::shared_ptr<fj_chain>> live ABSL_GUARDED_BY(mu);
};
Registry& Live() {
  static auto* registry = new Registry();
  return *registry;
}

std::shared_ptr<fj_chain> Find(const fj_chain* handle) {
  if (!handle) return nullptr;
  Registry& r = Live();
  absl::MutexLock lock(&r.mu);
  auto it = r.live.find(handle);
  return it == r.live.end() ? nullptr : it->second;
}

int BadHandle(const char* function, const fj_chain* handle) {
  return Fail(FJ_INVALID_ARGUMENT,
              handle ? absl::StrCat(function, ": the fj_chain handle is not live (released already, "
                                              "or not from fj_compile / fj_compile_backward)")
                     : absl::StrCat(function, ": the fj_chain handle is NULL"));
}

// Runs `body` with exceptions turned into FJ_INTERNAL.
template <typename F>
int Guard(const char* function, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(FJ_INTERNAL, absl::StrCat(function, ": internal error: ", e.what()));
  } catch (...) {
    return Fail(FJ_INTERNAL, absl::StrCat(function, ": internal error"));
  }
}

// Handle lookup plus the guard, for the accessors.
template <typename F>
int WithChain(const char* function, const fj_chain* handle, F&& body) {
  return Guard(function, [&]() -> int {
    std::shared_ptr<fj_chain> chain = Find(handle);
    if (!chain) return BadHandle(function, handle);
    return body(*chain);
  });
}

// A device guard for `device` (jit::DeviceContextGuard). Without a driver there is none and
// that is not an error here: runs then check their bindings first and report the driver after.
absl::StatusOr<std::optional<fusejit::jit::DeviceContextGuard>> GuardDevice(int device) {
  if (!fusejit::jit::Driver().ok()) return std::nullopt;
  absl::StatusOr<fusejit::jit::DeviceContextGuard> guard =
      fusejit::jit::DeviceContextGuard::Enter(device);
  if (!guard.ok()) return guard.status();
  return std::optional<fusejit::jit::DeviceContextGuard>(*std::move(guard));
}

int NullArgument(const char* function, const char* argument) {
  return Fail(FJ_INVALID_ARGUMENT, absl::StrCat(function, ": ", argument, " is NULL"));
}


// fusejit::Compile or fusejit::CompileBackward.
using CompileFn = absl::StatusOr<std::shared_ptr<fusejit::CompiledChain>> (*)(
    const fusejit::Chain&, const fusejit::CompileOptions&);

// fj_compile and fj_compile_backward: the options read, the spec parsed and compiled with
// `compile` (for the options' device when they name no arch), and a live handle made.
int CompileHandle(const char* function, CompileFn compile, const char* spec,
                  const fj_compile_options* options, fj_chain** out) {
  return Guard(function, [&]() -> int {
    if (!spec) return NullArgument(function, "spec");
    if (!out) return NullArgument(function, "out");
    *out = nullptr;
    fj_compile_options opts{};
    if (options) {
      if (options->struct_size < offsetof(fj_compile_options, disable_tuning) + sizeof(int) ||
          options->struct_size > sizeof(fj_compile_options) * 4) {
        return Fail(FJ_INVALID_ARGUMENT,
                    absl::StrCat(function, ": options->struct_size is ", options->struct_size,
                                 "; set it to sizeof(fj_compile_options) (", sizeof(opts), ")"));
      }
      opts = *options;
    }
    fusejit::CompileOptions o;
    if (opts.arch) o.arch = opts.arch;
    const std::string precision = opts.precision ? opts.precision : "";
    if (precision.empty() || precision == "fp32") {
      o.precision = fusejit::Precision::kFp32;
    } else if (precision == "tf32") {
      o.precision = fusejit::Precision::kTf32;
    } else {
      return Fail(FJ_INVALID_ARGUMENT, absl::StrCat(function, ": precision '", precision,
                                                    "' is not one; write fp32 or tf32"));
    }
    if (opts.strategy) o.strategy = opts.strategy;
    if (opts.tune_config) o.tune_config = opts.tune_config;
    o.use_cache = opts.disable_cache == 0;
    o.use_tuning = opts.disable_tuning == 0;

    absl::StatusOr<fusejit::Chain> chain = fusejit::ParseChain(spec);
    if (!chain.ok()) return Fail(chain.status());
    std::optional<fusejit::jit::DeviceContextGuard> guard;  // compile for that device
    if (o.arch.empty()) {
      absl::StatusOr<fusejit::jit::DeviceContextGuard> g =
          fusejit::jit::DeviceContextGuard::Enter(opts.device);
      if (!g.ok()) {
        return Fail(absl::Status(g.status().code(),
                                 absl::StrCat(function, ": ", g.status().message(),
                                              " (or give an explicit arch)")));
      }
      guard.emplace(*std::move(g));
    }
    absl::StatusOr<std::shared_ptr<fusejit::CompiledChain>> compiled = compile(*chain, o);
    if (!compiled.ok()) return Fail(compiled.status());
    auto handle = std::make_shared<fj_chain>();
    handle->compiled = *std::move(compiled);
    handle->spec = fusejit::FormatChain(handle->compiled->chain());
    handle->strategy = handle->compiled->strategy();
    handle->explain = handle->compiled->Explain();
    handle->signature = handle->compiled->signature();
    Registry& r = Live();
    absl::MutexLock lock(&r.mu);
    r.live.emplace(handle.get(), handle);
    *out = handle.get();
    return Ok();
  });
}

}  // namespace

extern "C" {

int fj_abi_version(void) { return FUSEJIT_C_ABI_VERSION; }

int fj_abi_minor(void) { return FUSEJIT_C_ABI_MINOR; }

const char* fj_version(void) { return fusejit::GeneratorBuild(); }

const char* fj_last_error(void) { return last_error.c_str(); }

int fj_canonical_spec(const char* spec, const char** canonical) {
  return Guard("fj_canonical_spec", [&]() -> int {
    if (!spec) return NullArgument("fj_canonical_spec", "spec");
    if (!canonical) return NullArgument("fj_canonical_spec", "canonical");
    absl::StatusOr<fusejit::Chain> chain = fusejit::ParseChain(spec);
    if (!chain.ok()) return Fail(chain.status());
    scratch = fusejit::FormatChain(*chain);
    *canonical = scratch.c_str();
    return Ok();
  });
}

int fj_cache_dir(const char** dir) {
  return Guard("fj_cache_dir", [&]() -> int {
    if (!dir) return NullArgument("fj_cache_dir", "dir");
    scratch = fusejit::cache::KernelCache::Default().directory();
    *dir = scratch.c_str();
    return Ok();
  });
}

int fj_compile(const char* spec, const fj_compile_options* options, fj_chain** out) {
  return CompileHandle("fj_compile", fusejit::Compile, spec, options, out);
}

int fj_compile_backward(const char* spec, const fj_compile_options* options, fj_chain** out) {
  return CompileHandle("fj_compile_backward", fusejit::CompileBackward, spec, options, out);
}

int fj_compile_training_forward(const char* spec, const fj_compile_options* options,
                                fj_chain** out) {
  return CompileHandle("fj_compile_training_forward", fusejit::CompileTrainingForward, spec,
                       options, out);
}

int fj_compile_backward_saved(const char* spec, const fj_compile_options* options, fj_chain** out) {
  return CompileHandle("fj_compile_backward_saved", fusejit::CompileBackwardFromSaved, spec,
                       options, out);
}

const char* fj_role_name(int role) {
  if (role < FJ_ROLE_INPUT || role > FJ_ROLE_SAVED) return nullptr;
  return fusejit::TensorRoleName(static_cast<fusejit::TensorRole>(role));
}

int fj_chain_release(fj_chain* handle) {
  return Guard("fj_chain_release", [&]() -> int {
    if (!handle) return BadHandle("fj_chain_release", handle);
    std::shared_ptr<fj_chain> released;  // destroyed outside the lock
    Registry& r = Live();
    {
      absl::MutexLock lock(&r.mu);
      auto it = r.live.find(handle);
      if (it == r.live.end()) return BadHandle("fj_chain_release", handle);
      released = std::move(it->second);
      r.live.erase(it);
    }
    return Ok();
  });
}

int fj_chain_spec(const fj_chain* handle, const char** spec) {
  return WithChain("fj_chain_spec", handle, [&](fj_chain& c) -> int {
    if (!spec) return NullArgument("fj_chain_spec", "spec");
    *spec = c.spec.c_str();
    return Ok();
  });
}

int fj_chain_strategy(const fj_chain* handle, const char** strategy) {
  return WithChain("fj_chain_strategy", handle, [&](fj_chain& c) -> int {
    if (!strategy) return NullArgument("fj_chain_strategy", "strategy");
    *strategy = c.strategy.c_str();
    return Ok();
  });
}

int fj_chain_explain(const fj_chain* handle, const char** text) {
  return WithChain("fj_chain_explain", handle, [&](fj_chain& c) -> int {
    if (!text) return NullArgument("fj_chain_explain", "text");
    *text = c.explain.c_str();
    return Ok();
  });
}

int fj_chain_workspace_bytes(const fj_chain* handle, size_t* bytes) {
  return WithChain("fj_chain_workspace_bytes", handle, [&](fj_chain& c) -> int {
    if (!bytes) return NullArgument("fj_chain_workspace_bytes", "bytes");
    *bytes = c.compiled->workspace_bytes();
    return Ok();
  });
}

int fj_chain_tensor_count(const fj_chain* handle, size_t* count) {
  return WithChain("fj_chain_tensor_count", handle, [&](fj_chain& c) -> int {
    if (!count) return NullArgument("fj_chain_tensor_count", "count");
    *count = c.signature.size();
    return Ok();
  });
}

int fj_chain_tensor(const fj_chain* handle, size_t index, fj_tensor_info* info) {
  return WithChain("fj_chain_tensor", handle, [&](fj_chain& c) -> int {
    if (!info) return NullArgument("fj_chain_tensor", "info");
    if (index >= c.signature.size()) {
      return Fail(FJ_OUT_OF_RANGE, absl::StrCat("fj_chain_tensor: index ", index,
                                                " is past the signature's ", c.signature.size(),
                                                " tensors"));
    }
    const fusejit::TensorSpec& t = c.signature[index];
    *info = fj_tensor_info{};
    info->name = t.name.c_str();
    info->role = static_cast<int>(t.role);
    info->dtype = static_cast<int>(t.dtype);
    info->ndim = static_cast<int>(t.shape.size());
    for (size_t i = 0; i < t.shape.size() && i < 8; ++i) info->shape[i] = t.shape[i];
    info->bytes = t.bytes();
    info->alignment = t.alignment;
    return Ok();
  });
}

int fj_chain_load(fj_chain* handle, int device) {
  return WithChain("fj_chain_load", handle, [&](fj_chain& c) -> int {
    absl::StatusOr<fusejit::jit::DeviceContextGuard> guard =
        fusejit::jit::DeviceContextGuard::Enter(device);
    if (!guard.ok()) return Fail(guard.status());
    if (absl::Status s = c.compiled->Load(); !s.ok()) return Fail(s);
    return Ok();
  });
}

int fj_chain_run(fj_chain* handle, const char* const* names, const fj_deviceptr* pointers,
                 size_t count, CUstream stream, int device) {
  return WithChain("fj_chain_run", handle, [&](fj_chain& c) -> int {
    if (count > 0 && !names) return NullArgument("fj_chain_run", "names");
    if (count > 0 && !pointers) return NullArgument("fj_chain_run", "pointers");
    fusejit::NamedBindings bindings;
    for (size_t i = 0; i < count; ++i) {
      if (!names[i]) {
        return Fail(FJ_INVALID_ARGUMENT, absl::StrCat("fj_chain_run: names[", i, "] is NULL"));
      }
      if (!bindings.emplace(names[i], pointers[i]).second) {
        return Fail(FJ_INVALID_ARGUMENT,
                    absl::StrCat("fj_chain_run: '", names[i], "' is bound twice"));
      }
    }
    auto guard = GuardDevice(device);
    if (!guard.ok()) return Fail(guard.status());
    if (absl::Status s = c.compiled->RunNamed(bindings, stream); !s.ok()) return Fail(s);
    return Ok();
  });
}

int fj_chain_run_tensors(fj_chain* handle, const fj_deviceptr* pointers, size_t count,
                         CUstream stream, int device) {
  return WithChain("fj_chain_run_tensors", handle, [&](fj_chain& c) -> int {
    if (count > 0 && !pointers) return NullArgument("fj_chain_run_tensors", "pointers");
    auto guard = GuardDevice(device);
    if (!guard.ok()) return Fail(guard.status());
    static_assert(sizeof(fj_deviceptr) == sizeof(CUdeviceptr));
    if (absl::Status s = c.compiled->RunTensors(reinterpret_cast<const CUdeviceptr*>(pointers),
                                                count, stream);
        !s.ok()) {
      return Fail(s);
    }
    return Ok();
  });
}

}  // extern "C"
