// The backward pass on the GPU: every gradient (x, conv weight and bias, group_norm weight and
// bias) of the seed chains (small batches) and of random chains against the float64 reference
// backward, gradient buffers NaN-poisoned and checked fully written, two runs bitwise identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "tests/gpu_support.h"
#include "tests/random_chains.h"
#include "tools/runner.h"
#include "tools/tensor_files.h"

namespace fusejit {
namespace {

Chain WithBatch(const std::string& spec, int64_t batch) {
  absl::StatusOr<Chain> c = ParseChain(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  Chain chain = *c;
  chain.input[0] = batch;
  return chain;
}

// Whether the H100 backward plan of `chain` (saved_stats: reading the training forward's group
// statistics) runs a kernel whose body names `body`.
bool BackwardPlanRuns(const Chain& chain, const std::string& body, bool saved_stats = false) {
  absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(
      chain, codegen::PlanTarget{"sm_90", 132, Precision::kFp32}, saved_stats);
  if (!plan.ok()) return false;
  for (const codegen::KernelLaunch& k : plan->kernels) {
    if (k.body.find(body) != std::string::npos) return true;
  }
  return false;
}

// Runs the backward of `chain` on `inputs` twice and checks every gradient.
void CheckBackwardOn(const Chain& chain, const HostInputs& inputs, uint64_t seed,
                     Precision precision = Precision::kFp32, double rtol = 1e-5) {
  SCOPED_TRACE(FormatChain(chain));
  CompileOptions options;
  options.precision = precision;
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, options);
  ASSERT_TRUE(b.ok()) << b.status();  // every f32 chain has a backward
  const HostTensor grad_y = tools::RandomGradOutput(chain, seed);
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  reads["grad_y"] = grad_y;
  absl::StatusOr<tools::SignatureRunResult> first = tools::RunSignatureOnDevice(**b, reads, {.reps = 0});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<tools::SignatureRunResult> second = tools::RunSignatureOnDevice(**b, reads, {.reps = 0});
  ASSERT_TRUE(second.ok()) << second.status();
  for (const auto& [name, t] : first->written) {
    const HostTensor& u = second->written.at(name);
    ASSERT_EQ(t.data.size(), u.data.size());
    EXPECT_EQ(std::memcmp(t.data.data(), u.data.data(), t.data.size() * sizeof(float)), 0)
        << name << " differs between two runs";
  }
  tools::CheckOptions check;
  check.rtol = rtol;
  absl::StatusOr<tools::GradientCheckResult> r =
      tools::CheckGradients(chain, inputs, grad_y, first->written, check);
  ASSERT_TRUE(r.ok()) << r.status();
  std::string table;
  for (const tools::GradientCheck& g : r->gradients) {
    table += absl::StrCat("  ", g.name, ": rel_l2 ", g.errors.rel_l2, " max_abs ", g.errors.max_abs,
                          " rel_max ", g.rel_max, " unwritten ", g.unwritten, "\n");
    EXPECT_TRUE(g.pass) << g.name << " rel_l2 " << g.errors.rel_l2 << " rel_max " << g.rel_max
                        << " unwritten " << g.unwritten;
  }
  std::printf("%s\n%s", FormatChain(chain).c_str(), table.c_str());
}

// Runs the backward of `chain` on random inputs twice and checks every gradient.
void CheckBackward(const Chain& chain, uint64_t seed, Precision precision = Precision::kFp32,
                   double rtol = 1e-5) {
  CheckBackwardOn(chain, RandomInputs(chain, seed), seed, precision, rtol);
}

TEST(GpuBackward, SeedChains) {
  SKIP_WITHOUT_GPU();
  for (const Workload& w : SeedWorkloads()) {
    const int64_t batch = w.id == "W3" ? 1 : 2;
    CheckBackward(WithBatch(w.spec, batch), 1);
  }
}

TEST(GpuBackward, EveryOpAndMeanMode) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,5,6,7,8] | conv3d(out=6,k=3,padding=1) | relu | group_norm(groups=3) | leaky_relu(slope=0.2)",
      "x:f32[2,5,6,7,8] | conv3d(out=6,k=3,stride=2,padding=1) | sigmoid | group_norm(groups=2) | tanh | mean(dims=[2,3,4])",
      "x:f32[3,4,5,6,7] | conv3d(out=8,k=[2,3,1],dilation=2,bias=false) | gelu | group_norm(groups=4) | mean(dims=[1,2,3,4])",
      "x:f32[2,4,5,6,5] | conv_transpose3d(out=6,k=3,stride=2,padding=1,output_padding=1) | swish | group_norm(groups=2) | hardswish",
      "x:f32[2,3,4,5,6] | conv_transpose3d(out=5,k=[3,2,2],stride=[2,1,3],padding=[1,0,0],bias=false) | clamp(min=-0.2,max=0.3)",
      "x:f32[2,6,5,6,7] | group_norm(groups=3) | swish",
      "x:f32[2,6,5,6,7] | tanh | group_norm(groups=2) | mean(dims=[2,3,4])",
      "x:f32[2,3,5,6,7] | hardswish | gelu",
      "x:f32[2,3,9,9,9] | conv3d(out=4,k=3) | mean(dims=[2,3,4])",
      "x:f32[1,8,6,6,6] | conv3d(out=40,k=3,padding=1) | relu | group_norm(groups=5)",
      // output_padding >= stride (dilation allows it): the data gradient cropped.
      "x:f32[2,4,5,5,5] | conv_transpose3d(out=4,k=3,output_padding=1,dilation=2) | relu | group_norm(groups=2)",
      "x:f32[1,3,4,5,6] | conv_transpose3d(out=5,k=[3,2,3],stride=[1,2,1],padding=[1,0,0],output_padding=[1,1,2],dilation=[2,2,3]) | tanh",
      // the smooth activations (softplus's threshold inside the data's range)
      "x:f32[2,5,6,7,8] | conv3d(out=6,k=3,padding=1) | mish | group_norm(groups=3) | softplus(beta=1.5,threshold=1)",
      "x:f32[2,4,5,6,5] | conv_transpose3d(out=6,k=3,stride=2,padding=1) | elu(alpha=0.7) | group_norm(groups=2) | selu | mean(dims=[2,3,4])",
      "x:f32[2,6,5,6,7] | hardsigmoid | group_norm(groups=3) | mish",
      "x:f32[2,3,5,6,7] | selu | softplus | elu",
      "x:f32[2,5,6,7,8] | conv3d(out=6,k=3,padding=1) | gelu_tanh | group_norm(groups=3) | celu(alpha=0.6)",
      "x:f32[2,4,5,6,5] | conv_transpose3d(out=6,k=3,stride=2,padding=1) | logsigmoid | group_norm(groups=2) | softsign | mean(dims=[2,3,4])",
      "x:f32[2,6,5,6,7] | tanhshrink | group_norm(groups=3) | gelu_tanh",
  };
  uint64_t seed = 11;
  for (const char* spec : specs) {
    absl::StatusOr<Chain> c = ParseChain(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    CheckBackward(*c, seed++);
  }
}

// hardtanh (nn.Hardtanh, nn.ReLU6) passes the gradient only strictly inside its bounds, clamp at
// them too: inputs put every third point exactly on a bound (through a 1x1 identity convolution,
// whose output is x exactly), so a backward with the other op's convention fails by far.
TEST(GpuBackward, HardtanhAndClampAtTheirBounds) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,4,5,6,7] | conv3d(out=4,k=1,bias=false) | hardtanh(min=-0.5,max=0.5) | "
      "group_norm(groups=2)",
      "x:f32[2,4,5,6,7] | conv3d(out=4,k=1,bias=false) | clamp(min=-0.5,max=0.5) | "
      "group_norm(groups=2)",
      "x:f32[2,4,5,6,7] | conv3d(out=4,k=1,bias=false) | hardtanh(min=0,max=6) | tanh | "
      "mean(dims=[2,3,4])",
      "x:f32[2,3,5,6,7] | hardtanh(min=-0.5,max=0.5) | group_norm(groups=3) | swish",
      "x:f32[2,3,5,6,7] | hardtanh(min=0,max=6) | gelu",
      // one-sided clamps: gradient 1 at the bound (clamp(min=0) is not relu, whose is 0)
      "x:f32[2,4,5,6,7] | conv3d(out=4,k=1,bias=false) | clamp(min=0) | group_norm(groups=2)",
      "x:f32[2,3,5,6,7] | clamp(max=0.5) | group_norm(groups=3) | swish",
  };
  uint64_t seed = 41;
  for (const char* spec : specs) {
    absl::StatusOr<Chain> c = ParseChain(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    const Op& act = c->ops[c->ops[0].kind == OpKind::kConv3d ? 1 : 0];
    HostInputs inputs = RandomInputs(*c, seed);
    // (a one-sided clamp's other bound is infinite: both halves on its finite one)
    const double lo = std::isinf(act.min) ? act.max : act.min;
    const double hi = std::isinf(act.max) ? act.min : act.max;
    for (size_t i = 0; i < inputs.x.data.size(); i += 3) {
      inputs.x.data[i] = static_cast<float>(i % 2 ? lo : hi);
    }
    if (c->ops[0].kind == OpKind::kConv3d) {
      HostTensor& w = inputs.params.at("0.weight");  // [4,4,1,1,1]: the identity
      for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = i % 5 == 0 ? 1.f : 0.f;
    }
    CheckBackwardOn(*c, inputs, seed++);
  }
}

// The weight gradient on tensor cores (sm_80+, 32 or more GEMM rows: conv3d's output channels,
// conv_transpose3d's input channels): rows and columns that are not whole tiles, strides,
// dilation, output_padding, a 1x1x1 kernel, several reduction chunks; fp32-accurate (3xTF32) to
// 1e-5, and TF32 when asked to 2e-2 of the magnitude (the forward TF32 tests' max-error bound:
// every product of the recompute, the data and the weight gradient rounds its operands to 10
// bits, and group_norm's backward divides by the group's spread).
TEST(GpuBackward, TensorCoreWeightGradient) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,32,7,9,11] | conv3d(out=40,k=3,padding=1) | gelu | group_norm(groups=5)",
      "x:f32[2,48,6,7,8] | conv_transpose3d(out=24,k=3,stride=2,padding=1,output_padding=1) | "
      "tanh | group_norm(groups=4) | mean(dims=[2,3,4])",
      "x:f32[1,100,5,6,7] | conv3d(out=70,k=[2,3,1],stride=[1,2,1],dilation=2) | swish",
      "x:f32[1,64,8,8,8] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)",
      "x:f32[2,32,9,9,9] | conv3d(out=64,k=1) | sigmoid | group_norm(groups=16) | hardswish",
      "x:f32[4,32,16,16,16] | conv3d(out=64,k=3,padding=1) | tanh",
  };
  uint64_t seed = 70;
  for (const char* spec : specs) {
    absl::StatusOr<Chain> c = ParseChain(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    CheckBackward(*c, seed++);
    CheckBackward(*c, seed++, Precision::kTf32, 2e-2);
  }
}

// The halo weight gradient (templates/wgrad_halo.cuh: T with 8 to 32 channels): tiles of 16 and
// 32 rows, one and several column tiles, T rows wider than a 64-point segment, strides, dilations,
// paddings, output_padding, tiles past the grid's edges; and a chain whose halo does not fit;
// fp32-accurate to 1e-5 and in TF32 mode.
TEST(GpuBackward, HaloWeightGradient) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[3,5,12,20,20] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      "x:f32[2,5,6,9,70] | conv3d(out=24,k=3,padding=[0,1,2]) | group_norm(groups=8) | "
      "mean(dims=[1,2,3,4])",
      "x:f32[2,12,5,8,8] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      "x:f32[2,9,4,7,67] | conv_transpose3d(out=7,k=[2,3,4],stride=[1,2,3],dilation=[1,2,1],"
      "output_padding=[0,1,2]) | relu",
      "x:f32[1,9,6,11,13] | conv3d(out=29,k=[3,2,5],stride=[2,1,2],dilation=[1,2,1],padding=2) | "
      "tanh | group_norm(groups=1)",
      "x:f32[2,20,5,6,7] | conv3d(out=13,k=3,padding=1) | gelu",
      // Too wide a halo: the per-tap gathering mma kernel in a 16-row tile.
      "x:f32[1,12,5,6,7] | conv_transpose3d(out=40,k=7,stride=3,dilation=3) | tanh",
  };
  uint64_t seed = 500;
  for (const char* spec : specs) {
    absl::StatusOr<Chain> c = ParseChain(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    CheckBackward(*c, seed++);
    CheckBackward(*c, seed++, Precision::kTf32, 2e-2);
  }
}

// The wgmma weight gradient (sm_90, both channel counts of the GEMM 32 or more) on random chains
// of the grammar with 32-160 channels: odd counts (tiles padded), strides, dilations, paddings,
// output_padding, batch 1-3; fp32-accurate to 1e-5 and in TF32 mode.
TEST(GpuBackward, WgmmaWeightGradientRandomChains) {
  SKIP_WITHOUT_GPU();
  Rng rng(90210);
  RandomChainOptions options;
  options.max_batch = 3;
  options.max_spatial = 9;
  options.max_channels = 160;
  int checked = 0;
  for (int i = 0; i < 400 && checked < 16; ++i) {
    const Chain c = RandomChain(rng, options);
    const codegen::ChainInfo info = codegen::AnalyzeChain(c);
    if (info.producer == nullptr || c.input[1] < 32 || info.producer_shape[1] < 32) continue;
    CheckBackward(c, 300 + i, checked % 4 == 3 ? Precision::kTf32 : Precision::kFp32,
                  checked % 4 == 3 ? 2e-2 : 1e-5);
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

// The wgmma weight gradient with tap reuse (templates/wgrad_taps.cuh): stride-1 convolutions and
// transposed convolutions, 2 to 7 kw taps (2 or 3 per CTA, idle warpgroups where they do not
// divide), padding and output_padding, dilation along every axis, channel counts that are not
// multiples of 64, both precisions.
TEST(GpuBackward, WgmmaTapReuseWeightGradient) {
  SKIP_WITHOUT_GPU();
  Rng rng(4242);
  int checked = 0;
  for (int i = 0; checked < 14 && i < 200; ++i) {
    const bool transposed = rng.Int(0, 1) == 1;
    const int64_t kd = rng.Int(1, 3), kh = rng.Int(1, 3), kw = rng.Int(2, 7);
    const int64_t dw = rng.Int(1, 2), dh = rng.Int(1, 2);
    const int64_t pw = rng.Int(0, std::min<int64_t>(2, (kw - 1) * dw));
    const int64_t cin = rng.Int(32, 150), cout = rng.Int(32, 150);
    const int64_t batch = rng.Int(1, 3), d = rng.Int(3, 6), h = rng.Int(4, 9),
                  w = rng.Int(kw * dw, 19);
    std::string op =
        absl::StrCat(transposed ? "conv_transpose3d" : "conv3d", "(out=", cout, ",k=[", kd, ",", kh,
                     ",", kw, "],padding=[0,1,", pw, "],dilation=[1,", dh, ",", dw, "]");
    if (transposed && rng.Int(0, 1) == 1) absl::StrAppend(&op, ",output_padding=[0,0,1]");
    absl::StrAppend(&op, ")");
    const std::string spec = absl::StrCat("x:f32[", batch, ",", cin, ",", d, ",", h, ",", w, "] | ",
                                          op, i % 2 ? " | gelu" : " | group_norm(groups=1)");
    absl::StatusOr<Chain> c = ParseChain(spec);
    if (!c.ok()) continue;  // e.g. an output_padding the stride does not allow
    if (!BackwardPlanRuns(*c, "fj::wgrad_taps_kernel")) continue;
    CheckBackward(*c, 700 + i, checked % 3 == 2 ? Precision::kTf32 : Precision::kFp32,
                  checked % 3 == 2 ? 2e-2 : 1e-5);
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}

// The training pair (CompileTrainingForward, CompileBackwardFromSaved) of a chain that saves: y
// against the float64 reference, u poisoned and written in full, and every gradient within 1e-5
// of float64. Where the training forward runs the producer's own plan (the composite), every
// gradient is bitwise the recomputing backward's (u is the same plan's output either way); where
// the fused forward writes u (codegen::SaveProducerOutput), u is checked against the float64
// convolution and two backward runs are bitwise identical.
void CheckSavedGradients(const Chain& chain, uint64_t seed, CompiledChain& fwd_chain) {
  absl::StatusOr<std::shared_ptr<CompiledChain>> bwd = CompileBackwardFromSaved(chain, {});
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  absl::StatusOr<std::shared_ptr<CompiledChain>> plain = CompileBackward(chain, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  const HostInputs inputs = RandomInputs(chain, seed);
  std::map<std::string, HostTensor> reads = inputs.params;
  reads["x"] = inputs.x;
  absl::StatusOr<tools::SignatureRunResult> f =
      tools::RunSignatureOnDevice(fwd_chain, reads, {.reps = 0});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->written.count("u"), 1u);
  // Every saved tensor (u; the group statistics where the plan saves them too) written in full.
  std::vector<std::string> saved;
  for (const TensorSpec& t : fwd_chain.signature()) {
    if (t.role != TensorRole::kSaved) continue;
    saved.push_back(t.name);
    ASSERT_EQ(f->written.count(t.name), 1u) << t.name;
    for (double v : f->written.at(t.name).data) {
      ASSERT_TRUE(std::isfinite(v)) << t.name << " not written in full";
    }
  }
  absl::StatusOr<tools::CheckResult> y =
      tools::CheckOutput(chain, inputs, f->written.at("y"), tools::CheckOptions{});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(y->pass) << "y rel_l2 " << y->errors.rel_l2 << " unwritten " << y->unwritten;

  reads["grad_y"] = tools::RandomGradOutput(chain, seed);
  absl::StatusOr<tools::SignatureRunResult> recomputed =
      tools::RunSignatureOnDevice(**plain, reads, {.reps = 0});
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  for (const std::string& name : saved) reads[name] = f->written.at(name);
  absl::StatusOr<tools::SignatureRunResult> b =
      tools::RunSignatureOnDevice(**bwd, reads, {.reps = 0});
  ASSERT_TRUE(b.ok()) << b.status();
  for (const std::string& name : saved) EXPECT_EQ(b->written.count(name), 0u) << name;  // read
  const bool fused = fwd_chain.strategy() != "training-forward";
  absl::StatusOr<tools::SignatureRunResult> again;
  if (fused) {
    const Chain producer = codegen::ProducerChain(chain);
    HostInputs producer_inputs{inputs.x, {}};
    for (const ParamSpec& p : ChainParams(producer)) {
      producer_inputs.params[p.name] = inputs.params.at(p.name);
    }
    // u as [N, C, D, H, W]; the training forward may lay it out [N, D, H, C, W]
    // (codegen::ULayout::kRowsByChannel: its signature's shape says which).
    HostTensor u_ncdhw = f->written.at("u");
    const Shape p = codegen::AnalyzeChain(chain).producer_shape;
    if (u_ncdhw.shape != p) {
      EXPECT_EQ(u_ncdhw.shape, (Shape{p[0], p[2], p[3], p[1], p[4]}));
      const HostTensor& rows = f->written.at("u");
      u_ncdhw.shape = p;
      const int64_t C = p[1], D = p[2], H = p[3], W = p[4];
      for (int64_t n = 0; n < p[0]; ++n)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t w = 0; w < W; ++w) {
                u_ncdhw.data[(((n * C + c) * D + d) * H + h) * W + w] =
                    rows.data[(((n * D + d) * H + h) * C + c) * W + w];
              }
    }
    absl::StatusOr<tools::CheckResult> u =
        tools::CheckOutput(producer, producer_inputs, u_ncdhw, tools::CheckOptions{});
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_TRUE(u->pass) << "u rel_l2 " << u->errors.rel_l2 << " unwritten " << u->unwritten;
    again = tools::RunSignatureOnDevice(**bwd, reads, {.reps = 0});
    ASSERT_TRUE(again.ok()) << again.status();
  }
  for (const auto& [name, t] : (fused ? again : recomputed)->written) {
    const HostTensor& got = b->written.at(name);
    ASSERT_EQ(t.data.size(), got.data.size());
    EXPECT_EQ(std::memcmp(t.data.data(), got.data.data(), t.data.size() * sizeof(t.data[0])), 0)
        << name
        << (fused ? " differs between two runs" : " differs from the recomputing backward's");
  }
  absl::StatusOr<tools::GradientCheckResult> r = tools::CheckGradients(
      chain, inputs, reads.at("grad_y"), b->written, tools::CheckOptions{.rtol = 1e-5});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const tools::GradientCheck& g : r->gradients) {
    EXPECT_TRUE(g.pass) << g.name << " rel_max " << g.rel_max << " unwritten " << g.unwritten;
  }
}

// A chain that does not save gets the plain forward (no kSaved tensor) and a refusal of the saved
// backward. Returns whether the chain saves.
bool CheckTrainingPair(const Chain& chain, uint64_t seed) {
  SCOPED_TRACE(FormatChain(chain));
  absl::StatusOr<std::shared_ptr<CompiledChain>> fwd = CompileTrainingForward(chain, {});
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return false;
  if (!TrainingForwardSaves(chain)) {
    for (const TensorSpec& t : (*fwd)->signature()) EXPECT_NE(t.role, TensorRole::kSaved);
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(chain, {});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
    return false;
  }
  CheckSavedGradients(chain, seed, **fwd);
  return true;
}

TEST(GpuBackward, TrainingForwardSavesUForTheBackward) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[1,64,12,12,12] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
      "group_norm(groups=8)",
      "x:f32[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      "x:f32[2,3,6,7,9] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      "x:f32[2,5,6,7,8] | conv3d(out=6,k=3,stride=2,padding=1) | sigmoid | mean(dims=[1,2,3,4])",
      "x:f32[2,4,5,5,5] | conv_transpose3d(out=4,k=3,output_padding=1,dilation=2) | relu | "
      "group_norm(groups=2)",
  };
  uint64_t seed = 700;
  int saved = 0;
  for (const char* spec : specs) saved += CheckTrainingPair(ParseOrFail(spec), seed++);
  EXPECT_EQ(saved, 5);  // the stride-2 conv_transpose3d: its fused forward writes u
  // Plans writing u in their own forward (codegen::SaveProducerOutput): mma-moments-mean (W2's
  // and W4's plan; odd sizes, kernels and channel counts, both mean modes),
  // convt-recompute-normalize's statistics pass (W1's plan; coalesced rows (stride 2 along w) and
  // direct ones, output_padding, per-dimension strides; it saves the group statistics too),
  // mma-convt-recompute-normalize's, convt-direct's pass, and the igemm
  // epilogue (W3's plan, with and without group_norm, a spatial size not a multiple of 4: scalar
  // stores).
  struct Fused {
    const char* spec;
    const char* strategy;
  };
  const Fused fused[] = {
      {"x:f32[2,3,12,13,14] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       "mma-moments-mean"},
      {"x:f32[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])",
       "mma-moments-mean"},
      {"x:f32[2,5,9,11,10] | conv3d(out=8,k=[3,4,3]) | swish | group_norm(groups=2) | "
       "mean(dims=[1,2,3,4])",
       "mma-moments-mean"},
      {"x:f32[3,8,7,12,9] | conv3d(out=32,k=3) | tanh | group_norm(groups=4) | mean(dims=[2,3,4])",
       "mma-moments-mean"},
      {"x:f32[4,3,8,16,16] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4,eps=1e-5) | hardswish",
       "convt-recompute-normalize"},
      {"x:f32[2,3,8,10,17] | conv_transpose3d(out=8,k=3,stride=2,padding=1,output_padding=1) | "
       "gelu | group_norm(groups=2) | tanh",
       "convt-recompute-normalize"},
      {"x:f32[2,2,5,6,7] | conv_transpose3d(out=12,k=[3,2,3],stride=[1,2,3]) | relu | "
       "group_norm(groups=3)",
       "convt-recompute-normalize"},
      // mma-convt-recompute-normalize's statistics pass (u, and the group statistics from its
      // scale/shift kernel, as convt-recompute-normalize's).
      {"x:f32[17,8,8,16,16] | conv_transpose3d(out=16,k=2,stride=2) | gelu | "
       "group_norm(groups=4) | relu",
       "mma-convt-recompute-normalize"},
      {"x:f32[1,64,12,12,12] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
       "group_norm(groups=8)",
       "igemm-store-normalize"},
      {"x:f32[2,64,7,9,11] | conv_transpose3d(out=128,k=3) | gelu | group_norm(groups=4) | "
       "sigmoid",
       "igemm-store-normalize"},
      {"x:f32[2,32,12,12,12] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)",
       "igemm-store-normalize"},
      {"x:f32[2,32,9,10,11] | conv3d(out=64,k=3,padding=1) | tanh", "igemm-store"},
      // convt-direct's single pass (no group_norm), rows of 17 points: coalesced and direct.
      {"x:f32[2,3,6,8,9] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish",
       "convt-direct"},
      {"x:f32[2,2,5,6,4] | conv_transpose3d(out=7,k=[2,3,3],stride=[2,1,2]) | gelu | tanh",
       "convt-direct"},
      // tc-conv's epilogue: pre-norm values (the sweep's K4 shape, small), y of a transposed
      // convolution split into output phases.
      {"x:f32[2,16,8,8,8] | conv3d(out=32,k=5,padding=2) | relu | group_norm(groups=4)", "tc-conv"},
      {"x:f32[2,20,10,10,10] | conv_transpose3d(out=36,k=3,stride=2,padding=1,output_padding=1) | "
       "tanh",
       "tc-conv"},
      // mma-direct's row stores of u (odd rows, 8 and 24 channels).
      {"x:f32[2,3,9,10,13] | conv3d(out=8,k=3) | swish", "mma-direct"},
      {"x:f32[2,3,7,12,11] | conv3d(out=24,k=[3,4,3]) | hardswish | tanh", "mma-direct"},
      // The reduction split (u written by the kernel adding the parts), groups across tiles.
      {"x:f32[2,128,8,8,8] | conv3d(out=192,k=3,padding=1) | swish | group_norm(groups=8)",
       "igemm-store-normalize"},
  };
  for (const Fused& t : fused) {
    const Chain c = ParseOrFail(t.spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(c, {});
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->strategy(), t.strategy) << t.spec;
    EXPECT_TRUE(CheckTrainingPair(c, seed++)) << t.spec;
  }
  Rng rng(777);
  int checked = 0;
  for (int i = 0; i < 200 && checked < 12; ++i) {
    const Chain c = RandomChain(rng);
    if (!TrainingForwardSaves(c)) continue;
    CheckTrainingPair(c, 800 + i);
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

// The fused backward for few input channels (templates/few_in_backward.cuh): conv_transpose3d
// with strides, padding beyond the stride, dilation, output_padding (also >= stride); conv3d with
// stride 1, padding and dilation; odd sizes that leave partial tiles, no bias, no group_norm,
// mean modes, ops after group_norm, W1 and W4 at batch 2; and random chains that take it.
TEST(GpuBackward, FewInputChannelsFusedBackward) {
  SKIP_WITHOUT_GPU();
  const char* const specs[] = {
      "x:f32[2,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      "x:f32[3,1,5,7,9] | conv_transpose3d(out=5,k=[2,3,1],stride=[2,1,3],bias=false) | tanh",
      "x:f32[2,4,6,5,7] | conv_transpose3d(out=8,k=3,dilation=2,padding=3,output_padding=1,"
      "stride=2) | relu | group_norm(groups=2) | mean(dims=[2,3,4])",
      "x:f32[2,2,4,5,6] | conv_transpose3d(out=6,k=3,stride=[1,2,1],dilation=[2,2,3],"
      "output_padding=[1,1,2]) | gelu | group_norm(groups=3) | leaky_relu(negative_slope=0.1)",
      "x:f32[1,3,9,11,13] | conv_transpose3d(out=7,k=[3,2,4],stride=[3,2,1],padding=[0,1,2]) | "
      "hardswish | group_norm(groups=7) | mean(dims=[1,2,3,4])",
      "x:f32[2,4,3,40,70] | conv_transpose3d(out=4,k=1,stride=2) | sigmoid | "
      "group_norm(groups=1)",
      "x:f32[4,1,8,8,8] | conv_transpose3d(out=32,k=[3,3,1],stride=1,padding=1) | relu",
      // conv3d with stride 1: W4 at batch 2, padding, dilation, odd sizes, no bias.
      "x:f32[2,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])",
      "x:f32[2,3,16,32,32] | conv3d(out=16,k=[2,4,2]) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      "x:f32[2,2,6,7,9] | conv3d(out=5,k=[3,1,2],padding=[2,0,1],dilation=[1,1,2]) | tanh",
      "x:f32[3,4,5,9,11] | conv3d(out=6,k=3,padding=1,bias=false) | swish | "
      "group_norm(groups=3) | gelu",
      "x:f32[2,1,7,6,40] | conv3d(out=9,k=[2,3,3],dilation=[2,1,2],padding=[1,1,2]) | relu | "
      "group_norm(groups=9)",
  };
  int seed = 500;
  for (const char* spec : specs) {
    const Chain chain = WithBatch(spec, ParseChain(spec)->input[0]);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(chain, codegen::PlanTarget{"sm_90", 132, Precision::kFp32});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(codegen::BackwardPlanWritesGradX(chain, *plan)) << spec;
    CheckBackward(chain, seed++);
  }
  Rng rng(9191);
  int taken = 0;
  for (int i = 0; i < 400 && taken < 20; ++i) {
    const Chain chain = RandomChain(rng);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(chain, codegen::PlanTarget{"sm_90", 132, Precision::kFp32});
    if (!plan.ok() || !codegen::BackwardPlanWritesGradX(chain, *plan)) continue;
    ++taken;
    CheckBackward(chain, 700 + i);
  }
  EXPECT_GE(taken, 10);
}

// grad_y's group_norm sums on a recomputed u (templates/convt_backward.cuh), through the
// recomputing backward (statistics from u: zpart) and the training pair (the forward's statistics):
// W1 at batch 2; rows narrower than a warp (several per warp), rows wider than 64 (several q chunks
// a lane), 32 and 20 channels (two rounds of the reduce-scatter), both mean modes, odd groups, no
// op after group_norm (the training pair's saved statistics); and random chains that take it.
// The mean chains' training forwards save u without the statistics, or nothing.
TEST(GpuBackward, ConvTSumsRecomputeU) {
  SKIP_WITHOUT_GPU();
  const auto recomputes = [](const Chain& chain, bool saved_stats) {
    return BackwardPlanRuns(chain, "convt_bwd_sums_kernel", saved_stats);
  };
  const char* const specs[] = {
      "x:f32[2,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      "x:f32[3,2,5,6,5] | conv_transpose3d(out=12,k=3,stride=2) | gelu | group_norm(groups=3) | "
      "tanh",
      "x:f32[2,1,4,5,70] | conv_transpose3d(out=8,k=[2,3,3],stride=[1,2,2],padding=[0,1,1],"
      "output_padding=[0,1,0]) | relu | group_norm(groups=2) | sigmoid",
      "x:f32[2,2,5,6,7] | conv_transpose3d(out=32,k=2,stride=2) | leaky_relu | "
      "group_norm(groups=8) | hardswish",
      "x:f32[2,3,4,7,9] | conv_transpose3d(out=20,k=3,stride=2,padding=1,dilation=[1,2,1]) | "
      "swish | group_norm(groups=5) | relu",
      "x:f32[3,3,6,5,8] | conv_transpose3d(out=9,k=3,stride=2,padding=1) | hardswish | "
      "group_norm(groups=3) | gelu | mean(dims=[2,3,4])",
      "x:f32[2,4,5,6,4] | conv_transpose3d(out=6,k=2,stride=[2,1,2]) | tanh | "
      "group_norm(groups=1) | swish | mean(dims=[1,2,3,4])",
  };
  int seed = 1300, saved = 0;
  for (const char* spec : specs) {
    const Chain chain = ParseOrFail(spec);
    EXPECT_TRUE(recomputes(chain, false)) << spec;
    CheckBackward(chain, seed++);
    saved += CheckTrainingPair(chain, seed++);
  }
  EXPECT_GE(saved, 5);  // all but the mean chains save u and the statistics
  // No op after group_norm: the recomputing backward takes one pass over u for both sums; the
  // training pair's backward (saved statistics) recomputes u.
  const Chain plain = ParseOrFail(
      "x:f32[2,3,6,9,10] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4)");
  EXPECT_FALSE(recomputes(plain, false));
  EXPECT_TRUE(recomputes(plain, true));
  EXPECT_TRUE(CheckTrainingPair(plain, seed++));
  Rng rng(2727);
  int taken = 0;
  for (int i = 0; i < 800 && taken < 12; ++i) {
    const Chain chain = RandomChain(rng);
    if (!recomputes(chain, false)) continue;
    ++taken;
    CheckBackward(chain, 1400 + i);
  }
  EXPECT_GE(taken, 6);
}

// The direct FFMA weight gradient (templates/wgrad_direct.cuh) of conv3d chains with few input
// channels and kernels 5 wide: strides along d and h, padding, dilation, 1 to 32 output channels
// (not multiples of 4), rows that leave a partial stage, several planes per block; and random
// chains that take it (drawn with kernels 5 to 7 wide: the plan takes the 5-wide ones).
TEST(GpuBackward, DirectWeightGradient) {
  SKIP_WITHOUT_GPU();
  const auto direct = [](const Chain& chain) {
    return BackwardPlanRuns(chain, "wgrad_direct_kernel");
  };
  const char* const specs[] = {
      "x:f32[2,3,9,10,14] | conv3d(out=16,k=[2,3,5]) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      "x:f32[2,3,8,17,19] | conv3d(out=10,k=[3,3,5],stride=[2,2,1],padding=1) | relu | "
      "group_norm(groups=5)",
      "x:f32[3,1,9,10,11] | conv3d(out=5,k=5,bias=false) | tanh",
      "x:f32[2,4,7,9,12] | conv3d(out=32,k=[2,3,5],stride=[1,2,1],padding=[0,1,2]) | gelu | "
      "group_norm(groups=8) | mean(dims=[1,2,3,4])",
      "x:f32[2,2,8,11,13] | conv3d(out=7,k=[3,3,5],dilation=[2,1,3],padding=4) | sigmoid",
      "x:f32[1,3,5,30,16] | conv3d(out=1,k=[1,4,5],stride=[2,3,1]) | swish",
      "x:f32[2,4,6,6,9] | conv3d(out=12,k=[3,3,5],stride=[3,3,1],padding=[1,2,0]) | leaky_relu | "
      "group_norm(groups=3) | hardswish",
      "x:f32[2,1,20,24,40] | conv3d(out=24,k=5,padding=2) | relu | group_norm(groups=6)",
  };
  int seed = 900;
  for (const char* spec : specs) {
    const Chain chain = *ParseChain(spec);
    EXPECT_TRUE(direct(chain)) << spec;
    CheckBackward(chain, seed++);
  }
  Rng rng(31337);
  const RandomChainOptions options = FewInputWideKernelOptions();
  int taken = 0;
  for (int i = 0; i < 600 && taken < 20; ++i) {
    const Chain chain = RandomChain(rng, options);
    if (!direct(chain)) continue;
    ++taken;
    CheckBackward(chain, 1000 + i);
  }
  EXPECT_GE(taken, 10);
}

TEST(GpuBackward, RandomChains) {
  SKIP_WITHOUT_GPU();
  Rng rng(4242);
  for (int i = 0; i < 60; ++i) CheckBackward(RandomChain(rng), 100 + i);
}

}  // namespace
}  // namespace fusejit
