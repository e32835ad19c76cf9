// Tests of the CPU reference (reference/): every op against hand-computed numbers, the
// convolutions against naive direct implementations on random data, RandomInputs, sample subsets,
// threads, input validation and CompareToReference.
#include "fusejit/reference.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace fusejit {
namespace {

using ::testing::HasSubstr;

HostTensor Tensor(Shape shape, std::vector<float> data) {
  return {std::move(shape), std::move(data)};
}

std::vector<double> Evaluate(const Chain& chain, const HostInputs& inputs,
                             const ReferenceOptions& options = {}) {
  absl::StatusOr<std::vector<double>> y = RunReference(chain, inputs, options);
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : std::vector<double>{};
}

// A chain of one op on x, with x and the op's parameters given by hand.
std::vector<double> RunOne(const Shape& x_shape, std::vector<float> x, const Op& op,
                           std::map<std::string, HostTensor> params = {}) {
  const Chain chain{x_shape, {op}};
  return Evaluate(chain, HostInputs{Tensor(x_shape, std::move(x)), std::move(params)});
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at index " << i;
}

// ---- conv3d, hand-computed ----

TEST(ReferenceConv3d, TwoByTwoKernelWithBias) {
  // x = [[1,2,3],[4,5,6]], w = [[1,2],[3,4]]: 1+4+12+20 = 37 and 2+6+15+24 = 47, plus 0.5.
  const std::vector<double> y =
      RunOne({1, 1, 1, 2, 3}, {1, 2, 3, 4, 5, 6}, Conv3d(1, {1, 2, 2}),
             {{"0.weight", Tensor({1, 1, 1, 2, 2}, {1, 2, 3, 4})}, {"0.bias", Tensor({1}, {0.5})}});
  ExpectNear(y, {37.5, 47.5}, 0);
}

TEST(ReferenceConv3d, ChannelsUseWeightLayoutCoutCin) {
  // x = [2,3] (two channels), w[co][ci] = [[1,2],[3,4]], bias [10,20]: 2+6+10, 6+12+20.
  const std::vector<double> y = RunOne(
      {1, 2, 1, 1, 1}, {2, 3}, Conv3d(2, {1, 1, 1}),
      {{"0.weight", Tensor({2, 2, 1, 1, 1}, {1, 2, 3, 4})}, {"0.bias", Tensor({2}, {10, 20})}});
  ExpectNear(y, {18, 38}, 0);
}

// Stride 2, padding 1, dilation 2 along one axis at a time: x = [1,2,3,4,5], w = [1,10,100].
// out size = floor((5 + 2 - 2*2 - 1) / 2) + 1 = 2; output o reads x[2o - 1 + 2k] (0 outside):
// o=0: x[-1], x[1], x[3] = 0 + 2*10 + 4*100 = 420; o=1: x[1], x[3], x[5] = 2 + 40 + 0 = 42.
TEST(ReferenceConv3d, StridePaddingDilationAlongEachAxis) {
  for (int axis = 0; axis < 3; ++axis) {
    Shape x_shape = {1, 1, 1, 1, 1}, w_shape = {1, 1, 1, 1, 1};
    Dims3 k = {1, 1, 1}, stride = {1, 1, 1}, padding = {0, 0, 0}, dilation = {1, 1, 1};
    x_shape[2 + axis] = 5;
    w_shape[2 + axis] = 3;
    k[axis] = 3;
    stride[axis] = 2;
    padding[axis] = 1;
    dilation[axis] = 2;
    const Op op = Conv3d(1, k, stride, padding, dilation, /*bias=*/false);
    EXPECT_EQ(OutputShape(Chain{x_shape, {op}})[2 + axis], 2);
    const std::vector<double> y =
        RunOne(x_shape, {1, 2, 3, 4, 5}, op, {{"0.weight", Tensor(w_shape, {1, 10, 100})}});
    SCOPED_TRACE(axis);
    ExpectNear(y, {420, 42}, 0);
  }
}

TEST(ReferenceConv3d, FullThreeDimensionalPadding) {
  // x = 1..8 on 2x2x2, w = 1..8 on 2x2x2, padding 1: 3x3x3 outputs.
  const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<double> y =
      RunOne({1, 1, 2, 2, 2}, v, Conv3d(1, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, false),
             {{"0.weight", Tensor({1, 1, 2, 2, 2}, v)}});
  ASSERT_EQ(y.size(), 27u);
  EXPECT_EQ(y[0], 1 * 8);          // (0,0,0): x[0,0,0] * w[1,1,1]
  EXPECT_EQ(y[1], 1 * 7 + 2 * 8);  // (0,0,1): x[0,0,0]*w[1,1,0] + x[0,0,1]*w[1,1,1]
  EXPECT_EQ(y[13], 204);           // centre: sum of i*i for i = 1..8
  EXPECT_EQ(y[26], 8 * 1);         // (2,2,2): x[1,1,1] * w[0,0,0]
}

// ---- conv_transpose3d, hand-computed ----

// x = [1,2], w = [1,10,100] along w; output o = 2i - p + k receives x[i] * w[k].
TEST(ReferenceConvTranspose3d, StrideTwoScatter) {
  const std::map<std::string, HostTensor> w = {{"0.weight", Tensor({1, 1, 1, 1, 3}, {1, 10, 100})}};
  // No padding: (2-1)*2 + 3 = 5 outputs: [1, 10, 100+2, 20, 200].
  ExpectNear(
      RunOne({1, 1, 1, 1, 2}, {1, 2},
             ConvTranspose3d(1, {1, 1, 3}, {1, 1, 2}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, false), w),
      {1, 10, 102, 20, 200}, 0);
  // Padding 1 drops one output at each end: 3 outputs.
  ExpectNear(
      RunOne({1, 1, 1, 1, 2}, {1, 2},
             ConvTranspose3d(1, {1, 1, 3}, {1, 1, 2}, {0, 0, 1}, {0, 0, 0}, {1, 1, 1}, false), w),
      {10, 102, 20}, 0);
  // Padding 1 and output_padding 1: the last one comes back.
  ExpectNear(
      RunOne({1, 1, 1, 1, 2}, {1, 2},
             ConvTranspose3d(1, {1, 1, 3}, {1, 1, 2}, {0, 0, 1}, {0, 0, 1}, {1, 1, 1}, false), w),
      {10, 102, 20, 200}, 0);
}

TEST(ReferenceConvTranspose3d, DilationAndBias) {
  // Dilation 2, stride 1: o = i + 2k, (2-1) + 2*2 + 1 = 6 outputs, plus bias 0.5.
  const std::vector<double> y =
      RunOne({1, 1, 1, 1, 2}, {1, 2},
             ConvTranspose3d(1, {1, 1, 3}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 2}),
             {{"0.weight", Tensor({1, 1, 1, 1, 3}, {1, 10, 100})}, {"0.bias", Tensor({1}, {0.5})}});
  ExpectNear(y, {1.5, 2.5, 10.5, 20.5, 100.5, 200.5}, 0);
}

TEST(ReferenceConvTranspose3d, ChannelsUseWeightLayoutCinCout) {
  // x = [2,3], w[ci][co] = [[1,2],[3,4]], bias [10,20]: 2*1+3*3+10 = 21, 2*2+3*4+20 = 36.
  const std::vector<double> y = RunOne(
      {1, 2, 1, 1, 1}, {2, 3}, ConvTranspose3d(2, {1, 1, 1}),
      {{"0.weight", Tensor({2, 2, 1, 1, 1}, {1, 2, 3, 4})}, {"0.bias", Tensor({2}, {10, 20})}});
  ExpectNear(y, {21, 36}, 0);
}

// ---- convolutions against naive direct implementations on random data ----

int64_t At(const Shape& s, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) {
  return (((n * s[1] + c) * s[2] + d) * s[3] + h) * s[4] + w;
}

// Both naive versions loop over every (input or output position, tap) and test bounds directly.
std::vector<double> NaiveConv(const Chain& chain, const HostInputs& in, Shape* out_shape) {
  const Op& op = chain.ops[0];
  const ConvAttrs& a = op.conv;
  const Shape& xs = chain.input;
  const bool transposed = op.kind == OpKind::kConvTranspose3d;
  Shape ys = {xs[0], a.out_channels, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const int64_t in = xs[2 + i], k = a.kernel[i], s = a.stride[i], p = a.padding[i],
                  dil = a.dilation[i];
    ys[2 + i] = transposed ? (in - 1) * s - 2 * p + dil * (k - 1) + a.output_padding[i] + 1
                           : (in + 2 * p - dil * (k - 1) - 1) / s + 1;
  }
  *out_shape = ys;
  const std::vector<float>& w = in.params.at("0.weight").data;
  std::vector<double> y(NumElements(ys), 0.0);
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t co = 0; co < ys[1]; ++co)
      for (int64_t ci = 0; ci < xs[1]; ++ci)
        for (int64_t kd = 0; kd < a.kernel[0]; ++kd)
          for (int64_t kh = 0; kh < a.kernel[1]; ++kh)
            for (int64_t kw = 0; kw < a.kernel[2]; ++kw) {
              const int64_t widx =
                  (((transposed ? ci * ys[1] + co : co * xs[1] + ci) * a.kernel[0] + kd) *
                       a.kernel[1] +
                   kh) *
                      a.kernel[2] +
                  kw;
              if (!transposed) {  // gather: out position reads in = o*s - p + k*dil
                for (int64_t od = 0; od < ys[2]; ++od)
                  for (int64_t oh = 0; oh < ys[3]; ++oh)
                    for (int64_t ow = 0; ow < ys[4]; ++ow) {
                      const int64_t id = od * a.stride[0] - a.padding[0] + kd * a.dilation[0];
                      const int64_t ih = oh * a.stride[1] - a.padding[1] + kh * a.dilation[1];
                      const int64_t iw = ow * a.stride[2] - a.padding[2] + kw * a.dilation[2];
                      if (id < 0 || id >= xs[2] || ih < 0 || ih >= xs[3] || iw < 0 || iw >= xs[4])
                        continue;
                      y[At(ys, n, co, od, oh, ow)] +=
                          double(w[widx]) * in.x.data[At(xs, n, ci, id, ih, iw)];
                    }
              } else {  // scatter: in position writes out = i*s - p + k*dil
                for (int64_t id = 0; id < xs[2]; ++id)
                  for (int64_t ih = 0; ih < xs[3]; ++ih)
                    for (int64_t iw = 0; iw < xs[4]; ++iw) {
                      const int64_t od = id * a.stride[0] - a.padding[0] + kd * a.dilation[0];
                      const int64_t oh = ih * a.stride[1] - a.padding[1] + kh * a.dilation[1];
                      const int64_t ow = iw * a.stride[2] - a.padding[2] + kw * a.dilation[2];
                      if (od < 0 || od >= ys[2] || oh < 0 || oh >= ys[3] || ow < 0 || ow >= ys[4])
                        continue;
                      y[At(ys, n, co, od, oh, ow)] +=
                          double(w[widx]) * in.x.data[At(xs, n, ci, id, ih, iw)];
                    }
              }
            }
  if (a.bias) {
    const std::vector<float>& b = in.params.at("0.bias").data;
    const int64_t spatial = ys[2] * ys[3] * ys[4];
    for (size_t i = 0; i < y.size(); ++i) y[i] += b[(i / spatial) % ys[1]];
  }
  return y;
}

void ExpectMatchesNaive(const Chain& chain) {
  SCOPED_TRACE(FormatChain(chain));
  ASSERT_TRUE(ValidateChain(chain).ok()) << ValidateChain(chain);
  const HostInputs in = RandomInputs(chain, 7);
  Shape naive_shape;
  const std::vector<double> want = NaiveConv(chain, in, &naive_shape);
  EXPECT_EQ(OutputShape(chain), naive_shape);
  ExpectNear(Evaluate(chain, in), want, 1e-12);
}

TEST(ReferenceConv3d, MatchesNaiveOnOddShapes) {
  ExpectMatchesNaive({{2, 3, 7, 6, 9}, {Conv3d(4, {3, 2, 3}, {2, 1, 3}, {1, 0, 2}, {1, 2, 1})}});
  ExpectMatchesNaive({{1, 2, 5, 5, 5}, {Conv3d(3, {3, 3, 3}, {2, 2, 2}, {2, 2, 2}, {2, 2, 2})}});
  ExpectMatchesNaive(
      {{1, 3, 6, 7, 5}, {Conv3d(5, {4, 4, 4}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, false)}});
  // Long rows: interior blocks of 8, 4 and 2 outputs, a single tail output and the edges.
  ExpectMatchesNaive({{1, 2, 3, 3, 29}, {Conv3d(3, {1, 2, 3}, {1, 1, 1}, {0, 1, 1})}});
  ExpectMatchesNaive({{1, 2, 2, 3, 41}, {Conv3d(2, {2, 1, 4}, {1, 1, 2}, {1, 0, 3}, {1, 1, 2})}});
}

TEST(ReferenceConvTranspose3d, MatchesNaiveScatterOnOddShapes) {
  ExpectMatchesNaive(
      {{2, 3, 5, 7, 6}, {ConvTranspose3d(4, {3, 2, 3}, {2, 2, 3}, {1, 0, 2}, {1, 1, 2})}});
  ExpectMatchesNaive({{1, 2, 3, 4, 5},
                      {ConvTranspose3d(3, {3, 3, 3}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {2, 2, 2})}});
  ExpectMatchesNaive(
      {{1, 2, 4, 3, 5},
       {ConvTranspose3d(2, {2, 3, 1}, {3, 1, 2}, {0, 1, 0}, {2, 0, 1}, {1, 2, 1}, false)}});
  ExpectMatchesNaive({{1, 3, 3, 5, 5}, {ConvTranspose3d(16, {3, 3, 3}, {2, 2, 2}, {1, 1, 1})}});
  ExpectMatchesNaive({{1, 2, 2, 3, 23},
                      {ConvTranspose3d(3, {2, 2, 3}, {2, 1, 1}, {0, 1, 1}, {1, 0, 0}, {1, 1, 2})}});
  ExpectMatchesNaive({{1, 2, 2, 2, 30}, {ConvTranspose3d(2, {1, 1, 5}, {1, 1, 1}, {0, 0, 4})}});
}

// ---- elementwise ops at hand-picked points (all exactly representable as float) ----

void ExpectElementwise(const Op& op, const std::vector<float>& x, const std::vector<double>& want) {
  SCOPED_TRACE(OpName(op.kind));
  ExpectNear(RunOne({1, 1, 1, 1, static_cast<int64_t>(x.size())}, x, op), want, 1e-15);
}

TEST(ReferenceElementwise, HandPickedPoints) {
  ExpectElementwise(Elementwise(OpKind::kRelu), {-2, 0, 1.5}, {0, 0, 1.5});
  ExpectElementwise(LeakyRelu(0.125), {-2, 0, 3}, {-0.25, 0, 3});
  ExpectElementwise(Elementwise(OpKind::kSigmoid), {-2, 0, 2},
                    {0.11920292202211755, 0.5, 0.8807970779778823});
  ExpectElementwise(Elementwise(OpKind::kTanh), {-1, 0, 0.5},
                    {-0.7615941559557649, 0, 0.46211715726000974});
  // swish(x) = x * sigmoid(x).
  ExpectElementwise(Elementwise(OpKind::kSwish), {-1, 0, 2},
                    {-0.2689414213699951, 0, 1.7615941559557646});
  // hardswish: 0 up to -3, x above 3, x(x+3)/6 between: -1 -> -2/6, 1 -> 4/6, 1.5 -> 6.75/6.
  ExpectElementwise(Elementwise(OpKind::kHardswish), {-4, -3, -1, 0, 1, 1.5, 3, 4},
                    {0, 0, -1.0 / 3, 0, 2.0 / 3, 1.125, 3, 4});
  // gelu(x) = x * Phi(x): Phi(1) = 0.8413447460685429, Phi(2) = 0.9772498680518208.
  ExpectElementwise(Elementwise(OpKind::kGelu), {-1, 0, 1, 2},
                    {-0.15865525393145707, 0, 0.8413447460685429, 1.9544997361036416});
  ExpectElementwise(Clamp(-0.5, 0.25), {-1, -0.5, 0.125, 3}, {-0.5, -0.5, 0.125, 0.25});
}

TEST(ReferenceElementwise, ChainsApplyInOrder) {
  // relu then clamp then leaky_relu: -1 -> 0 -> 0.5 -> 0.5; 4 -> 4 -> 2 -> 2.
  const Chain chain{{1, 1, 1, 1, 2}, {Elementwise(OpKind::kRelu), Clamp(0.5, 2), LeakyRelu(0.5)}};
  ExpectNear(Evaluate(chain, {Tensor({1, 1, 1, 1, 2}, {-1, 4}), {}}), {0.5, 2}, 0);
}

// ---- group_norm and mean ----

TEST(ReferenceGroupNorm, HandComputedOneGroup) {
  // Channels [1,2] and [3,4] in one group: mean 2.5, biased var 1.25; eps 2.75 makes
  // 1/sqrt(var + eps) = 0.5. gamma [2,-1], beta [0.5,1]:
  // c0: (1-2.5)*0.5*2+0.5 = -1, (2-2.5)*0.5*2+0.5 = 0; c1: (3-2.5)*0.5*-1+1 = 0.75, 0.25.
  const std::vector<double> y =
      RunOne({1, 2, 1, 1, 2}, {1, 2, 3, 4}, GroupNorm(1, 2.75),
             {{"0.weight", Tensor({2}, {2, -1})}, {"0.bias", Tensor({2}, {0.5, 1})}});
  ExpectNear(y, {-1, 0, 0.75, 0.25}, 1e-15);
}

TEST(ReferenceGroupNorm, RandomAffineMatchesFormula) {
  const Chain chain{{3, 6, 2, 3, 4}, {GroupNorm(3, 1e-5)}};
  const HostInputs in = RandomInputs(chain, 11);
  const std::vector<float>& x = in.x.data;
  const std::vector<float>& gamma = in.params.at("0.weight").data;
  const std::vector<float>& beta = in.params.at("0.bias").data;
  const int64_t spatial = 2 * 3 * 4, group = 2 * spatial;
  std::vector<double> want(x.size());
  for (int64_t n = 0; n < 3; ++n) {
    for (int64_t g = 0; g < 3; ++g) {
      const int64_t base = (n * 3 + g) * group;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < group; ++i) mean += x[base + i] / double(group);
      for (int64_t i = 0; i < group; ++i)
        var += (x[base + i] - mean) * (x[base + i] - mean) / group;
      for (int64_t i = 0; i < group; ++i) {
        const int64_t c = g * 2 + i / spatial;
        want[base + i] = (x[base + i] - mean) / std::sqrt(var + 1e-5) * gamma[c] + beta[c];
      }
    }
  }
  ExpectNear(Evaluate(chain, in), want, 1e-12);
}

TEST(ReferenceMean, BothForms) {
  const std::vector<float> x = {1, 2, 3, 5, 0, 0, 4, 8};  // N=2, C=2, two values each
  ExpectNear(RunOne({2, 2, 1, 1, 2}, x, Mean({2, 3, 4})), {1.5, 4, 0, 6}, 0);
  ExpectNear(RunOne({2, 2, 1, 1, 2}, x, Mean({1, 2, 3, 4})), {2.75, 3}, 0);
}

// ---- whole chains ----

TEST(ReferenceChain, SwishGroupNormHardswishAfterTransposedConvMatchesNaive) {
  const Chain chain{
      {2, 3, 3, 4, 5},
      {ConvTranspose3d(4, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}), Elementwise(OpKind::kSwish),
       GroupNorm(2, 1e-5), Elementwise(OpKind::kHardswish)}};
  const HostInputs in = RandomInputs(chain, 3);
  Shape ys;
  std::vector<double> want = NaiveConv(Chain{chain.input, {chain.ops[0]}}, in, &ys);
  for (double& v : want) v = v / (1 + std::exp(-v));
  const int64_t group = 2 * ys[2] * ys[3] * ys[4];
  const std::vector<float>& gamma = in.params.at("2.weight").data;
  const std::vector<float>& beta = in.params.at("2.bias").data;
  for (size_t base = 0; base < want.size(); base += group) {
    double mean = 0, sq = 0;
    for (int64_t i = 0; i < group; ++i) mean += want[base + i] / group;
    for (int64_t i = 0; i < group; ++i) sq += (want[base + i] - mean) * (want[base + i] - mean);
    const double rstd = 1 / std::sqrt(sq / group + 1e-5);
    const int64_t c0 = (base / group) % 2 * 2;
    for (int64_t i = 0; i < group; ++i) {
      const int64_t c = c0 + i / (group / 2);
      double v = (want[base + i] - mean) * rstd * gamma[c] + beta[c];
      want[base + i] = v * std::clamp(v + 3, 0.0, 6.0) / 6;
    }
  }
  ExpectNear(Evaluate(chain, in), want, 1e-12);
}

TEST(ReferenceChain, MeanOfGroupNormDependsOnRandomAffine) {
  // W4's trap: with weight 1 and bias 0 the result would be 0 for every input.
  const Chain chain{{2, 3, 6, 6, 6}, {Conv3d(8, {3, 3, 3}), GroupNorm(4), Mean({1, 2, 3, 4})}};
  const std::vector<double> y = Evaluate(chain, RandomInputs(chain, 5));
  ASSERT_EQ(y.size(), 2u);
  EXPECT_GT(std::abs(y[0]), 1e-3);
  EXPECT_NE(y[0], y[1]);
}

// ---- samples and threads ----

TEST(ReferenceOptions, SampleSubsetEqualsSliceOfFullResult) {
  const Chain chain{
      {5, 2, 4, 5, 6},
      {Conv3d(6, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}), Elementwise(OpKind::kGelu), GroupNorm(3)}};
  const HostInputs in = RandomInputs(chain, 1);
  const std::vector<double> full = Evaluate(chain, in, {.samples = {}, .threads = 1});
  const int64_t per = NumElements(OutputShape(chain)) / 5;
  for (int threads : {1, 2, 8}) {
    const std::vector<double> sub = Evaluate(chain, in, {.samples = {1, 4}, .threads = threads});
    ASSERT_EQ(sub.size(), static_cast<size_t>(2 * per));
    EXPECT_TRUE(std::equal(sub.begin(), sub.begin() + per, full.begin() + per));
    EXPECT_TRUE(std::equal(sub.begin() + per, sub.end(), full.begin() + 4 * per));
    // Every thread count gives bit-identical results (fixed summation order).
    EXPECT_EQ(Evaluate(chain, in, {.samples = {}, .threads = threads}), full);
  }
}

// ---- RandomInputs ----

std::pair<float, float> MinMax(const std::vector<float>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *hi};
}

TEST(RandomInputs, DeterministicInRangeAndVaried) {
  const Chain chain{{2, 2, 5, 6, 7}, {ConvTranspose3d(8, {3, 3, 3}), GroupNorm(4)}};
  const HostInputs a = RandomInputs(chain, 42), b = RandomInputs(chain, 42);
  const HostInputs c = RandomInputs(chain, 43);
  EXPECT_EQ(a.x.data, b.x.data);
  EXPECT_NE(a.x.data, c.x.data);
  EXPECT_EQ(a.x.shape, chain.input);
  ASSERT_EQ(a.params.size(), 4u);
  for (const ParamSpec& p : ChainParams(chain)) {
    EXPECT_EQ(a.params.at(p.name).shape, p.shape);
    EXPECT_EQ(a.params.at(p.name).data, b.params.at(p.name).data);
    EXPECT_NE(a.params.at(p.name).data, c.params.at(p.name).data);
  }

  auto [xlo, xhi] = MinMax(a.x.data);
  EXPECT_GE(xlo, 0.0f);
  EXPECT_LT(xhi, 1.0f);
  EXPECT_GT(xhi - xlo, 0.9f);
  // ConvTranspose3d fan_in is weight.shape[1] * k^3 = Cout * 27 = 216, as PyTorch computes it.
  const double bound = 1 / std::sqrt(216.0);
  for (const char* name : {"0.weight", "0.bias"}) {
    auto [lo, hi] = MinMax(a.params.at(name).data);
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LT(hi, bound) << name;
    EXPECT_LT(lo, hi) << name;
  }
  auto [wlo, whi] = MinMax(a.params.at("0.weight").data);  // 432 values: both ends are reached
  EXPECT_LT(wlo, -0.9 * bound);
  EXPECT_GT(whi, 0.9 * bound);
  auto [glo, ghi] = MinMax(a.params.at("1.weight").data);
  EXPECT_GE(glo, 0.5f);
  EXPECT_LT(ghi, 1.5f);
  EXPECT_LT(glo, ghi);
  auto [blo, bhi] = MinMax(a.params.at("1.bias").data);
  EXPECT_GE(blo, -0.5f);
  EXPECT_LT(bhi, 0.5f);
  EXPECT_LT(blo, bhi);
}

TEST(RandomInputs, Conv3dFanInAndIndependentStreams) {
  const Chain with_bias{{1, 2, 5, 5, 5}, {Conv3d(64, {3, 3, 3})}};
  const Chain no_bias{{1, 2, 5, 5, 5},
                      {Conv3d(64, {3, 3, 3}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, false)}};
  const HostInputs a = RandomInputs(with_bias, 9), b = RandomInputs(no_bias, 9);
  // Dropping a parameter leaves every other tensor as it was.
  EXPECT_EQ(a.x.data, b.x.data);
  EXPECT_EQ(a.params.at("0.weight").data, b.params.at("0.weight").data);
  EXPECT_EQ(b.params.count("0.bias"), 0u);
  const double bound = 1 / std::sqrt(2 * 27.0);  // Cin * k^3
  auto [lo, hi] = MinMax(a.params.at("0.weight").data);
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_LT(lo, -0.95 * bound);
  EXPECT_GT(hi, 0.95 * bound);
}

TEST(RandomInputs, FixedValuesAcrossStandardLibraries) {
  // mt19937_64 seeded with seed ^ FNV-1a-64(name), then (r >> 11) * 2^-53: fully specified, so
  // these values must be the same everywhere, forever.
  const Chain chain{{1, 1, 1, 1, 3}, {GroupNorm(1)}};
  const HostInputs a = RandomInputs(chain, 0);
  // Checked against an independent Python implementation of mt19937_64.
  EXPECT_EQ(a.x.data, (std::vector<float>{0x1.24a208p-4f, 0x1.983ec4p-2f, 0x1.7634cap-1f}));
  EXPECT_EQ(a.params.at("0.bias").data, (std::vector<float>{-0x1.40de46p-8f}));  // -0.5 + u
}

// ---- validation ----

TEST(ReferenceErrors, NameTheTensorAndShapes) {
  const Chain chain{{1, 3, 3, 3, 3}, {Conv3d(16, {3, 3, 3})}};
  const HostInputs good = RandomInputs(chain, 1);
  ASSERT_TRUE(RunReference(chain, good).ok());

  HostInputs in = good;
  in.params["0.weight"] = Tensor({16, 3, 3, 3}, std::vector<float>(16 * 27));
  EXPECT_THAT(RunReference(chain, in).status().message(),
              HasSubstr("parameter 0.weight: expected shape [16,3,3,3,3], got [16,3,3,3]"));

  in = good;
  in.params.erase("0.bias");
  EXPECT_THAT(RunReference(chain, in).status().message(),
              HasSubstr("parameter 0.bias (bias of op 0 conv3d) is missing: expected shape [16]"));

  in = good;
  in.params["3.weight"] = Tensor({1}, {1});
  EXPECT_THAT(
      RunReference(chain, in).status().message(),
      HasSubstr("unexpected parameter 3.weight: the chain's parameters are 0.weight, 0.bias"));

  in = good;
  in.x = Tensor({1, 3, 3, 3, 4}, std::vector<float>(108));
  EXPECT_THAT(RunReference(chain, in).status().message(),
              HasSubstr("input x: expected shape [1,3,3,3,3], got [1,3,3,3,4]"));

  in = good;
  in.params["0.bias"].data.pop_back();
  EXPECT_THAT(
      RunReference(chain, in).status().message(),
      HasSubstr("parameter 0.bias: shape [16] has 16 elements, but its data holds 15 values"));
}

TEST(ReferenceErrors, SamplesThreadsAndChain) {
  const Chain chain{{3, 1, 1, 1, 2}, {Elementwise(OpKind::kRelu)}};
  const HostInputs in = RandomInputs(chain, 1);
  absl::Status s = RunReference(chain, in, {.samples = {0, 3}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("sample index 3 is out of range: the batch has 3 samples"));
  EXPECT_THAT(RunReference(chain, in, {.samples = {2, 1}}).status().message(),
              HasSubstr("strictly ascending"));
  EXPECT_THAT(RunReference(chain, in, {.samples = {1, 1}}).status().message(),
              HasSubstr("strictly ascending"));
  EXPECT_FALSE(RunReference(chain, in, {.samples = {}, .threads = -1}).ok());
  EXPECT_THAT(RunReference(Chain{{3, 1, 1, 1, 2}, {}}, in).status().message(),
              HasSubstr("invalid chain"));
}

// ---- CompareToReference ----

TEST(CompareToReference, Statistics) {
  const float out[] = {1, 2.5, -1};
  const double ref[] = {1, 2, -2};
  const ErrorStats s = CompareToReference(out, ref, 3);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.non_finite, 0);
  EXPECT_DOUBLE_EQ(s.max_abs, 1);
  EXPECT_DOUBLE_EQ(s.rel_l2, std::sqrt(1.25) / 3);
  EXPECT_DOUBLE_EQ(s.max_rel, 0.5);
}

TEST(CompareToReference, NonFiniteOutputsAreCountedAndFailEveryTolerance) {
  const float out[] = {1, std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity()};
  const double ref[] = {1, 2, 3};
  const ErrorStats s = CompareToReference(out, ref, 3);
  EXPECT_EQ(s.non_finite, 2);
  EXPECT_TRUE(std::isinf(s.max_abs));
  EXPECT_TRUE(std::isinf(s.rel_l2));
  EXPECT_TRUE(std::isinf(s.max_rel));
}

TEST(CompareToReference, ZeroReference) {
  const double ref[] = {0, 0};
  const float zeros[] = {0, 0}, ones[] = {0, 1};
  const ErrorStats same = CompareToReference(zeros, ref, 2);
  EXPECT_EQ(same.rel_l2, 0);
  EXPECT_EQ(same.max_abs, 0);
  EXPECT_EQ(same.max_rel, 0);
  const ErrorStats off = CompareToReference(ones, ref, 2);
  EXPECT_TRUE(std::isinf(off.rel_l2));
  EXPECT_EQ(off.max_abs, 1);
}

}  // namespace
}  // namespace fusejit
