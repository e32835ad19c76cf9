// jit/device.h: device queries, contexts, buffers and event timing for tools, tests and benchmarks.
// Not for the hot path: these helpers allocate, synchronize and query freely.
//
//   ASSIGN_OR_RETURN(auto ctx, jit::ScopedPrimaryContext::Create(0));
//   ASSIGN_OR_RETURN(std::string arch, jit::CurrentArch());        // "sm_90"
//   ASSIGN_OR_RETURN(auto y, jit::DeviceBuffer::Allocate(n * sizeof(float)));
//   RETURN_IF_ERROR(y.FillFloat(std::nanf("")));                    // poison the output
//
// Everything here needs the driver (jit::Driver()); without one every call returns its
// "no CUDA driver found" error.
#ifndef FUSEJIT_JIT_DEVICE_H_
#define FUSEJIT_JIT_DEVICE_H_

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::jit {

struct DeviceInfo {
  int ordinal = -1;
  std::string name;  // "NVIDIA H100 80GB HBM3"
  std::string arch;  // "sm_90": compute capability as an NVRTC real arch
  int sm_count = 0;
  int driver_version = 0;  // 1000 * major + 10 * minor, e.g. 13000
  size_t total_mem = 0;    // bytes
  int max_shared_per_block_optin =
      0;  // bytes, the most dynamic shared memory a kernel can opt into
};

// The device of the calling thread's current context.
// Errors: no driver; FailedPrecondition "no current CUDA context: ..."; a failing query (named).
absl::StatusOr<DeviceInfo> CurrentDeviceInfo();

// CurrentDeviceInfo()->arch, with fewer queries.
absl::StatusOr<std::string> CurrentArch();

// Makes sure the calling thread has a current context: the one already current is kept (whatever
// its device); with none, device `ordinal`'s primary context (the one the CUDA runtime and PyTorch
// use) is retained for the life of the process and made current. Never creates a context.
// Cheap when a context is current (one driver call).
absl::Status UseCurrentOrPrimaryContext(int ordinal);

// A device guard for calls on device `ordinal`'s memory (the C ABI's runs), as PyTorch's device
// guard: the current context is kept when it is on that device (the caller's, primary or not);
// when it is on another device, that device's primary context is made current and the previous
// context is restored on destruction; with none current, the primary context is made current
// (and left so). Never creates a context. Movable; destroy on the creating thread.
class DeviceContextGuard {
 public:
  static absl::StatusOr<DeviceContextGuard> Enter(int ordinal);
  DeviceContextGuard(DeviceContextGuard&& other) noexcept
      : restore_(other.restore_), switched_(other.switched_) {
    other.switched_ = false;
  }
  DeviceContextGuard& operator=(DeviceContextGuard&&) = delete;
  DeviceContextGuard(const DeviceContextGuard&) = delete;
  ~DeviceContextGuard();

 private:
  DeviceContextGuard() = default;
  CUcontext restore_ = nullptr;
  bool switched_ = false;
};

// Retains device `ordinal`'s primary context and makes it current on the calling thread. On
// destruction, if that context is still current on the destroying thread, the context that was
// current before Create is restored; then the primary context is released.
// REQUIRES: destroyed on the thread that created it (contexts are current per thread).
// Movable; a moved-from instance owns nothing.
class ScopedPrimaryContext {
 public:
  // Errors: no driver; InvalidArgument when `ordinal` is not a device (naming how many there are);
  // the failing driver call otherwise.
  static absl::StatusOr<ScopedPrimaryContext> Create(int ordinal = 0);

  ScopedPrimaryContext(ScopedPrimaryContext&& other) noexcept;
  ScopedPrimaryContext& operator=(ScopedPrimaryContext&& other) noexcept;
  ScopedPrimaryContext(const ScopedPrimaryContext&) = delete;
  ScopedPrimaryContext& operator=(const ScopedPrimaryContext&) = delete;
  ~ScopedPrimaryContext();

  CUcontext context() const { return context_; }
  int ordinal() const { return ordinal_; }

 private:
  ScopedPrimaryContext(int ordinal, CUdevice device, CUcontext context, CUcontext previous)
      : ordinal_(ordinal), device_(device), context_(context), previous_(previous) {}
  void Reset();

  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;   // null: owns nothing
  CUcontext previous_ = nullptr;  // current before Create (may be null)
};

// A cuMemAlloc'd device buffer, freed on destruction. Movable; a moved-from buffer is empty.
// REQUIRES: destroyed while the context it was allocated in is alive.
// Thread-compatible: distinct buffers may be used from distinct threads.
class DeviceBuffer {
 public:
  // Allocates `bytes` in the current context (256-byte aligned). Allocate(0) returns an empty
  // buffer (ptr() == 0) without touching the driver. Errors: no driver; "no current CUDA context:
  // ..."; ResourceExhausted when out of memory.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // Synchronous copies of the first `bytes` bytes. OutOfRange if bytes > this->bytes().
  absl::Status CopyFromHost(const void* src, size_t bytes);
  absl::Status CopyToHost(void* dst, size_t bytes) const;
  // Sets every float of the buffer to `value` (bit pattern through cuMemsetD32; NaN works), e.g. to
  // poison an output. Synchronous w.r.t. the host. InvalidArgument if bytes() % 4 != 0.
  absl::Status FillFloat(float value);
  // Sets every byte to `value` (0xff poisons any float dtype with NaNs), synchronously.
  absl::Status FillBytes(unsigned char value);

 private:
  DeviceBuffer(CUdeviceptr ptr, size_t bytes) : ptr_(ptr), bytes_(bytes) {}
  void Reset();

  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Times work enqueued on a stream with CUDA events.
class EventTimer {
 public:
  // Calls enqueue() `warmup` times, then `reps` times with each rep between its own pair of events
  // (all reps are enqueued before waiting, so the GPU runs them back to back), synchronizes, and
  // returns each rep's elapsed GPU time in milliseconds, in order.
  // `enqueue` must only enqueue work on `stream` (not synchronize it); its first error is returned.
  // `between`, when given, is enqueued before every rep (warm-up ones too) outside the timed
  // events, e.g. to flush the L2 cache so that reps do not measure it.
  // InvalidArgument if reps < 1 or warmup < 0.
  // REQUIRES: `stream`'s context is current.
  static absl::StatusOr<std::vector<float>> Time(
      CUstream stream, int warmup, int reps, absl::FunctionRef<absl::Status()> enqueue,
      const std::function<absl::Status()>& between = nullptr);
};

// The median of `samples` (mean of the middle two for an even count); NaN when empty.
double Median(std::vector<float> samples);

}  // namespace fusejit::jit

#endif  // FUSEJIT_JIT_DEVICE_H_
