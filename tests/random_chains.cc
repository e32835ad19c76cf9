#include "tests/random_chains.h"

#include <cmath>
#include <vector>

namespace fusejit {
namespace {

Dims3 RandomDims(Rng& rng, int64_t lo, int64_t hi) {
  if (rng.Chance(0.6)) {
    const int64_t v = rng.Int(lo, hi);
    return {v, v, v};
  }
  return {rng.Int(lo, hi), rng.Int(lo, hi), rng.Int(lo, hi)};
}

Op RandomElementwise(Rng& rng) {
  static const OpKind kKinds[] = {OpKind::kRelu,  OpKind::kLeakyRelu, OpKind::kSigmoid,
                                  OpKind::kTanh,  OpKind::kSwish,     OpKind::kHardswish,
                                  OpKind::kGelu,  OpKind::kClamp};
  const OpKind kind = kKinds[rng.Int(0, 7)];
  if (kind == OpKind::kLeakyRelu) {
    const double slope = rng.Uniform(0.001, 0.3);
    // About a sixth of them a multiply by +-[0.5, 2) instead, chosen without drawing (as
    // hardtanh below), so the chains after them stay the ones they were.
    if (slope > 0.25) return Mul((slope < 0.275 ? -1 : 1) * (0.5 + std::fmod(slope, 0.025) * 60));
    // And another sixth one of the smooth activations, from the slope's digits likewise.
    if (slope > 0.2) {
      const double f = std::fmod(slope, 0.01) * 100;  // in [0, 1)
      if (slope <= 0.21) return Elu(0.5 + f);
      if (slope <= 0.22) return Softplus(0.5 + 1.5 * f, 0.5 + 2 * f);  // threshold hit often
      if (slope <= 0.23) return Elementwise(OpKind::kMish);
      if (slope <= 0.24) return Elementwise(OpKind::kSelu);
      return Elementwise(OpKind::kHardsigmoid);
    }
    // And of the rest a sixth one of the activations added after those, likewise.
    if (slope > 0.15) {
      const double f = std::fmod(slope, 0.01) * 100;  // in [0, 1)
      if (slope <= 0.16) return Celu(0.5 + f);
      if (slope <= 0.17) return Elementwise(OpKind::kGeluTanh);
      if (slope <= 0.18) return Elementwise(OpKind::kLogsigmoid);
      if (slope <= 0.19) return Elementwise(OpKind::kSoftsign);
      return Elementwise(OpKind::kTanhshrink);
    }
    return LeakyRelu(slope);
  }
  if (kind == OpKind::kClamp) {
    // Windows of at least 0.5: a narrow window before a group_norm leaves values whose
    // deviations from the group mean are a few ulp of the mean, which rstd then amplifies -- an
    // fp32 cancellation every fp32 implementation shares (seen: width 0.11, eps 0.009, rel L2
    // 1.8e-5 with max abs 9e-6), not a kernel defect.
    const double lo = rng.Uniform(-1.0, 0.2);
    const double hi = lo + rng.Uniform(0.5, 1.5);
    // About a third of them hardtanh (the same values, the gradient without the bounds), chosen
    // without drawing, so the chains after them stay the ones they were.
    // And an eighth an addition of hi instead.
    if (lo >= -0.6 && lo < -0.45) return Add(hi);
    // And of the rest, by the window's width, about a tenth each a clamp with only min or only
    // max (the other bound at infinity).
    if (lo >= -0.6 && hi - lo > 1.4) return Clamp(lo, HUGE_VAL);
    if (lo >= -0.6 && hi - lo > 1.3) return Clamp(-HUGE_VAL, hi);
    return lo < -0.6 ? Hardtanh(lo, hi) : Clamp(lo, hi);
  }
  return Elementwise(kind);
}

std::vector<int64_t> Divisors(int64_t c) {
  std::vector<int64_t> d;
  for (int64_t g = 1; g <= c; ++g) {
    if (c % g == 0) d.push_back(g);
  }
  return d;
}

}  // namespace

Chain RandomChain(Rng& rng, const RandomChainOptions& options) {
  while (true) {
    Chain chain;
    const int64_t max_in =
        options.max_input_channels > 0 ? options.max_input_channels : options.max_channels / 2;
    chain.input = {rng.Int(1, options.max_batch), rng.Int(1, max_in),
                   rng.Int(3, options.max_spatial), rng.Int(3, options.max_spatial),
                   rng.Int(3, options.max_spatial)};
    int64_t channels = chain.input[1];
    if (rng.Chance(0.85)) {
      const bool transposed = rng.Chance(options.transposed_chance);
      const int64_t out = rng.Int(1, options.max_channels);
      Dims3 k = RandomDims(rng, 1, 3);
      const Dims3 stride = RandomDims(rng, 1, 3);
      const Dims3 padding = RandomDims(rng, 0, 2), dilation = RandomDims(rng, 1, 2);
      const bool bias = rng.Chance(0.75);
      // Drawn only when asked for, so the default options give the same chains as before.
      if (options.min_kernel_w != 1 || options.max_kernel_w != 3) {
        k[2] = rng.Int(options.min_kernel_w, options.max_kernel_w);
      }
      if (transposed) {
        Dims3 op = {0, 0, 0};
        for (int a = 0; a < 3; ++a) {
          const int64_t limit = std::max(stride[a], dilation[a]) - 1;
          op[a] = rng.Chance(0.5) ? rng.Int(0, limit) : 0;
        }
        chain.ops.push_back(ConvTranspose3d(out, k, stride, padding, op, dilation, bias));
      } else {
        chain.ops.push_back(Conv3d(out, k, stride, padding, dilation, bias));
      }
      channels = out;
    }
    for (int64_t i = rng.Int(0, 2); i > 0; --i) chain.ops.push_back(RandomElementwise(rng));
    if (rng.Chance(0.7)) {
      const std::vector<int64_t> divisors = Divisors(channels);
      chain.ops.push_back(GroupNorm(divisors[rng.Int(0, divisors.size() - 1)],
                                    rng.Chance(0.5) ? 1e-5 : rng.Uniform(1e-6, 1e-2)));
      for (int64_t i = rng.Int(0, 2); i > 0; --i) chain.ops.push_back(RandomElementwise(rng));
    }
    if (rng.Chance(0.3)) chain.ops.push_back(Mean(rng.Chance(0.5) ? std::vector<int>{2, 3, 4}
                                                                  : std::vector<int>{1, 2, 3, 4}));
    if (chain.ops.empty()) chain.ops.push_back(RandomElementwise(rng));
    if (ValidateChain(chain).ok()) return chain;
  }
}

}  // namespace fusejit
