// jit/driver.h: the CUDA driver API, loaded at run time.
//
// libcuda.so.1 is opened with dlopen on first use and never linked, so binaries built with fusejit
// start, generate code and run NVRTC on machines without an NVIDIA driver; only launching needs
// one. Entry points are resolved with dlsym by the symbol names cuda.h's macros give (cuMemAlloc ->
// cuMemAlloc_v2, cuEventElapsedTime -> cuEventElapsedTime_v2, ...), so each member has exactly
// the prototype cuda.h declares for it. cuda.h is used for its types only.
//
//   absl::StatusOr<const jit::DriverApi*> api = jit::Driver();
//   if (!api.ok()) return api.status();
//   CUdeviceptr p;
//   FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemAlloc(&p, bytes), "cuMemAlloc");
//
// Every driver call's CUresult must be checked: with FUSEJIT_CU_RETURN_IF_ERROR or CuCheck. The
// only exception is cleanup in destructors, where there is nobody to report to (say so in a
// comment).
#ifndef FUSEJIT_JIT_DRIVER_H_
#define FUSEJIT_JIT_DRIVER_H_

#include <cuda.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::jit {

// The driver entry points fusejit uses, by their base names. To use another one, add it here: the
// member and its lookup in driver.cc both come from this list.
//
// Note: cuda.h #defines many of these names to their versioned symbols (cuMemAlloc is
// cuMemAlloc_v2), so the members are really named e.g. `cuMemAlloc_v2`; written as `cuMemAlloc` in
// any file that includes cuda.h (all of them, through this header), they resolve consistently.
// Do not define CUDA_API_PER_THREAD_DEFAULT_STREAM in any translation unit that includes this.
#define FUSEJIT_DRIVER_FUNCTIONS(X)              \
  X(cuInit)                                      \
  X(cuDriverGetVersion)                          \
  X(cuGetErrorName)                              \
  X(cuGetErrorString)                            \
  X(cuDeviceGet)                                 \
  X(cuDeviceGetCount)                            \
  X(cuDeviceGetName)                             \
  X(cuDeviceGetAttribute)                        \
  X(cuDeviceTotalMem)                            \
  X(cuDevicePrimaryCtxRetain)                    \
  X(cuDevicePrimaryCtxRelease)                   \
  X(cuCtxSetCurrent)                             \
  X(cuCtxGetCurrent)                             \
  X(cuCtxGetDevice)                              \
  X(cuCtxSynchronize)                            \
  X(cuModuleLoadData)                            \
  X(cuModuleUnload)                              \
  X(cuModuleGetFunction)                         \
  X(cuModuleGetGlobal)                           \
  X(cuFuncGetAttribute)                          \
  X(cuFuncSetAttribute)                          \
  X(cuLaunchKernel)                              \
  X(cuLaunchKernelEx)                            \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuMemAlloc)                                  \
  X(cuMemFree)                                   \
  X(cuMemcpyHtoD)                                \
  X(cuMemcpyDtoH)                                \
  X(cuMemcpyDtoD)                                \
  X(cuMemcpyDtoDAsync)                           \
  X(cuMemsetD32)                                 \
  X(cuMemsetD32Async)                            \
  X(cuMemsetD8)                                  \
  X(cuMemsetD8Async)                             \
  X(cuStreamCreate)                              \
  X(cuStreamDestroy)                             \
  X(cuStreamSynchronize)                         \
  X(cuEventCreate)                               \
  X(cuEventDestroy)                              \
  X(cuEventRecord)                               \
  X(cuEventSynchronize)                          \
  X(cuEventElapsedTime)

#define FUSEJIT_DECLARE_DRIVER_FUNCTION(name) decltype(&::name) name = nullptr;

// Pointers to the driver's functions, each with exactly cuda.h's signature, e.g.
//   CUresult (*cuInit)(unsigned int);
//   CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);   // really cuMemAlloc_v2, see above
// All non-null in an instance returned by Driver().
struct DriverApi {
  FUSEJIT_DRIVER_FUNCTIONS(FUSEJIT_DECLARE_DRIVER_FUNCTION)
  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor, e.g. 13000
};

#undef FUSEJIT_DECLARE_DRIVER_FUNCTION

// The driver, loaded and initialized (cuInit(0)) on the first call; later calls return the same
// result, success or failure, without retrying. Never unloaded.
// Errors (all FailedPrecondition):
//   - libcuda.so.1 cannot be opened: "no CUDA driver found: <dlerror>; launching kernels needs an
//     NVIDIA GPU and its driver (codegen, NVRTC and the CPU reference work without one)";
//   - the driver is for an older CUDA major version than cuda.h, or lacks an entry point (named);
//   - cuInit fails (e.g. CUDA_ERROR_NO_DEVICE), named with its CUresult.
// Thread-safe.
absl::StatusOr<const DriverApi*> Driver();

// Driver().ok(), cached. Cheap after the first call. Thread-safe.
bool DriverAvailable();

// Loads the driver API from `library` (a dlopen name or path) without the cache and without calling
// cuInit, for tests of the loading errors. The library is never closed. Thread-safe.
absl::StatusOr<DriverApi> LoadDriverApi(const std::string& library);

// OK when r == CUDA_SUCCESS; otherwise an error "<what>: CUDA_ERROR_X (description)", whose code is
//   FailedPrecondition  for a missing/unusable device, context or driver (NO_DEVICE,
//   INVALID_CONTEXT,
//                       NOT_INITIALIZED, NO_BINARY_FOR_GPU, UNSUPPORTED_PTX_VERSION, ...),
//   ResourceExhausted   for CUDA_ERROR_OUT_OF_MEMORY,
//   InvalidArgument     for CUDA_ERROR_INVALID_VALUE,
//   Internal            otherwise (including sticky errors such as CUDA_ERROR_ILLEGAL_ADDRESS).
// Names come from the driver when it is loaded, else from a small built-in table ("CUresult 42"
// for codes outside it). Thread-safe.
absl::Status CuCheck(CUresult r, std::string_view what);

// "CUDA_ERROR_X (description)" for r, as CuCheck words it.
std::string CuResultText(CUresult r);

// OK if the calling thread has a current CUDA context; otherwise FailedPrecondition
// "no current CUDA context: <for_what> needs one; make a context current first (cuCtxSetCurrent,
// or jit::ScopedPrimaryContext)". Also fails (as Driver()) when there is no driver.
absl::Status RequireCurrentContext(std::string_view for_what);

}  // namespace fusejit::jit

// Evaluates the driver call `call` (a CUresult expression) once; on failure returns
// CuCheck(result, what) from the enclosing function (which returns absl::Status or StatusOr<T>).
// `what` is evaluated only on failure.
#define FUSEJIT_CU_RETURN_IF_ERROR(call, what)                    \
  do {                                                            \
    const CUresult fusejit_cu_result_ = (call);                   \
    if (fusejit_cu_result_ != CUDA_SUCCESS) {                     \
      return ::fusejit::jit::CuCheck(fusejit_cu_result_, (what)); \
    }                                                             \
  } while (false)

#endif  // FUSEJIT_JIT_DRIVER_H_
