// GPU checks of the tensor-core strategies igemm-store-normalize and igemm-moments-mean (named
// Gpu*; skipped without a driver or on a GPU other than sm_90): W3 at its seed shape in both
// precisions (fp32-accurate: rel L2 <= 1e-6 and max abs <= 1e-5 against float64), then smaller
// chains it applies to -- conv3d and conv_transpose3d, 128 or 256 output channels, odd sizes,
// padding, dilation, output_padding, batch 1-3, elementwise ops before and after group_norm -- at
// the default tolerance; the sweep shape W4-f and random chains ending in mean (both mean modes)
// through igemm-moments-mean, fp32-accurate and TF32; and non-default tunings (wg, stages, async)
// of both strategies, fp32-accurate. Outputs are poisoned with NaN before every run and must be
// fully written; two runs must be bitwise identical (testing::CheckChain, CheckConfig).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <utility>

#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "fusejit/workloads.h"
#include "jit/device.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using testing::CheckChain;
using testing::Tolerance;

constexpr char kIgemm[] = "igemm-store-normalize";
constexpr char kMoments[] = "igemm-moments-mean";
constexpr char kW4f[] =
    "x:f32[16,32,16,16,16] | conv3d(out=256,k=3,stride=1) | group_norm(groups=32) | "
    "mean(dims=[1,2,3,4])";
constexpr Tolerance kFp32Accurate{1e-6, 1e-5};  // WORKLOADS.md's fp32-accurate target
constexpr Tolerance kTf32{2e-3, 2e-2};

#define SKIP_WITHOUT_SM90()                                                                    \
  if (std::string why = testing::GpuUnavailableReason(); !why.empty()) {                       \
    GTEST_SKIP() << "no usable GPU: " << why;                                                  \
  }                                                                                            \
  if (absl::StatusOr<std::string> arch = jit::CurrentArch(); !arch.ok() || *arch != "sm_90") { \
    GTEST_SKIP() << "igemm-store-normalize needs an sm_90 GPU";                                \
  }

Chain Parse(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << spec << ": " << chain.status();
  return chain.ok() ? *chain : Chain{};
}

const codegen::Strategy& ByName(const char* name) {
  for (const auto& s : codegen::AllStrategies()) {
    if (s->name() == name) return *s;
  }
  std::abort();
}
const codegen::Strategy& Igemm() { return ByName(kIgemm); }
const codegen::Strategy& Moments() { return ByName(kMoments); }

// Compiles every (chain, precision) on its own thread (NVRTC compiles one program per thread),
// so that the checks after it find them in the in-memory cache.
void CompileInParallel(const std::vector<std::pair<Chain, Precision>>& list,
                       const std::string& strategy) {
  std::vector<std::future<std::string>> results;
  for (const auto& job : list) {
    // Not a structured binding: the lambda captures them (clang 14 cannot capture bindings).
    const Chain& chain = job.first;
    const Precision precision = job.second;
    results.push_back(std::async(std::launch::async, [&chain, precision, &strategy] {
      absl::StatusOr<jit::ScopedPrimaryContext> ctx = jit::ScopedPrimaryContext::Create(0);
      if (!ctx.ok()) return ctx.status().ToString();
      CompileOptions options;
      options.strategy = strategy;
      options.precision = precision;
      absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
      return c.ok() ? std::string() : FormatChain(chain) + ": " + c.status().ToString();
    }));
  }
  for (auto& r : results) EXPECT_EQ(r.get(), "");
}

TEST(GpuIgemm, W3SeedShapeFp32Accurate) {
  SKIP_WITHOUT_SM90();
  const Chain w3 = Parse(SeedWorkloads()[2].spec);
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(w3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->Explain().find("plan: igemm-store-normalize"), std::string::npos)
      << (*c)->Explain();
  CheckChain(w3, /*seed=*/11, {0, 7, 15}, "", kFp32Accurate, Precision::kFp32,
             /*timing_reps=*/10);
}

TEST(GpuIgemm, W3SeedShapeTf32) {
  SKIP_WITHOUT_SM90();
  const Chain w3 = Parse(SeedWorkloads()[2].spec);
  CheckChain(w3, /*seed=*/11, {0, 7, 15}, "", kTf32, Precision::kTf32, /*timing_reps=*/10);
}

// Chains chosen to reach each branch of the kernels: scalar (S % 4 != 0) and vector stores,
// one or two output planes per tile, one to three warpgroups, two B stages without a wgmma in
// flight (1x1x1 and 1xkxk kernels), groups of 1 to 128 channels, with and without bias.
const char* const kChains[] = {
    // conv3d, padding 1, dilation 2, odd sizes (S = 405), one warpgroup.
    "x:f32[2,32,7,11,11] | conv3d(out=128,k=3,padding=1,dilation=2) | relu | "
    "group_norm(groups=4) | hardswish",
    // conv_transpose3d, kernel (3,2,3), padding (1,0,1), no bias, S = 450.
    "x:f32[3,64,5,9,9] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1],bias=false) | "
    "leaky_relu(slope=0.1) | group_norm(groups=2)",
    // 256 channels (two channel tiles), 8 channels per group, S % 4 == 0.
    "x:f32[1,64,8,10,12] | conv3d(out=256,k=3,padding=1) | swish | group_norm(groups=32) | tanh",
    // conv_transpose3d with dilation 2 and output_padding 1, 128 channels per group.
    "x:f32[2,32,6,7,8] | conv_transpose3d(out=256,k=3,padding=1,output_padding=1,dilation=2) | "
    "gelu | group_norm(groups=2,eps=0.001) | clamp(min=-0.5,max=1)",
    // 1x1x1 kernel, 96 input channels, one channel per group.
    "x:f32[3,96,5,9,9] | conv3d(out=128,k=1) | sigmoid | group_norm(groups=128)",
    // 1x3x3 kernel, no pre-op.
    "x:f32[2,32,4,12,13] | conv3d(out=128,k=[1,3,3],padding=[0,1,1]) | group_norm(groups=8) | relu",
    // Enough tiles for three warpgroups (192-row tiles), odd S = 9261.
    "x:f32[3,32,21,21,21] | conv3d(out=128,k=3,padding=1,bias=false) | relu | group_norm(groups=8)",
    // W3's chain at a smaller size.
    "x:f32[2,64,8,8,8] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)",
    // Channels padded to whole tiles: 64 (half a tile), 160 (the second tile holds one group of
    // 32 and 96 padding channels, whose groups are neither stored nor merged).
    "x:f32[2,32,7,11,11] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8) | tanh",
    "x:f32[1,64,6,9,9] | conv_transpose3d(out=160,k=3,padding=1) | swish | group_norm(groups=5)",
    // 192 channels: three 64-channel tiles (the default tile for 129-192 channels).
    "x:f32[2,32,6,9,9] | conv3d(out=192,k=3,padding=1) | gelu | group_norm(groups=12)",
    // 32-63 channels: one 64-channel tile, up to half of it padding.
    "x:f32[2,64,7,9,9] | conv3d(out=40,k=3,padding=1) | relu | group_norm(groups=5)",
    "x:f32[1,32,6,9,9] | conv_transpose3d(out=32,k=3,padding=1) | swish | group_norm(groups=4)",
};

// Input channels that are not whole k-blocks of 32 (zero-padded): 24, 25, 44, 56, with and
// without group_norm. fp32-accurate (F16x3, 32-channel blocks) takes them all; TF32 (the TF32
// class on fp16, 64-channel blocks) only where those pad by at most half: 44 and 56, not 24 or 25.
TEST(GpuIgemm, PaddedInputChannels) {
  SKIP_WITHOUT_SM90();
  struct Case {
    const char* spec;
    const char* strategy;
    bool tf32;  // whether the strategy applies in TF32 mode
  };
  const Case cases[] = {
      {"x:f32[2,24,7,9,9] | conv3d(out=64,k=3,padding=1) | gelu | group_norm(groups=8)", kIgemm,
       false},
      {"x:f32[1,44,6,9,11] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1]) | relu | "
       "group_norm(groups=4)",
       kIgemm, true},
      {"x:f32[2,56,6,11,11] | conv3d(out=56,k=3) | relu | group_norm(groups=7) | swish", kIgemm,
       true},
      {"x:f32[2,25,6,9,9] | conv_transpose3d(out=48,k=3,padding=1) | tanh", "igemm-store", false},
  };
  uint64_t seed = 700;
  for (const Case& c : cases) {
    const Chain chain = Parse(c.spec);
    const bool tf32 =
        ByName(c.strategy).Applies(codegen::PlanInput(chain, {"sm_90", 132, Precision::kTf32}));
    EXPECT_EQ(tf32, c.tf32) << c.spec;
    CheckChain(chain, seed, {}, c.strategy, kFp32Accurate, Precision::kFp32);
    if (tf32) CheckChain(chain, seed, {}, c.strategy, kTf32, Precision::kTf32);
    ++seed;
  }
}

// group_norm groups across channel tiles: 12-channel groups on 64-channel tiles (some groups in
// two tiles), 192-channel groups over two 128-channel tiles, one group over three, 25-channel
// groups with a padded second tile; conv3d and conv_transpose3d, both precisions.
TEST(GpuIgemm, GroupsAcrossChannelTiles) {
  SKIP_WITHOUT_SM90();
  const char* const chains[] = {
      "x:f32[2,32,6,9,9] | conv3d(out=192,k=3,padding=1) | relu | group_norm(groups=16)",
      "x:f32[1,64,5,9,9] | conv_transpose3d(out=384,k=3,padding=1) | swish | group_norm(groups=2) "
      "| tanh",
      "x:f32[2,32,6,8,9] | conv3d(out=384,k=[3,1,3],padding=[1,0,1]) | group_norm(groups=1)",
      "x:f32[2,64,5,9,9] | conv3d(out=200,k=3,padding=1) | gelu | group_norm(groups=8)",
      "x:f32[3,32,6,9,9] | conv_transpose3d(out=96,k=3,padding=1,bias=false) | "
      "group_norm(groups=2)",
  };
  std::vector<std::pair<Chain, Precision>> list;
  for (const char* spec : chains) {
    for (Precision p : {Precision::kFp32, Precision::kTf32}) {
      const Chain chain = Parse(spec);
      ASSERT_TRUE(Igemm().Applies(codegen::PlanInput(chain, {"sm_90", 132, p}))) << spec;
      list.emplace_back(chain, p);
    }
  }
  CompileInParallel(list, kIgemm);
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& [chain, precision] = list[i];
    CheckChain(chain, /*seed=*/1300 + i / 2, {}, kIgemm,
               precision == Precision::kFp32 ? kFp32Accurate : kTf32, precision);
  }
}

// conv3d with strides (the halo holds the input rows of the tile's strided points; fp32-accurate,
// at least 4 taps per halo point): 2, (1,1,2), 2 with a [1,4,4] kernel, 2 with dilation and odd
// sizes; every epilogue.
TEST(GpuIgemm, StridedConv3dFp32Accurate) {
  SKIP_WITHOUT_SM90();
  const std::pair<const char*, const char*> chains[] = {
      {"x:f32[2,32,16,20,20] | conv3d(out=64,k=4,stride=2,padding=1) | relu | group_norm(groups=8)",
       kIgemm},
      {"x:f32[1,64,8,20,30] | conv3d(out=128,k=[3,3,5],stride=[1,1,2],padding=[1,1,2]) | gelu | "
       "group_norm(groups=4)",
       kIgemm},
      {"x:f32[1,32,11,19,21] | conv3d(out=128,k=[3,4,4],stride=2,padding=1,dilation=[1,2,1]) | "
       "tanh | group_norm(groups=16) | relu",
       kIgemm},
      {"x:f32[2,32,9,30,30] | conv3d(out=96,k=[1,4,4],stride=2) | group_norm(groups=3) | "
       "mean(dims=[2,3,4])",
       kMoments},
      {"x:f32[2,64,16,17,17] | conv3d(out=64,k=4,stride=2,padding=1) | relu", "igemm-store"},
  };
  uint64_t seed = 1400;
  for (const auto& [spec, strategy] : chains) {
    const Chain chain = Parse(spec);
    ASSERT_TRUE(ByName(strategy).Applies(codegen::PlanInput(chain, {"sm_90", 132}))) << spec;
    CheckChain(chain, seed++, {}, strategy, kFp32Accurate, Precision::kFp32);
  }
}

TEST(GpuIgemm, SmallerChainsInBothPrecisions) {
  SKIP_WITHOUT_SM90();
  std::vector<std::pair<Chain, Precision>> list;
  for (const char* spec : kChains) {
    const Chain chain = Parse(spec);
    for (Precision p : {Precision::kFp32, Precision::kTf32}) {
      ASSERT_TRUE(Igemm().Applies(codegen::PlanInput(chain, {"sm_90", 132, p}))) << spec;
      list.emplace_back(chain, p);
    }
  }
  CompileInParallel(list, kIgemm);
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& [chain, precision] = list[i];
    // Both precisions of a chain get the same inputs, so the reference is computed once.
    CheckChain(chain, /*seed=*/300 + i / 2, {}, kIgemm,
               precision == Precision::kFp32 ? Tolerance{} : kTf32, precision);
  }
}

Op RandomOp(Rng& rng) {
  static const OpKind kKinds[] = {OpKind::kRelu, OpKind::kLeakyRelu, OpKind::kSigmoid,
                                  OpKind::kTanh, OpKind::kSwish,     OpKind::kHardswish,
                                  OpKind::kGelu, OpKind::kClamp};
  const OpKind kind = kKinds[rng.Int(0, 7)];
  if (kind == OpKind::kLeakyRelu) return LeakyRelu(rng.Uniform(0.001, 0.3));
  if (kind == OpKind::kClamp) {
    const double lo = rng.Uniform(-1.0, 0.2);
    return Clamp(lo, lo + rng.Uniform(0.1, 1.5));
  }
  return Elementwise(kind);
}

Dims3 RandomDims(Rng& rng, int64_t lo, int64_t hi) {
  if (rng.Chance(0.6)) {
    const int64_t v = rng.Int(lo, hi);
    return {v, v, v};
  }
  return {rng.Int(lo, hi), rng.Int(lo, hi), rng.Int(lo, hi)};
}

// A random stride-1 conv chain with 32, 64 or 20-100 input channels, 128 or 256 output channels (or
// 32, 48, 64, 96, 192: padded to whole 128- or 64-channel tiles) and a group_norm of any group
// count that divides them (groups may cross channel tiles); with `mean`, ending in a mean (either
// mode, no ops after the group_norm). Not every one is valid or applicable.
Chain RandomIgemmChain(Rng& rng, bool mean = false) {
  Chain chain;
  chain.input = {rng.Int(1, 3),
                 rng.Chance(0.4)   ? 32
                 : rng.Chance(0.6) ? 64
                                   : rng.Int(20, 100),
                 rng.Int(4, 11), rng.Int(5, 12), rng.Int(5, 12)};
  static const int64_t kPadded[] = {32, 48, 64, 96, 192};
  const int64_t out = rng.Chance(0.5) ? 128 : rng.Chance(0.4) ? 256 : kPadded[rng.Int(0, 4)];
  const Dims3 k = RandomDims(rng, 1, 3), padding = RandomDims(rng, 0, 2);
  const Dims3 dilation = RandomDims(rng, 1, 2);
  const bool bias = rng.Chance(0.6);
  if (rng.Chance(0.5)) {
    Dims3 op = {0, 0, 0};
    for (int a = 0; a < 3; ++a) op[a] = dilation[a] > 1 && rng.Chance(0.5) ? 1 : 0;
    chain.ops.push_back(ConvTranspose3d(out, k, {1, 1, 1}, padding, op, dilation, bias));
  } else {
    const Dims3 stride = rng.Chance(0.3) ? RandomDims(rng, 1, 2) : Dims3{1, 1, 1};
    chain.ops.push_back(Conv3d(out, k, stride, padding, dilation, bias));
  }
  for (int64_t i = rng.Int(0, 2); i > 0; --i) chain.ops.push_back(RandomOp(rng));
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= out; ++g) {
    if (out % g == 0) divisors.push_back(g);
  }
  chain.ops.push_back(GroupNorm(divisors[rng.Int(0, static_cast<int64_t>(divisors.size()) - 1)]));
  if (mean) {
    chain.ops.push_back(Mean(rng.Chance(0.5) ? std::vector<int>{2, 3, 4}
                                             : std::vector<int>{1, 2, 3, 4}));
    return chain;
  }
  for (int64_t i = rng.Int(0, 2); i > 0; --i) chain.ops.push_back(RandomOp(rng));
  return chain;
}

TEST(GpuIgemm, RandomChains) {
  SKIP_WITHOUT_SM90();
  Rng rng(20261123);
  std::vector<std::pair<Chain, Precision>> list;
  for (int tries = 0; tries < 10000 && list.size() < 10; ++tries) {
    const Chain chain = RandomIgemmChain(rng);
    if (!ValidateChain(chain).ok()) continue;
    const Precision p = list.size() % 4 == 3 ? Precision::kTf32 : Precision::kFp32;
    if (!Igemm().Applies(codegen::PlanInput(chain, {"sm_90", 132, p}))) continue;
    list.emplace_back(chain, p);
  }
  ASSERT_EQ(list.size(), 10u) << "too few random chains apply";
  CompileInParallel(list, kIgemm);
  uint64_t seed = 500;
  for (const auto& [chain, precision] : list) {
    CheckChain(chain, seed++, {}, kIgemm, precision == Precision::kFp32 ? Tolerance{} : kTf32,
               precision);
  }
}

// ---- igemm-store (no group_norm, no mean) --------------------------------------------------

// The GEMM's epilogue writes y itself (bias and every op): W3's producer with relu (its
// backward's recompute), odd sizes with scalar stores, two channel tiles, a 1x1x1 kernel, output
// channels that are not whole tiles.
TEST(GpuIgemm, StoreChainsWithoutGroupNormInBothPrecisions) {
  SKIP_WITHOUT_SM90();
  const char* const chains[] = {
      "x:f32[2,64,16,16,16] | conv_transpose3d(out=128,k=3,bias=false) | relu",
      "x:f32[2,32,7,11,11] | conv3d(out=256,k=3,padding=1,dilation=2) | gelu | tanh",
      "x:f32[3,96,5,9,9] | conv3d(out=128,k=1)",
      "x:f32[1,32,6,7,9] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1]) | "
      "leaky_relu(slope=0.1) | hardswish",
      // Output channels padded to whole tiles: 64, 100, 200 (the second tile partial), bias.
      "x:f32[2,32,7,11,11] | conv3d(out=64,k=3,padding=1) | gelu",
      "x:f32[1,64,6,9,9] | conv_transpose3d(out=100,k=3,padding=1) | tanh",
      "x:f32[2,128,6,9,9] | conv3d(out=200,k=3,padding=1)",
      // 32 and 48 channels on a 64-channel tile (data gradients of S1 and S12 of the sweep).
      "x:f32[2,64,7,11,11] | conv_transpose3d(out=32,k=3,padding=1,bias=false)",
      "x:f32[1,96,6,9,9] | conv_transpose3d(out=48,k=3,padding=1) | gelu",
  };
  std::vector<std::pair<Chain, Precision>> list;
  for (const char* spec : chains) {
    for (Precision p : {Precision::kFp32, Precision::kTf32}) list.emplace_back(Parse(spec), p);
  }
  CompileInParallel(list, "igemm-store");
  uint64_t seed = 900;
  for (const auto& [chain, precision] : list) {
    CheckChain(chain, seed++, {}, "igemm-store",
               precision == Precision::kFp32 ? kFp32Accurate : kTf32, precision);
  }
}

// ---- igemm-moments-mean ------------------------------------------------------------------

TEST(GpuIgemmMoments, W4fFp32AccurateAndTf32) {
  SKIP_WITHOUT_SM90();
  const Chain w4f = Parse(kW4f);
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(w4f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->Explain().find("plan: igemm-moments-mean"), std::string::npos)
      << (*c)->Explain();
  CheckChain(w4f, /*seed=*/41, {0, 9, 15}, "", kFp32Accurate, Precision::kFp32,
             /*timing_reps=*/10);
  CheckChain(w4f, /*seed=*/41, {0, 9, 15}, kMoments, kTf32, Precision::kTf32,
             /*timing_reps=*/10);
}

// Random chains ending in mean: conv3d and conv_transpose3d, both mean modes, odd sizes,
// elementwise ops before the norm; fp32-accurate, every fourth TF32.
TEST(GpuIgemmMoments, RandomMeanChains) {
  SKIP_WITHOUT_SM90();
  Rng rng(20261124);
  std::vector<std::pair<Chain, Precision>> list;
  int modes[2] = {0, 0}, producers[2] = {0, 0};
  for (int tries = 0; tries < 20000 && list.size() < 12; ++tries) {
    const Chain chain = RandomIgemmChain(rng, /*mean=*/true);
    if (!ValidateChain(chain).ok()) continue;
    const Precision p = list.size() % 4 == 3 ? Precision::kTf32 : Precision::kFp32;
    if (!Moments().Applies(codegen::PlanInput(chain, {"sm_90", 132, p}))) continue;
    ++modes[chain.ops.back().dims.size() == 4 ? 1 : 0];
    ++producers[chain.ops[0].kind == OpKind::kConv3d ? 0 : 1];
    list.emplace_back(chain, p);
  }
  ASSERT_EQ(list.size(), 12u) << "too few random mean chains apply";
  EXPECT_GT(modes[0] * modes[1] * producers[0] * producers[1], 0) << "both modes and producers";
  CompileInParallel(list, kMoments);
  uint64_t seed = 700;
  for (const auto& [chain, precision] : list) {
    CheckChain(chain, seed++, {}, kMoments,
               precision == Precision::kFp32 ? kFp32Accurate : kTf32, precision);
  }
}

// ---- tunings other than the default (both strategies) -----------------------------------

// Compiles `chain` with exactly `config`, runs it twice (NaN-poisoned output, bitwise-identical
// reruns, every output written) and checks it against the float64 reference within `tol`.
void CheckConfig(const Chain& chain, uint64_t seed, const std::string& config, Precision precision,
                 Tolerance tol) {
  SCOPED_TRACE(FormatChain(chain) + " config " + config);
  CompileOptions options;
  options.tune_config = config;
  options.precision = precision;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
  ASSERT_TRUE(c.ok()) << c.status();
  const HostInputs inputs = RandomInputs(chain, seed);
  absl::StatusOr<std::vector<std::vector<float>>> outs = testing::RunOnGpu(**c, inputs, 2);
  ASSERT_TRUE(outs.ok()) << outs.status();
  const std::vector<float>& y = (*outs)[0];
  ASSERT_EQ(std::memcmp(y.data(), (*outs)[1].data(), y.size() * 4), 0) << "two runs differ";
  absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->size(), y.size());
  const ErrorStats e = CompareToReference(y.data(), ref->data(), static_cast<int64_t>(y.size()));
  std::printf("  %s: rel L2 %.2e, max abs %.2e\n", config.c_str(), e.rel_l2, e.max_abs);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_l2, tol.rel_l2);
  EXPECT_LE(e.max_abs, tol.max_abs);
}

// Each tuning gets its own inputs. The mean chain averages over the spatial dims only: a mean over
// the channels too is a near-cancelling sum (outputs ~1e-3 of the per-channel terms), whose
// relative error on some inputs exceeds 1e-6 at an absolute error of ~2e-9 (measured: this chain
// with dims=[1,2,3,4], wg=1, seed 905: rel L2 1.6e-6, max abs 2.4e-9; the other seeds 2e-8 to
// 7e-8). W4-f and RandomMeanChains check that mode.
TEST(GpuIgemm, NonDefaultTuningsAreFp32Accurate) {
  SKIP_WITHOUT_SM90();
  // Output planes of 16x16 (store) and 12x12 (mean): tiles of 1-3 (1-2) warpgroups fit.
  const Chain store = Parse(
      "x:f32[2,64,6,14,14] | conv_transpose3d(out=256,k=3,bias=false) | relu | "
      "group_norm(groups=16)");
  const Chain mean = Parse(
      "x:f32[3,32,10,14,14] | conv3d(out=256,k=3) | swish | group_norm(groups=32) | "
      "mean(dims=[2,3,4])");
  const std::vector<std::pair<const Chain*, std::string>> configs = {
      {&store, "igemm-store-normalize:wg=1,stages=2,async=0,bn=128"},
      {&store, "igemm-store-normalize:wg=1,stages=3,async=1,bn=128"},
      {&store, "igemm-store-normalize:wg=2,stages=4,async=0,bn=128"},
      {&store, "igemm-store-normalize:wg=2,stages=5,async=1,bn=128"},
      {&store, "igemm-store-normalize:wg=3,stages=8,async=1,bn=128"},
      {&mean, "igemm-moments-mean:wg=1,stages=2,async=0,bn=128"},
      {&mean, "igemm-moments-mean:wg=1,stages=4,async=1,bn=128"},
      {&mean, "igemm-moments-mean:wg=2,stages=3,async=0,bn=128"},
      {&mean, "igemm-moments-mean:wg=2,stages=8,async=1,bn=128"},
      // 64-channel tiles (wgmma n = 64): four channel tiles, up to 4 warpgroups with the
      // fp32-accurate pair of accumulators.
      {&store, "igemm-store-normalize:wg=1,stages=2,async=0,bn=64"},
      {&store, "igemm-store-normalize:wg=2,stages=5,async=1,bn=64"},
      {&store, "igemm-store-normalize:wg=4,stages=4,async=1,bn=64"},
      {&mean, "igemm-moments-mean:wg=2,stages=4,async=1,bn=64"},
      // The reduction split (a second kernel adds the parts in order): 2, 3 and 6 parts (6: one
      // (kd, channel block) step each; border tiles with fewer active kd leave parts empty).
      {&store, "igemm-store-normalize:wg=1,stages=4,async=1,bn=128,split=2"},
      {&store, "igemm-store-normalize:wg=2,stages=5,async=1,bn=64,split=3"},
      {&store, "igemm-store-normalize:wg=1,stages=3,async=0,bn=128,split=6"},
      {&mean, "igemm-moments-mean:wg=1,stages=4,async=1,bn=128,split=3"},
      {&mean, "igemm-moments-mean:wg=2,stages=5,async=1,bn=64,split=2"},
  };
  std::vector<std::future<std::string>> compiled;
  for (const auto& [chain, config] : configs) {
    compiled.push_back(std::async(std::launch::async, [chain = chain, config = config] {
      absl::StatusOr<jit::ScopedPrimaryContext> ctx = jit::ScopedPrimaryContext::Create(0);
      if (!ctx.ok()) return ctx.status().ToString();
      CompileOptions options;
      options.tune_config = config;
      absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(*chain, options);
      return c.ok() ? std::string() : config + ": " + c.status().ToString();
    }));
  }
  for (auto& r : compiled) EXPECT_EQ(r.get(), "");
  uint64_t seed = 900;
  for (const auto& [chain, config] : configs) {
    CheckConfig(*chain, seed++, config, Precision::kFp32, kFp32Accurate);
  }
  // The TF32 tuning of W3 (4 warpgroups) on the smaller chain.
  CheckConfig(store, 950, "igemm-store-normalize:wg=4,stages=5,async=1,bn=128", Precision::kTf32,
              kTf32);
  CheckConfig(store, 951, "igemm-store-normalize:wg=4,stages=5,async=1,bn=64", Precision::kTf32,
              kTf32);
}

}  // namespace
}  // namespace fusejit
