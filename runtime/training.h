// runtime/training.h: what a training forward saves for its backward (fusejit::
// CompileTrainingForward, CompileBackwardFromSaved; runtime/training.cc, runtime/backward.cc).
#ifndef FUSEJIT_RUNTIME_TRAINING_H_
#define FUSEJIT_RUNTIME_TRAINING_H_

#include <string>

#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/signature.h"

namespace fusejit::runtime {

// Whether the training forward of `chain` saves u, and why. Saving turns a step of F + P + B
// (the fused forward, the backward's recompute of the producer P, the rest of the backward) into
// P + T + B (the producer, then the ops after it, T, from u): it pays when T < F. Both are the
// planner's estimates (the cost model that ranks strategies; the lowest applicable). Only f32
// chains with ops after a producer can save.
struct SaveDecision {
  bool saves = false;
  std::string why;  // one line for explain
};
SaveDecision DecideSave(const Chain& chain, const codegen::PlanTarget& target);

// The saved tensor: "u", the producer's output (kSaved, f32, its shape).
// REQUIRES: TrainingForwardSaves(chain).
TensorSpec SavedProducerOutput(const Chain& chain);

// The ops after the producer as a chain of their own on u (their parameters renumbered from 0).
// REQUIRES: TrainingForwardSaves(chain).
Chain TailChain(const Chain& chain);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_TRAINING_H_
