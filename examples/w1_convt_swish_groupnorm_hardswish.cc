// W1: conv_transpose3d -> swish -> group_norm -> hardswish, built with the C++ builders of
// fusejit/chain.h (the other examples parse a spec string instead).
//
// Step 1 of the fusejit API, describing the chain, is here; steps 2-5 (compile, bind buffers by
// name, run on a stream, compare with the CPU reference) are examples/run_and_check.h.
#include "examples/run_and_check.h"
#include "fusejit/chain.h"

int main() {
  // 1. The chain: ConvTranspose3d(3, 16, 3, stride=2, padding=1) | swish | GroupNorm(4, 16) |
  //    hardswish, on x of shape [128, 3, 16, 32, 32].
  fusejit::Chain chain;
  chain.input = {128, 3, 16, 32, 32};
  chain.ops = {fusejit::ConvTranspose3d(16, {3, 3, 3}, /*stride=*/{2, 2, 2}, /*padding=*/{1, 1, 1}),
               fusejit::Elementwise(fusejit::OpKind::kSwish), fusejit::GroupNorm(4, 1e-5),
               fusejit::Elementwise(fusejit::OpKind::kHardswish)};
  if (absl::Status s = fusejit::ValidateChain(chain); !s.ok()) {
    return fusejit_example::Fail("invalid chain", s);
  }
  return fusejit_example::RunAndCheck(chain);
}
