// The tensor-core strategies igemm-store-normalize and igemm-moments-mean
// (codegen/igemm_strategy.cc), CPU only: which chains and targets they apply to, the plans they
// make (W3 in both precisions, mean chains in both mean modes), their tuning (wave-aware default,
// Validate's reasons, every valid candidate of a small space compiles), and that the plans compile
// for sm_90a (NVRTC needs no GPU). Their GPU checks are in tests/gpu/gpu_igemm_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <regex>
#include <tuple>

#include "absl/strings/match.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "jit/nvrtc.h"
#include "templates/embedded.h"
#include "templates/geometry.cuh"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

constexpr char kIgemm[] = "igemm-store-normalize";
constexpr char kMoments[] = "igemm-moments-mean";
// Sweep shape W4-f (bench/compare_pytorch.py): K = 864, both mean dims.
constexpr char kW4f[] =
    "x:f32[16,32,16,16,16] | conv3d(out=256,k=3,stride=1) | group_norm(groups=32) | "
    "mean(dims=[1,2,3,4])";
// Sweep shape W3-c: 2 samples, 256 channels.
constexpr char kW3c[] =
    "x:f32[2,128,16,16,16] | conv_transpose3d(out=256,k=3,bias=false) | relu | "
    "group_norm(groups=16)";

Chain Parse(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << spec << ": " << chain.status();
  return chain.ok() ? *chain : Chain{};
}

const codegen::Strategy& ByName(const char* name) {
  for (const auto& s : codegen::AllStrategies()) {
    if (s->name() == name) return *s;
  }
  ADD_FAILURE() << name << " is not registered";
  std::abort();
}
const codegen::Strategy& Igemm() { return ByName(kIgemm); }
const codegen::Strategy& Moments() { return ByName(kMoments); }

codegen::PlanTarget Target(const char* arch, Precision precision = Precision::kFp32) {
  return {arch, 132, precision};
}

const codegen::KernelLaunch* FindKernel(const codegen::Plan& plan, const std::string& symbol) {
  for (const codegen::KernelLaunch& k : plan.kernels) {
    if (k.symbol == symbol) return &k;
  }
  return nullptr;
}

// The GEMM kernel (with a split: the one writing the parts) and the kernel running the epilogue
// (the GEMM itself, or with a split the one adding the parts).
const codegen::KernelLaunch* GemmKernel(const codegen::Plan& plan) {
  for (const char* s : {"fj_igemm_wgmma_split", "fj_igemm_wgmma", "fj_igemm_wgmma_moments"}) {
    if (const codegen::KernelLaunch* k = FindKernel(plan, s)) return k;
  }
  return nullptr;
}
const codegen::KernelLaunch* EpilogueKernel(const codegen::Plan& plan) {
  for (const char* s :
       {"fj_igemm_reduce", "fj_igemm_reduce_moments", "fj_igemm_wgmma", "fj_igemm_wgmma_moments"}) {
    if (const codegen::KernelLaunch* k = FindKernel(plan, s)) return k;
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

// Compiles the plan's source for its architecture with ptxas's report: "" when it uses wgmma, no
// kernel spills, ptxas neither fenced nor serialized a wgmma, and it reported at least
// `min_reports` spill lines (stores and loads of each kernel), else what is wrong.
std::string WgmmaWithoutSpills(const Chain& chain, const codegen::Plan& plan, int min_reports) {
  const codegen::GeneratedSource src = codegen::EmitSource(chain, plan);
  jit::NvrtcRequest req;
  req.name = src.name;
  req.source = src.main;
  req.headers = src.headers;
  req.arch = plan.arch_override;
  req.options = src.nvrtc_options;
  req.options.push_back("--ptxas-options=-v");
  req.want_ptx = true;
  absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
  const std::string name = FormatChain(chain);
  if (!out.ok()) return name + ": " + out.status().ToString();
  std::string errors;
  if (out->ptx.find("wgmma.mma_async") == std::string::npos) errors += name + ": no wgmma\n";
  // ptxas serializes or fences wgmma it cannot prove safe (C7519: warpgroup.arrive injected;
  // C7510: wgmma serialized): either costs the main loop.
  for (const char* code : {"C7519", "C7510"}) {
    if (out->log.find(code) != std::string::npos) errors += name + ": " + code + "\n" + out->log;
  }
  const std::regex spill(R"(([0-9]+) bytes spill (stores|loads))");
  int reports = 0;
  for (auto it = std::sregex_iterator(out->log.begin(), out->log.end(), spill);
       it != std::sregex_iterator(); ++it) {
    ++reports;
    if ((*it)[1].str() != "0") errors += name + ": spills\n" + out->log;
  }
  if (reports < min_reports) errors += name + ": too few ptxas reports\n" + out->log;
  return errors;
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
    // Launch order: absmax -> prep -> GEMM -> finalize -> apply (both scale their fp16 values).
    EXPECT_EQ(Symbols(*plan),
              (std::vector<std::string>{"fj_igemm_absmax", "fj_igemm_prep", "fj_igemm_wgmma",
                                        "fj_gn_finalize", "fj_gn_apply"}));
    // The measured tunings: F16x3 192-row tiles, 7 stages, flush every 2; the TF32 class (one
    // fp16 product of scaled values) 256 rows, 5 stages.
    EXPECT_EQ(TuneValue(*plan, "kPrec"), tf32 ? "4" : "1");
    EXPECT_EQ(TuneValue(*plan, "kWG"), tf32 ? "4" : "3");
    EXPECT_EQ(TuneValue(*plan, "kStages"), tf32 ? "5" : "7");
    EXPECT_EQ(TuneValue(*plan, "kFlushSteps"), tf32 ? "0" : "2");
    EXPECT_EQ(TuneValue(*plan, "kAsync"), "1");
    EXPECT_EQ(plan->tune_config,
              tf32 ? "igemm-store-normalize:wg=4,stages=5,async=1,bn=128,split=1"
                   : "igemm-store-normalize:wg=3,stages=7,async=1,bn=128,split=1");
    const codegen::KernelLaunch* gemm = FindKernel(*plan, "fj_igemm_wgmma");
    ASSERT_NE(gemm, nullptr);
    const unsigned rows = tf32 ? 256 : 192, tiles = (34 * 34 * 34 + rows - 1) / rows;
    EXPECT_EQ(gemm->grid, (std::array<unsigned, 3>{tiles, 1, 16}));
    EXPECT_EQ(gemm->block[0], rows * 2);  // a warpgroup of 128 threads per 64 rows
    EXPECT_EQ(gemm->min_blocks_per_sm, 1u);
    EXPECT_EQ(gemm->shared_bytes, tf32 ? 217088u : 229376u);
    EXPECT_LE(gemm->shared_bytes, 227u * 1024);
    EXPECT_EQ(FindKernel(*plan, "fj_gn_finalize")->body,
              "fj::gn_finalize_body<Cfg, " + std::to_string(tiles) + ", 128>");
    EXPECT_EQ(FindKernel(*plan, "fj_gn_apply")->grid, (std::array<unsigned, 3>{20, 16 * 128, 1}));
    // Workspace: the operand copies (x channels-last: as large as x, half of it as fp16 values)
    // plus small regions.
    const size_t x_bytes = 16ull * 64 * 32 * 32 * 32 * (tf32 ? 2 : 4),
                 w_bytes = 64ull * 128 * 27 * (tf32 ? 2 : 4);
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
  // f32 in both precisions; bf16 and f16 (one 16-bit product, kPrecBF16x1 / kPrecF16x1).
  std::vector<std::pair<Chain, Precision>> cases = {{W3(), Precision::kFp32},
                                                    {W3(), Precision::kTf32}};
  for (DType d : {DType::kBF16, DType::kF16}) {
    Chain c = W3();
    c.dtype = d;
    cases.emplace_back(c, Precision::kFp32);
  }
  for (const auto& [chain, precision] : cases) {
    SCOPED_TRACE(FormatChain(chain));
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90", precision));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, "igemm-store-normalize");
    // Stores and loads of each of the 4-5 kernels.
    EXPECT_EQ(WgmmaWithoutSpills(chain, *plan, /*min_reports=*/8), "");
  }
}

// With one 16-bit product per term, the last channel block runs only its k-slices that hold
// channels (16 each); F16x3 and TF32 run whole blocks (skipping measured slower for F16x3).
TEST(Igemm, OneProductPrecisionsSkipTheLastBlocksPaddingSlices) {
  namespace g = fj::geom;
  auto geom = [](long long cin, int prec) {
    return g::IgemmOf(16, 16, 16, 16, 16, 16, cin, 64, 3, 3, 3, 1, 1, 1, 1, 128, 64, 3, prec);
  };
  struct Case {
    long long cin;
    int prec;
    long long cb, slices, last_slices, cin_live;
  };
  for (const Case& c :
       std::vector<Case>{{32, g::kPrecBF16x1, 1, 4, 2, 32},       // half of the one block
                         {200, g::kPrecF16x1, 4, 4, 1, 208},      // 8 channels in the last block
                         {96, g::kPrecF16x1Scaled, 2, 4, 2, 96},  // TF32 class on fp16
                         {64, g::kPrecBF16x1, 1, 4, 4, 64},       // whole
                         {48, g::kPrecF16x3, 2, 2, 2, 64},        // whole blocks
                         {40, g::kPrecTF32x1, 2, 4, 4, 64}}) {    // whole blocks
    SCOPED_TRACE(testing::Message() << "cin " << c.cin << " prec " << c.prec);
    const g::Igemm ig = geom(c.cin, c.prec);
    EXPECT_EQ(ig.cb, c.cb);
    EXPECT_EQ(ig.slices, c.slices);
    EXPECT_EQ(ig.last_slices, c.last_slices);
    EXPECT_EQ(ig.cin_live, c.cin_live);
  }
  // The bf16 chain with 32 input channels: its kernel runs the two-slice k-steps as a second
  // instantiation, not as branches inside the wgmma sequence (ptxas then injects warpgroup
  // fences, C7519), and nothing spills.
  Chain s1 = Parse(
      "x:bf16[16,32,32,32,32] | conv3d(out=64,k=3,padding=1) | relu | "
      "group_norm(groups=8)");
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(s1, Target("sm_90"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, kIgemm);
  // `explain` says so.
  EXPECT_NE(plan->description.find("the last block's k-steps run 2 of its 4 slices of 16 "
                                   "channels, the rest being padding: 32 of 64 channels"),
            std::string::npos)
      << plan->description;
  EXPECT_EQ(WgmmaWithoutSpills(s1, *plan, /*min_reports=*/8), "");
}

// The domain and the precision the slices allow: a 16-bit chain with 40 input channels (48 of
// 64 run) takes the GEMM; an f32 chain's TF32 mode takes the fp16 rate with half-padded blocks
// only where x is large enough to pay for the absmax pass (H200, 2026-11-29).
TEST(Igemm, SliceSkippingWidensTheOneProductDomain) {
  const std::string t9 = "[8,40,12,12,12] | conv_transpose3d(out=40,k=1) | gelu";
  for (const char* dt : {"x:bf16", "x:f16"}) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(Parse(dt + t9), Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, "igemm-store") << dt;
  }
  absl::StatusOr<codegen::Plan> tf32 =
      codegen::MakePlan(Parse("x:f32" + t9), Target("sm_90", Precision::kTf32));
  ASSERT_TRUE(tf32.ok()) << tf32.status();
  EXPECT_NE(tf32->strategy, "igemm-store");
  const std::string s1 = " conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)";
  for (const auto& [spec, prec] : std::vector<std::pair<std::string, std::string>>{
           {"x:f32[16,32,32,32,32] |" + s1, "4"},    // 16M values: fp16 rate
           {"x:f32[1,32,32,32,32] |" + s1, "0"},     // 1M values: TF32 itself
           {"x:f32[1,64,32,32,32] |" + s1, "4"}}) {  // whole blocks: fp16 rate at any size
    absl::StatusOr<codegen::Plan> plan =
        codegen::MakePlan(Parse(spec), Target("sm_90", Precision::kTf32));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kIgemm) << spec;
    EXPECT_EQ(TuneValue(*plan, "kPrec"), prec) << spec;
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
  EXPECT_TRUE(s.Applies(codegen::PlanInput(W3(), Target("sm_90"))));
  EXPECT_TRUE(s.Applies(codegen::PlanInput(W3(), Target("sm_90a"))));
  EXPECT_TRUE(s.Applies(codegen::PlanInput(W3(), Target("sm_90", Precision::kTf32))));
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_100", "sm_120"}) {
    EXPECT_FALSE(s.Applies(codegen::PlanInput(W3(), Target(arch)))) << arch;
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target(arch));
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Elsewhere W3 gets the portable tensor-core engine (mma.sync, sm_80 and later).
    EXPECT_EQ(plan->strategy, "tc-conv") << arch;
    EXPECT_EQ(plan->arch_override, "") << arch;
  }
  absl::StatusOr<codegen::Plan> older = codegen::MakePlan(W3(), Target("sm_75"));
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->strategy, "store-normalize");
  // TF32 on sm_80: the engine's one-product TF32 plan.
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(W3(), Target("sm_80", Precision::kTf32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, "tc-conv");
  EXPECT_NE(plan->description.find("TF32 (asked for)"), std::string::npos);
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
  ASSERT_TRUE(s.Applies(codegen::PlanInput(Parse(base), Target("sm_90"))));
  // 32-63 channels on one 64-channel tile (groups inside it).
  ASSERT_TRUE(s.Applies(codegen::PlanInput(
      Parse("x:f32[2,64,10,10,10] | conv3d(out=48,k=3,padding=1) | relu | group_norm(groups=6)"),
      Target("sm_90"))));
  ASSERT_TRUE(s.Applies(codegen::PlanInput(
      Parse("x:f32[2,64,10,10,10] | conv_transpose3d(out=256,k=3,padding=1,"
            "dilation=2,output_padding=1,bias=false) | swish | group_norm(groups=4) | gelu"),
      Target("sm_90"))));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"stride 2, 3x3 taps: under 4 taps per halo point",
       "x:f32[8,32,32,32,32] | conv3d(out=64,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=8)"},
      {"stride 2 with an output plane < 64 points",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,stride=2,padding=1) | relu | "
       "group_norm(groups=8)"},
      {"transposed stride 2",
       "x:f32[2,64,10,10,10] | conv_transpose3d(out=128,k=3,stride=2) | relu | "
       "group_norm(groups=8)"},
      {"Cin 16 and Cout 96: padding both to whole blocks and tiles more than doubles the products",
       "x:f32[2,16,10,10,10] | conv3d(out=96,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"Cin too large for the prep tile",
       "x:f32[1,384,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"},
      {"Cout 24: padding to a 64-channel tile more than doubles the products",
       "x:f32[2,64,10,10,10] | conv3d(out=24,k=3,padding=1) | relu | group_norm(groups=6)"},
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
    EXPECT_FALSE(s.Applies(codegen::PlanInput(chain, Target("sm_90")))) << why << ": " << spec;
    EXPECT_FALSE(s.Applies(codegen::PlanInput(chain, Target("sm_90", Precision::kTf32))))
        << why << ": " << spec;
    // The planner still finds a plan.
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << why << ": " << plan.status();
    EXPECT_NE(plan->strategy, kIgemm) << why;
  }
}

// group_norm groups need not lie inside a channel tile: each tile writes one moments part per
// group it holds, and the finalize merges a group's parts (geom::IgemmGroupParts).
TEST(Igemm, GroupsAcrossChannelTiles) {
  const codegen::Strategy& s = Igemm();
  struct Case {
    std::string spec;
    std::string bn;
    int64_t parts;  // the most parts of any group
  };
  const std::vector<Case> cases = {
      // 12 channels a group on 64-channel tiles: groups 5 and 10 cross tile boundaries.
      {"x:f32[2,64,10,10,10] | conv3d(out=192,k=3,padding=1) | relu | group_norm(groups=16)", "64",
       2},
      // One group of 48 channels on a 64-channel tile.
      {"x:f32[2,64,10,10,10] | conv3d(out=48,k=3,padding=1) | relu | group_norm(groups=1)", "64",
       1},
      // 192 channels a group: 128-channel tiles, each group over two of them.
      {"x:f32[2,64,10,10,10] | conv3d(out=384,k=3,padding=1) | relu | group_norm(groups=2)", "128",
       2},
      // All 384 channels in one group: three tiles.
      {"x:f32[2,64,10,10,10] | conv_transpose3d(out=384,k=3,padding=1) | group_norm(groups=1)",
       "128", 3},
      // 200 channels in 8 groups of 25 (padded to two 128-channel tiles).
      {"x:f32[4,200,8,8,8] | conv3d(out=200,k=3,padding=1) | group_norm(groups=8)", "128", 2},
  };
  for (const Case& c : cases) {
    const Chain chain = Parse(c.spec);
    ASSERT_TRUE(s.Applies(codegen::PlanInput(chain, Target("sm_90")))) << c.spec;
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"), kIgemm);
    ASSERT_TRUE(plan.ok()) << c.spec << ": " << plan.status();
    EXPECT_EQ(TuneValue(*plan, "kBN"), c.bn) << c.spec;
    const codegen::KernelLaunch* fin = FindKernel(*plan, "fj_gn_finalize");
    ASSERT_NE(fin, nullptr) << c.spec;
    EXPECT_EQ(fin->body, absl::StrCat("fj::gn_finalize_body<Cfg, ", GemmKernel(*plan)->grid[0],
                                      ", ", c.bn, ">"))
        << c.spec;
    EXPECT_EQ(fj::geom::IgemmGroupParts(chain.ops[0].conv.out_channels, chain.ops.back().groups,
                                        std::stoi(c.bn)),
              c.parts)
        << c.spec;
    // The partials workspace names the parts where there are several.
    bool named = false;
    for (const codegen::WorkspaceRegion& w : plan->workspace) {
      named |= w.name.find(absl::StrCat("*", c.parts, " (a group's parts")) != std::string::npos;
    }
    EXPECT_EQ(named, c.parts > 1) << c.spec;
  }
  // The moments-mean variant reads per-channel moments: any grouping.
  EXPECT_TRUE(Moments().Applies(codegen::PlanInput(
      Parse("x:f32[4,64,16,16,16] | conv3d(out=96,k=3,padding=1) | group_norm(groups=2) | "
            "mean(dims=[2,3,4])"),
      Target("sm_90"))));
}

// conv3d with a stride: the halo holds the input rows the tile's strided points read (wider by
// the stride). Only where each halo point serves at least 4 taps, and fp32-accurate (measured:
// ChainSupported); conv_transpose3d with a stride does not apply (tc-conv's output phases).
TEST(Igemm, StridedConv3dApplies) {
  const Chain k4 = Parse(
      "x:f32[8,32,32,32,32] | conv3d(out=64,k=4,stride=2,padding=1) | swish | "
      "group_norm(groups=8)");
  ASSERT_TRUE(Igemm().Applies(codegen::PlanInput(k4, Target("sm_90"))));
  EXPECT_FALSE(Igemm().Applies(codegen::PlanInput(k4, Target("sm_90", Precision::kTf32))));
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(k4, Target("sm_90"), kIgemm);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 16x16x16 output points in tiles of 64 rows per warpgroup.
  EXPECT_EQ(EpilogueKernel(*plan)->grid[0], 4096u / (64 * std::stoul(TuneValue(*plan, "kWG"))));
  const codegen::Strategy& store = ByName("igemm-store");
  EXPECT_TRUE(store.Applies(codegen::PlanInput(
      Parse("x:f32[8,64,16,16,16] | conv3d(out=64,k=4,stride=2,padding=1) | relu"),
      Target("sm_90"))));
  // 3x3 taps over a 2x2 stride: 2.25 taps per halo point.
  EXPECT_FALSE(store.Applies(codegen::PlanInput(
      Parse("x:f32[8,64,16,16,16] | conv3d(out=64,k=3,stride=2,padding=1) | relu"),
      Target("sm_90"))));
  EXPECT_FALSE(store.Applies(codegen::PlanInput(
      Parse("x:f32[8,64,16,16,16] | conv_transpose3d(out=64,k=4,stride=2,padding=1) | relu"),
      Target("sm_90"))));
}

// Small shapes fall back to smaller tiles and fewer stages instead of not applying.
TEST(Igemm, SmallShapesGetSmallerTunings) {
  // One warpgroup: an output plane of 81 points holds one 64-row tile but not two. (Grids this
  // small go to tc-conv unless igemm is asked for: the fill charge of Cost.)
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(
      Parse("x:f32[1,32,7,9,9] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8)"),
      Target("sm_90"), kIgemm);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, kIgemm);
  EXPECT_EQ(TuneValue(*plan, "kWG"), "1");
  // A 1x1x1 kernel: one tap per halo, so two B stages and no wgmma kept in flight.
  plan = codegen::MakePlan(
      Parse("x:f32[2,64,12,12,12] | conv3d(out=128,k=1) | relu | group_norm(groups=8)"),
      Target("sm_90"), kIgemm);
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
  const bool moments = plan.strategy == kMoments;
  const codegen::KernelLaunch* gemm = GemmKernel(plan);
  const codegen::KernelLaunch* epilogue = EpilogueKernel(plan);
  const codegen::KernelLaunch* prep = FindKernel(plan, "fj_igemm_prep");
  const codegen::KernelLaunch* apply = FindKernel(plan, "fj_gn_apply");
  const codegen::KernelLaunch* mean = FindKernel(plan, "fj_igemm_mean");
  EXPECT_TRUE(gemm && prep && (moments ? mean != nullptr : apply != nullptr));
  if (!gemm || !prep || !(moments ? mean != nullptr : apply != nullptr)) return "";
  std::string s = src.main.substr(0, wrappers);
  s += "using Tn = fj::IgemmPlanTune<IgemmFixed, IgemmTune>;\n";
  s += "using Sh = fj::IgemmShape<Cfg, Tn>;\n";
  s += "static_assert(fj::IgemmWgmmaShape<Cfg, Tn>::kSmemBytes == " +
       std::to_string(gemm->shared_bytes) + ", \"shared bytes\");\n";
  s += "static_assert(Sh::kTiles == " + std::to_string(gemm->grid[0]) + ", \"tiles\");\n";
  s += "static_assert(Sh::kThreads == " + std::to_string(gemm->block[0]) + ", \"threads\");\n";
  s += "static_assert(Sh::kCP / Sh::kBN == " + std::to_string(gemm->grid[1]) + ", \"ctiles\");\n";
  s += "static_assert(Cfg::kN * Sh::kSplit == " + std::to_string(gemm->grid[2]) + ", \"z\");\n";
  if (epilogue != gemm) {
    s += "static_assert(Sh::kEpiBytes == " + std::to_string(epilogue->shared_bytes) +
         " && Cfg::kN == " + std::to_string(epilogue->grid[2]) + ", \"reduce\");\n";
  }
  s += "static_assert(Cfg::kN * Sh::kPrepXBlocksPerSample + Sh::kPrepWBlocks == " +
       std::to_string(prep->grid[0]) + ", \"prep grid\");\n";
  if (moments) {
    s += "static_assert(fj::IgemmMean<Cfg, Tn>::kThreads == " + std::to_string(mean->block[0]) +
         ", \"mean block\");\n";
    for (const codegen::WorkspaceRegion& w : plan.workspace) {
      if (!absl::StartsWith(w.name, "per-tile channel moments")) continue;
      s += "static_assert(Sh::kChannelPartials * sizeof(fj::IgemmChannelMoments) == " +
           std::to_string(w.bytes) + ", \"channel partials\");\n";
    }
  } else {
    s += "static_assert(fj::GnApply<Cfg>::kBlocksPerRow == " + std::to_string(apply->grid[0]) +
         " && fj::GnApply<Cfg>::kThreads == " + std::to_string(apply->block[0]) +
         ", \"apply grid\");\n";
  }
  // The operand copies: their workspace entries are the template's sizes.
  for (const codegen::WorkspaceRegion& w : plan.workspace) {
    if (absl::StartsWith(w.name, "x channels-last")) {
      s += "static_assert(Sh::kXaBytes == " + std::to_string(w.bytes) + "ll, \"xa bytes\");\n";
    } else if (absl::StartsWith(w.name, "weights [tap]")) {
      s += "static_assert(Sh::kWbBytes == " + std::to_string(w.bytes) + "ll, \"wb bytes\");\n";
    } else if (absl::StartsWith(w.name, "the split's parts")) {
      s += "static_assert(Sh::kKPartFloats * 4 == " + std::to_string(w.bytes) + "ll, \"kpart\");\n";
    } else if (absl::StartsWith(w.name, "per-tile group moments")) {
      s += "static_assert(Sh::kPartialFloats * 4 == " + std::to_string(w.bytes) +
           "ll, \"partials\");\n";
    }
  }
  s += "static_assert(fj::IgemmWgmmaLoop<Cfg, Tn>::kAhead >= 1, \"\");\n";
  s += "static_assert(fj::HaloShape<Cfg, Tn>::kTapsHW > 0, \"\");\n";
  return s;
}

bool AnalyzeMean(const Chain& chain) { return chain.ops.back().kind == OpKind::kMean; }

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
      // igemm-moments-mean: both mean modes, 1024 channels (the finalize's limit).
      Parse(kW4f),
      Parse("x:f32[3,64,5,9,9] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1],bias=false) | "
            "gelu | group_norm(groups=2) | mean(dims=[2,3,4])"),
      Parse("x:f32[1,32,4,8,8] | conv3d(out=1024,k=3,padding=1) | group_norm(groups=64) | "
            "mean(dims=[2,3,4])"),
      // conv3d with strides (fp32-accurate only): 2, (1,1,2), 2 with a [1,4,4] kernel and a mean.
      Parse("x:f32[2,32,16,20,20] | conv3d(out=64,k=4,stride=2,padding=1) | relu | "
            "group_norm(groups=8)"),
      Parse("x:f32[1,64,8,20,30] | conv3d(out=128,k=[3,3,5],stride=[1,1,2],padding=[1,1,2]) | "
            "gelu | group_norm(groups=4)"),
      Parse("x:f32[2,32,9,30,30] | conv3d(out=96,k=[1,4,4],stride=2) | group_norm(groups=3) | "
            "mean(dims=[2,3,4])"),
      // 64-channel tiles (the default for 64 and 129-192 channels).
      Parse("x:f32[2,32,8,12,12] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)"),
      Parse("x:f32[2,64,6,10,10] | conv_transpose3d(out=192,k=3) | group_norm(groups=12) | "
            "mean(dims=[2,3,4])"),
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
    if (rng.Chance(0.35)) {
      chain.ops.push_back(Mean(rng.Chance(0.5) ? std::vector<int>{2, 3, 4}
                                               : std::vector<int>{1, 2, 3, 4}));
    }
    if (!ValidateChain(chain).ok() ||
        !(Igemm().Applies(codegen::PlanInput(chain, Target("sm_90"))) ||
          Moments().Applies(codegen::PlanInput(chain, Target("sm_90"))))) {
      continue;
    }
    chains.push_back(chain);
    ++accepted;
  }
  EXPECT_EQ(accepted, 12);
  // bf16 and f16 chains pack 64 channels per operand block (32 for f32): 32, 64 and 96 inputs.
  for (int i = 0; i < 4; ++i) {
    Chain low = chains[i];  // (i < 4: the chains above, before the random ones)
    low.dtype = i % 2 == 0 ? DType::kBF16 : DType::kF16;
    chains.push_back(low);
  }
  for (const Chain& chain : chains) {
    for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
      SCOPED_TRACE(FormatChain(chain) + (precision == Precision::kTf32 ? " tf32" : ""));
      // Strided conv3d chains: fp32-accurate only (ChainSupported).
      if (precision == Precision::kTf32 && chain.ops[0].conv.stride != Dims3{1, 1, 1}) continue;
      const bool mean = AnalyzeMean(chain);
      absl::StatusOr<codegen::Plan> plan =
          codegen::MakePlan(chain, Target("sm_90", precision), mean ? kMoments : kIgemm);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const codegen::KernelLaunch* gemm = GemmKernel(*plan);
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

// ---- igemm-moments-mean ------------------------------------------------------------------

TEST(IgemmMoments, MeanChainsPlanToItInBothModesAndPrecisions) {
  const std::vector<std::string> specs = {
      kW4f,
      "x:f32[8,64,12,12,12] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8) | "
      "mean(dims=[2,3,4])",
      "x:f32[6,32,9,12,12] | conv_transpose3d(out=256,k=3,padding=1,bias=false) | swish | "
      "hardswish | group_norm(groups=64) | mean(dims=[1,2,3,4])",
  };
  for (const std::string& spec : specs) {
    const Chain chain = Parse(spec);
    for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
      const bool tf32 = precision == Precision::kTf32;
      SCOPED_TRACE(spec + (tf32 ? " tf32" : ""));
      absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90", precision));
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->strategy, kMoments);
      EXPECT_EQ(plan->arch_override, "sm_90a");
      std::vector<std::string> want = {"fj_igemm_prep", "fj_igemm_wgmma_moments", "fj_igemm_mean"};
      // TF32 of 32 input channels: one TF32 product (fp16 values in 64-channel blocks would
      // double the products); else the scaled fp16 values.
      const bool tf32x1 = tf32 && chain.input[1] % 64 != 0 && chain.input[1] < 96;
      if (!tf32x1) want.insert(want.begin(), "fj_igemm_absmax");
      EXPECT_EQ(Symbols(*plan), want);
      EXPECT_EQ(TuneValue(*plan, "kOut"), "1");
      EXPECT_EQ(TuneValue(*plan, "kPrec"), !tf32 ? "1" : tf32x1 ? "0" : "4");
      const codegen::KernelLaunch* gemm = FindKernel(*plan, "fj_igemm_wgmma_moments");
      const codegen::KernelLaunch* mean = FindKernel(*plan, "fj_igemm_mean");
      ASSERT_TRUE(gemm && mean);
      const int64_t n = chain.input[0], c = chain.ops[0].conv.out_channels;
      EXPECT_EQ(gemm->grid[1], static_cast<unsigned>(c / 128));
      EXPECT_EQ(gemm->grid[2], static_cast<unsigned>(n));
      EXPECT_EQ(mean->grid, (std::array<unsigned, 3>{static_cast<unsigned>(n), 1, 1}));
      // Nothing full-size: the operand copies (x channels-last, weights) and the partials, two
      // doubles per (sample, tile of 64-256 points, channel): under a float per 4 points.
      const size_t operands =
          static_cast<size_t>(NumElements(chain.input) + NumElements(ChainParams(chain)[0].shape)) *
          4;
      const Shape p = ShapeAfter(chain, 0);
      EXPECT_EQ(plan->workspace.back().bytes, static_cast<size_t>(n * gemm->grid[0] * c) * 16);
      EXPECT_LT(plan->workspace_bytes, operands + static_cast<size_t>(NumElements(p)))
          << codegen::ExplainPlan(*plan);
      EXPECT_NE(codegen::ExplainPlan(*plan).find("nothing full-size"), std::string::npos);
    }
  }
}

TEST(IgemmMoments, DoesNotApplyToChainsBreakingAConstraint) {
  const codegen::Strategy& s = Moments();
  const std::string base =
      "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=8) | "
      "mean(dims=[2,3,4])";
  ASSERT_TRUE(s.Applies(codegen::PlanInput(Parse(base), Target("sm_90"))));
  EXPECT_FALSE(s.Applies(codegen::PlanInput(Parse(base), Target("sm_80"))));
  EXPECT_FALSE(Igemm().Applies(codegen::PlanInput(Parse(base), Target("sm_90"))));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"an op after group_norm",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | group_norm(groups=8) | relu | "
       "mean(dims=[2,3,4])"},
      {"no mean", "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | group_norm(groups=8)"},
      {"no group_norm",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,padding=1) | relu | "
       "mean(dims=[2,3,4])"},
      {"more than 1024 channels",
       "x:f32[1,32,6,6,6] | conv3d(out=1152,k=3,padding=1) | group_norm(groups=9) | "
       "mean(dims=[2,3,4])"},
      {"stride 2",
       "x:f32[2,64,10,10,10] | conv3d(out=128,k=3,stride=2,padding=1) | "
       "group_norm(groups=8) | mean(dims=[2,3,4])"},
      {"Cout 24: padding more than doubles the products",
       "x:f32[2,64,10,10,10] | conv3d(out=24,k=3,padding=1) | group_norm(groups=6) | "
       "mean(dims=[2,3,4])"},
      {"output plane < 64 points",
       "x:f32[2,64,9,7,9] | conv3d(out=128,k=3,padding=1) | "
       "group_norm(groups=8) | mean(dims=[1,2,3,4])"},
  };
  for (const auto& [why, spec] : cases) {
    const Chain chain = Parse(spec);
    if (chain.ops.empty()) continue;
    EXPECT_FALSE(s.Applies(codegen::PlanInput(chain, Target("sm_90")))) << why << ": " << spec;
    EXPECT_FALSE(s.Applies(codegen::PlanInput(chain, Target("sm_90", Precision::kTf32))))
        << why << ": " << spec;
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << why << ": " << plan.status();
    EXPECT_NE(plan->strategy, kMoments) << why;
  }
}

// The generated sources compiled for sm_90a: wgmma emitted, nothing spilled, both mean modes.
TEST(IgemmMoments, PlansCompileForSm90aWithoutSpills) {
  const std::vector<std::pair<std::string, Precision>> jobs = {
      {kW4f, Precision::kFp32},
      {kW4f, Precision::kTf32},
      {"x:f32[3,64,5,9,9] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1],bias=false) | "
       "gelu | group_norm(groups=2) | mean(dims=[2,3,4])",
       Precision::kFp32},
  };
  std::vector<std::future<std::string>> results;
  for (const auto& job : jobs) {
    // Not a structured binding: the lambda captures them (clang 14 cannot capture bindings).
    const auto spec = job.first;
    const Precision precision = job.second;
    results.push_back(std::async(std::launch::async, [spec, precision] {
      const Chain chain = Parse(spec);
      absl::StatusOr<codegen::Plan> plan =
          codegen::MakePlan(chain, Target("sm_90", precision), kMoments);
      if (!plan.ok()) return plan.status().ToString();
      return WgmmaWithoutSpills(chain, *plan, /*min_reports=*/6);
    }));
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

// ---- igemm-store (no group_norm, no mean) --------------------------------------------------

constexpr char kStore[] = "igemm-store";
// W3's producer with its relu (the chain its backward recomputes), and plain convolutions.
const char* const kStoreChains[] = {
    "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu",
    "x:f32[2,32,7,11,11] | conv3d(out=256,k=3,padding=1,dilation=2) | gelu | tanh",
    "x:f32[3,96,5,9,9] | conv3d(out=128,k=1)",
    // Output channels padded to whole 128-channel tiles: 64, 100, 200 (the last tile partial).
    "x:f32[16,64,32,32,32] | conv3d(out=64,k=3,padding=1) | swish",
    "x:f32[1,64,6,9,9] | conv_transpose3d(out=100,k=3,padding=1) | tanh",
    "x:f32[2,128,6,9,9] | conv3d(out=200,k=3,padding=1)",
};

TEST(IgemmStore, ChainsWithoutGroupNormPlanToItAndCompileWithoutSpills) {
  std::vector<std::future<std::string>> results;
  for (const char* spec : kStoreChains) {
    for (Precision precision : {Precision::kFp32, Precision::kTf32}) {
      results.push_back(std::async(std::launch::async, [spec, precision] {
        const Chain chain = Parse(spec);
        absl::StatusOr<codegen::Plan> plan =
            codegen::MakePlan(chain, Target("sm_90", precision), kStore);
        if (!plan.ok()) return plan.status().ToString();
        std::string errors;
        // The GEMM is the last kernel and writes y itself: nothing after it.
        if (&plan->kernels.back() != EpilogueKernel(*plan)) errors += "GEMM not last\n";
        return errors + WgmmaWithoutSpills(chain, *plan, /*min_reports=*/2);
      }));
    }
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

TEST(IgemmStore, AppliesOnlyWithoutGroupNormAndMean) {
  const codegen::Strategy& store = ByName(kStore);
  // The planner's choice for W3's producer (its backward's recompute) and a 64-channel conv.
  for (const char* spec : {kStoreChains[0], kStoreChains[3]}) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(Parse(spec), Target("sm_90"));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, kStore) << spec;
  }
  // A grid of 64 one-warpgroup CTAs: igemm-store with the reduction split, in both precisions.
  const Chain small = Parse("x:f32[4,256,8,8,8] | conv3d(out=256,k=3,padding=1) | gelu");
  EXPECT_EQ(codegen::MakePlan(small, Target("sm_90"))->strategy, kStore);
  EXPECT_EQ(codegen::MakePlan(small, Target("sm_90", Precision::kTf32))->strategy, kStore);
  EXPECT_FALSE(store.Applies(codegen::PlanInput(W3(), Target("sm_90"))));  // has group_norm
  EXPECT_FALSE(Igemm().Applies(codegen::PlanInput(Parse(kStoreChains[0]), Target("sm_90"))));
  EXPECT_TRUE(store.Applies(codegen::PlanInput(Parse(kStoreChains[0]), Target("sm_90"))));
  EXPECT_FALSE(store.Applies(codegen::PlanInput(Parse(kStoreChains[0]), Target("sm_80"))));
  // A mean needs a reduction the store does not do. 44 input channels are padded to two k-blocks
  // of 32 (1.45x the products); 40 would be 1.6x: not taken.
  EXPECT_FALSE(store.Applies(codegen::PlanInput(
      Parse("x:f32[2,32,10,10,10] | conv3d(out=128,k=3) | relu | mean(dims=[2,3,4])"),
      Target("sm_90"))));
  EXPECT_TRUE(store.Applies(codegen::PlanInput(
      Parse("x:f32[2,44,10,10,10] | conv3d(out=128,k=3) | relu"), Target("sm_90"))));
  EXPECT_FALSE(store.Applies(codegen::PlanInput(
      Parse("x:f32[2,40,10,10,10] | conv3d(out=128,k=3) | relu"), Target("sm_90"))));
  // In TF32 mode one 64-channel block of fp16 values holds the 44 (1.45x); 24 would take 2.7x.
  EXPECT_TRUE(
      store.Applies(codegen::PlanInput(Parse("x:f32[2,44,10,10,10] | conv3d(out=128,k=3) | relu"),
                                       Target("sm_90", Precision::kTf32))));
  EXPECT_FALSE(
      store.Applies(codegen::PlanInput(Parse("x:f32[2,24,10,10,10] | conv3d(out=128,k=3) | relu"),
                                       Target("sm_90", Precision::kTf32))));
  EXPECT_TRUE(store.Applies(codegen::PlanInput(
      Parse("x:f32[2,32,10,10,10] | conv3d(out=100,k=3) | relu"), Target("sm_90"))));
  // group_norm's plans pad the channels too (groups may cross tiles: GroupsAcrossChannelTiles).
  EXPECT_TRUE(Igemm().Applies(codegen::PlanInput(
      Parse("x:f32[2,32,10,10,10] | conv3d(out=64,k=3) | relu | group_norm(groups=8)"),
      Target("sm_90"))));
  EXPECT_TRUE(Igemm().Applies(codegen::PlanInput(
      Parse("x:f32[2,32,10,10,10] | conv3d(out=96,k=3) | relu | group_norm(groups=2)"),
      Target("sm_90"))));
  // bf16/f16 chains natively (the epilogue rounds y once into the dtype); f64 has no tensor cores.
  EXPECT_TRUE(store.HandlesDType(DType::kBF16));
  EXPECT_TRUE(store.HandlesDType(DType::kF16));
  EXPECT_TRUE(store.HandlesDType(DType::kF32));
  EXPECT_FALSE(store.HandlesDType(DType::kF64));
}

// bf16/f16 igemm-store plans: one 16-bit product, y (the chain's output, not a workspace)
// written by the GEMM itself, and the wgmma kernel compiles without spills.
TEST(IgemmStore, LowPrecisionChainsWriteTheirOutputDirectly) {
  std::vector<std::future<std::string>> results;
  for (const char* spec : {kStoreChains[3], kStoreChains[5]}) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      results.push_back(std::async(std::launch::async, [spec, dtype] {
        Chain chain = Parse(spec);
        chain.dtype = dtype;
        absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_90"), kStore);
        if (!plan.ok()) return plan.status().ToString();
        std::string errors;
        const codegen::KernelLaunch& gemm = plan->kernels.back();
        if (&gemm != EpilogueKernel(*plan)) errors += "GEMM not last\n";
        bool writes_y = false;
        for (const codegen::KernelArg& a : gemm.args) {
          writes_y |= a.kind == codegen::KernelArg::Kind::kOutput;
        }
        if (!writes_y) errors += "the GEMM does not write y\n";
        return errors + WgmmaWithoutSpills(chain, *plan, /*min_reports=*/1);
      }));
    }
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

// ---- tuning (both strategies) -------------------------------------------------------------

// The default is the tile height of least estimated time over waves of CTAs: W3 keeps its
// measured tunings (checked above); W3-c (2 samples) takes 192-row tiles, 124 CTAs in one wave
// on 132 SMs, rather than 128-row tiles in two waves (184 CTAs).
TEST(IgemmTuning, DefaultIsWaveAware) {
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(Parse(kW3c), Target("sm_90"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, kIgemm);
  EXPECT_EQ(plan->tune_config, "igemm-store-normalize:wg=3,stages=7,async=1,bn=128,split=1");
  EXPECT_EQ(FindKernel(*plan, "fj_igemm_wgmma")->grid, (std::array<unsigned, 3>{31, 2, 2}));
  plan = codegen::MakePlan(Parse(kW4f), Target("sm_90"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tune_config, "igemm-moments-mean:wg=3,stages=7,async=1,bn=128,split=1");
  // Fewer SMs, fewer waves to fill: the same chain on a 16-SM part keeps large tiles.
  absl::StatusOr<codegen::TuneConfig> small =
      codegen::DefaultTuneConfig(Parse(kW3c), {"sm_90", 16, Precision::kFp32});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->Get("wg"), 3);
}

TEST(IgemmTuning, ValidateRefusesWithTheReason) {
  struct Case {
    const Chain* chain;
    Precision precision;
    std::string config;
    std::string reason;
  };
  const Chain w4f = Parse(kW4f);
  const std::vector<Case> cases = {
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=7,async=1,bn=96",
       "bn 96 is not 128 or 64"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=5,stages=7,async=1,bn=128",
       "not in [1, 4]"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=0,stages=7,async=1,bn=128",
       "not in [1, 4]"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=4,stages=5,async=1,bn=128", "register"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=11,async=1,bn=128",
       "stages 11 must be in [2, 10]"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=1,async=0,bn=128",
       "must be in [2"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=2,async=1,bn=128",
       "async needs stages >= 3"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=7,async=2,bn=128", "0 or 1"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:wg=3,stages=8,async=1,bn=128",
       "shared memory"},
      {&W3(), Precision::kFp32, "igemm-store-normalize:stages=7,wg=3,async=1", "in that order"},
      {&W3(), Precision::kFp32, "igemm-moments-mean:wg=3,stages=7,async=1,bn=128",
       "does not apply"},
      {&w4f, Precision::kTf32, "igemm-moments-mean:wg=4,stages=5,async=1,bn=128",
       "more than two output planes"},
      {&w4f, Precision::kFp32, "igemm-store-normalize:wg=3,stages=7,async=1,bn=128",
       "does not apply"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<codegen::TuneConfig> config = codegen::TuneConfig::Parse(c.config);
    ASSERT_TRUE(config.ok()) << config.status();
    const absl::Status s =
        codegen::ValidateConfig(*c.chain, Target("sm_90", c.precision), *config);
    EXPECT_FALSE(s.ok()) << c.config;
    EXPECT_NE(s.message().find(c.reason), std::string::npos) << c.config << ": " << s;
  }
  // And what it accepts: the W3 TF32 tuning, a small one, 64-channel tiles, a configuration
  // stored before bn existed (the 128-channel tile).
  for (const char* ok : {"igemm-store-normalize:wg=4,stages=5,async=1,bn=128",
                         "igemm-store-normalize:wg=1,stages=2,async=0,bn=128",
                         "igemm-store-normalize:wg=4,stages=5,async=1",
                         "igemm-store-normalize:wg=4,stages=4,async=1,bn=64"}) {
    const absl::Status s = codegen::ValidateConfig(W3(), Target("sm_90", Precision::kTf32),
                                                   *codegen::TuneConfig::Parse(ok));
    EXPECT_TRUE(s.ok()) << ok << ": " << s;
  }
}

// Small grids split the reduction: the GEMM writes raw parts (grid z = samples x parts), a second
// kernel adds them in part order and runs the epilogue; large grids do not split.
TEST(IgemmTuning, SmallGridsSplitTheReduction) {
  struct Case {
    const char* strategy;
    std::string spec;
  };
  const std::vector<Case> cases = {
      {"igemm-store", "x:f32[4,256,8,8,8] | conv3d(out=256,k=3,padding=1) | gelu"},
      {kIgemm, "x:f32[4,200,8,8,8] | conv3d(out=200,k=3,padding=1) | group_norm(groups=8)"},
      {kMoments,
       "x:f32[2,160,12,12,12] | conv3d(out=80,k=3,padding=1) | swish | group_norm(groups=10) | "
       "mean(dims=[2,3,4])"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<codegen::Plan> plan =
        codegen::MakePlan(Parse(c.spec), Target("sm_90"), c.strategy);
    ASSERT_TRUE(plan.ok()) << c.spec << ": " << plan.status();
    const int split = std::stoi(TuneValue(*plan, "kSplit"));
    EXPECT_GT(split, 1) << c.spec;
    const codegen::KernelLaunch* part = FindKernel(*plan, "fj_igemm_wgmma_split");
    const bool moments = std::string(c.strategy) == kMoments;
    const codegen::KernelLaunch* reduce =
        FindKernel(*plan, moments ? "fj_igemm_reduce_moments" : "fj_igemm_reduce");
    ASSERT_NE(part, nullptr) << c.spec;
    ASSERT_NE(reduce, nullptr) << c.spec;
    EXPECT_EQ(FindKernel(*plan, "fj_igemm_wgmma"), nullptr);
    EXPECT_EQ(part->grid[0], reduce->grid[0]);
    EXPECT_EQ(part->grid[1], reduce->grid[1]);
    EXPECT_EQ(part->grid[2], reduce->grid[2] * split);
    EXPECT_EQ(reduce->grid[2], Parse(c.spec).input[0]);
    // The split kernel writes kpart, the reduce reads it and writes what the GEMM would.
    EXPECT_EQ(part->args.back().name, "kpart");
    EXPECT_EQ(reduce->args.front().name, "kpart");
  }
  // W3 fills the GPU without a split.
  absl::StatusOr<codegen::Plan> w3 = codegen::MakePlan(W3(), Target("sm_90"));
  ASSERT_TRUE(w3.ok());
  EXPECT_EQ(TuneValue(*w3, "kSplit"), "1");
  EXPECT_NE(FindKernel(*w3, "fj_igemm_wgmma"), nullptr);
  // Validate: at most 8 parts and at most the reduction's (kd, channel block) steps.
  const Chain small = Parse(
      "x:f32[1,32,4,8,12] | conv3d(out=128,k=[3,1,2],padding=[1,0,1]) | relu | "
      "group_norm(groups=4)");
  for (const auto& [config, reason] : std::vector<std::pair<std::string, std::string>>{
           {"igemm-store-normalize:wg=1,stages=2,async=0,bn=128,split=4",
            "split 4 is not in [1, 3]"},
           {"igemm-store-normalize:wg=1,stages=2,async=0,bn=128,split=0", "split 0 is not in"}}) {
    const absl::Status s =
        codegen::ValidateConfig(small, Target("sm_90"), *codegen::TuneConfig::Parse(config));
    EXPECT_NE(s.message().find(reason), std::string::npos) << config << ": " << s;
  }
  EXPECT_TRUE(
      codegen::ValidateConfig(
          small, Target("sm_90"),
          *codegen::TuneConfig::Parse("igemm-store-normalize:wg=1,stages=2,async=0,bn=128,split=3"))
          .ok());
}

// Every candidate that Validate() accepts compiles (NVRTC, sm_90a: every static_assert and the
// launch bounds), on two chains whose spaces are small: one warpgroup / up to 3 stages / splits of
// 1-3, and two warpgroups / up to 3 stages / splits of 1-4 with a mean; each with 128- and
// 64-channel tiles.
TEST(IgemmTuning, EveryValidCandidateOfASmallSpaceCompiles) {
  const std::vector<std::tuple<const char*, const char*, size_t>> chains = {
      {kIgemm,
       "x:f32[1,32,4,8,12] | conv3d(out=128,k=[3,1,2],padding=[1,0,1]) | relu | "
       "group_norm(groups=4)",
       18},
      {kMoments,
       "x:f32[2,64,5,10,13] | conv_transpose3d(out=256,k=[2,1,2],bias=false) | tanh | "
       "group_norm(groups=16) | mean(dims=[2,3,4])",
       48},
  };
  std::vector<std::pair<Chain, std::string>> jobs;
  for (const auto& [strategy, spec, count] : chains) {
    const Chain chain = Parse(spec);
    const std::vector<codegen::TuneConfig> all =
        ByName(strategy).Candidates(codegen::PlanInput(chain, Target("sm_90")));
    EXPECT_EQ(all.size(), count) << spec;
    for (const codegen::TuneConfig& c : all) jobs.emplace_back(chain, c.ToString());
  }
  std::vector<std::future<std::string>> results;
  std::atomic<size_t> next{0};
  for (int w = 0; w < 2; ++w) {
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

}  // namespace
}  // namespace fusejit
