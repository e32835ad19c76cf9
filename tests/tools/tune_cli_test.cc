// `fusejit autotune` without a GPU: help, usage errors, manifests, and the failure without a
// driver (in-process through AutotuneCommand). Its measurements are tested in tests/gpu/gpu_tune_test.cc.
#include <sstream>
#include <string>
#include <vector>

#include "cache/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jit/driver.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace fusejit::tools {
namespace {

using ::testing::HasSubstr;

struct Result {
  int status = 0;
  std::string out, err;
};

Result Autotune(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  Result r;
  r.status = AutotuneCommand(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

const char* const kSpec = "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | group_norm(groups=2) | "
                          "mean(dims=[2,3,4])";

TEST(AutotuneCliTest, HelpNamesTheFlags) {
  Result r = Autotune({"--help"});
  EXPECT_EQ(r.status, kExitOk);
  for (const char* flag : {"--manifest", "--budget-s", "--max-candidates", "--no-store"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  EXPECT_THAT(r.out, HasSubstr("FUSEJIT_DISABLE_TUNING"));
}

TEST(AutotuneCliTest, UsageErrors) {
  EXPECT_EQ(Autotune({}).status, kExitUsage);
  EXPECT_THAT(Autotune({}).err, HasSubstr("no chains"));
  Result r = Autotune({"x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | nosuchop"});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("argument 1"));
  EXPECT_EQ(Autotune({kSpec, "--budget-s", "-1"}).status, kExitUsage);
  EXPECT_EQ(Autotune({kSpec, "--max-candidates", "0"}).status, kExitUsage);
  EXPECT_EQ(Autotune({kSpec, "--precision", "fp16"}).status, kExitUsage);
  // A manifest that does not exist is invalid input, like a bad spec.
  EXPECT_EQ(Autotune({"--manifest", "/nonexistent/manifest.txt"}).status, kExitUsage);
}

TEST(AutotuneCliTest, WithoutADriverItFailsNamingWhy) {
  if (jit::Driver().ok()) GTEST_SKIP() << "a CUDA driver is present";
  cache::testing::TempDir dir;
  const std::string manifest = dir.Sub("m.txt");
  cache::testing::WriteFileOrDie(manifest, std::string(kSpec) + "\nnot a spec\n");
  Result r = Autotune({"--manifest", manifest, "--budget-s", "1"});
  EXPECT_EQ(r.status, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("m.txt:2"));  // the bad line is reported, the rest kept
  EXPECT_THAT(r.err, HasSubstr("no CUDA driver"));
}

}  // namespace
}  // namespace fusejit::tools
