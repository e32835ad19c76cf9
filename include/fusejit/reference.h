// fusejit/reference.h: host tensors, random test data and the CPU reference.
//
// The reference evaluates a chain op by op in double precision, with PyTorch's semantics. It is the
// ground truth for the tests, the CLI's --check and the examples. It is written for clarity first
// and speed second (multi-threaded over samples), and can evaluate a subset of the batch, since
// samples are independent: that keeps checks of large seed shapes affordable.
#ifndef FUSEJIT_REFERENCE_H_
#define FUSEJIT_REFERENCE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/chain.h"

namespace fusejit {

// A dense float32 host tensor, C order.
struct HostTensor {
  Shape shape;
  std::vector<float> data;
};

// Host copies of a chain's input and every parameter, by name.
struct HostInputs {
  HostTensor x;
  std::map<std::string, HostTensor> params;
};

// Random data for a chain, deterministic in `seed`: x uniform in [0,1) (like torch.rand); conv
// weights and biases uniform in +-1/sqrt(fan_in) (PyTorch's default init); GroupNorm weight uniform
// in [0.5,1.5] and bias in [-0.5,0.5] (never the 1/0 defaults, which hide bugs).
// Exact algorithm (added for reproduction outside C++, e.g. in Python): each tensor ("x",
// "0.weight", ...) has its own std::mt19937_64 seeded with seed ^ FNV-1a-64(name), so adding a
// parameter leaves the others unchanged; each value, in C order, is
// float(lo + (hi - lo) * ((r >> 11) * 2^-53)), stepped down to the next float if rounding reached
// hi. Conv fan_in is weight.shape[1] * kd * kh * kw, as PyTorch computes it. For a bf16 or f16
// chain each value is then rounded to the dtype (RoundToDType).
// REQUIRES: chain is valid.
HostInputs RandomInputs(const Chain& chain, uint64_t seed);

struct ReferenceOptions {
  // Batch indices to evaluate, ascending; empty means all. The result then has shape
  // [samples.size(), ...OutputShape(chain)[1:]].
  std::vector<int64_t> samples;
  int threads = 0;  // 0: hardware concurrency
};

// Evaluates the chain in double precision. Errors: missing or wrongly shaped tensors (naming the
// parameter and the expected shape), sample index out of range.
// (Added:) also unexpected parameters, samples not strictly ascending, threads < 0 and an invalid
// chain. Each output value sums its terms in a fixed order, so the result is bit-identical for
// every thread count and sample subset. Threads go to samples first; when there are fewer samples
// than threads, the convolutions of each sample split their output channels among the rest.
absl::StatusOr<std::vector<double>> RunReference(const Chain& chain, const HostInputs& inputs,
                                                 const ReferenceOptions& options = {});

// The backward pass of the reference: gradients of the scalar L = sum(y * grad_y) (grad_y: the
// upstream gradient, OutputShape(chain)) with respect to x and every parameter, in double precision
// with PyTorch's backward formulas (kinks as codegen/op_table.h's derivative column: relu'(0)=0,
// leaky_relu'(0)=slope, clamp'=1 on [min,max] including bounds, hardtanh'=1 only on (min,max),
// hardswish' at +-3 as PyTorch's hardswish_backward as of PyTorch 2.7+: 0 at and below -3, x/3+0.5
// on (-3,3), 1 at and above 3). The forward pass is re-evaluated per sample in double (as
// RunReference does), keeping each op's input for its backward.
struct ReferenceGradients {
  std::vector<double> x;  // dL/dx: the input's shape, or [samples.size(), ...] for a subset
  // dL/dparam for every ChainParams() entry, by name, in the parameter's shape. With a sample
  // subset: summed over those samples only.
  std::map<std::string, std::vector<double>> params;

  // The MAGNITUDE of each gradient value: the sum of the absolute values of the terms whose signed
  // sum is that value, so always >= |gradient|. A floating-point computation of a gradient errs by
  // up to about c * eps * magnitude (eps: its precision's epsilon; c grows with the chain's depth
  // and the sums' lengths), not by a fraction of |gradient|. Where the terms cancel, |gradient| is
  // ~0 while the magnitude keeps the usual gradient scale -- e.g. every gradient but beta's when
  // group_norm with one channel per group is followed by a mean (the output does not depend on x),
  // or a conv bias's right before group_norm -- and an error relative to |gradient| means nothing.
  // So compare a float32 gradient `got` with the reference `ref` (x, or a parameter's) as
  //   max_i |got_i - ref_i| / max_i magnitude_i <= tol   (one scale per tensor), or
  //   |got_i - ref_i| <= tol * magnitude_i for every i    (elementwise, stricter),
  // with tol a multiple of float32's epsilon (~1.2e-7) that allows for the chain's depth.
  // Computed by propagating magnitudes backward alongside the gradients, each op's backward taken
  // with absolute values, from m = |grad_y| at the output: elementwise m_in = m_out * |f'(x)|;
  // mean spreads m / count; group_norm m_x = rstd * (|gamma| m + mean_g(|gamma| m) +
  // |xhat| mean_g(|gamma| m |xhat|)), gamma: sum of m |xhat|, beta: sum of m; convolutions: the
  // data backward with |w| and m, weight: sum of m * |x|, bias: sum of m. (magnitude >= |gradient|
  // holds exactly in double too, value by value.) Same shapes, sample subsets (parameters: summed
  // over the subset's samples) and determinism as x and params.
  std::vector<double> x_magnitude;
  std::map<std::string, std::vector<double>> param_magnitudes;
};
// grad_y always has the full OutputShape(chain); with options.samples only those samples' rows are
// read. Errors: those of RunReference (the same checks, in the same order), then a wrongly shaped
// grad_y (naming the expected and the given shape).
// Deterministic: every value (gradient or magnitude) sums its terms in a fixed order, so the result
// is bit-identical for every thread count. Threads go to samples first (leftover threads split each
// convolution's channels); parameter gradients (and magnitudes) are computed per sample, then
// summed over the samples in sample order (so a subset gives exactly the sum over its samples, in
// ascending order).
absl::StatusOr<ReferenceGradients> RunReferenceBackward(const Chain& chain,
                                                        const HostInputs& inputs,
                                                        const HostTensor& grad_y,
                                                        const ReferenceOptions& options = {});

// Comparison of a float32 result with a double reference.
struct ErrorStats {
  double max_abs = 0;       // max |out - ref|
  double rel_l2 = 0;        // ||out - ref||_2 / ||ref||_2
  double max_rel = 0;       // max |out - ref| / max(|ref|, 1e-6 * max|ref|) -- informational
  int64_t non_finite = 0;   // NaN/Inf in out where ref is finite (unwritten or broken outputs)
  int64_t count = 0;
  // (Added:) a non-finite out where ref is finite makes max_abs, max_rel and rel_l2 infinite, so a
  // tolerance check on any one of them fails. Where ref itself is not finite, out matches only the
  // same value (NaN for NaN); ||ref|| = 0 gives rel_l2 0 if out equals ref, else infinity.
};
ErrorStats CompareToReference(const float* out, const double* ref, int64_t count);

}  // namespace fusejit

#endif  // FUSEJIT_REFERENCE_H_
