// jit/device.cc: device queries, ScopedPrimaryContext, DeviceBuffer, EventTimer.
#include "jit/device.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "jit/driver.h"

namespace fusejit::jit {
namespace {

absl::StatusOr<CUdevice> CurrentDevice(const DriverApi& api) {
  if (absl::Status s = RequireCurrentContext("querying the current device"); !s.ok()) return s;
  CUdevice device = 0;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxGetDevice(&device), "cuCtxGetDevice");
  return device;
}

absl::StatusOr<int> Attribute(const DriverApi& api, CUdevice device, CUdevice_attribute attribute,
                              const char* name) {
  int value = 0;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDeviceGetAttribute(&value, attribute, device),
                             absl::StrCat("cuDeviceGetAttribute(", name, ")"));
  return value;
}

absl::StatusOr<std::string> ArchOf(const DriverApi& api, CUdevice device) {
  absl::StatusOr<int> major = Attribute(api, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        "COMPUTE_CAPABILITY_MAJOR");
  if (!major.ok()) return major.status();
  absl::StatusOr<int> minor = Attribute(api, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                        "COMPUTE_CAPABILITY_MINOR");
  if (!minor.ok()) return minor.status();
  return absl::StrCat("sm_", *major, *minor);
}

// Owns CUevents; destroys them on every path.
class Events {
 public:
  explicit Events(const DriverApi& api) : api_(api) {}
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    // Destroying an event cannot usefully fail here; nobody to report to from a destructor.
    for (CUevent e : events_) (void)api_.cuEventDestroy(e);
  }
  absl::StatusOr<CUevent> Create() {
    CUevent e = nullptr;
    FUSEJIT_CU_RETURN_IF_ERROR(api_.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    events_.push_back(e);
    return e;
  }

 private:
  const DriverApi& api_;
  std::vector<CUevent> events_;
};

}  // namespace

absl::StatusOr<DeviceInfo> CurrentDeviceInfo() {
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;
  absl::StatusOr<CUdevice> device = CurrentDevice(api);
  if (!device.ok()) return device.status();

  DeviceInfo info;
  info.ordinal = static_cast<int>(*device);
  std::array<char, 256> name{};
  FUSEJIT_CU_RETURN_IF_ERROR(
      api.cuDeviceGetName(name.data(), static_cast<int>(name.size()), *device), "cuDeviceGetName");
  info.name = std::string(name.data(), strnlen(name.data(), name.size()));
  absl::StatusOr<std::string> arch = ArchOf(api, *device);
  if (!arch.ok()) return arch.status();
  info.arch = *std::move(arch);
  absl::StatusOr<int> sms =
      Attribute(api, *device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT");
  if (!sms.ok()) return sms.status();
  info.sm_count = *sms;
  absl::StatusOr<int> optin =
      Attribute(api, *device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN");
  if (!optin.ok()) return optin.status();
  info.max_shared_per_block_optin = *optin;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDeviceTotalMem(&info.total_mem, *device), "cuDeviceTotalMem");
  return info;
}

absl::StatusOr<std::string> CurrentArch() {
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  absl::StatusOr<CUdevice> device = CurrentDevice(**loaded);
  if (!device.ok()) return device.status();
  return ArchOf(**loaded, *device);
}

namespace {

// The device of ordinal `ordinal`; InvalidArgument (naming how many there are) when none.
absl::StatusOr<CUdevice> DeviceOf(const DriverApi& api, int ordinal) {
  int count = 0;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ordinal ", ordinal,
                                                   " does not exist: there are ", count,
                                                   " device(s), 0..", count - 1));
  }
  CUdevice device = 0;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDeviceGet(&device, ordinal),
                             absl::StrCat("cuDeviceGet(", ordinal, ")"));
  return device;
}

// Device `ordinal`'s primary context, retained once for the life of the process (so it stays
// alive for every thread that makes it current here).
absl::StatusOr<CUcontext> RetainedPrimaryContext(const DriverApi& api, int ordinal) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* retained = new absl::flat_hash_map<int, CUcontext>();
  absl::MutexLock lock(&mu);
  auto it = retained->find(ordinal);
  if (it != retained->end()) return it->second;
  absl::StatusOr<CUdevice> device = DeviceOf(api, ordinal);
  if (!device.ok()) return device.status();
  CUcontext context = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDevicePrimaryCtxRetain(&context, *device),
                             absl::StrCat("cuDevicePrimaryCtxRetain(device ", ordinal, ")"));
  retained->emplace(ordinal, context);
  return context;
}

}  // namespace

absl::Status UseCurrentOrPrimaryContext(int ordinal) {
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;
  CUcontext current = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current) return absl::OkStatus();
  absl::StatusOr<CUcontext> primary = RetainedPrimaryContext(api, ordinal);
  if (!primary.ok()) return primary.status();
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxSetCurrent(*primary), "cuCtxSetCurrent(primary context)");
  return absl::OkStatus();
}

absl::StatusOr<DeviceContextGuard> DeviceContextGuard::Enter(int ordinal) {
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;
  DeviceContextGuard guard;
  CUcontext current = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current) {
    CUdevice have = 0;
    FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxGetDevice(&have), "cuCtxGetDevice");
    absl::StatusOr<CUdevice> want = DeviceOf(api, ordinal);
    if (!want.ok()) return want.status();
    if (have == *want) return guard;
  }
  absl::StatusOr<CUcontext> primary = RetainedPrimaryContext(api, ordinal);
  if (!primary.ok()) return primary.status();
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxSetCurrent(*primary), "cuCtxSetCurrent(primary context)");
  guard.restore_ = current;
  guard.switched_ = current != nullptr;
  return guard;
}

DeviceContextGuard::~DeviceContextGuard() {
  if (!switched_) return;
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (loaded.ok()) (void)(*loaded)->cuCtxSetCurrent(restore_);  // best effort in a destructor
}

// ---- ScopedPrimaryContext ----------------------------------------------------------------------

absl::StatusOr<ScopedPrimaryContext> ScopedPrimaryContext::Create(int ordinal) {
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;
  absl::StatusOr<CUdevice> device = DeviceOf(api, ordinal);
  if (!device.ok()) return device.status();
  CUcontext previous = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxGetCurrent(&previous), "cuCtxGetCurrent");
  CUcontext context = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuDevicePrimaryCtxRetain(&context, *device),
                             absl::StrCat("cuDevicePrimaryCtxRetain(device ", ordinal, ")"));
  // From here the retained context is owned; release it if making it current fails.
  ScopedPrimaryContext scoped(ordinal, *device, context, previous);
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuCtxSetCurrent(context), "cuCtxSetCurrent(primary context)");
  return scoped;
}

ScopedPrimaryContext::ScopedPrimaryContext(ScopedPrimaryContext&& other) noexcept
    : ordinal_(other.ordinal_),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)),
      previous_(std::exchange(other.previous_, nullptr)) {}

ScopedPrimaryContext& ScopedPrimaryContext::operator=(ScopedPrimaryContext&& other) noexcept {
  if (this != &other) {
    Reset();
    ordinal_ = other.ordinal_;
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
    previous_ = std::exchange(other.previous_, nullptr);
  }
  return *this;
}

ScopedPrimaryContext::~ScopedPrimaryContext() { Reset(); }

void ScopedPrimaryContext::Reset() {
  if (context_ == nullptr) return;
  absl::StatusOr<const DriverApi*> api = Driver();  // OK: we hold a context, so it loaded
  if (api.ok()) {
    // Cleanup cannot report failures; the results are deliberately ignored.
    CUcontext current = nullptr;
    if ((*api)->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == context_) {
      (void)(*api)->cuCtxSetCurrent(previous_);
    }
    (void)(*api)->cuDevicePrimaryCtxRelease(device_);
  }
  context_ = nullptr;
  previous_ = nullptr;
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  if (absl::Status s = RequireCurrentContext("DeviceBuffer::Allocate"); !s.ok()) return s;
  CUdeviceptr ptr = 0;
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemAlloc(&ptr, bytes),
                             absl::StrCat("cuMemAlloc(", bytes, " bytes)"));
  return DeviceBuffer(ptr, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  if (ptr_ != 0) {
    absl::StatusOr<const DriverApi*> api = Driver();  // OK: ptr_ came from cuMemAlloc
    // Cleanup cannot report failures; the result is deliberately ignored.
    if (api.ok()) (void)(*api)->cuMemFree(ptr_);
  }
  ptr_ = 0;
  bytes_ = 0;
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_) {
    return absl::OutOfRangeError(absl::StrCat("DeviceBuffer::CopyFromHost: ", bytes,
                                              " bytes do not fit the buffer's ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemcpyHtoD(ptr_, src, bytes),
                             absl::StrCat("cuMemcpyHtoD(", bytes, " bytes)"));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    return absl::OutOfRangeError(
        absl::StrCat("DeviceBuffer::CopyToHost: ", bytes, " bytes exceed the buffer's ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemcpyDtoH(dst, ptr_, bytes),
                             absl::StrCat("cuMemcpyDtoH(", bytes, " bytes)"));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::FillBytes(unsigned char value) {
  if (bytes_ == 0) return absl::OkStatus();
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemsetD8(ptr_, value, bytes_),
                             absl::StrCat("cuMemsetD8(", bytes_, " bytes)"));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::FillFloat(float value) {
  if (bytes_ % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer::FillFloat: the buffer's ", bytes_,
                                                   " bytes are not a whole number of floats"));
  }
  if (bytes_ == 0) return absl::OkStatus();
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  unsigned int bits = 0;
  static_assert(sizeof(bits) == sizeof(value));
  std::memcpy(&bits, &value, sizeof(bits));
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemsetD32(ptr_, bits, bytes_ / sizeof(float)),
                             absl::StrCat("cuMemsetD32(", bytes_ / sizeof(float), " floats)"));
  return absl::OkStatus();
}

// ---- EventTimer --------------------------------------------------------------------------------

absl::StatusOr<std::vector<float>> EventTimer::Time(
    CUstream stream, int warmup, int reps, absl::FunctionRef<absl::Status()> enqueue,
    const std::function<absl::Status()>& between) {
  if (reps < 1 || warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EventTimer::Time: reps must be >= 1 and warmup >= 0 (got reps=", reps,
                     ", warmup=", warmup, ")"));
  }
  absl::StatusOr<const DriverApi*> loaded = Driver();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;

  Events events(api);
  std::vector<std::pair<CUevent, CUevent>> pairs;
  for (int i = 0; i < reps; ++i) {
    absl::StatusOr<CUevent> start = events.Create();
    if (!start.ok()) return start.status();
    absl::StatusOr<CUevent> stop = events.Create();
    if (!stop.ok()) return stop.status();
    pairs.emplace_back(*start, *stop);
  }
  for (int i = 0; i < warmup; ++i) {
    if (between) {
      if (absl::Status s = between(); !s.ok()) return s;
    }
    if (absl::Status s = enqueue(); !s.ok()) return s;
  }
  for (const auto& [start, stop] : pairs) {
    if (between) {
      if (absl::Status s = between(); !s.ok()) return s;
    }
    FUSEJIT_CU_RETURN_IF_ERROR(api.cuEventRecord(start, stream), "cuEventRecord(start)");
    if (absl::Status s = enqueue(); !s.ok()) return s;
    FUSEJIT_CU_RETURN_IF_ERROR(api.cuEventRecord(stop, stream), "cuEventRecord(stop)");
  }
  // Events complete in stream order, so the last stop implies all the others.
  FUSEJIT_CU_RETURN_IF_ERROR(api.cuEventSynchronize(pairs.back().second), "cuEventSynchronize");
  std::vector<float> ms;
  ms.reserve(pairs.size());
  for (const auto& [start, stop] : pairs) {
    float elapsed = 0;
    FUSEJIT_CU_RETURN_IF_ERROR(api.cuEventElapsedTime(&elapsed, start, stop), "cuEventElapsedTime");
    ms.push_back(elapsed);
  }
  return ms;
}

double Median(std::vector<float> samples) {
  if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + mid, samples.end());
  const double upper = samples[mid];
  if (samples.size() % 2 == 1) return upper;
  const double lower = *std::max_element(samples.begin(), samples.begin() + mid);
  return (lower + upper) / 2;
}

}  // namespace fusejit::jit
