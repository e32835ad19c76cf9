// tap-gemm (runtime/tap_gemm.h, codegen/tap_gemm_plan.h): which chains it splits, the parts it
// splits them into, its composites compiled for sm_80 and sm_90, chosen by cost for few output
// and many input channels, refused by name with the reason. The GPU checks are in
// tests/gpu/gpu_tap_gemm_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "codegen/tap_gemm_plan.h"
#include "fusejit/fusejit.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

CompileOptions Arch(const char* arch, const std::string& strategy = "") {
  CompileOptions o;
  o.arch = arch;
  o.strategy = strategy;
  return o;
}

std::vector<std::string> Names(const std::vector<TensorSpec>& sig) {
  std::vector<std::string> names;
  for (const TensorSpec& t : sig) {
    if (t.role != TensorRole::kWorkspace) names.push_back(t.name);
  }
  return names;
}

TEST(TapGemm, SplitsIntoAGemmAndTheLaterOps) {
  const Chain chain = ParseOrFail(
      "x:f32[2,128,28,29,36] | conv_transpose3d(out=4,k=4) | clamp(min=-0.5,max=0.5) | "
      "group_norm(groups=4) | gelu");
  const std::optional<codegen::TapGemm> split = codegen::SplitTapGemm(chain);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->taps, 64);
  EXPECT_EQ(FormatChain(split->gemm), "x:f32[2,128,28,29,36] | conv3d(out=256,k=1,bias=false)");
  EXPECT_EQ(split->rest.input, (Shape{2, 4, 31, 32, 39}));
  ASSERT_EQ(split->rest.ops.size(), 3u);
  EXPECT_EQ(split->rest.ops[1].kind, OpKind::kGroupNorm);
  EXPECT_EQ(split->z_bytes, size_t{2} * 256 * 28 * 29 * 36 * 4);
  EXPECT_EQ(split->weight_bytes, size_t{256} * 128 * 4);
}

TEST(TapGemm, SaysWhyItDoesNotApply) {
  struct Case {
    const char* spec;
    const char* why;
  } cases[] = {
      {"x:f32[2,32,8,8,8] | conv3d(out=4,k=1) | relu", "1x1x1"},
      {"x:f32[2,4,8,8,8] | conv3d(out=4,k=3) | relu", "8 input channels"},
      {"x:bf16[2,32,8,8,8] | conv3d(out=4,k=3)", "f32 chains"},
      {"x:f32[2,32,8,8,8] | relu | group_norm(groups=4)", "needs a convolution"},
      {"x:f32[16,64,64,64,64] | conv3d(out=16,k=3)", "2 GiB"},
  };
  for (const Case& c : cases) {
    std::string why;
    EXPECT_FALSE(codegen::SplitTapGemm(ParseOrFail(c.spec), &why).has_value()) << c.spec;
    EXPECT_TRUE(absl::StrContains(why, c.why)) << c.spec << ": " << why;
    // By name: the same reason, as an error.
    if (absl::StartsWith(c.spec, "x:f32")) {
      absl::StatusOr<std::shared_ptr<CompiledChain>> compiled =
          Compile(ParseOrFail(c.spec), Arch("sm_90", "tap-gemm"));
      ASSERT_FALSE(compiled.ok()) << c.spec;
      EXPECT_TRUE(absl::StrContains(compiled.status().message(), c.why)) << compiled.status();
    }
  }
}

// The composite compiles for both architectures, by name and by cost; its tensors are the
// chain's; its steps are the weight, the GEMM, the gather and (with later ops) their plan.
TEST(TapGemm, CompositesCompileForSm80AndSm90) {
  const char* specs[] = {
      // Chosen by cost: few outputs, many inputs (the random chains' R44 and R20).
      "x:f32[2,128,28,29,36] | conv_transpose3d(out=4,k=4) | clamp(min=-0.5,max=0.5) | "
      "group_norm(groups=4) | gelu",
      "x:f32[2,64,13,13,13] | conv_transpose3d(out=4,k=4,padding=2) | tanh | group_norm(groups=1)",
      // By name: a strided, dilated conv3d without later ops, no bias.
      "x:f32[3,24,11,12,13] | conv3d(out=3,k=3,stride=2,padding=1,dilation=2,bias=false)",
  };
  for (const char* spec : specs) {
    const Chain chain = ParseOrFail(spec);
    for (const char* arch : {"sm_80", "sm_90"}) {
      // The first by cost on both; the second by cost on sm_90 (on sm_80 its GEMM has no wgmma
      // plan and the chain's own plan costs less); the third by name.
      const bool by_cost = spec == specs[0] || (spec == specs[1] && arch == std::string("sm_90"));
      absl::StatusOr<std::shared_ptr<CompiledChain>> c =
          Compile(chain, Arch(arch, by_cost ? "" : "tap-gemm"));
      ASSERT_TRUE(c.ok()) << spec << " " << arch << ": " << c.status();
      EXPECT_EQ((*c)->strategy(), "tap-gemm") << spec << " " << arch;
      EXPECT_EQ(Names((*c)->signature()), Names(ForwardSignature(chain, 1))) << spec;
      EXPECT_EQ((*c)->output_shape(), OutputShape(chain));
      const std::string explain = (*c)->Explain();
      EXPECT_TRUE(absl::StrContains(explain, "step 3: the convolution's output from Z")) << explain;
      EXPECT_EQ(absl::StrContains(explain, "step 4: the later ops"), chain.ops.size() > 1)
          << explain;
      EXPECT_EQ((*c)->kernel_count() >= 3, true);
    }
  }
}

// Many output channels: the chain's own plan (an implicit GEMM reads x once per 64+ columns).
TEST(TapGemm, NotChosenForManyOutputChannels) {
  const Chain chain = ParseOrFail("x:f32[4,32,16,16,16] | conv3d(out=64,k=3,padding=1) | relu");
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, Arch("sm_90"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->strategy(), "tap-gemm");
}

}  // namespace
}  // namespace fusejit
