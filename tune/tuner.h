// tune/tuner.h: measuring the launch configurations of a chain on the GPU and choosing one.
//
//   jit::ScopedPrimaryContext ctx = *jit::ScopedPrimaryContext::Create(0);
//   absl::StatusOr<TuneResult> r = TuneChain(chain, {.budget_s = 8});
//   TuningDb::Default().Store(r->ToRecord());   // later Compiles on this kind of GPU use it
//
// The search (codegen::AllCandidates() is the space: every applicable strategy's valid
// configurations, the planner's default first):
//   1. the default configuration is measured first; its output is the reference;
//   2. hill climbing: every untried neighbour of the best so far (configurations one parameter
//      away, or another strategy's default) is measured; repeat from the new best while one
//      improves on it;
//   3. the rest of the space in order of distance from the best, while budget is left;
//   4. confirmation: the default and the fastest few are timed again, interleaved, with more
//      repetitions; the fastest there wins (the default when nothing beats it).
// A candidate whose first 3 runs take over 1.25x the best time so far is not timed further.
// Candidates are compiled by fusejit::Compile (CompileOptions::tune_config, no cache) on
// `compile_threads` CPU threads while the calling thread times the ones already built. A
// candidate counts only when its output matches the default's: relative L2 difference within the
// tolerance and every value finite (computed on the device: templates/tune_compare.cuh);
// otherwise it is rejected and reported. The tolerance is max(tolerance (at least the unit
// roundoff of a bf16 or f16 output, 2^-8 or 2^-11), error_factor x the
// default's own relative L2 error against the float64 CPU reference on the first and last
// sample): outputs that are small sums of large terms (a mean after group_norm) legitimately
// move by more than 1e-5 when the fp32 summation order changes, and by about what the default
// already differs from the exact result. The reference is skipped (the tolerance stays as given)
// when those samples would cost more than reference_max_macs multiply-adds. Times are medians of
// CUDA-event timings of `reps` runs after `warmup` ones, with `l2_flush_bytes` overwritten
// (untimed) before each run.
#ifndef FUSEJIT_TUNE_TUNER_H_
#define FUSEJIT_TUNE_TUNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "tune/tuning_db.h"

namespace fusejit::tune {

struct CandidateResult {
  enum class Outcome {
    kTimed,         // output matched; median_ms is its time
    kMismatch,      // output differs from the default's: rejected
    kCompileError,  // fusejit::Compile failed (a Validate() gap: reported)
    kRunError,      // launch or execution failed
  };
  std::string config;  // TuneConfig text
  Outcome outcome = Outcome::kTimed;
  double median_ms = 0;  // kTimed only
  bool screened = false;  // slower than screen_factor x the best in 3 runs: median of those
  double rel_l2 = 0;     // against the default's output (0 for the default itself)
  int64_t non_finite = 0;
  std::string error;     // kCompileError, kRunError: the message
};
std::string_view OutcomeName(CandidateResult::Outcome outcome);  // "timed", "mismatch", ...

struct TuneOptions {
  // Wall time of the search for one chain (steps 1-3; the default is always measured, and
  // compiles in flight when it runs out are waited for). Confirmation comes on top.
  double budget_s = 8;
  // Most configurations measured, the default included; 0: no limit but the budget.
  int max_candidates = 0;
  int compile_threads = 0;  // 0: the hardware's
  int warmup = 2;
  int reps = 10;
  int confirm_rounds = 3;     // step 4: rounds of `reps` runs of each finalist
  int confirm_finalists = 3;  // fastest candidates confirmed besides the default
  size_t l2_flush_bytes = size_t{256} << 20;
  double tolerance = 1e-5;  // relative L2 difference from the default configuration's output
  double error_factor = 4;  // ... or this times the default's error against float64
  double reference_max_macs = 4e9;
  double screen_factor = 1.25;  // not timed further when 3 runs take over this x the best
  uint64_t seed = 0;        // of the random inputs
  Precision precision = Precision::kFp32;
  // Called on the calling thread after each measured candidate (e.g. for a progress display).
  std::function<void(const CandidateResult&)> on_candidate;
};

struct TuneResult {
  std::string spec;  // canonical
  std::string arch;
  Precision precision = Precision::kFp32;
  DeviceKey device;
  std::string default_config, best_config;
  double default_ms = 0, best_ms = 0;  // confirmation medians
  size_t space = 0;     // configurations in the search space
  size_t tried = 0;     // measured (any outcome), the default included
  size_t rejected = 0;  // kMismatch
  size_t failed = 0;    // kCompileError + kRunError
  bool budget_exhausted = false;  // the search stopped for the budget (or max_candidates)
  double default_error = -1;  // the default's rel. L2 error vs float64 (-1: not computed)
  double tolerance = 0;       // the one applied
  double seconds = 0;   // everything: inputs, search, confirmation
  std::vector<CandidateResult> candidates;  // in measurement order

  double speedup() const { return best_ms > 0 ? default_ms / best_ms : 0; }
  // The database record of this result (fusejit_version = GeneratorBuild(), tuned_at = now).
  TuningRecord ToRecord() const;
};

// Tunes `chain` on the current context's device. Errors: no current context or driver; the
// default configuration failing to compile or run (the chain cannot be tuned); out of device
// memory. REQUIRES: chain is valid; the calling thread's current context stays current.
absl::StatusOr<TuneResult> TuneChain(const Chain& chain, const TuneOptions& options = {});

}  // namespace fusejit::tune

#endif  // FUSEJIT_TUNE_TUNER_H_
