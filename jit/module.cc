// jit/module.cc: LoadedModule and Launch.
#include "jit/module.h"

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "jit/driver.h"

namespace fusejit::jit {
namespace {

constexpr unsigned kMaxGridX = 2147483647u;
constexpr unsigned kMaxGridYZ = 65535u;
constexpr unsigned kMaxBlockXY = 1024u;
constexpr unsigned kMaxBlockZ = 64u;
constexpr unsigned kMaxBlockThreads = 1024u;
constexpr unsigned kDefaultSharedLimit = 48u * 1024u;

std::string Dims(const std::array<unsigned, 3>& d) {
  return absl::StrCat("[", absl::StrJoin(d, ","), "]");
}

absl::Status CheckLaunchDims(const std::array<unsigned, 3>& grid,
                             const std::array<unsigned, 3>& block) {
  const std::string where = absl::StrCat("launch(grid=", Dims(grid), ", block=", Dims(block), ")");
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0 || block[i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": every grid and block dimension must be at least 1"));
    }
  }
  if (grid[0] > kMaxGridX) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": grid.x ", grid[0], " exceeds the limit ", kMaxGridX));
  }
  if (grid[1] > kMaxGridYZ || grid[2] > kMaxGridYZ) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": grid.y and grid.z must be at most ", kMaxGridYZ));
  }
  if (block[0] > kMaxBlockXY || block[1] > kMaxBlockXY || block[2] > kMaxBlockZ) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": block dimensions must be at most [",
                                                   kMaxBlockXY, ",", kMaxBlockXY, ",", kMaxBlockZ,
                                                   "]"));
  }
  const unsigned long long threads = 1ull * block[0] * block[1] * block[2];
  if (threads > kMaxBlockThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", threads, " threads per block exceed the limit ", kMaxBlockThreads));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadedModule>> LoadedModule::Load(std::string_view image) {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  if (image.empty()) {
    return absl::InvalidArgumentError("LoadedModule::Load: the module image is empty");
  }
  if (absl::Status s = RequireCurrentContext("loading a CUDA module"); !s.ok()) return s;

  // A cubin is an ELF image and carries its own size; PTX text must be NUL-terminated for the
  // driver, which a string_view does not promise.
  const bool is_elf = image.size() >= 4 && std::memcmp(image.data(),
                                                       "\x7f"
                                                       "ELF",
                                                       4) == 0;
  std::string text;
  const void* data = image.data();
  if (!is_elf) {
    text.assign(image);
    data = text.c_str();
  }
  CUmodule module = nullptr;
  FUSEJIT_CU_RETURN_IF_ERROR(
      (*api)->cuModuleLoadData(&module, data),
      absl::StrCat("cuModuleLoadData(", is_elf ? "cubin" : "PTX", ", ", image.size(), " bytes)"));
  return std::unique_ptr<LoadedModule>(new LoadedModule(module));
}

LoadedModule::~LoadedModule() {
  // A module exists only if Load() found the driver, so Driver() is OK here. Nobody can be told
  // about a failed unload in a destructor; the result is deliberately ignored.
  absl::StatusOr<const DriverApi*> api = Driver();
  if (api.ok() && module_ != nullptr) (void)(*api)->cuModuleUnload(module_);
}

absl::StatusOr<CUfunction> LoadedModule::Function(const std::string& name) const {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  CUfunction f = nullptr;
  const CUresult r = (*api)->cuModuleGetFunction(&f, module_, name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return absl::NotFoundError(
        absl::StrCat("kernel '", name, "' not found in module: ", CuResultText(r),
                     "; is it declared extern \"C\" __global__ with exactly this name?"));
  }
  FUSEJIT_CU_RETURN_IF_ERROR(r, absl::StrCat("cuModuleGetFunction('", name, "')"));
  return f;
}

absl::StatusOr<CUdeviceptr> LoadedModule::Global(const std::string& name,
                                                 size_t min_bytes) const {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuModuleGetGlobal(&ptr, &bytes, module_, name.c_str()),
                             absl::StrCat("cuModuleGetGlobal('", name, "')"));
  if (bytes < min_bytes) {
    return absl::InternalError(absl::StrCat("module global '", name, "' has ", bytes,
                                            " bytes; the plan copies ", min_bytes));
  }
  return ptr;
}

absl::Status Launch(CUfunction f, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                    unsigned shared_bytes, CUstream stream, void** args, LaunchOptions options) {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  if (f == nullptr) return absl::InvalidArgumentError("launch: the CUfunction is null");
  if (absl::Status s = CheckLaunchDims(grid, block); !s.ok()) return s;
  // The 48 KiB default covers static plus dynamic shared memory: opt in when the two together
  // exceed it (the static size is the function's; asked only when dynamic memory is large).
  int static_bytes = 0;
  if (shared_bytes > kDefaultSharedLimit / 2) {
    FUSEJIT_CU_RETURN_IF_ERROR(
        (*api)->cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f),
        "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
  }
  if (shared_bytes + static_cast<unsigned>(static_bytes) > kDefaultSharedLimit) {
    FUSEJIT_CU_RETURN_IF_ERROR(
        (*api)->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   static_cast<int>(shared_bytes)),
        absl::StrCat("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES=", shared_bytes,
                     "): the device's opt-in shared memory limit per block may be lower"));
  }
  if (options.programmatic_serialization) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = block[0];
    config.blockDimY = block[1];
    config.blockDimZ = block[2];
    config.sharedMemBytes = shared_bytes;
    config.hStream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    FUSEJIT_CU_RETURN_IF_ERROR(
        (*api)->cuLaunchKernelEx(&config, f, args, /*extra=*/nullptr),
        absl::StrCat("cuLaunchKernelEx(grid=", Dims(grid), ", block=", Dims(block),
                     ", shared=", shared_bytes, ", programmatic stream serialization)"));
    return absl::OkStatus();
  }
  FUSEJIT_CU_RETURN_IF_ERROR(
      (*api)->cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                             shared_bytes, stream, args, /*extra=*/nullptr),
      absl::StrCat("cuLaunchKernel(grid=", Dims(grid), ", block=", Dims(block),
                   ", shared=", shared_bytes, ")"));
  return absl::OkStatus();
}

}  // namespace fusejit::jit
