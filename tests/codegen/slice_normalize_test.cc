// Strategy slice-normalize (group_norm chains without a convolution or mean whose (sample, group)
// slice fits in shared memory): where it applies, that the planner picks it where it fills the GPU,
// that it compiles for every arch and dtype, and on the GPU that it matches the float64 reference.
#include <gtest/gtest.h>

#include <string>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

constexpr char kName[] = "slice-normalize";

const codegen::Strategy& Slice() {
  const codegen::Strategy* s = codegen::FindStrategy(kName);
  EXPECT_NE(s, nullptr);
  return *s;
}

const char* const kSpecs[] = {
    "x:f32[8,128,16,16,16] | group_norm(groups=32) | gelu",  // the sweep's G3: 64 KB slices
    "x:f32[4,60,9,10,11] | relu | group_norm(groups=20,eps=0.001) | tanh",
    "x:f32[16,48,12,12,12] | swish | hardswish | group_norm(groups=8)",   // 55 KB slices
    "x:f32[3,5,7,6,5] | group_norm(groups=5) | clamp(min=-0.5,max=0.8)",  // odd sizes
};

TEST(SliceNormalize, AppliesToSmallGroupsWithoutAConvolutionOrMean) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kSpecs) {
    EXPECT_TRUE(Slice().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  for (const char* spec : {
           "x:f32[16,64,32,32,32] | group_norm(groups=8) | relu",  // 1 MB slices
           "x:f32[2,8,5,6,7] | group_norm(groups=4) | mean(dims=[2,3,4])",
           "x:f32[2,8,5,6,7] | relu",
           "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | group_norm(groups=4)",
       }) {
    EXPECT_FALSE(Slice().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  // 128 KB slices fit sm_90's 227 KB of shared memory, not sm_86's 99 KB.
  const Chain big = ParseOrFail("x:f32[8,128,16,16,32] | group_norm(groups=32) | gelu");
  EXPECT_TRUE(Slice().Applies(codegen::PlanInput(big, t)));
  EXPECT_FALSE(Slice().Applies(codegen::PlanInput(big, {"sm_86", 84, Precision::kFp32})));
  EXPECT_FALSE(Slice().HandlesDType(DType::kF64));
  // The planner takes it where the (sample, group) blocks fill the GPU (G3: 256 blocks) and the
  // generic two passes for a handful of blocks.
  absl::StatusOr<codegen::Plan> g3 = codegen::MakePlan(ParseOrFail(kSpecs[0]), t);
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(g3->strategy, kName);
  absl::StatusOr<codegen::Plan> few = codegen::MakePlan(ParseOrFail(kSpecs[3]), t);
  ASSERT_TRUE(few.ok()) << few.status();
  EXPECT_NE(few->strategy, kName);
}

TEST(SliceNormalize, CompilesForSm80AndSm90InEveryDtype) {
  testing::ExpectCompilesForEveryArchAndDtype(kSpecs, kName);
}

TEST(SliceNormalize, ValidateRefusesWithTheReason) {
  testing::ExpectValidateRefuses(ParseOrFail(kSpecs[1]), {"sm_90", 132, Precision::kFp32},
                                 {{"slice-normalize:threads=48", "threads 48"},
                                  {"slice-normalize:threads=2048", "threads 2048"},
                                  {"slice-normalize:warps=4", "takes the parameters threads"}});
}

// The GPU test's random chains: enough of them reach the strategy.
TEST(SliceNormalize, RandomChainsReachIt) {
  EXPECT_GE(testing::RandomChainsReaching(Slice(), 7, 20).size(), 10u);
}

TEST(GpuSliceNormalize, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(Slice(), kSpecs, {"threads=128", "threads=1024"}, 7);
}

}  // namespace
}  // namespace fusejit
