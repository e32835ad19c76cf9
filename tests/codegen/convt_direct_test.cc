// Strategy convt-direct (conv_transpose3d with a bias, at most 32 output channels and a cheap
// convolution, then elementwise ops only): where it applies, that the planner picks it over
// tc-conv for few input channels (W1's convolution alone, which the backward recomputes), that it
// compiles for every arch and dtype, and on the GPU that it matches the float64 reference.
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

constexpr char kName[] = "convt-direct";

const codegen::Strategy& Direct() {
  const codegen::Strategy* s = codegen::FindStrategy(kName);
  EXPECT_NE(s, nullptr);
  return *s;
}

const char* const kSpecs[] = {
    // W1's convolution alone (what its recomputing backward runs first).
    "x:f32[4,3,8,16,16] | conv_transpose3d(out=16,k=3,stride=2,padding=1)",
    "x:f32[2,3,5,6,7] | conv_transpose3d(out=5,k=2,stride=[1,2,3],output_padding=[0,1,2]) | tanh",
    "x:f32[3,2,9,9,9] | conv_transpose3d(out=32,k=3,stride=2,padding=1,dilation=2) | gelu | relu",
    "x:f32[1,4,7,5,40] | conv_transpose3d(out=7,k=[1,3,2],stride=[2,1,2],padding=[0,1,1]) | swish",
};

TEST(ConvTDirect, AppliesToTransposedConvolutionsWithElementwiseOpsOnly) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kSpecs) {
    EXPECT_TRUE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  for (const char* spec : {
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3) | group_norm(groups=4)",
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3) | mean(dims=[2,3,4])",
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3,bias=false) | relu",
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=48,k=3) | relu",   // > 32 channels
           "x:f32[2,32,8,8,8] | conv_transpose3d(out=16,k=3) | relu",  // 864 MACs a point
           "x:f32[2,3,8,8,8] | conv3d(out=16,k=3) | relu",
       }) {
    EXPECT_FALSE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  EXPECT_FALSE(Direct().Applies(
      codegen::PlanInput(ParseOrFail(kSpecs[0]), {"sm_75", 40, Precision::kFp32})));
  EXPECT_FALSE(Direct().HandlesDType(DType::kF64));
  // W1's convolution: the planner takes it over tc-conv.
  absl::StatusOr<codegen::Plan> w1 = codegen::MakePlan(
      ParseOrFail("x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1)"), t);
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->strategy, kName);
  // Its kernel can also write u (the training forward of a chain with ops after it).
  EXPECT_TRUE(codegen::CanSaveProducerOutput(*w1));
}

TEST(ConvTDirect, CompilesForSm80AndSm90InEveryDtype) {
  testing::ExpectCompilesForEveryArchAndDtype(kSpecs, kName);
}

TEST(ConvTDirect, ValidateRefusesWithTheReason) {
  testing::ExpectValidateRefuses(
      ParseOrFail(kSpecs[1]), {"sm_90", 132, Precision::kFp32},
      {{"convt-direct:threads=48,min_blocks=2,rows_per_unit=1,write_blocks=1,streaming_stores=1,"
        "coalesce_stores=1",
        "threads 48"},
       {"convt-direct:threads=128,min_blocks=2,rows_per_unit=1,write_blocks=0,streaming_stores=1,"
        "coalesce_stores=1",
        "write_blocks 0"},
       {"convt-direct:threads=128,min_blocks=2,rows_per_unit=1,stat_blocks=1,write_blocks=1,"
        "streaming_stores=1,coalesce_stores=1",
        "takes the parameters threads"}});
}

// The GPU test's random chains: enough of them reach the strategy.
TEST(ConvTDirect, RandomChainsReachIt) {
  EXPECT_GE(testing::RandomChainsReaching(Direct(), 11, 20).size(), 10u);
}

TEST(GpuConvTDirect, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(
      Direct(), kSpecs,
      {"threads=128,min_blocks=2,rows_per_unit=2,write_blocks=1,streaming_stores=0,"
       "coalesce_stores=1",
       "threads=512,min_blocks=1,rows_per_unit=1,write_blocks=1,streaming_stores=1,"
       "coalesce_stores=0"},
      11);
}

}  // namespace
}  // namespace fusejit
