// codegen/emit.h: writes the CUDA source for a (chain, plan): the narrow seam into code generation.
//
// The generated translation unit is short and readable: a comment with the chain and the plan,
// a Cfg struct of named constants (shapes baked in) and the chain's elementwise ops, #includes of
// the plan's templates, and one extern "C" __global__ wrapper per kernel of the plan. The
// templates travel with it as NVRTC headers.
#ifndef FUSEJIT_CODEGEN_EMIT_H_
#define FUSEJIT_CODEGEN_EMIT_H_

#include <string>
#include <utility>
#include <vector>

#include "codegen/plan.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

struct GeneratedSource {
  std::string name;  // "fusejit_<strategy>.cu": NVRTC program name
  std::string main;  // the generated translation unit
  // Every template as (include name, text). NVRTC reads only the ones included.
  std::vector<std::pair<std::string, std::string>> headers;
  // NVRTC options the source needs (part of the cache key like everything NVRTC sees).
  std::vector<std::string> nvrtc_options;
};

// NVRTC options every fusejit source is compiled with.
std::vector<std::string> SourceNvrtcOptions();

// REQUIRES: chain valid, plan made for it.
GeneratedSource EmitSource(const Chain& chain, const Plan& plan);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_EMIT_H_
