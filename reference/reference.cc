// reference/reference.cc: RunReference (per-sample evaluation, threads), the argument checks it
// shares with RunReferenceBackward (backward.cc), and CompareToReference. The ops themselves are in
// ops.cc and conv.cc.
#include "fusejit/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "reference/ops.h"

namespace fusejit {
namespace reference_internal {
namespace {

absl::StatusOr<std::vector<OpParams>> CheckParams(const Chain& chain, const HostInputs& inputs) {
  const std::vector<ParamSpec> specs = ChainParams(chain);
  std::vector<OpParams> params(chain.ops.size());
  for (const ParamSpec& spec : specs) {
    auto it = inputs.params.find(spec.name);
    if (it == inputs.params.end()) {
      return absl::InvalidArgumentError(
          fmt::format("parameter {} ({} of op {} {}) is missing: expected shape {}", spec.name,
                      spec.name.substr(spec.name.find('.') + 1), spec.op_index,
                      OpName(chain.ops[spec.op_index].kind), FormatShape(spec.shape)));
    }
    absl::Status s = CheckTensor(fmt::format("parameter {}", spec.name), it->second, spec.shape);
    if (!s.ok()) return s;
    const bool is_bias = spec.name.ends_with(".bias");
    (is_bias ? params[spec.op_index].bias : params[spec.op_index].weight) = it->second.data.data();
  }
  for (const auto& entry : inputs.params) {
    const std::string& name = entry.first;  // not a structured binding: the lambda captures it
    const bool known =
        std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& p) { return p.name == name; });
    if (!known) {
      std::vector<std::string> names;
      for (const ParamSpec& p : specs) names.push_back(p.name);
      return absl::InvalidArgumentError(
          fmt::format("unexpected parameter {}: the chain's parameters are {}", name,
                      names.empty() ? "none" : absl::StrJoin(names, ", ")));
    }
  }
  return params;
}

// The samples to evaluate: options.samples, or every index of the batch.
absl::StatusOr<std::vector<int64_t>> CheckSamples(const std::vector<int64_t>& requested,
                                                  int64_t batch) {
  if (requested.empty()) {
    std::vector<int64_t> all(batch);
    for (int64_t n = 0; n < batch; ++n) all[n] = n;
    return all;
  }
  for (size_t i = 0; i < requested.size(); ++i) {
    if (requested[i] < 0 || requested[i] >= batch) {
      return absl::OutOfRangeError(
          fmt::format("sample index {} is out of range: the batch has {} samples (0..{})",
                      requested[i], batch, batch - 1));
    }
    if (i > 0 && requested[i] <= requested[i - 1]) {
      return absl::InvalidArgumentError(
          fmt::format("samples must be strictly ascending: {} follows {} at position {}",
                      requested[i], requested[i - 1], i));
    }
  }
  return requested;
}

}  // namespace

absl::Status CheckTensor(std::string_view what, const HostTensor& t, const Shape& expected) {
  if (t.shape != expected) {
    return absl::InvalidArgumentError(fmt::format("{}: expected shape {}, got {}", what,
                                                  FormatShape(expected), FormatShape(t.shape)));
  }
  if (static_cast<int64_t>(t.data.size()) != NumElements(expected)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: shape {} has {} elements, but its data holds {} values", what,
                    FormatShape(expected), NumElements(expected), t.data.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckedCall> CheckCall(const Chain& chain, const HostInputs& inputs,
                                      const ReferenceOptions& options) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) {
    return absl::Status(s.code(), fmt::format("invalid chain: {}", std::string(s.message())));
  }
  if (absl::Status s = CheckTensor("input x", inputs.x, chain.input); !s.ok()) return s;
  CheckedCall call;
  absl::StatusOr<std::vector<OpParams>> params = CheckParams(chain, inputs);
  if (!params.ok()) return params.status();
  call.params = *std::move(params);
  absl::StatusOr<std::vector<int64_t>> samples = CheckSamples(options.samples, chain.input[0]);
  if (!samples.ok()) return samples.status();
  call.samples = *std::move(samples);
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        fmt::format("threads must be 0 (all cores) or positive, got {}", options.threads));
  }
  for (size_t i = 0; i < chain.ops.size(); ++i) call.shapes.push_back(ShapeAfter(chain, i));

  // Samples in parallel; threads left over (fewer samples than threads) split each convolution.
  const int total_threads =
      options.threads > 0 ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int64_t count = static_cast<int64_t>(call.samples.size());
  call.outer_threads = static_cast<int>(std::min<int64_t>(total_threads, count));
  call.inner_threads = std::max(1, total_threads / std::max(1, call.outer_threads));
  return call;
}

}  // namespace reference_internal

namespace {

using reference_internal::OpParams;
using reference_internal::SampleTensor;

Dims3 SpatialDims(const Shape& shape) { return {shape[2], shape[3], shape[4]}; }

// Runs the chain on sample n of x and returns its output, OutputShape(chain)[1:] in C order.
std::vector<double> EvaluateSample(const Chain& chain, const std::vector<OpParams>& params,
                                   const std::vector<Shape>& shapes, const HostTensor& x, int64_t n,
                                   int threads) {
  SampleTensor t;
  t.channels = chain.input[1];
  t.dhw = SpatialDims(chain.input);
  const int64_t per_sample = t.channels * t.Spatial();
  t.data.assign(x.data.begin() + n * per_sample, x.data.begin() + (n + 1) * per_sample);

  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const Op& op = chain.ops[i];
    const OpParams& p = params[i];
    switch (op.kind) {
      case OpKind::kConv3d:
        t = reference_internal::Conv3d(t, op.conv, p.weight, p.bias, SpatialDims(shapes[i]),
                                       threads);
        break;
      case OpKind::kConvTranspose3d:
        t = reference_internal::ConvTranspose3d(t, op.conv, p.weight, p.bias,
                                                SpatialDims(shapes[i]), threads);
        break;
      case OpKind::kGroupNorm:
        reference_internal::GroupNormInPlace(t, op.groups, op.eps, p.weight, p.bias);
        break;
      case OpKind::kMean:
        return reference_internal::Mean(t, op.dims);  // always the last op
      default:
        reference_internal::ElementwiseInPlace(op, t);
        break;
    }
  }
  return std::move(t.data);
}

}  // namespace

absl::StatusOr<std::vector<double>> RunReference(const Chain& chain, const HostInputs& inputs,
                                                 const ReferenceOptions& options) {
  absl::StatusOr<reference_internal::CheckedCall> call =
      reference_internal::CheckCall(chain, inputs, options);
  if (!call.ok()) return call.status();
  const Shape out_shape = OutputShape(chain);
  const int64_t out_per_sample = NumElements(out_shape) / out_shape[0];

  const int64_t count = static_cast<int64_t>(call->samples.size());
  std::vector<double> result(static_cast<size_t>(count * out_per_sample));
  reference_internal::ParallelFor(count, call->outer_threads, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      std::vector<double> y = EvaluateSample(chain, call->params, call->shapes, inputs.x,
                                             call->samples[s], call->inner_threads);
      std::copy(y.begin(), y.end(), result.begin() + s * out_per_sample);
    }
  });
  return result;
}

ErrorStats CompareToReference(const float* out, const double* ref, int64_t count) {
  ErrorStats stats;
  stats.count = count;
  double ref_max = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (std::isfinite(ref[i])) ref_max = std::max(ref_max, std::abs(ref[i]));
  }
  const double rel_floor = 1e-6 * ref_max;
  const double inf = std::numeric_limits<double>::infinity();
  double diff_sq = 0, ref_sq = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double o = out[i], r = ref[i];
    double diff;
    if (std::isfinite(r)) {
      if (!std::isfinite(o)) {
        ++stats.non_finite;
        diff = inf;
      } else {
        diff = std::abs(o - r);
      }
      ref_sq += r * r;
    } else {
      // A non-finite reference (not produced by RandomInputs data) matches only itself.
      const bool same = (std::isnan(r) && std::isnan(o)) || o == r;
      diff = same ? 0.0 : inf;
    }
    stats.max_abs = std::max(stats.max_abs, diff);
    diff_sq += diff * diff;
    if (diff > 0) {
      const double denom = std::max(std::abs(r), rel_floor);
      const double rel = std::isinf(diff) || denom == 0 ? inf : diff / denom;
      stats.max_rel = std::max(stats.max_rel, rel);
    }
  }
  if (ref_sq > 0) {
    stats.rel_l2 = std::sqrt(diff_sq) / std::sqrt(ref_sq);
  } else {
    stats.rel_l2 = diff_sq > 0 ? inf : 0.0;
  }
  return stats;
}

}  // namespace fusejit
