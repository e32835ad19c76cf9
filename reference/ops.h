// reference/ops.h: the CPU reference's op implementations, one sample at a time (internal to
// reference/; the public entry points are in include/fusejit/reference.h).
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
#include <vector>

#include "fusejit/chain.h"

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

}  // namespace fusejit::reference_internal

#endif  // FUSEJIT_REFERENCE_OPS_H_
