// Strategies mma-convt-recompute-normalize and mma-convt-direct (templates/mma_convt.cuh:
// conv_transpose3d with a bias, at most 16 input and 32 output channels, on tensor cores by output
// phase): where they apply, that they compile for every arch and dtype, that Validate explains a
// refusal, and on the GPU that they match the float64 reference (odd channel counts, per-dimension
// strides, padding, dilation, output_padding; poisoned outputs; two runs bitwise equal).
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

const codegen::Strategy& Find(const char* name) {
  const codegen::Strategy* s = codegen::FindStrategy(name);
  EXPECT_NE(s, nullptr) << name;
  return *s;
}
const codegen::Strategy& Recompute() { return Find("mma-convt-recompute-normalize"); }
const codegen::Strategy& Direct() { return Find("mma-convt-direct"); }

const char* const kNormSpecs[] = {
    // W1's chain at a small size.
    "x:f32[2,3,5,6,7] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
    "group_norm(groups=4) | hardswish",
    // Odd channel counts, per-dimension kernel, stride, padding and output_padding.
    "x:f32[2,5,4,5,6] | conv_transpose3d(out=12,k=[3,2,4],stride=[2,1,3],padding=[1,0,2],"
    "output_padding=[1,0,1]) | relu | group_norm(groups=3)",
    // Dilation, post ops.
    "x:f32[1,8,3,4,9] | conv_transpose3d(out=24,k=3,stride=2,dilation=2,padding=1) | gelu | "
    "group_norm(groups=6) | tanh",
    // 16 input, 32 output channels, stride 1 (three k16 steps a tap row).
    "x:f32[2,16,3,4,10] | conv_transpose3d(out=32,k=3,padding=1) | group_norm(groups=8)",
    // One input channel, three outputs, kernel = stride (one tap a phase).
    "x:f32[3,1,4,4,4] | conv_transpose3d(out=3,k=2,stride=2) | group_norm(groups=1) | relu",
};

const char* const kDirectSpecs[] = {
    "x:f32[2,3,6,7,8] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish",
    "x:f32[2,6,4,5,6] | conv_transpose3d(out=10,k=[2,3,3],stride=[1,2,2],output_padding=[0,1,0])",
    "x:f32[1,4,3,3,20] | conv_transpose3d(out=8,k=4,stride=3,padding=1) | hardswish",
    // A w phase without taps (kernel 1, stride 2): those outputs are the bias alone.
    "x:f32[2,3,4,5,6] | conv_transpose3d(out=8,k=1,stride=2) | leaky_relu(negative_slope=0.1)",
};

TEST(MmaConvT, AppliesToFewChannelTransposedConvolutions) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (const char* spec : kNormSpecs) {
    EXPECT_TRUE(Recompute().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
    EXPECT_FALSE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  for (const char* spec : kDirectSpecs) {
    EXPECT_TRUE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
    EXPECT_FALSE(Recompute().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  for (const char* spec : {
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3,bias=false) | relu",
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=48,k=3) | relu",   // > 32 outputs
           "x:f32[2,20,8,8,8] | conv_transpose3d(out=16,k=3) | relu",  // > 16 inputs
           "x:f32[2,3,8,8,8] | conv3d(out=16,k=3) | relu",             // not transposed
           "x:f32[2,3,8,8,8] | conv_transpose3d(out=16,k=3) | group_norm(groups=4) | "
           "mean(dims=[2,3,4])",
           "x:f32[2,3,4,4,40] | conv_transpose3d(out=32,k=3,stride=2)",  // 128 accumulators
       }) {
    EXPECT_FALSE(Direct().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
    EXPECT_FALSE(Recompute().Applies(codegen::PlanInput(ParseOrFail(spec), t))) << spec;
  }
  EXPECT_FALSE(Recompute().Applies(
      codegen::PlanInput(ParseOrFail(kNormSpecs[0]), {"sm_75", 40, Precision::kFp32})));
  EXPECT_FALSE(Recompute().HandlesDType(DType::kF64));
  EXPECT_TRUE(Direct().HandlesDType(DType::kBF16));
}

// The planner picks the recompute plan only where it was measured faster (mma_convt_strategy.cc
// MeasuredDomain): strided, few taps a phase, at least 4 input channels, whole n8 tiles, rows of
// 32+ points, a block an SM; W1 (3 channels) keeps the FFMA kernels, stride 1, 8-tap phases,
// short rows (the sweep's T7) and small grids keep tc-conv; the
// direct plan was not measured faster anywhere yet (nullptr: neither of them).
TEST(MmaConvT, PlannerPicksThemWhereMeasuredFaster) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  const std::pair<const char*, const char*> cases[] = {
      {"x:f32[16,16,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | relu | "
       "group_norm(groups=4)",
       "mma-convt-recompute-normalize"},
      {"x:bf16[16,16,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | relu | "
       "group_norm(groups=4)",
       "mma-convt-recompute-normalize"},
      {"x:f32[32,4,16,24,24] | conv_transpose3d(out=32,k=2,stride=2) | group_norm(groups=8)",
       "mma-convt-recompute-normalize"},
      {"x:f32[16,8,16,24,24] | conv_transpose3d(out=16,k=2,stride=2) | gelu", nullptr},
      {"x:f32[8,12,8,16,16] | conv_transpose3d(out=20,k=3,stride=2,padding=1,output_padding=1) "
       "| swish | group_norm(groups=5) | relu",
       "tc-conv"},
      {"x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4,eps=1e-5) | hardswish",
       "convt-recompute-normalize"},
      {"x:f32[8,8,16,32,32] | conv_transpose3d(out=32,k=3,padding=1) | gelu | group_norm(groups=8)",
       "tc-conv"},
      {"x:f32[16,8,16,16,16] | conv_transpose3d(out=24,k=4,stride=2,padding=1) | swish", "tc-conv"},
      {"x:f32[32,12,12,12,12] | conv_transpose3d(out=18,k=3,stride=2) | swish | "
       "group_norm(groups=3) | hardswish",
       nullptr},
  };
  for (const auto& [spec, want] : cases) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(ParseOrFail(spec), t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (want == nullptr) {  // anything but this file's strategies
      EXPECT_EQ(plan->strategy.rfind("mma-convt", 0), std::string::npos) << spec;
    } else {
      EXPECT_EQ(plan->strategy, want) << spec << "\n" << plan->choice;
    }
  }
}

TEST(MmaConvT, CompilesForSm80AndSm90InEveryDtype) {
  testing::ExpectCompilesForEveryArchAndDtype(kNormSpecs, "mma-convt-recompute-normalize");
  testing::ExpectCompilesForEveryArchAndDtype(kDirectSpecs, "mma-convt-direct");
}

TEST(MmaConvT, ValidateRefusesWithTheReason) {
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  testing::ExpectValidateRefuses(
      ParseOrFail(kNormSpecs[0]), t,
      {{"mma-convt-recompute-normalize:warps=64,min_blocks=1,stat_blocks=1,write_blocks=1",
        "warps must be in [1, 32]"},
       {"mma-convt-recompute-normalize:warps=8,min_blocks=1,stat_blocks=9,write_blocks=1",
        "stat_blocks 9 must be in [1, 5]"},
       {"mma-convt-recompute-normalize:warps=8,min_blocks=1,stat_blocks=1,write_blocks=0",
        "write_blocks 0"},
       {"mma-convt-recompute-normalize:warps=8,min_blocks=1,stat_blocks=1",
        "takes the parameters warps"}});
  testing::ExpectValidateRefuses(
      ParseOrFail(kDirectSpecs[0]), t,
      {{"mma-convt-direct:warps=8,min_blocks=1,stat_blocks=1,write_blocks=1",
        "takes the parameters warps"},
       {"mma-convt-direct:warps=16,min_blocks=3,write_blocks=1", "cap of threads x min_blocks"}});
}

// The GPU test's random chains: enough of them reach each strategy.
TEST(MmaConvT, RandomChainsReachThem) {
  EXPECT_GE(testing::RandomChainsReaching(Recompute(), 17, 20).size(), 10u);
  EXPECT_GE(testing::RandomChainsReaching(Direct(), 17, 20).size(), 10u);
}

TEST(GpuMmaConvT, RecomputeNormalizeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(Recompute(), kNormSpecs,
                                 {"warps=4,min_blocks=1,stat_blocks=1,write_blocks=2",
                                  "warps=8,min_blocks=2,stat_blocks=2,write_blocks=1"},
                                 17);
}

TEST(GpuMmaConvT, DirectMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  testing::CheckStrategyOnTheGpu(
      Direct(), kDirectSpecs,
      {"warps=4,min_blocks=1,write_blocks=1", "warps=16,min_blocks=1,write_blocks=2"}, 17);
}

}  // namespace
}  // namespace fusejit
