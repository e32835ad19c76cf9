// The direct FFMA weight gradient of conv3d chains with few input channels
// (templates/wgrad_direct.cuh, planned by codegen::PlanBackward): which chains get it, its shared
// memory layout (geom::WgradDirect), and random chains that take it compile for sm_80 and sm_90.
// GPU runs: tests/gpu/gpu_backward_test.cc (GpuBackward.DirectWeightGradient).
#include <gtest/gtest.h>

#include <string>

#include "codegen/backward_plan.h"
#include "codegen/plan.h"
#include "fusejit/fusejit.h"
#include "templates/geometry.cuh"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

const codegen::PlanTarget kH100{"sm_90", 132, Precision::kFp32};

// The body of the plan's weight-gradient kernel ("" if none).
std::string WgradBody(const Chain& chain) {
  absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(chain, kH100);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return "";
  for (const codegen::KernelLaunch& k : plan->kernels) {
    if (k.symbol == "fj_wgrad_partial") return k.body;
  }
  return "";
}

TEST(WgradDirect, Conv3dWithFewInputChannelsGetsIt) {
  const std::pair<const char*, bool> cases[] = {
      {"x:f32[64,1,32,32,32] | conv3d(out=8,k=5,padding=2) | gelu", true},
      {"x:f32[2,3,12,17,19] | conv3d(out=10,k=[3,3,5],stride=[2,2,1],padding=1) | relu", true},
      {"x:f32[2,4,7,9,12] | conv3d(out=32,k=[2,3,5],stride=[1,2,1],padding=[0,1,2]) | gelu", true},
      {"x:f32[1,1,5,30,16] | conv3d(out=1,k=[1,4,5],stride=[2,3,1]) | swish", true},
      // Kernels 6 and 7 wide: not timed on it yet (the halo kernel).
      {"x:f32[2,4,7,9,12] | conv3d(out=32,k=[2,3,7],stride=[1,2,1],padding=[0,1,3]) | gelu", false},
      {"x:f32[1,1,5,30,16] | conv3d(out=1,k=[1,4,6],stride=[2,3,1]) | swish", false},
      // W2 (a kernel 4 wide), stride 2 along w, five input channels, 33 output channels, a
      // kernel 8 wide, a conv_transpose3d: not it.
      {"x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       false},
      {"x:f32[2,3,12,17,19] | conv3d(out=10,k=5,stride=2,padding=1) | relu", false},
      {"x:f32[2,5,12,17,19] | conv3d(out=10,k=5,padding=1) | relu", false},
      {"x:f32[2,3,12,17,19] | conv3d(out=33,k=5,padding=1) | relu", false},
      {"x:f32[2,3,12,17,19] | conv3d(out=8,k=[1,1,8]) | relu", false},
      {"x:f32[2,1,4,7,9] | conv_transpose3d(out=7,k=5) | relu", false},
  };
  for (const auto& [spec, direct] : cases) {
    SCOPED_TRACE(spec);
    const std::string body = WgradBody(ParseOrFail(spec));
    EXPECT_EQ(body.find("wgrad_direct_kernel") != std::string::npos, direct) << body;
  }
  // Its copies are cp.async: not before sm_80.
  absl::StatusOr<codegen::Plan> sm75 = codegen::PlanBackward(
      ParseOrFail("x:f32[64,1,32,32,32] | conv3d(out=8,k=5,padding=2) | gelu"),
      codegen::PlanTarget{"sm_75", 40, Precision::kFp32});
  ASSERT_TRUE(sm75.ok()) << sm75.status();
  for (const codegen::KernelLaunch& k : sm75->kernels) {
    EXPECT_EQ(k.body.find("wgrad_direct_kernel"), std::string::npos);
  }
}

TEST(WgradDirect, SharedMemoryHoldsTheStageAndTheCopiesSums) {
  for (long long ct : {4, 8, 16}) {
    for (long long copies : {1, 2, 5}) {
      for (long long sw : {1, 2, 3}) {
        // 3 input channels, 10 output channels, rows 29 wide, kernel 2 x 3 x 4, dilation 2 in w.
        const fj::geom::WgradDirect g =
            fj::geom::WgradDirectOf(3, 10, 29, 2, 3, 4, 2, sw, 1, 2, ct, 6, copies);
        EXPECT_EQ(g.groups, (10 + ct - 1) / ct);
        EXPECT_EQ(g.cpad % 4, 0);  // float4 reads of grad_u's channels
        EXPECT_EQ(g.tasks, 3 * 2 * 3 * g.groups);
        EXPECT_EQ(g.threads % 32, 0);
        EXPECT_GE(g.threads, g.tasks * copies);
        EXPECT_EQ(g.rows_in, 5 * 2 + 2 * 1 + 1);
        EXPECT_EQ(g.cols, 28 * sw + 3 * 2 + 1);
        EXPECT_EQ(g.pitch % 2, 1);
        EXPECT_GE(g.pitch, g.cols);
        EXPECT_EQ(g.x_offset, 6 * 29 * g.cpad);
        EXPECT_GE(g.stage, g.x_offset + 3 * 2 * g.rows_in * g.pitch);
        EXPECT_EQ(g.stage % 4, 0);  // the second buffer 16-byte aligned
        EXPECT_GE(g.smem, 2 * 4 * g.stage);
        EXPECT_GE(g.smem, 8 * copies * g.tasks * ct * 4);
      }
    }
  }
}

TEST(WgradDirect, RandomChainsThatTakeItCompileForSm80AndSm90) {
  Rng rng(4711);
  const RandomChainOptions options = FewInputWideKernelOptions();
  int taken = 0;
  for (int i = 0; i < 600 && taken < 5; ++i) {
    const Chain chain = RandomChain(rng, options);
    if (WgradBody(chain).find("wgrad_direct_kernel") == std::string::npos) continue;
    ++taken;
    testing::ExpectBackwardCompilesForSm80AndSm90(chain);
  }
  EXPECT_GE(taken, 3);
}

}  // namespace
}  // namespace fusejit
