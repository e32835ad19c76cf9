// reference/ops.h: the CPU reference's op implementations, forward and backward, one sample at a
// time, and the argument checks its entry points share (internal to reference/; the public entry
// points are in include/fusejit/reference.h).
//
// A sample is a dense [C, D, H, W] tensor of doubles in C order. Parameters are read as the caller
// gave them (float32); every product and sum is taken in double. Each function implements one op
// with PyTorch's semantics and assumes its arguments were validated (shapes agree with the chain).
//
// Thread safety: every function here is reentrant; the convolutions split their output channels
// over `threads` std::threads of their own.
#ifndef FUSEJIT_REFERENCE_OPS_H_
#define FUSEJIT_REFERENCE_OPS_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusejit/chain.h"
#include "fusejit/reference.h"

namespace fusejit::reference_internal {

struct SampleTensor {
  int64_t channels = 0;
  Dims3 dhw = {0, 0, 0};
  std::vector<double> data;  // channels * d * h * w values

  int64_t Spatial() const { return dhw[0] * dhw[1] * dhw[2]; }
};

// Calls fn(begin, end) on disjoint chunks covering [0, count), on up to `threads` threads (the
// calling thread among them). Returns when every chunk is done. fn must not throw.
void ParallelFor(int64_t count, int threads, const std::function<void(int64_t, int64_t)>& fn);

// conv3d: weight [Cout, Cin, kd, kh, kw], bias [Cout] or nullptr; out_dhw from the chain's shape
// rules: floor((in + 2p - dil*(k-1) - 1) / s) + 1 per dimension. Zero padding.
SampleTensor Conv3d(const SampleTensor& in, const ConvAttrs& attrs, const float* weight,
                    const float* bias, const Dims3& out_dhw, int threads);

// conv_transpose3d: weight [Cin, Cout, kd, kh, kw], bias [Cout] or nullptr; out_dhw is
// (in-1)*s - 2p + dil*(k-1) + output_padding + 1 per dimension.
SampleTensor ConvTranspose3d(const SampleTensor& in, const ConvAttrs& attrs, const float* weight,
                             const float* bias, const Dims3& out_dhw, int threads);

// The value of an elementwise op (relu ... clamp) at x. REQUIRES: IsElementwise(op.kind).
double Elementwise(const Op& op, double x);
// Applies an elementwise op to every value of t in place.
void ElementwiseInPlace(const Op& op, SampleTensor& t);

// Affine GroupNorm in place: per group of C/groups channels, biased variance, then
// (x - mean) / sqrt(var + eps) * gamma[c] + beta[c]. gamma and beta have t.channels values.
void GroupNormInPlace(SampleTensor& t, int64_t groups, double eps, const float* gamma,
                      const float* beta);

// mean over dims {2,3,4} (one value per channel) or {1,2,3,4} (one value).
std::vector<double> Mean(const SampleTensor& t, const std::vector<int>& dims);

// ---- Backward, one sample (ops_backward.cc) ----
// Each function takes the op's input as its forward saw it and grad, the gradient of L with respect
// to the op's output, and gives the gradient with respect to the op's input. Gradients of the op's
// parameters, for this sample alone, overwrite *grads. Each value sums its terms in a fixed order,
// whatever `threads` is.
//
// BackwardMode::kMagnitude runs the same backward on magnitudes instead (see
// ReferenceGradients::x_magnitude): grad is then nonnegative, the magnitude of each output
// gradient, and every term of every sum is replaced by its absolute value -- |f'(x)|, |w|, |x|,
// |gamma|, |xhat|, and the terms subtracted in group_norm's backward are added. The result (and
// *grads) bound the sums of |terms| of the gradients, value by value. Same order of summation, so
// just as deterministic; and since rounding is monotone, magnitude >= |gradient| holds exactly in
// floating point wherever the incoming magnitudes bound the incoming gradients.

enum class BackwardMode {
  kGradient,   // the signed gradient
  kMagnitude,  // the sum of the absolute values of its terms
};

struct ParamGradients {
  std::vector<double> weight;  // in the weight's shape; empty where the op has none
  std::vector<double> bias;    // empty where the op has none (conv with bias=false)
};

// conv3d (weight [Cout, Cin, kd, kh, kw]); grad has the output's shape. Input channels are split
// over `threads` (each computes its data gradient and its slice of the weight gradient).
SampleTensor Conv3dBackward(const SampleTensor& in, const SampleTensor& grad,
                            const ConvAttrs& attrs, const float* weight, BackwardMode mode,
                            int threads, ParamGradients* grads);

// conv_transpose3d (weight [Cin, Cout, kd, kh, kw]); grad has the output's shape. Input channels
// are split over `threads`, as for Conv3dBackward.
SampleTensor ConvTranspose3dBackward(const SampleTensor& in, const SampleTensor& grad,
                                     const ConvAttrs& attrs, const float* weight,
                                     BackwardMode mode, int threads, ParamGradients* grads);

// grad *= f'(in) (kMagnitude: |f'(in)|) with f' from codegen/op_table.h's derivative column.
// REQUIRES: IsElementwise(op.kind), grad and in of the same size.
void ElementwiseBackwardInPlace(const Op& op, const SampleTensor& in, BackwardMode mode,
                                SampleTensor& grad);

// Affine GroupNorm (as GroupNormInPlace) on `in`: grad becomes dL/din, through each group's mean and
// biased variance; grads gets dL/dgamma and dL/dbeta (t.channels values each).
void GroupNormBackwardInPlace(const SampleTensor& in, SampleTensor& grad, int64_t groups,
                              double eps, const float* gamma, BackwardMode mode,
                              ParamGradients* grads);

// mean over `dims` of a [channels, dhw] input: grad (one value per channel, or one value) spread
// over the values it averaged, divided by their count. Its terms are all positive multiples of
// grad, so the magnitude is MeanBackward of |grad| (no mode needed).
SampleTensor MeanBackward(const std::vector<double>& grad, int64_t channels, const Dims3& dhw,
                          const std::vector<int>& dims);

// ---- Argument checks shared by RunReference and RunReferenceBackward (reference.cc) ----

// An InvalidArgument error naming `what` unless t has shape `expected` and as many values.
absl::Status CheckTensor(std::string_view what, const HostTensor& t, const Shape& expected);

// The weight and bias of an op (nullptr where it has none), after validation.
struct OpParams {
  const float* weight = nullptr;
  const float* bias = nullptr;
};

// A call's validated arguments.
struct CheckedCall {
  std::vector<OpParams> params;   // by op index
  std::vector<int64_t> samples;   // options.samples, or every index of the batch
  std::vector<Shape> shapes;      // ShapeAfter(chain, i) for every op i
  int outer_threads = 1;          // threads over samples: min(threads, samples)
  int inner_threads = 1;          // threads within one sample (the convolutions' channels)
};

// Checks, in this order: the chain (ValidateChain), x's shape, every parameter (missing,
// wrongly shaped, unexpected), options.samples (in range, strictly ascending) and options.threads
// (>= 0). The errors are RunReference's, documented in include/fusejit/reference.h.
absl::StatusOr<CheckedCall> CheckCall(const Chain& chain, const HostInputs& inputs,
                                      const ReferenceOptions& options);

}  // namespace fusejit::reference_internal

#endif  // FUSEJIT_REFERENCE_OPS_H_
