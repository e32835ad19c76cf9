// The cache with a real NVRTC cubin as its payload: compiled once, read back bit-identical by
// another cache instance, the NVRTC version in the key.
#include <nvrtc.h>

#include <string>

#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

constexpr char kSource[] =
    "extern \"C\" __global__ void scale(float* x, float a) {\n"
    "  x[threadIdx.x] *= a;\n"
    "}\n";

absl::StatusOr<std::string> CompileCubin(const char* arch_option) {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, kSource, "scale.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
    return absl::InternalError("nvrtcCreateProgram failed");
  }
  const char* options[] = {arch_option};
  const nvrtcResult compiled = nvrtcCompileProgram(prog, 1, options);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  std::string cubin;
  size_t size = 0;
  if (compiled == NVRTC_SUCCESS && nvrtcGetCUBINSize(prog, &size) == NVRTC_SUCCESS) {
    cubin.resize(size);
    if (nvrtcGetCUBIN(prog, cubin.data()) != NVRTC_SUCCESS) cubin.clear();
  }
  nvrtcDestroyProgram(&prog);
  if (cubin.empty()) return absl::InternalError("nvrtc: " + log);
  return cubin;
}

TEST(CacheNvrtc, CubinRoundTripsThroughTheDiskCache) {
  int major = 0, minor = 0;
  ASSERT_EQ(nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  CacheKey key;
  key.source_hash = HashSource(kSource);
  key.generator_version = "fusejit-test 1";
  key.nvrtc_version = fmt::format("{}.{}", major, minor);
  key.options = "--gpu-architecture=sm_90";
  key.arch = "sm_90";
  key.spec = "scale";
  testing::TempDir tmp;
  CacheOptions o;
  o.dir = tmp.Sub("cache");
  int compiles = 0;
  std::string first;
  {
    KernelCache cache(o);
    absl::StatusOr<std::string> cubin = cache.GetOrCompile(key, [&] {
      ++compiles;
      return CompileCubin("--gpu-architecture=sm_90");
    });
    ASSERT_TRUE(cubin.ok()) << cubin.status();
    ASSERT_GT(cubin->size(), 4u);
    EXPECT_EQ(cubin->substr(0, 4),
              "\x7f"
              "ELF");
    first = *cubin;
  }
  KernelCache cache(o);
  bool hit = false;
  absl::StatusOr<std::string> again = cache.GetOrCompile(
      key,
      [&] {
        ++compiles;
        return CompileCubin("--gpu-architecture=sm_90");
      },
      &hit);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(*again, first);
  EXPECT_EQ(compiles, 1);
}

}  // namespace
}  // namespace fusejit::cache
