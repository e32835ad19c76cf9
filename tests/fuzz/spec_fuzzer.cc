// libFuzzer target: the spec parser. Properties: ParseChain never crashes (ASan, UBSan: no
// float-to-int cast of a huge or NaN value, no signed overflow in the output-size arithmetic); a
// chain it accepts prints to a spec that parses back to the same chain and prints the same; such
// a chain plans and emits CUDA source for sm_90 (no NVRTC) or is refused with an error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "spec fuzzer: %s\n  %s\n  %s\n", what, a.c_str(), b.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fusejit::Chain> chain = fusejit::ParseChain(text);
  if (!chain.ok()) {
    if (chain.status().message().size() > 2000) {
      Fail("an error message longer than 2000 bytes", std::string(text.substr(0, 200)),
           std::string(chain.status().message().substr(0, 200)));
    }
    return 0;
  }
  const std::string printed = fusejit::FormatChain(*chain);
  absl::StatusOr<fusejit::Chain> again = fusejit::ParseChain(printed);
  if (!again.ok()) Fail("the printed spec does not parse", printed, std::string(again.status().message()));
  if (!(*again == *chain)) Fail("the printed spec parses to another chain", std::string(text), printed);
  if (fusejit::FormatChain(*again) != printed) Fail("printing is not stable", printed, fusejit::FormatChain(*again));

  // Plan and emit, as Compile would for an explicit arch; NVRTC is not called. Plans of very
  // large chains are still only text: bounded by ChainLimits.
  fusejit::codegen::PlanTarget target;
  target.arch = "sm_90";
  absl::StatusOr<fusejit::codegen::Plan> plan = fusejit::codegen::MakePlan(*chain, target, "");
  if (!plan.ok()) return 0;  // e.g. a dtype without plans
  fusejit::codegen::GeneratedSource source = fusejit::codegen::EmitSource(*chain, *plan);
  if (source.main.empty()) Fail("empty generated source", printed, plan->strategy);
  return 0;
}
