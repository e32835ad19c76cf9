// codegen/backward_plan.h: the plan of a chain's backward kernels (grad_y -> grad_u and the
// parameter gradients).
//
// A chain's backward is three steps (runtime/backward.cc puts them together):
//   1. recompute u, the producer's output, with the forward plan of the chain cut after its
//      producer (no step without a producer: u is x);
//   2. this plan: grad_u from grad_y through mean, the post ops, group_norm and the pre ops, the
//      group_norm and conv-bias gradients, and the conv weight gradient (its kernels:
//      codegen/weight_gradient_plan.h);
//   3. grad_x = the data gradient of the convolution, itself a convolution of grad_u (planned as a
//      forward chain of its own: DataGradientChain);
//   4. only where that convolution's output is larger than x (DataGradientChain): grad_x = its
//      leading box (cast_plan.h's PlanCrop).
#ifndef FUSEJIT_CODEGEN_BACKWARD_PLAN_H_
#define FUSEJIT_CODEGEN_BACKWARD_PLAN_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/signature.h"

namespace fusejit::codegen {

// Names of step 2's own tensors, besides the chain's (x, grad_y, the parameters and their grads).
inline constexpr std::string_view kProducerOutputName = "u";       // saved: the producer's output
inline constexpr std::string_view kProducerGradName = "grad_u";    // written: dL/du
inline constexpr std::string_view kSavedStatsName = "stats";       // saved: group mean and rstd
inline constexpr std::string_view kSavedMomentsName = "moments";   // saved: channel moments
// Written with grad_u: max|grad_u| per block of the kernel writing it, float [blocks].
inline constexpr std::string_view kProducerGradMaximaName = "grad_u_maxima";
// Step 3's: per-block maxima of |x| (step 3's x is grad_u), read (ReadInputMaxima).
inline constexpr std::string_view kInputMaximaName = "x_maxima";

// How the training forward's saved u lies in memory.
//   kNCDHW:         the producer's output as PyTorch lays it out, [N, C, D, H, W].
//   kRowsByChannel: [N, D, H, C, W], the rows of every channel at one (d, h) side by side. The
//       convt plans' statistics pass (templates/convt_group_norm.cuh) computes a row of every
//       channel at once and stores them as one span: W1's 63-wide rows stored a channel apart
//       left partly written 32-byte sectors at both ends of each, and its training forward took
//       1.397 ms against 1.155 this way (H100, 2026-11-27). Taken only where the backward reads
//       u in the few-input-channel kernel alone (BackwardReadsURowsByChannel).
enum class ULayout { kNCDHW, kRowsByChannel };

// Step 2's plan. Its signature (Plan::signature): x, u (with a producer), stats (saved_stats),
// grad_y, the group_norm weight and bias, grad_u (grad_x without a producer), the gradient of
// every parameter except the conv weight's data (grad_<conv weight> is computed here too),
// workspace. saved_stats: the group statistics are read from the training forward's "stats"
// (SavedStatsSpec) instead of recomputed from u (one pass over u less).
// A convolution with few input channels (conv_transpose3d; conv3d with stride 1) gets the fused
// form (templates/few_in_backward.cuh, planned by codegen/few_in_backward_plan.h):
// the conv weight is in the signature too and grad_x takes grad_u's place -- it computes the data
// gradient itself, so steps 3 and 4 are skipped (BackwardPlanWritesGradX).
// REQUIRES: chain is valid and float32, or BackwardRunsNatively(chain) (then x, the parameters,
// grad_y and every gradient are in the chain's dtype: grad_y_dtype must be it); saved_stats only
// for a chain with group_norm. Unimplemented for other dtypes.
// u_layout: how the saved u lies (kRowsByChannel: InvalidArgument unless the plan reads it in
// the fused kernel alone).
// saved_moment_blocks > 0: the training forward saved its per-block channel moments of the
// pre-norm values (SavedMomentsSpec with that many blocks), and grad_y's sums come from them
// instead of a pass over u and grad_y (backward.cuh's bwd_sums_from_moments_kernel);
// InvalidArgument unless BackwardReadsSavedMoments(chain) and not saved_stats.
// grad_y_dtype: the dtype grad_y is read in (f32, or bf16/f16: a bf16/f16 chain's backward runs
// its f32 backward on its own 16-bit grad_y, widened exactly at each load, instead of an f32
// copy); InvalidArgument for another.
absl::StatusOr<Plan> PlanBackward(const Chain& chain, const PlanTarget& target,
                                  bool saved_stats = false, ULayout u_layout = ULayout::kNCDHW,
                                  int saved_moment_blocks = 0, DType grad_y_dtype = DType::kF32);

// Whether a chain's backward plan runs in its own dtype: bf16 and f16 chains without a
// convolution (their kernels widen every load and round every store, templates/backward.cuh). A
// 16-bit chain with a convolution runs the f32 backward between casts (runtime/dtype_adapter.h).
bool BackwardRunsNatively(const Chain& chain);

// Whether step 2's `plan` of `chain` (which has a producer) writes grad_x itself: the fused form.
bool BackwardPlanWritesGradX(const Chain& chain, const Plan& plan);

// Step 1: the chain up to and including its producer. REQUIRES: the chain has a producer.
Chain ProducerChain(const Chain& chain);

// The ops after the producer as a chain of their own on u, its output (their parameters
// renumbered from 0: op i of the chain is op i - producer_index - 1 of the tail; ops empty when
// the producer is the last op). REQUIRES: the chain has a producer.
Chain TailChain(const Chain& chain);

// The training forward's saved tensor u (runtime/training.cc, read by the backward in place of
// step 1): the producer's output, f32, role kSaved, shaped as `layout` lays it out.
// REQUIRES: the chain has a producer.
TensorSpec SavedProducerOutputSpec(const Chain& chain, ULayout layout = ULayout::kNCDHW);

// The training forward's saved group statistics: float [N, groups, 2] (mean, rstd as the forward
// normalized with them), role kSaved. REQUIRES: the chain has a group_norm.
TensorSpec SavedStatsSpec(const Chain& chain);

// The training forward's saved channel moments: float [N, blocks, C, 3], the (count, mean, M2)
// of the pre-norm values z = pre(u) over each of a sample's `blocks` parts, per channel, as the
// forward's moments-mean finalize merges them (fj::Moments, partials[(n*blocks + b)*C + c]),
// role kSaved. REQUIRES: the chain has a producer and a group_norm; blocks >= 1.
TensorSpec SavedMomentsSpec(const Chain& chain, int blocks);

// The tensors a training forward saves, in their signature order (u, then the group statistics
// and the channel moments where saved): the one order both sides of the pair bind them in.
// REQUIRES: the chain has a producer.
std::vector<TensorSpec> SavedTensorSpecs(const Chain& chain, ULayout layout, bool stats,
                                         int moment_blocks);

// Whether the backward of `chain` can take grad_y's sums from saved channel moments: it ends in
// mean with no op between group_norm and mean (grad_y is then one value per (n, c) slice), and
// has a producer (its training forward saves u).
bool BackwardReadsSavedMoments(const Chain& chain);

// Where `plan`, a forward plan, computes its output from float per-block channel moments in its
// workspace (an argument "partials" of type fj::Moments, read by the moments-mean finalize
// "fj_moments_mean") and the backward reads them (BackwardReadsSavedMoments): their blocks per
// sample (the region's size over N*C moments); else 0.
int SavableMomentBlocks(const Chain& chain, const Plan& plan);

// The training forward's fused form: `plan`, a forward plan of `chain`, changed so that it also
// writes u (bias added, before any op) into the signature tensor kProducerOutputName. A strategy
// offers this by leaving a null float argument named "u" where its kernel can store u (as
// mma-moments-mean's does); SaveProducerOutput binds every such argument to u and gives the plan
// the forward signature plus u. Where the plan also leaves a null float argument named "stats"
// (the convt-* plans' scale/shift kernel: CanSaveStats) and the chain has a group_norm (whose
// statistics they are), it binds that to kSavedStatsName, after u. FailedPrecondition where the
// plan has no u argument.
// Where the plan's moments can be saved (SavableMomentBlocks) and the backward reads them
// (BackwardReadsSavedMoments), its "partials" arguments are bound to kSavedMomentsName
// (SavedMomentsSpec) after u instead: the backward then skips a pass over u.
// layout kRowsByChannel: where the plan's kernels that store u take it (CanSaveURowsByChannel: a
// tune struct "ConvTTune", templates/convt_group_norm.cuh), they get the tune constant
// kURowsByChannel = true; FailedPrecondition elsewhere.
bool CanSaveProducerOutput(const Plan& plan);
bool CanSaveStats(const Chain& chain, const Plan& plan);
bool CanSaveURowsByChannel(const Plan& plan);
absl::Status SaveProducerOutput(const Chain& chain, Plan* plan, ULayout layout = ULayout::kNCDHW);

// Whether step 2's plan of `chain` with saved_stats can read a saved u laid out kRowsByChannel:
// it reads u in the fused few-input-channel kernel only (grad_y's sums recompute u there).
bool BackwardReadsURowsByChannel(const Chain& chain, const PlanTarget& target, bool saved_stats);

// Step 3: the forward chain computing grad_x from grad_u: for conv3d a conv_transpose3d with the
// same weight tensor (its [Cout,Cin,k] layout is conv_transpose3d's [in,out,k]) and the
// output_padding that restores x's size; for conv_transpose3d a conv3d. No bias. Its output has
// x's shape, except for a conv_transpose3d with output_padding >= stride (dilation allows it):
// there the conv3d's output is longer along that dimension (Di + floor(output_padding/stride))
// and grad_x is its leading x-shaped box (runtime/backward.cc crops it: step 4).
// REQUIRES: the chain is valid and has a producer.
absl::StatusOr<Chain> DataGradientChain(const Chain& chain);

// Step 3 without a pass over grad_u for its largest magnitude: `plan`, a forward plan whose x is
// grad_u, changed to reduce `count` per-block maxima of |x| (step 2's kProducerGradMaximaName,
// covering every value of x) instead of scanning x. A strategy that scales x by max|x| offers
// this by leaving a null float argument named "xmax" read by that kernel, whose tune struct
// "IgemmFixed" then gets kXMaxima = count (templates/igemm_mma.cuh, igemm_absmax_body);
// ReadInputMaxima binds every such argument to kInputMaximaName and gives the plan the forward
// signature plus that tensor (float [count], role kInput) before the workspace. The maximum is
// exact, so the plan's results are bitwise those of the scanning plan. FailedPrecondition where
// the plan has no such argument (CanReadInputMaxima false) or already has its own signature.
bool CanReadInputMaxima(const Plan& plan);
absl::Status ReadInputMaxima(const Chain& chain, Plan* plan, int64_t count);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_BACKWARD_PLAN_H_
