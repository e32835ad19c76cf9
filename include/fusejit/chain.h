// fusejit/chain.h: the op-chain description a caller hands to fusejit.
//
// A chain is an input shape and dtype (NCDHW, contiguous) followed by ops:
//   [producer]  conv3d | conv_transpose3d            (optional, first)
//   elementwise relu, leaky_relu, sigmoid, tanh, swish (alias silu), hardswish, gelu, clamp,
//               hardtanh (clamp's values; gradient only strictly inside its bounds), mul, add,
//               mish, softplus, elu, selu, hardsigmoid, gelu_tanh, logsigmoid, softsign,
//               tanhshrink, celu
//   group_norm  at most one, affine, elementwise ops before and after it
//   mean        optional, last: dims [2,3,4] -> [N,C] or [1,2,3,4] -> [N]
//
// Its text form (the "spec") is canonical: FormatChain(ParseChain(s)) is the same string for every
// spelling of the same chain, so it serves as a log line, an error context and a cache key.
//   x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish |
//   group_norm(groups=4,eps=1e-5) | hardswish
//
// Parameters are named as PyTorch's nn.Sequential names them, by op index ("0.weight", "2.bias"),
// with PyTorch's shapes (Conv3d weight [Cout,Cin,kd,kh,kw]; ConvTranspose3d [Cin,Cout,kd,kh,kw]).
//
// Thread safety: all functions here are pure; a Chain is a value type.
#ifndef FUSEJIT_CHAIN_H_
#define FUSEJIT_CHAIN_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit {

using Dims3 = std::array<int64_t, 3>;  // (d, h, w)
using Shape = std::vector<int64_t>;

// Element type of a chain's tensors (input, parameters, output), written in specs as f32, f16,
// bf16, f64. Part of the chain, so of its canonical text and every cache key. f32 chains have
// plans (codegen/planner.h); bf16 and f16 chains run their f32 plan between casts
// (runtime/dtype_adapter.h); f64 parses and prints but Compile refuses it with an error naming the
// dtypes that have plans.
enum class DType { kF32, kF16, kBF16, kF64 };
const char* DTypeName(DType dtype);  // "f32", "f16", "bf16", "f64"
size_t DTypeBytes(DType dtype);           // 4, 2, 2, 8
// The dtype named `name` in spec spelling; false when there is none.
bool ParseDType(std::string_view name, DType* dtype);
// Host conversions, bit-identical to the GPU's (templates/dtype.cuh): round to nearest even, NaN
// stays NaN, overflow goes to infinity. RoundToDType gives v's value in `dtype` as a float (f32,
// f64: v). EncodeDType writes `count` values as `dtype` (DTypeBytes(dtype) each) to `out`;
// DecodeDType reads them back as floats (exact for f16 and bf16; f64 rounded to float).
float RoundToDType(float v, DType dtype);
void EncodeDType(const float* in, size_t count, DType dtype, void* out);
void DecodeDType(const void* in, size_t count, DType dtype, float* out);

enum class OpKind {
  kConv3d,
  kConvTranspose3d,
  kRelu,
  kLeakyRelu,
  kSigmoid,
  kTanh,
  kSwish,
  kHardswish,
  kGelu,
  kClamp,
  kHardtanh,
  kMul,  // x * by (a Python scalar multiply or divide: x * 2, x / 4)
  kAdd,  // x + by (x + 1, x - 0.5)
  kMish,         // x * tanh(softplus(x))
  kSoftplus,     // log(1 + e^(beta x)) / beta, x where beta x > threshold
  kElu,          // x > 0 ? x : alpha (e^x - 1)
  kSelu,         // scale * elu(x, alpha) with PyTorch's fixed scale and alpha
  kHardsigmoid,  // clamp(x / 6 + 1/2, 0, 1)
  kGeluTanh,     // gelu's tanh approximation (PyTorch's approximate='tanh')
  kLogsigmoid,   // log(sigmoid(x))
  kSoftsign,     // x / (1 + |x|)
  kTanhshrink,   // x - tanh(x)
  kCelu,         // max(0, x) + min(0, alpha (e^(x/alpha) - 1))
  kGroupNorm,
  kMean,
};

// Attributes of conv3d / conv_transpose3d, with PyTorch's defaults.
struct ConvAttrs {
  int64_t out_channels = 0;
  Dims3 kernel = {0, 0, 0};
  Dims3 stride = {1, 1, 1};
  Dims3 padding = {0, 0, 0};
  Dims3 output_padding = {0, 0, 0};  // conv_transpose3d only
  Dims3 dilation = {1, 1, 1};
  bool bias = true;
  bool operator==(const ConvAttrs&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ConvAttrs& c) {
    return H::combine(std::move(h), c.out_channels, c.kernel, c.stride, c.padding,
                      c.output_padding, c.dilation, c.bias);
  }
};

// One op. Only the fields of its kind are meaningful; the others keep their defaults so that
// operator== compares chains by content.
struct Op {
  OpKind kind = OpKind::kRelu;
  ConvAttrs conv;            // kConv3d, kConvTranspose3d
  double slope = 0.01;       // kLeakyRelu
  double min = 0, max = 0;   // kClamp, kHardtanh
  double by = 0;             // kMul (the factor), kAdd (the addend)
  double alpha = 1;          // kElu, kCelu
  double beta = 1, threshold = 20;  // kSoftplus (PyTorch's defaults)
  int64_t groups = 0;        // kGroupNorm
  double eps = 1e-5;         // kGroupNorm
  std::vector<int> dims;     // kMean: {2,3,4} or {1,2,3,4}
  bool operator==(const Op&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Op& op) {
    return H::combine(std::move(h), op.kind, op.conv, op.slope, op.min, op.max, op.by, op.alpha,
                      op.beta, op.threshold, op.groups, op.eps, op.dims);
  }
};

struct Chain {
  Shape input;  // [N, C, D, H, W]
  std::vector<Op> ops;
  DType dtype = DType::kF32;  // of the input, the parameters and the output
  bool operator==(const Chain&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Chain& c) {
    return H::combine(std::move(h), c.input, c.ops, c.dtype);
  }
};

// What fusejit accepts, checked by ParseChain and ValidateChain before any arithmetic on the
// values; each error names the limit it exceeded. Sizes beyond these are far outside what the
// plans are built for, and would make NVRTC (or the kernel) run for minutes.
struct ChainLimits {
  static constexpr size_t kMaxSpecBytes = 4096;    // length of a spec's text
  static constexpr size_t kMaxOps = 32;            // ops in one chain
  static constexpr int64_t kMaxSize = 1 << 20;     // each input size (N, C, D, H, W), out, groups
  static constexpr int64_t kMaxElements = 2147483647;  // of any tensor: 32-bit indexing
  static constexpr int64_t kMaxKernel = 32;        // each kernel size (k)
  static constexpr int64_t kMaxStride = 64;        // each stride, dilation, output_padding
  static constexpr int64_t kMaxPadding = 1024;     // each padding
  // Multiply-adds of one convolution: output elements x (input channels x kernel volume).
  static constexpr int64_t kMaxConvMacs = int64_t{1} << 44;
  // Input channels x kernel volume: the reduction behind one convolution output (the unrolled
  // loop NVRTC compiles).
  static constexpr int64_t kMaxReduction = int64_t{1} << 20;
};

// Builders for chains written in C++ (the alternative to ParseChain).
Op Conv3d(int64_t out_channels, Dims3 kernel, Dims3 stride = {1, 1, 1}, Dims3 padding = {0, 0, 0},
          Dims3 dilation = {1, 1, 1}, bool bias = true);
Op ConvTranspose3d(int64_t out_channels, Dims3 kernel, Dims3 stride = {1, 1, 1},
                   Dims3 padding = {0, 0, 0}, Dims3 output_padding = {0, 0, 0},
                   Dims3 dilation = {1, 1, 1}, bool bias = true);
// An op without arguments (relu, sigmoid, tanh, swish, hardswish, gelu, mish, selu, hardsigmoid,
// gelu_tanh, logsigmoid, softsign, tanhshrink), or softplus / elu / celu at PyTorch's defaults.
Op Elementwise(OpKind kind);
Op LeakyRelu(double slope = 0.01);
Op Clamp(double min, double max);
// PyTorch's hardtanh (nn.Hardtanh; nn.ReLU6 is Hardtanh(0, 6)): clamp's values, gradient 1 only
// strictly between min and max (0 at the bounds, where clamp's is 1).
Op Hardtanh(double min = -1, double max = 1);
// Multiplication by a constant, x * by (PyTorch: `x * 2.0`; `x / 4` is Mul(0.25)), and addition of
// one, x + by (`x + 1`, `x - 0.5` is Add(-0.5)).
Op Mul(double by);
Op Add(double by);
// PyTorch's softplus (nn.Softplus(beta, threshold)) and elu (nn.ELU(alpha)).
Op Softplus(double beta = 1, double threshold = 20);
Op Elu(double alpha = 1);
// PyTorch's celu (nn.CELU(alpha)): elu with its input scaled by 1/alpha.
Op Celu(double alpha = 1);
Op GroupNorm(int64_t groups, double eps = 1e-5);
Op Mean(std::vector<int> dims);

// Parses and validates a spec. Errors name the op, the argument and what would be valid, e.g.
// "op 3 group_norm(groups=5): 16 channels are not divisible by 5 groups".
absl::StatusOr<Chain> ParseChain(std::string_view spec);

// Checks a chain built in C++ against the grammar, the shape rules and ChainLimits, and that every
// number is finite and representable in the chain's dtype (ParseChain calls this).
absl::Status ValidateChain(const Chain& chain);

// The canonical spec text. REQUIRES: chain is valid.
std::string FormatChain(const Chain& chain);

// Name of an op kind as written in specs ("conv3d", "swish", ...).
std::string_view OpName(OpKind kind);
bool IsElementwise(OpKind kind);
bool IsProducer(OpKind kind);

// Shape after op i (the shape it writes). REQUIRES: chain is valid and i < ops.size().
Shape ShapeAfter(const Chain& chain, size_t i);
// The chain's output shape. REQUIRES: chain is valid.
Shape OutputShape(const Chain& chain);
int64_t NumElements(const Shape& shape);
std::string FormatShape(const Shape& shape);  // "[128,3,16,32,32]"

struct ParamSpec {
  std::string name;  // "0.weight"
  Shape shape;
  size_t op_index;
  bool operator==(const ParamSpec&) const = default;
};
// Every parameter the chain reads, in op order (weight before bias). REQUIRES: chain is valid.
std::vector<ParamSpec> ChainParams(const Chain& chain);

}  // namespace fusejit

#endif  // FUSEJIT_CHAIN_H_
