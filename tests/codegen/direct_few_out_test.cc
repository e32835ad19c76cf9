// Strategy direct-few-out (few output channels, e.g. a convolution's data gradient): where it
// applies, that it compiles for every arch, and on the GPU that it matches the float64 reference.
#include <gtest/gtest.h>

#include <string>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

Chain Parse(const std::string& spec) { return ParseOrFail(spec); }

const codegen::Strategy& FewOut() {
  const codegen::Strategy* s = codegen::FindStrategy("direct-few-out");
  EXPECT_NE(s, nullptr);
  return *s;
}

const char* const kSpecs[] = {
    "x:f32[2,16,9,10,11] | conv_transpose3d(out=3,k=4,bias=false)",
    "x:f32[2,24,7,8,9] | conv_transpose3d(out=3,k=3,padding=1,dilation=2) | tanh",
    "x:f32[2,16,11,13,13] | conv3d(out=3,k=3,stride=2,padding=1,bias=false)",
    "x:f32[3,5,6,7,19] | conv3d(out=8,k=[2,3,4],stride=[1,2,3],padding=[0,1,2],dilation=[2,1,1]) | swish",
    "x:f32[1,40,5,5,5] | conv3d(out=1,k=3,padding=1) | relu",
    // 1x1x1 kernels: up to 32 output channels (fewer outputs a thread).
    "x:f32[3,40,7,9,37] | conv3d(out=20,k=1) | gelu",
    "x:f32[2,24,5,6,33] | conv_transpose3d(out=32,k=1,bias=false) | sigmoid",
    "x:f32[2,12,9,9,9] | conv3d(out=17,k=1,stride=2)",
};

TEST(DirectFewOut, AppliesToFewOutputChannelsWithoutNormOrMean) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kSpecs)
    EXPECT_TRUE(FewOut().Applies(codegen::PlanInput(Parse(spec), t))) << spec;
  for (const char* spec : {
           "x:f32[2,16,9,10,11] | conv3d(out=9,k=3)",  // 9 channels
           "x:f32[2,16,9,10,11] | conv3d(out=33,k=1)",  // 1x1x1: 33 channels
           "x:f32[2,16,9,10,11] | conv_transpose3d(out=3,k=3,stride=2)",  // transposed, stride 2
           "x:f32[2,16,9,10,11] | conv3d(out=4,k=3) | group_norm(groups=2)",
           "x:f32[2,16,9,10,11] | conv3d(out=4,k=3) | mean(dims=[2,3,4])",
           "x:f32[2,4,9,10,11] | relu",
       }) {
    EXPECT_FALSE(FewOut().Applies(codegen::PlanInput(Parse(spec), t))) << spec;
  }
}

// Eight outputs along w a thread by default; two where a conv3d is strided along h and w (the
// autotuner's finding on the H100: 1.35x to 2.1x faster there, slower elsewhere). Two output
// rows a thread where rows share input rows (stride 1 along h), the kernel has 4 or more rows and
// the sums fit 64 registers.
TEST(DirectFewOut, DefaultOutputsPerThreadFollowTheStride) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  struct Case {
    const char* spec;
    const char* config;
  };
  for (const Case& c : {
           Case{"x:f32[128,16,31,63,63] | conv3d(out=3,k=3,stride=2,padding=1,bias=false)",
                "direct-few-out:tw=2,th=1,threads=128"},
           Case{"x:f32[2,16,11,13,13] | conv3d(out=3,k=[3,3,3],stride=[1,2,2]) | tanh",
                "direct-few-out:tw=2,th=1,threads=128"},
           Case{"x:f32[2,16,11,13,29] | conv3d(out=3,k=3,stride=[1,1,2])",
                "direct-few-out:tw=8,th=1,threads=128"},
           Case{"x:f32[2,16,11,13,13] | conv3d(out=3,k=3,stride=[1,1,2])",  // w is 6
                "direct-few-out:tw=6,th=1,threads=128"},
           Case{"x:f32[2,16,9,10,11] | conv_transpose3d(out=3,k=4,bias=false)",
                "direct-few-out:tw=8,th=2,threads=128"},
           Case{"x:f32[2,16,9,10,3] | conv3d(out=3,k=1)", "direct-few-out:tw=3,th=1,threads=128"},
           Case{"x:f32[2,16,9,10,3] | conv3d(out=3,k=[1,5,1],padding=[0,2,0])",
                "direct-few-out:tw=3,th=2,threads=128"},
           // 8 channels: 2 x 8 x 8 sums would not fit.
           Case{"x:f32[2,16,9,10,11] | conv3d(out=8,k=4)", "direct-few-out:tw=8,th=1,threads=128"},
       }) {
    EXPECT_EQ(FewOut().DefaultConfig(codegen::PlanInput(Parse(c.spec), t)).ToString(), c.config)
        << c.spec;
  }
}

TEST(DirectFewOut, CompilesForSm75Sm80AndSm90AndRefusesBadConfigs) {
  for (const char* spec : kSpecs) {
    for (const char* arch : {"sm_75", "sm_80", "sm_90"}) {
      CompileOptions o;
      o.arch = arch;
      o.strategy = "direct-few-out";
      o.use_cache = false;
      absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(spec), o);
      ASSERT_TRUE(c.ok()) << spec << " " << arch << ": " << c.status();
    }
  }
  CompileOptions o;
  o.arch = "sm_90";
  o.tune_config = "direct-few-out:tw=9,th=1,threads=128";
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(kSpecs[0]), o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tw 9 is not in [1, 8]"), std::string::npos) << c.status();
  o.tune_config = "direct-few-out:tw=2,th=2,threads=128";  // kSpecs[2] is strided along h
  c = Compile(Parse(kSpecs[2]), o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("needs stride 1 along h"), std::string::npos) << c.status();
  o.tune_config = "direct-few-out:tw=8,th=4,threads=128";  // 4 x 3 x 8 sums
  c = Compile(Parse(kSpecs[0]), o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("exceed 64 registers"), std::string::npos) << c.status();
  o.tune_config = "direct-few-out:tw=8,threads=128";  // th missing
  c = Compile(Parse(kSpecs[0]), o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tw,th,threads"), std::string::npos) << c.status();
}

TEST(GpuDirectFewOut, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const char* spec : kSpecs) {
    // Row tiles of 1, 2 and 4 (the last two where the spec's stride along h allows them).
    for (const char* config :
         {"", "tw=1,th=1,threads=64", "tw=2,th=1,threads=256", "tw=8,th=1,threads=128",
          "tw=4,th=4,threads=64", "tw=8,th=2,threads=128", "tw=3,th=2,threads=96"}) {
      CompileOptions o;
      o.strategy = "direct-few-out";
      if (*config) {
        o.tune_config = std::string("direct-few-out:") + config;
        const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
        if (!FewOut()
                 .Validate(codegen::PlanInput(Parse(spec), t),
                           *codegen::TuneConfig::Parse(o.tune_config))
                 .ok()) {
          continue;
        }
      }
      testing::CheckChainWithOptions(Parse(spec), seed, o);
    }
    ++seed;
  }
  // Random chains it applies to.
  Rng rng(77);
  int checked = 0;
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (int i = 0; i < 400 && checked < 25; ++i) {
    const Chain c = RandomChain(rng);
    if (!FewOut().Applies(codegen::PlanInput(c, t))) continue;
    CompileOptions o;
    o.strategy = "direct-few-out";
    testing::CheckChainWithOptions(c, 100 + i, o);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace fusejit
