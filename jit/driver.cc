// jit/driver.cc: dlopen libcuda.so.1, resolve entry points with dlsym, cuInit.
#include "jit/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fusejit::jit {
namespace {

constexpr char kDriverLibrary[] = "libcuda.so.1";

std::string VersionText(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

// Set once Driver() has loaded the driver successfully, so CuCheck can ask it for error names
// without triggering (or waiting on) the load itself.
std::atomic<const DriverApi*> g_loaded_api{nullptr};

// Fallback names for when the driver is not loaded (or its lookup fails).
const char* BuiltinName(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED:
      return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE:
      return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
      return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE:
      return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT:
      return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case CUDA_ERROR_INVALID_HANDLE:
      return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case CUDA_ERROR_LAUNCH_FAILED:
      return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_STUB_LIBRARY:
      return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "CUDA_ERROR_NOT_SUPPORTED";
    default:
      return nullptr;
  }
}

std::string ResultText(const DriverApi* api, CUresult r) {
  const char* name = nullptr;
  const char* description = nullptr;
  if (api != nullptr) {
    // Either lookup may fail (unknown code); we then fall back to the built-in names.
    if (api->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->cuGetErrorString(r, &description) != CUDA_SUCCESS) description = nullptr;
  }
  if (name == nullptr) name = BuiltinName(r);
  std::string text =
      name != nullptr ? std::string(name) : absl::StrCat("CUresult ", static_cast<int>(r));
  if (description != nullptr) absl::StrAppend(&text, " (", description, ")");
  return text;
}

absl::StatusCode CodeFor(CUresult r) {
  switch (r) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

// Debian's Abseil keeps absl::string_view distinct from std::string_view.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status CheckWith(const DriverApi* api, CUresult r, std::string_view what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  return absl::Status(CodeFor(r), absl::StrCat(AbslView(what), ": ", ResultText(api, r)));
}

// Resolves entry points by the exact symbol names cuda.h declares (cuMemAlloc is a macro for
// cuMemAlloc_v2, and so on), so every pointer has exactly the prototype its DriverApi member is
// declared with. (cuGetProcAddress is not used on purpose: asked for CUDA 13.0 it returns, e.g.,
// cuCtxSynchronize's 13.0 variant, which takes a CUcontext the 2.0 prototype does not pass.)
class Resolver {
 public:
  Resolver(std::string library, void* handle) : library_(std::move(library)), handle_(handle) {}

  // `symbol` is the versioned name ("cuMemAlloc_v2"); `driver_version` only for messages.
  absl::Status Resolve(const char* symbol, void** out, int driver_version) const {
    *out = dlsym(handle_, symbol);
    if (*out != nullptr) return absl::OkStatus();
    std::string driver = driver_version > 0
                             ? absl::StrCat(library_, " (CUDA ", VersionText(driver_version), ")")
                             : library_;
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver ", driver, " has no entry point ", symbol,
                     " (fusejit was built with CUDA ", VersionText(CUDA_VERSION),
                     "); update the NVIDIA driver"));
  }

 private:
  std::string library_;
  void* handle_;
};

absl::StatusOr<const DriverApi*> LoadAndInit() {
  absl::StatusOr<DriverApi> api = LoadDriverApi(kDriverLibrary);
  if (!api.ok()) return api.status();
  // Intentionally leaked, like the library handle: the driver stays loaded for the process.
  const DriverApi* loaded = new DriverApi(*std::move(api));
  if (absl::Status s = CheckWith(loaded, loaded->cuInit(0), "cuInit(0)"); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(s.message(), " [CUDA driver ", kDriverLibrary, ", CUDA ",
                                     VersionText(loaded->driver_version), "]"));
  }
  g_loaded_api.store(loaded, std::memory_order_release);
  return loaded;
}

}  // namespace

absl::StatusOr<DriverApi> LoadDriverApi(const std::string& library) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace; we only use dlsym on it.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA driver found: ", error != nullptr ? error : library,
        "; launching kernels needs an NVIDIA GPU and its driver (codegen, NVRTC and the CPU "
        "reference work without one)"));
  }
  // The handle is never closed: function pointers into the driver may outlive any owner.
  Resolver resolver(library, handle);

  DriverApi api;
  void* fn = nullptr;
  if (absl::Status s = resolver.Resolve("cuDriverGetVersion", &fn, 0); !s.ok()) return s;
  api.cuDriverGetVersion = reinterpret_cast<decltype(api.cuDriverGetVersion)>(fn);
  const CUresult version_result = api.cuDriverGetVersion(&api.driver_version);
  if (version_result == CUDA_ERROR_STUB_LIBRARY) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA driver found: ", library,
        " is the CUDA toolkit's stub library, not a driver (remove the toolkit's lib64/stubs "
        "folder from LD_LIBRARY_PATH); launching kernels needs an NVIDIA GPU and its driver "
        "(codegen, NVRTC and the CPU reference work without one)"));
  }
  if (absl::Status s = CheckWith(nullptr, version_result, "cuDriverGetVersion"); !s.ok()) {
    return s;
  }
  // CUDA guarantees compatibility within a major version only: a driver for an older major cannot
  // load what this toolkit's NVRTC emits, and lacks entry points cuda.h declares.
  if (api.driver_version / 1000 < CUDA_VERSION / 1000) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver ", library, " supports CUDA ", VersionText(api.driver_version),
        ", but fusejit was built with CUDA ", VersionText(CUDA_VERSION),
        "; install an NVIDIA driver for CUDA ", CUDA_VERSION / 1000, ".x or newer"));
  }

// FUSEJIT_SYMBOL(cuMemAlloc) is "cuMemAlloc_v2": the name after cuda.h's macros, i.e. the symbol
// whose prototype cuda.h declares under that name.
#define FUSEJIT_SYMBOL_TEXT(name) #name
#define FUSEJIT_SYMBOL(name) FUSEJIT_SYMBOL_TEXT(name)
#define FUSEJIT_RESOLVE_DRIVER_FUNCTION(name)                                          \
  if (absl::Status s = resolver.Resolve(FUSEJIT_SYMBOL(name), &fn, api.driver_version); \
      !s.ok()) {                                                                       \
    return s;                                                                          \
  }                                                                                    \
  api.name = reinterpret_cast<decltype(api.name)>(fn);
  FUSEJIT_DRIVER_FUNCTIONS(FUSEJIT_RESOLVE_DRIVER_FUNCTION)
#undef FUSEJIT_RESOLVE_DRIVER_FUNCTION
#undef FUSEJIT_SYMBOL
#undef FUSEJIT_SYMBOL_TEXT
  return api;
}

absl::StatusOr<const DriverApi*> Driver() {
  // Function-local static: initialized exactly once, thread-safe (the same guarantee as
  // std::call_once); concurrent first callers wait for the one doing the load.
  static const absl::StatusOr<const DriverApi*> driver = LoadAndInit();
  return driver;
}

bool DriverAvailable() {
  static const bool available = Driver().ok();
  return available;
}

std::string CuResultText(CUresult r) {
  return ResultText(g_loaded_api.load(std::memory_order_acquire), r);
}

absl::Status CuCheck(CUresult r, std::string_view what) {
  return CheckWith(g_loaded_api.load(std::memory_order_acquire), r, what);
}

absl::Status RequireCurrentContext(std::string_view for_what) {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  CUcontext ctx = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no current CUDA context: ", AbslView(for_what),
                     " needs one; make a context current first (cuCtxSetCurrent, or "
                     "jit::ScopedPrimaryContext)"));
  }
  return absl::OkStatus();
}

}  // namespace fusejit::jit
