// GPU correctness (named Gpu*, skipped without a driver): the seed chains at their seed shapes and
// random chains, against the float64 CPU reference. Outputs are poisoned with NaN before every run
// and checked fully written; two runs must be bitwise identical.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "fusejit/workloads.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using testing::CheckChain;

TEST(GpuChains, SeedChainsAtSeedShapes) {
  SKIP_WITHOUT_GPU();
  for (const Workload& w : SeedWorkloads()) {
    absl::StatusOr<Chain> chain = ParseChain(w.spec);
    ASSERT_TRUE(chain.ok());
    const int64_t n = chain->input[0];
    CheckChain(*chain, /*seed=*/11, {0, n / 2, n - 1});
  }
}

TEST(GpuChains, SeedChainsWithEveryApplicableGenericStrategy) {
  SKIP_WITHOUT_GPU();
  // Same chains at a smaller batch, so every strategy runs and the full batch is checked.
  for (const Workload& w : SeedWorkloads()) {
    absl::StatusOr<Chain> chain = ParseChain(w.spec);
    ASSERT_TRUE(chain.ok());
    chain->input[0] = 2;
    for (const char* s : {"store-normalize", "recompute-normalize", "recompute-mean"}) {
      const bool has_mean = chain->ops.back().kind == OpKind::kMean;
      if ((std::string(s) == "recompute-mean") != has_mean) continue;
      CheckChain(*chain, /*seed=*/5, {}, s);
    }
  }
}

TEST(GpuChains, RandomChains) {
  SKIP_WITHOUT_GPU();
  Rng rng(20261122);
  for (int i = 0; i < 60; ++i) {
    CheckChain(RandomChain(rng), /*seed=*/100 + i, {});
  }
}

// Every non-generic strategy on random chains it applies to (odd sizes, strides, padding,
// dilation), so the fast kernels are checked beyond the seed shapes.
TEST(GpuChains, FastStrategiesOnRandomChains) {
  SKIP_WITHOUT_GPU();
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  Rng rng(4242);
  RandomChainOptions options;
  options.max_spatial = 20;
  options.max_channels = 32;
  for (const auto& strategy : codegen::AllStrategies()) {
    const std::string name(strategy->name());
    if (name == "elementwise" || name == "reduce-mean" || name == "store-normalize" ||
        name == "recompute-normalize" || name == "recompute-mean") {
      continue;  // the generic ones run on every random chain above
    }
    if (name.starts_with("igemm-")) continue;  // >= 128 channels: gpu_igemm_test.cc
    int checked = 0;
    for (int tries = 0; tries < 200000 && checked < 12; ++tries) {
      const Chain chain = RandomChain(rng, options);
      if (!strategy->Applies(codegen::PlanInput(chain, target))) continue;
      CheckChain(chain, /*seed=*/31 + checked, {}, name);
      ++checked;
    }
    EXPECT_EQ(checked, 12) << name << ": too few random chains apply";
  }
}

// Elementwise op `op` before and after a group_norm, after a convolution and a transposed one,
// with and without a mean, alone: on every strategy that applies to each chain.
void CheckOnEveryApplicableStrategy(const std::string& op, uint64_t& seed) {
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  const char* const shapes[] = {
      "x:f32[2,4,9,10,11] | conv3d(out=8,k=3,padding=1) | OP | group_norm(groups=2) | OP",
      "x:f32[2,4,6,7,5] | conv_transpose3d(out=6,k=3,stride=2) | OP | group_norm(groups=3) | OP | "
      "mean(dims=[2,3,4])",
      "x:f32[2,6,12,12,12] | conv3d(out=16,k=3) | OP | mean(dims=[1,2,3,4])",
      "x:f32[3,8,7,9,10] | OP | group_norm(groups=4) | OP",
      "x:f32[2,5,6,7,8] | OP",
  };
  for (const char* shape : shapes) {
    std::string spec = shape;
    for (size_t at; (at = spec.find("OP")) != std::string::npos;) spec.replace(at, 2, op);
    absl::StatusOr<Chain> chain = ParseChain(spec);
    ASSERT_TRUE(chain.ok()) << spec << ": " << chain.status();
    int applied = 0;
    for (const auto& strategy : codegen::AllStrategies()) {
      if (!strategy->Applies(codegen::PlanInput(*chain, target))) continue;
      CheckChain(*chain, seed++, {}, std::string(strategy->name()));
      ++applied;
    }
    EXPECT_GT(applied, 0) << spec;
  }
}

// The smooth activations (mish, softplus with its threshold inside the data's range, elu, selu,
// hardsigmoid) on every applicable strategy (the older ops are drawn by the random chains of
// every strategy above).
TEST(GpuChains, SmoothActivationsOnEveryApplicableStrategy) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const char* op : {"mish", "softplus(beta=1.5,threshold=1)", "elu(alpha=0.7)", "selu",
                         "hardsigmoid"}) {
    CheckOnEveryApplicableStrategy(op, seed);
  }
}

// gelu's tanh approximation, logsigmoid, softsign, tanhshrink, celu on every applicable strategy.
TEST(GpuChains, MoreActivationsOnEveryApplicableStrategy) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (const char* op : {"gelu_tanh", "logsigmoid", "softsign", "tanhshrink", "celu(alpha=0.6)"}) {
    CheckOnEveryApplicableStrategy(op, seed);
  }
}

// clamp with only min or only max (the other bound at infinity) on every applicable strategy.
TEST(GpuChains, OneSidedClampsOnEveryApplicableStrategy) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (const char* op : {"clamp(min=-0.3)", "clamp(max=0.4)"}) CheckOnEveryApplicableStrategy(op, seed);
}

TEST(GpuChains, LargerRandomChains) {
  SKIP_WITHOUT_GPU();
  Rng rng(99);
  RandomChainOptions options;
  options.max_spatial = 24;
  options.max_channels = 32;
  for (int i = 0; i < 10; ++i) CheckChain(RandomChain(rng, options), /*seed=*/7 + i, {});
}

TEST(GpuChains, RunRefusesBadBindings) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<Chain> chain = ParseChain(SeedWorkloads()[0].spec);
  ASSERT_TRUE(chain.ok());
  chain->input[0] = 1;
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(*chain);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  Bindings b;
  absl::Status s = (*compiled)->Run(b, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("input"), std::string::npos) << s;
  b.input = 256;
  b.output = 512;
  b.workspace = 1024;
  b.params["0.weight"] = 256;
  s = (*compiled)->Run(b, nullptr);
  EXPECT_NE(s.message().find("0.bias"), std::string::npos) << s;
  b.params["0.bias"] = 256;
  b.params["2.weight"] = 256;
  b.params["2.bias"] = 256;
  b.params["7.weight"] = 256;
  s = (*compiled)->Run(b, nullptr);
  EXPECT_NE(s.message().find("unknown tensor '7.weight'"), std::string::npos) << s;
}

}  // namespace
}  // namespace fusejit
