// Strategy mma-direct (conv3d with a bias, 8/16/24/32 output channels and few input channels,
// then elementwise ops only): where it applies, that the planner picks it over tc-conv for W2's
// and W4's convolutions with an activation, that it compiles for every arch and dtype, and on the
// GPU that it matches the float64 reference.
#include <gtest/gtest.h>

#include <string>

#include "codegen/backward_plan.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

constexpr char kName[] = "mma-direct";

const codegen::Strategy& Direct() {
  const codegen::Strategy* s = codegen::FindStrategy(kName);
  EXPECT_NE(s, nullptr);
  return *s;
}

const char* const kSpecs[] = {
    "x:f32[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish",  // W2's convolution, odd sizes
    "x:f32[3,3,10,12,12] | conv3d(out=24,k=3)",              // W4's, no op
    "x:f32[2,5,9,11,10] | conv3d(out=8,k=[3,4,3],padding=1) | swish | tanh",
    "x:f32[1,4,7,12,40] | conv3d(out=32,k=3,stride=[1,1,2],dilation=[1,2,1]) | gelu",
};

TEST(MmaDirect, AppliesToConvolutionsWithElementwiseOpsOnly) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kSpecs) {
    EXPECT_TRUE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  for (const char* spec : {
           "x:f32[2,3,8,8,8] | conv3d(out=16,k=3) | group_norm(groups=4)",
           "x:f32[2,3,8,8,8] | conv3d(out=16,k=3) | mean(dims=[2,3,4])",
           "x:f32[2,3,8,8,8] | conv3d(out=16,k=3,bias=false) | relu",
           "x:f32[2,3,8,8,8] | conv3d(out=12,k=3) | relu",  // not a multiple of 8
           "x:f32[2,3,8,8,8] | conv3d(out=48,k=3) | relu",  // > 32 channels
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3) | relu",
       }) {
    EXPECT_FALSE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  EXPECT_FALSE(Direct().Applies(
      codegen::PlanInput(ParseOrFail(kSpecs[0]), {"sm_75", 40, Precision::kFp32})));
  EXPECT_FALSE(Direct().HandlesDType(DType::kF64));
  for (const char* spec : {"x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish",
                           "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | relu"}) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(ParseOrFail(spec), t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kName) << spec;
    EXPECT_TRUE(codegen::CanSaveProducerOutput(*plan)) << spec;
  }
}

TEST(MmaDirect, CompilesForSm80AndSm90InEveryDtype) {
  testing::ExpectCompilesForEveryArchAndDtype(kSpecs, kName);
}

TEST(MmaDirect, ValidateRefusesWithTheReason) {
  testing::ExpectValidateRefuses(
      ParseOrFail(kSpecs[0]), {"sm_90", 132, Precision::kFp32},
      {{"mma-direct:warps=64,min_blocks=1,blocks_per_sample=1,unroll_kh=1,pack=0",
        "warps must be in [1, 32]"},
       {"mma-direct:warps=8,min_blocks=1,blocks_per_sample=99,unroll_kh=1,pack=0",
        "blocks_per_sample 99"},
       {"mma-direct:warps=8,min_blocks=1,blocks_per_sample=1,unroll_kh=1",
        "takes the parameters warps"}});
}

// The GPU test's random chains: enough of them reach the strategy.
TEST(MmaDirect, RandomChainsReachIt) {
  EXPECT_GE(testing::RandomChainsReaching(Direct(), 13, 20).size(), 10u);
}

TEST(GpuMmaDirect, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(Direct(), kSpecs,
                                 {"warps=4,min_blocks=1,blocks_per_sample=1,unroll_kh=1,pack=0",
                                  "warps=8,min_blocks=1,blocks_per_sample=2,unroll_kh=2,pack=0"},
                                 13);
}

}  // namespace
}  // namespace fusejit
