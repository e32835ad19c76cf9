// reference/backward.cc: RunReferenceBackward, the reference's backward pass (per-sample forward
// re-evaluation keeping each op's input, then the ops' backward in reverse order; the per-op
// formulas are in ops_backward.cc).
#include <algorithm>

#include "fusejit/reference.h"
#include "reference/ops.h"

namespace fusejit {
namespace {

using reference_internal::CheckedCall;
using reference_internal::ParamGradients;
using reference_internal::SampleTensor;

Dims3 SpatialDims(const Shape& shape) { return {shape[2], shape[3], shape[4]}; }

// Sample n's backward: writes dL/dx of the sample to dx (C*D*H*W values) and, for each op, the
// sample's parameter gradients to (*op_grads)[i] (empty for ops without parameters).
void BackwardSample(const Chain& chain, const CheckedCall& call, const HostTensor& x,
                    const HostTensor& grad_y, int64_t n, double* dx,
                    std::vector<ParamGradients>* op_grads) {
  const size_t num_ops = chain.ops.size();
  const int threads = call.inner_threads;
  op_grads->assign(num_ops, ParamGradients{});

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

  // Backward, from sample n's row of grad_y.
  const Shape& out_shape = grad_y.shape;
  const int64_t out_per_sample = NumElements(out_shape) / out_shape[0];
  const float* gy = grad_y.data.data() + n * out_per_sample;
  SampleTensor g;
  size_t i = num_ops;
  if (num_ops > 0 && chain.ops.back().kind == OpKind::kMean) {
    const SampleTensor& in = inputs.back();
    g = reference_internal::MeanBackward(std::vector<double>(gy, gy + out_per_sample), in.channels,
                                         in.dhw, chain.ops.back().dims);
    --i;
  } else {
    g.channels = t.channels;
    g.dhw = t.dhw;
    g.data.assign(gy, gy + out_per_sample);
  }
  while (i-- > 0) {
    const Op& op = chain.ops[i];
    const reference_internal::OpParams& p = call.params[i];
    switch (op.kind) {
      case OpKind::kConv3d:
        g = reference_internal::Conv3dBackward(inputs[i], g, op.conv, p.weight, threads,
                                               &(*op_grads)[i]);
        break;
      case OpKind::kConvTranspose3d:
        g = reference_internal::ConvTranspose3dBackward(inputs[i], g, op.conv, p.weight, threads,
                                                        &(*op_grads)[i]);
        break;
      case OpKind::kGroupNorm:
        reference_internal::GroupNormBackwardInPlace(inputs[i], g, op.groups, op.eps, p.weight,
                                                     &(*op_grads)[i]);
        break;
      case OpKind::kMean:
        break;  // unreachable: mean is only ever last, handled above
      default:
        reference_internal::ElementwiseBackwardInPlace(op, inputs[i], g);
        break;
    }
  }
  std::copy(g.data.begin(), g.data.end(), dx);
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
  // Totals by op index, pointing into result.params.
  std::vector<std::vector<double>*> weight_total(chain.ops.size()), bias_total(chain.ops.size());
  for (const ParamSpec& spec : ChainParams(chain)) {
    std::vector<double>& total = result.params[spec.name];
    total.assign(static_cast<size_t>(NumElements(spec.shape)), 0.0);
    (spec.name.ends_with(".bias") ? bias_total : weight_total)[spec.op_index] = &total;
  }

  // Samples in blocks of outer_threads, one thread each; after each block its samples' parameter
  // gradients are added to the totals in sample order. So every total is
  // ((0 + g[s0]) + g[s1]) + ... whatever the block size (the thread count), and at most one block
  // of per-sample gradients is held at a time.
  const int64_t outer = call->outer_threads;
  for (int64_t block = 0; block < count; block += outer) {
    const int64_t size = std::min(outer, count - block);
    std::vector<std::vector<ParamGradients>> per_sample(size);
    reference_internal::ParallelFor(size, call->outer_threads, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const int64_t s = block + j;
        BackwardSample(chain, *call, inputs.x, grad_y, call->samples[s],
                       &result.x[s * x_per_sample], &per_sample[j]);
      }
    });
    for (int64_t j = 0; j < size; ++j) {
      for (size_t i = 0; i < chain.ops.size(); ++i) {
        if (weight_total[i] != nullptr) AddTo(weight_total[i], per_sample[j][i].weight);
        if (bias_total[i] != nullptr) AddTo(bias_total[i], per_sample[j][i].bias);
      }
    }
  }
  return result;
}

}  // namespace fusejit
