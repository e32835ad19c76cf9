// Tests of the reference's backward pass (RunReferenceBackward): every op against central finite
// differences of L = sum(y * grad_y) computed with RunReference, PyTorch's conventions at the kinks,
// sample subsets, determinism across thread counts and argument errors; and the gradients'
// magnitudes (ReferenceGradients::x_magnitude): bounds on |gradient|, hand-checked values, a chain
// whose gradients cancel, subsets and determinism.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fusejit/chain.h"
#include "fusejit/reference.h"

namespace fusejit {
namespace {

using ::testing::HasSubstr;

Chain Parse(const std::string& spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << spec << ": " << chain.status();
  return chain.ok() ? *chain : Chain{};
}

// Upstream gradient for the chain's output: uniform in [-1, 1), deterministic in seed.
HostTensor RandomGradY(const Chain& chain, uint64_t seed) {
  HostTensor t;
  t.shape = OutputShape(chain);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  t.data.resize(static_cast<size_t>(NumElements(t.shape)));
  for (float& v : t.data) v = static_cast<float>(dist(rng));
  return t;
}

// RandomInputs with x mapped to float((x + offset) * scale): x in [0,1) puts every value on one side
// of relu's kink, so the elementwise cases move it across theirs.
HostInputs Inputs(const Chain& chain, uint64_t seed, double x_offset = 0, double x_scale = 1) {
  HostInputs inputs = RandomInputs(chain, seed);
  for (float& v : inputs.x.data) v = static_cast<float>((v + x_offset) * x_scale);
  return inputs;
}

ReferenceOptions Options(std::vector<int64_t> samples, int threads = 0) {
  ReferenceOptions options;
  options.samples = std::move(samples);
  options.threads = threads;
  return options;
}

ReferenceGradients Backward(const Chain& chain, const HostInputs& inputs, const HostTensor& grad_y,
                            const ReferenceOptions& options = {}) {
  absl::StatusOr<ReferenceGradients> g = RunReferenceBackward(chain, inputs, grad_y, options);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ReferenceGradients{};
}

// The gradient tensors by name ("x" and every parameter), with their magnitudes.
struct NamedGradient {
  std::string name;
  const std::vector<double>* gradient;
  const std::vector<double>* magnitude;
};
std::vector<NamedGradient> AllGradients(const ReferenceGradients& g) {
  std::vector<NamedGradient> all = {{"x", &g.x, &g.x_magnitude}};
  for (const auto& [name, values] : g.params) {
    const auto it = g.param_magnitudes.find(name);
    all.push_back({name, &values, it == g.param_magnitudes.end() ? nullptr : &it->second});
  }
  return all;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double d : v) m = std::max(m, std::abs(d));
  return m;
}

// Every gradient has a magnitude of its shape, finite, with magnitude >= |gradient| value by value
// (exactly: see reference/ops.h), and not all zero.
void ExpectMagnitudesBoundGradients(const ReferenceGradients& g) {
  EXPECT_EQ(g.param_magnitudes.size(), g.params.size());
  for (const NamedGradient& t : AllGradients(g)) {
    SCOPED_TRACE(t.name);
    ASSERT_NE(t.magnitude, nullptr);
    ASSERT_EQ(t.magnitude->size(), t.gradient->size());
    int violations = 0;
    for (size_t i = 0; i < t.gradient->size(); ++i) {
      const double grad = (*t.gradient)[i], magnitude = (*t.magnitude)[i];
      ASSERT_TRUE(std::isfinite(magnitude)) << i;
      if (!(magnitude >= std::abs(grad)) && ++violations <= 5) {
        ADD_FAILURE() << "value " << i << ": magnitude " << magnitude << " < |gradient| "
                      << std::abs(grad);
      }
    }
    EXPECT_EQ(violations, 0);
    EXPECT_GT(MaxAbs(*t.magnitude), 0);
  }
}

// L = sum(y * grad_y), y from the forward reference in double; summed in index order.
double Loss(const Chain& chain, const HostInputs& inputs, const HostTensor& grad_y) {
  absl::StatusOr<std::vector<double>> y = RunReference(chain, inputs);
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return 0;
  double sum = 0;
  for (size_t i = 0; i < y->size(); ++i) sum += (*y)[i] * static_cast<double>(grad_y.data[i]);
  return sum;
}

// The points where an elementwise op's derivative jumps.
std::vector<double> Kinks(const Op& op) {
  switch (op.kind) {
    case OpKind::kRelu:
    case OpKind::kLeakyRelu:
      return {0.0};
    case OpKind::kClamp:
    case OpKind::kHardtanh:
      return {op.min, op.max};
    case OpKind::kHardswish:
      return {-3.0, 3.0};
    default:
      return {};
  }
}

// The input of op i for the whole batch: x itself for i = 0, else the output of the chain's first i
// ops (with only their parameters).
std::vector<double> OpInput(const Chain& chain, const HostInputs& inputs, size_t i) {
  if (i == 0) return std::vector<double>(inputs.x.data.begin(), inputs.x.data.end());
  Chain prefix = chain;
  prefix.ops.resize(i);
  HostInputs prefix_inputs{inputs.x, {}};
  for (const ParamSpec& p : ChainParams(prefix)) {
    prefix_inputs.params[p.name] = inputs.params.at(p.name);
  }
  absl::StatusOr<std::vector<double>> y = RunReference(prefix, prefix_inputs);
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : std::vector<double>{};
}

// True when some op with kinks sees, in the evaluations at `a` and at `b`, a value on one of its
// kinks or on different sides of one: the finite difference between them would straddle a kink.
bool StraddlesKink(const Chain& chain, const HostInputs& a, const HostInputs& b) {
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const std::vector<double> kinks = Kinks(chain.ops[i]);
    if (kinks.empty()) continue;
    const std::vector<double> va = OpInput(chain, a, i), vb = OpInput(chain, b, i);
    for (size_t j = 0; j < va.size(); ++j) {
      for (double k : kinks) {
        const double da = va[j] - k, db = vb[j] - k;
        if (da == 0 || db == 0 || (da < 0) != (db < 0)) return true;
      }
    }
  }
  return false;
}

std::vector<float>& Values(HostInputs& inputs, const std::string& name) {
  return name == "x" ? inputs.x.data : inputs.params.at(name).data;
}
const std::vector<float>& Values(const HostInputs& inputs, const std::string& name) {
  return name == "x" ? inputs.x.data : inputs.params.at(name).data;
}

// A central difference of L along coordinate k of tensor `name`, with float-representable points
// vp = float(v + h) and vm = float(v - h) (the reference reads float32 values): (L(vp) - L(vm)) /
// (vp - vm), dividing by the difference actually taken.
struct CentralDifference {
  double derivative = 0;
  double half_step = 0;     // (vp - vm) / 2
  bool straddles = false;   // some op with kinks sees one between (or on) the two evaluations
};

CentralDifference Central(const Chain& chain, const HostInputs& inputs, const HostTensor& grad_y,
                          const std::string& name, size_t k, double h) {
  HostInputs plus = inputs, minus = inputs;
  const double v = Values(inputs, name)[k];
  float& vp = Values(plus, name)[k];
  float& vm = Values(minus, name)[k];
  vp = static_cast<float>(v + h);
  vm = static_cast<float>(v - h);
  CentralDifference d;
  d.straddles = StraddlesKink(chain, plus, minus);
  if (d.straddles) return d;
  const double step = static_cast<double>(vp) - static_cast<double>(vm);
  d.derivative = (Loss(chain, plus, grad_y) - Loss(chain, minus, grad_y)) / step;
  d.half_step = step / 2;
  return d;
}

// Checks RunReferenceBackward against finite differences on `coords` random coordinates of x and
// of every parameter. For coordinate k of tensor v, with h = 1e-3 * max|v|: central differences
// D(s1), D(s2) with half-steps s1 ~ h and s2 ~ h/2 (see Central), Richardson-extrapolated to
// s = 0: D(s) = f' + c s^2 + O(s^4), so f' ~ (s1^2 D(s2) - s2^2 D(s1)) / (s1^2 - s2^2).
// Coordinates where either difference would straddle a kink of some op are skipped (the derivative
// jumps there), and others taken in their place.
//
// Tolerance: |fd - grad| <= 1e-5 * max|grad of the tensor|. The extrapolated difference errs by
// O(h^4) (below 1e-8 of max|grad| in every case here; a plain central difference's O(h^2) reached
// 9e-6 behind group_norm, too close), and rounding in L (double) adds ~1e-12. A wrong formula errs
// by a sizeable fraction of max|grad| -- a sign error in any term, a missing mean or variance term
// in group_norm's backward, a wrong conv tap mapping or a mean's gradient off by its count all
// exceed 1e-2 -- so 1e-5 passes robustly and still fails every one of those.
void ExpectMatchesFiniteDifferences(const Chain& chain, const HostInputs& inputs,
                                    const HostTensor& grad_y, uint64_t seed = 1, int coords = 20,
                                    double tolerance = 1e-5) {
  const ReferenceGradients grads = Backward(chain, inputs, grad_y);
  std::vector<std::string> names = {"x"};
  for (const ParamSpec& p : ChainParams(chain)) {
    names.push_back(p.name);
    ASSERT_EQ(grads.params.count(p.name), 1u) << p.name;
    EXPECT_EQ(static_cast<int64_t>(grads.params.at(p.name).size()), NumElements(p.shape))
        << p.name;
  }
  EXPECT_EQ(grads.params.size(), names.size() - 1);
  EXPECT_EQ(static_cast<int64_t>(grads.x.size()), NumElements(chain.input));

  std::mt19937_64 rng(seed);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::vector<double>& g = name == "x" ? grads.x : grads.params.at(name);
    const std::vector<float>& v = Values(inputs, name);
    ASSERT_EQ(g.size(), v.size());
    double g_max = 0, v_max = 0;
    for (double d : g) g_max = std::max(g_max, std::abs(d));
    for (float f : v) v_max = std::max(v_max, std::abs(static_cast<double>(f)));
    ASSERT_GT(g_max, 0) << "a zero gradient checks nothing";
    const double h = 1e-3 * v_max;

    std::vector<size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    int checked = 0, skipped = 0;
    double worst = 0;
    for (size_t k : order) {
      if (checked == coords) break;
      const CentralDifference d1 = Central(chain, inputs, grad_y, name, k, h);
      const CentralDifference d2 = Central(chain, inputs, grad_y, name, k, h / 2);
      if (d1.straddles || d2.straddles) {
        ++skipped;
        continue;
      }
      const double s1 = d1.half_step * d1.half_step, s2 = d2.half_step * d2.half_step;
      const double fd = (s1 * d2.derivative - s2 * d1.derivative) / (s1 - s2);
      const double err = std::abs(fd - g[k]) / g_max;
      worst = std::max(worst, err);
      EXPECT_LE(err, tolerance) << "coordinate " << k << ": backward " << g[k]
                                << ", finite difference " << fd << ", max|grad| " << g_max;
      ++checked;
    }
    EXPECT_GE(checked, std::min<int>(coords, static_cast<int>(v.size())) / 2)
        << skipped << " coordinates skipped at kinks";
    std::ostringstream worst_text;
    worst_text << worst << " (" << checked << " checked, " << skipped << " skipped)";
    ::testing::Test::RecordProperty("worst_" + name, worst_text.str());
  }
}

void ExpectMatchesFiniteDifferences(const std::string& spec, uint64_t seed, double x_offset = 0,
                                    double x_scale = 1) {
  SCOPED_TRACE(spec);
  const Chain chain = Parse(spec);
  ASSERT_FALSE(chain.ops.empty());
  ExpectMatchesFiniteDifferences(chain, Inputs(chain, seed, x_offset, x_scale),
                                 RandomGradY(chain, seed + 1000), seed);
}

// ---- every elementwise op, before and after group_norm ----

struct ElementwiseCase {
  const char* name;  // for the test's name
  const char* op;    // spec text
  double x_scale;    // x in [-scale/2, scale/2)
};

class ReferenceBackwardElementwiseTest : public ::testing::TestWithParam<ElementwiseCase> {};

TEST_P(ReferenceBackwardElementwiseTest, BeforeAndAfterGroupNormMatchesFiniteDifferences) {
  const ElementwiseCase& c = GetParam();
  const std::string op = c.op;
  ExpectMatchesFiniteDifferences(
      "x:f32[2,4,3,4,5] | " + op + " | group_norm(groups=2) | " + op, /*seed=*/7, -0.5, c.x_scale);
}

TEST_P(ReferenceBackwardElementwiseTest, MagnitudesBoundGradients) {
  const ElementwiseCase& c = GetParam();
  const std::string op = c.op;
  for (const std::string& spec :
       {"x:f32[2,4,3,4,5] | " + op + " | group_norm(groups=2) | " + op,
        "x:f32[2,3,4,5,3] | conv3d(out=4,k=2,padding=1) | " + op + " | mean(dims=[2,3,4])",
        "x:f32[2,3,3,4,2] | conv_transpose3d(out=4,k=2,stride=2) | " + op +
            " | mean(dims=[1,2,3,4])"}) {
    SCOPED_TRACE(spec);
    const Chain chain = Parse(spec);
    ExpectMagnitudesBoundGradients(
        Backward(chain, Inputs(chain, /*seed=*/7, -0.5, c.x_scale), RandomGradY(chain, 1007)));
  }
}

TEST_P(ReferenceBackwardElementwiseTest, AfterConvMatchesFiniteDifferences) {
  const ElementwiseCase& c = GetParam();
  ExpectMatchesFiniteDifferences("x:f32[2,3,4,5,3] | conv3d(out=4,k=2,padding=1) | " +
                                     std::string(c.op),
                                 /*seed=*/11, -0.5, c.x_scale);
}

// x in [-1, 1) reaches relu's, leaky_relu's and clamp's kinks; hardswish's at +-3 need [-4, 4).
INSTANTIATE_TEST_SUITE_P(
    ReferenceBackward, ReferenceBackwardElementwiseTest,
    ::testing::Values(ElementwiseCase{"relu", "relu", 2},
                      ElementwiseCase{"leaky_relu", "leaky_relu(slope=0.2)", 2},
                      ElementwiseCase{"sigmoid", "sigmoid", 2}, ElementwiseCase{"tanh", "tanh", 2},
                      ElementwiseCase{"swish", "swish", 2},
                      ElementwiseCase{"hardswish", "hardswish", 8},
                      ElementwiseCase{"gelu", "gelu", 2},
                      ElementwiseCase{"clamp", "clamp(min=-0.3,max=0.4)", 2},
                      ElementwiseCase{"hardtanh", "hardtanh(min=-0.3,max=0.4)", 2},
                      ElementwiseCase{"mul", "mul(by=-1.75)", 2},
                      ElementwiseCase{"add", "add(by=0.625)", 2}),
    [](const ::testing::TestParamInfo<ElementwiseCase>& info) {
      return std::string(info.param.name);
    });

// ---- group_norm, mean, convolutions and whole chains ----

struct ChainCase {
  const char* name;
  const char* spec;
};

class ReferenceBackwardChainTest : public ::testing::TestWithParam<ChainCase> {};

TEST_P(ReferenceBackwardChainTest, MatchesFiniteDifferences) {
  ExpectMatchesFiniteDifferences(GetParam().spec, /*seed=*/3);
}

// x in [-1, 1), so that the convolutions' terms have both signs too.
TEST_P(ReferenceBackwardChainTest, MagnitudesBoundGradients) {
  const Chain chain = Parse(GetParam().spec);
  ExpectMagnitudesBoundGradients(
      Backward(chain, Inputs(chain, /*seed=*/3, -0.5, 2), RandomGradY(chain, 1003)));
}

INSTANTIATE_TEST_SUITE_P(
    ReferenceBackward, ReferenceBackwardChainTest,
    ::testing::Values(
        ChainCase{"GroupNormAlone", "x:f32[3,6,2,3,4] | group_norm(groups=3)"},
        ChainCase{"GroupNormPerChannelLargeEps", "x:f32[2,4,3,2,5] | group_norm(groups=4,eps=0.01)"},
        ChainCase{"GroupNormOneGroup", "x:f32[2,3,3,3,3] | group_norm(groups=1)"},
        ChainCase{"MeanSpatial", "x:f32[2,3,4,5,3] | mean(dims=[2,3,4])"},
        ChainCase{"MeanAll", "x:f32[2,3,4,5,3] | sigmoid | mean(dims=[1,2,3,4])"},
        ChainCase{"GroupNormThenMean",
                  "x:f32[2,4,3,3,3] | swish | group_norm(groups=2) | tanh | mean(dims=[2,3,4])"},
        ChainCase{"Conv3dStridePaddingDilationNoBias",
                  "x:f32[2,3,5,7,6] | conv3d(out=4,k=[2,3,1],stride=2,padding=1,dilation=2,"
                  "bias=false)"},
        ChainCase{"ConvTranspose3dStridePaddingDilationOutputPaddingNoBias",
                  "x:f32[2,3,5,3,7] | conv_transpose3d(out=4,k=[2,3,1],stride=2,padding=1,"
                  "output_padding=1,dilation=2,bias=false)"},
        ChainCase{"Conv3dPerAxisAttributes",
                  "x:f32[1,2,7,6,5] | conv3d(out=3,k=[3,2,2],stride=[1,2,3],padding=[2,0,1],"
                  "dilation=[1,2,1])"},
        ChainCase{"ConvTranspose3dPerAxisAttributes",
                  "x:f32[1,2,3,4,5] | conv_transpose3d(out=3,k=[3,2,2],stride=[1,2,3],"
                  "padding=[1,0,1],output_padding=[0,1,2],dilation=[1,2,1])"},
        ChainCase{"Conv3dChain",
                  "x:f32[2,4,5,6,7] | conv3d(out=6,k=3,stride=2,padding=1) | swish | "
                  "group_norm(groups=2) | hardswish"},
        ChainCase{"ConvTranspose3dChainWithMean",
                  "x:f32[2,3,3,4,5] | conv_transpose3d(out=4,k=3,stride=2,padding=1,"
                  "output_padding=1) | tanh | group_norm(groups=2) | gelu | mean(dims=[2,3,4])"}),
    [](const ::testing::TestParamInfo<ChainCase>& info) { return std::string(info.param.name); });

// ---- hand-checked values ----

// One elementwise op on a row of values with grad_y = 1: the x-gradient is f'(x) itself.
std::vector<double> Derivatives(const std::string& op, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const Chain chain = Parse("x:f32[1,1,1,1," + std::to_string(n) + "] | " + op);
  const HostInputs inputs{{chain.input, x}, {}};
  const HostTensor grad_y{chain.input, std::vector<float>(x.size(), 1.0f)};
  return Backward(chain, inputs, grad_y).x;
}

// PyTorch's backward formulas at the kinks (threshold_backward, leaky_relu_backward, clamp's
// x >= min && x <= max mask, hardswish_backward), as codegen/op_table.h's derivative column has
// them. hardswish_backward here is PyTorch's through 2.6 (0 below -3, x/3 + 1/2 on the closed
// [-3, 3], 1 above): -0.5 at -3 and 1.5 at 3. (PyTorch 2.7 moved both boundaries into the flat
// pieces, 0 at -3 and 1 at 3; the table, not this test, is the place to follow that.)
TEST(ReferenceBackward, KinksFollowPyTorch) {
  EXPECT_EQ(Derivatives("relu", {-1, 0, 2}), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(Derivatives("leaky_relu(slope=0.2)", {-1, 0, 2}), (std::vector<double>{0.2, 0.2, 1}));
  EXPECT_EQ(Derivatives("clamp(min=-0.5,max=0.25)", {-1, -0.5, 0, 0.25, 1}),
            (std::vector<double>{0, 1, 1, 1, 0}));
  EXPECT_EQ(Derivatives("hardswish", {-4, -3, 0, 1.5, 3, 4}),
            (std::vector<double>{0, 0, 0.5, 1, 1, 1}));  // PyTorch 2.11: 0 at -3, 1 at 3
}

TEST(ReferenceBackward, MeanSpreadsGradientOverItsCount) {
  const Chain chain = Parse("x:f32[2,3,2,2,2] | mean(dims=[1,2,3,4])");
  const HostInputs inputs = RandomInputs(chain, 5);
  const HostTensor grad_y{{2}, {2.4f, -1.2f}};
  const ReferenceGradients g = Backward(chain, inputs, grad_y);
  ASSERT_EQ(g.x.size(), 48u);
  for (size_t i = 0; i < g.x.size(); ++i) {
    EXPECT_DOUBLE_EQ(g.x[i], static_cast<double>(grad_y.data[i / 24]) / 24) << i;
    EXPECT_DOUBLE_EQ(g.x_magnitude[i], std::abs(static_cast<double>(grad_y.data[i / 24])) / 24)
        << i;
  }
  EXPECT_TRUE(g.params.empty());
  EXPECT_TRUE(g.param_magnitudes.empty());
}

// ---- magnitudes: hand-checked values ----

// Elementwise ops have one term per value: the magnitude is |gradient| exactly.
TEST(ReferenceBackward, ElementwiseMagnitudeIsAbsoluteGradient) {
  const Chain chain = Parse("x:f32[2,3,2,3,4] | tanh | hardswish | leaky_relu(slope=0.2)");
  const HostInputs inputs = Inputs(chain, 51, -0.5, 8);
  const ReferenceGradients g = Backward(chain, inputs, RandomGradY(chain, 52));
  ASSERT_EQ(g.x_magnitude.size(), g.x.size());
  for (size_t i = 0; i < g.x.size(); ++i) EXPECT_EQ(g.x_magnitude[i], std::abs(g.x[i])) << i;
}

// With x >= 0, the weights replaced by |w| and grad_y by |grad_y|, every term of the convolutions'
// (and the mean's) backward is nonnegative, so the magnitudes are the gradients, bit for bit (the
// same terms summed in the same order). And the magnitudes depend only on |w| and |grad_y|, so they
// are those of the original inputs.
TEST(ReferenceBackward, ConvMagnitudeIsTheGradientOfAbsoluteValues) {
  for (const char* spec :
       {"x:f32[2,3,4,3,5] | conv3d(out=4,k=[2,3,2],stride=[1,2,1],padding=1,dilation=[2,1,1]) | "
        "mean(dims=[2,3,4])",
        "x:f32[2,3,3,2,4] | conv_transpose3d(out=4,k=[3,2,3],stride=2,padding=1,"
        "output_padding=1,dilation=[1,2,1]) | mean(dims=[1,2,3,4])",
        "x:f32[2,3,3,2,4] | conv_transpose3d(out=2,k=2,stride=[1,2,2],bias=false)"}) {
    SCOPED_TRACE(spec);
    const Chain chain = Parse(spec);
    const HostInputs inputs = RandomInputs(chain, 61);  // x in [0, 1)
    const HostTensor grad_y = RandomGradY(chain, 62);
    HostInputs abs_inputs = inputs;
    for (auto& [name, t] : abs_inputs.params) {
      for (float& v : t.data) v = std::abs(v);
    }
    HostTensor abs_grad_y = grad_y;
    for (float& v : abs_grad_y.data) v = std::abs(v);

    const ReferenceGradients g = Backward(chain, inputs, grad_y);
    const ReferenceGradients a = Backward(chain, abs_inputs, abs_grad_y);
    ASSERT_FALSE(a.x.empty());
    EXPECT_EQ(g.x_magnitude, a.x);
    EXPECT_EQ(g.param_magnitudes, a.params);
    EXPECT_EQ(a.x_magnitude, a.x);
    EXPECT_EQ(a.param_magnitudes, a.params);
    EXPECT_NE(g.x, a.x);  // the signs did matter for the gradient
  }
}

// GroupNorm alone, against its formula computed here: with xhat = (x - mean) * rstd per group of n
// values and m = |grad_y|, beta: sum_c m; gamma: sum_c m |xhat|; x: rstd * (|gamma| m +
// mean(|gamma| m) + |xhat| mean(|gamma| m |xhat|)).
TEST(ReferenceBackward, GroupNormMagnitudeFollowsItsFormula) {
  const Chain chain = Parse("x:f32[2,6,2,3,2] | group_norm(groups=3,eps=0.001)");
  HostInputs inputs = Inputs(chain, 71, -0.5, 2);
  for (float& v : inputs.params.at("0.weight").data) v -= 1.0f;  // gamma of both signs
  const HostTensor grad_y = RandomGradY(chain, 72);
  const ReferenceGradients g = Backward(chain, inputs, grad_y);
  const std::vector<float>& x = inputs.x.data;
  const std::vector<float>& gamma = inputs.params.at("0.weight").data;
  const int64_t batch = 2, channels = 6, groups = 3, spatial = 12;
  const int64_t per_group = channels / groups * spatial;
  const double n = static_cast<double>(per_group);
  std::vector<double> x_magnitude(x.size()), gamma_magnitude(channels), beta_magnitude(channels);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t base = (b * groups + grp) * per_group;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < per_group; ++i) mean += x[base + i];
      mean /= n;
      for (int64_t i = 0; i < per_group; ++i) var += (x[base + i] - mean) * (x[base + i] - mean);
      const double rstd = 1 / std::sqrt(var / n + 0.001);
      std::vector<double> xhat(per_group), m(per_group);
      double mean_gm = 0, mean_gm_xhat = 0;
      for (int64_t i = 0; i < per_group; ++i) {
        const int64_t c = grp * (channels / groups) + i / spatial;
        xhat[i] = std::abs((x[base + i] - mean) * rstd);
        m[i] = std::abs(static_cast<double>(grad_y.data[base + i])) * std::abs(gamma[c]);
        mean_gm += m[i] / n;
        mean_gm_xhat += m[i] * xhat[i] / n;
        gamma_magnitude[c] += std::abs(static_cast<double>(grad_y.data[base + i])) * xhat[i];
        beta_magnitude[c] += std::abs(static_cast<double>(grad_y.data[base + i]));
      }
      for (int64_t i = 0; i < per_group; ++i) {
        x_magnitude[base + i] = rstd * (m[i] + mean_gm + xhat[i] * mean_gm_xhat);
      }
    }
  }
  const auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-12 * std::abs(want[i])) << i;
    }
  };
  {
    SCOPED_TRACE("x");
    expect_near(g.x_magnitude, x_magnitude);
  }
  {
    SCOPED_TRACE("gamma");
    expect_near(g.param_magnitudes.at("0.weight"), gamma_magnitude);
  }
  {
    SCOPED_TRACE("beta");
    expect_near(g.param_magnitudes.at("0.bias"), beta_magnitude);
  }
}

// ---- magnitudes where the gradients cancel ----

// With one channel per group and a mean over everything after group_norm, the output is
// mean_c(beta[c]) whatever x, the conv's parameters and gamma are: their gradients are analytically
// zero (~1e-17 in double: rounding), as are the conv bias's in any case (a per-channel shift that
// group_norm removes). The magnitudes keep the scale the gradients would have without the
// cancellation. The comparison: the same chain with a tanh between group_norm and the mean, which
// breaks it. Its magnitudes are the chain's times |tanh'| <= 1 at the last step, so at most the
// chain's, and not far below them (tanh' stays well above 0 on group_norm's output); and they are
// above its gradients, which now do not vanish (x's, gamma's and the conv weight's are 1/7 to
// 1/35 of its magnitudes, as group_norm's backward still cancels in part; the conv bias's, 1/100).
TEST(ReferenceBackward, MagnitudesKeepTheScaleWhereGradientsCancel) {
  const std::string head =
      "x:f32[8,2,3,9,11] | conv3d(out=7,k=[1,3,3]) | gelu | relu | group_norm(groups=7)";
  const Chain chain = Parse(head + " | mean(dims=[1,2,3,4])");
  const Chain similar = Parse(head + " | tanh | mean(dims=[1,2,3,4])");
  const HostInputs inputs = RandomInputs(chain, 81);
  HostTensor grad_y = RandomGradY(chain, 82);
  const ReferenceGradients g = Backward(chain, inputs, grad_y);
  const ReferenceGradients s = Backward(similar, inputs, grad_y);
  ExpectMagnitudesBoundGradients(g);
  ExpectMagnitudesBoundGradients(s);
  for (const NamedGradient& t : AllGradients(g)) {
    if (t.name == "3.bias") continue;  // below
    SCOPED_TRACE(t.name);
    const NamedGradient* u = nullptr;
    const std::vector<NamedGradient> all_similar = AllGradients(s);
    for (const NamedGradient& v : all_similar) {
      if (v.name == t.name) u = &v;
    }
    ASSERT_NE(u, nullptr);
    const double max_grad = MaxAbs(*t.gradient), max_magnitude = MaxAbs(*t.magnitude);
    const double similar_magnitude = MaxAbs(*u->magnitude);
    const double similar_grad = MaxAbs(*u->gradient);
    EXPECT_LT(max_grad, 1e-12);
    EXPECT_GT(max_magnitude, 1e6 * max_grad);
    EXPECT_GE(max_magnitude, similar_magnitude);
    EXPECT_LE(max_magnitude, 10 * similar_magnitude);
    EXPECT_GT(similar_magnitude, similar_grad);
    std::ostringstream text;
    text << "max|gradient| " << max_grad << ", max magnitude " << max_magnitude
         << "; with tanh: max|gradient| " << similar_grad << ", max magnitude "
         << similar_magnitude;
    RecordProperty("scales_" + t.name, text.str());
  }
  // beta's gradient does not cancel: each beta[c] adds to the mean with weight 1/7.
  const std::vector<double>& beta = g.params.at("3.bias");
  const std::vector<double>& beta_magnitude = g.param_magnitudes.at("3.bias");
  for (size_t c = 0; c < beta.size(); ++c) {
    double expected = 0;
    for (int64_t n = 0; n < 8; ++n) expected += static_cast<double>(grad_y.data[n]) / 7;
    EXPECT_NEAR(beta[c], expected, 1e-12);
    EXPECT_GE(beta_magnitude[c], std::abs(beta[c]));
  }
}

// ---- samples and threads ----

const char kConvChain[] =
    "x:f32[5,3,4,5,3] | conv3d(out=4,k=[2,3,2],padding=1) | swish | group_norm(groups=2) | "
    "leaky_relu(slope=0.1)";

TEST(ReferenceBackward, SampleSubsetGivesTheFullBatchRows) {
  const Chain chain = Parse(kConvChain);
  const HostInputs inputs = RandomInputs(chain, 21);
  const HostTensor grad_y = RandomGradY(chain, 22);
  const ReferenceGradients full = Backward(chain, inputs, grad_y);
  const ReferenceGradients subset = Backward(chain, inputs, grad_y, Options({1, 3}));
  const int64_t per_sample = NumElements(chain.input) / chain.input[0];
  ASSERT_EQ(static_cast<int64_t>(subset.x.size()), 2 * per_sample);
  EXPECT_TRUE(std::equal(subset.x.begin(), subset.x.begin() + per_sample,
                         full.x.begin() + 1 * per_sample));
  EXPECT_TRUE(std::equal(subset.x.begin() + per_sample, subset.x.end(),
                         full.x.begin() + 3 * per_sample));

  // Parameter gradients: summed over the subset's samples only, in sample order.
  const ReferenceGradients one = Backward(chain, inputs, grad_y, Options({1}));
  const ReferenceGradients three = Backward(chain, inputs, grad_y, Options({3}));
  ASSERT_EQ(subset.params.size(), 4u);  // 0.weight, 0.bias, 2.weight, 2.bias
  for (const auto& [name, values] : subset.params) {
    SCOPED_TRACE(name);
    ASSERT_EQ(values.size(), one.params.at(name).size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(values[i], one.params.at(name)[i] + three.params.at(name)[i]) << i;
    }
    // and not the full batch's
    EXPECT_NE(values, full.params.at(name));
  }

  // The magnitudes likewise.
  EXPECT_TRUE(std::equal(subset.x_magnitude.begin(), subset.x_magnitude.begin() + per_sample,
                         full.x_magnitude.begin() + 1 * per_sample));
  EXPECT_TRUE(std::equal(subset.x_magnitude.begin() + per_sample, subset.x_magnitude.end(),
                         full.x_magnitude.begin() + 3 * per_sample));
  ASSERT_EQ(subset.param_magnitudes.size(), 4u);
  for (const auto& [name, values] : subset.param_magnitudes) {
    SCOPED_TRACE(name);
    ASSERT_EQ(values.size(), one.param_magnitudes.at(name).size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(values[i], one.param_magnitudes.at(name)[i] + three.param_magnitudes.at(name)[i])
          << i;
    }
  }
}

TEST(ReferenceBackward, BitIdenticalForEveryThreadCount) {
  const Chain chain = Parse(kConvChain);
  const HostInputs inputs = RandomInputs(chain, 31);
  const HostTensor grad_y = RandomGradY(chain, 32);
  // The whole batch (5 samples: blocks of 3 and 2 with 3 threads) and a single sample (3 threads
  // split the convolution's channels).
  for (const std::vector<int64_t>& samples : {std::vector<int64_t>{}, std::vector<int64_t>{2}}) {
    SCOPED_TRACE(samples.size());
    const ReferenceGradients a = Backward(chain, inputs, grad_y, Options(samples, 1));
    const ReferenceGradients b = Backward(chain, inputs, grad_y, Options(samples, 3));
    const ReferenceGradients c = Backward(chain, inputs, grad_y, Options(samples, 0));
    EXPECT_EQ(a.x, b.x);
    EXPECT_EQ(a.params, b.params);
    EXPECT_EQ(a.x, c.x);
    EXPECT_EQ(a.params, c.params);
    EXPECT_EQ(a.x_magnitude, b.x_magnitude);
    EXPECT_EQ(a.param_magnitudes, b.param_magnitudes);
    EXPECT_EQ(a.x_magnitude, c.x_magnitude);
    EXPECT_EQ(a.param_magnitudes, c.param_magnitudes);
  }
}

TEST(ReferenceBackward, ConvOfModerateSizeIsQuick) {
  const Chain chain = Parse("x:f32[2,8,8,8,8] | conv3d(out=8,k=3,padding=1) | relu");
  const HostInputs inputs = RandomInputs(chain, 41);
  const HostTensor grad_y = RandomGradY(chain, 42);
  const auto start = std::chrono::steady_clock::now();
  const ReferenceGradients g = Backward(chain, inputs, grad_y, Options({}, 1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(g.x.size(), 2u * 8 * 512);
  RecordProperty("seconds", std::to_string(seconds));
  // Generous: a few milliseconds in a release build; sanitizer builds are far slower.
  EXPECT_LT(seconds, 30.0);
}

// ---- errors ----

TEST(ReferenceBackward, WrongGradYShapeIsAnError) {
  const Chain chain = Parse("x:f32[2,3,4,4,4] | relu | mean(dims=[2,3,4])");
  const HostInputs inputs = RandomInputs(chain, 1);
  absl::StatusOr<ReferenceGradients> g =
      RunReferenceBackward(chain, inputs, HostTensor{{2, 3, 1}, std::vector<float>(6)});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("grad_y"));
  EXPECT_THAT(g.status().message(), HasSubstr("expected shape [2,3]"));
  EXPECT_THAT(g.status().message(), HasSubstr("got [2,3,1]"));

  // Full shape even for a subset.
  g = RunReferenceBackward(chain, inputs, HostTensor{{1, 3}, std::vector<float>(3)},
                           Options({1}));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("expected shape [2,3]"));

  // Right shape, wrong number of values.
  g = RunReferenceBackward(chain, inputs, HostTensor{{2, 3}, std::vector<float>(5)});
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("grad_y"));
  EXPECT_THAT(g.status().message(), HasSubstr("5 values"));
}

TEST(ReferenceBackward, ArgumentErrorsAreRunReferences) {
  const Chain chain = Parse("x:f32[2,3,4,4,4] | conv3d(out=2,k=3) | relu");
  const HostTensor grad_y = RandomGradY(chain, 2);
  HostInputs inputs = RandomInputs(chain, 1);
  inputs.params.erase("0.weight");
  absl::StatusOr<ReferenceGradients> g = RunReferenceBackward(chain, inputs, grad_y);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("parameter 0.weight"));
  EXPECT_THAT(g.status().message(), HasSubstr("missing"));
  EXPECT_THAT(g.status().message(), HasSubstr("[2,3,3,3,3]"));
  // The same message as the forward's.
  EXPECT_EQ(g.status(), RunReference(chain, inputs).status());

  inputs = RandomInputs(chain, 1);
  g = RunReferenceBackward(chain, inputs, grad_y, Options({2}));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kOutOfRange);
  g = RunReferenceBackward(chain, inputs, grad_y, Options({}, -1));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("threads"));
  inputs.params["9.weight"] = HostTensor{{1}, {0}};
  g = RunReferenceBackward(chain, inputs, grad_y);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("unexpected parameter 9.weight"));
}

}  // namespace
}  // namespace fusejit
