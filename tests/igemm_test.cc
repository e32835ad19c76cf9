// The tensor-core strategy igemm-store-normalize (codegen/igemm_strategy.cc), CPU only: which
// chains and targets it applies to, the plan it makes for W3 in both precisions, and that the
// plans compile for sm_90a (NVRTC needs no GPU). Its GPU checks are in gpu_igemm_test.cc.
#include <gtest/gtest.h>

#include <regex>

#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "jit/nvrtc.h"
#include "templates/embedded.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

constexpr char kIgemm[] = "igemm-store-normalize";

Chain Parse(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << spec << ": " << chain.status();
  return chain.ok() ? *chain : Chain{};
}

const codegen::Strategy& Igemm() {
  for (const auto& s : codegen::AllStrategies()) {
    if (s->name() == kIgemm) return *s;
  }
  ADD_FAILURE() << kIgemm << " is not registered";
  std::abort();
}

codegen::PlanTarget Target(const char* arch, Precision precision = Precision::kFp32) {
  return {arch, 132, precision};
}

const codegen::KernelLaunch* FindKernel(const codegen::Plan& plan, const std::string& symbol) {
  for (const codegen::KernelLaunch& k : plan.kernels) {
    if (k.symbol == symbol) return &k;
  }
  return nullptr;
}

std::vector<std::string> Symbols(const codegen::Plan& plan) {
  std::vector<std::string> out;
  for (const codegen::KernelLaunch& k : plan.kernels) out.push_back(k.symbol);
  return out;
}

std::string TuneValue(const codegen::Plan& plan, const std::string& field) {
  for (const codegen::TuneStruct& t : plan.tunes) {
    for (const codegen::TuneStruct::Field& f : t.fields) {
      if (f.name == field) return f.value;
    }
  }
  return "";
}

const Chain& W3() {
  static const Chain* w3 = new Chain(Parse(SeedWorkloads()[2].spec));
  return *w3;
}

TEST(Igemm, W3PlansToIgemmInBothPrecisions) {
  ASSERT_EQ(SeedWorkloads()[2].id, "W3");
  for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
    const bool tf32 = precision == Precision::kTf32;
    SCOPED_TRACE(tf32 ? "tf32" : "fp32");
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target("sm_90", precision));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kIgemm);
    EXPECT_EQ(plan->arch_override, "sm_90a");
    // Launch order: [absmax] -> prep -> GEMM -> finalize -> apply.
    if (tf32) {
      EXPECT_EQ(Symbols(*plan), (std::vector<std::string>{"fj_igemm_prep", "fj_igemm_wgmma",
                                                          "fj_gn_finalize", "fj_gn_apply"}));
    } else {
      EXPECT_EQ(Symbols(*plan),
                (std::vector<std::string>{"fj_igemm_absmax", "fj_igemm_prep", "fj_igemm_wgmma",
                                          "fj_gn_finalize", "fj_gn_apply"}));
    }
    // The measured tunings: F16x3 192-row tiles, 7 stages, flush every 2; TF32 256 rows, 5 stages.
    EXPECT_EQ(TuneValue(*plan, "kPrec"), tf32 ? "0" : "1");
    EXPECT_EQ(TuneValue(*plan, "kWG"), tf32 ? "4" : "3");
    EXPECT_EQ(TuneValue(*plan, "kStages"), tf32 ? "5" : "7");
    EXPECT_EQ(TuneValue(*plan, "kFlushSteps"), tf32 ? "0" : "2");
    EXPECT_EQ(TuneValue(*plan, "kAsync"), "1");
    const codegen::KernelLaunch* gemm = FindKernel(*plan, "fj_igemm_wgmma");
    ASSERT_NE(gemm, nullptr);
    const unsigned rows = tf32 ? 256 : 192, tiles = (34 * 34 * 34 + rows - 1) / rows;
    EXPECT_EQ(gemm->grid, (std::array<unsigned, 3>{tiles, 1, 16}));
    EXPECT_EQ(gemm->block[0], rows * 2);  // a warpgroup of 128 threads per 64 rows
    EXPECT_EQ(gemm->min_blocks_per_sm, 1u);
    EXPECT_EQ(gemm->shared_bytes, tf32 ? 217088u : 229376u);
    EXPECT_LE(gemm->shared_bytes, 227u * 1024);
    EXPECT_EQ(FindKernel(*plan, "fj_gn_finalize")->body,
              "fj::gn_finalize_body<Cfg, " + std::to_string(tiles) + ">");
    EXPECT_EQ(FindKernel(*plan, "fj_gn_apply")->grid, (std::array<unsigned, 3>{20, 16 * 128, 1}));
    // Workspace: the operand copies (x channels-last: as large as x) plus small regions.
    const size_t x_bytes = 16ull * 64 * 32 * 32 * 32 * 4, w_bytes = 64ull * 128 * 27 * 4;
    EXPECT_EQ(plan->workspace[0].bytes, x_bytes);
    EXPECT_EQ(plan->workspace[1].bytes, w_bytes);
    EXPECT_LT(plan->workspace_bytes, x_bytes + w_bytes + (1u << 20));
    const std::string explain = codegen::ExplainPlan(*plan);
    EXPECT_NE(explain.find(tf32 ? "TF32" : "fp32-accurate"), std::string::npos) << explain;
  }
}

TEST(Igemm, W3CompilesForSm90aInBothPrecisions) {
  for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
    CompileOptions options;
    options.arch = "sm_90";
    options.precision = precision;
    options.use_cache = false;
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(W3(), options);
    ASSERT_TRUE(c.ok()) << c.status();
    // The chain reports the device arch it was compiled for; the cubin is its sm_90a variant.
    EXPECT_EQ((*c)->arch(), "sm_90");
    const std::string explain = (*c)->Explain();
    EXPECT_NE(explain.find("plan: igemm-store-normalize"), std::string::npos) << explain;
    EXPECT_NE(explain.find("(wgmma, sm_90a)"), std::string::npos) << explain;
    EXPECT_GT((*c)->workspace_bytes(), 0u);
  }
}

// The generated W3 source compiled for sm_90a: wgmma instructions are emitted and nothing spills.
TEST(Igemm, W3KernelsUseWgmmaAndDoNotSpill) {
  for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target("sm_90", precision));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const codegen::GeneratedSource src = codegen::EmitSource(W3(), *plan);
    jit::NvrtcRequest req;
    req.name = src.name;
    req.source = src.main;
    req.headers = src.headers;
    req.arch = plan->arch_override;
    req.options = src.nvrtc_options;
    req.options.push_back("--ptxas-options=-v");
    req.want_ptx = true;
    absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_NE(out->ptx.find("wgmma.mma_async"), std::string::npos);
    const std::regex spill(R"(([0-9]+) bytes spill (stores|loads))");
    int reports = 0;
    for (auto it = std::sregex_iterator(out->log.begin(), out->log.end(), spill);
         it != std::sregex_iterator(); ++it) {
      ++reports;
      EXPECT_EQ((*it)[1].str(), "0") << out->log;
    }
    EXPECT_GE(reports, 8) << out->log;  // stores and loads of each of the 4-5 kernels
  }
}

TEST(Igemm, TheWgmmaTemplateCompilesForSm90a) {
  const templates::TemplateFile* f = templates::Find("igemm_wgmma.cuh");
  ASSERT_NE(f, nullptr);
  jit::NvrtcRequest req;
  req.name = "igemm_wgmma.cuh";
  req.source = std::string(f->text);
  req.arch = "sm_90a";
  req.options = codegen::SourceNvrtcOptions();
  req.want_ptx = true;
  for (const templates::TemplateFile& t : templates::All()) {
    req.headers.emplace_back(std::string(t.name), std::string(t.text));
  }
  absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->ptx.find("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"),
            std::string::npos);
  EXPECT_NE(out->ptx.find("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
            std::string::npos);
  // Built for plain sm_90 it compiles too (Templates.EveryTemplateCompilesOnItsOwn), but without
  // wgmma: the kernel says why and traps.
  req.arch = "sm_90";
  out = jit::CompileCuda(req);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->ptx.find("wgmma.mma_async"), std::string::npos);
  EXPECT_NE(out->ptx.find("trap"), std::string::npos);
}

TEST(Igemm, AppliesOnlyToHopper) {
  const codegen::Strategy& s = Igemm();
  EXPECT_TRUE(s.Applies(W3(), Target("sm_90")));
  EXPECT_TRUE(s.Applies(W3(), Target("sm_90a")));
  EXPECT_TRUE(s.Applies(W3(), Target("sm_90", Precision::kTf32)));
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_100", "sm_120"}) {
    EXPECT_FALSE(s.Applies(W3(), Target(arch))) << arch;
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target(arch));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, "store-normalize") << arch;
    EXPECT_EQ(plan->arch_override, "") << arch;
  }
  // TF32 is permission: on a target without a TF32 plan the fp32 plans run.
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target("sm_80", Precision::kTf32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, "store-normalize");
  CompileOptions options;
  options.arch = "sm_80";
  options.use_cache = false;
  options.strategy = kIgemm;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(W3(), options);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("does not apply"), std::string::npos) << c.status();
}

// One chain per requirement of the kernels, each breaking only that one.
TEST(Igemm, DoesNotApplyToChainsBreakingAConstraint) {
  const codegen::Strategy& s = Igemm();
  const std::string base =
      "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)";
  ASSERT_TRUE(s.Applies(Parse(base), Target("sm_90")));
  ASSERT_TRUE(s.Applies(
      Parse("x:f32[2,64,10,10,10] | conv_transpose3d(out=256,k=3,padding=1,"
            "dilation=2,output_padding=1,bias=false) | swish | group_norm(groups=4) | gelu"),
      Target("sm_90")));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"stride 2",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,stride=2,padding=1) | relu | "
       "group_norm(groups=8)"},
      {"transposed stride 2",
       "x:f32[2,64,10,10,10] | conv_transpose3d(out=128,k=3,stride=2) | relu | "
       "group_norm(groups=8)"},
      {"Cin not a multiple of 32",
       "x:f32[2,48,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"Cin too large for the prep tile",
       "x:f32[1,384,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"Cout not a multiple of 128",
       "x:f32[2,64,10,10,10] | conv3d(out=192,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"Cout 64",
       "x:f32[2,64,10,10,10] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"a group straddles channel tiles",
       "x:f32[2,64,10,10,10] | conv3d(out=384,k=3,padding=1) | relu | group_norm(groups=2)"},
      {"kernel depth > 8",
       "x:f32[1,32,12,10,10] | conv3d(out=128,k=[9,1,1]) | relu | group_norm(groups=8)"},
      {"output plane < 64 points",
       "x:f32[2,64,9,7,9] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"N*C > 65535 (apply grid)",
       "x:f32[513,32,8,8,8] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"sample >= 2 GiB channels-last",
       "x:f32[1,64,256,256,128] | conv3d(out=128,k=1) | relu | group_norm(groups=8)"},
      {"no tuning fits shared memory",
       "x:f32[1,32,3,3,3000] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"mean",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8) | "
       "mean(dims=[2,3,4])"},
      {"no group_norm", "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | relu"},
      {"no producer", "x:f32[2,128,10,10,10] | relu | group_norm(groups=8)"},
  };
  for (const auto& [why, spec] : cases) {
    const Chain chain = Parse(spec);
    if (chain.ops.empty()) continue;
    EXPECT_FALSE(s.Applies(chain, Target("sm_90"))) << why << ": " << spec;
    EXPECT_FALSE(s.Applies(chain, Target("sm_90", Precision::kTf32))) << why << ": " << spec;
    // The planner still finds a plan.
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << why << ": " << plan.status();
    EXPECT_NE(plan->strategy, kIgemm) << why;
  }
}

// Small shapes fall back to smaller tiles and fewer stages instead of not applying.
TEST(Igemm, SmallShapesGetSmallerTunings) {
  // One warpgroup: an output plane of 81 points holds one 64-row tile but not two.
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(
      Parse("x:f32[1,32,7,9,9] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"),
      Target("sm_90"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, kIgemm);
  EXPECT_EQ(TuneValue(*plan, "kWG"), "1");
  // A 1x1x1 kernel: one tap per halo, so two B stages and no wgmma kept in flight.
  plan = codegen::MakePlan(
      Parse("x:f32[2,64,12,12,12] | conv3d(out=128,k=1) | relu | group_norm(groups=8)"),
      Target("sm_90"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, kIgemm);
  EXPECT_EQ(TuneValue(*plan, "kStages"), "2");
  EXPECT_EQ(TuneValue(*plan, "kAsync"), "0");
}

// The plan's grids and shared memory come from a host-side copy of the templates' shapes; check
// them against the templates themselves (static_asserts compiled by NVRTC, kernels left out), on
// chains across the kernels' limits. This also instantiates every static_assert of the templates
// for chains that Applies() accepts.
std::string ShapeProbe(const Chain& chain, const codegen::Plan& plan) {
  const codegen::GeneratedSource src = codegen::EmitSource(chain, plan);
  const size_t wrappers = src.main.find("// " + plan.kernels[0].purpose + "\nextern");
  EXPECT_NE(wrappers, std::string::npos);
  const codegen::KernelLaunch* gemm = FindKernel(plan, "fj_igemm_wgmma");
  const codegen::KernelLaunch* prep = FindKernel(plan, "fj_igemm_prep");
  const codegen::KernelLaunch* apply = FindKernel(plan, "fj_gn_apply");
  EXPECT_TRUE(gemm && prep && apply);
  if (!gemm || !prep || !apply) return "";
  std::string s = src.main.substr(0, wrappers);
  s += "using Sh = fj::IgemmShape<Cfg, IgemmTune>;\n";
  s += "static_assert(fj::IgemmWgmmaShape<Cfg, IgemmTune>::kSmemBytes == " +
       std::to_string(gemm->shared_bytes) + ", \"shared bytes\");\n";
  s += "static_assert(Sh::kTiles == " + std::to_string(gemm->grid[0]) + ", \"tiles\");\n";
  s += "static_assert(Sh::kThreads == " + std::to_string(gemm->block[0]) + ", \"threads\");\n";
  s += "static_assert(Cfg::kC / Sh::kBN == " + std::to_string(gemm->grid[1]) + ", \"ctiles\");\n";
  s += "static_assert(Cfg::kN * Sh::kPrepXBlocksPerSample + Sh::kPrepWBlocks == " +
       std::to_string(prep->grid[0]) + ", \"prep grid\");\n";
  s += "static_assert(fj::GnApply<Cfg>::kBlocksPerRow == " + std::to_string(apply->grid[0]) +
       " && fj::GnApply<Cfg>::kThreads == " + std::to_string(apply->block[0]) +
       ", \"apply grid\");\n";
  s += "static_assert(fj::IgemmWgmmaLoop<Cfg, IgemmTune>::kAhead >= 1, \"\");\n";
  s += "static_assert(fj::HaloShape<Cfg, IgemmTune>::kTapsHW > 0, \"\");\n";
  return s;
}

Dims3 RandomDims(Rng& rng, int64_t lo, int64_t hi) {
  if (rng.Chance(0.6)) {
    const int64_t v = rng.Int(lo, hi);
    return {v, v, v};
  }
  return {rng.Int(lo, hi), rng.Int(lo, hi), rng.Int(lo, hi)};
}

TEST(Igemm, HostGeometryMatchesTheTemplates) {
  std::vector<Chain> chains = {
      W3(),
      Parse("x:f32[2,32,7,11,11] | conv3d(out=128,k=3,padding=1,dilation=2) | relu | "
            "group_norm(groups=4) | hardswish"),
      Parse("x:f32[3,64,5,9,9] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1],bias=false) | "
            "group_norm(groups=2)"),
      Parse("x:f32[3,96,5,9,9] | conv3d(out=128,k=1) | sigmoid | group_norm(groups=128)"),
      // The largest Cin; rows so long that only one warpgroup with 3 stages fits.
      Parse("x:f32[1,352,4,4,100] | conv3d(out=384,k=[8,3,5],padding=[4,1,2]) | "
            "group_norm(groups=3)"),
  };
  // Random chains over a wide range of sizes, including rows so long that only small tunings
  // fit in shared memory, or none.
  Rng rng(77);
  int accepted = 0;
  for (int tries = 0; tries < 20000 && accepted < 12; ++tries) {
    Chain chain;
    chain.input = {rng.Int(1, 4), 32 * rng.Int(1, 11), rng.Int(1, 9), rng.Int(1, 40),
                   rng.Chance(0.3) ? rng.Int(100, 700) : rng.Int(4, 40)};
    const int64_t out = 128 * rng.Int(1, 3);
    const Dims3 k = RandomDims(rng, 1, 5), padding = RandomDims(rng, 0, 3);
    const Dims3 dilation = RandomDims(rng, 1, 3);
    if (rng.Chance(0.5)) {
      chain.ops.push_back(ConvTranspose3d(out, k, {1, 1, 1}, padding, {0, 0, 0}, dilation));
    } else {
      chain.ops.push_back(Conv3d(out, k, {1, 1, 1}, padding, dilation, rng.Chance(0.5)));
    }
    chain.ops.push_back(GroupNorm(out / (int64_t{1} << rng.Int(0, 7))));
    if (!ValidateChain(chain).ok() || !Igemm().Applies(chain, Target("sm_90"))) continue;
    chains.push_back(chain);
    ++accepted;
  }
  EXPECT_EQ(accepted, 12);
  for (const Chain& chain : chains) {
    for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
      SCOPED_TRACE(FormatChain(chain) + (precision == Precision::kTf32 ? " tf32" : ""));
      absl::StatusOr<codegen::Plan> plan =
          codegen::MakePlan(chain, Target("sm_90", precision), kIgemm);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const codegen::KernelLaunch* gemm = FindKernel(*plan, "fj_igemm_wgmma");
      ASSERT_NE(gemm, nullptr);
      EXPECT_LE(gemm->shared_bytes, 227u * 1024);
      jit::NvrtcRequest req;
      req.name = "igemm_shape_probe.cu";
      req.source = ShapeProbe(chain, *plan);
      req.arch = "sm_90a";
      req.options = codegen::SourceNvrtcOptions();
      for (const templates::TemplateFile& t : templates::All()) {
        req.headers.emplace_back(std::string(t.name), std::string(t.text));
      }
      absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
      EXPECT_TRUE(out.ok()) << out.status() << "\n" << codegen::ExplainPlan(*plan);
    }
  }
}

}  // namespace
}  // namespace fusejit
