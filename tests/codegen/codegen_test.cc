// Code generation: plans, generated source, and NVRTC compiles of every template and of seed and
// random chains for sm_80 and sm_90. CPU only (NVRTC needs no GPU).
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "codegen/emit.h"
#include "codegen/format_number.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "jit/nvrtc.h"
#include "templates/embedded.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

Chain Parse(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *chain;
}

TEST(FormatNumber, ExactAndLocaleIndependent) {
  EXPECT_EQ(FormatDouble(1e-5), "1e-5");
  EXPECT_EQ(FormatDouble(0.01), "0.01");
  EXPECT_EQ(FormatDouble(-3), "-3");
  EXPECT_EQ(FormatDouble(1e20), "1e20");
  EXPECT_EQ(FloatLiteral(2), "2.0f");
  EXPECT_EQ(FloatLiteral(0.1), "0.1f");
  EXPECT_EQ(FloatLiteral(1e-5), "1e-5f");
  // Every float literal reads back as the same float.
  Rng rng(3);
  for (int i = 0; i < 1000; ++i) {
    const double v = rng.Uniform(-10, 10) * std::pow(10.0, static_cast<double>(rng.Int(-8, 8)));
    std::string lit = FloatLiteral(v);
    lit.pop_back();  // 'f'
    EXPECT_EQ(std::strtof(lit.c_str(), nullptr), static_cast<float>(v)) << lit;
    EXPECT_EQ(std::strtod(FormatDouble(v).c_str(), nullptr), v);
  }
}

TEST(Planner, SeedChainsGetTheExpectedPlans) {
  codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  const std::vector<Workload>& w = SeedWorkloads();
  auto strategy = [&](int i) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(Parse(w[i].spec), target);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->strategy : "";
  };
  EXPECT_EQ(strategy(0), "convt-recompute-normalize");  // cheap convT: never store the 1 GB
  // Few input channels, 16/24 channels: tensor cores (mma.sync, F16x3) for the moments.
  EXPECT_EQ(strategy(1), "mma-moments-mean");
  // K = 1728: tensor cores (sm_90a wgmma), store once, normalize in place.
  EXPECT_EQ(strategy(2), "igemm-store-normalize");
  EXPECT_EQ(strategy(3), "mma-moments-mean");
}

// A convolution whose output is small against its sums (a mean after a strided k5 conv with
// few output channels): the generic reduce-mean evaluates one point per thread, and with 4
// channels x 8 samples it had 32 blocks (H200, 2026-11-29: 1.48 ms against the tensor cores'
// 0.127; bench/random_chain_speed.py R39). The cost counts that parallelism (PassSlowdown), so
// tc-conv is chosen; where reduce-mean runs anyway (named, or a dtype without tc-conv), its
// chunks fill the device.
TEST(Planner, ReductionsWithFewOutputPointsUseTheDeviceOrTheTensorCores) {
  codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  for (const char* spec :
       {"x:f32[8,24,26,18,29] | conv3d(out=4,k=5,stride=2,padding=1) | mean(dims=[1,2,3,4])",
        "x:f32[32,64,18,18,18] | conv3d(out=6,k=5,stride=2,padding=1) | mean(dims=[2,3,4])",
        "x:f32[1,16,34,9,7] | conv3d(out=32,k=3,padding=1) | mean(dims=[1,2,3,4])"}) {
    SCOPED_TRACE(spec);
    const Chain chain = Parse(spec);
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, target);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, "tc-conv");
    absl::StatusOr<codegen::Plan> generic = codegen::MakePlan(chain, target, "reduce-mean");
    ASSERT_TRUE(generic.ok()) << generic.status();
    const codegen::KernelLaunch& k = generic->kernels[0];
    const int64_t threads = int64_t{k.grid[0]} * k.grid[1] * k.block[0];
    // At least a full grid's worth of blocks, or one thread per output point.
    EXPECT_GE(threads, std::min<int64_t>(132 * 8 * 256, NumElements(ShapeAfter(chain, 0)) / 2))
        << codegen::ExplainPlan(*generic);
  }
}

TEST(Planner, WorkspaceIsSmallNotFullSize) {
  codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  for (const Workload& w : SeedWorkloads()) {
    const Chain chain = Parse(w.spec);
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, target);
    ASSERT_TRUE(plan.ok());
    // Far below one float per output point of the producer. The tensor-core plan (W3) also
    // holds its operand copies: x channels-last (as large as x) and the weights.
    size_t operands = 0;
    if (plan->strategy == "igemm-store-normalize") {
      const int64_t weights = NumElements(ChainParams(chain)[0].shape);
      operands = static_cast<size_t>(NumElements(chain.input) + weights) * 4;
    }
    EXPECT_LT(plan->workspace_bytes,
              operands + static_cast<size_t>(NumElements(ShapeAfter(chain, 0))) / 16)
        << w.id << "\n" << codegen::ExplainPlan(*plan);
  }
}

TEST(Planner, NamedStrategyAndErrors) {
  codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  const Chain w1 = Parse(SeedWorkloads()[0].spec);
  absl::StatusOr<codegen::Plan> store = codegen::MakePlan(w1, target, "store-normalize");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->strategy, "store-normalize");
  absl::StatusOr<codegen::Plan> bad = codegen::MakePlan(w1, target, "reduce-mean");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("convt-recompute-normalize"), std::string::npos)
      << bad.status();  // lists what applies
}

// bf16 and f16 chains: the planner offers only the strategies that read and write them natively
// (Compile runs the others' f32 plans between casts, tests/runtime/dtype_test.cc);
// f64 is refused by name.
TEST(Planner, DTypesPlanOnlyWhereStrategiesHandleThem) {
  codegen::PlanTarget target;
  target.arch = "sm_90";
  for (const char* dtype : {"f16", "bf16"}) {
    Chain chain = Parse(std::string("x:") + dtype + "[2,3,8,8,8] | conv3d(out=4,k=3) | relu");
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, target);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->strategy, "elementwise");
    for (const codegen::TuneConfig& c : codegen::AllCandidates(chain, target)) {
      const codegen::Strategy* s = codegen::FindStrategy(c.strategy);
      ASSERT_NE(s, nullptr);
      EXPECT_TRUE(s->HandlesDType(chain.dtype)) << c.strategy;
    }
    // An f32-only strategy is refused by name (tc-conv, igemm-*, mma-moments-mean and
    // convt-recompute-normalize read and write the 16-bit dtypes themselves).
    EXPECT_FALSE(codegen::MakePlan(chain, target, "direct-few-out").ok());
    EXPECT_TRUE(codegen::MakePlan(chain, target, "tc-conv").ok());
  }
  // f64: the generic strategies (double arithmetic), store-normalize excepted.
  Chain f64 = Parse("x:f64[2,3,8,8,8] | conv3d(out=4,k=3) | relu | group_norm(groups=2)");
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(f64, target);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->strategy, "recompute-normalize");
  EXPECT_FALSE(codegen::MakePlan(f64, target, "store-normalize").ok());
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(f64, {.arch = "sm_90"});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_NE((*compiled)->source().find("__device__ static double pre(double v)"),
            std::string::npos);
}

TEST(Emit, SourceIsReadableWithBakedConstants) {
  const Chain w1 = Parse(SeedWorkloads()[0].spec);
  absl::StatusOr<codegen::Plan> plan =
      codegen::MakePlan(w1, {"sm_90", 132, Precision::kFp32});
  ASSERT_TRUE(plan.ok());
  const codegen::GeneratedSource src = codegen::EmitSource(w1, *plan);
  EXPECT_NE(src.main.find("// chain: " + SeedWorkloads()[0].spec), std::string::npos);
  EXPECT_NE(src.main.find("static constexpr int kN = 128;"), std::string::npos) << src.main;
  EXPECT_NE(src.main.find("kC = 16, kD = 31, kH = 63, kW = 63"), std::string::npos);
  EXPECT_NE(src.main.find("kProducer = kConvTranspose3d"), std::string::npos);
  EXPECT_NE(src.main.find("kEps = 1e-5f"), std::string::npos);
  EXPECT_NE(src.main.find("fj::swish(v)"), std::string::npos);
  EXPECT_NE(src.main.find("fj::hardswish(v)"), std::string::npos);
  EXPECT_NE(src.main.find("extern \"C\" __global__"), std::string::npos);
  // The same chain and plan give the same text.
  EXPECT_EQ(codegen::EmitSource(w1, *plan).main, src.main);
}

// Compiles `source` with every template as a header.
absl::Status CompileWithTemplates(const std::string& name, const std::string& source,
                                  const std::string& arch) {
  jit::NvrtcRequest req;
  req.name = name;
  req.source = source;
  req.arch = arch;
  req.options = codegen::SourceNvrtcOptions();
  for (const templates::TemplateFile& f : templates::All()) {
    req.headers.emplace_back(std::string(f.name), std::string(f.text));
  }
  return jit::CompileCuda(req).status();
}

TEST(Templates, EveryTemplateCompilesOnItsOwn) {
  ASSERT_FALSE(templates::All().empty());
  for (const templates::TemplateFile& f : templates::All()) {
    absl::Status s = CompileWithTemplates(std::string(f.name), std::string(f.text), "sm_90");
    EXPECT_TRUE(s.ok()) << f.name << ": " << s;
  }
}

// Compiles chains through the public API for `archs` (sm_80 and sm_90 by default), several at a
// time.
void ExpectChainsCompile(const std::vector<Chain>& chains, const std::string& strategy = "",
                         const std::vector<std::string>& archs = {"sm_80", "sm_90"}) {
  std::vector<std::future<std::string>> results;
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  for (size_t start = 0; start < chains.size(); start += workers) {
    results.clear();
    for (size_t i = start; i < std::min(chains.size(), start + workers); ++i) {
      results.push_back(std::async(std::launch::async, [&, i] {
        std::string errors;
        for (const std::string& arch : archs) {
          CompileOptions options;
          options.arch = arch;
          options.use_cache = false;
          options.strategy = strategy;
          absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chains[i], options);
          if (!c.ok()) {
            errors += FormatChain(chains[i]) + " for " + arch + ": " + c.status().ToString();
          } else if (c->get()->arch() != arch) {
            errors += "wrong arch";
          }
        }
        return errors;
      }));
    }
    for (auto& r : results) EXPECT_EQ(r.get(), "");
  }
}

TEST(Compile, SeedChainsCompileForSm80AndSm90WithEveryApplicableStrategy) {
  for (const Workload& w : SeedWorkloads()) {
    const Chain chain = Parse(w.spec);
    for (const auto& s : codegen::AllStrategies()) {
      std::vector<std::string> archs;
      for (const char* arch : {"sm_80", "sm_90"}) {
        if (s->Applies(codegen::PlanInput(chain, {arch, 132, Precision::kFp32})))
          archs.push_back(arch);
      }
      if (!archs.empty()) ExpectChainsCompile({chain}, std::string(s->name()), archs);
    }
  }
}

TEST(Compile, SeedAndRandomChainsCompileForSm75WithTheGenericPlans) {
  // sm_75 (T4) lacks cp.async and the mma.sync shapes of the fast templates: the planner must
  // pick plans NVRTC accepts there.
  std::vector<Chain> chains;
  for (const Workload& w : SeedWorkloads()) chains.push_back(Parse(w.spec));
  Rng rng(75);
  for (int i = 0; i < 8; ++i) chains.push_back(RandomChain(rng));
  ExpectChainsCompile(chains, "", {"sm_75"});
}

TEST(Compile, RandomChainsCompileForSm80AndSm90) {
  Rng rng(2026);
  std::vector<Chain> chains;
  for (int i = 0; i < 24; ++i) chains.push_back(RandomChain(rng));
  ExpectChainsCompile(chains);
}

TEST(Compile, InvalidChainAndBadArchAreRefused) {
  Chain bad{{2, 16, 8, 8, 8}, {GroupNorm(5)}};
  CompileOptions options;
  options.arch = "sm_90";
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(bad, options);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not divisible"), std::string::npos);
  options.arch = "sm_9";
  c = Compile(Parse("x:f32[1,2,3,3,3] | relu"), options);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("sm_9"), std::string::npos) << c.status();
}

TEST(Compile, CompiledChainDescribesItself) {
  CompileOptions options;
  options.arch = "sm_90";
  options.use_cache = false;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c =
      Compile(Parse(SeedWorkloads()[3].spec), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->output_shape(), (Shape{128}));
  EXPECT_EQ((*c)->params().size(), 4u);
  EXPECT_GT((*c)->workspace_bytes(), 0u);
  const std::string explain = (*c)->Explain();
  EXPECT_NE(explain.find("mma-moments-mean"), std::string::npos) << explain;
  EXPECT_NE(explain.find("kernel 0"), std::string::npos) << explain;
  EXPECT_NE(explain.find("workspace"), std::string::npos) << explain;
  EXPECT_GT((*c)->stats().nvrtc_ms, 0);
  // Profiling interface: the kernels in launch order; a prefix longer than the plan is refused
  // before anything touches a GPU.
  ASSERT_EQ((*c)->kernel_count(), 2u);
  EXPECT_EQ((*c)->kernel_name(0), "fj_mma_conv_moments");
  EXPECT_EQ((*c)->kernel_name(2), "");
  const absl::Status too_many = (*c)->RunFirstKernels(Bindings{}, nullptr, 3);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_NE(too_many.message().find("exceeds the plan's 2 kernels"), std::string::npos) << too_many;
}

}  // namespace
}  // namespace fusejit
