#include "tests/strategy_checks.h"

#include <gtest/gtest.h>

#include <memory>

#include "fusejit/fusejit.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit::testing {

void ExpectCompilesForEveryArchAndDtype(std::span<const char* const> specs,
                                        const std::string& strategy) {
  for (const char* spec : specs) {
    for (const char* dtype : {"f32", "bf16", "f16"}) {
      std::string s = spec;
      s.replace(2, 3, dtype);  // "x:f32[" -> "x:<dtype>["
      for (const char* arch : {"sm_80", "sm_90"}) {
        CompileOptions o;
        o.arch = arch;
        o.use_cache = false;
        o.strategy = strategy;
        absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(ParseOrFail(s), o);
        ASSERT_TRUE(c.ok()) << s << " " << arch << ": " << c.status();
        EXPECT_EQ((*c)->strategy(), strategy) << s;
      }
    }
  }
}

void ExpectValidateRefuses(const Chain& chain, const codegen::PlanTarget& target,
                           const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [config, reason] : cases) {
    absl::StatusOr<codegen::TuneConfig> parsed = codegen::TuneConfig::Parse(config);
    ASSERT_TRUE(parsed.ok()) << config << ": " << parsed.status();
    const absl::Status s = codegen::ValidateConfig(chain, target, *parsed);
    EXPECT_FALSE(s.ok()) << config;
    EXPECT_NE(s.message().find(reason), std::string::npos) << config << ": " << s;
  }
}

std::vector<Chain> RandomChainsReaching(const codegen::Strategy& strategy, uint64_t seed,
                                        int want) {
  Rng rng(seed);
  std::vector<Chain> out;
  const codegen::PlanTarget t{"sm_90", 132, Precision::kFp32};
  for (int i = 0; i < 4000 && static_cast<int>(out.size()) < want; ++i) {
    Chain c = RandomChain(rng);
    if (strategy.Applies(codegen::PlanInput(c, t))) out.push_back(std::move(c));
  }
  return out;
}

void CheckStrategyOnTheGpu(const codegen::Strategy& strategy, std::span<const char* const> specs,
                           const std::vector<std::string>& configs, uint64_t chain_seed) {
  const std::string name(strategy.name());
  uint64_t seed = 1;
  for (const char* spec : specs) {
    CompileOptions o;
    o.strategy = name;
    CheckChainWithOptions(ParseOrFail(spec), seed, o);
    for (const std::string& config : configs) {
      o.tune_config = name + ":" + config;
      CheckChainWithOptions(ParseOrFail(spec), seed, o);
    }
    ++seed;
  }
  CompileOptions o;
  o.strategy = name;
  for (const Chain& c : RandomChainsReaching(strategy, chain_seed, 20)) {
    CheckChainWithOptions(c, 100 + seed++, o);
  }
}

void ExpectBackwardCompilesForSm80AndSm90(const Chain& chain, const std::string& expect) {
  for (const char* arch : {"sm_80", "sm_90"}) {
    SCOPED_TRACE(FormatChain(chain) + " " + arch);
    CompileOptions o;
    o.arch = arch;
    o.use_cache = false;
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, o);
    ASSERT_TRUE(b.ok()) << b.status();
    if (!expect.empty()) EXPECT_NE((*b)->Explain().find(expect), std::string::npos);
  }
}

}  // namespace fusejit::testing
