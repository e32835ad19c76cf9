// tap-gemm on the GPU (runtime/tap_gemm.h): random conv3d and conv_transpose3d chains with 8-48
// input channels and 1-8 output channels (odd sizes, strides, padding, dilation, output_padding,
// later ops of every kind), run as tap-gemm by name against the float64 reference, fp32-accurate
// and TF32, outputs NaN-poisoned, two runs bitwise identical; and the chains it is chosen for by
// cost, as Compile plans them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/tap_gemm_plan.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

std::vector<int64_t> AllSamples(const Chain& chain) {
  std::vector<int64_t> all(chain.input[0]);
  for (int64_t i = 0; i < chain.input[0]; ++i) all[i] = i;
  return all;
}

TEST(GpuTapGemm, RandomChainsByName) {
  SKIP_WITHOUT_GPU();
  Rng rng(4242);
  RandomChainOptions o;
  o.max_batch = 4;
  o.max_spatial = 14;
  o.max_channels = 8;
  o.max_input_channels = 48;
  o.min_kernel_w = 2;
  o.max_kernel_w = 4;
  int checked = 0;
  for (int tries = 0; tries < 2000 && checked < 40; ++tries) {
    const Chain chain = RandomChain(rng, o);
    if (!codegen::SplitTapGemm(chain).has_value()) continue;
    SCOPED_TRACE(FormatChain(chain));
    testing::CheckChain(chain, /*seed=*/100 + checked, AllSamples(chain), "tap-gemm");
    if (checked % 4 == 0) {
      testing::CheckChain(chain, /*seed=*/100 + checked, AllSamples(chain), "tap-gemm",
                          {1e-2, 1e-2}, Precision::kTf32);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

TEST(GpuTapGemm, ChosenByCost) {
  SKIP_WITHOUT_GPU();
  const char* specs[] = {
      "x:f32[2,128,28,29,36] | conv_transpose3d(out=4,k=4) | clamp(min=-0.5,max=0.5) | "
      "group_norm(groups=4) | gelu",
      "x:f32[2,64,13,13,13] | conv_transpose3d(out=4,k=4,padding=2) | tanh | group_norm(groups=1)",
  };
  for (const char* spec : specs) {
    const Chain chain = ParseOrFail(spec);
    SCOPED_TRACE(spec);
    testing::CheckChain(chain, /*seed=*/7, AllSamples(chain), "", {}, Precision::kFp32,
                        /*timing_reps=*/10);
  }
}

}  // namespace
}  // namespace fusejit
