// tools/runner.h: running a compiled chain on the GPU and checking its output against the CPU
// reference. Shared by `fusejit run` and `fusejit seeds` (one implementation of upload, poison,
// run, download, time and check).
#ifndef FUSEJIT_TOOLS_RUNNER_H_
#define FUSEJIT_TOOLS_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"

namespace fusejit::tools {

struct DeviceRunOptions {
  int reps = 10;   // timed runs after the checked one; 0: no timing
  int warmup = 1;  // untimed runs before the timed ones
  // Bytes of a scratch buffer overwritten (untimed) before every timed run, so that no run finds
  // its inputs in the L2 cache; 0: no flush. The H100's L2 is 50 MB.
  size_t l2_flush_bytes = 0;
  // Also time each kernel: the prefixes of the plan (first 1, 2, ... kernels) are timed like the
  // whole chain, and kernel i's time is the median of prefix i+1 minus the median of prefix i.
  bool per_kernel = false;
};

struct KernelTime {
  std::string name;  // the kernel's symbol
  double median_ms = 0;
};

struct DeviceRunResult {
  HostTensor output;            // y of the first run, OutputShape(chain)
  std::vector<float> times_ms;  // one per timed rep
  double median_ms = 0;         // median of times_ms; NaN when reps == 0
  std::vector<KernelTime> kernels;  // with per_kernel (and reps > 0), in launch order
};

// Uploads x and every parameter of `compiled`, allocates y and the workspace, fills y with NaN,
// runs once on a new stream, synchronizes and downloads y; then times `reps` more runs with CUDA
// events. Device memory is freed before returning.
// REQUIRES: a current CUDA context (e.g. jit::ScopedPrimaryContext); `inputs` holds x with the
// chain's input shape and every entry of compiled.params() with its shape (errors otherwise).
absl::StatusOr<DeviceRunResult> RunOnDevice(CompiledChain& compiled, const HostInputs& inputs,
                                            const DeviceRunOptions& options = {});

// `k` batch indices spread evenly over [0, batch), the first and the last included, ascending;
// every index when k >= batch or k <= 0.
std::vector<int64_t> SpreadSamples(int64_t batch, int64_t k);

struct CheckOptions {
  int64_t samples = 0;  // compare this many samples (SpreadSamples); 0: all
  double rtol = 1e-5;   // limit on the relative L2 error
  double atol = 1e-4;   // limit on the max abs error
};

struct CheckResult {
  std::vector<int64_t> samples;  // the batch indices compared
  ErrorStats errors;             // over those samples
  int64_t unwritten = 0;         // non-finite values anywhere in the output (all samples)
  double reference_ms = 0;       // wall time of the CPU reference
  bool pass = false;             // rel_l2 <= rtol, max_abs <= atol, nothing non-finite
};

// Evaluates the reference on the chosen samples of `inputs` and compares `output` with it.
// Errors: the reference's (bad inputs), or an output whose shape is not OutputShape(chain).
absl::StatusOr<CheckResult> CheckOutput(const Chain& chain, const HostInputs& inputs,
                                        const HostTensor& output, const CheckOptions& options);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_RUNNER_H_
