// Chain builders, validation, shape inference, parameter listing and canonical printing.
#include "fusejit/chain.h"

#include "codegen/op_table.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/format_number.h"

namespace fusejit {
namespace {

// Largest element count of any tensor fusejit accepts: kernels index with 32-bit integers.
constexpr int64_t kMaxElements = ChainLimits::kMaxElements;
static_assert(kMaxElements == std::numeric_limits<int32_t>::max());

// a * b + c and friends without overflow: false when the result does not fit int64_t.
bool MulAdd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t p = 0;
  return !__builtin_mul_overflow(a, b, &p) && !__builtin_add_overflow(p, c, out);
}

std::string Dims3Text(const Dims3& d) {
  if (d[0] == d[1] && d[1] == d[2]) return absl::StrCat(d[0]);
  return absl::StrCat("[", d[0], ",", d[1], ",", d[2], "]");
}

std::string OpText(const Op& op) {
  std::string s(OpName(op.kind));
  switch (op.kind) {
    case OpKind::kConv3d:
    case OpKind::kConvTranspose3d: {
      const ConvAttrs& c = op.conv;
      absl::StrAppend(&s, "(out=", c.out_channels, ",k=", Dims3Text(c.kernel));
      if (c.stride != Dims3{1, 1, 1}) absl::StrAppend(&s, ",stride=", Dims3Text(c.stride));
      if (c.padding != Dims3{0, 0, 0}) absl::StrAppend(&s, ",padding=", Dims3Text(c.padding));
      if (c.output_padding != Dims3{0, 0, 0}) {
        absl::StrAppend(&s, ",output_padding=", Dims3Text(c.output_padding));
      }
      if (c.dilation != Dims3{1, 1, 1}) absl::StrAppend(&s, ",dilation=", Dims3Text(c.dilation));
      if (!c.bias) absl::StrAppend(&s, ",bias=false");
      absl::StrAppend(&s, ")");
      break;
    }
    case OpKind::kLeakyRelu:
      absl::StrAppend(&s, "(slope=", FormatDouble(op.slope), ")");
      break;
    case OpKind::kClamp:  // a bound at infinity is one left out
      if (std::isinf(op.min)) {
        absl::StrAppend(&s, "(max=", FormatDouble(op.max), ")");
      } else if (std::isinf(op.max)) {
        absl::StrAppend(&s, "(min=", FormatDouble(op.min), ")");
      } else {
        absl::StrAppend(&s, "(min=", FormatDouble(op.min), ",max=", FormatDouble(op.max), ")");
      }
      break;
    case OpKind::kHardtanh:
      absl::StrAppend(&s, "(min=", FormatDouble(op.min), ",max=", FormatDouble(op.max), ")");
      break;
    case OpKind::kMul:
    case OpKind::kAdd:
      absl::StrAppend(&s, "(by=", FormatDouble(op.by), ")");
      break;
    case OpKind::kSoftplus:
      absl::StrAppend(&s, "(beta=", FormatDouble(op.beta), ",threshold=",
                      FormatDouble(op.threshold), ")");
      break;
    case OpKind::kElu:
    case OpKind::kCelu:
      absl::StrAppend(&s, "(alpha=", FormatDouble(op.alpha), ")");
      break;
    case OpKind::kGroupNorm:
      absl::StrAppend(&s, "(groups=", op.groups, ",eps=", FormatDouble(op.eps), ")");
      break;
    case OpKind::kMean:
      absl::StrAppend(&s, "(dims=[", absl::StrJoin(op.dims, ","), "])");
      break;
    default:
      break;
  }
  return s;
}

// Checked product; false on overflow past kMaxElements.
bool CheckedCount(const Shape& shape, int64_t* count) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return false;
    if (n > kMaxElements / d) return false;
    n *= d;
  }
  *count = n;
  return true;
}

// Output spatial extent of a conv along one axis (PyTorch's formulas), in overflow-checked
// arithmetic; nullopt when an intermediate does not fit int64_t (only for values beyond
// ChainLimits, which ValidateChain refuses first).
std::optional<int64_t> ConvOutExtent(const Op& op, int64_t in, int axis) {
  const ConvAttrs& c = op.conv;
  const int64_t k = c.kernel[axis], s = c.stride[axis], p = c.padding[axis],
                dil = c.dilation[axis];
  int64_t span = 0, reach = 0, padded = 0, out = 0;
  if (!MulAdd(dil, k - 1, 1, &reach) || !MulAdd(2, p, in, &padded)) return std::nullopt;
  if (op.kind == OpKind::kConv3d) {
    if (__builtin_sub_overflow(padded, reach, &span)) return std::nullopt;
    return span < 0 ? 0 : span / s + 1;
  }
  // (in - 1) * s - 2 * p + dil * (k - 1) + output_padding + 1; 2 * p fits (checked above).
  int64_t tail = 0;
  if (__builtin_add_overflow(reach, c.output_padding[axis], &tail) ||
      !MulAdd(in - 1, s, tail, &out) || __builtin_sub_overflow(out, 2 * p, &out)) {
    return std::nullopt;
  }
  return out;
}

Shape ProducerShape(const Op& op, const Shape& in) {
  Shape out = {in[0], op.conv.out_channels, 0, 0, 0};
  for (int a = 0; a < 3; ++a) out[2 + a] = ConvOutExtent(op, in[2 + a], a).value_or(-1);
  return out;
}

std::string OpContext(size_t i, const Op& op) {
  return absl::StrCat("op ", i, " ", OpText(op), ": ");
}

absl::Status ValidateConv(size_t i, const Op& op, const Shape& in) {
  const ConvAttrs& c = op.conv;
  const std::string ctx = OpContext(i, op);
  const bool transposed = op.kind == OpKind::kConvTranspose3d;
  if (c.out_channels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "out=", c.out_channels, " must be a positive channel count"));
  }
  if (c.out_channels > ChainLimits::kMaxSize) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, "out=", c.out_channels,
                                                   " is over the limit of ",
                                                   ChainLimits::kMaxSize, " channels"));
  }
  static constexpr const char* kAxis[3] = {"d", "h", "w"};
  // Limits first, so that all arithmetic below is on small numbers.
  for (int a = 0; a < 3; ++a) {
    struct Limit {
      const char* name;
      int64_t value, max;
    };
    for (const Limit& l : {Limit{"k", c.kernel[a], ChainLimits::kMaxKernel},
                           Limit{"stride", c.stride[a], ChainLimits::kMaxStride},
                           Limit{"padding", c.padding[a], ChainLimits::kMaxPadding},
                           Limit{"dilation", c.dilation[a], ChainLimits::kMaxStride},
                           Limit{"output_padding", c.output_padding[a], ChainLimits::kMaxStride}}) {
      if (l.value > l.max) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, l.name, " (", kAxis[a], ") is ",
                                                       l.value, "; the limit is ", l.max));
      }
    }
  }
  for (int a = 0; a < 3; ++a) {
    if (c.kernel[a] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "k (", kAxis[a], ") is ", c.kernel[a],
                                                     "; kernel sizes must be >= 1"));
    }
    if (c.stride[a] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "stride (", kAxis[a], ") is ",
                                                     c.stride[a], "; strides must be >= 1"));
    }
    if (c.padding[a] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "padding (", kAxis[a], ") is ",
                                                     c.padding[a], "; padding must be >= 0"));
    }
    if (c.dilation[a] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "dilation (", kAxis[a], ") is ",
                                                     c.dilation[a], "; dilation must be >= 1"));
    }
    if (c.output_padding[a] != 0) {
      if (!transposed) {
        return absl::InvalidArgumentError(
            absl::StrCat(ctx, "output_padding applies to conv_transpose3d only"));
      }
      if (c.output_padding[a] < 0 ||
          (c.output_padding[a] >= c.stride[a] && c.output_padding[a] >= c.dilation[a])) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, "output_padding (", kAxis[a], ") is ", c.output_padding[a],
            "; it must be >= 0 and smaller than either stride (", c.stride[a],
            ") or dilation (", c.dilation[a], ")"));
      }
    }
    const std::optional<int64_t> extent = ConvOutExtent(op, in[2 + a], a);
    if (!extent.has_value()) {  // unreachable within the limits above; kept for safety
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, "output size along ", kAxis[a], " overflows 64-bit arithmetic"));
    }
    const int64_t ext = *extent;
    if (ext > ChainLimits::kMaxSize) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "output size along ", kAxis[a], " is ",
                                                     ext, "; the limit is ",
                                                     ChainLimits::kMaxSize));
    }
    if (ext <= 0) {
      if (!transposed) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, "kernel extent ", c.dilation[a] * (c.kernel[a] - 1) + 1, " along ", kAxis[a],
            " is larger than the padded input (", in[2 + a], " + 2*", c.padding[a], " = ",
            in[2 + a] + 2 * c.padding[a], "); use a smaller k or dilation, or more padding"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, "output size along ", kAxis[a], " would be ", ext,
          "; padding is too large for this input, kernel and stride"));
    }
  }
  return absl::OkStatus();
}

// The range of a dtype's finite values: largest magnitude and smallest positive (subnormal).
struct RealRange {
  double max, min_positive;
};
RealRange RangeOf(DType dtype) {
  switch (dtype) {
    case DType::kF16: return {65504.0, 5.9604644775390625e-08};
    case DType::kBF16: return {3.3895313892515355e38, 9.183549615799121e-41};
    case DType::kF64:
      return {std::numeric_limits<double>::max(), std::numeric_limits<double>::denorm_min()};
    case DType::kF32: break;
  }
  return {std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
}

// A real argument must be finite and within the dtype's range; `nonzero`: it must not round to
// 0 in the dtype either (a value below half the smallest positive one does). Only comparisons
// of doubles: nothing is converted before it is known to fit.
absl::Status CheckReal(const std::string& ctx, const char* name, double v, DType dtype,
                       bool nonzero) {
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, name, " must be a finite number"));
  }
  const RealRange range = RangeOf(dtype);
  const std::string dt(DTypeName(dtype));
  if (std::fabs(v) > range.max) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, name, "=", FormatDouble(v), " is beyond the range of ", dt, " (largest magnitude ",
        FormatDouble(range.max), ")"));
  }
  if (nonzero && std::fabs(v) <= range.min_positive / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, name, "=", FormatDouble(v), " rounds to 0 in ", dt, " (its smallest positive value is ",
        FormatDouble(range.min_positive), "); ", name, " must not be 0"));
  }
  return absl::OkStatus();
}

// The work of one convolution, refused before NVRTC or the GPU spend minutes on it: the
// reduction behind each output (input channels x kernel volume) and the multiply-adds in all.
absl::Status CheckConvWork(const std::string& ctx, const Op& op, const Shape& in,
                           const Shape& out) {
  const ConvAttrs& c = op.conv;
  int64_t kvol = c.kernel[0] * c.kernel[1] * c.kernel[2];  // <= 32^3: within limits
  int64_t reduction = 0, macs = 0;
  // conv3d: every output sums Cin x kvol products. conv_transpose3d: every input element is
  // scattered to Cout x kvol outputs (each output sums about Cin x kvol / stride^3).
  const bool transposed = op.kind == OpKind::kConvTranspose3d;
  const bool overflow =
      __builtin_mul_overflow(in[1], kvol, &reduction) ||
      (transposed ? __builtin_mul_overflow(NumElements(in), c.out_channels * kvol, &macs)
                  : __builtin_mul_overflow(reduction, NumElements(out), &macs));
  if (overflow || reduction > ChainLimits::kMaxReduction) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, "each output sums ", in[1], " channels x ", kvol, " kernel taps = ",
        overflow ? std::string("too many") : absl::StrCat(reduction),
        " products; the limit is ", ChainLimits::kMaxReduction));
  }
  if (macs > ChainLimits::kMaxConvMacs) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, "the convolution needs ", macs, " multiply-adds (input ", FormatShape(in),
        ", output ", FormatShape(out), "); the limit for one kernel is ",
        ChainLimits::kMaxConvMacs));
  }
  return absl::OkStatus();
}

}  // namespace

Op Conv3d(int64_t out_channels, Dims3 kernel, Dims3 stride, Dims3 padding, Dims3 dilation,
          bool bias) {
  Op op;
  op.kind = OpKind::kConv3d;
  op.conv = {out_channels, kernel, stride, padding, {0, 0, 0}, dilation, bias};
  return op;
}

Op ConvTranspose3d(int64_t out_channels, Dims3 kernel, Dims3 stride, Dims3 padding,
                   Dims3 output_padding, Dims3 dilation, bool bias) {
  Op op;
  op.kind = OpKind::kConvTranspose3d;
  op.conv = {out_channels, kernel, stride, padding, output_padding, dilation, bias};
  return op;
}

Op Elementwise(OpKind kind) {
  Op op;
  op.kind = kind;
  return op;
}

Op LeakyRelu(double slope) {
  Op op;
  op.kind = OpKind::kLeakyRelu;
  op.slope = slope;
  return op;
}

Op Clamp(double min, double max) {
  Op op;
  op.kind = OpKind::kClamp;
  op.min = min;
  op.max = max;
  return op;
}

Op Hardtanh(double min, double max) {
  Op op = Clamp(min, max);
  op.kind = OpKind::kHardtanh;
  return op;
}

Op Mul(double by) {
  Op op;
  op.kind = OpKind::kMul;
  op.by = by;
  return op;
}

Op Add(double by) {
  Op op = Mul(by);
  op.kind = OpKind::kAdd;
  return op;
}

Op Softplus(double beta, double threshold) {
  Op op;
  op.kind = OpKind::kSoftplus;
  op.beta = beta;
  op.threshold = threshold;
  return op;
}

Op Elu(double alpha) {
  Op op;
  op.kind = OpKind::kElu;
  op.alpha = alpha;
  return op;
}

Op Celu(double alpha) {
  Op op;
  op.kind = OpKind::kCelu;
  op.alpha = alpha;
  return op;
}

Op GroupNorm(int64_t groups, double eps) {
  Op op;
  op.kind = OpKind::kGroupNorm;
  op.groups = groups;
  op.eps = eps;
  return op;
}

Op Mean(std::vector<int> dims) {
  Op op;
  op.kind = OpKind::kMean;
  op.dims = std::move(dims);
  return op;
}

std::string_view OpName(OpKind kind) { return Describe(kind).name; }

bool IsProducer(OpKind kind) { return Describe(kind).role == OpRole::kProducer; }

bool IsElementwise(OpKind kind) { return Describe(kind).role == OpRole::kElementwise; }

absl::Status ValidateChain(const Chain& chain) {
  if (chain.input.size() != 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("input x has ", chain.input.size(), " dimensions ", FormatShape(chain.input),
                     "; fusejit takes 5-D NCDHW input such as x:f32[8,3,16,32,32]"));
  }
  int64_t count = 0;
  for (int64_t d : chain.input) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("input x", FormatShape(chain.input),
                                                     ": every size must be >= 1"));
    }
    if (d > ChainLimits::kMaxSize) {
      return absl::InvalidArgumentError(absl::StrCat("input x", FormatShape(chain.input), ": size ",
                                                     d, " is over the limit of ",
                                                     ChainLimits::kMaxSize));
    }
  }
  if (!CheckedCount(chain.input, &count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input x", FormatShape(chain.input), " has more than ", kMaxElements,
        " elements; fusejit kernels index tensors with 32-bit integers"));
  }
  if (chain.ops.empty()) {
    return absl::InvalidArgumentError(
        "the chain has no ops; write at least one, e.g. 'x:f32[1,3,8,8,8] | relu'");
  }
  if (chain.ops.size() > ChainLimits::kMaxOps) {
    return absl::InvalidArgumentError(absl::StrCat("the chain has ", chain.ops.size(),
                                                   " ops; the limit is ", ChainLimits::kMaxOps));
  }
  Shape shape = chain.input;
  int group_norms = 0;
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const Op& op = chain.ops[i];
    const std::string ctx = OpContext(i, op);
    if (IsProducer(op.kind)) {
      if (i != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, "a convolution must be the first op of the chain (fusejit fuses one producer)"));
      }
      if (absl::Status s = ValidateConv(i, op, shape); !s.ok()) return s;
      shape = ProducerShape(op, shape);
      if (!CheckedCount(shape, &count)) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, "output ", FormatShape(shape), " has more than ", kMaxElements, " elements"));
      }
      int64_t wcount = 0;
      if (!CheckedCount(ChainParams(Chain{chain.input, {op}})[0].shape, &wcount)) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, "weight is too large"));
      }
      if (absl::Status s = CheckConvWork(ctx, op, chain.input, shape); !s.ok()) return s;
      continue;
    }
    switch (op.kind) {
      case OpKind::kLeakyRelu:
        if (absl::Status s = CheckReal(ctx, "slope", op.slope, chain.dtype, false); !s.ok()) {
          return s;
        }
        break;
      case OpKind::kMul:
      case OpKind::kAdd:
        if (absl::Status s = CheckReal(ctx, "by", op.by, chain.dtype, false); !s.ok()) return s;
        break;
      case OpKind::kSoftplus:
        if (absl::Status s = CheckReal(ctx, "beta", op.beta, chain.dtype, true); !s.ok()) {
          return s;
        }
        if (absl::Status s = CheckReal(ctx, "threshold", op.threshold, chain.dtype, false);
            !s.ok()) {
          return s;
        }
        break;
      case OpKind::kElu:
        if (absl::Status s = CheckReal(ctx, "alpha", op.alpha, chain.dtype, false); !s.ok()) {
          return s;
        }
        break;
      case OpKind::kCelu:  // (it divides by alpha)
        if (absl::Status s = CheckReal(ctx, "alpha", op.alpha, chain.dtype, true); !s.ok()) {
          return s;
        }
        break;
      case OpKind::kClamp:
      case OpKind::kHardtanh:
        // clamp's left-out bound is min = -inf or max = +inf (not both); the others are finite
        if (op.kind == OpKind::kClamp && op.min == -HUGE_VAL && op.max == HUGE_VAL) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "clamp needs a finite min, max or both"));
        }
        for (auto [name, v] : {std::pair{"min", op.min}, std::pair{"max", op.max}}) {
          if (op.kind == OpKind::kClamp && v == (name[1] == 'i' ? -HUGE_VAL : HUGE_VAL)) continue;
          if (absl::Status s = CheckReal(ctx, name, v, chain.dtype, false); !s.ok()) return s;
        }
        if (op.min > op.max) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "min and max must be finite with min <= max"));
        }
        break;
      case OpKind::kGroupNorm:
        if (++group_norms > 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "a chain may have at most one group_norm"));
        }
        if (op.groups <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "groups=", op.groups, " must be >= 1"));
        }
        if (shape[1] % op.groups != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              ctx, shape[1], " channels are not divisible by ", op.groups,
              " groups; use a number of groups that divides ", shape[1]));
        }
        if (!(op.eps > 0) || !std::isfinite(op.eps)) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "eps must be a positive finite number"));
        }
        if (absl::Status s = CheckReal(ctx, "eps", op.eps, chain.dtype, true); !s.ok()) return s;
        break;
      case OpKind::kMean:
        if (i + 1 != chain.ops.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(ctx, "mean must be the last op of the chain"));
        }
        if (op.dims != std::vector<int>{2, 3, 4} && op.dims != std::vector<int>{1, 2, 3, 4}) {
          return absl::InvalidArgumentError(absl::StrCat(
              ctx, "dims must be [2,3,4] (giving [N,C]) or [1,2,3,4] (giving [N])"));
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

Shape ShapeAfter(const Chain& chain, size_t i) {
  Shape shape = chain.input;
  for (size_t j = 0; j <= i && j < chain.ops.size(); ++j) {
    const Op& op = chain.ops[j];
    if (IsProducer(op.kind)) {
      shape = ProducerShape(op, shape);
    } else if (op.kind == OpKind::kMean) {
      shape = op.dims.size() == 3 ? Shape{shape[0], shape[1]} : Shape{shape[0]};
    }
  }
  return shape;
}

Shape OutputShape(const Chain& chain) { return ShapeAfter(chain, chain.ops.size() - 1); }

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string FormatShape(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::vector<ParamSpec> ChainParams(const Chain& chain) {
  std::vector<ParamSpec> params;
  Shape shape = chain.input;
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const Op& op = chain.ops[i];
    const std::string prefix = absl::StrCat(i, ".");
    if (IsProducer(op.kind)) {
      const ConvAttrs& c = op.conv;
      const int64_t cin = shape[1], cout = c.out_channels;
      Shape w = op.kind == OpKind::kConv3d ? Shape{cout, cin} : Shape{cin, cout};
      w.insert(w.end(), c.kernel.begin(), c.kernel.end());
      params.push_back({prefix + "weight", w, i});
      if (c.bias) params.push_back({prefix + "bias", {cout}, i});
    } else if (op.kind == OpKind::kGroupNorm) {
      params.push_back({prefix + "weight", {shape[1]}, i});
      params.push_back({prefix + "bias", {shape[1]}, i});
    }
    shape = ShapeAfter(chain, i);
  }
  return params;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
  }
  return "?";
}

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kF32: return 4;
    case DType::kF64: return 8;
  }
  return 0;
}

bool ParseDType(std::string_view name, DType* dtype) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    if (DTypeName(d) == name) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

std::string FormatChain(const Chain& chain) {
  std::string s = absl::StrCat("x:", std::string(DTypeName(chain.dtype)), FormatShape(chain.input));
  for (const Op& op : chain.ops) absl::StrAppend(&s, " | ", OpText(op));
  return s;
}

}  // namespace fusejit
