// conv-moments-mean beyond the seed domain: up to 64 channels (split over the grid, csplit),
// Cin*k^3 up to 4096 (weights in dynamic shared memory), strides, padding, dilation.
// CPU: the plan choice on the sweep shapes that used to fall to the generic plan, and NVRTC
// compiles of the extreme candidates (most shared memory, most accumulators). GPU (Gpu*, skipped
// without a driver): the strategy forced on those shapes and on random wide chains, with the
// default and with other valid tunings, fp32-accurate against the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "jit/device.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

constexpr char kStrategy[] = "conv-moments-mean";

// bench/sweep_manifest.txt: W2-d, W2-f, W4-e.
const char* const kSweep[] = {
    "x:f32[64,8,16,16,16] | conv3d(out=16,k=5,stride=1) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])",
    "x:f32[32,16,8,16,16] | conv3d(out=64,k=3,stride=1) | hardswish | group_norm(groups=8) | "
    "mean(dims=[2,3,4])",
    "x:f32[32,3,16,64,64] | conv3d(out=32,k=5,stride=2) | group_norm(groups=8) | "
    "mean(dims=[1,2,3,4])",
};

// fp32-accurate: rel L2 <= 1e-6, max abs <= 1e-5 against float64.
constexpr testing::Tolerance kFp32Accurate{1e-6, 1e-5};

codegen::PlanTarget Sm90() { return {"sm_90", 132, Precision::kFp32}; }

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Chain{};
}

// conv3d | ew{0,2} | group_norm | mean with 32-64 output channels (sometimes fewer), up to 16
// input channels, kernels up to 5 per dim, strides 1-3, padding 0-2, dilation 1-2, batch 1-3
// and inputs up to 14 larger than the kernel span (`big`: batch 16-48, inputs 12-28 larger).
Chain RandomWideChain(Rng& rng, bool big = false) {
  const int64_t channel_choices[] = {32, 36, 40, 48, 56, 60, 64, 64, 8, 20};
  const int64_t c = channel_choices[rng.Int(0, 9)];
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= c; ++g) {
    if (c % g == 0) divisors.push_back(g);
  }
  const int64_t groups = divisors[rng.Int(0, static_cast<int64_t>(divisors.size()) - 1)];
  int64_t k[3], s[3], p[3], d[3], in[3];
  for (int i = 0; i < 3; ++i) {
    k[i] = rng.Int(1, 5);
    s[i] = rng.Chance(0.6) ? 1 : rng.Int(2, 3);
    p[i] = rng.Chance(0.6) ? 0 : rng.Int(1, 2);
    d[i] = rng.Chance(0.8) ? 1 : 2;
    const int64_t span = d[i] * (k[i] - 1) + 1;
    in[i] = std::max<int64_t>(span - 2 * p[i], 1) + (big ? rng.Int(12, 28) : rng.Int(0, 14));
  }
  auto dims = [](const int64_t (&v)[3]) { return absl::StrCat("[", v[0], ",", v[1], ",", v[2], "]"); };
  const char* ops[] = {"relu", "hardswish", "swish", "tanh", "gelu", "leaky_relu(slope=0.1)",
                       "clamp(min=-0.5,max=0.75)", "sigmoid"};
  std::string spec = absl::StrCat("x:f32[", big ? rng.Int(16, 48) : rng.Int(1, 3), ",", rng.Int(1, 16), ",", in[0], ",",
                                  in[1], ",", in[2], "] | conv3d(out=", c, ",k=", dims(k),
                                  ",stride=", dims(s), ",padding=", dims(p), ",dilation=", dims(d),
                                  ")");
  for (int64_t i = rng.Int(0, 2); i > 0; --i) absl::StrAppend(&spec, " | ", ops[rng.Int(0, 7)]);
  absl::StrAppend(&spec, " | group_norm(groups=", groups, ") | mean(dims=",
                  rng.Chance(0.5) ? "[2,3,4]" : "[1,2,3,4]", ")");
  return Parse(spec);
}

TEST(ConvMoments, SweepShapesPlanThisStrategy) {
  const codegen::Strategy* self = nullptr;
  for (const auto& s : codegen::AllStrategies()) {
    if (s->name() == kStrategy) self = s.get();
  }
  ASSERT_NE(self, nullptr);
  for (const char* spec : kSweep) {
    // The planner picks this strategy or, where it was measured faster (W2-d: stride 1, k5, 8
    // input channels), the tensor-core mma-moments-mean -- never a generic one.
    absl::StatusOr<codegen::Plan> chosen = codegen::MakePlan(Parse(spec), Sm90());
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_TRUE(chosen->strategy == kStrategy || chosen->strategy == "mma-moments-mean")
        << spec << ": " << chosen->strategy;
    ASSERT_TRUE(self->Applies(codegen::PlanInput(Parse(spec), Sm90()))) << spec;
    absl::StatusOr<codegen::Plan> plan = self->MakePlan(codegen::PlanInput(Parse(spec), Sm90()));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kStrategy) << spec;
    ASSERT_FALSE(plan->kernels.empty());
    EXPECT_GT(plan->kernels[0].shared_bytes, 0u) << spec;
    EXPECT_LE(plan->kernels[0].shared_bytes, 227u * 1024) << spec;
  }
  // W2-d's 64 KB of weights for 16 channels: only with dynamic shared memory or a channel split.
  absl::StatusOr<codegen::TuneConfig> def = codegen::DefaultTuneConfig(Parse(kSweep[0]), Sm90());
  ASSERT_TRUE(def.ok());
  std::printf("  defaults: %s\n", def->ToString().c_str());
}

TEST(ConvMoments, AppliesToRandomWideChains) {
  Rng rng(640);
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  ASSERT_NE(s, nullptr);
  int applies = 0;
  for (int i = 0; i < 200; ++i) {
    const bool big = i % 2 == 1;
    const Chain chain = RandomWideChain(rng, big);
    if (!s->Applies(codegen::PlanInput(chain, Sm90()))) continue;
    ++applies;
    const codegen::TuneConfig def = s->DefaultConfig(codegen::PlanInput(chain, Sm90()));
    EXPECT_TRUE(s->Validate(codegen::PlanInput(chain, Sm90()), def).ok()) << FormatChain(chain);
    EXPECT_TRUE(s->MakePlan(codegen::PlanInput(chain, Sm90())).ok()) << FormatChain(chain);
    // Large enough to fill the GPU: the only generic plan for these chains computes the conv
    // twice, this one or a tensor-core moments plan must be chosen (mma-moments-mean: with 8
    // output channels and 8-12 input channels times 24-45 taps, where this plan's FFMA work is
    // modeled at its measured rate, ConvMomentsMeanStrategy::Cost). (Tiny chains may go either
    // way: both are latency-bound.)
    if (big) {
      absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Sm90());
      ASSERT_TRUE(plan.ok());
      EXPECT_TRUE(plan->strategy == kStrategy || plan->strategy == "mma-moments-mean" ||
                  plan->strategy == "tc-conv")
          << FormatChain(chain) << ": " << plan->strategy;
    }
  }
  EXPECT_GT(applies, 190);  // all but the rare chain whose weights need too many parts
}

// The default and, per channel split, the valid candidates with the most shared memory and the
// most accumulators per thread (the limits Validate() mirrors from the template's static_asserts
// and launch bounds) compile through NVRTC for sm_90.
TEST(ConvMoments, ExtremeCandidatesCompileForSm90) {
  std::vector<Chain> chains;
  for (const char* spec : kSweep) chains.push_back(Parse(spec));
  Rng rng(77);
  chains.push_back(RandomWideChain(rng));
  std::vector<std::pair<Chain, std::string>> jobs;
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  ASSERT_NE(s, nullptr);
  for (const Chain& chain : chains) {
    if (!s->Applies(codegen::PlanInput(chain, Sm90()))) continue;
    const std::vector<codegen::TuneConfig> all = s->Candidates(codegen::PlanInput(chain, Sm90()));
    ASSERT_FALSE(all.empty());
    // csplit -> most shared memory, ksplit -> most accumulators
    std::map<int64_t, std::pair<int64_t, std::string>> most_smem, most_acc;
    for (const codegen::TuneConfig& c : all) {
      absl::StatusOr<codegen::Plan> plan = s->MakeTunedPlan(codegen::PlanInput(chain, Sm90()), c);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t csplit = *c.Get("csplit");
      const int64_t smem = plan->kernels[0].shared_bytes;
      const int64_t acc = *c.Get("ph") * *c.Get("pw") * chain.ops[0].conv.out_channels / csplit;
      if (smem > most_smem[csplit].first) most_smem[csplit] = {smem, c.ToString()};
      if (acc > most_acc[*c.Get("ksplit")].first) most_acc[*c.Get("ksplit")] = {acc, c.ToString()};
    }
    std::vector<std::string> picked = {all[0].ToString()};
    for (const auto& [csplit, best] : most_smem) picked.push_back(best.second);
    for (const auto& [ksplit, best] : most_acc) picked.push_back(best.second);
    std::sort(picked.begin() + 1, picked.end());
    picked.erase(std::unique(picked.begin() + 1, picked.end()), picked.end());
    for (const std::string& p : picked) jobs.push_back({chain, p});
  }
  std::printf("compiling %zu configurations\n", jobs.size());
  std::atomic<size_t> next{0};
  std::vector<std::future<std::string>> results;
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  for (unsigned w = 0; w < workers; ++w) {
    results.push_back(std::async(std::launch::async, [&] {
      std::string errors;
      for (size_t i = next++; i < jobs.size(); i = next++) {
        CompileOptions options;
        options.arch = "sm_90";
        options.use_cache = false;
        options.tune_config = jobs[i].second;
        absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(jobs[i].first, options);
        if (!c.ok()) errors += jobs[i].second + ": " + std::string(c.status().message()) + "\n";
      }
      return errors;
    }));
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

// ---- GPU ------------------------------------------------------------------------------------

// Compiles `chain` with each of `configs` (in parallel: NVRTC dominates these tests).
std::vector<absl::StatusOr<std::shared_ptr<CompiledChain>>> CompileAll(
    const Chain& chain, const std::vector<std::string>& configs) {
  std::vector<std::future<absl::StatusOr<std::shared_ptr<CompiledChain>>>> pending;
  for (const std::string& config : configs) {
    pending.push_back(std::async(std::launch::async, [&chain, config] {
      // Compile() plans for the current context's device: make the primary context current here.
      absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
      if (!context.ok()) return absl::StatusOr<std::shared_ptr<CompiledChain>>(context.status());
      CompileOptions options;
      options.tune_config = config;
      return Compile(chain, options);
    }));
  }
  std::vector<absl::StatusOr<std::shared_ptr<CompiledChain>>> out;
  for (auto& p : pending) out.push_back(p.get());
  return out;
}

// Runs `compiled` and checks it as CheckChain does (two bitwise-identical runs, every output
// written) against `ref`, the float64 reference of `samples`.
void CheckCompiled(const Chain& chain, const std::string& config,
                   const absl::StatusOr<std::shared_ptr<CompiledChain>>& compiled,
                   const HostInputs& inputs, const std::vector<int64_t>& samples,
                   const std::vector<double>& ref) {
  SCOPED_TRACE(FormatChain(chain) + " config " + config);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  absl::StatusOr<std::vector<std::vector<float>>> outs = testing::RunOnGpu(**compiled, inputs);
  ASSERT_TRUE(outs.ok()) << outs.status();
  const std::vector<float>& y = (*outs)[0];
  ASSERT_EQ(std::memcmp(y.data(), (*outs)[1].data(), y.size() * 4), 0) << "two runs differ";
  for (float v : y) ASSERT_FALSE(std::isnan(v)) << "outputs left unwritten (still NaN)";
  const int64_t per_sample = static_cast<int64_t>(y.size()) / chain.input[0];
  std::vector<float> picked;
  for (int64_t s : samples) {
    picked.insert(picked.end(), y.begin() + s * per_sample, y.begin() + (s + 1) * per_sample);
  }
  ASSERT_EQ(picked.size(), ref.size());
  const ErrorStats err = CompareToReference(picked.data(), ref.data(), ref.size());
  EXPECT_LE(err.rel_l2, kFp32Accurate.rel_l2) << "max_abs " << err.max_abs;
  EXPECT_LE(err.max_abs, kFp32Accurate.max_abs) << "rel_l2 " << err.rel_l2;
  std::printf("  rel_l2 %.2e  max_abs %.2e  %s  %s\n", err.rel_l2, err.max_abs, config.c_str(),
              FormatChain(chain).c_str());
}

// Checks `chain` with its default tuning, the first candidates with other K splits, and up to
// `others` further valid candidates (spread over the candidate list: other channel splits, tiles,
// block counts).
void CheckDefaultAndOthers(const Chain& chain, uint64_t seed, const std::vector<int64_t>& samples,
                           int others) {
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  ASSERT_TRUE(s->Applies(codegen::PlanInput(chain, Sm90()))) << FormatChain(chain);
  const std::vector<codegen::TuneConfig> all = s->Candidates(codegen::PlanInput(chain, Sm90()));
  std::vector<std::string> configs = {all[0].ToString()};
  for (int64_t ksplit : {1, 2, 4}) {
    for (const codegen::TuneConfig& c : all) {
      if (c.Get("ksplit") == ksplit && c.Get("ksplit") != all[0].Get("ksplit")) {
        configs.push_back(c.ToString());
        break;
      }
    }
  }
  for (int i = 1; i <= others && all.size() > 1; ++i) {
    configs.push_back(all[(all.size() - 1) * i / others].ToString());
  }
  const auto compiled = CompileAll(chain, configs);
  const HostInputs inputs = RandomInputs(chain, seed);
  ReferenceOptions ropt;
  ropt.samples = samples;
  absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs, ropt);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (size_t i = 0; i < configs.size(); ++i) {
    CheckCompiled(chain, configs[i], compiled[i], inputs, samples, *ref);
  }
}

TEST(GpuConvMoments, SweepShapes) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : kSweep) {
    const Chain chain = Parse(spec);
    const int64_t n = chain.input[0];
    testing::CheckChain(chain, /*seed=*/3, {0, n - 1}, kStrategy, kFp32Accurate);
  }
}

TEST(GpuConvMoments, SweepShapesOtherTunings) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : kSweep) {
    Chain chain = Parse(spec);
    chain.input[0] = 3;  // smaller batch, same per-sample work and tilings
    CheckDefaultAndOthers(chain, /*seed=*/9, {0, 2}, /*others=*/4);
  }
}

TEST(GpuConvMoments, RandomWideChains) {
  SKIP_WITHOUT_GPU();
  Rng rng(2026);
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  int checked = 0;
  for (int tries = 0; tries < 200 && checked < 12; ++tries) {
    const Chain chain = RandomWideChain(rng);
    if (!s->Applies(codegen::PlanInput(chain, Sm90()))) continue;
    std::vector<int64_t> all(chain.input[0]);
    for (int64_t i = 0; i < chain.input[0]; ++i) all[i] = i;
    CheckDefaultAndOthers(chain, /*seed=*/50 + checked, all, /*others=*/2);
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

}  // namespace
}  // namespace fusejit
