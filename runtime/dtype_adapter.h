// runtime/dtype_adapter.h: bf16 and f16 chains run through their f32 plans.
//
// A bf16 (or f16) chain is computed as PyTorch's CUDA kernels compute it -- arithmetic,
// accumulation and group_norm statistics in fp32 -- but without rounding between the ops: its
// inputs and parameters are widened to f32 (exactly: every bf16/f16 value is a float), the f32
// plan of the same chain runs on them, and its outputs (or gradients) are rounded to the chain's
// dtype once, at the end. So its error against float64 is the final rounding plus the f32 plan's
// (~1e-6), at most PyTorch's own in that dtype, which also rounds after every op.
//
// Tensor cores: every bf16 and every f16 value is exact in TF32 (bf16: 8 significant bits and
// fp32's exponent range; f16: 11 bits, a narrower range; TF32: 11 bits, fp32's range), and the
// product of two such values is exact in fp32. So the f32 chain's convolution, whose operands are
// x and the weights, runs on TF32 tensor cores (InnerOptions): the same products as the
// fp32-accurate split, accumulated in fp32 (checked on the GPU: the forward is bit for bit the f32
// chain's TF32 result, rounded). The backward keeps the caller's precision: its data gradient
// convolves grad_u, an fp32 intermediate, and a TF32 recompute of u moved W3's f16 grad_x error
// past one f16 rounding (8.7e-4 of its largest magnitude, from relu's kink: u near 0 changing
// sign), where the fp32-accurate recompute stays within it.
//
// Where a strategy reads and writes the dtype itself the chain runs natively instead (no casts):
// when the f32 chain's plan is such a strategy, or when the dtype chain's own plan costs less than
// the f32 plan between casts (RunsNativelyByCost); and the backward of a chain without a
// convolution always (codegen::BackwardRunsNatively).
//
// The composite's steps: casts in (one kernel per tensor), the f32 chain (forward or backward),
// casts out. Its workspace holds an f32 copy of every tensor, then the f32 chain's workspace.
// Bound as they are, without a copy: the training forward's saved tensors (kSaved: u, the
// statistics or moments, f32 already) in a backward from saved (CompileBackwardFromSaved), and
// the tensors the f32 chain itself declares in the chain's dtype -- a backward's grad_y, which
// its kernels widen at each load (codegen::PlanBackward's grad_y_dtype).
#ifndef FUSEJIT_RUNTIME_DTYPE_ADAPTER_H_
#define FUSEJIT_RUNTIME_DTYPE_ADAPTER_H_

#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "fusejit/fusejit.h"
#include "runtime/stages.h"
#include "tune/tuning_db.h"

namespace fusejit::runtime {

// True for the dtypes run through the f32 plan (bf16, f16).
bool RunsThroughF32(DType dtype);

// OK for the dtypes fusejit::Compile has plans for (f32, and bf16 and f16 through f32); else
// Unimplemented naming the dtype and those that have plans.
absl::Status CheckDTypeCompiles(DType dtype);

// The options of the f32 chain inside a bf16/f16 forward: TF32 tensor cores (exact here).
CompileOptions InnerOptions(const CompileOptions& options);

// The precision of a backward's gradient convolutions (the weight gradient and the data
// gradient; its recompute of u keeps `caller`) for a chain of `dtype`: kTf32 for bf16 and f16 --
// the operand that is not already the chain's dtype (grad_u, f32) rounded to 11 significant bits
// (TF32, or the fp16 high of a power-of-two-scaled value: the same rounding) and x or the weight
// exact (8 or 11 bits), products exact, sums in fp32. That is the rounding PyTorch's own bf16/f16
// backward applies to grad_u, without its roundings of every intermediate gradient: W3's f16
// gradients of x and the weight are 2.9e-4 and 3.1e-4 from float64 against PyTorch's 7.1e-4 and
// 7.9e-4, at one tensor-core product instead of three (H100: BENCHMARKS.md "nineteenth session").
// Every other dtype: `caller`.
Precision BackwardGemmPrecision(DType dtype, Precision caller);

// `chain` with dtype f32.
Chain AsF32(const Chain& chain);

// Whether a bf16/f16 chain whose f32 chain's plan is `f32_strategy` runs natively: that strategy
// reads and writes `dtype` itself (else the f32 chain runs between casts).
bool RunsNatively(std::string_view f32_strategy, DType dtype);

// Whether a bf16/f16 chain whose f32 chain's untuned plan for `target` is `f32_strategy` runs
// natively: that strategy reads and writes the dtype itself (RunsNatively), or the lowest cost of
// the strategies that do, for the dtype chain, is below the f32 plan's cost plus its casts'
// (CastCost) -- an FFMA plan chosen for the f32 chain (conv-moments-mean) can lose to a native
// tensor-core plan of 16-bit products once the casts are counted. `why`, when not null, gets the
// two costs where they decided.
bool RunsNativelyByCost(const Chain& chain, const codegen::PlanTarget& target,
                        std::string_view f32_strategy, std::string* why = nullptr);

// The casts' cost (the planner's units: 1e6 a modeled microsecond) of running a bf16/f16
// `chain` through its f32 plan: 6 bytes an element of x, the parameters and y (read one width,
// written the other) at ~3 TB/s, and ~2 us a cast kernel.
double CastCost(const Chain& chain);

// How fusejit::Compile plans `chain` (valid or not: errors name what is wrong). bf16, f16:
// natively where the f32 chain's strategy (the plan of AsF32(chain) for the same target -- its
// precision included -- with InnerOptions, or the strategy of options.tune_config) reads and
// writes the dtype itself, or (an untuned f32 plan, nothing named) where RunsNativelyByCost
// says the dtype's own plan costs less than the f32 plan between casts -- the dtype chain planned
// again among the strategies that run it, by their costs for it (16-bit tensor-core products run
// at other rates than the f32 chain's), unless the caller named a strategy or configuration --
// else nullopt: the f32 chain between casts (AdaptDType). Other dtypes: PlanChain's plan.
// The training forward (runtime/training.cc) plans with it too: it is Compile's plan plus u.
absl::StatusOr<std::optional<PlannedChain>> PlanInItsDType(const Chain& chain, const Target& target,
                                                           const CompileOptions& options,
                                                           tune::TuningDb& tuning_db);

// The composite computing `chain` (dtype bf16 or f16) with `inner`, the f32 CompiledChain of
// AsF32(chain) (a forward when `forward`, else its backward).
// REQUIRES: RunsThroughF32(chain.dtype); chain valid.
absl::StatusOr<std::shared_ptr<CompiledChain>> AdaptDType(const Chain& chain,
                                                          std::shared_ptr<CompiledChain> inner,
                                                          bool forward, const Target& target,
                                                          const CompileOptions& options);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_DTYPE_ADAPTER_H_
