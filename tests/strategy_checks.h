// tests/strategy_checks.h: checks every strategy's tests make the same way (one place for them):
// that its plans compile for each arch and dtype, that Validate refuses a configuration with the
// reason, and that random chains reach it (CPU) and match the float64 reference (GPU).
#ifndef FUSEJIT_TESTS_STRATEGY_CHECKS_H_
#define FUSEJIT_TESTS_STRATEGY_CHECKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace fusejit::testing {

// Every spec (written "x:f32[...] | ...") in f32, bf16 and f16, compiled for sm_80 and sm_90 with
// `strategy` forced and no cache: each compiles and runs that strategy (gtest failures).
void ExpectCompilesForEveryArchAndDtype(std::span<const char* const> specs,
                                        const std::string& strategy);

// Each (config, reason): ValidateConfig(chain, target, config) fails with `reason` in its message.
void ExpectValidateRefuses(const Chain& chain, const codegen::PlanTarget& target,
                           const std::vector<std::pair<std::string, std::string>>& cases);

// The first `want` chains of RandomChain(Rng(seed)) (at most 4000 tried) that `strategy` applies
// to on sm_90.
std::vector<Chain> RandomChainsReaching(const codegen::Strategy& strategy, uint64_t seed, int want);

// The chain's backward (CompileBackward, no cache) compiled for sm_80 and for sm_90; where
// `expect` is not empty, each one's Explain() contains it (gtest failures name chain and arch).
void ExpectBackwardCompilesForSm80AndSm90(const Chain& chain, const std::string& expect = "");

// On the GPU (CheckChainWithOptions: float64 reference, poisoned outputs, two runs bitwise equal)
// with `strategy` forced: every spec under its default configuration and each of `configs`
// (the parameters, "threads=128"), then RandomChainsReaching(strategy, chain_seed, 20).
void CheckStrategyOnTheGpu(const codegen::Strategy& strategy, std::span<const char* const> specs,
                           const std::vector<std::string>& configs, uint64_t chain_seed);

}  // namespace fusejit::testing

#endif  // FUSEJIT_TESTS_STRATEGY_CHECKS_H_
