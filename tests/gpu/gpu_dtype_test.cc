// bf16 and f16 chains on the GPU: the seeds (small batches) and 40 random chains per dtype
// forward and backward, against the float64 reference within the dtype's tolerance
// (tools::DefaultRtol), outputs and gradients poisoned (all-ones bytes: NaN) and checked fully
// written, two runs bitwise identical -- and every value the f32 chain's result on the same inputs
// rounded once to the dtype (the forward's with TF32 tensor cores, exact for these operands), what
// runtime/dtype_adapter.h promises, within one unit (or, for plans multiplying on 16-bit tensor
// cores, an fp32 accumulation difference: see ExpectRoundedF32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "codegen/strategy_util.h"  // HasAmpereFeatures
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "jit/device.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tools/runner.h"
#include "tools/tensor_files.h"

namespace fusejit {
namespace {

Chain AsDType(Chain chain, DType dtype) {
  chain.dtype = dtype;
  return chain;
}

// Runs `c` on `reads` twice; checks the two bitwise identical and returns the first's tensors.
std::map<std::string, HostTensor> RunTwice(CompiledChain& c,
                                           const std::map<std::string, HostTensor>& reads) {
  absl::StatusOr<tools::SignatureRunResult> first = tools::RunSignatureOnDevice(c, reads, {.reps = 0});
  EXPECT_TRUE(first.ok()) << first.status();
  absl::StatusOr<tools::SignatureRunResult> second = tools::RunSignatureOnDevice(c, reads, {.reps = 0});
  EXPECT_TRUE(second.ok()) << second.status();
  if (!first.ok() || !second.ok()) return {};
  for (const auto& [name, t] : first->written) {
    const HostTensor& u = second->written.at(name);
    EXPECT_EQ(std::memcmp(t.data.data(), u.data.data(), t.data.size() * sizeof(float)), 0)
        << name << " differs between two runs";
  }
  return first->written;
}

// One unit in the last place of v in the dtype (normal range; subnormals share the smallest).
double UlpOf(float v, DType dtype) {
  const int mantissa = dtype == DType::kBF16 ? 7 : 10;
  const int min_exp = dtype == DType::kBF16 ? -126 : -14;  // smallest normal exponent
  int e = 0;
  std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa);
}

// Every value of `got` (dtype) is `f32` (the f32 plan's result on the same inputs) rounded to the
// dtype, NaN-free: bit for bit, or at most one unit in the dtype's last place away where the
// dtype's plan computes the fp32 value another way than the f32 plan (a flushed accumulator).
//
// A plan that multiplies on tensor cores natively (`native_mma`: igemm's one bf16/f16 wgmma
// product instead of TF32; tc-conv's one TF32 product of the widened values under the f32 plan's
// tiling, not the TF32 plan's) sums the same exact products in another order, with the tensor
// cores' own accumulation, so its pre-norm values differ from the f32 plan's by a few fp32 units;
// where the group norm cancels (y near 0) that difference can exceed one unit of the (tiny) output.
// For such plans every value must lie within half a unit of the dtype (its rounding) plus 2^-16 of
// the tensor's largest magnitude (an fp32 accumulation difference, 2^7 (bf16) or 2^4 (f16) times
// below the dtype's own rounding at that scale) of the f32 plan's unrounded value.
void ExpectRoundedF32(const std::map<std::string, HostTensor>& got,
                      const std::map<std::string, HostTensor>& f32, DType dtype,
                      bool native_mma = false) {
  for (const auto& [name, t] : got) {
    const HostTensor& w = f32.at(name);
    ASSERT_EQ(t.data.size(), w.data.size()) << name;
    double scale = 0;
    for (float v : w.data) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    int64_t differ = 0, beyond = 0, first = -1;
    for (size_t i = 0; i < t.data.size(); ++i) {
      const float want = RoundToDType(w.data[i], dtype);
      if (std::memcmp(&t.data[i], &want, sizeof(float)) == 0) continue;
      ++differ;
      const double g = t.data[i];
      const bool ok = native_mma ? std::fabs(g - w.data[i]) <=
                                       0.5 * UlpOf(want, dtype) + std::ldexp(scale, -16)
                                 : std::fabs(g - want) <= UlpOf(want, dtype);
      if (!ok) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++beyond;
      }
    }
    EXPECT_EQ(beyond, 0) << name << ": first at " << first << ": "
                         << (first >= 0 ? t.data[first] : 0.f) << " vs the f32 plan's "
                         << (first >= 0 ? w.data[first] : 0.f) << " (largest |value| " << scale
                         << ")";
    if (differ > 0) {
      std::printf("%s: %lld of %zu values differ from the f32 plan's, rounded\n", name.c_str(),
                  static_cast<long long>(differ), t.data.size());
    }
  }
}

// `strategy`: the plan asked for by name (both chains), or the planner's when empty;
// `tune_config`: the dtype chain's configuration (its strategy's), when given.
void CheckForward(const Chain& chain, uint64_t seed, const std::string& strategy = "",
                  const std::string& tune_config = "") {
  SCOPED_TRACE(FormatChain(chain) + " " + tune_config);
  CompileOptions options;
  options.strategy = strategy;
  options.tune_config = tune_config;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
  ASSERT_TRUE(c.ok()) << c.status();
  if (!strategy.empty()) EXPECT_EQ((*c)->strategy(), strategy);
  CompileOptions tf32;
  tf32.precision = Precision::kTf32;
  tf32.strategy = strategy;
  absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = Compile(AsDType(chain, DType::kF32), tf32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  const HostInputs inputs = RandomInputs(chain, seed);  // values of the dtype
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  const std::map<std::string, HostTensor> got = RunTwice(**c, reads);
  ASSERT_EQ(got.size(), 1u);
  const bool native_mma = (*c)->strategy().rfind("igemm-", 0) == 0 || (*c)->strategy() == "tc-conv";
  ExpectRoundedF32(got, RunTwice(**f32, reads), chain.dtype, native_mma);
  tools::CheckOptions check;
  check.samples = 2;
  absl::StatusOr<tools::CheckResult> r = tools::CheckOutput(chain, inputs, got.at("y"), check);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->pass) << "rel_l2 " << r->errors.rel_l2 << " (limit " << r->rtol << ") max_abs "
                       << r->errors.max_abs << " (limit " << r->atol << ") unwritten "
                       << r->unwritten;
  std::printf("%s: rel_l2 %.3e max_abs %.3e\n", FormatChain(chain).c_str(), r->errors.rel_l2,
              r->errors.max_abs);
}

// Each gradient (`got`, the dtype chain's) within the dtype's tolerance of float64, plus the f32
// plan's own error on the same inputs (`f32`, its gradients): the dtype adds only its rounding.
// (The f32 error is checked on its own by GpuBackward; with 16-bit inputs a relu's kink is hit
// more often -- u exactly or nearly 0 -- where the float64 reference and an fp32 recompute may
// take opposite sides.) Every gradient written in full.
void ExpectGradientsWithinDTypeTolerance(const Chain& chain, const HostInputs& inputs,
                                         const HostTensor& grad_y,
                                         const std::map<std::string, HostTensor>& got,
                                         const std::map<std::string, HostTensor>& f32) {
  absl::StatusOr<tools::GradientCheckResult> r =
      tools::CheckGradients(chain, inputs, grad_y, got, {});
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<tools::GradientCheckResult> r32 =
      tools::CheckGradients(AsDType(chain, DType::kF32), inputs, grad_y, f32, {});
  ASSERT_TRUE(r32.ok()) << r32.status();
  ASSERT_EQ(r->gradients.size(), r32->gradients.size());
  for (size_t i = 0; i < r->gradients.size(); ++i) {
    const tools::GradientCheck& g = r->gradients[i];
    const double f32_err = r32->gradients[i].rel_max;
    EXPECT_EQ(g.unwritten, 0) << g.name;
    EXPECT_LE(g.rel_max, r->rtol + f32_err) << g.name << " rel_max " << g.rel_max << " (limit "
                                            << r->rtol << " + the f32 plan's " << f32_err << ")";
  }
}

void CheckBackward(const Chain& chain, uint64_t seed) {
  SCOPED_TRACE(FormatChain(chain));
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = CompileBackward(chain);
  ASSERT_TRUE(c.ok()) << c.status();  // every bf16/f16 chain has a backward
  const HostInputs inputs = RandomInputs(chain, seed);
  HostTensor grad_y = tools::RandomGradOutput(chain, seed);
  for (float& v : grad_y.data) v = RoundToDType(v, chain.dtype);
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  reads["grad_y"] = grad_y;
  absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = CompileBackward(AsDType(chain, DType::kF32));
  ASSERT_TRUE(f32.ok()) << f32.status();
  const std::map<std::string, HostTensor> got = RunTwice(**c, reads);
  const std::map<std::string, HostTensor> want = RunTwice(**f32, reads);
  // The gradient convolutions run in the TF32 class (runtime/dtype_adapter.h,
  // BackwardGemmPrecision), not the f32 backward's fp32-accurate split: the float64 tolerance
  // below is the check.
  ExpectGradientsWithinDTypeTolerance(chain, inputs, grad_y, got, want);
}

// The training pair of a bf16/f16 chain (runtime/training.h: its own plan writing u in f32):
// y bitwise the plain forward's, every saved tensor written in full, the backward reading them
// within the dtype's tolerance of float64 plus the f32 plan's own error (as CheckBackward), two
// runs bitwise identical. Returns whether the chain saves.
bool CheckTrainingPair(const Chain& chain, uint64_t seed) {
  SCOPED_TRACE(FormatChain(chain));
  absl::StatusOr<std::shared_ptr<CompiledChain>> fwd = CompileTrainingForward(chain, {});
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return false;
  bool saves = false;
  for (const TensorSpec& t : (*fwd)->signature()) saves |= t.role == TensorRole::kSaved;
  absl::StatusOr<std::shared_ptr<CompiledChain>> bwd = CompileBackwardFromSaved(chain, {});
  if (!saves) {
    EXPECT_EQ(bwd.status().code(), absl::StatusCode::kInvalidArgument) << bwd.status();
    return false;
  }
  EXPECT_TRUE(bwd.ok()) << bwd.status();
  absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(chain, {});
  EXPECT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = CompileBackward(AsDType(chain, DType::kF32));
  EXPECT_TRUE(f32.ok()) << f32.status();
  if (!bwd.ok() || !plain.ok() || !f32.ok()) return true;
  const HostInputs inputs = RandomInputs(chain, seed);
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  const std::map<std::string, HostTensor> trained = RunTwice(**fwd, reads);
  const std::map<std::string, HostTensor> y = RunTwice(**plain, reads);
  if (trained.count("y") == 0 || y.count("y") == 0) return true;
  const HostTensor& ty = trained.at("y");
  if ((*fwd)->Explain().find("(u is kept for the backward)") == std::string::npos) {
    EXPECT_EQ(std::memcmp(ty.data.data(), y.at("y").data.data(), ty.data.size() * sizeof(float)), 0)
        << "the training forward's y differs from the plain forward's";
  } else {
    // A 16-bit igemm plan keeping u flushes its sums (codegen::PlanTarget::keeps_u), the plain
    // forward does not: y holds the plain forward's standard against the f32 plan instead.
    CompileOptions tf32;
    tf32.precision = Precision::kTf32;
    tf32.strategy = (*fwd)->strategy();
    absl::StatusOr<std::shared_ptr<CompiledChain>> f32_fwd =
        Compile(AsDType(chain, DType::kF32), tf32);
    EXPECT_TRUE(f32_fwd.ok()) << f32_fwd.status();
    if (f32_fwd.ok()) {
      std::map<std::string, HostTensor> f32_y = RunTwice(**f32_fwd, reads);
      ExpectRoundedF32({{"y", ty}}, f32_y, chain.dtype, /*native_mma=*/true);
    }
  }
  for (const TensorSpec& t : (*fwd)->signature()) {
    if (t.role != TensorRole::kSaved) continue;
    EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    const HostTensor& v = trained.at(t.name);
    int64_t bad = 0;
    for (float e : v.data) bad += !std::isfinite(e);
    EXPECT_EQ(bad, 0) << t.name << " not written in full";
    reads[t.name] = v;
  }
  HostTensor grad_y = tools::RandomGradOutput(chain, seed);
  for (float& v : grad_y.data) v = RoundToDType(v, chain.dtype);
  reads["grad_y"] = grad_y;
  const std::map<std::string, HostTensor> got = RunTwice(**bwd, reads);
  std::map<std::string, HostTensor> f32_reads = reads;  // the recomputing f32 backward's
  for (const TensorSpec& t : (*fwd)->signature()) {
    if (t.role == TensorRole::kSaved) f32_reads.erase(t.name);
  }
  const std::map<std::string, HostTensor> want = RunTwice(**f32, f32_reads);
  ExpectGradientsWithinDTypeTolerance(chain, inputs, grad_y, got, want);
  return true;
}

void CheckF64Forward(const Chain& chain, uint64_t seed) {
  SCOPED_TRACE(FormatChain(chain));
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain);
  ASSERT_TRUE(c.ok()) << c.status();
  const HostInputs inputs = RandomInputs(chain, seed);
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  const std::map<std::string, HostTensor> got = RunTwice(**c, reads);
  ASSERT_EQ(got.size(), 1u);
  tools::CheckOptions check;
  check.samples = 2;
  absl::StatusOr<tools::CheckResult> r = tools::CheckOutput(chain, inputs, got.at("y"), check);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->pass) << "rel_l2 " << r->errors.rel_l2 << " max_abs " << r->errors.max_abs
                       << " unwritten " << r->unwritten;
}

class GpuDType : public ::testing::TestWithParam<DType> {};

TEST_P(GpuDType, SeedChains) {
  SKIP_WITHOUT_GPU();
  for (const Workload& w : SeedWorkloads()) {
    Chain chain = AsDType(ParseOrFail(w.spec), GetParam());
    chain.input[0] = w.id == "W3" ? 1 : 2;
    CheckForward(chain, 3);
    CheckBackward(chain, 4);
  }
}

// bf16/f16 training: the forward's own plan writes u (f32) and the backward reads it. The seeds
// at small batches (each saves) and random chains (those that save).
TEST_P(GpuDType, TrainingPairSavesU) {
  SKIP_WITHOUT_GPU();
  int saved = 0;
  for (const Workload& w : SeedWorkloads()) {
    Chain chain = AsDType(ParseOrFail(w.spec), GetParam());
    chain.input[0] = w.id == "W3" ? 1 : 2;
    EXPECT_TRUE(CheckTrainingPair(chain, 5)) << w.id << " does not save";
  }
  // Every plan with u's slot, natively in the dtype (the chains of
  // GpuBackward.TrainingForwardSavesUForTheBackward that reach each f32 strategy).
  const char* const specs[] = {
      "[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | mean(dims=[2,3,4])",
      "[2,5,9,11,10] | conv3d(out=8,k=[3,4,3]) | swish | group_norm(groups=2) | "
      "mean(dims=[1,2,3,4])",
      "[2,3,8,10,17] | conv_transpose3d(out=8,k=3,stride=2,padding=1,output_padding=1) | gelu | "
      "group_norm(groups=2) | tanh",
      "[2,2,5,6,7] | conv_transpose3d(out=12,k=[3,2,3],stride=[1,2,3]) | relu | "
      "group_norm(groups=3)",
      "[17,8,8,16,16] | conv_transpose3d(out=16,k=2,stride=2) | gelu | group_norm(groups=4) | relu",
      "[2,64,7,9,11] | conv_transpose3d(out=128,k=3) | gelu | group_norm(groups=4) | sigmoid",
      "[2,32,12,12,12] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)",
      "[2,32,9,10,11] | conv3d(out=64,k=3,padding=1) | tanh",
      "[2,3,6,8,9] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish",
      "[2,2,5,6,4] | conv_transpose3d(out=7,k=[2,3,3],stride=[2,1,2]) | gelu | tanh",
      "[2,3,9,10,13] | conv3d(out=8,k=3) | swish",
      "[2,3,7,12,11] | conv3d(out=24,k=[3,4,3]) | hardswish | tanh",
      "[2,128,8,8,8] | conv3d(out=192,k=3,padding=1) | swish | group_norm(groups=8)",
      // tc-conv (its 16-bit sums in short runs when u is kept): a group_norm normalized by its
      // own pass, a transposed convolution split into output phases.
      "[2,16,8,8,8] | conv3d(out=32,k=5,padding=2) | relu | group_norm(groups=4)",
      "[2,20,10,10,10] | conv_transpose3d(out=36,k=3,stride=2,padding=1,output_padding=1) | tanh",
  };
  const std::string d = DTypeName(GetParam());
  uint64_t seed = 500;
  for (const char* spec : specs) {
    const Chain c = ParseOrFail("x:" + d + spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(c, {});
    ASSERT_TRUE(f.ok()) << f.status();
    const bool saves = CheckTrainingPair(c, seed++);
    std::printf("%s: %s%s\n", spec, (*f)->strategy().c_str(), saves ? ", saves u" : "");
    saved += saves;
  }
  EXPECT_GE(saved, 8);  // most of these plans run natively and save
  Rng rng(GetParam() == DType::kBF16 ? 81 : 82);
  int random = 0;
  for (int i = 0; i < 200 && random < 8; ++i) {
    const Chain c = AsDType(RandomChain(rng), GetParam());
    if (!TrainingForwardSaves(c)) continue;
    CheckTrainingPair(c, 600 + i);
    ++random;
  }
  EXPECT_EQ(random, 8);
}

TEST_P(GpuDType, RandomChainsForward) {
  SKIP_WITHOUT_GPU();
  Rng rng(GetParam() == DType::kBF16 ? 61 : 62);
  for (int i = 0; i < 40; ++i) CheckForward(AsDType(RandomChain(rng), GetParam()), 200 + i);
}

TEST_P(GpuDType, RandomChainsBackward) {
  SKIP_WITHOUT_GPU();
  Rng rng(GetParam() == DType::kBF16 ? 71 : 72);
  for (int i = 0; i < 20; ++i) CheckBackward(AsDType(RandomChain(rng), GetParam()), 300 + i);
}

// A chain without a convolution: its backward runs natively (codegen::BackwardRunsNatively), the
// f32 backward's kernels widening every load exactly and rounding every store once, so every
// gradient is the f32 backward's on the same values, rounded to the dtype, bit for bit (two runs
// bitwise identical, NaN-poisoned buffers fully written) -- and within the dtype's tolerance of
// float64. Every op, both mean modes, group_norm with and without ops after it, odd sizes; random
// chains without a convolution.
TEST_P(GpuDType, BackwardWithoutConvolutionIsTheF32BackwardRounded) {
  SKIP_WITHOUT_GPU();
  const std::string d = DTypeName(GetParam());
  std::vector<std::string> specs = {
      "x:" + d + "[2,6,9,7,8] | clamp(min=-0.5,max=0.5) | group_norm(groups=2) | hardswish",
      "x:" + d + "[3,16,8,9,10] | swish | group_norm(groups=2) | mean(dims=[2,3,4])",
      "x:" + d + "[2,8,5,6,7] | group_norm(groups=4) | mean(dims=[1,2,3,4])",
      "x:" + d + "[2,6,5,6,7] | tanh | hardtanh(min=-0.5,max=0.25) | sigmoid",
      "x:" + d + "[3,5,4,6,7] | gelu | mean(dims=[2,3,4])",
      "x:" + d + "[1,12,17,19,23] | leaky_relu(negative_slope=0.1) | group_norm(groups=3,eps=1e-3)",
      "x:" + d + "[2,32,12,12,12] | relu | group_norm(groups=8) | gelu | tanh",
  };
  Rng rng(GetParam() == DType::kBF16 ? 91 : 92);
  for (int i = 0; i < 400 && specs.size() < 15; ++i) {
    const Chain c = AsDType(RandomChain(rng), GetParam());
    if (codegen::AnalyzeChain(c).producer == nullptr) specs.push_back(FormatChain(c));
  }
  ASSERT_EQ(specs.size(), 15u);
  uint64_t seed = 900;
  for (const std::string& spec : specs) {
    const Chain chain = ParseOrFail(spec);
    SCOPED_TRACE(spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = CompileBackward(chain);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->Explain().find("widen"), std::string::npos) << "not native";
    absl::StatusOr<std::shared_ptr<CompiledChain>> f32 =
        CompileBackward(AsDType(chain, DType::kF32));
    ASSERT_TRUE(f32.ok()) << f32.status();
    const HostInputs inputs = RandomInputs(chain, ++seed);
    HostTensor grad_y = tools::RandomGradOutput(chain, seed);
    for (float& v : grad_y.data) v = RoundToDType(v, chain.dtype);
    std::map<std::string, HostTensor> reads = inputs.params;
    reads["x"] = inputs.x;
    reads["grad_y"] = grad_y;
    const std::map<std::string, HostTensor> got = RunTwice(**c, reads);
    const std::map<std::string, HostTensor> want = RunTwice(**f32, reads);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : got) {
      const HostTensor& w = want.at(name);
      ASSERT_EQ(t.data.size(), w.data.size()) << name;
      int64_t differ = 0;
      for (size_t k = 0; k < t.data.size(); ++k) {
        const float r = RoundToDType(w.data[k], chain.dtype);
        differ += std::memcmp(&t.data[k], &r, sizeof(float)) != 0;
      }
      EXPECT_EQ(differ, 0) << name << ": values that are not the f32 backward's, rounded";
    }
    ExpectGradientsWithinDTypeTolerance(chain, inputs, grad_y, got, want);
  }
}

// The Hopper tensor-core strategies (igemm-*) run bf16/f16 chains natively: one product of the
// dtype's values, pre-norm values in an fp32 workspace or channel moments, or (igemm-store) y
// written in the dtype by the epilogue. Chains of their domain
// (Cin % 32 == 0, C % 128 == 0, stride 1) with padding, dilation, transposed or not, post-ops and
// both mean modes.
TEST_P(GpuDType, TensorCoreGemmChainsRunNatively) {
  SKIP_WITHOUT_GPU();
  const std::string d = DTypeName(GetParam());
  const std::vector<std::string> specs = {
      "x:" + d +
          "[1,64,12,12,12] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
          "group_norm(groups=8)",
      "x:" + d +
          "[2,32,10,12,14] | conv3d(out=128,k=3,padding=1) | gelu | group_norm(groups=16) | "
          "hardswish",
      "x:" + d +
          "[1,64,9,11,13] | conv3d(out=256,k=3,padding=2,dilation=2) | swish | "
          "group_norm(groups=4) | tanh",
      "x:" + d +
          "[4,32,12,16,16] | conv3d(out=128,k=3) | group_norm(groups=8) | mean(dims=[2,3,4])",
      "x:" + d +
          "[2,64,8,9,10] | conv_transpose3d(out=128,k=2) | leaky_relu(negative_slope=0.1) | "
          "group_norm(groups=32) | mean(dims=[1,2,3,4])",
      // igemm-store: no group_norm, y written in the dtype by the GEMM's epilogue (96 channels
      // padded to one 128-channel tile; a grid of several tiles).
      "x:" + d + "[2,32,10,12,14] | conv3d(out=96,k=3,padding=1) | relu",
      "x:" + d + "[3,64,8,16,16] | conv3d(out=128,k=3,padding=1) | swish | tanh",
      // igemm-store-normalize with channels padded to a whole tile (64 of 128).
      "x:" + d + "[2,32,12,16,16] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)",
      // Groups across channel tiles: 96-channel groups on 64-channel tiles.
      "x:" + d + "[2,64,8,10,12] | conv3d(out=192,k=3,padding=1) | swish | group_norm(groups=2)",
      // 96 and 160 input channels: two and three 64-channel operand blocks, the last half zeros.
      "x:" + d + "[4,96,12,16,16] | conv3d(out=128,k=3,padding=1) | relu | group_norm(groups=4)",
      "x:" + d + "[4,160,10,16,16] | conv_transpose3d(out=128,k=2) | gelu",
      "x:" + d +
          "[4,96,12,16,16] | conv3d(out=128,k=3,padding=1) | group_norm(groups=4) | "
          "mean(dims=[2,3,4])",
      // Input channels that are not multiples of 32: 56 and 44 in one 64-channel block.
      "x:" + d + "[2,56,6,11,11] | conv3d(out=56,k=3) | relu | group_norm(groups=7) | swish",
      "x:" + d +
          "[1,44,6,9,11] | conv_transpose3d(out=128,k=[3,2,3],padding=[1,0,1]) | relu | "
          "group_norm(groups=4)",
  };
  // The igemm plan asked for by name: the dtype chain's own costs may prefer tc-conv.
  for (const std::string& spec : specs) {
    const Chain chain = ParseOrFail(spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = Compile(AsDType(chain, DType::kF32));
    ASSERT_TRUE(f32.ok()) << spec << ": " << f32.status();
    if (absl::StatusOr<std::string> arch = jit::CurrentArch(); !arch.ok() || *arch != "sm_90") {
      CheckForward(chain, 11);
      continue;
    }
    EXPECT_EQ((*f32)->strategy().rfind("igemm-", 0), 0u) << spec << " ran " << (*f32)->strategy();
    CheckForward(chain, 11, (*f32)->strategy());
  }
}

// mma-moments-mean (W2's and W4's plan) and mma-direct run bf16/f16 chains on one fp16 product
// per step (their scaled 16-bit values are fp16 values: no low parts): the f32 plan's F16x3 sums
// of the same widened inputs, rounded once. Odd sizes, padding, strides, dilation, 8-32 channels.
TEST_P(GpuDType, MmaConvChainsRunNatively) {
  SKIP_WITHOUT_GPU();
  const std::string d = DTypeName(GetParam());
  struct Case {
    std::string spec, strategy;
  };
  const Case cases[] = {
      {"x:" + d + "[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish", "mma-direct"},
      {"x:" + d + "[2,5,9,11,10] | conv3d(out=8,k=[3,4,3],padding=1) | swish | tanh", "mma-direct"},
      {"x:" + d + "[1,4,7,12,40] | conv3d(out=32,k=3,stride=[1,1,2],dilation=[1,2,1]) | gelu",
       "mma-direct"},
      {"x:" + d +
           "[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
           "mean(dims=[2,3,4])",
       "mma-moments-mean"},
      {"x:" + d +
           "[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | "
           "mean(dims=[1,2,3,4])",
       "mma-moments-mean"},
  };
  uint64_t seed = 21;
  for (const Case& c : cases) CheckForward(ParseOrFail(c.spec), seed++, c.strategy);
}

// convt-recompute-normalize (seed W1's plan) runs bf16/f16 chains natively: x and the parameters
// widened as loaded, the same fp32 FFMA order as the f32 plan, y rounded once -- so every value is
// the f32 plan's rounded. Odd channel counts, strides 1-3, output_padding, dilation, post-ops.
TEST_P(GpuDType, TransposedConvChainsRunNatively) {
  SKIP_WITHOUT_GPU();
  const std::string d = DTypeName(GetParam());
  const std::vector<std::string> specs = {
      "x:" + d +
          "[2,3,5,9,10] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
          "group_norm(groups=4) | hardswish",
      "x:" + d +
          "[3,4,4,5,6] | conv_transpose3d(out=12,k=4,stride=2,padding=1,output_padding=1) "
          "| gelu | group_norm(groups=3)",
      "x:" + d +
          "[1,2,6,7,5] | conv_transpose3d(out=5,k=3,stride=3,padding=0,output_padding=2) | "
          "relu | group_norm(groups=5) | tanh",
      "x:" + d +
          "[2,2,5,6,7] | conv_transpose3d(out=32,k=3,padding=2,dilation=2) | "
          "leaky_relu(negative_slope=0.1) | group_norm(groups=8) | sigmoid",
      "x:" + d + "[2,1,7,7,7] | conv_transpose3d(out=7,k=2,stride=2) | group_norm(groups=1)",
  };
  const absl::StatusOr<std::string> arch = jit::CurrentArch();
  for (const std::string& spec : specs) {
    const Chain chain = ParseOrFail(spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    if (arch.ok() && codegen::HasAmpereFeatures(*arch)) {
      EXPECT_EQ((*c)->strategy(), "convt-recompute-normalize") << spec;
    }
    CheckForward(chain, 13);
  }
}

// tc-conv (the mma.sync engine, sm_80+) runs bf16/f16 chains natively: x and the weights copied
// in the dtype by its prep kernel, one m16n8k16 bf16/f16 product per term (exact in fp32), y
// rounded once; with group_norm the pre-norm values in an fp32 workspace. Every epilogue: y stored,
// pre-norm + normalize, channel moments only (mean), pre-norm + row means (post-ops then mean),
// mean without group_norm; transposed with stride and output_padding, odd channel counts, split-K.
TEST_P(GpuDType, TcConvChainsRunNatively) {
  SKIP_WITHOUT_GPU();
  const std::string d = DTypeName(GetParam());
  const std::vector<std::string> specs = {
      "x:" + d + "[2,12,9,10,11] | conv3d(out=20,k=3,padding=1) | gelu",
      "x:" + d +
          "[2,16,8,8,8] | conv_transpose3d(out=24,k=3,stride=2,padding=1,output_padding=1) "
          "| relu | group_norm(groups=4) | tanh",
      "x:" + d +
          "[3,8,10,10,10] | conv3d(out=24,k=3,stride=2,padding=1) | swish | "
          "group_norm(groups=6) | mean(dims=[2,3,4])",
      "x:" + d +
          "[2,24,8,8,8] | conv3d(out=40,k=3,padding=1) | relu | group_norm(groups=5) | "
          "sigmoid | mean(dims=[1,2,3,4])",
      "x:" + d +
          "[2,40,6,6,6] | conv3d(out=72,k=3,padding=1,dilation=2) | tanh | "
          "mean(dims=[2,3,4])",
      "x:" + d + "[1,200,4,4,4] | conv3d(out=200,k=3,padding=1) | group_norm(groups=8)",
      // at most 8 output channels: the 8-channel tile (one n8 fragment a warp)
      "x:" + d +
          "[2,40,6,7,8] | conv_transpose3d(out=4,k=3,stride=2,padding=1,output_padding=1) | "
          "group_norm(groups=2)",
      "x:" + d + "[2,24,7,8,9] | conv3d(out=7,k=3,padding=1) | swish | mean(dims=[2,3,4])",
  };
  for (const std::string& spec : specs) CheckForward(ParseOrFail(spec), 17, "tc-conv");
}

// The native bf16/f16 tc-conv under its tilings: the default and its nearest neighbours (every
// k-step width: 16, 32 and 64 values a k-step over 4 taps x 12 (padded to 16) channels; tile
// shapes, warp tiles, split-K, stages), each against the f32 plan rounded.
TEST_P(GpuDType, TcConvEveryTileShape) {
  SKIP_WITHOUT_GPU();
  const Chain chain = ParseOrFail(std::string("x:") + DTypeName(GetParam()) +
                                  "[2,12,7,9,11] | conv3d(out=36,k=[1,2,2],padding=1) | swish | "
                                  "group_norm(groups=6)");
  const codegen::Strategy* tc = codegen::FindStrategy("tc-conv");
  ASSERT_NE(tc, nullptr);
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  int checked = 0;
  for (const codegen::TuneConfig& config : tc->Candidates(codegen::PlanInput(chain, target))) {
    if (checked == 24) break;
    CheckForward(chain, 19, "tc-conv", config.ToString());
    ++checked;
  }
  EXPECT_GE(checked, 16);
}

// f64 chains (the generic plans in double): forward against the reference, fully written, two runs
// bitwise identical. The host side decodes outputs to float, so these hold them to f32's
// tolerance; the Python tests compare f64 models in double (rel err <= 1e-12).
TEST(GpuF64, SeedsAndRandomChainsForward) {
  SKIP_WITHOUT_GPU();
  for (const Workload& w : SeedWorkloads()) {
    Chain chain = AsDType(ParseOrFail(w.spec), DType::kF64);
    chain.input[0] = 1;
    CheckF64Forward(chain, 5);
  }
  Rng rng(81);
  for (int i = 0; i < 30; ++i) CheckF64Forward(AsDType(RandomChain(rng), DType::kF64), 400 + i);
}

// Chains without a producer run one 16-byte vector a thread (4 floats, 8 bf16/f16, 2 doubles)
// and the remainder one element a thread: counts from 1 to past a million, none a multiple of 8
// but one, in every dtype; each value checked (fully written, twice the same bits, and for
// bf16/f16 the f32 plan's value rounded once).
TEST(GpuElementwise, VectorsAndTheirTailsInEveryDType) {
  SKIP_WITHOUT_GPU();
  const char* shapes[] = {"[1,1,1,1,1]",  "[1,1,1,1,7]",    "[1,2,1,1,4]",
                          "[2,3,5,7,11]", "[3,5,17,19,23]", "[2,7,33,37,43]"};
  for (const char* shape : shapes) {
    const Chain chain = ParseOrFail(
        absl::StrCat("x:f32", shape,
                     " | hardswish | clamp(min=-0.25,max=0.75) | leaky_relu(negative_slope=0.2)"));
    testing::CheckChain(chain, 3, {});
    CheckForward(AsDType(chain, DType::kBF16), 4);
    CheckForward(AsDType(chain, DType::kF16), 5);
    CheckF64Forward(AsDType(chain, DType::kF64), 6);
  }
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, GpuDType, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace fusejit
