// W2: conv3d -> hardswish -> group_norm -> mean over (D, H, W), parsed from its spec text.
//
// Step 1 of the fusejit API, describing the chain, is here; steps 2-5 (compile, bind buffers by
// name, run on a stream, compare with the CPU reference) are examples/run_and_check.h.
#include "examples/run_and_check.h"
#include "fusejit/chain.h"

int main() {
  // 1. The chain, as text: Conv3d(3, 16, 4) | hardswish | GroupNorm(4, 16) | mean(dim=[2,3,4]).
  auto chain_or = fusejit::ParseChain(
      "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
      "mean(dims=[2,3,4])");
  if (!chain_or.ok()) return fusejit_example::Fail("invalid chain", chain_or.status());
  const fusejit::Chain& chain = *chain_or;
  return fusejit_example::RunAndCheck(chain);
}
