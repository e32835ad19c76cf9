// runtime/tap_gemm.h: a chain whose convolution has few output channels and many input channels,
// run as a dense GEMM per tap and a gather (codegen/tap_gemm_plan.h says why), then the chain's
// later ops as their own chain.
//
// The composite's steps: W' from the weight (one small kernel), Z = the 1x1x1 convolution of x
// with C x taps outputs (the planner's plan for that chain: tc-conv, on tensor cores at the
// caller's precision), the convolution's output from Z (gather, bias), the later ops' own plan
// on it. Its workspace: W', Z, the convolution's output (when later ops read it), then the GEMM's
// and the later ops' workspaces.
#ifndef FUSEJIT_RUNTIME_TAP_GEMM_H_
#define FUSEJIT_RUNTIME_TAP_GEMM_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "codegen/tap_gemm_plan.h"
#include "fusejit/fusejit.h"
#include "runtime/stages.h"

namespace fusejit::runtime {

// Why Compile runs `chain` as tap-gemm, or nullopt when it runs `planned` (the chain's own plan):
// the caller asked for tap-gemm by name (an error, naming why, when it does not apply), or no
// strategy or configuration was named (a tuned configuration of the chain's own plan does not
// count: the tuner does not time tap-gemm) and codegen::TapGemmBeatsOwnPlan says it should.
// REQUIRES: chain valid.
absl::StatusOr<std::optional<std::string>> ChooseTapGemm(const Chain& chain, const Target& target,
                                                         const CompileOptions& options,
                                                         const PlannedChain* planned);

// The composite. REQUIRES: codegen::SplitTapGemm(chain) has a value.
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileTapGemm(const Chain& chain,
                                                              const Target& target,
                                                              const CompileOptions& options,
                                                              const std::string& why);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_TAP_GEMM_H_
