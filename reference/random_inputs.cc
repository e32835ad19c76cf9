// reference/random_inputs.cc: RandomInputs, deterministic test data for a chain.
//
// Each tensor has its own stream: std::mt19937_64 seeded with seed ^ FNV-1a-64(name) ("x",
// "0.weight", ...), so adding a parameter to a chain leaves the other tensors' values unchanged.
// mt19937_64's output is fixed by the C++ standard and the conversion to [0,1) is our own
// ((r >> 11) * 2^-53), so the data is identical with every standard library.
#include <cmath>
#include <limits>
#include <random>
#include <string_view>

#include "fusejit/reference.h"

namespace fusejit {
namespace {

// FNV-1a, 64 bits: a fixed string hash (std::hash differs between standard libraries).
uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A tensor of `shape` with values uniform in [lo, hi), from the stream of (seed, name).
HostTensor Uniform(const Shape& shape, double lo, double hi, uint64_t seed, std::string_view name) {
  std::mt19937_64 engine(seed ^ Fnv1a64(name));
  HostTensor t;
  t.shape = shape;
  t.data.resize(static_cast<size_t>(NumElements(shape)));
  for (float& v : t.data) {
    const double u = static_cast<double>(engine() >> 11) * 0x1p-53;  // [0, 1)
    v = static_cast<float>(lo + (hi - lo) * u);
    // Rounding to float can reach hi (e.g. 1 - 2^-53 rounds to 1.0f); keep the range half-open.
    while (static_cast<double>(v) >= hi) {
      v = std::nextafter(v, -std::numeric_limits<float>::infinity());
    }
  }
  return t;
}

// PyTorch's default init for Conv3d and ConvTranspose3d draws weight and bias from
// +-1/sqrt(fan_in), fan_in = weight.shape[1] * kd * kh * kw: Cin * k^3 for conv3d, Cout * k^3 for
// conv_transpose3d (whose weight is [Cin, Cout, kd, kh, kw]).
int64_t ConvFanIn(const std::vector<ParamSpec>& specs, size_t op_index) {
  for (const ParamSpec& p : specs) {
    if (p.op_index == op_index && p.name.ends_with(".weight")) {
      return p.shape[1] * p.shape[2] * p.shape[3] * p.shape[4];
    }
  }
  return 1;  // unreachable for valid chains: every conv has a weight
}

}  // namespace

HostInputs RandomInputs(const Chain& chain, uint64_t seed) {
  HostInputs in;
  in.x = Uniform(chain.input, 0.0, 1.0, seed, "x");
  const std::vector<ParamSpec> specs = ChainParams(chain);
  for (const ParamSpec& spec : specs) {
    const Op& op = chain.ops[spec.op_index];
    double lo = 0, hi = 0;
    if (op.kind == OpKind::kGroupNorm) {
      const bool is_bias = spec.name.ends_with(".bias");
      lo = is_bias ? -0.5 : 0.5;
      hi = is_bias ? 0.5 : 1.5;
    } else {
      hi = 1.0 / std::sqrt(static_cast<double>(ConvFanIn(specs, spec.op_index)));
      lo = -hi;
    }
    in.params[spec.name] = Uniform(spec.shape, lo, hi, seed, spec.name);
  }
  // Values the chain's dtype holds exactly, so the GPU and the reference see the same numbers.
  if (chain.dtype != DType::kF32) {
    for (float& v : in.x.data) v = RoundToDType(v, chain.dtype);
    for (auto& [name, t] : in.params) {
      for (float& v : t.data) v = RoundToDType(v, chain.dtype);
    }
  }
  return in;
}

}  // namespace fusejit
