// tests/random_chains.h: random valid chains for tests (odd sizes, strides 1-3, padding,
// dilation, output_padding, groups dividing the channels, batch 1 to 8).
#ifndef FUSEJIT_TESTS_RANDOM_CHAINS_H_
#define FUSEJIT_TESTS_RANDOM_CHAINS_H_

#include <cstdint>
#include <random>

#include <string>

#include <gtest/gtest.h>

#include "fusejit/chain.h"

namespace fusejit {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(engine_() % static_cast<uint64_t>(hi - lo + 1));
  }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  }
  bool Chance(double p) { return Uniform(0, 1) < p; }

 private:
  std::mt19937_64 engine_;
};

struct RandomChainOptions {
  int64_t max_batch = 8;
  int64_t max_spatial = 13;   // input D, H, W in [3, max_spatial]
  int64_t max_channels = 12;  // output channels; input ones up to half of it
  int64_t max_input_channels = 0;  // input channels instead, when > 0
  // The producer's kernel width in [min_kernel_w, max_kernel_w] (other axes 1-3); a conv3d or a
  // conv_transpose3d with probability transposed_chance.
  int64_t min_kernel_w = 1, max_kernel_w = 3;
  double transposed_chance = 0.45;
};

// A random chain that passes ValidateChain.
Chain RandomChain(Rng& rng, const RandomChainOptions& options = {});

// conv3d chains (or none) with at most 4 input channels, up to 32 output channels and kernels 5
// to 7 wide, batch 1-3: around the direct weight gradient's domain (templates/wgrad_direct.cuh).
inline RandomChainOptions FewInputWideKernelOptions() {
  RandomChainOptions o;
  o.max_batch = 3;
  o.max_spatial = 16;
  o.max_channels = 32;
  o.max_input_channels = 4;
  o.min_kernel_w = 5;
  o.max_kernel_w = 7;
  o.transposed_chance = 0;
  return o;
}

// The chain of `spec`; a gtest failure naming the spec and the error (and an empty Chain) when it
// does not parse.
inline Chain ParseOrFail(const std::string& spec) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status();
  return c.ok() ? *c : Chain{};
}

}  // namespace fusejit

#endif  // FUSEJIT_TESTS_RANDOM_CHAINS_H_
