// mma-moments-mean on the GPU (skipped without a driver): the strategy forced on the seeds W2
// and W4 (sample subsets), on W4 with a [N, C] mean, and on random chains it applies to
// (strides, padding, dilation, odd sizes, 1-8 input channels), fp32-accurate against the float64
// reference (tests/gpu_support.h CheckChain: poisoned outputs, full writes, bitwise reruns).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using testing::CheckChain;

constexpr char kStrategy[] = "mma-moments-mean";
constexpr testing::Tolerance kFp32Accurate{1e-6, 1e-5};

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Chain{};
}

TEST(GpuMmaMoments, SeedsW2W4) {
  SKIP_WITHOUT_GPU();
  CheckChain(Parse("x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | "
                   "group_norm(groups=4,eps=1e-5) | mean(dims=[2,3,4])"),
             /*seed=*/1, {0, 1, 511, 1023}, kStrategy, kFp32Accurate);
  CheckChain(Parse("x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
                   "mean(dims=[1,2,3,4])"),
             /*seed=*/2, {0, 1, 64, 127}, kStrategy, kFp32Accurate);
  // W4 with the [N, C] mean: values away from zero, so the relative error means something.
  CheckChain(Parse("x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
                   "mean(dims=[2,3,4])"),
             /*seed=*/3, {0, 5, 127}, kStrategy, kFp32Accurate);
}

// conv3d | ew{0,1} | group_norm | mean with 8-32 channels (multiples of 8), 1-8 input channels,
// kernels 1-4, strides 1-2, padding 0-2, dilation 1-2, odd sizes up to ~50 wide.
std::string RandomSpec(Rng& rng) {
  const int64_t c = 8 * rng.Int(1, 4);
  const int64_t groups_choices[] = {1, 2, 4, 8};
  int64_t groups = groups_choices[rng.Int(0, 3)];
  while (c % groups != 0) groups /= 2;
  int64_t k[3], s[3], p[3], d[3], in[3];
  for (int i = 0; i < 3; ++i) {
    k[i] = rng.Int(1, 4);
    s[i] = rng.Chance(0.7) ? 1 : 2;
    p[i] = rng.Chance(0.6) ? 0 : rng.Int(1, 2);
    d[i] = rng.Chance(0.8) ? 1 : 2;
    const int64_t span = d[i] * (k[i] - 1) + 1;
    in[i] = std::max<int64_t>(span - 2 * p[i], 1) + rng.Int(0, i == 2 ? 40 : 12);
  }
  auto dims = [](const int64_t (&v)[3]) {
    return absl::StrCat("[", v[0], ",", v[1], ",", v[2], "]");
  };
  const char* ops[] = {"relu", "hardswish", "swish", "tanh", "gelu"};
  std::string spec = absl::StrCat("x:f32[", rng.Int(1, 3), ",", rng.Int(1, 8), ",", in[0], ",",
                                  in[1], ",", in[2], "] | conv3d(out=", c, ",k=", dims(k),
                                  ",stride=", dims(s), ",padding=", dims(p),
                                  ",dilation=", dims(d), ")");
  if (rng.Chance(0.5)) absl::StrAppend(&spec, " | ", ops[rng.Int(0, 4)]);
  absl::StrAppend(&spec, " | group_norm(groups=", groups, ") | mean(dims=",
                  rng.Chance(0.5) ? "[2,3,4]" : "[1,2,3,4]", ")");
  return spec;
}

TEST(GpuMmaMoments, RandomChains) {
  SKIP_WITHOUT_GPU();
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  ASSERT_NE(s, nullptr);
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  Rng rng(8080);
  int checked = 0;
  for (int tries = 0; tries < 2000 && checked < 16; ++tries) {
    const Chain chain = Parse(RandomSpec(rng));
    if (!s->Applies(codegen::PlanInput(chain, target))) continue;
    CheckChain(chain, /*seed=*/100 + checked, {}, kStrategy, kFp32Accurate);
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

// Runs a compiled tuning twice on random inputs: fp32-accurate, bitwise-identical reruns.
void CheckTuned(const Chain& chain, const absl::StatusOr<std::shared_ptr<CompiledChain>>& c,
                const char* config) {
  const HostInputs inputs = RandomInputs(chain, 5);
  absl::StatusOr<std::vector<std::vector<float>>> outs = testing::RunOnGpu(**c, inputs);
  ASSERT_TRUE(outs.ok()) << outs.status();
  absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const ErrorStats err = CompareToReference((*outs)[0].data(), ref->data(),
                                            static_cast<int64_t>(ref->size()));
  EXPECT_LE(err.rel_l2, kFp32Accurate.rel_l2);
  EXPECT_LE(err.max_abs, kFp32Accurate.max_abs);
  EXPECT_EQ((*outs)[0], (*outs)[1]) << "two runs differ";
  std::printf("  rel_l2 %.2e max_abs %.2e  %s\n", err.rel_l2, err.max_abs, config);
}

// Other tunings than the default (warps, blocks per sample), forced through tune_config.
TEST(GpuMmaMoments, OtherTunings) {
  SKIP_WITHOUT_GPU();
  const Chain chain = Parse(
      "x:f32[3,5,13,21,29] | conv3d(out=24,k=[3,2,3],stride=[2,1,1],padding=[1,1,0]) | swish | "
      "group_norm(groups=4) | mean(dims=[2,3,4])");
  for (const char* config : {"mma-moments-mean:warps=4,min_blocks=1,blocks_per_sample=1,unroll_kh=2,pack=0",
                             "mma-moments-mean:warps=16,min_blocks=1,blocks_per_sample=7,unroll_kh=1,pack=0",
                             "mma-moments-mean:warps=1,min_blocks=1,blocks_per_sample=3,unroll_kh=1,pack=0"}) {
    SCOPED_TRACE(config);
    CompileOptions options;
    options.tune_config = config;
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
    ASSERT_TRUE(c.ok()) << c.status();
    CheckTuned(chain, c, config);
  }
  // Packed K (Cin 5 -> two channel groups per tap, stride 2 in d, padding in w only).
  const Chain packed = Parse(
      "x:f32[2,5,13,21,29] | conv3d(out=16,k=[3,2,3],stride=[2,1,1],padding=[0,0,1]) | swish | "
      "group_norm(groups=4) | mean(dims=[1,2,3,4])");
  for (const char* config : {"mma-moments-mean:warps=4,min_blocks=1,blocks_per_sample=2,unroll_kh=2,pack=1",
                             "mma-moments-mean:warps=8,min_blocks=1,blocks_per_sample=1,unroll_kh=1,pack=1"}) {
    SCOPED_TRACE(config);
    CompileOptions options;
    options.tune_config = config;
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(packed, options);
    ASSERT_TRUE(c.ok()) << c.status();
    CheckTuned(packed, c, config);
  }
}

// Timings (no assertion; medians of RunOnGpu, L2 not flushed) of a few tunings of the seeds,
// to pick the defaults: prints "  time <ms> <config>".
TEST(GpuMmaMoments, SeedTuningTimes) {
  SKIP_WITHOUT_GPU();
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {"x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
       "mean(dims=[2,3,4])",
       {"warps=8,min_blocks=2,blocks_per_sample=1,unroll_kh=1,pack=0",
        "warps=8,min_blocks=2,blocks_per_sample=1,unroll_kh=2,pack=0"}},
      {"x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
       "mean(dims=[1,2,3,4])",
       {"warps=8,min_blocks=2,blocks_per_sample=2,unroll_kh=1,pack=0",
        "warps=8,min_blocks=2,blocks_per_sample=2,unroll_kh=1,pack=1",
        "warps=8,min_blocks=2,blocks_per_sample=3,unroll_kh=1,pack=1",
        "warps=4,min_blocks=3,blocks_per_sample=3,unroll_kh=1,pack=1",
        "warps=8,min_blocks=2,blocks_per_sample=4,unroll_kh=1,pack=1"}},
  };
  for (const auto& [spec, configs] : cases) {
    const Chain chain = Parse(spec);
    const HostInputs inputs = RandomInputs(chain, 9);
    for (const char* config : configs) {
      CompileOptions options;
      options.tune_config = absl::StrCat(kStrategy, ":", config);
      absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
      ASSERT_TRUE(c.ok()) << c.status();
      double ms = 0;
      ASSERT_TRUE(testing::RunOnGpu(**c, inputs, 1, 20, &ms).ok());
      std::printf("  time %.4f ms  %s  %s\n", ms, config, spec);
    }
  }
}

}  // namespace
}  // namespace fusejit
