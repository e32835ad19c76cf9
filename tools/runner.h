// tools/runner.h: running a compiled chain on the GPU and checking its output against the CPU
// reference. Shared by `fusejit run` and `fusejit seeds` (one implementation of upload, poison,
// run, download, time and check).
#ifndef FUSEJIT_TOOLS_RUNNER_H_
#define FUSEJIT_TOOLS_RUNNER_H_

#include <cstdint>
#include <limits>
#include <map>
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
  // whole chain, and kernel i's time is the median of prefix i+1 minus the median of prefix i,
  // or 0 where that is negative (a kernel shorter than the medians' noise).
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

// The general form, driven by compiled.signature(): every tensor a run reads (input, param,
// grad_output) is uploaded from `reads` by name (an error names a missing or misshapen one);
// every tensor it writes (output, grad_input, grad_param) is allocated, filled with NaN and
// downloaded after the first run; the workspace is allocated. Then `reps` timed runs.
struct SignatureRunResult {
  std::map<std::string, HostTensor> written;  // by signature name, from the first run
  std::vector<float> times_ms;
  double median_ms = 0;  // NaN when reps == 0
  std::vector<KernelTime> kernels;
};
absl::StatusOr<SignatureRunResult> RunSignatureOnDevice(
    CompiledChain& compiled, const std::map<std::string, HostTensor>& reads,
    const DeviceRunOptions& options = {});

// Whether a signature role is written by a run (output and gradients) rather than read. A kSaved
// tensor (fusejit::CompileTrainingForward's u, stats) is RunSignatureOnDevice's to write --
// poisoned, returned in `written` -- when `reads` lacks it, and uploaded from `reads` when it has
// it (the backward reading it; a backward's run without one of them is an InvalidArgument).
bool IsWritten(TensorRole role);

// `k` batch indices spread evenly over [0, batch), the first and the last included, ascending;
// every index when k >= batch or k <= 0.
std::vector<int64_t> SpreadSamples(int64_t batch, int64_t k);

// Limits, NaN meaning the chain dtype's default (DefaultRtol / DefaultAtol).
struct CheckOptions {
  int64_t samples = 0;  // compare this many samples (SpreadSamples); 0: all
  double rtol = std::numeric_limits<double>::quiet_NaN();  // limit on the relative L2 error
  double atol = std::numeric_limits<double>::quiet_NaN();  // limit on the max abs error
};

// The dtype's tolerance. f32: rtol 1e-5, atol 1e-4 (the plans' fp32 arithmetic against float64).
// bf16 and f16 chains compute in f32 and round the result once, so their error is that rounding:
// at most u = 2^-8 (bf16) or 2^-11 (f16) relative per value. rtol is 1.25 u, and the max abs
// limit 1e-4 + 1.25 u * max |reference|. Gradients are held to rtol relative to their largest
// magnitude.
double DefaultRtol(DType dtype);
double DefaultAtol(DType dtype, double max_abs_reference);

struct CheckResult {
  std::vector<int64_t> samples;  // the batch indices compared
  ErrorStats errors;             // over those samples
  int64_t unwritten = 0;         // non-finite values anywhere in the output (all samples)
  double reference_ms = 0;       // wall time of the CPU reference
  double rtol = 0, atol = 0;     // the limits applied (given, or the dtype's)
  bool pass = false;             // rel_l2 <= rtol, max_abs <= atol, nothing non-finite
};

// Evaluates the reference on the chosen samples of `inputs` and compares `output` with it.
// Errors: the reference's (bad inputs), or an output whose shape is not OutputShape(chain).
absl::StatusOr<CheckResult> CheckOutput(const Chain& chain, const HostInputs& inputs,
                                        const HostTensor& output, const CheckOptions& options);

// The gradients of a backward run (RunSignatureOnDevice of CompileBackward's chain) against the
// float64 reference backward: grad_x on the chosen samples; the parameter gradients (sums over
// the batch) only when every sample is compared, else they are reported as not checked.
struct GradientCheck {
  std::string name;     // "grad_x", "grad_0.weight", ...
  bool checked = false;
  ErrorStats errors;
  int64_t unwritten = 0;  // non-finite values in the whole tensor
  double rel_max = 0;     // max_abs / max magnitude (ReferenceGradients: sum of |terms|)
  bool pass = false;
};
struct GradientCheckResult {
  std::vector<int64_t> samples;
  std::vector<GradientCheck> gradients;  // in signature order
  double reference_ms = 0;
  double rtol = 0;    // the limit applied (given, or the dtype's)
  bool pass = false;  // every checked gradient passes and nothing is unwritten
};
// Passes when rel_max = max|got - ref| / max magnitude <= rtol (the magnitude is the sum of the
// terms' absolute values behind each gradient value, so gradients that cancel to ~0 are judged
// against the size of what cancelled) and nothing is non-finite. rel_l2 is reported too.
absl::StatusOr<GradientCheckResult> CheckGradients(
    const Chain& chain, const HostInputs& inputs, const HostTensor& grad_y,
    const std::map<std::string, HostTensor>& written, const CheckOptions& options);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_RUNNER_H_
