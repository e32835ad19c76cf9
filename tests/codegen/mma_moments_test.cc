// mma-moments-mean (templates/mma_conv_moments.cuh): where it applies, that its default and
// tuned configurations validate, and that its plans compile through NVRTC for sm_80 and sm_90
// (seeds W2, W4 and random chains with strides, padding, dilation, odd sizes). The GPU checks are
// in tests/gpu/gpu_mma_moments_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "jit/nvrtc.h"
#include "templates/embedded.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

constexpr char kStrategy[] = "mma-moments-mean";

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Chain{};
}

codegen::PlanTarget Target(const char* arch) { return {arch, 132, Precision::kFp32}; }

const char kW2[] =
    "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
    "mean(dims=[2,3,4])";
const char kW4[] =
    "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
    "mean(dims=[1,2,3,4])";

// conv3d | ew{0,1} | group_norm | mean with 8-32 channels (multiples of 8), 1-8 input channels,
// kernels 1-4, strides 1-2, padding 0-2, dilation 1-2, small odd sizes.
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

TEST(MmaMoments, AppliesToSeedsW2W4) {
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  ASSERT_NE(s, nullptr);
  for (const char* spec : {kW2, kW4}) {
    const Chain chain = Parse(spec);
    for (const char* arch : {"sm_80", "sm_90"}) {
      ASSERT_TRUE(s->Applies(codegen::PlanInput(chain, Target(arch)))) << spec << " " << arch;
      const codegen::TuneConfig def = s->DefaultConfig(codegen::PlanInput(chain, Target(arch)));
      EXPECT_TRUE(s->Validate(codegen::PlanInput(chain, Target(arch)), def).ok()) << def.ToString();
      std::printf("  %s default %s\n", arch, def.ToString().c_str());
    }
    EXPECT_FALSE(s->Applies(codegen::PlanInput(chain, Target("sm_75"))));
    // The planner's choice for the seeds (measured faster than conv-moments-mean on the H100).
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kStrategy) << spec;
    EXPECT_LT(s->Cost(codegen::PlanInput(chain, Target("sm_90"))),
              codegen::FindStrategy("conv-moments-mean")
                  ->Cost(codegen::PlanInput(chain, Target("sm_90"))));
  }
  // Not for a chain with ops after group_norm, nor for 12 channels.
  EXPECT_FALSE(s->Applies(
      codegen::PlanInput(Parse("x:f32[2,3,8,8,8] | conv3d(out=16,k=3) | group_norm(groups=4) | "
                               "relu | mean(dims=[2,3,4])"),
                         Target("sm_90"))));
  EXPECT_FALSE(s->Applies(
      codegen::PlanInput(Parse("x:f32[2,3,8,8,8] | conv3d(out=12,k=3) | group_norm(groups=4) | "
                               "mean(dims=[2,3,4])"),
                         Target("sm_90"))));
}

TEST(MmaMoments, CandidatesValidateAndBadConfigsAreRefused) {
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  const Chain chain = Parse(kW4);
  const std::vector<codegen::TuneConfig> all =
      s->Candidates(codegen::PlanInput(chain, Target("sm_90")));
  EXPECT_GT(all.size(), 5u);
  for (const codegen::TuneConfig& c : all) {
    EXPECT_TRUE(s->MakeTunedPlan(codegen::PlanInput(chain, Target("sm_90")), c).ok())
        << c.ToString();
  }
  absl::StatusOr<codegen::TuneConfig> bad =
      codegen::TuneConfig::Parse("mma-moments-mean:warps=8,min_blocks=2,blocks_per_sample=99,unroll_kh=1,pack=0");
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::Status st = s->Validate(codegen::PlanInput(chain, Target("sm_90")), *bad);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("blocks_per_sample"), std::string::npos) << st;
}

TEST(MmaMoments, PlansCompileForSm80AndSm90) {
  std::vector<std::string> specs = {kW2, kW4};
  Rng rng(515);
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  for (int tries = 0; tries < 500 && specs.size() < 6; ++tries) {
    const std::string spec = RandomSpec(rng);
    if (s->Applies(codegen::PlanInput(Parse(spec), Target("sm_90")))) specs.push_back(spec);
  }
  ASSERT_EQ(specs.size(), 6u);
  for (const std::string& spec : specs) {
    for (const char* arch : {"sm_80", "sm_90"}) {
      CompileOptions options;
      options.arch = arch;
      options.use_cache = false;
      options.strategy = kStrategy;
      absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(spec), options);
      EXPECT_TRUE(c.ok()) << spec << " " << arch << ": " << c.status();
    }
  }
}

// The host's shared-memory size (KernelLaunch::shared_bytes) is the template's kSharedBytes for
// every candidate of a few chains (both K layouts, warps 4-16): static_asserts compiled by NVRTC.
TEST(MmaMoments, HostSharedBytesMatchTheTemplate) {
  const codegen::Strategy* s = codegen::FindStrategy(kStrategy);
  std::vector<std::string> specs = {kW2, kW4};
  Rng rng(733);
  for (int tries = 0; tries < 500 && specs.size() < 5; ++tries) {
    const std::string spec = RandomSpec(rng);
    if (s->Applies(codegen::PlanInput(Parse(spec), Target("sm_90")))) specs.push_back(spec);
  }
  for (const std::string& spec : specs) {
    const Chain chain = Parse(spec);
    std::string probe;
    int count = 0;
    for (const codegen::TuneConfig& c : s->Candidates(codegen::PlanInput(chain, Target("sm_90")))) {
      if (count == 12) break;
      absl::StatusOr<codegen::Plan> plan =
          s->MakeTunedPlan(codegen::PlanInput(chain, Target("sm_90")), c);
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (probe.empty()) probe = codegen::EmitSource(chain, *plan).main + "\nnamespace fj {\n";
      const codegen::TuneStruct& t = plan->tunes.back();
      std::string fields;
      for (const auto& f : t.fields) {
        absl::StrAppend(&fields, " static constexpr ", f.type, " ", f.name, " = ", f.value, ";");
      }
      absl::StrAppend(&probe, "struct Probe", count, " {", fields, " };\n",
                      "static_assert(MmaMomentsGeom<Cfg, Probe", count, ">::kSharedBytes == ",
                      plan->kernels[0].shared_bytes, ", \"", c.ToString(), "\");\n");
      ++count;
    }
    probe += "}  // namespace fj\n";
    jit::NvrtcRequest req;
    req.name = "mma_moments_probe.cu";
    req.source = probe;
    req.arch = "sm_90";
    req.options = codegen::SourceNvrtcOptions();
    for (const templates::TemplateFile& t : templates::All()) {
      req.headers.emplace_back(std::string(t.name), std::string(t.text));
    }
    absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
    EXPECT_TRUE(out.ok()) << spec << ": " << out.status();
  }
}

}  // namespace
}  // namespace fusejit
