// codegen/op_table.h: one row per op, read by the parser, printer, emitter and reference; the
// elementwise derivatives against finite differences and PyTorch's conventions at the kinks.
#include "codegen/op_table.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fusejit/chain.h"

namespace fusejit {
namespace {

constexpr OpKind kAllKinds[] = {OpKind::kConv3d,    OpKind::kConvTranspose3d, OpKind::kRelu,
                                OpKind::kLeakyRelu, OpKind::kSigmoid,         OpKind::kTanh,
                                OpKind::kSwish,     OpKind::kHardswish,       OpKind::kGelu,
                                OpKind::kClamp,     OpKind::kHardtanh,        OpKind::kMul,
                                OpKind::kAdd,       OpKind::kMish,            OpKind::kSoftplus,
                                OpKind::kElu,       OpKind::kSelu,            OpKind::kHardsigmoid,
                                OpKind::kGeluTanh,  OpKind::kLogsigmoid,      OpKind::kSoftsign,
                                OpKind::kTanhshrink, OpKind::kCelu,           OpKind::kGroupNorm,
                                OpKind::kMean};

TEST(OpTable, EveryKindHasOneRowFoundByNameAndAlias) {
  EXPECT_EQ(OpTable().size(), std::size(kAllKinds));
  for (OpKind kind : kAllKinds) {
    const OpDesc& d = Describe(kind);
    EXPECT_EQ(d.kind, kind);
    EXPECT_EQ(OpName(kind), d.name);
    ASSERT_NE(FindOp(d.name), nullptr);
    EXPECT_EQ(FindOp(d.name)->kind, kind);
    const bool elementwise = d.role == OpRole::kElementwise;
    EXPECT_EQ(IsElementwise(kind), elementwise);
    EXPECT_EQ(d.device != nullptr, elementwise) << d.name;
    EXPECT_EQ(d.value != nullptr, elementwise) << d.name;
    EXPECT_EQ(d.derivative != nullptr, elementwise) << d.name;
  }
  EXPECT_EQ(FindOp("silu")->kind, OpKind::kSwish);
  EXPECT_EQ(FindOp("relu6"), nullptr);
  EXPECT_NE(OpNamesText().find("swish (silu)"), std::string::npos);
}

TEST(OpTable, HardtanhTakesPyTorchsDefaultsAndNames) {
  absl::StatusOr<Chain> a = ParseChain(
      "x:f32[1,2,3,3,3] | hardtanh | hardtanh(min_val=0,max_val=6) | "
      "hardtanh(max=2)");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ops[0], Hardtanh(-1, 1));
  EXPECT_EQ(a->ops[1], Hardtanh(0, 6));
  EXPECT_EQ(a->ops[2], Hardtanh(-1, 2));
  EXPECT_EQ(FormatChain(*a),
            "x:f32[1,2,3,3,3] | hardtanh(min=-1,max=1) | hardtanh(min=0,max=6) | "
            "hardtanh(min=-1,max=2)");
  absl::StatusOr<Chain> bad = ParseChain("x:f32[1,2,3,3,3] | hardtanh(min=2,max=1)");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("min <= max"), std::string::npos) << bad.status();
  // hardtanh's default min is -1: a max below it is refused, not silently swapped.
  EXPECT_FALSE(ParseChain("x:f32[1,2,3,3,3] | hardtanh(max=-2)").ok());
}

TEST(OpTable, MulAndAddTakeOneConstant) {
  absl::StatusOr<Chain> a =
      ParseChain("x:f32[1,2,3,3,3] | mul(by=0.25) | add(other=-1.5) | mul(other=3)");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ops[0], Mul(0.25));
  EXPECT_EQ(a->ops[1], Add(-1.5));
  EXPECT_EQ(a->ops[2], Mul(3));
  EXPECT_EQ(FormatChain(*a), "x:f32[1,2,3,3,3] | mul(by=0.25) | add(by=-1.5) | mul(by=3)");
  const OpDesc& mul = Describe(OpKind::kMul);
  EXPECT_EQ(mul.value(Mul(-2), 1.5), -3.0);
  EXPECT_EQ(mul.derivative(Mul(-2), 7.0), -2.0);
  EXPECT_EQ(Describe(OpKind::kAdd).value(Add(-2), 1.5), -0.5);
  EXPECT_EQ(Describe(OpKind::kAdd).derivative(Add(-2), 1.5), 1.0);
  EXPECT_EQ(mul.device(Mul(0.5), DType::kF32), "v = v * 0.5f;");
  EXPECT_EQ(mul.device(Mul(0.5), DType::kF64), "v = v * 0.5;");
  for (const char* bad : {"x:f32[1,2,3,3,3] | mul", "x:f32[1,2,3,3,3] | add(by=inf)",
                          "x:f16[1,2,3,3,3] | mul(by=1e6)", "x:f32[1,2,3,3,3] | mul(by=true)"}) {
    absl::StatusOr<Chain> c = ParseChain(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("by"), std::string::npos) << c.status();
  }
}

TEST(OpTable, SmoothActivationsTakePyTorchsDefaultsAndValues) {
  absl::StatusOr<Chain> a = ParseChain(
      "x:f32[1,2,3,3,3] | mish | softplus | softplus(beta=2,threshold=5) | elu | elu(alpha=0.5) | "
      "selu | hardsigmoid");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ops[1], Softplus(1, 20));
  EXPECT_EQ(a->ops[2], Softplus(2, 5));
  EXPECT_EQ(a->ops[3], Elu(1));
  EXPECT_EQ(a->ops[4], Elu(0.5));
  EXPECT_EQ(FormatChain(*a),
            "x:f32[1,2,3,3,3] | mish | softplus(beta=1,threshold=20) | "
            "softplus(beta=2,threshold=5) | elu(alpha=1) | elu(alpha=0.5) | selu | hardsigmoid");
  // Values PyTorch 2.11 gives (float64): F.mish(1) = 0.8650983882673103, F.softplus(-1) =
  // 0.31326168751822286, F.elu(-1, 0.5) = -0.31606027941427883, F.selu(-1) = -1.1113307378125625,
  // F.hardsigmoid(1) = 0.6666666666666666; softplus(2, beta=1, threshold=1) = 2 (linear above).
  EXPECT_NEAR(Describe(OpKind::kMish).value(Elementwise(OpKind::kMish), 1), 0.8650983882673103,
              1e-15);
  EXPECT_NEAR(Describe(OpKind::kSoftplus).value(Softplus(), -1), 0.31326168751822286, 1e-15);
  EXPECT_EQ(Describe(OpKind::kSoftplus).value(Softplus(1, 1), 2), 2.0);
  EXPECT_EQ(Describe(OpKind::kSoftplus).derivative(Softplus(1, 1), 2), 1.0);
  EXPECT_NEAR(Describe(OpKind::kElu).value(Elu(0.5), -1), -0.31606027941427883, 1e-15);
  EXPECT_EQ(Describe(OpKind::kElu).derivative(Elu(0.5), 0), 0.5);  // x <= 0 takes alpha e^x
  EXPECT_NEAR(Describe(OpKind::kSelu).value(Elementwise(OpKind::kSelu), -1), -1.1113307378125625,
              1e-15);
  EXPECT_NEAR(Describe(OpKind::kHardsigmoid).value(Elementwise(OpKind::kHardsigmoid), 1),
              2.0 / 3.0, 1e-15);
  EXPECT_EQ(Describe(OpKind::kHardsigmoid).derivative(Elementwise(OpKind::kHardsigmoid), 3), 0.0);
  EXPECT_EQ(Describe(OpKind::kSoftplus).device(Softplus(2, 5), DType::kF32),
            "v = fj::softplus(v, 2.0f, 5.0f);");
  for (const char* bad : {"x:f32[1,2,3,3,3] | softplus(beta=0)", "x:f32[1,2,3,3,3] | elu(alpha=inf)",
                          "x:f32[1,2,3,3,3] | mish(alpha=1)", "x:f32[1,2,3,3,3] | elu(beta=1)"}) {
    EXPECT_FALSE(ParseChain(bad).ok()) << bad;
  }
}

TEST(OpTable, MoreActivationsTakePyTorchsDefaultsAndValues) {
  absl::StatusOr<Chain> a = ParseChain(
      "x:f32[1,2,3,3,3] | gelu_tanh | logsigmoid | softsign | tanhshrink | celu | celu(alpha=0.5)");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ops[4], Celu(1));
  EXPECT_EQ(a->ops[5], Celu(0.5));
  EXPECT_EQ(FormatChain(*a),
            "x:f32[1,2,3,3,3] | gelu_tanh | logsigmoid | softsign | tanhshrink | celu(alpha=1) | "
            "celu(alpha=0.5)");
  // PyTorch (float64) at x = -1, 0.5, 2: F.gelu(approximate='tanh'), F.logsigmoid, F.softsign,
  // F.tanhshrink, F.celu(alpha=0.5); and each one's gradient at 0 by autograd: 0.5, 0.5, 1, 0, 1.
  struct Case {
    Op op;
    double want[3];
    double grad_at_0;
  };
  const Case cases[] = {
      {Elementwise(OpKind::kGeluTanh), {-0.15880800939172324, 0.34571400982514394, 1.954597694087775}, 0.5},
      {Elementwise(OpKind::kLogsigmoid), {-1.3132616875182228, -0.4740769841801067, -0.1269280110429725}, 0.5},
      {Elementwise(OpKind::kSoftsign), {-0.5, 0.3333333333333333, 0.6666666666666666}, 1.0},
      {Elementwise(OpKind::kTanhshrink), {-0.23840584404423515, 0.03788284273999026, 1.035972419924183}, 0.0},
      {Celu(0.5), {-0.43233235838169365, 0.5, 2.0}, 1.0},
  };
  for (const Case& c : cases) {
    const OpDesc& d = Describe(c.op.kind);
    const double xs[3] = {-1.0, 0.5, 2.0};
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(d.value(c.op, xs[i]), c.want[i], 1e-15) << d.name;
    EXPECT_EQ(d.derivative(c.op, 0.0), c.grad_at_0) << d.name;
  }
  EXPECT_EQ(Describe(OpKind::kCelu).device(Celu(0.5), DType::kF32), "v = fj::celu(v, 0.5f, 2.0f);");
  EXPECT_EQ(Describe(OpKind::kCelu).device_derivative(Celu(0.5)), "g = fj::celu_d(v, 2.0f);");
  for (const char* bad : {"x:f32[1,2,3,3,3] | celu(alpha=0)", "x:f32[1,2,3,3,3] | celu(alpha=inf)",
                          "x:f32[1,2,3,3,3] | softsign(alpha=1)"}) {
    EXPECT_FALSE(ParseChain(bad).ok()) << bad;
  }
}

TEST(OpTable, ClampTakesEitherBoundOrBoth) {
  absl::StatusOr<Chain> a =
      ParseChain("x:f32[1,2,3,3,3] | clamp(min=0) | clamp(max=6) | clamp(min=-1,max=1)");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ops[0], Clamp(0, HUGE_VAL));
  EXPECT_EQ(a->ops[1], Clamp(-HUGE_VAL, 6));
  EXPECT_EQ(FormatChain(*a), "x:f32[1,2,3,3,3] | clamp(min=0) | clamp(max=6) | clamp(min=-1,max=1)");
  const OpDesc& clamp = Describe(OpKind::kClamp);
  EXPECT_EQ(clamp.device(a->ops[0], DType::kF32), "v = fj::clamp_min(v, 0.0f);");
  EXPECT_EQ(clamp.device(a->ops[1], DType::kF64), "v = fj::clamp_max(v, 6.0);");
  EXPECT_EQ(clamp.device_derivative(a->ops[0]), "g = fj::clamp_min_d(v, 0.0f);");
  EXPECT_EQ(clamp.value(a->ops[0], -2.0), 0.0);
  EXPECT_EQ(clamp.value(a->ops[1], 1e300), 6.0);
  EXPECT_EQ(clamp.derivative(a->ops[0], 0.0), 1.0);  // PyTorch's clamp_min backward: x >= min
  EXPECT_EQ(clamp.derivative(a->ops[1], 7.0), 0.0);
  for (const char* bad : {"x:f32[1,2,3,3,3] | clamp", "x:f32[1,2,3,3,3] | clamp(min=inf)",
                          "x:f32[1,2,3,3,3] | clamp(min=2,max=1)"}) {
    EXPECT_FALSE(ParseChain(bad).ok()) << bad;
  }
  Chain both_open{{1, 2, 3, 3, 3}, {Clamp(-HUGE_VAL, HUGE_VAL)}};
  EXPECT_FALSE(ValidateChain(both_open).ok());
}

TEST(OpTable, AliasesParseAndPrintAsTheName) {
  absl::StatusOr<Chain> a = ParseChain("x:f32[1,2,3,3,3] | silu | leaky_relu(negative_slope=0.2) | "
                                       "mean(dim=[2,3,4])");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(FormatChain(*a),
            "x:f32[1,2,3,3,3] | swish | leaky_relu(slope=0.2) | mean(dims=[2,3,4])");
}

Op Sample(OpKind kind) {
  if (kind == OpKind::kLeakyRelu) return LeakyRelu(0.2);
  if (kind == OpKind::kClamp) return Clamp(-0.75, 1.5);
  if (kind == OpKind::kHardtanh) return Hardtanh(-0.75, 1.5);
  if (kind == OpKind::kMul) return Mul(-1.25);
  if (kind == OpKind::kAdd) return Add(0.375);
  if (kind == OpKind::kSoftplus) return Softplus(1.5, 2);  // the threshold inside the range
  if (kind == OpKind::kElu) return Elu(0.75);
  if (kind == OpKind::kCelu) return Celu(0.6);
  return Elementwise(kind);
}

TEST(OpTable, DerivativesMatchFiniteDifferences) {
  for (OpKind kind : kAllKinds) {
    const OpDesc& d = Describe(kind);
    if (d.role != OpRole::kElementwise) continue;
    const Op op = Sample(kind);
    for (double x = -5.013; x <= 5.0; x += 0.0371) {  // steps that miss every kink
      const double h = 1e-6;
      const double numeric = (d.value(op, x + h) - d.value(op, x - h)) / (2 * h);
      EXPECT_NEAR(d.derivative(op, x), numeric, 1e-6 * (1 + std::abs(numeric)))
          << d.name << " at " << x;
    }
  }
}

TEST(OpTable, KinksFollowPyTorch) {
  auto grad = [](const Op& op, double x) { return Describe(op.kind).derivative(op, x); };
  EXPECT_EQ(grad(Elementwise(OpKind::kRelu), 0.0), 0.0);         // threshold_backward: x > 0
  EXPECT_EQ(grad(LeakyRelu(0.2), 0.0), 0.2);                      // x > 0 ? 1 : slope
  EXPECT_EQ(grad(Clamp(-1, 1), -1.0), 1.0);                       // bounds included
  EXPECT_EQ(grad(Clamp(-1, 1), 1.0), 1.0);
  EXPECT_EQ(grad(Clamp(-1, 1), 1.5), 0.0);
  EXPECT_EQ(grad(Hardtanh(-1, 1), -1.0), 0.0);  // hardtanh_backward: bounds
  EXPECT_EQ(grad(Hardtanh(-1, 1), 1.0), 0.0);   // excluded
  EXPECT_EQ(grad(Hardtanh(0, 6), 0.0), 0.0);    // relu6 at 0 and 6
  EXPECT_EQ(grad(Hardtanh(0, 6), 6.0), 0.0);
  EXPECT_EQ(grad(Hardtanh(-1, 1), 0.999), 1.0);
  EXPECT_EQ(grad(Hardtanh(-1, 1), -1.5), 0.0);
  // PyTorch 2.11 (measured on the lent GPU): 0 at -3, 1 at 3; x/3 + 1/2 strictly between.
  EXPECT_EQ(grad(Elementwise(OpKind::kHardswish), -3.0), 0.0);
  EXPECT_EQ(grad(Elementwise(OpKind::kHardswish), 3.0), 1.0);
  EXPECT_EQ(grad(Elementwise(OpKind::kHardswish), 1.5), 1.0);
  EXPECT_EQ(grad(Elementwise(OpKind::kHardswish), -3.5), 0.0);
  EXPECT_EQ(grad(Elementwise(OpKind::kHardswish), 3.5), 1.0);
}

}  // namespace
}  // namespace fusejit
