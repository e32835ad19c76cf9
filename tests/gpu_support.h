// tests/gpu_support.h: running a compiled chain on the GPU from host tensors, for Gpu* tests.
#ifndef FUSEJIT_TESTS_GPU_SUPPORT_H_
#define FUSEJIT_TESTS_GPU_SUPPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"

namespace fusejit::testing {

// Makes device 0's primary context current for the whole test binary. Returns the reason there is
// no GPU (for GTEST_SKIP) or "" when one is usable.
std::string GpuUnavailableReason();

// In a GPU test (TEST body): skips it, naming why, when GpuUnavailableReason() is not empty.
#define SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                     \
    const std::string fusejit_gpu_reason = ::fusejit::testing::GpuUnavailableReason();    \
    if (!fusejit_gpu_reason.empty()) GTEST_SKIP() << "no usable GPU: " << fusejit_gpu_reason; \
  } while (0)

// Uploads `inputs`, fills the output with NaN, runs `compiled` `runs` times (re-poisoning before
// each) and returns each run's output. With timing_reps > 0 it then times that many more runs
// (CUDA events, after one warm-up) and stores their median in *median_ms.
// REQUIRES: GpuUnavailableReason() == "".
absl::StatusOr<std::vector<std::vector<float>>> RunOnGpu(CompiledChain& compiled,
                                                         const HostInputs& inputs, int runs = 2,
                                                         int timing_reps = 0,
                                                         double* median_ms = nullptr);

// Limits on the error of a chain's output against the float64 reference.
struct Tolerance {
  double rel_l2 = 1e-5;
  double max_abs = 1e-4;
};

// Compiles `chain` for the current device (with `strategy` when non-empty, else the planner's
// choice, and `precision`), runs it twice on RandomInputs(chain, seed) with the output poisoned
// with NaN before each run, and checks (gtest failures) that the two runs are bitwise identical,
// that every output was written, and that the batch indices `samples` (all when empty) match the
// float64 reference within `tol`. Prints the errors (and, with timing_reps > 0, the median time
// of that many more runs). The reference of the last (chain, seed, samples) is kept, so checking
// the same chain again (another strategy or precision) does not recompute it.
void CheckChain(const Chain& chain, uint64_t seed, const std::vector<int64_t>& samples,
                const std::string& strategy = "", Tolerance tol = {},
                Precision precision = Precision::kFp32, int timing_reps = 0);

// CheckChain with every compile option given (a tune config, the cache off, ...).
void CheckChainWithOptions(const Chain& chain, uint64_t seed, const CompileOptions& options,
                           const std::vector<int64_t>& samples = {}, Tolerance tol = {},
                           int timing_reps = 0);

}  // namespace fusejit::testing

#endif  // FUSEJIT_TESTS_GPU_SUPPORT_H_
