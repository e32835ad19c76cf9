// runtime/composite.h: a CompiledChain made of compiled steps run in order on the caller's stream,
// each step's tensors bound to the composite's own tensors (or regions of its workspace).
//
// The backward (runtime/backward.cc: recompute, backward kernels, data gradient) and the dtype
// adapter (runtime/dtype_adapter.h: casts in, the f32 plan, casts out) are composites.
#ifndef FUSEJIT_RUNTIME_COMPOSITE_H_
#define FUSEJIT_RUNTIME_COMPOSITE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusejit/fusejit.h"

namespace fusejit::runtime {

// One compiled step and where each tensor of its signature comes from.
struct Step {
  std::string what;  // one line for explain and error messages
  std::shared_ptr<CompiledChain> compiled;
  struct Source {
    int tensor = -1;    // index into the composite's signature; -1: a null pointer
    size_t offset = 0;  // bytes added to its pointer (workspace regions)
  };
  std::vector<Source> sources;  // one per compiled->signature() tensor
};

// Builds steps from a composite signature: each step tensor is bound by `map` (step tensor name
// -> source) when listed there, else to the composite tensor of the same name.
class StepsBuilder {
 public:
  explicit StepsBuilder(const std::vector<TensorSpec>* signature) : signature_(signature) {}
  absl::Status Add(std::string what, std::shared_ptr<CompiledChain> compiled,
                   const std::vector<std::pair<std::string, Step::Source>>& map);
  std::vector<Step>& steps() { return steps_; }

 private:
  const std::vector<TensorSpec>* signature_;
  std::vector<Step> steps_;
};

struct CompositeInfo {
  Chain chain;            // the chain the composite computes (its signature's chain)
  std::string arch;
  std::string strategy;   // strategy() of the composite
  std::string header;     // Explain's text before the steps (ends with a newline)
  bool forward = false;   // Run(Bindings) binds the forward's fixed fields (else: an error)
  Shape output_shape;
  int source_step = 0;    // whose source() is the composite's
};

// REQUIRES: every step's sources index `signature` (or are -1).
std::shared_ptr<CompiledChain> MakeComposite(CompositeInfo info, std::vector<Step> steps,
                                             std::vector<TensorSpec> signature);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_COMPOSITE_H_
