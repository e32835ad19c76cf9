// Tests of jit/: NVRTC compilation (CPU), driver loading errors (CPU), and module load, launch,
// buffers and timing (Gpu*, skipped without a CUDA driver).
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "fusejit/fusejit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "jit/module.h"
#include "jit/nvrtc.h"

namespace fusejit {
namespace {

using ::testing::HasSubstr;

constexpr char kSaxpySource[] = R"(
#include "scale.cuh"
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = Scale(a, x[i]) + y[i];
}
)";
constexpr char kScaleHeader[] =
    "__device__ inline float Scale(float a, float x) { return a * x; }\n";

jit::NvrtcRequest SaxpyRequest(const std::string& arch) {
  jit::NvrtcRequest request;
  request.name = "saxpy.cu";
  request.source = kSaxpySource;
  request.headers = {{"scale.cuh", kScaleHeader}};
  request.arch = arch;
  return request;
}

// ---- NVRTC (no GPU needed) ----------------------------------------------------------------------

TEST(JitNvrtc, CompilesToElfCubinForSm80AndSm90) {
  for (const char* arch : {"sm_80", "sm_90"}) {
    absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(SaxpyRequest(arch));
    ASSERT_TRUE(result.ok()) << arch << ": " << result.status();
    ASSERT_GE(result->cubin.size(), 4u) << arch;
    EXPECT_EQ(result->cubin.substr(0, 4), std::string("\x7f"
                                                      "ELF"))
        << arch;
    EXPECT_TRUE(result->ptx.empty()) << arch;
    EXPECT_GT(result->compile_ms, 0) << arch;
  }
}

TEST(JitNvrtc, WantPtxAlsoReturnsPtx) {
  jit::NvrtcRequest request = SaxpyRequest("sm_90");
  request.want_ptx = true;
  absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->cubin.empty());
  EXPECT_THAT(result->ptx, HasSubstr(".entry saxpy"));
  EXPECT_THAT(result->ptx, HasSubstr(".target sm_90"));
}

TEST(JitNvrtc, ExtraOptionsArePassed) {
  jit::NvrtcRequest request = SaxpyRequest("sm_80");
  request.source = "#if FUSEJIT_FLAG != 7\n#error flag missing\n#endif\n" + request.source;
  request.options = {"-DFUSEJIT_FLAG=7"};
  absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
  EXPECT_TRUE(result.ok()) << result.status();
}

TEST(JitNvrtc, SyntaxErrorReturnsTheLog) {
  jit::NvrtcRequest request = SaxpyRequest("sm_80");
  request.name = "broken.cu";
  request.source =
      "extern \"C\" __global__ void k(float* y) { y[0] = undefined_identifier_xyz; }\n";
  absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("undefined_identifier_xyz"));
  EXPECT_THAT(result.status().message(), HasSubstr("broken.cu"));
}

TEST(JitNvrtc, MissingHeaderIsReported) {
  jit::NvrtcRequest request = SaxpyRequest("sm_80");
  request.headers.clear();
  absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("scale.cuh"));
}

TEST(JitNvrtc, BadArchIsRefused) {
  for (const char* arch : {"foo", "", "sm_", "sm_8", "sm_1000", "sm_4x", "compute_90", "sm_30"}) {
    absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(SaxpyRequest(arch));
    ASSERT_FALSE(result.ok()) << arch;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << arch;
    EXPECT_EQ(
        result.status().message(),
        std::string("arch '") + arch + "' is not valid: expected sm_XX such as sm_80 or sm_90");
  }
}

TEST(JitNvrtc, ArchNumbers) {
  EXPECT_EQ(*jit::ArchNumber("sm_80"), 80);
  EXPECT_EQ(*jit::ArchNumber("sm_90a"), 90);
  EXPECT_EQ(*jit::ArchNumber("sm_100f"), 100);
  for (const char* arch : {"foo", "", "sm_", "sm_8", "sm_1000", "compute_90"}) {
    EXPECT_EQ(jit::ArchNumber(arch).status().code(), absl::StatusCode::kInvalidArgument) << arch;
  }
}

TEST(JitNvrtc, UnsupportedArchNamesTheSupportedOnes) {
  std::vector<std::string> supported = jit::SupportedArchs();
  ASSERT_FALSE(supported.empty());
  absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(SaxpyRequest("sm_51"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("not supported"));
  EXPECT_THAT(result.status().message(), HasSubstr(supported.back()));
}

TEST(JitNvrtc, VersionAndSupportedArchs) {
  EXPECT_FALSE(jit::NvrtcVersion().empty());
  EXPECT_NE(jit::NvrtcVersion(), "unknown");
  std::vector<std::string> archs = jit::SupportedArchs();
  EXPECT_THAT(archs, ::testing::Contains("sm_80"));
  EXPECT_THAT(archs, ::testing::Contains("sm_90"));
}

TEST(JitNvrtc, ConcurrentCompilesSucceed) {
  constexpr int kThreads = 4;
  std::vector<absl::Status> statuses(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &statuses] {
      jit::NvrtcRequest request = SaxpyRequest(t % 2 == 0 ? "sm_80" : "sm_90");
      request.options = {"-DTHREAD=" + std::to_string(t)};
      absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
      statuses[t] = result.ok() && result->cubin.size() > 4 ? absl::OkStatus()
                                                            : absl::InternalError("failed");
      if (!result.ok()) statuses[t] = result.status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(statuses[t].ok()) << t << ": " << statuses[t];
}

// ---- Driver loading (no GPU needed) -------------------------------------------------------------

TEST(JitDriver, DriverReportsItsAbsenceClearly) {
  absl::StatusOr<const jit::DriverApi*> api = jit::Driver();
  EXPECT_EQ(api.ok(), jit::DriverAvailable());
  if (jit::DriverAvailable()) {
    ASSERT_TRUE(api.ok()) << api.status();
    EXPECT_NE((*api)->cuLaunchKernel, nullptr);
    EXPECT_GE((*api)->driver_version, CUDA_VERSION / 1000 * 1000);
  } else {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(api.status().message(), HasSubstr("no CUDA driver found"));
    EXPECT_THAT(api.status().message(), HasSubstr("launching kernels needs an NVIDIA GPU"));
  }
}

TEST(JitDriver, MissingLibraryIsNamed) {
  absl::StatusOr<jit::DriverApi> api = jit::LoadDriverApi("libfusejit_no_such_driver.so.1");
  ASSERT_FALSE(api.ok());
  EXPECT_THAT(api.status().message(), HasSubstr("no CUDA driver found"));
  EXPECT_THAT(api.status().message(), HasSubstr("libfusejit_no_such_driver.so.1"));
}

TEST(JitDriver, LibraryWithoutEntryPointsIsRefused) {
  // libm opens fine but is not a CUDA driver.
  absl::StatusOr<jit::DriverApi> api = jit::LoadDriverApi("libm.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(api.status().message(), HasSubstr("has no entry point cuDriverGetVersion"));
}

TEST(JitDriver, CuCheckNamesTheResult) {
  EXPECT_TRUE(jit::CuCheck(CUDA_SUCCESS, "anything").ok());
  absl::Status oom = jit::CuCheck(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(64 bytes)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("cuMemAlloc(64 bytes): CUDA_ERROR_OUT_OF_MEMORY"));
  absl::Status no_device = jit::CuCheck(CUDA_ERROR_NO_DEVICE, "cuInit");
  EXPECT_EQ(no_device.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_device.message(), HasSubstr("CUDA_ERROR_NO_DEVICE"));
  EXPECT_EQ(jit::CuCheck(CUDA_ERROR_ILLEGAL_ADDRESS, "sync").code(), absl::StatusCode::kInternal);
}

TEST(JitDriver, ResolvesBaseNamesToCudaHeaderVariants) {
  // cuda.h maps cuMemAlloc to cuMemAlloc_v2; DriverApi's member must carry that ABI.
  jit::DriverApi api;
  static_assert(std::is_same_v<decltype(api.cuMemAlloc), decltype(&::cuMemAlloc_v2)>);
  static_assert(
      std::is_same_v<decltype(api.cuEventElapsedTime), decltype(&::cuEventElapsedTime_v2)>);
  EXPECT_EQ(api.cuMemAlloc, nullptr);
}

TEST(JitDriver, WithoutDriverEverythingFailsCleanly) {
  if (jit::DriverAvailable()) GTEST_SKIP() << "a CUDA driver is present";
  EXPECT_THAT(jit::LoadedModule::Load("\x7f"
                                      "ELF....")
                  .status()
                  .message(),
              HasSubstr("no CUDA driver found"));
  EXPECT_THAT(jit::CurrentArch().status().message(), HasSubstr("no CUDA driver found"));
  EXPECT_THAT(jit::ScopedPrimaryContext::Create(0).status().message(),
              HasSubstr("no CUDA driver found"));
  EXPECT_THAT(jit::DeviceBuffer::Allocate(16).status().message(),
              HasSubstr("no CUDA driver found"));
  EXPECT_THAT(Workspace::Allocate(256).status().message(), HasSubstr("no CUDA driver found"));
}

TEST(JitWorkspace, EmptyWorkspaceNeedsNoDriver) {
  absl::StatusOr<Workspace> ws = Workspace::Allocate(0);
  ASSERT_TRUE(ws.ok()) << ws.status();
  EXPECT_EQ(ws->get(), 0u);
  EXPECT_EQ(ws->size(), 0u);
  Workspace moved = *std::move(ws);
  EXPECT_EQ(moved.get(), 0u);
}

TEST(JitDevice, MedianOfSamples) {
  EXPECT_TRUE(std::isnan(jit::Median({})));
  EXPECT_DOUBLE_EQ(jit::Median({3.0f}), 3.0);
  EXPECT_DOUBLE_EQ(jit::Median({5.0f, 1.0f, 3.0f}), 3.0);
  EXPECT_DOUBLE_EQ(jit::Median({4.0f, 1.0f, 3.0f, 2.0f}), 2.5);
}

TEST(JitDevice, EmptyBufferNeedsNoDriver) {
  absl::StatusOr<jit::DeviceBuffer> buffer = jit::DeviceBuffer::Allocate(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->ptr(), 0u);
  float f = 0;
  EXPECT_EQ(buffer->CopyFromHost(&f, sizeof(f)).code(), absl::StatusCode::kOutOfRange);
}

// ---- GPU ----------------------------------------------------------------------------------------

#define SKIP_WITHOUT_DRIVER() \
  if (!jit::DriverAvailable()) GTEST_SKIP() << "no CUDA driver: " << jit::Driver().status()

#define ASSERT_OK_AND_ASSIGN(lhs, expr)            \
  auto lhs##_or = (expr);                          \
  ASSERT_TRUE(lhs##_or.ok()) << lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

TEST(GpuJit, SaxpyRoundTrip) {
  SKIP_WITHOUT_DRIVER();
  ASSERT_OK_AND_ASSIGN(ctx, jit::ScopedPrimaryContext::Create(0));
  ASSERT_OK_AND_ASSIGN(info, jit::CurrentDeviceInfo());
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_mem, 0u);
  ASSERT_OK_AND_ASSIGN(arch, jit::CurrentArch());
  EXPECT_EQ(arch, info.arch);
  ASSERT_OK_AND_ASSIGN(compiled, jit::CompileCuda(SaxpyRequest(arch)));
  ASSERT_OK_AND_ASSIGN(module, jit::LoadedModule::Load(compiled.cubin));
  ASSERT_OK_AND_ASSIGN(saxpy, module->Function("saxpy"));

  int n = 1000;
  float a = 2.5f;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<float>(n - i);
  }
  ASSERT_OK_AND_ASSIGN(dx, jit::DeviceBuffer::Allocate(n * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(dy, jit::DeviceBuffer::Allocate(n * sizeof(float)));
  ASSERT_TRUE(dx.CopyFromHost(x.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(dy.CopyFromHost(y.data(), n * sizeof(float)).ok());
  CUdeviceptr px = dx.ptr(), py = dy.ptr();
  void* args[] = {&n, &a, &px, &py};
  absl::Status launched =
      jit::Launch(saxpy, {(n + 255) / 256u, 1, 1}, {256, 1, 1}, 0, nullptr, args);
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(jit::CuCheck((*jit::Driver())->cuCtxSynchronize(), "cuCtxSynchronize").ok());
  std::vector<float> out(n);
  ASSERT_TRUE(dy.CopyToHost(out.data(), n * sizeof(float)).ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], a * x[i] + y[i]) << i;
}

TEST(GpuJit, ErrorsAreStatusesNotCrashes) {
  SKIP_WITHOUT_DRIVER();
  ASSERT_OK_AND_ASSIGN(ctx, jit::ScopedPrimaryContext::Create(0));
  ASSERT_OK_AND_ASSIGN(arch, jit::CurrentArch());
  ASSERT_OK_AND_ASSIGN(compiled, jit::CompileCuda(SaxpyRequest(arch)));
  ASSERT_OK_AND_ASSIGN(module, jit::LoadedModule::Load(compiled.cubin));
  absl::StatusOr<CUfunction> missing = module->Function("no_such_kernel");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("no_such_kernel"));
  ASSERT_OK_AND_ASSIGN(saxpy, module->Function("saxpy"));

  int n = 0;
  float a = 1;
  CUdeviceptr null_ptr = 0;
  void* args[] = {&n, &a, &null_ptr, &null_ptr};
  absl::Status too_big = jit::Launch(saxpy, {1, 1, 1}, {2048, 1, 1}, 0, nullptr, args);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("2048"));
  EXPECT_FALSE(jit::Launch(saxpy, {0, 1, 1}, {32, 1, 1}, 0, nullptr, args).ok());
  EXPECT_FALSE(jit::Launch(saxpy, {1, 70000, 1}, {32, 1, 1}, 0, nullptr, args).ok());
  EXPECT_FALSE(jit::Launch(saxpy, {1, 1, 1}, {32, 32, 2}, 0, nullptr, args).ok());
  // Far more dynamic shared memory than any GPU offers: refused by the driver, as a status.
  EXPECT_FALSE(jit::Launch(saxpy, {1, 1, 1}, {32, 1, 1}, 16u << 20, nullptr, args).ok());
  // A valid launch still works afterwards (n = 0 touches no memory).
  EXPECT_TRUE(jit::Launch(saxpy, {1, 1, 1}, {32, 1, 1}, 0, nullptr, args).ok());
  EXPECT_TRUE(jit::CuCheck((*jit::Driver())->cuCtxSynchronize(), "cuCtxSynchronize").ok());

  std::string not_a_cubin(4096, '\0');
  not_a_cubin.replace(0, 4,
                      "\x7f"
                      "ELF");
  absl::StatusOr<std::unique_ptr<jit::LoadedModule>> garbage = jit::LoadedModule::Load(not_a_cubin);
  EXPECT_FALSE(garbage.ok());
}

TEST(GpuJit, BuffersWorkspaceAndFill) {
  SKIP_WITHOUT_DRIVER();
  ASSERT_OK_AND_ASSIGN(ctx, jit::ScopedPrimaryContext::Create(0));
  ASSERT_OK_AND_ASSIGN(buffer, jit::DeviceBuffer::Allocate(64 * sizeof(float)));
  ASSERT_TRUE(buffer.FillFloat(std::nanf("")).ok());
  std::vector<float> host(64, 0.0f);
  ASSERT_TRUE(buffer.CopyToHost(host.data(), host.size() * sizeof(float)).ok());
  for (float v : host) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(buffer.CopyToHost(host.data(), 65 * sizeof(float)).code(),
            absl::StatusCode::kOutOfRange);
  jit::DeviceBuffer moved = std::move(buffer);
  EXPECT_EQ(buffer.ptr(), 0u);  // NOLINT: moved-from is empty by contract
  EXPECT_NE(moved.ptr(), 0u);

  ASSERT_OK_AND_ASSIGN(ws, Workspace::Allocate(1000));
  EXPECT_NE(ws.get(), 0u);
  EXPECT_EQ(ws.get() % 256, 0u);
  EXPECT_EQ(ws.size(), 1000u);
  EXPECT_FALSE(jit::ScopedPrimaryContext::Create(1 << 20).ok());
}

TEST(GpuJit, EventTimerReturnsPositiveTimes) {
  SKIP_WITHOUT_DRIVER();
  ASSERT_OK_AND_ASSIGN(ctx, jit::ScopedPrimaryContext::Create(0));
  ASSERT_OK_AND_ASSIGN(arch, jit::CurrentArch());
  ASSERT_OK_AND_ASSIGN(compiled, jit::CompileCuda(SaxpyRequest(arch)));
  ASSERT_OK_AND_ASSIGN(module, jit::LoadedModule::Load(compiled.cubin));
  ASSERT_OK_AND_ASSIGN(saxpy, module->Function("saxpy"));
  int n = 1 << 22;
  float a = 1.5f;
  ASSERT_OK_AND_ASSIGN(dx, jit::DeviceBuffer::Allocate(n * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(dy, jit::DeviceBuffer::Allocate(n * sizeof(float)));
  ASSERT_TRUE(dx.FillFloat(1.0f).ok());
  ASSERT_TRUE(dy.FillFloat(0.0f).ok());
  CUdeviceptr px = dx.ptr(), py = dy.ptr();
  void* args[] = {&n, &a, &px, &py};
  absl::StatusOr<std::vector<float>> times = jit::EventTimer::Time(nullptr, 2, 5, [&] {
    return jit::Launch(saxpy, {static_cast<unsigned>(n / 256), 1, 1}, {256, 1, 1}, 0, nullptr,
                       args);
  });
  ASSERT_TRUE(times.ok()) << times.status();
  ASSERT_EQ(times->size(), 5u);
  for (float ms : *times) EXPECT_GT(ms, 0.0f);
  EXPECT_GT(jit::Median(*times), 0.0);
  EXPECT_FALSE(jit::EventTimer::Time(nullptr, 0, 0, [] { return absl::OkStatus(); }).ok());
}

}  // namespace
}  // namespace fusejit
