// The autotuner on the GPU: tuning small chains finds a configuration no slower than the default
// (the default is a candidate; 2% allowed for noise), the chosen kernel still matches the float64
// CPU reference, and a stored result is what Compile then uses on this device.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "cache/testing.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "gtest/gtest.h"
#include "tests/gpu_support.h"
#include "tune/tuner.h"
#include "tune/tuning_db.h"

namespace fusejit::tune {
namespace {

// Checks `config` for `chain` against the float64 reference on random inputs.
void ExpectMatchesReference(const Chain& chain, const std::string& config) {
  CompileOptions options;
  options.tune_config = config;
  options.use_tuning = false;
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(chain, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const HostInputs inputs = RandomInputs(chain, 3);
  absl::StatusOr<std::vector<std::vector<float>>> out =
      fusejit::testing::RunOnGpu(**compiled, inputs, /*runs=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0], (*out)[1]) << "two runs differ";
  absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->size(), (*out)[0].size());
  const ErrorStats e =
      CompareToReference((*out)[0].data(), ref->data(), static_cast<int64_t>(ref->size()));
  std::printf("  %s: rel_l2 %.2e max_abs %.2e\n", config.c_str(), e.rel_l2, e.max_abs);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_l2, 1e-5) << config;
  EXPECT_LE(e.max_abs, 1e-4) << config;
}

void TuneAndCheck(const std::string& spec, double budget_s) {
  const Chain chain = *ParseChain(spec);
  TuneOptions options;
  options.budget_s = budget_s;
  absl::StatusOr<TuneResult> r = TuneChain(chain, options);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("%s\n  default %.4f ms, best %.4f ms (%.2fx), %zu tried, %zu rejected, %zu failed, "
              "%zu in the space, %.1f s\n  best: %s\n",
              spec.c_str(), r->default_ms, r->best_ms, r->speedup(), r->tried, r->rejected,
              r->failed, r->space, r->seconds, r->best_config.c_str());
  EXPECT_GE(r->tried, 2u);
  EXPECT_EQ(r->failed, 0u) << "a candidate that Validate() accepted failed";
  EXPECT_LE(r->best_ms, r->default_ms * 1.02);
  EXPECT_FALSE(r->candidates.empty());
  EXPECT_EQ(r->candidates[0].config, r->default_config);
  ExpectMatchesReference(chain, r->best_config);
}

TEST(GpuTune, ConvMomentsChainNoSlowerThanDefaultAndCorrect) {
  SKIP_WITHOUT_GPU();
  TuneAndCheck("x:f32[16,3,16,32,32] | conv3d(out=16,k=3) | hardswish | group_norm(groups=4) | "
               "mean(dims=[2,3,4])",
               3);
}

TEST(GpuTune, ConvTChainNoSlowerThanDefaultAndCorrect) {
  SKIP_WITHOUT_GPU();
  TuneAndCheck("x:f32[8,3,8,16,16] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
               "group_norm(groups=4) | hardswish",
               3);
}

TEST(GpuTune, GenericChainNoSlowerThanDefaultAndCorrect) {
  SKIP_WITHOUT_GPU();
  // (1x1: store-normalize by default; with a 3x3 the parallelism-aware cost picks tc-conv.)
  TuneAndCheck("x:f32[4,40,8,8,8] | conv3d(out=48,k=1) | relu | group_norm(groups=4)", 3);
}

// bf16, f16 and f64 chains: the tuner uploads the inputs, poisons, compares and downloads the
// output in the chain's dtype, and compiles each candidate for the chain itself (a bf16 chain's
// tc-conv tilings are those of one TF32 product, not the f32 chain's 3xTF32). Its default's error
// against float64 is the dtype's (a misread output -- 4-byte floats over 2-byte values -- gives NaN
// halves or errors near 1), no candidate fails, and the best is no slower than the default.
TEST(GpuTune, ChainsOfEveryDtypeTuneInTheirDtype) {
  SKIP_WITHOUT_GPU();
  const std::pair<const char*, double> cases[] = {
      {"x:bf16[4,32,8,12,12] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)", 1e-2},
      {"x:f16[2,24,8,10,10] | conv3d(out=40,k=3,padding=1) | swish", 2e-3},
      // (The tuner reads outputs back as floats: f64 results carry a float's rounding.)
      {"x:f64[2,3,8,16,16] | conv3d(out=16,k=3) | group_norm(groups=4) | mean(dims=[2,3,4])", 1e-6},
  };
  for (const auto& [spec, max_error] : cases) {
    SCOPED_TRACE(spec);
    const Chain chain = *ParseChain(spec);
    TuneOptions options;
    options.budget_s = 5;  // the bf16 chain's igemm candidates take ~1 s each to compile
    absl::StatusOr<TuneResult> r = TuneChain(chain, options);
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("%s\n  default %.4f ms (rel err %.2e), best %.4f ms, %zu tried, %zu rejected\n",
                spec, r->default_ms, r->default_error, r->best_ms, r->tried, r->rejected);
    EXPECT_GE(r->tried, 2u);
    EXPECT_EQ(r->failed, 0u);    // every candidate's configuration checked against this chain
    EXPECT_EQ(r->rejected, 0u);  // correct plans round differently, within the dtype's tolerance
    EXPECT_LE(r->best_ms, r->default_ms * 1.02);
    EXPECT_GE(r->default_error, 0.0);  // measured (-1: not computed)
    EXPECT_LE(r->default_error, max_error);
  }
}

TEST(GpuTune, AStoredResultIsWhatCompileUsesOnThisDevice) {
  SKIP_WITHOUT_GPU();
  cache::testing::TempDir dir;
  TuningDbOptions o;
  o.dir = dir.Sub("tuning");
  TuningDb db(o);
  TuningDb* previous = TuningDb::SetDefaultForTesting(&db);
  const Chain chain = *ParseChain(
      "x:f32[4,3,8,16,16] | conv3d(out=16,k=3) | group_norm(groups=4) | mean(dims=[1,2,3,4])");
  TuneOptions options;
  options.budget_s = 2;
  absl::StatusOr<TuneResult> r = TuneChain(chain, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(db.Store(r->ToRecord()).ok());
  CompileOptions compile;  // the current device
  compile.use_cache = false;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, compile);
  TuningDb::SetDefaultForTesting(previous);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->stats().tune_origin, "tuned");
  EXPECT_TRUE(absl::StrContains((*c)->Explain(), "config: " + r->best_config)) << (*c)->Explain();
}

}  // namespace
}  // namespace fusejit::tune
