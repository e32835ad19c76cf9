// W4: conv3d -> group_norm -> mean over everything but the batch, parsed from its spec text.
// (With GroupNorm's default weight 1 and bias 0 this chain returns mean(bias) for any input, so it
// is checked here with random GroupNorm parameters, as RandomInputs draws them.)
//
// Step 1 of the fusejit API, describing the chain, is here; steps 2-5 (compile, bind buffers by
// name, run on a stream, compare with the CPU reference) are examples/run_and_check.h.
#include "examples/run_and_check.h"
#include "fusejit/chain.h"

int main() {
  // 1. The chain, as text: Conv3d(3, 24, 3) | GroupNorm(8, 24) | mean(dim=[1,2,3,4]).
  auto chain_or = fusejit::ParseChain(
      "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
      "mean(dims=[1,2,3,4])");
  if (!chain_or.ok()) return fusejit_example::Fail("invalid chain", chain_or.status());
  const fusejit::Chain& chain = *chain_or;
  return fusejit_example::RunAndCheck(chain);
}
