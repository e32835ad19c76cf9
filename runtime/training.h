// runtime/training.h: what a training forward saves for its backward (fusejit::
// CompileTrainingForward, CompileBackwardFromSaved; runtime/training.cc, runtime/backward.cc).
#ifndef FUSEJIT_RUNTIME_TRAINING_H_
#define FUSEJIT_RUNTIME_TRAINING_H_

#include <string>

#include "codegen/backward_plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/signature.h"
#include "runtime/stages.h"

namespace fusejit::runtime {

// Whether the training forward of `chain` saves u, and how, and why. A step without saving is
// F + P + B (the fused forward, the backward's recompute of the producer P, the rest of the
// backward). Where the fused forward's plan can also write u (codegen::SaveProducerOutput), the
// step becomes F + W + B (W: writing u), which pays when W < P; otherwise saving runs the
// producer, then the ops after it (T) from u: P + T + B, which pays when T < F. All are the
// planner's estimates (the cost model that ranks strategies; the lowest applicable; W is u's
// bytes at the models' 3 bytes a picosecond). Only chains with ops after a producer save; bf16
// and f16 chains only by F + W, from the plan Compile runs them with natively (u in f32, read by
// their f32 backward between casts).
struct SaveDecision {
  bool saves = false;
  bool fused = false;  // saves by the fused forward writing u (else: producer, then the tail)
  std::string why;     // one line for explain
};
SaveDecision DecideSave(const Chain& chain, const codegen::PlanTarget& target);

// What CompileTrainingForward of `chain`, where it saves u, saves with it and how it lays u out.
// stats: the group statistics ("stats", codegen::SavedStatsSpec), where its fused plan offers
// them (codegen::CanSaveStats); CompileBackwardFromSaved reads them then instead of recomputing
// them from u. u_layout (codegen::ULayout): kRowsByChannel where its fused plan can store u so
// (codegen::CanSaveURowsByChannel) and the backward from saved reads u in the few-input-channel
// kernel alone (codegen::BackwardReadsURowsByChannel), else kNCDHW. Both sides call this with
// the same options, so they agree.
// moment_blocks: > 0 where its fused plan finishes from per-block channel moments the backward
// can read (codegen::SavableMomentBlocks, codegen::BackwardReadsSavedMoments): it saves them too
// ("moments", codegen::SavedMomentsSpec with that many blocks), and the backward takes grad_y's
// sums from them instead of a pass over u.
// fused: its own forward plan writes u (else u comes from the two-step form, or -- bf16, f16 --
// nothing is saved).
struct SavedWithU {
  bool fused = false;
  bool stats = false;
  int moment_blocks = 0;
  codegen::ULayout u_layout = codegen::ULayout::kNCDHW;
};
SavedWithU TrainingForwardSavedWithU(const Chain& chain, const Target& target,
                                     const CompileOptions& options);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_TRAINING_H_
