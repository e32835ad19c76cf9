#include "tools/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "jit/device.h"
#include "jit/driver.h"

namespace fusejit::tools {
namespace {

// A stream created in the current context, destroyed with this object.
class ScopedStream {
 public:
  static absl::StatusOr<ScopedStream> Create() {
    absl::StatusOr<const jit::DriverApi*> api = jit::Driver();
    if (!api.ok()) return api.status();
    CUstream stream = nullptr;
    FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING),
                               "cuStreamCreate");
    return ScopedStream(*api, stream);
  }
  ScopedStream(ScopedStream&& other) noexcept
      : api_(other.api_), stream_(std::exchange(other.stream_, nullptr)) {}
  ScopedStream& operator=(ScopedStream&&) = delete;
  ~ScopedStream() {
    // A destructor cannot report a failure; the result is deliberately ignored.
    if (stream_ != nullptr) (void)api_->cuStreamDestroy(stream_);
  }
  CUstream get() const { return stream_; }
  absl::Status Synchronize() const {
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuStreamSynchronize(stream_), "cuStreamSynchronize");
    return absl::OkStatus();
  }

 private:
  ScopedStream(const jit::DriverApi* api, CUstream stream) : api_(api), stream_(stream) {}
  const jit::DriverApi* api_;
  CUstream stream_;
};

// Uploads `t` as `dtype` (rounded to nearest even where narrower than float).
absl::StatusOr<jit::DeviceBuffer> Upload(const HostTensor& t, DType dtype, const std::string& what) {
  const size_t bytes = t.data.size() * DTypeBytes(dtype);
  absl::StatusOr<jit::DeviceBuffer> buf = jit::DeviceBuffer::Allocate(bytes);
  if (!buf.ok()) return buf.status();
  std::vector<char> host(bytes);
  EncodeDType(t.data.data(), t.data.size(), dtype, host.data());
  if (absl::Status s = buf->CopyFromHost(host.data(), bytes); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("uploading ", what, ": ", s.message()));
  }
  return buf;
}

absl::Status CheckShape(const HostTensor& t, const Shape& expected, const std::string& what) {
  if (t.shape != expected || static_cast<int64_t>(t.data.size()) != NumElements(expected)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has shape ", FormatShape(t.shape),
                                                   "; the chain needs ", FormatShape(expected)));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsWritten(TensorRole role) {
  return role == TensorRole::kOutput || role == TensorRole::kGradInput ||
         role == TensorRole::kGradParam;
}

// A saved tensor is written by the training forward and read by its backward: read when `reads`
// has it (a backward's run requires it: RunSignatureOnDevice).
bool IsWrittenGiven(const TensorSpec& t, const std::map<std::string, HostTensor>& reads) {
  return IsWritten(t.role) || (t.role == TensorRole::kSaved && reads.count(t.name) == 0);
}

absl::StatusOr<SignatureRunResult> RunSignatureOnDevice(
    CompiledChain& compiled, const std::map<std::string, HostTensor>& reads,
    const DeviceRunOptions& options) {
  const std::vector<TensorSpec>& sig = compiled.signature();
  // A backward (its signature reads grad_y) reads its saved tensors: each must be given.
  const bool backward = std::any_of(sig.begin(), sig.end(), [](const TensorSpec& t) {
    return t.role == TensorRole::kGradOutput;
  });
  for (const TensorSpec& t : sig) {
    if (backward && t.role == TensorRole::kSaved && reads.count(t.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the backward reads the saved tensor '", t.name,
          "', which the training forward wrote; pass it (every kSaved tensor of its signature)"));
    }
  }
  NamedBindings bindings;
  std::map<std::string, jit::DeviceBuffer> buffers;
  std::optional<Workspace> workspace;
  for (const TensorSpec& t : sig) {
    if (t.role == TensorRole::kWorkspace) {
      absl::StatusOr<Workspace> w = Workspace::Allocate(t.bytes());
      if (!w.ok()) return w.status();
      workspace.emplace(*std::move(w));
      bindings[t.name] = workspace->get();
      continue;
    }
    absl::StatusOr<jit::DeviceBuffer> buf;
    if (IsWrittenGiven(t, reads)) {
      buf = jit::DeviceBuffer::Allocate(NumElements(t.shape) * DTypeBytes(t.dtype));
      if (!buf.ok()) return buf.status();
      // Poison: any element the kernels fail to write stays NaN and is counted by the checks.
      // All-ones bytes are a NaN in every dtype (f16, bf16, f32, f64).
      if (absl::Status s = buf->FillBytes(0xff); !s.ok()) {
        return s;
      }
    } else {
      auto it = reads.find(t.name);
      if (it == reads.end()) {
        return absl::InvalidArgumentError(absl::StrCat(t.name, " (", TensorRoleName(t.role),
                                                       ") is missing: expected shape ",
                                                       FormatShape(t.shape)));
      }
      if (absl::Status s = CheckShape(it->second, t.shape, t.name); !s.ok()) return s;
      buf = Upload(it->second, t.dtype, t.name);
      if (!buf.ok()) return buf.status();
    }
    bindings[t.name] = buf->ptr();
    buffers.emplace(t.name, *std::move(buf));
  }

  absl::StatusOr<ScopedStream> stream = ScopedStream::Create();
  if (!stream.ok()) return stream.status();
  if (absl::Status s = compiled.RunNamed(bindings, stream->get()); !s.ok()) return s;
  if (absl::Status s = stream->Synchronize(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("running ", FormatChain(compiled.chain()), ": ",
                                               s.message()));
  }
  SignatureRunResult result;
  for (const TensorSpec& t : sig) {
    if (!IsWrittenGiven(t, reads)) continue;
    HostTensor& h = result.written[t.name];
    h.shape = t.shape;
    h.data.resize(NumElements(t.shape));
    std::vector<char> host(h.data.size() * DTypeBytes(t.dtype));
    if (absl::Status s = buffers.at(t.name).CopyToHost(host.data(), host.size()); !s.ok()) {
      return s;
    }
    DecodeDType(host.data(), h.data.size(), t.dtype, h.data.data());
  }

  result.median_ms = std::numeric_limits<double>::quiet_NaN();
  if (options.reps > 0) {
    std::function<absl::Status()> flush;
    absl::StatusOr<jit::DeviceBuffer> scratch = jit::DeviceBuffer::Allocate(options.l2_flush_bytes);
    if (!scratch.ok()) return scratch.status();
    if (options.l2_flush_bytes > 0) {
      const jit::DriverApi* api = *jit::Driver();
      flush = [&, api]() -> absl::Status {
        FUSEJIT_CU_RETURN_IF_ERROR(
            api->cuMemsetD32Async(scratch->ptr(), 0x3f800000u, scratch->bytes() / 4,
                                  stream->get()),
            "flushing the L2 cache");
        return absl::OkStatus();
      };
    }
    absl::StatusOr<std::vector<float>> times =
        jit::EventTimer::Time(stream->get(), options.warmup, options.reps,
                              [&] { return compiled.RunNamed(bindings, stream->get()); }, flush);
    if (!times.ok()) return times.status();
    result.times_ms = *std::move(times);
    result.median_ms = jit::Median(result.times_ms);
    if (options.per_kernel) {
      double previous = 0;
      for (size_t count = 1; count <= compiled.kernel_count(); ++count) {
        double median = result.median_ms;
        if (count < compiled.kernel_count()) {
          absl::StatusOr<std::vector<float>> prefix = jit::EventTimer::Time(
              stream->get(), options.warmup, options.reps,
              [&] { return compiled.RunFirstKernelsNamed(bindings, stream->get(), count); },
              flush);
          if (!prefix.ok()) return prefix.status();
          median = jit::Median(*std::move(prefix));
        }
        result.kernels.push_back(
            {compiled.kernel_name(count - 1), std::max(0.0, median - previous)});
        previous = median;
      }
    }
  }
  return result;
}

absl::StatusOr<DeviceRunResult> RunOnDevice(CompiledChain& compiled, const HostInputs& inputs,
                                            const DeviceRunOptions& options) {
  std::map<std::string, HostTensor> reads = inputs.params;
  reads[std::string(kInputName)] = inputs.x;
  absl::StatusOr<SignatureRunResult> run = RunSignatureOnDevice(compiled, reads, options);
  if (!run.ok()) return run.status();
  DeviceRunResult result;
  result.output = std::move(run->written[std::string(kOutputName)]);
  result.times_ms = std::move(run->times_ms);
  result.median_ms = run->median_ms;
  result.kernels = std::move(run->kernels);
  return result;
}

std::vector<int64_t> SpreadSamples(int64_t batch, int64_t k) {
  std::vector<int64_t> samples;
  if (k <= 0 || k >= batch) {
    for (int64_t i = 0; i < batch; ++i) samples.push_back(i);
    return samples;
  }
  if (k == 1) return {0};
  // Consecutive exact positions are at least 1 apart (k <= batch), so their floors are distinct.
  for (int64_t i = 0; i < k; ++i) samples.push_back(i * (batch - 1) / (k - 1));
  return samples;
}

namespace {
// Unit roundoff of the dtype's result rounding (0: none beyond the f32 plan's).
double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 0x1p-8;
    case DType::kF16: return 0x1p-11;
    default: return 0;
  }
}
}  // namespace

double DefaultRtol(DType dtype) {
  const double u = UnitRoundoff(dtype);
  return u > 0 ? 1.25 * u : 1e-5;
}

double DefaultAtol(DType dtype, double max_abs_reference) {
  return 1e-4 + 1.25 * UnitRoundoff(dtype) * max_abs_reference;
}

absl::StatusOr<CheckResult> CheckOutput(const Chain& chain, const HostInputs& inputs,
                                        const HostTensor& output, const CheckOptions& options) {
  const Shape out_shape = OutputShape(chain);
  if (absl::Status s = CheckShape(output, out_shape, "the output"); !s.ok()) return s;
  const int64_t batch = out_shape[0];
  const int64_t per_sample = batch == 0 ? 0 : NumElements(out_shape) / batch;

  CheckResult result;
  result.samples = SpreadSamples(batch, options.samples);
  ReferenceOptions ref_options;
  if (static_cast<int64_t>(result.samples.size()) < batch) ref_options.samples = result.samples;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs, ref_options);
  if (!ref.ok()) return ref.status();
  result.reference_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::vector<float> compared;
  compared.reserve(result.samples.size() * per_sample);
  for (int64_t n : result.samples) {
    const float* row = output.data.data() + n * per_sample;
    compared.insert(compared.end(), row, row + per_sample);
  }
  if (compared.size() != ref->size()) {
    return absl::InternalError(absl::StrCat("reference returned ", ref->size(), " values for ",
                                            compared.size(), " outputs"));
  }
  result.errors =
      CompareToReference(compared.data(), ref->data(), static_cast<int64_t>(compared.size()));
  for (float v : output.data) result.unwritten += std::isfinite(v) ? 0 : 1;
  // Written as negations so that a NaN error counts as a failure.
  double max_ref = 0;
  for (double v : *ref) max_ref = std::max(max_ref, std::fabs(v));
  result.rtol = std::isnan(options.rtol) ? DefaultRtol(chain.dtype) : options.rtol;
  result.atol = std::isnan(options.atol) ? DefaultAtol(chain.dtype, max_ref) : options.atol;
  result.pass = !(result.errors.rel_l2 > result.rtol) && !(result.errors.max_abs > result.atol) &&
                !std::isnan(result.errors.rel_l2) && !std::isnan(result.errors.max_abs) &&
                result.unwritten == 0 && result.errors.non_finite == 0;
  return result;
}

absl::StatusOr<GradientCheckResult> CheckGradients(
    const Chain& chain, const HostInputs& inputs, const HostTensor& grad_y,
    const std::map<std::string, HostTensor>& written, const CheckOptions& options) {
  const int64_t batch = chain.input[0];
  const double rtol = std::isnan(options.rtol) ? DefaultRtol(chain.dtype) : options.rtol;
  GradientCheckResult result;
  result.rtol = rtol;
  result.samples = SpreadSamples(batch, options.samples);
  const bool all = static_cast<int64_t>(result.samples.size()) == batch;
  ReferenceOptions ref_options;
  if (!all) ref_options.samples = result.samples;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ReferenceGradients> ref = RunReferenceBackward(chain, inputs, grad_y, ref_options);
  if (!ref.ok()) return ref.status();
  result.reference_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  auto check = [&](const std::string& name, const std::vector<double>& expected,
                   const std::vector<double>& magnitude, bool per_sample) -> absl::Status {
    auto it = written.find(name);
    if (it == written.end()) return absl::InternalError(absl::StrCat("the run wrote no ", name));
    const std::vector<float>& got = it->second.data;
    GradientCheck g;
    g.name = name;
    for (float v : got) g.unwritten += std::isfinite(v) ? 0 : 1;
    std::vector<float> compared;
    if (per_sample) {
      const int64_t per = batch == 0 ? 0 : static_cast<int64_t>(got.size()) / batch;
      for (int64_t n : result.samples) {
        compared.insert(compared.end(), got.begin() + n * per, got.begin() + (n + 1) * per);
      }
    } else {
      compared = got;
    }
    g.checked = per_sample || all;
    if (g.checked) {
      if (compared.size() != expected.size()) {
        return absl::InternalError(absl::StrCat("reference ", name, " has ", expected.size(),
                                                " values for ", compared.size()));
      }
      g.errors = CompareToReference(compared.data(), expected.data(),
                                    static_cast<int64_t>(compared.size()));
      // Relative to the largest magnitude (sum of |terms|): meaningful where terms cancel.
      double scale = 0;
      for (double v : magnitude) scale = std::max(scale, std::fabs(v));
      g.rel_max = scale > 0 ? g.errors.max_abs / scale : (g.errors.max_abs > 0 ? INFINITY : 0);
    }
    g.pass = g.unwritten == 0 &&
             (!g.checked || (!(g.rel_max > rtol) && !std::isnan(g.rel_max) &&
                             g.errors.non_finite == 0));
    result.gradients.push_back(std::move(g));
    return absl::OkStatus();
  };
  if (absl::Status s = check(std::string(kGradInputName), ref->x, ref->x_magnitude, true); !s.ok()) return s;
  for (const ParamSpec& p : ChainParams(chain)) {
    if (absl::Status s = check(GradName(p.name), ref->params.at(p.name), ref->param_magnitudes.at(p.name), false); !s.ok()) return s;
  }
  result.pass = std::all_of(result.gradients.begin(), result.gradients.end(),
                            [](const GradientCheck& g) { return g.pass; });
  return result;
}

}  // namespace fusejit::tools
