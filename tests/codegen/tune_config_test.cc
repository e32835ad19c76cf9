// Tuning configurations and the strategies' tuning spaces: printed form, candidate enumeration,
// validity (every candidate Validate()s, builds a plan whose constants are the config's values,
// and compiles through NVRTC), and Validate()'s refusals.
#include <algorithm>
#include <cstdio>
#include <atomic>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "codegen/tune_config.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "gtest/gtest.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using codegen::TuneConfig;

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

codegen::PlanTarget Sm90() { return {"sm_90", 132, Precision::kFp32}; }

// Small chains, one per tunable family (the fast strategies, the generic ones with and without a
// mean), quick to compile.
const char* const kConvMoments =
    "x:f32[4,3,8,16,16] | conv3d(out=16,k=3) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])";
const char* const kConvT =
    "x:f32[2,3,6,8,8] | conv_transpose3d(out=8,k=3,stride=2,padding=1) | swish | "
    "group_norm(groups=2) | hardswish";
const char* const kGeneric = "x:f32[2,40,6,6,6] | conv3d(out=48,k=3) | relu | group_norm(groups=4)";

TEST(TuneConfig, PrintParseRoundTrip) {
  for (const std::string text :
       {"elementwise", "igemm-store-normalize",
        "conv-moments-mean:threads=128,min_blocks=3,ph=1,pw=6,blocks_per_sample=33,csplit=1",
        "store-normalize:block=256,grid_per_sm=16,chunks=-1"}) {
    absl::StatusOr<TuneConfig> c = TuneConfig::Parse(text);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->ToString(), text);
    EXPECT_EQ(*TuneConfig::Parse(c->ToString()), *c);
  }
  TuneConfig c{"recompute-mean", {{"block", 512}, {"chunks", 7}, {"mean_chunks", 2}}};
  EXPECT_EQ(c.ToString(), "recompute-mean:block=512,chunks=7,mean_chunks=2");
  EXPECT_EQ(*TuneConfig::Parse(c.ToString()), c);
  EXPECT_EQ(c.Get("chunks"), 7);
  EXPECT_FALSE(c.Get("threads").has_value());
}

TEST(TuneConfig, ParseRefusesMalformedText) {
  for (const char* text : {"", ":threads=1", "Conv:threads=1", "conv-moments-mean:", "a:threads",
                           "a:threads=", "a:threads=x", "a:threads=1,threads=2", "a:Threads=1",
                           "a:threads=+1", "a:threads=1,", "a b"}) {
    absl::StatusOr<TuneConfig> c = TuneConfig::Parse(text);
    EXPECT_FALSE(c.ok()) << text;
    if (!c.ok()) {
      EXPECT_TRUE(absl::StrContains(c.status().message(), "tune config")) << text;
    }
  }
}

TEST(TuneConfig, DistanceCountsDifferingParameters) {
  TuneConfig a{"s", {{"x", 1}, {"y", 2}}};
  EXPECT_EQ(a.Distance(a), 0);
  EXPECT_EQ(a.Distance({"s", {{"x", 1}, {"y", 3}}}), 1);
  EXPECT_EQ(a.Distance({"s", {{"x", 0}, {"y", 3}}}), 2);
  EXPECT_EQ(a.Distance({"t", {}}), 3);
  EXPECT_EQ((TuneConfig{"t", {}}).Distance(TuneConfig{"u", {}}), 1);
}

TEST(TuneConfig, EnumerateKeepsDefaultFirstThenByDistance) {
  TuneConfig def{"s", {{"x", 2}, {"y", 10}}};
  std::vector<codegen::TuneParam> space = {{"x", {1, 2, 3}}, {"y", {10, 20}}};
  std::vector<TuneConfig> all = codegen::EnumerateConfigs(
      def, space, [](const TuneConfig& c) { return *c.Get("x") != 3 || *c.Get("y") != 20; });
  ASSERT_EQ(all.size(), 5u);  // 3 x 2, minus (3, 20)
  EXPECT_EQ(all[0], def);
  std::set<std::string> seen;
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_TRUE(seen.insert(all[i].ToString()).second) << "duplicate " << all[i].ToString();
    if (i > 0) {
      EXPECT_LE(all[i - 1].Distance(def), all[i].Distance(def));
    }
  }
}

TEST(TuneSpace, DefaultConfigIsTheHeuristicPlanForRandomChains) {
  Rng rng(7);
  for (int i = 0; i < 40; ++i) {
    const Chain chain = RandomChain(rng);
    for (const auto& s : codegen::AllStrategies()) {
      if (!s->Applies(codegen::PlanInput(chain, Sm90()))) continue;
      const TuneConfig def = s->DefaultConfig(codegen::PlanInput(chain, Sm90()));
      EXPECT_EQ(def.strategy, s->name());
      EXPECT_TRUE(s->Validate(codegen::PlanInput(chain, Sm90()), def).ok())
          << FormatChain(chain) << ": " << s->Validate(codegen::PlanInput(chain, Sm90()), def);
      absl::StatusOr<codegen::Plan> by_name = codegen::MakePlan(chain, Sm90(), s->name());
      absl::StatusOr<codegen::Plan> by_config = codegen::MakePlan(chain, Sm90(), def);
      ASSERT_TRUE(by_name.ok() && by_config.ok()) << FormatChain(chain);
      EXPECT_EQ(codegen::EmitSource(chain, *by_name).main,
                codegen::EmitSource(chain, *by_config).main)
          << FormatChain(chain) << " " << def.ToString();
      EXPECT_EQ(by_config->tune_config, def.ToString());
    }
  }
}

// Every candidate of every applicable strategy is valid, and its plan bakes exactly its values.
void ExpectCandidatesValid(const Chain& chain, size_t* count) {
  const std::vector<TuneConfig> all = codegen::AllCandidates(chain, Sm90());
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0], *codegen::DefaultTuneConfig(chain, Sm90())) << FormatChain(chain);
  std::set<std::string> strategies, seen;
  for (const TuneConfig& c : all) {
    EXPECT_TRUE(seen.insert(c.ToString()).second) << "duplicate " << c.ToString();
    strategies.insert(c.strategy);
    ASSERT_TRUE(codegen::ValidateConfig(chain, Sm90(), c).ok())
        << c.ToString() << ": " << codegen::ValidateConfig(chain, Sm90(), c);
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Sm90(), c);
    ASSERT_TRUE(plan.ok()) << c.ToString() << ": " << plan.status();
    EXPECT_EQ(plan->strategy, c.strategy);
    EXPECT_EQ(plan->tune_config, c.ToString());
    if (c.values.empty()) continue;
    ASSERT_FALSE(plan->tunes.empty()) << c.ToString();
    const codegen::TuneStruct& t = plan->tunes.back();
    ASSERT_EQ(t.fields.size(), c.values.size()) << c.ToString();
    for (size_t i = 0; i < c.values.size(); ++i) {
      const std::string& v = t.fields[i].value;
      const int64_t want = c.values[i].second;
      EXPECT_TRUE(v == std::to_string(want) || (v == "true" && want == 1) ||
                  (v == "false" && want == 0))
          << c.ToString() << ": " << t.fields[i].name << " = " << v;
    }
  }
  for (const auto& s : codegen::AllStrategies()) {
    if (s->Applies(codegen::PlanInput(chain, Sm90()))) {
      EXPECT_TRUE(strategies.count(std::string(s->name()))) << s->name();
    }
  }
  *count = all.size();
}

TEST(TuneSpace, EveryCandidateIsValidAndBakesItsValues) {
  std::vector<std::string> specs = {kConvMoments, kConvT, kGeneric};
  for (const Workload& w : SeedWorkloads()) specs.push_back(w.spec);
  for (const std::string& spec : specs) {
    size_t count = 0;
    ExpectCandidatesValid(Parse(spec), &count);
    EXPECT_GT(count, 20u) << spec;  // every seed has a tunable strategy
  }
  Rng rng(11);
  for (int i = 0; i < 6; ++i) {
    size_t count = 0;
    ExpectCandidatesValid(RandomChain(rng), &count);
  }
}

TEST(TuneSpace, ThePlanChoiceIsTunable) {
  // A chain where conv-moments-mean, recompute-mean (and igemm where it applies) compete.
  const std::vector<TuneConfig> all = codegen::AllCandidates(Parse(kConvMoments), Sm90());
  std::set<std::string> strategies;
  for (const TuneConfig& c : all) strategies.insert(c.strategy);
  EXPECT_TRUE(strategies.count("conv-moments-mean"));
  EXPECT_TRUE(strategies.count("recompute-mean"));
  // W1: both normalize plans and the recompute one.
  strategies.clear();
  for (const TuneConfig& c : codegen::AllCandidates(Parse(SeedWorkloads()[0].spec), Sm90())) {
    strategies.insert(c.strategy);
  }
  for (const char* s : {"convt-recompute-normalize", "store-normalize", "recompute-normalize"}) {
    EXPECT_TRUE(strategies.count(s)) << s;
  }
}

TEST(TuneSpace, ValidateRefusesWithTheReason) {
  const Chain cm = Parse(kConvMoments);
  const Chain ct = Parse(kConvT);
  const Chain g = Parse(kGeneric);
  struct Case {
    const Chain* chain;
    std::string config;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {&cm, "conv-moments-mean:threads=100,min_blocks=2,ph=1,pw=6,blocks_per_sample=1,csplit=1",
       "multiple of 32"},
      {&cm, "conv-moments-mean:threads=1024,min_blocks=3,ph=1,pw=6,blocks_per_sample=1,csplit=1",
       "does not fit an SM"},
      {&cm, "conv-moments-mean:threads=128,min_blocks=2,ph=1,pw=6,blocks_per_sample=1,csplit=3",
       "csplit"},
      {&cm, "conv-moments-mean:threads=128,min_blocks=2,ph=1,pw=99,blocks_per_sample=1,csplit=1",
       "output plane"},
      {&cm, "conv-moments-mean:threads=1024,min_blocks=1,ph=1,pw=8,blocks_per_sample=1,csplit=1",
       "shared memory"},
      {&cm, "conv-moments-mean:threads=64,min_blocks=8,ph=2,pw=8,blocks_per_sample=1,csplit=1",
       "accumulators"},
      {&cm, "conv-moments-mean:threads=128,min_blocks=2,ph=1,pw=6,blocks_per_sample=9999,csplit=1",
       "blocks_per_sample"},
      {&cm, "conv-moments-mean:threads=128,min_blocks=2,ph=1,pw=6", "takes the parameters"},
      {&cm, "conv-moments-mean:min_blocks=2,threads=128,ph=1,pw=6,blocks_per_sample=1,csplit=1",
       "in that order"},
      {&cm, "elementwise", "does not apply"},
      {&cm, "no-such-strategy:threads=1", "does not exist"},
      {&ct, "convt-recompute-normalize:threads=256,min_blocks=2,rows_per_unit=1,stat_blocks=1,"
            "write_blocks=1,streaming_stores=2,coalesce_stores=1",
       "0 or 1"},
      {&ct, "convt-recompute-normalize:threads=256,min_blocks=2,rows_per_unit=99,stat_blocks=1,"
            "write_blocks=1,streaming_stores=1,coalesce_stores=1",
       "rows_per_unit"},
      {&ct, "convt-recompute-normalize:threads=256,min_blocks=2,rows_per_unit=1,stat_blocks=0,"
            "write_blocks=1,streaming_stores=1,coalesce_stores=1",
       "stat_blocks"},
      {&g, "store-normalize:block=100,grid_per_sm=16,chunks=1", "block"},
      {&g, "store-normalize:block=256,grid_per_sm=0,chunks=1", "grid_per_sm"},
      {&g, "store-normalize:block=256,grid_per_sm=16,chunks=100000", "chunks"},
      {&g, "igemm-store-normalize:block=256", "igemm"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TuneConfig> config = TuneConfig::Parse(c.config);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::Status s = codegen::ValidateConfig(*c.chain, Sm90(), *config);
    EXPECT_FALSE(s.ok()) << c.config;
    EXPECT_TRUE(absl::StrContains(s.message(), c.reason)) << c.config << ": " << s;
    EXPECT_FALSE(codegen::MakePlan(*c.chain, Sm90(), *config).ok()) << c.config;
  }
}

TEST(TuneSpace, CompileRefusesAnInvalidOrMismatchedConfig) {
  CompileOptions options;
  options.arch = "sm_90";
  options.use_cache = false;
  options.tune_config = "conv-moments-mean:threads=100";
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(kConvMoments), options);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "takes the parameters")) << c.status();
  options.tune_config = "conv-moments-mean:threads=";
  EXPECT_FALSE(Compile(Parse(kConvMoments), options).ok());
  options.tune_config = codegen::DefaultTuneConfig(Parse(kConvMoments), Sm90())->ToString();
  options.strategy = "recompute-mean";
  c = Compile(Parse(kConvMoments), options);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "not the strategy asked for")) << c.status();
}

// Compiles (NVRTC, sm_90) the default and every configuration one step from it, for one chain
// of each tunable family, several at a time: a Validate() that lets through a configuration a
// template refuses (static_assert, launch bounds) fails here.
TEST(TuneSpace, NeighboursOfTheDefaultCompileForSm90) {
  std::vector<std::pair<Chain, std::string>> jobs;
  for (const char* spec : {kConvMoments, kConvT, kGeneric}) {
    const Chain chain = Parse(spec);
    const std::vector<TuneConfig> all = codegen::AllCandidates(chain, Sm90());
    std::map<std::string, TuneConfig> defaults;  // strategy -> its default
    for (const TuneConfig& c : all) defaults.try_emplace(c.strategy, c);
    for (const TuneConfig& c : all) {
      const TuneConfig& def = defaults.at(c.strategy);
      // The defaults, the one-step neighbours of the chosen strategy's default, and the largest
      // values of each parameter (the register and shared-memory limits).
      bool extreme = false;
      for (const auto& [name, value] : c.values) {
        int64_t most = value;
        for (const TuneConfig& o : all) {
          if (o.strategy == c.strategy) most = std::max(most, *o.Get(name));
        }
        extreme |= value == most && c.Distance(def) == 1;
      }
      if (c.Distance(def) == 0 || (c.strategy == all[0].strategy && c.Distance(def) == 1) ||
          extreme) {
        jobs.push_back({chain, c.ToString()});
      }
    }
  }
  ASSERT_GT(jobs.size(), 20u);
  std::printf("compiling %zu configurations\n", jobs.size());
  std::vector<std::future<std::string>> results;
  std::atomic<size_t> next{0};
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
        if (!c.ok()) {
          errors += jobs[i].second + ": " + std::string(c.status().message()) + "\n";
        } else if ((*c)->stats().tune_origin != "given") {
          errors += jobs[i].second + ": origin " + (*c)->stats().tune_origin + "\n";
        }
      }
      return errors;
    }));
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

}  // namespace
}  // namespace fusejit
