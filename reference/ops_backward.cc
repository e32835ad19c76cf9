// reference/ops_backward.cc: the backward of each op of the CPU reference, one sample at a time, in
// double precision with PyTorch's formulas (declared in reference/ops.h).
//
// Convolutions: a tap (kd, kh, kw) links index a of one grid to index b = a * s - p + k * dil of the
// other along each dimension, as in the forward (reference/conv.cc): for conv3d a is the output and
// b the input (output o reads input o * s - p + k * dil); for conv_transpose3d a is the input and b
// the output (input i writes output i * s - p + k * dil; output_padding only makes the output
// grid larger). Over those pairs, with w the tap's weight and g the output gradient:
//   conv3d:            dx[ci][b] += w[co][ci][k] * g[co][a],   dw[co][ci][k] += g[co][a] * x[ci][b]
//   conv_transpose3d:  dx[ci][a] += w[ci][co][k] * g[co][b],   dw[ci][co][k] += x[ci][a] * g[co][b]
//   both:              db[co] = sum of g[co]
// Each input channel ci is one unit of work: its data gradient and every weight gradient with that
// ci, summed over (co, tap, pairs in C order). So the order of every sum is fixed, whatever the
// thread count.
//
// BackwardMode::kMagnitude (reference/ops.h) reads every factor through Term() below: the same
// loops with |w|, |x|, |f'(x)|, |gamma| and |xhat|, and group_norm's subtracted terms added.
#include <algorithm>
#include <cmath>

#include "codegen/op_table.h"
#include "reference/ops.h"

namespace fusejit::reference_internal {
namespace {

// A factor of a backward's term: itself, or its absolute value in magnitude mode.
double Term(BackwardMode mode, double v) {
  return mode == BackwardMode::kMagnitude ? std::abs(v) : v;
}

// Calls fn(a, b) (flat spatial indices) for every pair linked by tap k with a inside a_dhw and b
// inside b_dhw: b = a * stride - padding + k * dilation along each dimension. In C order of a.
template <typename Fn>
void ForEachTapPair(const Dims3& a_dhw, const Dims3& b_dhw, const ConvAttrs& c, const Dims3& k,
                    Fn&& fn) {
  for (int64_t ad = 0; ad < a_dhw[0]; ++ad) {
    const int64_t bd = ad * c.stride[0] - c.padding[0] + k[0] * c.dilation[0];
    if (bd < 0 || bd >= b_dhw[0]) continue;
    for (int64_t ah = 0; ah < a_dhw[1]; ++ah) {
      const int64_t bh = ah * c.stride[1] - c.padding[1] + k[1] * c.dilation[1];
      if (bh < 0 || bh >= b_dhw[1]) continue;
      const int64_t a_row = (ad * a_dhw[1] + ah) * a_dhw[2];
      const int64_t b_row = (bd * b_dhw[1] + bh) * b_dhw[2];
      for (int64_t aw = 0; aw < a_dhw[2]; ++aw) {
        const int64_t bw = aw * c.stride[2] - c.padding[2] + k[2] * c.dilation[2];
        if (bw < 0 || bw >= b_dhw[2]) continue;
        fn(a_row + aw, b_row + bw);
      }
    }
  }
}

SampleTensor Zeros(int64_t channels, const Dims3& dhw) {
  SampleTensor t;
  t.channels = channels;
  t.dhw = dhw;
  t.data.assign(static_cast<size_t>(channels * dhw[0] * dhw[1] * dhw[2]), 0.0);
  return t;
}

// db[co] = sum of grad's channel co, or nothing without a bias.
std::vector<double> BiasGradient(const SampleTensor& grad, bool bias) {
  if (!bias) return {};
  std::vector<double> db(grad.channels, 0.0);
  const int64_t spatial = grad.Spatial();
  for (int64_t co = 0; co < grad.channels; ++co) {
    double sum = 0;
    for (int64_t i = 0; i < spatial; ++i) sum += grad.data[co * spatial + i];
    db[co] = sum;
  }
  return db;
}

// Both convolutions (see the file comment). `transposed`: weight [Cin, Cout, k], the input is the
// tap's `a` grid; else weight [Cout, Cin, k], the input is the `b` grid. (In magnitude mode grad is
// nonnegative, so the bias's sum needs no change.)
SampleTensor ConvBackward(const SampleTensor& in, const SampleTensor& grad, const ConvAttrs& c,
                          const float* weight, bool transposed, BackwardMode mode, int threads,
                          ParamGradients* grads) {
  const int64_t cin = in.channels, cout = grad.channels;
  const int64_t KD = c.kernel[0], KH = c.kernel[1], KW = c.kernel[2];
  const int64_t taps = KD * KH * KW;
  const int64_t in_spatial = in.Spatial(), out_spatial = grad.Spatial();
  SampleTensor dx = Zeros(cin, in.dhw);
  grads->weight.assign(static_cast<size_t>(cin * cout * taps), 0.0);
  grads->bias = BiasGradient(grad, c.bias);
  // The input as the weight gradient's terms read it: x, or |x| in magnitude mode.
  std::vector<double> in_terms = in.data;
  for (double& v : in_terms) v = Term(mode, v);

  ParallelFor(cin, threads, [&](int64_t ci_begin, int64_t ci_end) {
    for (int64_t ci = ci_begin; ci < ci_end; ++ci) {
      const double* x = &in_terms[ci * in_spatial];
      double* dxc = &dx.data[ci * in_spatial];
      for (int64_t co = 0; co < cout; ++co) {
        const double* g = &grad.data[co * out_spatial];
        const int64_t w_base = (transposed ? ci * cout + co : co * cin + ci) * taps;
        for (int64_t kd = 0; kd < KD; ++kd) {
          for (int64_t kh = 0; kh < KH; ++kh) {
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t tap = (kd * KH + kh) * KW + kw;
              const double w = Term(mode, weight[w_base + tap]);
              double dw = 0;
              if (transposed) {  // a: input, b: output
                ForEachTapPair(in.dhw, grad.dhw, c, {kd, kh, kw}, [&](int64_t a, int64_t b) {
                  dxc[a] += w * g[b];
                  dw += x[a] * g[b];
                });
              } else {  // a: output, b: input
                ForEachTapPair(grad.dhw, in.dhw, c, {kd, kh, kw}, [&](int64_t a, int64_t b) {
                  dxc[b] += w * g[a];
                  dw += g[a] * x[b];
                });
              }
              grads->weight[w_base + tap] = dw;
            }
          }
        }
      }
    }
  });
  return dx;
}

}  // namespace

SampleTensor Conv3dBackward(const SampleTensor& in, const SampleTensor& grad,
                            const ConvAttrs& attrs, const float* weight, BackwardMode mode,
                            int threads, ParamGradients* grads) {
  return ConvBackward(in, grad, attrs, weight, /*transposed=*/false, mode, threads, grads);
}

SampleTensor ConvTranspose3dBackward(const SampleTensor& in, const SampleTensor& grad,
                                     const ConvAttrs& attrs, const float* weight,
                                     BackwardMode mode, int threads, ParamGradients* grads) {
  return ConvBackward(in, grad, attrs, weight, /*transposed=*/true, mode, threads, grads);
}

void ElementwiseBackwardInPlace(const Op& op, const SampleTensor& in, BackwardMode mode,
                                SampleTensor& grad) {
  double (*derivative)(const Op&, double) = Describe(op.kind).derivative;
  for (size_t i = 0; i < grad.data.size(); ++i) {
    grad.data[i] *= Term(mode, derivative(op, in.data[i]));
  }
}

// With xhat = (x - mean) * rstd and y = xhat * gamma + beta over a group of n values:
//   dbeta[c] = sum_c dy,  dgamma[c] = sum_c dy * xhat,  dxhat = dy * gamma,
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
// (the last two terms: through the mean, and through the biased variance). In magnitude mode, with
// m the output's magnitude: dbeta = sum_c m, dgamma = sum_c m * |xhat|, and
//   dx = rstd * (|gamma| m + mean(|gamma| m) + |xhat| * mean(|gamma| m |xhat|)).
void GroupNormBackwardInPlace(const SampleTensor& in, SampleTensor& grad, int64_t groups,
                              double eps, const float* gamma, BackwardMode mode,
                              ParamGradients* grads) {
  const int64_t channels_per_group = in.channels / groups;
  const int64_t spatial = in.Spatial();
  const int64_t group_size = channels_per_group * spatial;
  const double n = static_cast<double>(group_size);
  grads->weight.assign(in.channels, 0.0);
  grads->bias.assign(in.channels, 0.0);
  for (int64_t g = 0; g < groups; ++g) {
    const double* x = &in.data[g * group_size];
    double* dy = &grad.data[g * group_size];
    // The forward's statistics, as GroupNormInPlace computes them (two passes).
    double sum = 0;
    for (int64_t i = 0; i < group_size; ++i) sum += x[i];
    const double mean = sum / n;
    double sq = 0;
    for (int64_t i = 0; i < group_size; ++i) sq += (x[i] - mean) * (x[i] - mean);
    const double rstd = 1.0 / std::sqrt(sq / n + eps);

    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t cg = 0; cg < channels_per_group; ++cg) {
      const int64_t c = g * channels_per_group + cg;
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t i = cg * spatial; i < (cg + 1) * spatial; ++i) {
        sum_dy += dy[i];
        sum_dy_xhat += dy[i] * Term(mode, (x[i] - mean) * rstd);
      }
      grads->bias[c] = sum_dy;
      grads->weight[c] = sum_dy_xhat;
      sum_dxhat += Term(mode, gamma[c]) * sum_dy;
      sum_dxhat_xhat += Term(mode, gamma[c]) * sum_dy_xhat;
    }
    const double mean_dxhat = sum_dxhat / n, mean_dxhat_xhat = sum_dxhat_xhat / n;
    for (int64_t cg = 0; cg < channels_per_group; ++cg) {
      const double gamma_c = Term(mode, gamma[g * channels_per_group + cg]);
      for (int64_t i = cg * spatial; i < (cg + 1) * spatial; ++i) {
        const double xhat = Term(mode, (x[i] - mean) * rstd);
        // a - b - c for the gradient; a + b + c for the magnitude (b, c >= 0 then).
        dy[i] = mode == BackwardMode::kMagnitude
                    ? rstd * (dy[i] * gamma_c + mean_dxhat + xhat * mean_dxhat_xhat)
                    : rstd * (dy[i] * gamma_c - mean_dxhat - xhat * mean_dxhat_xhat);
      }
    }
  }
}

SampleTensor MeanBackward(const std::vector<double>& grad, int64_t channels, const Dims3& dhw,
                          const std::vector<int>& dims) {
  SampleTensor dx = Zeros(channels, dhw);
  const int64_t spatial = dx.Spatial();
  if (dims.size() == 4) {  // dims {1,2,3,4}: one value over everything
    std::fill(dx.data.begin(), dx.data.end(), grad[0] / static_cast<double>(dx.data.size()));
    return dx;
  }
  for (int64_t c = 0; c < channels; ++c) {  // dims {2,3,4}: one value per channel
    std::fill(dx.data.begin() + c * spatial, dx.data.begin() + (c + 1) * spatial,
              grad[c] / static_cast<double>(spatial));
  }
  return dx;
}

}  // namespace fusejit::reference_internal
