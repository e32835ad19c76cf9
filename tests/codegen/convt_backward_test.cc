// grad_y's group_norm sums on a recomputed u (templates/convt_backward.cuh, planned by
// codegen::ChooseConvTSums inside codegen::PlanBackward): which chains take the kernel, what its
// launch binds, and that its plans compile for sm_80 and sm_90. GPU runs:
// tests/gpu/gpu_backward_test.cc (GpuBackward.ConvTSumsRecomputeU).
#include <gtest/gtest.h>

#include <string>

#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "codegen/convt_strategy.h"
#include "codegen/plan.h"
#include "fusejit/fusejit.h"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

const codegen::PlanTarget kH100{"sm_90", 132, Precision::kFp32};

const codegen::KernelLaunch* FindKernel(const codegen::Plan& plan, const std::string& symbol) {
  for (const codegen::KernelLaunch& k : plan.kernels) {
    if (k.symbol == symbol) return &k;
  }
  return nullptr;
}

std::string TuneValue(const codegen::Plan& plan, const std::string& tune,
                      const std::string& field) {
  for (const codegen::TuneStruct& t : plan.tunes) {
    if (t.name != tune) continue;
    for (const codegen::TuneStruct::Field& f : t.fields) {
      if (f.name == field) return f.value;
    }
  }
  return "";
}

constexpr const char* kW1 =
    "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
    "group_norm(groups=4) | hardswish";

TEST(ConvTSums, W1RecomputesUForGradYsSums) {
  for (bool saved_stats : {false, true}) {
    SCOPED_TRACE(saved_stats);
    const Chain w1 = ParseOrFail(kW1);
    absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(w1, kH100, saved_stats);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const codegen::KernelLaunch* k = FindKernel(*plan, "fj_convt_bwd_sums");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(FindKernel(*plan, "fj_bwd_sums"), nullptr);
    // One block row per sample; gpart has a chunk per block of a sample.
    EXPECT_EQ(k->grid[1], 128u);
    EXPECT_EQ(TuneValue(*plan, "BwdTune", "kSplit"), std::to_string(k->grid[0]));
    EXPECT_EQ(TuneValue(*plan, "ConvTTune", "kStatBlocksPerSample"), std::to_string(k->grid[0]));
    std::string args;
    for (const codegen::KernelArg& a : k->args) args += a.name + "=" + a.param + " ";
    EXPECT_EQ(args.substr(0, 41), "x= weight=0.weight bias=0.bias gy=grad_y ");
    // The conv bias is bound by the step's signature.
    bool bias = false;
    for (const TensorSpec& t : plan->signature) bias |= t.name == "0.bias";
    EXPECT_TRUE(bias);
    EXPECT_NE(plan->description.find("grad_y's sums recompute u"), std::string::npos);
  }
}

TEST(ConvTSums, OtherChainsReadU) {
  struct Case {
    const char* spec;
    bool saved_stats;
    const char* sums;  // the kernel that takes grad_y's sums
  };
  const Case cases[] = {
      // 46.9 MACs a point: reading u is cheaper.
      {"x:f32[2,3,6,6,6] | conv_transpose3d(out=16,k=5,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       true, "fj_bwd_sums"},
      // No bias: outside convt_group_norm.cuh's convolution.
      {"x:f32[2,3,6,6,6] | conv_transpose3d(out=16,k=3,stride=2,bias=false) | swish | "
       "group_norm(groups=4) | hardswish",
       true, "fj_bwd_sums"},
      // More than 32 channels.
      {"x:f32[2,3,6,6,6] | conv_transpose3d(out=40,k=3,stride=2) | swish | group_norm(groups=4) | "
       "hardswish",
       true, "fj_bwd_sums"},
      // conv3d.
      {"x:f32[2,3,6,6,6] | conv3d(out=16,k=3,padding=1) | swish | group_norm(groups=4) | relu",
       true, "fj_bwd_sums"},
      // No op after group_norm, statistics recomputed: one pass over u gives both sums.
      {"x:f32[2,3,6,6,6] | conv_transpose3d(out=16,k=3,stride=2) | swish | group_norm(groups=4)",
       false, "fj_bwd_moments_sums"},
      // ... but with the training forward's statistics, the recompute.
      {"x:f32[2,3,6,6,6] | conv_transpose3d(out=16,k=3,stride=2) | swish | group_norm(groups=4)",
       true, "fj_convt_bwd_sums"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(ParseOrFail(c.spec), kH100, c.saved_stats);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(FindKernel(*plan, c.sums), nullptr) << plan->description;
  }
  // The plan says why it reads u.
  absl::StatusOr<codegen::Plan> k5 = codegen::PlanBackward(ParseOrFail(cases[0].spec), kH100, true);
  ASSERT_TRUE(k5.ok()) << k5.status();
  EXPECT_NE(
      k5->description.find("grad_y's sums read u (46.9 MACs a point to recompute u (at most 16))"),
      std::string::npos)
      << k5->description;
}

TEST(ConvTSums, NamesWhyItDoesNotApply) {
  const Chain k5 = ParseOrFail(
      "x:f32[2,3,6,6,6] | conv_transpose3d(out=16,k=5,stride=2,padding=1) | swish | "
      "group_norm(groups=4)");
  const codegen::ChainInfo info = codegen::AnalyzeChain(k5);
  std::string why;
  EXPECT_FALSE(codegen::ChooseConvTSums(k5, info, kH100, &why).has_value());
  EXPECT_EQ(why, "46.9 MACs a point to recompute u (at most 16)");
  why.clear();
  EXPECT_FALSE(
      codegen::ChooseConvTSums(k5, info, codegen::PlanTarget{"sm_75", 40, Precision::kFp32}, &why)
          .has_value());
  EXPECT_EQ(why, "no cp.async before sm_80");
}

// The training forward of W1 stores u with the rows of its channels side by side ([N, D, H, C, W]:
// codegen::ULayout::kRowsByChannel), and the backward from it reads that layout in the fused
// kernel, the only one reading u there. Chains whose backward reads u elsewhere keep [N, C, D, H,
// W].
TEST(ConvTSums, TrainingForwardLaysOutURowsByChannelWhereOnlyTheFusedKernelReadsIt) {
  CompileOptions o;
  o.arch = "sm_90";
  o.use_cache = false;
  const auto u_shape = [](const CompiledChain& c) {
    for (const TensorSpec& t : c.signature()) {
      if (t.name == "u") return t.shape;
    }
    return Shape{};
  };
  const Chain w1 = ParseOrFail(
      "x:f32[2,3,6,7,9] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish");
  absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(w1, o);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(u_shape(**f), (Shape{2, 11, 13, 16, 17}));  // [N, D, H, C, W]
  EXPECT_NE((*f)->Explain().find("kURowsByChannel=true"), std::string::npos) << (*f)->Explain();
  EXPECT_NE((*f)->Explain().find("laid out [N, D, H, C, W]"), std::string::npos);
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(w1, o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(u_shape(**b), (Shape{2, 11, 13, 16, 17}));
  EXPECT_NE((*b)->Explain().find("kURowsByChannel=true"), std::string::npos) << (*b)->Explain();
  // The recomputing backward's u is its own: [N, C, D, H, W].
  absl::StatusOr<std::shared_ptr<CompiledChain>> r = CompileBackward(w1, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Explain().find("kURowsByChannel"), std::string::npos);

  // 46.9 MACs a point: grad_y's sums read u, so u keeps PyTorch's layout.
  const Chain k5 = ParseOrFail(
      "x:f32[2,3,6,7,9] | conv_transpose3d(out=16,k=5,stride=2,padding=2) | swish | "
      "group_norm(groups=4) | hardswish");
  absl::StatusOr<std::shared_ptr<CompiledChain>> f5 = CompileTrainingForward(k5, o);
  ASSERT_TRUE(f5.ok()) << f5.status();
  ASSERT_EQ(u_shape(**f5), codegen::AnalyzeChain(k5).producer_shape) << (*f5)->Explain();
  absl::StatusOr<codegen::Plan> refused =
      codegen::PlanBackward(k5, kH100, /*saved_stats=*/true, codegen::ULayout::kRowsByChannel);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("reads u in kernels that take it [N, C, D, H, W]"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(codegen::BackwardReadsURowsByChannel(k5, kH100, true));
  EXPECT_TRUE(codegen::BackwardReadsURowsByChannel(w1, kH100, true));
}

TEST(ConvTSums, PlansCompileForSm80AndSm90) {
  const char* const specs[] = {
      "x:f32[2,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      // Two reduce-scatter rounds (32 and 20 channels), narrow and wide rows, both mean modes.
      "x:f32[2,2,5,6,7] | conv_transpose3d(out=32,k=2,stride=2) | leaky_relu | "
      "group_norm(groups=8) | hardswish",
      "x:f32[2,3,4,7,9] | conv_transpose3d(out=20,k=3,stride=2,padding=1,dilation=[1,2,1]) | "
      "swish | group_norm(groups=5) | relu",
      "x:f32[2,1,4,5,70] | conv_transpose3d(out=8,k=[2,3,3],stride=[1,2,2],padding=[0,1,1],"
      "output_padding=[0,1,0]) | relu | group_norm(groups=2) | sigmoid",
      "x:f32[3,3,6,5,8] | conv_transpose3d(out=9,k=3,stride=2,padding=1) | hardswish | "
      "group_norm(groups=3) | gelu | mean(dims=[2,3,4])",
      "x:f32[2,4,5,6,4] | conv_transpose3d(out=6,k=2,stride=[2,1,2]) | tanh | "
      "group_norm(groups=1) | swish | mean(dims=[1,2,3,4])",
  };
  for (const char* spec : specs) {
    testing::ExpectBackwardCompilesForSm80AndSm90(ParseOrFail(spec), "fj_convt_bwd_sums");
  }
}

}  // namespace
}  // namespace fusejit
