// The backward pass on the CPU: backward plans of the seed chains and of random chains compile for
// sm_80 and sm_90 (all three steps through NVRTC), the signature and the step structure, the data
// gradient's dual convolution restores x's shape, and bad requests get clear errors.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "codegen/emit.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "templates/geometry.cuh"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

Chain Parse(const std::string& spec) { return ParseOrFail(spec); }

CompileOptions Arch(const char* arch) {
  CompileOptions o;
  o.arch = arch;
  o.use_cache = false;
  return o;
}

std::vector<std::string> Names(const std::vector<TensorSpec>& sig) {
  std::vector<std::string> names;
  for (const TensorSpec& t : sig) names.push_back(t.name);
  return names;
}

// A bf16/f16 chain's backward reads its 16-bit grad_y as it is (PlanBackward's grad_y_dtype):
// every kernel taking grad_y takes it in that dtype -- the generic passes, the statistics pass
// recomputing u (convt_backward.cuh), the fused few-input-channel kernel and the sums from saved
// moments -- and the rest of the plan is the f32 one's.
TEST(Backward, GradYIsReadInItsOwnDtype) {
  struct Case {
    std::string spec;
    bool saved_stats;
    int moment_blocks;
  };
  const std::vector<Case> cases = {
      {"x:f32[2,5,6,7,8] | conv3d(out=8,k=3,padding=1) | swish | group_norm(groups=2) | tanh",
       false, 0},
      {"x:f32[2,3,8,9,10] | conv_transpose3d(out=8,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       false, 0},
      {"x:f32[2,3,8,9,10] | conv_transpose3d(out=8,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       true, 0},
      {"x:f32[4,3,8,10,12] | conv3d(out=16,k=3) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       false, 3},
      {"x:f32[2,6,5,6,7] | group_norm(groups=3) | gelu", false, 0},
      {"x:f32[2,6,5,6,7] | conv3d(out=10,k=3,padding=1) | sigmoid", false, 0},
  };
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  for (const Case& c : cases) {
    const Chain chain = Parse(c.spec);
    absl::StatusOr<codegen::Plan> f32 = codegen::PlanBackward(
        chain, target, c.saved_stats, codegen::ULayout::kNCDHW, c.moment_blocks);
    ASSERT_TRUE(f32.ok()) << c.spec << ": " << f32.status();
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(absl::StrCat(c.spec, " grad_y ", DTypeName(dtype)));
      absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(
          chain, target, c.saved_stats, codegen::ULayout::kNCDHW, c.moment_blocks, dtype);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->signature.size(), f32->signature.size());
      for (size_t i = 0; i < plan->signature.size(); ++i) {
        const TensorSpec& t = plan->signature[i];
        EXPECT_EQ(t.dtype, t.name == kGradOutputName ? dtype : f32->signature[i].dtype) << t.name;
      }
      // Every kernel's gy argument is a pointer to the dtype; nothing else changed.
      const std::string source = codegen::EmitSource(chain, *plan).main;
      const std::string type = dtype == DType::kBF16 ? "fj::bf16_t" : "fj::f16_t";
      int readers = 0;
      for (const codegen::KernelLaunch& k : plan->kernels) {
        for (const codegen::KernelArg& a : k.args) {
          if (a.param != kGradOutputName) continue;
          ++readers;
          EXPECT_NE(source.find(absl::StrCat(k.symbol, "(")), std::string::npos);
        }
      }
      EXPECT_GE(readers, 1);
      size_t at = 0;
      int typed = 0;
      while ((at = source.find(absl::StrCat("const ", type, "* gy"), at)) != std::string::npos) {
        ++typed;
        ++at;
      }
      EXPECT_EQ(typed, readers) << source;
      EXPECT_EQ(source.find("const float* gy"), std::string::npos);
      EXPECT_EQ(plan->kernels.size(), f32->kernels.size());
      EXPECT_EQ(plan->workspace_bytes, f32->workspace_bytes);
    }
  }
  // Compiles (NVRTC) for both architectures, through the bf16 chain's CompileBackward.
  for (const char* arch : {"sm_80", "sm_90"}) {
    for (const Case& c : cases) {
      Chain chain = Parse(c.spec);
      chain.dtype = DType::kBF16;
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, Arch(arch));
      ASSERT_TRUE(b.ok()) << c.spec << " " << arch << ": " << b.status();
    }
  }
  absl::StatusOr<codegen::Plan> f64 = codegen::PlanBackward(
      Parse(cases[0].spec), target, false, codegen::ULayout::kNCDHW, 0, DType::kF64);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f64.status().message().find("f32, bf16 or f16"), std::string::npos) << f64.status();
}

TEST(Backward, SignatureNamesEveryGradient) {
  // (5 input channels: with 4 or fewer the fused backward computes grad_x itself, no step 3.)
  const Chain c =
      Parse("x:f32[2,5,6,7,8] | conv3d(out=8,k=3,padding=1) | swish | group_norm(groups=2) | tanh");
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(c, Arch("sm_90"));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<std::string> expected = {
      "x", "0.weight", "0.bias", "2.weight", "2.bias", "grad_y", "grad_x", "grad_0.weight",
      "grad_0.bias", "grad_2.weight", "grad_2.bias", "workspace"};
  EXPECT_EQ(Names((*b)->signature()), expected);
  const std::vector<TensorSpec>& sig = (*b)->signature();
  EXPECT_EQ(sig[5].role, TensorRole::kGradOutput);
  EXPECT_EQ(sig[5].shape, OutputShape(c));
  EXPECT_EQ(sig[6].role, TensorRole::kGradInput);
  EXPECT_EQ(sig[6].shape, c.input);
  EXPECT_EQ(sig[7].role, TensorRole::kGradParam);
  EXPECT_EQ(sig[7].shape, (Shape{8, 5, 3, 3, 3}));
  // u and grad_u (2 x 2*8*6*7*8 floats) and scratch.
  EXPECT_GE((*b)->workspace_bytes(), 2u * 2 * 8 * 6 * 7 * 8 * 4);
  const std::string e = (*b)->Explain();
  for (const char* part :
       {"step 1: recompute u", "step 2: grad_y -> grad_u", "step 3: grad_x",
        "conv_transpose3d(out=5,k=3,padding=1,bias=false)",
        "grad_0.weight f32[8,5,3,3,3] grad_param", "saved by the forward: nothing"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
  }
  EXPECT_EQ((*b)->output_shape(), c.input);
  EXPECT_GT((*b)->kernel_count(), 4u);
}

TEST(Backward, WithoutAProducerOneStepWritesGradX) {
  const Chain c = Parse("x:f32[2,8,5,6,7] | relu | group_norm(groups=4) | gelu | mean(dims=[2,3,4])");
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(c, Arch("sm_80"));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string e = (*b)->Explain();
  EXPECT_NE(e.find("step 1: grad_y -> grad_x"), std::string::npos) << e;
  EXPECT_EQ(e.find("step 2"), std::string::npos) << e;
  // Elementwise only, no parameters: no workspace at all.
  absl::StatusOr<std::shared_ptr<CompiledChain>> plain =
      CompileBackward(Parse("x:f32[2,3,4,5,6] | hardswish | clamp(min=-1,max=2)"), Arch("sm_90"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->workspace_bytes(), 0u);
  EXPECT_EQ(Names((*plain)->signature()), (std::vector<std::string>{"x", "grad_y", "grad_x"}));
}

TEST(Backward, DataGradientIsTheDualConvolutionRestoringXsShape) {
  // conv3d -> conv_transpose3d with the output_padding that gives x's size back, no bias.
  const Chain c = Parse("x:f32[2,3,10,9,8] | conv3d(out=5,k=3,stride=2,padding=1,dilation=[1,2,1]) | relu");
  absl::StatusOr<Chain> d = codegen::DataGradientChain(c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(FormatChain(*d),
            "x:f32[2,5,5,4,4] | conv_transpose3d(out=3,k=3,stride=2,padding=1,output_padding=[1,0,1],"
            "dilation=[1,2,1],bias=false)");
  EXPECT_EQ(OutputShape(*d), c.input);
  // conv_transpose3d -> conv3d.
  const Chain t = Parse(
      "x:f32[2,4,5,6,7] | conv_transpose3d(out=6,k=[2,3,4],stride=2,padding=1,output_padding=1) | tanh");
  absl::StatusOr<Chain> dt = codegen::DataGradientChain(t);
  ASSERT_TRUE(dt.ok()) << dt.status();
  EXPECT_EQ(OutputShape(*dt), t.input);
  EXPECT_EQ(dt->ops[0].kind, OpKind::kConv3d);
  // output_padding >= stride (allowed by dilation): the dual conv3d's output is longer along
  // that dimension (Di + floor(op / s)); grad_x is its leading box, cropped by a fourth step.
  // (5 input channels: with 4 or fewer the fused backward computes grad_x itself, no step 3.)
  const Chain odd = Parse(
      "x:f32[1,5,4,5,6] | conv_transpose3d(out=3,k=3,stride=[1,2,1],dilation=[2,2,3],"
      "output_padding=[1,1,2]) | relu");
  absl::StatusOr<Chain> wide = codegen::DataGradientChain(odd);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->ops[0].kind, OpKind::kConv3d);
  EXPECT_EQ(OutputShape(*wide), (Shape{1, 5, 5, 5, 8}));
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(odd, Arch("sm_90"));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string e = (*b)->Explain();
  EXPECT_NE(e.find("step 4: grad_x = the leading [1,5,4,5,6] box of the data gradient's "
                   "[1,5,5,5,8]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("bytes: the data gradient on its larger grid [1,5,5,5,8]"), std::string::npos)
      << e;
}

TEST(Backward, SeedChainsCompileForSm80AndSm90) {
  for (const Workload& w : SeedWorkloads()) {
    for (const char* arch : {"sm_80", "sm_90"}) {
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(Parse(w.spec), Arch(arch));
      ASSERT_TRUE(b.ok()) << w.id << " " << arch << ": " << b.status();
    }
  }
}

TEST(Backward, RandomChainsCompileForSm80AndSm90) {
  Rng rng(20261124);
  int compiled = 0;
  for (int i = 0; i < 12; ++i) {
    const Chain c = RandomChain(rng);
    for (const char* arch : {"sm_80", "sm_90"}) {
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(c, Arch(arch));
      ASSERT_TRUE(b.ok()) << FormatChain(c) << " " << arch << ": " << b.status();
      ++compiled;
    }
  }
  EXPECT_EQ(compiled, 24);  // every f32 chain has a backward
}

// The group statistics and group_norm's sums: with no op after group_norm, g_h = grad_y needs no
// statistics, so one pass (fj_bwd_moments_sums, then the per-group fix-up) reads u once; with one,
// the sums need the statistics first (fj_bwd_moments, then fj_bwd_sums). Without group_norm
// neither runs.
TEST(Backward, StatisticsPassesByOpsAfterGroupNorm) {
  struct Case {
    const char* spec;
    std::vector<std::string> first;  // the kernels before fj_bwd_grad_u (or fj_bwd_few_in)
  };
  const Case cases[] = {
      {"x:f32[2,3,6,7,8] | conv3d(out=8,k=3) | relu | group_norm(groups=2)",
       {"fj_bwd_moments_sums", "fj_bwd_sums_fix"}},
      {"x:f32[2,3,6,7,8] | conv3d(out=8,k=3) | group_norm(groups=4) | mean(dims=[2,3,4])",
       {"fj_bwd_moments_sums", "fj_bwd_sums_fix"}},
      {"x:f32[2,8,6,7,8] | swish | group_norm(groups=2) | mean(dims=[1,2,3,4])",
       {"fj_bwd_moments_sums", "fj_bwd_sums_fix"}},
      {"x:f32[2,3,6,7,8] | conv3d(out=8,k=3) | group_norm(groups=2) | hardswish",
       {"fj_bwd_moments", "fj_bwd_sums"}},
      {"x:f32[2,3,6,7,8] | conv3d(out=8,k=3) | tanh", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(Parse(c.spec), codegen::PlanTarget{"sm_90", 132, Precision::kFp32});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<std::string> first;
    for (const codegen::KernelLaunch& k : plan->kernels) {
      if (k.symbol == "fj_bwd_grad_u" || k.symbol == "fj_bwd_few_in") break;
      first.push_back(k.symbol);
    }
    EXPECT_EQ(first, c.first) << codegen::ExplainPlan(*plan);
  }
}

// The weight gradient's engine: wgmma (templates/wgrad_wgmma.cuh, an sm_90a build) on sm_90 where
// both channel counts of its GEMM are 32 or more; otherwise mma.sync, staging S's halo once per
// tile of T's grid where T has 8 to 32 channels (wgrad_halo) and gathering per tap where T has
// more (wgrad_mma_partial); FFMA below 8 and before sm_80. Its grid covers every tap x 64-row tile
// x column tile x chunk, the chunks cover the reduction, and the GEMM's shared memory fits two CTAs
// per SM.
// The wgmma weight gradient: three fp16 products (fp32-accurate) or the highs' product alone
// (TF32); the backward of a bf16 or f16 chain runs its gradient convolutions in the TF32 class, an
// f32 chain's at the caller's precision (runtime/dtype_adapter.h).
TEST(Backward, GradientConvolutionsPrecisionByDTypeAndCaller) {
  const Chain w3 = Parse(
      "x:f32[2,64,6,6,6] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)");
  for (Precision p : {Precision::kFp32, Precision::kTf32}) {
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(w3, codegen::PlanTarget{"sm_90", 132, p});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::string products;
    for (const codegen::TuneStruct& t : plan->tunes) {
      for (const codegen::TuneStruct::Field& f : t.fields) {
        if (t.name == "WgTune" && f.name == "kProducts") products = f.value;
      }
    }
    EXPECT_EQ(products, p == Precision::kTf32 ? "1" : "3") << codegen::ExplainPlan(*plan);
  }
  CompileOptions options;
  options.arch = "sm_90";
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    Chain chain = w3;
    chain.dtype = dtype;
    SCOPED_TRACE(FormatChain(chain));
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, options);
    ASSERT_TRUE(b.ok()) << b.status();
    const std::string e = (*b)->Explain();
    const bool tf32_class = dtype != DType::kF32;
    EXPECT_EQ(e.find("gradients' convolutions (weight and data gradient): TF32 class") !=
                  std::string::npos,
              tf32_class);
    EXPECT_EQ(e.find("kProducts=1") != std::string::npos, tf32_class) << e;
    EXPECT_EQ(e.find("kProducts=3") != std::string::npos, !tf32_class) << e;
  }
}

// Step 2 writes max|grad_u| per block with grad_u (codegen::kProducerGradMaximaName); step 3's
// tensor-core plan, which scales grad_u by its largest magnitude, reduces those instead of a pass
// over grad_u (codegen::ReadInputMaxima), in every precision that scales (fp32-accurate, TF32 and
// the bf16/f16 chains' TF32 class); a plan with no such pass leaves them unread. Plans that cannot
// read them are refused by ReadInputMaxima.
TEST(Backward, DataGradientReadsGradUMaxima) {
  CompileOptions options;
  options.arch = "sm_90";
  const std::string w3 =
      "[2,64,8,8,8] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)";
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    for (Precision p : {Precision::kFp32, Precision::kTf32}) {
      const Chain chain = Parse(absl::StrCat("x:", dtype, w3));
      SCOPED_TRACE(FormatChain(chain));
      options.precision = p;
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, options);
      ASSERT_TRUE(b.ok()) << b.status();
      const std::string e = (*b)->Explain();
      EXPECT_NE(e.find("gmax=grad_u_maxima"), std::string::npos) << e;
      // Step 3 (igemm) reads them; step 1's igemm (the recompute of u) scans its x.
      const size_t step3 = e.find("grad_x = the convolution's data gradient");
      ASSERT_NE(step3, std::string::npos) << e;
      EXPECT_NE(e.find("xmax=x_maxima", step3), std::string::npos) << e;
      EXPECT_EQ(e.find("xmax=null", step3), std::string::npos) << e;
      EXPECT_NE(e.find("bytes: max|grad_u| per block ("), std::string::npos) << e;
    }
  }
  // The forward's igemm plan scans x; a plan without the slot is refused.
  const Chain fwd = Parse("x:f32" + w3);
  absl::StatusOr<codegen::Plan> igemm = codegen::MakePlan(
      fwd, codegen::PlanTarget{"sm_90", 132, Precision::kFp32}, "igemm-store-normalize");
  ASSERT_TRUE(igemm.ok()) << igemm.status();
  EXPECT_TRUE(codegen::CanReadInputMaxima(*igemm));
  EXPECT_NE(codegen::ExplainPlan(*igemm).find("xmax=null"), std::string::npos);
  codegen::Plan read = *igemm;
  ASSERT_TRUE(codegen::ReadInputMaxima(fwd, &read, 96).ok());
  EXPECT_NE(codegen::ExplainPlan(read).find("xmax=x_maxima"), std::string::npos);
  EXPECT_NE(codegen::ExplainPlan(read).find("kXMaxima=96"), std::string::npos);
  ASSERT_GE(read.signature.size(), 2u);
  EXPECT_EQ(read.signature.back().name, "workspace");
  EXPECT_EQ(read.signature[read.signature.size() - 2].name, codegen::kInputMaximaName);
  EXPECT_EQ(read.signature[read.signature.size() - 2].shape, (Shape{96}));
  EXPECT_EQ(codegen::ReadInputMaxima(fwd, &read, 96).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<codegen::Plan> generic = codegen::MakePlan(
      fwd, codegen::PlanTarget{"sm_90", 132, Precision::kFp32}, "store-normalize");
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_FALSE(codegen::CanReadInputMaxima(*generic));
  EXPECT_EQ(codegen::ReadInputMaxima(fwd, &*generic, 96).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Backward, WeightGradientEngineByArchitectureAndChannels) {
  struct Case {
    const char* spec;
    const char* arch;
    const char* body;  // the weight-gradient kernel's
  };
  const Case cases[] = {
      {"x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
       "group_norm(groups=8)",
       "sm_90", "fj::wgrad_taps_kernel<Cfg, WgTune>"},
      {"x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
       "group_norm(groups=8)",
       "sm_80", "fj::wgrad_mma_partial_kernel<Cfg, WgTune>"},
      // Stride 1: the kw taps share staged rows (2 per CTA for a kernel 4 wide).
      {"x:f32[2,40,6,7,9] | conv3d(out=72,k=[3,2,4],padding=[1,0,2],dilation=[1,1,2]) | relu",
       "sm_90", "fj::wgrad_taps_kernel<Cfg, WgTune>"},
      // Stride 1, but two 64-channel windows of 64 + 2*64 rows leave room for fewer than 3 stages:
      // one tap per CTA.
      {"x:f32[1,72,2,2,260] | conv3d(out=40,k=[1,1,5],dilation=[1,1,64])", "sm_90",
       "fj::wgrad_wgmma_kernel<Cfg, WgTune>"},
      {"x:f32[2,33,7,9,11] | conv3d(out=97,k=[3,2,1],stride=[1,2,1],dilation=2) | tanh", "sm_90",
       "fj::wgrad_wgmma_kernel<Cfg, WgTune>"},
      {"x:f32[2,48,6,7,8] | conv_transpose3d(out=24,k=3,stride=2,padding=1) | tanh", "sm_90",
       "fj::wgrad_mma_partial_kernel<Cfg, WgTune>"},
      {"x:f32[2,5,16,16,16] | conv3d(out=16,k=3) | relu", "sm_90",
       "fj::wgrad_halo_kernel<Cfg, WgTune>"},
      {"x:f32[2,9,9,10,70] | conv_transpose3d(out=7,k=[2,3,4],stride=[1,2,3],dilation=[1,2,1]) | "
       "relu",
       "sm_80", "fj::wgrad_halo_kernel<Cfg, WgTune>"},
      {"x:f32[2,6,5,8,8] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish", "sm_90",
       "fj::wgrad_partial_kernel<Cfg, WgTune>"},
      // 12 T channels, but the halo of 7-tap dilated rows does not fit: gathered per tap.
      {"x:f32[1,12,9,9,9] | conv_transpose3d(out=64,k=7,stride=3,dilation=3)", "sm_90",
       "fj::wgrad_mma_partial_kernel<Cfg, WgTune>"},
      {"x:f32[2,40,6,7,8] | conv3d(out=24,k=3) | relu", "sm_80",
       "fj::wgrad_halo_kernel<Cfg, WgTune>"},
      {"x:f32[2,5,16,16,16] | conv3d(out=16,k=3) | relu", "sm_75",
       "fj::wgrad_partial_kernel<Cfg, WgTune>"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " " + c.arch);
    const Chain chain = Parse(c.spec);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(chain, codegen::PlanTarget{c.arch, 132, Precision::kFp32});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const codegen::KernelLaunch* gemm = nullptr;
    for (const codegen::KernelLaunch& k : plan->kernels) {
      if (k.body == c.body) gemm = &k;
    }
    ASSERT_NE(gemm, nullptr) << codegen::ExplainPlan(*plan);
    const bool wgmma = std::string(c.body).find("wgmma") != std::string::npos ||
                       std::string(c.body).find("taps") != std::string::npos;
    EXPECT_EQ(plan->arch_override, wgmma ? "sm_90a" : "");
    // fj_bwd_grad_u writes per-block maxima of |grad_u| (gmax) into the step's tensor
    // grad_u_maxima (for step 3, and) for the wgmma engine, whose scale of grad_u comes from them:
    // fj_wgrad_absmax reads them in place of grad_u. No other engine reads them.
    bool gmax_written = false, gmax_read = false, absmax_reads_gu = false;
    for (const codegen::KernelLaunch& k : plan->kernels) {
      for (const codegen::KernelArg& arg : k.args) {
        if (arg.name == "gmax" && arg.kind == codegen::KernelArg::Kind::kTensor &&
            arg.param == codegen::kProducerGradMaximaName) {
          (k.symbol == "fj_bwd_grad_u" ? gmax_written : gmax_read) = true;
        }
        absmax_reads_gu |= k.symbol == "fj_wgrad_absmax" && arg.name == "gu" && !arg.param.empty();
      }
    }
    EXPECT_TRUE(gmax_written);
    EXPECT_EQ(gmax_read, wgmma);
    EXPECT_FALSE(absmax_reads_gu);
    int64_t chunk = 0, splits = 0, bn = 0, bm = 0;
    for (const codegen::TuneStruct& t : plan->tunes) {
      if (t.name != "WgTune") continue;
      for (const codegen::TuneStruct::Field& f : t.fields) {
        if (f.name == "kChunk") chunk = std::stoll(f.value);
        if (f.name == "kSplits") splits = std::stoll(f.value);
        if (f.name == "kBN") bn = std::stoll(f.value);
        if (f.name == "kBM") bm = std::stoll(f.value);
      }
    }
    const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
    const bool conv = info.producer->kind == OpKind::kConv3d;
    const Shape& u = info.producer_shape;
    const int64_t t_channels = conv ? u[1] : chain.input[1];
    const int64_t s_channels = conv ? chain.input[1] : u[1];
    const int64_t t_points =
        conv ? u[2] * u[3] * u[4] : chain.input[2] * chain.input[3] * chain.input[4];
    const ConvAttrs& a = info.producer->conv;
    const int64_t taps = a.kernel[0] * a.kernel[1] * a.kernel[2];
    if (std::string(c.body) == "fj::wgrad_halo_kernel<Cfg, WgTune>") {
      // Tiles of T's grid cover it; the two stages fit two blocks per SM.
      int64_t rh = 0, seg = 0;
      for (const codegen::TuneStruct& t : plan->tunes) {
        for (const codegen::TuneStruct::Field& f : t.fields) {
          if (t.name == "WgTune" && f.name == "kRH") rh = std::stoll(f.value);
          if (t.name == "WgTune" && f.name == "kSeg") seg = std::stoll(f.value);
        }
      }
      const Dims3 tg =
          conv ? Dims3{u[2], u[3], u[4]} : Dims3{chain.input[2], chain.input[3], chain.input[4]};
      const fj::geom::WgradHalo h = fj::geom::WgradHaloOf(
          chain.input[0], tg[0], tg[1], tg[2], a.kernel[0], a.kernel[1], a.kernel[2], a.stride[1],
          a.stride[2], a.dilation[1], a.dilation[2], s_channels, rh, seg, bm, bn);
      EXPECT_EQ(bm, t_channels <= 16 ? 16 : 32);
      EXPECT_LE(seg, 64);
      EXPECT_LE(rh * seg, h.bk);
      EXPECT_GE(h.hb * rh, tg[1]);
      EXPECT_GE(h.wb * seg, tg[2]);
      EXPECT_EQ(h.steps, chain.input[0] * tg[0] * h.hb * h.wb);
      EXPECT_GE(chunk * splits, h.steps);
      EXPECT_LT(chunk * (splits - 1), h.steps);
      EXPECT_EQ(gemm->grid[0], (s_channels * taps + bn - 1) / bn);
      EXPECT_EQ(gemm->grid[1], (t_channels + bm - 1) / bm);
      EXPECT_EQ(gemm->grid[2], splits);
      EXPECT_EQ(gemm->shared_bytes, h.smem);
      EXPECT_LE(2 * gemm->shared_bytes, 227u * 1024);
      EXPECT_EQ(gemm->min_blocks_per_sm, 2u);
    }
    if (std::string(c.body) == "fj::wgrad_mma_partial_kernel<Cfg, WgTune>") {
      // The smallest of 16, 32, 64 rows holding the T channels; columns in multiples of 64.
      const int64_t cols = s_channels * taps;
      EXPECT_EQ(bm, t_channels <= 16 ? 16 : t_channels <= 32 ? 32 : 64);
      EXPECT_EQ(bn % 64, 0);
      EXPECT_LE(bn, bm == 64 ? 128 : 256);
      EXPECT_EQ(gemm->grid[0], (cols + bn - 1) / bn);
      EXPECT_EQ(gemm->grid[1], (t_channels + bm - 1) / bm);
      EXPECT_EQ(gemm->block[0], 256u);
      EXPECT_GE(chunk * splits, chain.input[0] * t_points);
      EXPECT_LT(chunk * (splits - 1), chain.input[0] * t_points);
      EXPECT_EQ(gemm->grid[2], splits);
    }
    if (!wgmma) continue;
    EXPECT_EQ(gemm->grid[2], splits);
    EXPECT_EQ(chunk % 64, 0);
    EXPECT_EQ(gemm->grid[1], (t_channels + 63) / 64);
    EXPECT_EQ(gemm->grid[2], splits);
    if (std::string(c.body) == "fj::wgrad_wgmma_kernel<Cfg, WgTune>") {
      // explain says why the taps do not share their rows.
      EXPECT_NE(gemm->purpose.find(a.stride == Dims3{1, 1, 1} ? "fewer than 3 stages"
                                                              : "tap reuse needs stride 1"),
                std::string::npos)
          << gemm->purpose;
      EXPECT_GE(chunk * splits, chain.input[0] * t_points);
      EXPECT_LT(chunk * (splits - 1), chain.input[0] * t_points);
      EXPECT_EQ(gemm->grid[0], taps * ((s_channels + bn - 1) / bn));
      EXPECT_EQ(gemm->block[0], 128u);
      EXPECT_LE(2 * gemm->shared_bytes, 227u * 1024);
      continue;
    }
    // Tap reuse: kTaps kw taps per CTA (one warpgroup each), the chunks cover E's k-steps.
    int64_t per_cta = 0, stages = 0;
    for (const codegen::TuneStruct& t : plan->tunes) {
      for (const codegen::TuneStruct::Field& f : t.fields) {
        if (t.name == "WgTune" && f.name == "kTaps") per_cta = std::stoll(f.value);
        if (t.name == "WgTune" && f.name == "kStages") stages = std::stoll(f.value);
      }
    }
    EXPECT_EQ(per_cta, a.kernel[2] == 4 ? 2 : 3);
    const Dims3 tg =
        conv ? Dims3{u[2], u[3], u[4]} : Dims3{chain.input[2], chain.input[3], chain.input[4]};
    const fj::geom::WgradTaps e = fj::geom::WgradTapsOf(
        chain.input[0], t_channels, s_channels, tg[0], tg[1], tg[2], a.kernel[0], a.kernel[1],
        a.kernel[2], a.dilation[0], a.dilation[1], a.dilation[2], bn, stages, 3, per_cta);
    EXPECT_EQ(e.ew, tg[2] + (a.kernel[2] - 1) * a.dilation[2]);
    EXPECT_GE(e.steps_per_plane * 64, tg[1] * e.ew);
    EXPECT_GE(chunk * splits, e.steps * 64);
    EXPECT_LT(chunk * (splits - 1), e.steps * 64);
    EXPECT_EQ(gemm->grid[0], a.kernel[0] * a.kernel[1] * e.groups * ((s_channels + bn - 1) / bn));
    EXPECT_GE(e.groups * per_cta, a.kernel[2]);
    EXPECT_LT((e.groups - 1) * per_cta, a.kernel[2]);
    EXPECT_EQ(gemm->block[0], 128u * per_cta);
    EXPECT_EQ(gemm->shared_bytes, e.smem);
    EXPECT_LE(gemm->shared_bytes, 227u * 1024);
    EXPECT_EQ(gemm->min_blocks_per_sm, 1u);
  }
}

// The training pair: the forward saving u (the producer's output) and the backward reading it.
TEST(Backward, TrainingForwardSavesTheProducerOutput) {
  const Chain w3 = Parse(
      "x:f32[2,64,8,8,8] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)");
  EXPECT_TRUE(TrainingForwardSaves(w3, Arch("sm_90")));
  EXPECT_FALSE(TrainingForwardSaves(w3));  // no GPU here: no target to decide for
  struct NoSave {
    const char* spec;
    const char* why;
  };
  for (const NoSave& n :
       {NoSave{"x:f32[2,6,5,6,7] | group_norm(groups=3) | swish", "no convolution"},
        NoSave{"x:f32[2,3,8,8,8] | conv3d(out=4,k=3)", "the last op"},
        // bf16/f16 save only from their own plan writing u; direct-few-out's cannot.
        NoSave{"x:bf16[2,3,8,8,8] | conv3d(out=4,k=3) | relu",
               "chains save u only from their own plan writing it"},
        // tc-conv's moments-only form (nothing full-size stored) does not offer u.
        NoSave{"x:bf16[2,48,8,8,8] | conv3d(out=96,k=3,padding=1) | swish | mean(dims=[2,3,4])",
               "the tc-conv plan cannot"},
        // Its fused forward (conv-moments-mean: nothing full-size stored, cannot write u)
        // costs less than the ops after the convolution reading u. (The transposed k2 s2 chain
        // this case had before plans tc-conv since the generic costs count a transposed
        // convolution's phases: it saves u now.)
        NoSave{"x:f32[8,2,16,16,16] | conv3d(out=4,k=1) | gelu | group_norm(groups=2) | "
               "mean(dims=[1,2,3,4])",
               "recomputing u in the backward is cheaper"}}) {
    const char* spec = n.spec;
    const Chain c = Parse(spec);
    EXPECT_FALSE(TrainingForwardSaves(c, Arch("sm_90"))) << spec;
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(c, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    for (const TensorSpec& t : (*f)->signature()) EXPECT_NE(t.role, TensorRole::kSaved) << spec;
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(c, Arch("sm_90"));
    ASSERT_FALSE(b.ok()) << spec;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("use CompileBackward"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find(n.why), std::string::npos) << b.status();
  }
  for (const char* arch : {"sm_80", "sm_90"}) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(w3, Arch(arch));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(
        Names((*f)->signature()),
        (std::vector<std::string>{"x", "0.weight", "2.weight", "2.bias", "y", "u", "workspace"}));
    const TensorSpec& u = (*f)->signature()[5];
    EXPECT_EQ(u.role, TensorRole::kSaved);
    EXPECT_EQ(u.shape, (Shape{2, 128, 10, 10, 10}));
    EXPECT_NE((*f)->Explain().find("saves for the backward: u"), std::string::npos);
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(w3, Arch(arch));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(
        Names((*b)->signature()),
        (std::vector<std::string>{"x", "0.weight", "2.weight", "2.bias", "grad_y", "u", "grad_x",
                                  "grad_0.weight", "grad_2.weight", "grad_2.bias", "workspace"}));
    EXPECT_EQ((*b)->signature()[5].role, TensorRole::kSaved);
    EXPECT_EQ((*b)->strategy(), "backward-from-saved");
    const std::string e = (*b)->Explain();
    EXPECT_EQ(e.find("recompute u"), std::string::npos) << e;
    EXPECT_NE(e.find("saved by the forward: u"), std::string::npos) << e;
    // No workspace region for u: the recomputing backward's minus u's bytes, at most.
    absl::StatusOr<std::shared_ptr<CompiledChain>> plain = CompileBackward(w3, Arch(arch));
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_LE((*b)->workspace_bytes() + u.bytes(), (*plain)->workspace_bytes());
  }
  // W3's plan on sm_90 (igemm-store-normalize: its wgmma epilogue) writes u itself, beside the
  // pre-norm values. (The small w3 above runs tc-conv, whose GEMM writes u too.)
  {
    const Chain w3_seed = Parse(
        "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
        "group_norm(groups=8)");
    absl::StatusOr<std::shared_ptr<CompiledChain>> f =
        CompileTrainingForward(w3_seed, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->strategy(), "igemm-store-normalize");
    EXPECT_NE((*f)->Explain().find("u=u"), std::string::npos) << (*f)->Explain();
    absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(w3_seed, Arch("sm_90"));
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ((*plain)->Explain().find("u=u"), std::string::npos) << (*plain)->Explain();
  }
  // W1's plan (convt-recompute-normalize: its write pass) writes u itself: writing 1 GB costs
  // less than the backward's recompute of the convolution.
  const Chain w1 = Parse(
      "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4,eps=1e-5) | hardswish");
  EXPECT_TRUE(TrainingForwardSaves(w1, Arch("sm_90")));
  {
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(w1, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->strategy(), "convt-recompute-normalize");
    EXPECT_NE((*f)->Explain().find("u=u"), std::string::npos);
    // Its scale/shift kernel saves the group statistics too: the backward reads them instead of
    // a pass over u (no fj_bwd_moments).
    EXPECT_NE((*f)->Explain().find("stats=stats"), std::string::npos) << (*f)->Explain();
    EXPECT_NE((*f)->Explain().find("and the group statistics (4096 bytes"), std::string::npos)
        << (*f)->Explain();
    EXPECT_EQ(Names((*f)->signature()),
              (std::vector<std::string>{"x", "0.weight", "0.bias", "2.weight", "2.bias", "y", "u",
                                        "stats", "workspace"}));
    EXPECT_EQ((*f)->signature()[7].role, TensorRole::kSaved);
    EXPECT_EQ((*f)->signature()[7].shape, (Shape{128, 4, 2}));
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(w1, Arch("sm_90"));
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<std::string> names = Names((*b)->signature());
    ASSERT_GE(names.size(), 8u);
    EXPECT_EQ(std::vector<std::string>(names.begin() + 5, names.begin() + 8),
              (std::vector<std::string>{"grad_y", "u", "stats"}));
    const std::string e = (*b)->Explain();
    EXPECT_NE(e.find("and the group statistics"), std::string::npos) << e;
    EXPECT_EQ(e.find("fj_bwd_moments"), std::string::npos) << e;
    // grad_y's sums recompute u (a cheap convolution) rather than read it
    // (templates/convt_backward.cuh).
    EXPECT_NE(e.find("fj_convt_bwd_sums"), std::string::npos) << e;
    // The recomputing backward still recomputes them.
    absl::StatusOr<std::shared_ptr<CompiledChain>> r = CompileBackward(w1, Arch("sm_90"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE((*r)->Explain().find("fj_bwd_moments"), std::string::npos);
  }
  // W2's and W4's plan (mma-moments-mean) writes u itself: one plan, its kernel's null u
  // argument bound (codegen::SaveProducerOutput), u before the workspace. The plain forward
  // leaves it null. Its per-block channel moments go to the saved "moments" instead of the
  // workspace, and the backward takes grad_y's sums from them (no pass over u).
  const Chain w4 = Parse(
      "x:f32[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])");
  EXPECT_TRUE(TrainingForwardSaves(w4, Arch("sm_90")));
  for (const char* arch : {"sm_80", "sm_90"}) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(w4, Arch(arch));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->strategy(), "mma-moments-mean");
    EXPECT_EQ(Names((*f)->signature()),
              (std::vector<std::string>{"x", "0.weight", "0.bias", "1.weight", "1.bias", "y", "u",
                                        "moments", "workspace"}));
    EXPECT_EQ((*f)->signature()[6].role, TensorRole::kSaved);
    EXPECT_EQ((*f)->signature()[6].shape, (Shape{3, 24, 8, 10, 10}));
    const TensorSpec moments = (*f)->signature()[7];
    EXPECT_EQ(moments.role, TensorRole::kSaved);
    ASSERT_EQ(moments.shape.size(), 4u);
    EXPECT_EQ(moments.shape[0], 3);
    EXPECT_GE(moments.shape[1], 1);  // the plan's blocks per sample
    EXPECT_EQ(moments.shape[2], 24);
    EXPECT_EQ(moments.shape[3], 3);  // count, mean, M2
    const std::string e = (*f)->Explain();
    EXPECT_NE(e.find("saves for the backward: u"), std::string::npos) << e;
    EXPECT_NE(e.find("written by this plan"), std::string::npos) << e;
    EXPECT_NE(e.find("u=u"), std::string::npos) << e;
    EXPECT_NE(e.find("partials=moments"), std::string::npos) << e;
    EXPECT_EQ(e.find("partials=ws"), std::string::npos) << e;
    absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(w4, Arch(arch));
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_NE((*plain)->Explain().find("u=null"), std::string::npos);
    EXPECT_NE((*plain)->Explain().find("partials=ws"), std::string::npos);
    for (const TensorSpec& t : (*plain)->signature()) EXPECT_NE(t.role, TensorRole::kSaved);
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(w4, Arch(arch));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->strategy(), "backward-from-saved");
    const std::vector<std::string> names = Names((*b)->signature());
    ASSERT_GE(names.size(), 8u);
    EXPECT_EQ(std::vector<std::string>(names.begin() + 5, names.begin() + 8),
              (std::vector<std::string>{"grad_y", "u", "moments"}));
    EXPECT_EQ((*b)->signature()[7].shape, moments.shape);  // both sides agree
    const std::string eb = (*b)->Explain();
    EXPECT_NE(eb.find("fj_bwd_sums_from_moments"), std::string::npos) << eb;
    EXPECT_EQ(eb.find("fj_bwd_moments_sums"), std::string::npos) << eb;
    EXPECT_NE(eb.find("and the channel moments"), std::string::npos) << eb;
    absl::StatusOr<std::shared_ptr<CompiledChain>> r = CompileBackward(w4, Arch(arch));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE((*r)->Explain().find("fj_bwd_moments_sums"), std::string::npos);
  }
  // W2's shape of chain (an op before group_norm, mean over [2, 3, 4]) saves them too.
  {
    const Chain w2 = Parse(
        "x:f32[4,3,10,16,16] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
        "mean(dims=[2,3,4])");
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(w2, Arch("sm_90"));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NE((*b)->Explain().find("fj_bwd_sums_from_moments"), std::string::npos);
  }
  // Only chains ending in group_norm | mean read saved moments: an op between them (grad_y is
  // then not one value per slice), or no mean, is refused by name.
  EXPECT_TRUE(codegen::BackwardReadsSavedMoments(w4));
  for (const char* spec :
       {"x:f32[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | relu | "
        "mean(dims=[1,2,3,4])",
        "x:f32[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8)",
        "x:f32[3,24,10,12,12] | group_norm(groups=8) | mean(dims=[2,3,4])"}) {
    const Chain c = Parse(spec);
    EXPECT_FALSE(codegen::BackwardReadsSavedMoments(c)) << spec;
    absl::StatusOr<codegen::Plan> refused =
        codegen::PlanBackward(c, codegen::PlanTarget{"sm_90"}, false, codegen::ULayout::kNCDHW,
                              /*saved_moment_blocks=*/2);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(refused.status().message().find("group_norm | mean"), std::string::npos)
        << refused.status();
  }
}

// bf16 and f16 training forwards are Compile's native plan writing u in f32 (and the group
// statistics or channel moments where the plan offers them); their backward from saved is the f32
// one between casts, binding the saved tensors as they are (no cast).
TEST(Backward, Bf16AndF16TrainingForwardsSaveUFromTheirOwnPlan) {
  struct Case {
    const char* spec;  // after the dtype
    std::vector<std::string> saved;
  };
  const Case cases[] = {
      {"[2,3,6,7,9] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       {"u", "stats"}},
      {"[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])",
       {"u", "moments"}},
      {"[2,64,8,8,8] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8)",
       {"u"}},
      // tc-conv plans storing pre-norm values (a group_norm normalized by its own pass) or y (a
      // transposed convolution split into output phases).
      {"[2,16,8,8,8] | conv3d(out=32,k=5,padding=2) | relu | group_norm(groups=4)", {"u"}},
      {"[2,20,10,10,10] | conv_transpose3d(out=36,k=3,stride=2,padding=1,output_padding=1) | tanh",
       {"u"}},
      // Its f32 chain's plans tie (tc-conv and store-normalize): the training decision follows
      // the plan Compile chose (it said "runs through its f32 plan" and saved nothing).
      {"[2,16,12,12,12] | conv3d(out=32,k=3,padding=1) | gelu | group_norm(groups=4)", {"u"}},
  };
  for (const char* dtype : {"bf16", "f16"}) {
    for (const Case& k : cases) {
      const Chain c = Parse(absl::StrCat("x:", dtype, k.spec));
      SCOPED_TRACE(FormatChain(c));
      EXPECT_TRUE(TrainingForwardSaves(c, Arch("sm_90")));
      absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(c, Arch("sm_90"));
      ASSERT_TRUE(plain.ok()) << plain.status();
      absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(c, Arch("sm_90"));
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ((*f)->strategy(), (*plain)->strategy());  // the same plan, writing u too
      // u is summed as accurately as the f32 chain's (PlanTarget::keeps_u): the igemm plan's
      // 16-bit products flush their short-run sums, where the plain forward, rounding y to 8 or
      // 11 bits, does not.
      if ((*plain)->strategy().rfind("igemm", 0) == 0) {
        EXPECT_NE((*plain)->Explain().find("not flushed"), std::string::npos);
        EXPECT_NE((*f)->Explain().find("flushed every 2 k-steps (u is kept for the backward)"),
                  std::string::npos)
            << (*f)->Explain();
      }
      if ((*plain)->strategy() == "tc-conv") {  // the same for tc-conv's 16-bit sums
        EXPECT_EQ((*plain)->Explain().find("in short runs"), std::string::npos);
        EXPECT_NE((*f)->Explain().find("in short runs (u is kept for the backward)"),
                  std::string::npos)
            << (*f)->Explain();
      }
      std::vector<std::string> saved;
      for (const TensorSpec& t : (*f)->signature()) {
        if (t.role == TensorRole::kSaved) {
          saved.push_back(t.name);
          EXPECT_EQ(t.dtype, DType::kF32) << t.name;
        } else if (t.role != TensorRole::kWorkspace) {
          EXPECT_EQ(t.dtype, c.dtype) << t.name;
        }
      }
      EXPECT_EQ(saved, k.saved);
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(c, Arch("sm_90"));
      ASSERT_TRUE(b.ok()) << b.status();
      std::vector<std::string> read;
      for (const TensorSpec& t : (*b)->signature()) {
        if (t.role == TensorRole::kSaved) {
          read.push_back(t.name);
          // The shapes the forward wrote.
          for (const TensorSpec& w : (*f)->signature()) {
            if (w.name == t.name) EXPECT_EQ(w.shape, t.shape) << t.name;
          }
          EXPECT_EQ(t.dtype, DType::kF32) << t.name;
        } else if (t.role != TensorRole::kWorkspace) {
          EXPECT_EQ(t.dtype, c.dtype) << t.name;
        }
      }
      EXPECT_EQ(read, k.saved);
      const std::string e = (*b)->Explain();
      EXPECT_EQ(e.find("recompute u, the producer's output"), std::string::npos) << e;
      EXPECT_NE(e.find("saved by the forward: u"), std::string::npos) << e;
      EXPECT_NE(e.find("saved tensors bound as the training forward wrote them"), std::string::npos)
          << e;
      absl::StatusOr<std::shared_ptr<CompiledChain>> r = CompileBackward(c, Arch("sm_90"));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_NE((*r)->Explain().find("recompute u, the producer's output"), std::string::npos);
    }
  }
}

// The training pair of random chains in every dtype with a backward (f32, bf16, f16), narrow and
// wide (up to 64 channels: the tensor-core plans): the training forward compiles, saves exactly
// when TrainingForwardSaves says so, and then the backward reading its saved tensors compiles
// with the same shapes; a bf16/f16 chain saves from the plan Compile runs it with.
TEST(Backward, RandomTrainingPairsCompile) {
  Rng rng(20261129);
  RandomChainOptions wide;
  wide.max_channels = 64;
  wide.max_spatial = 12;
  int saved = 0;
  for (int i = 0; i < 30; ++i) {
    Chain c = RandomChain(rng, i % 2 ? wide : RandomChainOptions{});
    c.dtype = i % 3 == 0 ? DType::kF32 : i % 3 == 1 ? DType::kBF16 : DType::kF16;
    SCOPED_TRACE(FormatChain(c));
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = CompileTrainingForward(c, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<TensorSpec> written;
    for (const TensorSpec& t : (*f)->signature()) {
      if (t.role == TensorRole::kSaved) written.push_back(t);
    }
    EXPECT_EQ(!written.empty(), TrainingForwardSaves(c, Arch("sm_90")));
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackwardFromSaved(c, Arch("sm_90"));
    if (written.empty()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
      continue;
    }
    ++saved;
    ASSERT_TRUE(b.ok()) << b.status();
    std::vector<TensorSpec> read;
    for (const TensorSpec& t : (*b)->signature()) {
      if (t.role == TensorRole::kSaved) read.push_back(t);
    }
    ASSERT_EQ(read.size(), written.size());
    for (size_t k = 0; k < read.size(); ++k) {
      EXPECT_EQ(read[k].name, written[k].name);
      EXPECT_EQ(read[k].shape, written[k].shape) << read[k].name;
    }
    if (c.dtype != DType::kF32) {
      absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(c, Arch("sm_90"));
      ASSERT_TRUE(plain.ok()) << plain.status();
      EXPECT_EQ((*f)->strategy(), (*plain)->strategy());
    }
  }
  EXPECT_GE(saved, 6);
}

TEST(Backward, ClearErrors) {
  const Chain c = Parse("x:f32[2,3,6,6,6] | conv3d(out=4,k=3) | relu");
  CompileOptions o = Arch("sm_90");
  o.strategy = "tc-conv";
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(c, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("leave them empty"), std::string::npos) << b.status();
  Chain f64 = c;
  f64.dtype = DType::kF64;
  b = CompileBackward(f64, Arch("sm_90"));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("f64"), std::string::npos) << b.status();
  // The forward's fixed-field Run is refused, naming the named form.
  absl::StatusOr<std::shared_ptr<CompiledChain>> ok = CompileBackward(c, Arch("sm_90"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::Status s = (*ok)->Run(Bindings{}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("RunNamed"), std::string::npos) << s;
  // A missing gradient buffer is named (checked before anything is launched).
  s = (*ok)->RunNamed({{"x", 256}, {"0.weight", 256}, {"0.bias", 256}, {"grad_y", 256},
                       {"grad_x", 256}, {"grad_0.weight", 256}, {"workspace", 256}},
                      nullptr);
  EXPECT_NE(s.message().find("grad_0.bias (grad_param) f32[4] is missing"), std::string::npos) << s;
}

}  // namespace
}  // namespace fusejit
