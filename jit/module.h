// jit/module.h: a loaded CUDA module and kernel launch, through the run-time-loaded driver.
//
//   ASSIGN_OR_RETURN(auto module, jit::LoadedModule::Load(nvrtc_result.cubin));  // current context
//   ASSIGN_OR_RETURN(CUfunction f, module->Function("saxpy"));
//   void* args[] = {&n, &a, &x, &y};
//   RETURN_IF_ERROR(jit::Launch(f, {blocks, 1, 1}, {256, 1, 1}, 0, stream, args));
#ifndef FUSEJIT_JIT_MODULE_H_
#define FUSEJIT_JIT_MODULE_H_

#include <cuda.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::jit {

// Owns a CUmodule loaded into one context. Non-copyable, non-movable (hold it by unique_ptr).
// REQUIRES: destroyed while the context it was loaded into is alive.
// Thread-safe: Function() may be called concurrently; the CUfunctions it returns stay valid for the
// module's lifetime and may be launched from any thread where that context is current.
class LoadedModule {
 public:
  // Loads `image` into the calling thread's current context. `image` is a cubin (ELF) or PTX text
  // (PTX is JIT-compiled by the driver; it need not be NUL-terminated here).
  // Errors: "no CUDA driver found..." (FailedPrecondition) without a driver; FailedPrecondition
  // "no current CUDA context: ..." when none is current; InvalidArgument for an empty image;
  // cuModuleLoadData's error otherwise (e.g. CUDA_ERROR_NO_BINARY_FOR_GPU for a cubin of another
  // arch).
  static absl::StatusOr<std::unique_ptr<LoadedModule>> Load(std::string_view image);

  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;
  ~LoadedModule();

  // The kernel whose symbol is `name` (declare kernels extern "C" so it is their plain name).
  // Error NotFound "kernel 'name' not found in module: ..." when there is none.
  absl::StatusOr<CUfunction> Function(const std::string& name) const;

  // Device address of the module-scope variable `name` (e.g. a __constant__ array). Errors if it
  // does not exist or is smaller than `min_bytes`.
  absl::StatusOr<CUdeviceptr> Global(const std::string& name, size_t min_bytes) const;

  CUmodule get() const { return module_; }

 private:
  explicit LoadedModule(CUmodule module) : module_(module) {}
  CUmodule module_;
};

// Enqueues f<<<grid, block, shared_bytes, stream>>>(args...) with cuLaunchKernel.
// `args` points to one pointer per kernel parameter (cuLaunchKernel's kernelParams); may be null
// for a kernel without parameters.
// Checks, before launching, with InvalidArgument errors naming the value: every dimension nonzero;
// grid.x <= 2^31-1, grid.y and grid.z <= 65535; block.x, block.y <= 1024, block.z <= 64 and
// block.x*block.y*block.z <= 1024. When shared_bytes > 48 KiB it first sets f's
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to shared_bytes (needed above 48 KiB; fails if
// the device's opt-in limit is lower). Launch-time errors (too many registers for the block, ...)
// are returned; errors during the kernel's execution surface at the next synchronization. REQUIRES:
// f's context is current; `stream` (0: the legacy default stream) belongs to it. Thread-safe.
//
// options.programmatic_serialization: launched with cuLaunchKernelEx and
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (programmatic dependent launch, sm_90+):
// the kernel may be scheduled while the stream's previous kernel still runs. Only for kernels
// that execute griddepcontrol.wait before touching memory (the generated ones:
// fj::grid_dependency_begin); anything else would race with its predecessor.
struct LaunchOptions {
  bool programmatic_serialization = false;
};
absl::Status Launch(CUfunction f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                    unsigned shared_bytes, CUstream stream, void** args,
                    LaunchOptions options = {});

}  // namespace fusejit::jit

#endif  // FUSEJIT_JIT_MODULE_H_
