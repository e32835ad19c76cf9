// Strategy channel-moments-mean ("x | ops | group_norm | mean" without a convolution): where it
// applies, that the planner picks it and it compiles for every arch and dtype, and on the GPU that
// it matches the float64 reference (random chains, both mean modes, bf16/f16, several chunkings).
#include <gtest/gtest.h>

#include <string>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

constexpr char kName[] = "channel-moments-mean";

const codegen::Strategy& ChannelMoments() {
  const codegen::Strategy* s = codegen::FindStrategy(kName);
  EXPECT_NE(s, nullptr);
  return *s;
}

const char* const kSpecs[] = {
    "x:f32[64,24,16,16,16] | relu | group_norm(groups=6) | mean(dims=[2,3,4])",
    "x:f32[2,8,5,6,7] | group_norm(groups=4) | mean(dims=[1,2,3,4])",
    "x:f32[3,256,3,4,5] | swish | tanh | group_norm(groups=64,eps=0.001) | mean(dims=[2,3,4])",
    "x:f32[1,5,40,40,40] | gelu | group_norm(groups=1) | mean(dims=[1,2,3,4])",
};

TEST(ChannelMomentsMean, AppliesToGroupNormMeanChainsWithoutAConvolution) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kSpecs) {
    const Chain chain = ParseOrFail(spec);
    EXPECT_TRUE(ChannelMoments().Applies(codegen::PlanInput(chain, t))) << spec;
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kName) << spec;  // reads x once; recompute-mean twice
  }
  for (const char* spec : {
           "x:f32[2,8,5,6,7] | group_norm(groups=4) | relu | mean(dims=[2,3,4])",  // post-op
           "x:f32[2,8,5,6,7] | relu | mean(dims=[2,3,4])",                         // no norm
           "x:f32[2,8,5,6,7] | group_norm(groups=4)",                              // no mean
           "x:f32[2,300,5,6,7] | group_norm(groups=4) | mean(dims=[2,3,4])",       // > 256 channels
           "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | group_norm(groups=4) | mean(dims=[2,3,4])",
       }) {
    EXPECT_FALSE(ChannelMoments().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  EXPECT_FALSE(ChannelMoments().HandlesDType(DType::kF64));  // double values: the generic plans
}

TEST(ChannelMomentsMean, CompilesForSm80AndSm90InEveryDtype) {
  testing::ExpectCompilesForEveryArchAndDtype(kSpecs, kName);
}

TEST(ChannelMomentsMean, ValidateRefusesWithTheReason) {
  testing::ExpectValidateRefuses(
      ParseOrFail(kSpecs[1]),  // 210 spatial points
      {"sm_90", 132, Precision::kFp32},
      {{"channel-moments-mean:threads=48,blocks_per_sample=1", "threads 48"},
       {"channel-moments-mean:threads=128,blocks_per_sample=0", "blocks_per_sample 0"},
       {"channel-moments-mean:threads=128,blocks_per_sample=211", "blocks_per_sample 211"},
       {"channel-moments-mean:blocks_per_sample=1,threads=128", "in that order"}});
}

// The GPU test's random chains: enough of them reach the strategy.
TEST(ChannelMomentsMean, RandomChainsReachIt) {
  EXPECT_GE(testing::RandomChainsReaching(ChannelMoments(), 99, 20).size(), 10u);
}

TEST(GpuChannelMomentsMean, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(
      ChannelMoments(), kSpecs,
      {"threads=64,blocks_per_sample=3", "threads=512,blocks_per_sample=1"}, 99);
}

}  // namespace
}  // namespace fusejit
