// reference/backward.cc: RunReferenceBackward, the reference's backward pass (per-sample forward
// re-evaluation keeping each op's input, then the ops' backward in reverse order, once for the
// gradients and once for their magnitudes; the per-op formulas are in ops_backward.cc).
#include <algorithm>
#include <cmath>

#include "fusejit/reference.h"
#include "reference/ops.h"

namespace fusejit {
namespace {

using reference_internal::BackwardMode;
using reference_internal::CheckedCall;
using reference_internal::ParamGradients;
using reference_internal::SampleTensor;

Dims3 SpatialDims(const Shape& shape) { return {shape[2], shape[3], shape[4]}; }

// The backward pass of one sample in `mode` through every op, from the gradient (or magnitude) at
// the chain's output, gy (out_per_sample values): gives the one at x, and each op's parameter
// gradients (or magnitudes) in (*op_grads)[i] (empty for ops without parameters). inputs[i]: op
// i's input in the forward.
SampleTensor BackwardPass(const Chain& chain, const CheckedCall& call,
                          const std::vector<SampleTensor>& inputs, const Shape& out_shape,
                          std::vector<double> gy, BackwardMode mode,
                          std::vector<ParamGradients>* op_grads) {
  const size_t num_ops = chain.ops.size();
  const int threads = call.inner_threads;
  op_grads->assign(num_ops, ParamGradients{});
  SampleTensor g;
  size_t i = num_ops;
  if (num_ops > 0 && chain.ops.back().kind == OpKind::kMean) {
    const SampleTensor& in = inputs.back();
    g = reference_internal::MeanBackward(gy, in.channels, in.dhw, chain.ops.back().dims);
    --i;
  } else {
    g.channels = out_shape[1];
    g.dhw = SpatialDims(out_shape);
    g.data = std::move(gy);
  }
  while (i-- > 0) {
    const Op& op = chain.ops[i];
    const reference_internal::OpParams& p = call.params[i];
    switch (op.kind) {
      case OpKind::kConv3d:
        g = reference_internal::Conv3dBackward(inputs[i], g, op.conv, p.weight, mode, threads,
                                               &(*op_grads)[i]);
        break;
      case OpKind::kConvTranspose3d:
        g = reference_internal::ConvTranspose3dBackward(inputs[i], g, op.conv, p.weight, mode,
                                                        threads, &(*op_grads)[i]);
        break;
      case OpKind::kGroupNorm:
        reference_internal::GroupNormBackwardInPlace(inputs[i], g, op.groups, op.eps, p.weight,
                                                     mode, &(*op_grads)[i]);
        break;
      case OpKind::kMean:
        break;  // unreachable: mean is only ever last, handled above
      default:
        reference_internal::ElementwiseBackwardInPlace(op, inputs[i], mode, g);
        break;
    }
  }
  return g;
}

// Sample n's backward: writes dL/dx of the sample to dx and its magnitude to dx_magnitude (C*D*H*W
// values each) and, for each op, the sample's parameter gradients to (*op_grads)[i] and their
// magnitudes to (*op_magnitudes)[i] (empty for ops without parameters).
void BackwardSample(const Chain& chain, const CheckedCall& call, const HostTensor& x,
                    const HostTensor& grad_y, int64_t n, double* dx, double* dx_magnitude,
                    std::vector<ParamGradients>* op_grads,
                    std::vector<ParamGradients>* op_magnitudes) {
  const size_t num_ops = chain.ops.size();
  const int threads = call.inner_threads;

  // Forward, keeping each op's input (inputs[i]) for its backward.
  SampleTensor t;
  t.channels = chain.input[1];
  t.dhw = SpatialDims(chain.input);
  const int64_t x_per_sample = t.channels * t.Spatial();
  t.data.assign(x.data.begin() + n * x_per_sample, x.data.begin() + (n + 1) * x_per_sample);
  std::vector<SampleTensor> inputs(num_ops);
  for (size_t i = 0; i < num_ops; ++i) {
    const Op& op = chain.ops[i];
    const reference_internal::OpParams& p = call.params[i];
    inputs[i] = t;
    switch (op.kind) {
      case OpKind::kConv3d:
        t = reference_internal::Conv3d(inputs[i], op.conv, p.weight, p.bias,
                                       SpatialDims(call.shapes[i]), threads);
        break;
      case OpKind::kConvTranspose3d:
        t = reference_internal::ConvTranspose3d(inputs[i], op.conv, p.weight, p.bias,
                                                SpatialDims(call.shapes[i]), threads);
        break;
      case OpKind::kGroupNorm:
        reference_internal::GroupNormInPlace(t, op.groups, op.eps, p.weight, p.bias);
        break;
      case OpKind::kMean:
        break;  // always the last op: its backward needs only its input
      default:
        reference_internal::ElementwiseInPlace(op, t);
        break;
    }
  }

  // Backward from sample n's row of grad_y: the gradient, then the magnitude from |grad_y|.
  const Shape& out_shape = grad_y.shape;
  const int64_t out_per_sample = NumElements(out_shape) / out_shape[0];
  const float* gy = grad_y.data.data() + n * out_per_sample;
  std::vector<double> gy_row(gy, gy + out_per_sample), gy_magnitude(out_per_sample);
  for (int64_t k = 0; k < out_per_sample; ++k) gy_magnitude[k] = std::abs(gy_row[k]);
  const SampleTensor g = BackwardPass(chain, call, inputs, out_shape, std::move(gy_row),
                                      BackwardMode::kGradient, op_grads);
  std::copy(g.data.begin(), g.data.end(), dx);
  const SampleTensor m = BackwardPass(chain, call, inputs, out_shape, std::move(gy_magnitude),
                                      BackwardMode::kMagnitude, op_magnitudes);
  std::copy(m.data.begin(), m.data.end(), dx_magnitude);
}

void AddTo(std::vector<double>* total, const std::vector<double>& v) {
  for (size_t k = 0; k < v.size(); ++k) (*total)[k] += v[k];
}

}  // namespace

absl::StatusOr<ReferenceGradients> RunReferenceBackward(const Chain& chain,
                                                        const HostInputs& inputs,
                                                        const HostTensor& grad_y,
                                                        const ReferenceOptions& options) {
  absl::StatusOr<CheckedCall> call = reference_internal::CheckCall(chain, inputs, options);
  if (!call.ok()) return call.status();
  if (absl::Status s = reference_internal::CheckTensor("grad_y", grad_y, OutputShape(chain));
      !s.ok()) {
    return s;
  }

  ReferenceGradients result;
  const int64_t count = static_cast<int64_t>(call->samples.size());
  const int64_t x_per_sample = NumElements(chain.input) / chain.input[0];
  result.x.assign(static_cast<size_t>(count * x_per_sample), 0.0);
  result.x_magnitude.assign(result.x.size(), 0.0);
  // Totals by op index, pointing into result.params and result.param_magnitudes.
  struct Totals {
    std::vector<std::vector<double>*> weight, bias;
  };
  Totals grad_total{std::vector<std::vector<double>*>(chain.ops.size()),
                    std::vector<std::vector<double>*>(chain.ops.size())};
  Totals magnitude_total = grad_total;
  for (const ParamSpec& spec : ChainParams(chain)) {
    const bool bias = spec.name.ends_with(".bias");
    const size_t size = static_cast<size_t>(NumElements(spec.shape));
    std::vector<double>& total = result.params[spec.name];
    total.assign(size, 0.0);
    (bias ? grad_total.bias : grad_total.weight)[spec.op_index] = &total;
    std::vector<double>& magnitude = result.param_magnitudes[spec.name];
    magnitude.assign(size, 0.0);
    (bias ? magnitude_total.bias : magnitude_total.weight)[spec.op_index] = &magnitude;
  }
  // Adds one sample's per-op gradients (or magnitudes) to the totals.
  const auto add = [&](const Totals& totals, const std::vector<ParamGradients>& sample) {
    for (size_t i = 0; i < chain.ops.size(); ++i) {
      if (totals.weight[i] != nullptr) AddTo(totals.weight[i], sample[i].weight);
      if (totals.bias[i] != nullptr) AddTo(totals.bias[i], sample[i].bias);
    }
  };

  // Samples in blocks of outer_threads, one thread each; after each block its samples' parameter
  // gradients are added to the totals in sample order. So every total is
  // ((0 + g[s0]) + g[s1]) + ... whatever the block size (the thread count), and at most one block
  // of per-sample gradients is held at a time.
  const int64_t outer = call->outer_threads;
  for (int64_t block = 0; block < count; block += outer) {
    const int64_t size = std::min(outer, count - block);
    std::vector<std::vector<ParamGradients>> per_sample(size), per_sample_magnitudes(size);
    reference_internal::ParallelFor(size, call->outer_threads, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const int64_t s = block + j;
        BackwardSample(chain, *call, inputs.x, grad_y, call->samples[s],
                       &result.x[s * x_per_sample], &result.x_magnitude[s * x_per_sample],
                       &per_sample[j], &per_sample_magnitudes[j]);
      }
    });
    for (int64_t j = 0; j < size; ++j) {
      add(grad_total, per_sample[j]);
      add(magnitude_total, per_sample_magnitudes[j]);
    }
  }
  return result;
}

}  // namespace fusejit
