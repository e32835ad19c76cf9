// tests/gpu_support.h: running a compiled chain on the GPU from host tensors, for Gpu* tests.
#ifndef FUSEJIT_TESTS_GPU_SUPPORT_H_
#define FUSEJIT_TESTS_GPU_SUPPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"

namespace fusejit::testing {

// Makes device 0's primary context current for the whole test binary. Returns the reason there is
// no GPU (for GTEST_SKIP) or "" when one is usable.
std::string GpuUnavailableReason();

// Uploads `inputs`, fills the output with NaN, runs `compiled` `runs` times (re-poisoning before
// each) and returns each run's output. REQUIRES: GpuUnavailableReason() == "".
absl::StatusOr<std::vector<std::vector<float>>> RunOnGpu(CompiledChain& compiled,
                                                         const HostInputs& inputs, int runs = 2);

}  // namespace fusejit::testing

#endif  // FUSEJIT_TESTS_GPU_SUPPORT_H_
