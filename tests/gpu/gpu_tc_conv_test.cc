// GPU correctness of the tensor-core convolution engine (strategy tc-conv, named Gpu*, skipped
// without a driver): every tail of the pipeline, conv3d and conv_transpose3d with odd channel
// counts, strides, padding, dilation and output_padding, both precisions, and tunings, against
// the float64 CPU reference (CheckChain: NaN-poisoned outputs, two runs bitwise identical).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using testing::CheckChain;

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status();
  return c.ok() ? *c : Chain{};
}

// One chain per tail of the pipeline (tc_conv_strategy.cc), with channel counts that are not
// multiples of 8.
const char* const kTails[] = {
    "x:f32[3,13,9,10,11] | conv3d(out=21,k=3,padding=1) | swish",
    "x:f32[3,13,9,10,11] | conv3d(out=21,k=3,padding=1) | gelu | mean(dims=[2,3,4])",
    "x:f32[3,13,9,10,11] | conv3d(out=21,k=3,padding=1) | relu | mean(dims=[1,2,3,4])",
    "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | relu | group_norm(groups=6) | tanh",
    "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])",
    "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | group_norm(groups=3) | "
    "mean(dims=[1,2,3,4])",
    "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | group_norm(groups=8) | swish | "
    "mean(dims=[2,3,4])",
    "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | group_norm(groups=8) | sigmoid | "
    "mean(dims=[1,2,3,4])",
};

TEST(GpuTcConv, EveryTail) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : kTails) CheckChain(Parse(spec), /*seed=*/3, {}, "tc-conv");
}

TEST(GpuTcConv, ConvolutionGeometries) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      // strides, dilation, asymmetric kernels and padding
      "x:f32[2,16,12,13,14] | conv3d(out=32,k=[1,3,5],stride=[1,2,2],padding=[0,1,2]) | relu",
      "x:f32[2,40,9,9,9] | conv3d(out=72,k=3,dilation=2,padding=2) | group_norm(groups=9)",
      "x:f32[2,8,20,20,20] | conv3d(out=8,k=5,stride=2) | leaky_relu(slope=0.1)",
      "x:f32[1,100,6,7,8] | conv3d(out=130,k=1) | group_norm(groups=13) | relu",
      "x:f32[2,3,10,10,10] | conv3d(out=5,k=2,stride=3,padding=1,bias=false) | swish",
      // transposed: phases, output_padding, dilation, kernel < stride
      "x:f32[2,16,8,8,8] | conv_transpose3d(out=48,k=3,stride=2,padding=1) | gelu | "
      "group_norm(groups=4)",
      "x:f32[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1,output_padding=1) | "
      "swish",
      "x:f32[2,9,5,5,5] | conv_transpose3d(out=17,k=[2,3,4],stride=[2,3,1],padding=[0,1,2]) | "
      "tanh",
      "x:f32[2,8,6,6,6] | conv_transpose3d(out=8,k=1,stride=2) | relu | group_norm(groups=2)",
      "x:f32[1,24,7,7,7] | conv_transpose3d(out=40,k=3,stride=2,dilation=2,padding=2) | "
      "hardswish | group_norm(groups=5) | mean(dims=[2,3,4])",
      "x:f32[2,64,6,6,6] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
      "group_norm(groups=8)",
  };
  int seed = 1;
  for (const char* spec : specs) CheckChain(Parse(spec), seed++, {}, "tc-conv");
}

TEST(GpuTcConv, RandomChainsBothPrecisions) {
  SKIP_WITHOUT_GPU();
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  const codegen::Strategy* tc = codegen::FindStrategy("tc-conv");
  ASSERT_NE(tc, nullptr);
  Rng rng(1313);
  RandomChainOptions options;
  options.max_spatial = 16;
  options.max_channels = 48;
  int checked = 0;
  for (int tries = 0; tries < 100000 && checked < 40; ++tries) {
    const Chain chain = RandomChain(rng, options);
    if (!tc->Applies(codegen::PlanInput(chain, target))) continue;
    // fp32: 2e-5 rather than 1e-5: a group_norm after saturating ops (sigmoid | sigmoid, one
    // group) amplifies the few-ulp intrinsics of the ops, as in every strategy (the generic
    // store-normalize plan of such a chain is off by the same 1.03e-5).
    CheckChain(chain, /*seed=*/50 + checked, {}, "tc-conv", {2e-5, 1e-4});
    // TF32 (asked for): one TF32 product, ~1e-3 relative.
    CheckChain(chain, /*seed=*/50 + checked, {}, "tc-conv", {2e-3, 5e-2}, Precision::kTf32);
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

TEST(GpuTcConv, EveryTileShape) {
  SKIP_WITHOUT_GPU();
  const Chain chain =
      Parse("x:f32[2,20,7,9,11] | conv3d(out=36,k=3,padding=1) | swish | group_norm(groups=6)");
  const codegen::Strategy* tc = codegen::FindStrategy("tc-conv");
  ASSERT_NE(tc, nullptr);
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  // The default and its nearest 29 neighbours (every single-parameter change among them).
  int checked = 0;
  for (const codegen::TuneConfig& config : tc->Candidates(codegen::PlanInput(chain, target))) {
    if (checked == 30) break;
    CompileOptions options;
    options.use_cache = false;
    options.tune_config = config.ToString();
    testing::CheckChainWithOptions(chain, /*seed=*/9, options);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

// Warp tiles of 64 rows (TF32, and 3xTF32 with 16-channel warp tiles).
TEST(GpuTcConv, WideWarpTiles) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,24,9,10,11] | conv3d(out=40,k=3,padding=1) | swish | group_norm(groups=4)",
      "x:f32[2,16,6,6,6] | conv_transpose3d(out=20,k=3,stride=2,padding=1) | relu | "
      "mean(dims=[2,3,4])",
  };
  for (const char* spec : specs) {
    for (const char* config : {"tc-conv:bm=128,bn=64,bk=32,stages=4,split=1,wm=64,l1=0",
                               "tc-conv:bm=64,bn=32,bk=16,stages=3,split=2,wm=64,l1=1"}) {
      CompileOptions options;
      options.use_cache = false;
      options.precision = Precision::kTf32;
      options.tune_config = config;
      testing::CheckChainWithOptions(Parse(spec), /*seed=*/4, options, {}, {2e-3, 5e-2});
    }
    CompileOptions options;
    options.use_cache = false;
    options.tune_config = "tc-conv:bm=128,bn=16,bk=16,stages=3,split=1,wm=64,l1=0";
    testing::CheckChainWithOptions(Parse(spec), /*seed=*/4, options);
  }
}

// The 8-channel tile (bn=8: one mma n8 fragment a warp, its B by ldmatrix.x2) for chains of at
// most 8 output channels, the planner's default there: every tail kind, transposed and strided,
// split-K, 64-row warp tiles and 8-wide k-steps, fp32-accurate and TF32.
TEST(GpuTcConv, EightChannelTile) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,40,6,7,8] | conv_transpose3d(out=4,k=3,stride=2,padding=1,output_padding=1) | "
      "group_norm(groups=4)",
      "x:f32[2,24,7,8,9] | conv3d(out=7,k=3,padding=1) | swish | mean(dims=[2,3,4])",
      "x:f32[3,33,6,6,6] | conv3d(out=8,k=3,stride=2,padding=1) | relu | group_norm(groups=2) | "
      "mean(dims=[1,2,3,4])",
      "x:f32[2,16,9,9,9] | conv3d(out=3,k=[1,3,5],padding=[0,1,2],bias=false) | tanh",
  };
  for (const char* spec : specs) {
    const Chain chain = Parse(spec);
    CheckChain(chain, /*seed=*/31, {}, "tc-conv", {2e-5, 1e-4});
    for (const char* config : {"tc-conv:bm=128,bn=8,bk=32,stages=3,split=3,wm=32,l1=1",
                               "tc-conv:bm=128,bn=8,bk=8,stages=4,split=1,wm=64,l1=0",
                               "tc-conv:bm=64,bn=8,bk=16,stages=2,split=2,wm=32,l1=0"}) {
      CompileOptions options;
      options.use_cache = false;
      options.tune_config = config;
      testing::CheckChainWithOptions(chain, /*seed=*/32, options, {}, {2e-5, 1e-4});
      options.precision = Precision::kTf32;
      testing::CheckChainWithOptions(chain, /*seed=*/32, options, {}, {2e-3, 5e-2});
    }
  }
}

// Split-K: several CTAs a tile, the last one summing the partials in split order (every tail,
// both producers; CheckChain also requires two runs to be bitwise identical).
TEST(GpuTcConv, SplitK) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,64,6,6,6] | conv3d(out=40,k=3,padding=1) | gelu",
      "x:f32[2,64,6,6,6] | conv3d(out=40,k=3,padding=1) | relu | group_norm(groups=5)",
      "x:f32[2,48,5,5,5] | conv_transpose3d(out=24,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | mean(dims=[2,3,4])",
      "x:f32[2,48,5,5,5] | conv_transpose3d(out=24,k=3,stride=2) | group_norm(groups=4) | tanh | "
      "mean(dims=[1,2,3,4])",
  };
  for (const char* spec : specs) {
    for (int split : {2, 3, 8, 16}) {
      CompileOptions options;
      options.use_cache = false;
      options.tune_config = "tc-conv:bm=128,bn=32,bk=16,stages=3,split=" + std::to_string(split) + ",wm=32,l1=1";
      testing::CheckChainWithOptions(Parse(spec), /*seed=*/21, options);
    }
  }
}

}  // namespace
}  // namespace fusejit
