#include "codegen/op_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codegen/format_number.h"

namespace fusejit {
namespace {

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// gelu's tanh approximation: sqrt(2 / pi) and the cubic's coefficient (ATen's kBeta, kKappa).
constexpr double kGeluTanhBeta = 0.79788456080286535587989211986876;
constexpr double kGeluTanhKappa = 0.044715;

// SELU's constants (torch.nn.SELU, from Klambauer et al.).
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;

// PyTorch's softplus: x where beta x > threshold, else log(1 + e^(beta x)) / beta.
double SoftplusValue(double x, double beta, double threshold) {
  return x * beta > threshold ? x : std::log1p(std::exp(x * beta)) / beta;
}

// clamp's and hardtanh's values (they differ only in the derivative): the device statement, and
// min first, then max (PyTorch's result when min > max is max everywhere). A clamp's bound at
// infinity is one left out (clamp(min=0): only the lower one).
std::string ClampSource(const Op& op, DType t) {
  if (std::isinf(op.min)) return absl::StrCat("v = fj::clamp_max(v, ", RealLiteral(op.max, t), ");");
  if (std::isinf(op.max)) return absl::StrCat("v = fj::clamp_min(v, ", RealLiteral(op.min, t), ");");
  return absl::StrCat("v = fj::clamp(v, ", RealLiteral(op.min, t), ", ", RealLiteral(op.max, t),
                      ");");
}
double ClampValue(const Op& op, double x) { return std::min(std::max(x, op.min), op.max); }

// The elementwise rows' three functions. Kinks follow PyTorch's backward formulas:
// relu'(0) = 0 (threshold_backward: x > 0); leaky_relu'(0) = slope (x > 0 ? 1 : slope);
// clamp'(x) = 1 on [min, max] including the bounds (x >= min && x <= max); hardtanh'(x) = 1
// only strictly inside (min, max) (hardtanh_backward: 0 at and beyond the bounds);
// hardswish'(x) = 0 at and below -3, x/3 + 1/2 on (-3, 3), 1 at and above 3 (PyTorch >= 2.7's
// hardswish_backward, checked on the lent GPU's PyTorch 2.11: 0 at -3, 1 at 3).
const std::vector<OpDesc>& Rows() {
  static const auto* rows = new std::vector<OpDesc>{
      {OpKind::kConv3d, "conv3d", nullptr, OpRole::kProducer,
       {{"out", "out_channels"}, {"k", "kernel_size"}, {"stride", nullptr}, {"padding", nullptr},
        {"dilation", nullptr}, {"bias", nullptr}},
       nullptr, nullptr, nullptr},
      {OpKind::kConvTranspose3d, "conv_transpose3d", nullptr, OpRole::kProducer,
       {{"out", "out_channels"}, {"k", "kernel_size"}, {"stride", nullptr}, {"padding", nullptr},
        {"output_padding", nullptr}, {"dilation", nullptr}, {"bias", nullptr}},
       nullptr, nullptr, nullptr},
      {OpKind::kRelu, "relu", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::relu(v);"; },
       [](const Op&, double x) { return x < 0 ? 0.0 : x; },  // NaN stays NaN, as in PyTorch
       [](const Op&, double x) { return x > 0 ? 1.0 : 0.0; },
       [](const Op&) -> std::string { return "g = fj::relu_d(v);"; }},
      {OpKind::kLeakyRelu, "leaky_relu", nullptr, OpRole::kElementwise,
       {{"slope", "negative_slope"}},
       [](const Op& op, DType t) {
         return absl::StrCat("v = fj::leaky_relu(v, ", RealLiteral(op.slope, t), ");");
       },
       [](const Op& op, double x) { return x < 0 ? op.slope * x : x; },
       [](const Op& op, double x) { return x > 0 ? 1.0 : op.slope; },
       [](const Op& op) { return absl::StrCat("g = fj::leaky_relu_d(v, ", FloatLiteral(op.slope), ");"); }},
      {OpKind::kSigmoid, "sigmoid", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::sigmoid(v);"; },
       [](const Op&, double x) { return Sigmoid(x); },
       [](const Op&, double x) { return Sigmoid(x) * (1.0 - Sigmoid(x)); },
       [](const Op&) -> std::string { return "g = fj::sigmoid_d(v);"; }},
      {OpKind::kTanh, "tanh", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::tanh_(v);"; },
       [](const Op&, double x) { return std::tanh(x); },
       [](const Op&, double x) { return 1.0 - std::tanh(x) * std::tanh(x); },
       [](const Op&) -> std::string { return "g = fj::tanh_d(v);"; }},
      {OpKind::kSwish, "swish", "silu", OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::swish(v);"; },
       [](const Op&, double x) { return x * Sigmoid(x); },
       [](const Op&, double x) { return Sigmoid(x) * (1.0 + x * (1.0 - Sigmoid(x))); },
       [](const Op&) -> std::string { return "g = fj::swish_d(v);"; }},
      {OpKind::kHardswish, "hardswish", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::hardswish(v);"; },
       [](const Op&, double x) { return x * std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0; },
       [](const Op&, double x) { return x <= -3.0 ? 0.0 : x < 3.0 ? x / 3.0 + 0.5 : 1.0; },
       [](const Op&) -> std::string { return "g = fj::hardswish_d(v);"; }},
      {OpKind::kGelu, "gelu", nullptr, OpRole::kElementwise, {},  // the erf form
       [](const Op&, DType) -> std::string { return "v = fj::gelu(v);"; },
       [](const Op&, double x) { return 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2)); },
       [](const Op&, double x) {
         return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) * 0.5 * M_2_SQRTPI * M_SQRT1_2;
       },
       [](const Op&) -> std::string { return "g = fj::gelu_d(v);"; }},
      {OpKind::kClamp, "clamp", nullptr, OpRole::kElementwise, {{"min", nullptr}, {"max", nullptr}},
       ClampSource,
       ClampValue,
       [](const Op& op, double x) { return x >= op.min && x <= op.max ? 1.0 : 0.0; },
       [](const Op& op) {
         if (std::isinf(op.min)) return absl::StrCat("g = fj::clamp_max_d(v, ", FloatLiteral(op.max), ");");
         if (std::isinf(op.max)) return absl::StrCat("g = fj::clamp_min_d(v, ", FloatLiteral(op.min), ");");
         return absl::StrCat("g = fj::clamp_d(v, ", FloatLiteral(op.min), ", ", FloatLiteral(op.max),
                             ");");
       }},
      {OpKind::kHardtanh, "hardtanh", nullptr, OpRole::kElementwise,
       {{"min", "min_val"}, {"max", "max_val"}},
       ClampSource,
       ClampValue,
       [](const Op& op, double x) { return x > op.min && x < op.max ? 1.0 : 0.0; },
       [](const Op& op) {
         return absl::StrCat("g = fj::hardtanh_d(v, ", FloatLiteral(op.min), ", ",
                             FloatLiteral(op.max), ");");
       }},
      {OpKind::kMul, "mul", nullptr, OpRole::kElementwise, {{"by", "other"}},
       [](const Op& op, DType t) { return absl::StrCat("v = v * ", RealLiteral(op.by, t), ";"); },
       [](const Op& op, double x) { return x * op.by; },
       [](const Op& op, double) { return op.by; },
       [](const Op& op) { return absl::StrCat("g = ", FloatLiteral(op.by), ";"); }},
      {OpKind::kAdd, "add", nullptr, OpRole::kElementwise, {{"by", "other"}},
       [](const Op& op, DType t) { return absl::StrCat("v = v + ", RealLiteral(op.by, t), ";"); },
       [](const Op& op, double x) { return x + op.by; },
       [](const Op&, double) { return 1.0; },
       [](const Op&) -> std::string { return "g = 1.f;"; }},
      // mish, softplus, elu, selu, hardsigmoid: PyTorch's CUDA formulas (ATen's
      // ActivationMishKernel, ActivationSoftplusKernel, ActivationEluKernel,
      // ActivationHardsigmoidKernel): elu's e^x - 1 as expm1; elu'(0) = alpha (x <= 0 takes
      // alpha e^x); softplus' = 1 where beta x > threshold, else sigmoid(beta x); hardsigmoid'
      // = 1/6 only strictly inside (-3, 3).
      {OpKind::kMish, "mish", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::mish(v);"; },
       [](const Op&, double x) { return x * std::tanh(std::log1p(std::exp(x))); },
       [](const Op&, double x) {
         const double t = std::tanh(std::log1p(std::exp(x)));
         return t + x * Sigmoid(x) * (1.0 - t * t);
       },
       [](const Op&) -> std::string { return "g = fj::mish_d(v);"; }},
      {OpKind::kSoftplus, "softplus", nullptr, OpRole::kElementwise,
       {{"beta", nullptr}, {"threshold", nullptr}},
       [](const Op& op, DType t) {
         return absl::StrCat("v = fj::softplus(v, ", RealLiteral(op.beta, t), ", ",
                             RealLiteral(op.threshold, t), ");");
       },
       [](const Op& op, double x) { return SoftplusValue(x, op.beta, op.threshold); },
       [](const Op& op, double x) {
         return x * op.beta > op.threshold ? 1.0 : Sigmoid(x * op.beta);
       },
       [](const Op& op) {
         return absl::StrCat("g = fj::softplus_d(v, ", FloatLiteral(op.beta), ", ",
                             FloatLiteral(op.threshold), ");");
       }},
      {OpKind::kElu, "elu", nullptr, OpRole::kElementwise, {{"alpha", nullptr}},
       [](const Op& op, DType t) {
         return absl::StrCat("v = fj::elu(v, ", RealLiteral(op.alpha, t), ", ",
                             RealLiteral(1.0, t), ");");
       },
       [](const Op& op, double x) { return x > 0 ? x : op.alpha * std::expm1(x); },
       [](const Op& op, double x) { return x > 0 ? 1.0 : op.alpha * std::exp(x); },
       [](const Op& op) {
         return absl::StrCat("g = fj::elu_d(v, ", FloatLiteral(op.alpha), ", 1.f);");
       }},
      {OpKind::kSelu, "selu", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType t) {
         return absl::StrCat("v = fj::elu(v, ", RealLiteral(kSeluAlpha * kSeluScale, t), ", ",
                             RealLiteral(kSeluScale, t), ");");
       },
       [](const Op&, double x) {
         return kSeluScale * (x > 0 ? x : kSeluAlpha * std::expm1(x));
       },
       [](const Op&, double x) { return kSeluScale * (x > 0 ? 1.0 : kSeluAlpha * std::exp(x)); },
       [](const Op&) {
         return absl::StrCat("g = fj::elu_d(v, ", FloatLiteral(kSeluAlpha * kSeluScale), ", ",
                             FloatLiteral(kSeluScale), ");");
       }},
      {OpKind::kHardsigmoid, "hardsigmoid", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::hardsigmoid(v);"; },
       [](const Op&, double x) { return std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0; },
       [](const Op&, double x) { return x > -3.0 && x < 3.0 ? 1.0 / 6.0 : 0.0; },
       [](const Op&) -> std::string { return "g = fj::hardsigmoid_d(v);"; }},
      // gelu_tanh, logsigmoid: PyTorch's CUDA formulas (ATen's GeluCUDAKernelImpl with
      // approximate='tanh', LogSigmoid's kernels); softsign x / (1 + |x|) and tanhshrink
      // x - tanh(x) are PyTorch composites, their gradients autograd's (1 / (1 + |x|)^2 and
      // tanh(x)^2); celu is elu's kernel with input scale 1/alpha (celu'(x <= 0) = e^(x/alpha),
      // 1 at 0).
      {OpKind::kGeluTanh, "gelu_tanh", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::gelu_tanh(v);"; },
       [](const Op&, double x) {
         return 0.5 * x * (1.0 + std::tanh(kGeluTanhBeta * (x + kGeluTanhKappa * x * x * x)));
       },
       [](const Op&, double x) {
         const double t = std::tanh(kGeluTanhBeta * (x + kGeluTanhKappa * x * x * x));
         return 0.5 * (1.0 + t) +
                0.5 * x * (1.0 - t * t) * kGeluTanhBeta * (1.0 + 3.0 * kGeluTanhKappa * x * x);
       },
       [](const Op&) -> std::string { return "g = fj::gelu_tanh_d(v);"; }},
      {OpKind::kLogsigmoid, "logsigmoid", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::logsigmoid(v);"; },
       [](const Op&, double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); },
       [](const Op&, double x) { return Sigmoid(-x); },
       [](const Op&) -> std::string { return "g = fj::logsigmoid_d(v);"; }},
      {OpKind::kSoftsign, "softsign", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::softsign(v);"; },
       [](const Op&, double x) { return x / (1.0 + std::abs(x)); },
       [](const Op&, double x) { return 1.0 / ((1.0 + std::abs(x)) * (1.0 + std::abs(x))); },
       [](const Op&) -> std::string { return "g = fj::softsign_d(v);"; }},
      {OpKind::kTanhshrink, "tanhshrink", nullptr, OpRole::kElementwise, {},
       [](const Op&, DType) -> std::string { return "v = fj::tanhshrink(v);"; },
       [](const Op&, double x) { return x - std::tanh(x); },
       [](const Op&, double x) { return std::tanh(x) * std::tanh(x); },
       [](const Op&) -> std::string { return "g = fj::tanhshrink_d(v);"; }},
      {OpKind::kCelu, "celu", nullptr, OpRole::kElementwise, {{"alpha", nullptr}},
       [](const Op& op, DType t) {
         return absl::StrCat("v = fj::celu(v, ", RealLiteral(op.alpha, t), ", ",
                             RealLiteral(1.0 / op.alpha, t), ");");
       },
       [](const Op& op, double x) { return x > 0 ? x : op.alpha * std::expm1(x / op.alpha); },
       [](const Op& op, double x) { return x > 0 ? 1.0 : std::exp(x / op.alpha); },
       [](const Op& op) {
         return absl::StrCat("g = fj::celu_d(v, ", FloatLiteral(1.0 / op.alpha), ");");
       }},
      {OpKind::kGroupNorm, "group_norm", nullptr, OpRole::kGroupNorm,
       {{"groups", "num_groups"}, {"eps", nullptr}}, nullptr, nullptr, nullptr},
      {OpKind::kMean, "mean", nullptr, OpRole::kMean, {{"dims", "dim"}}, nullptr, nullptr, nullptr},
  };
  return *rows;
}

}  // namespace

const std::vector<OpDesc>& OpTable() { return Rows(); }

const OpDesc& Describe(OpKind kind) {
  const std::vector<OpDesc>& rows = Rows();
  for (const OpDesc& d : rows) {
    if (d.kind == kind) return d;
  }
  return rows.front();  // unreachable for a valid OpKind (OpTableTest checks every kind has a row)
}

const OpDesc* FindOp(std::string_view name) {
  for (const OpDesc& d : Rows()) {
    if (name == d.name || (d.alias != nullptr && name == d.alias)) return &d;
  }
  return nullptr;
}

std::string OpNamesText() {
  std::string s;
  for (const OpDesc& d : Rows()) {
    absl::StrAppend(&s, s.empty() ? "" : ", ", d.name);
    if (d.alias != nullptr) absl::StrAppend(&s, " (", d.alias, ")");
  }
  return s;
}

}  // namespace fusejit
