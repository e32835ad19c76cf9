// W3: conv_transpose3d (64 -> 128 channels, no bias) -> relu -> group_norm, parsed from its spec.
//
// Step 1 of the fusejit API, describing the chain, is here; steps 2-5 (compile, bind buffers by
// name, run on a stream, compare with the CPU reference) are examples/run_and_check.h.
#include "examples/run_and_check.h"
#include "fusejit/chain.h"

int main() {
  // 1. The chain, as text: ConvTranspose3d(64, 128, 3, bias=False) | relu | GroupNorm(8, 128).
  auto chain_or = fusejit::ParseChain(
      "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
      "group_norm(groups=8,eps=1e-5)");
  if (!chain_or.ok()) return fusejit_example::Fail("invalid chain", chain_or.status());
  const fusejit::Chain& chain = *chain_or;
  return fusejit_example::RunAndCheck(chain);
}
