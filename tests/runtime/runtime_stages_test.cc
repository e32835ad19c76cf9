// runtime/stages.h: the pipeline one stage at a time, with a private kernel cache and tuning
// database passed in (no singletons), and Compile using the ones passed in CompileOptions.
#include "runtime/stages.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "cache/testing.h"

namespace fusejit {
namespace {

using cache::testing::TempDir;
using cache::testing::WarningLog;

constexpr const char* kSpec =
    "x:f32[2,3,8,16,16] | conv3d(out=16,k=3,padding=1) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])";

struct Stores {
  TempDir dir;
  WarningLog log;
  std::unique_ptr<cache::KernelCache> cache;
  std::unique_ptr<tune::TuningDb> db;
  Stores() {
    cache::CacheOptions c;
    c.dir = dir.Sub("kernels");
    c.warn = log.Sink();
    cache = std::make_unique<cache::KernelCache>(c);
    tune::TuningDbOptions t;
    t.dir = dir.Sub("tuning");
    t.warn = log.Sink();
    db = std::make_unique<tune::TuningDb>(t);
  }
};

TEST(RuntimeStages, EachStageAloneThenTheirComposition) {
  Stores stores;
  CompileOptions options;
  options.arch = "sm_90";
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->plan_target.arch, "sm_90");
  EXPECT_TRUE(target->device.empty());

  const Chain chain = *ParseChain(kSpec);
  absl::StatusOr<runtime::PlannedChain> planned =
      runtime::PlanChain(chain, *target, options, *stores.db);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->stats.tune_origin, "default");
  EXPECT_FALSE(planned->plan.kernels.empty());

  runtime::EmittedChain emitted = runtime::EmitChain(&*planned, /*want_ptx=*/false);
  EXPECT_EQ(emitted.key.spec, FormatChain(chain));
  EXPECT_TRUE(absl::StrContains(emitted.source.main, "struct Cfg"));
  EXPECT_EQ(emitted.key.generator_version, GeneratorVersion());

  CompileStats stats;
  absl::StatusOr<std::string> cubin =
      runtime::BuildCubin(*planned, emitted, stores.cache.get(), "", &stats);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  EXPECT_FALSE(stats.cache_hit);
  EXPECT_GT(stats.nvrtc_ms, 0);
  CompileStats again;
  ASSERT_TRUE(runtime::BuildCubin(*planned, emitted, stores.cache.get(), "", &again).ok());
  EXPECT_TRUE(again.cache_hit);  // the cache passed in, not the process's default
  EXPECT_EQ(stores.cache->Stats().compiles, 1);

  const std::string strategy = planned->plan.strategy;
  std::shared_ptr<CompiledChain> compiled =
      runtime::MakeCompiled(*std::move(planned), std::move(emitted), *std::move(cubin));
  EXPECT_EQ(compiled->strategy(), strategy);
  EXPECT_GT(compiled->cubin_bytes(), 0u);
  EXPECT_EQ(compiled->signature().front().name, "x");

  // Compile over the same stores: a disk hit in this cache.
  options.kernel_cache = stores.cache.get();
  options.tuning_db = stores.db.get();
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->stats().cache_hit);
  EXPECT_EQ(stores.cache->Stats().compiles, 1);
}

TEST(RuntimeStages, PlanChainUsesTheTuningDatabaseItIsGiven) {
  Stores stores;
  const Chain chain = *ParseChain(kSpec);
  CompileOptions options;
  options.arch = "sm_90";
  options.tuning_device = {"Test GPU (stages)", 132, 13000};
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  ASSERT_TRUE(target.ok());
  const codegen::TuneConfig def = *codegen::DefaultTuneConfig(chain, target->plan_target);
  codegen::TuneConfig other;
  for (const codegen::TuneConfig& c : codegen::AllCandidates(chain, target->plan_target)) {
    if (!(c == def)) {
      other = c;
      break;
    }
  }
  ASSERT_FALSE(other.strategy.empty());
  tune::TuningRecord r;
  r.key = {FormatChain(chain), "sm_90", Precision::kFp32, options.tuning_device};
  r.fusejit_version = GeneratorBuild();
  r.config = other.ToString();
  r.default_config = def.ToString();
  r.tuned_at = "2026-11-23T10:00:00Z";
  ASSERT_TRUE(stores.db->Store(r).ok());

  absl::StatusOr<runtime::PlannedChain> planned =
      runtime::PlanChain(chain, *target, options, *stores.db);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->stats.tune_origin, "tuned");
  EXPECT_EQ(planned->plan.tune_config, other.ToString());

  tune::TuningDbOptions empty;
  empty.dir = stores.dir.Sub("other-tuning");
  tune::TuningDb other_db(empty);
  planned = runtime::PlanChain(chain, *target, options, other_db);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned->stats.tune_origin, "default");
}

}  // namespace
}  // namespace fusejit
