// bf16 and f16 chains (runtime/dtype_adapter.h): host conversions, signatures, plans compiled for
// sm_80 and sm_90 forward and backward, f64 refused by name. The GPU checks are in
// tests/gpu/gpu_dtype_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "fusejit/workloads.h"
#include "runtime/dtype_adapter.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

uint16_t Encode16(float v, DType dtype) {
  uint16_t h;
  EncodeDType(&v, 1, dtype, &h);
  return h;
}
float Decode16(uint16_t h, DType dtype) {
  float v;
  DecodeDType(&h, 1, dtype, &v);
  return v;
}

TEST(DTypeHost, RoundsToNearestEven) {
  EXPECT_EQ(RoundToDType(1.f + 0x1p-8f, DType::kBF16), 1.f);             // tie: to even
  EXPECT_EQ(RoundToDType(1.f + 3 * 0x1p-8f, DType::kBF16), 1.f + 0x1p-6f);  // tie: to even (up)
  EXPECT_EQ(RoundToDType(1.f + 0x1p-11f, DType::kF16), 1.f);
  EXPECT_EQ(RoundToDType(1.f + 3 * 0x1p-11f, DType::kF16), 1.f + 0x1p-9f);
  EXPECT_EQ(RoundToDType(65504.f, DType::kF16), 65504.f);  // the largest half
  EXPECT_TRUE(std::isinf(RoundToDType(65520.f, DType::kF16)));
  EXPECT_EQ(RoundToDType(65519.f, DType::kF16), 65504.f);
  EXPECT_EQ(RoundToDType(0x1p-24f, DType::kF16), 0x1p-24f);  // the smallest subnormal
  EXPECT_EQ(RoundToDType(0x1p-25f, DType::kF16), 0.f);      // tie: to even (zero)
  EXPECT_EQ(RoundToDType(0x1.8p-25f, DType::kF16), 0x1p-24f);
  EXPECT_EQ(RoundToDType(-2.5f, DType::kF16), -2.5f);
  EXPECT_TRUE(std::isnan(RoundToDType(std::nanf(""), DType::kBF16)));
  EXPECT_TRUE(std::isnan(RoundToDType(std::nanf(""), DType::kF16)));
  EXPECT_EQ(RoundToDType(0.1f, DType::kF32), 0.1f);
}

// Every 16-bit pattern decodes to a float that encodes back to the same pattern (NaNs: to a NaN).
TEST(DTypeHost, EveryPatternRoundTrips) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
      const float v = Decode16(static_cast<uint16_t>(bits), dtype);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(Decode16(Encode16(v, dtype), dtype)));
        continue;
      }
      ASSERT_EQ(Encode16(v, dtype), bits) << DTypeName(dtype) << " " << v;
      ASSERT_EQ(RoundToDType(v, dtype), v);
    }
  }
  // 0xffff, the poison pattern, is a NaN in both.
  EXPECT_TRUE(std::isnan(Decode16(0xffff, DType::kBF16)));
  EXPECT_TRUE(std::isnan(Decode16(0xffff, DType::kF16)));
}

// Random inputs of a low-precision chain hold values of its dtype.
TEST(DTypeHost, RandomInputsAreRepresentable) {
  const Chain c = ParseOrFail("x:bf16[2,3,5,5,5] | conv3d(out=4,k=3) | group_norm(groups=2)");
  const HostInputs in = RandomInputs(c, 7);
  for (float v : in.x.data) ASSERT_EQ(RoundToDType(v, DType::kBF16), v);
  for (const auto& [name, t] : in.params) {
    for (float v : t.data) ASSERT_EQ(RoundToDType(v, DType::kBF16), v) << name;
  }
}

CompileOptions Arch(const char* arch) {
  CompileOptions o;
  o.arch = arch;
  return o;
}

// The signature: every tensor in the chain's dtype.
void ExpectDTypeSignature(const CompiledChain& c, DType dtype) {
  for (const TensorSpec& t : c.signature()) {
    if (t.role != TensorRole::kWorkspace) EXPECT_EQ(t.dtype, dtype) << t.name;
  }
}

TEST(DTypeChains, SeedsCompileForwardAndBackward) {
  for (const Workload& w : SeedWorkloads()) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      Chain chain = ParseOrFail(w.spec);
      chain.dtype = dtype;
      for (const char* arch : {"sm_80", "sm_90"}) {
        SCOPED_TRACE(FormatChain(chain) + " " + arch);
        absl::StatusOr<std::shared_ptr<CompiledChain>> f = Compile(chain, Arch(arch));
        ASSERT_TRUE(f.ok()) << f.status();
        ExpectDTypeSignature(**f, dtype);
        // The f32 chain's kernels (TF32 tensor cores: exact for bf16/f16 operands) between the
        // casts: x and each parameter in, y out.
        Chain f32 = chain;
        f32.dtype = DType::kF32;
        CompileOptions tf32 = Arch(arch);
        tf32.precision = Precision::kTf32;
        absl::StatusOr<std::shared_ptr<CompiledChain>> inner = Compile(f32, tf32);
        ASSERT_TRUE(inner.ok()) << inner.status();
        const codegen::Strategy* s = codegen::FindStrategy((*inner)->strategy());
        ASSERT_NE(s, nullptr);
        if (s->HandlesDType(dtype)) {  // natively: the same kernels
          // ... but the f32 chain's absmax pass: its TF32 class (igemm) scales its fp16 values.
          const auto absmax = [](const CompiledChain& c) {
            return c.Explain().find("fj_igemm_absmax") != std::string::npos ? 1 : 0;
          };
          EXPECT_EQ((*f)->kernel_count() - absmax(**f), (*inner)->kernel_count() - absmax(**inner));
          // igemm-store-normalize and tc-conv before gn_apply keep the pre-norm values in an
          // fp32 workspace (y is 16-bit).
          const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
          const bool pre_norm_workspace =
              (*f)->strategy() == "igemm-store-normalize" ||
              ((*f)->strategy() == "tc-conv" && info.group_norm && info.mean == codegen::MeanMode::kNone);
          if (pre_norm_workspace) {
            EXPECT_GT((*f)->workspace_bytes(), (*inner)->workspace_bytes());
          } else if ((*f)->strategy() != "tc-conv") {  // tc-conv: the f32-accurate plan's tiling
            EXPECT_EQ((*f)->workspace_bytes(), (*inner)->workspace_bytes());
          }
        } else {  // + a cast per input and parameter, one for y; + the f32 copies
          EXPECT_EQ((*f)->kernel_count(),
                    (*inner)->kernel_count() + ChainParams(chain).size() + 2);
          EXPECT_GT((*f)->workspace_bytes(), (*inner)->workspace_bytes());
        }
        const std::string explain = (*f)->Explain();
        EXPECT_NE(
            explain.find(s->HandlesDType(dtype) ? std::string("natively in ") + DTypeName(dtype)
                                                : std::string("dtype ") + DTypeName(dtype)),
            std::string::npos)
            << explain;
        EXPECT_EQ((*f)->strategy(), (*inner)->strategy());
        EXPECT_EQ((*f)->output_shape(), (*inner)->output_shape());

        absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, Arch(arch));
        ASSERT_TRUE(b.ok()) << b.status();
        ExpectDTypeSignature(**b, dtype);
        EXPECT_EQ((*b)->strategy(), "backward");
        // grad_y (as large as y) is read in the dtype as it is: no cast, no f32 copy.
        const std::string bexplain = (*b)->Explain();
        EXPECT_NE(bexplain.find(absl::StrCat("grad_y read in ", DTypeName(dtype), " as it is")),
                  std::string::npos)
            << bexplain;
        EXPECT_EQ(bexplain.find("grad_y.f32"), std::string::npos) << bexplain;
      }
    }
  }
}

// A bf16/f16 chain whose f32 plan runs natively is planned again by its own costs: 16-bit
// products run at other rates than TF32's. S8 of the sweep: its f32 chain takes igemm-store,
// the bf16 chain tc-conv (H100, 2026-11-26: tc-conv 0.057 ms against igemm-store's 0.101 in bf16);
// W3 keeps igemm-store-normalize (0.90 against tc-conv's 1.59). A named strategy is kept.
TEST(DTypeChains, NativeChainsArePlannedByTheirOwnCosts) {
  // The f32 chain's estimates prefer igemm-store (three products per term), the bf16/f16 chain's
  // tc-conv (one product).
  Chain s8 = ParseOrFail("x:f32[2,32,16,16,16] | conv3d(out=128,k=3,padding=1) | gelu");
  absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = Compile(s8, Arch("sm_90"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ((*f32)->strategy(), "igemm-store");
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    s8.dtype = dtype;
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(s8, Arch("sm_90"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->strategy(), "tc-conv");
    const std::string explain = (*c)->Explain();
    EXPECT_NE(
        explain.find(absl::StrCat("natively in ", DTypeName(dtype), " (the f32 chain's plan")),
        std::string::npos)
        << explain;
    EXPECT_NE(explain.find("is igemm-store)"), std::string::npos) << explain;
    CompileOptions named = Arch("sm_90");
    named.strategy = "igemm-store";
    c = Compile(s8, named);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->strategy(), "igemm-store");
  }
  Chain w3 = ParseOrFail(SeedWorkloads()[2].spec);
  w3.dtype = DType::kBF16;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(w3, Arch("sm_90"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->strategy(), "igemm-store-normalize");
}

// A bf16 chain whose f32 plan is a strategy without the dtype (an FFMA plan, run between casts)
// runs natively where its own plan's cost is below the f32 plan's plus the casts'
// (runtime::RunsNativelyByCost): R55 of seed 31 (conv-moments-mean in f32 TF32; tc-conv, 0.110 ms
// -> 0.057 on the H200, session 29) and a one-tap convolution of 3 channels (mma-moments-mean,
// 0.058 -> 0.045).
// A strategy named by the caller keeps the f32 plan between casts. The casts' cost grows with
// the tensors.
TEST(DTypeChains, OwnPlansBeatTheF32PlanBetweenCastsByCost) {
  const struct {
    const char* spec;
    const char* f32_strategy;
    const char* strategy;
  } cases[] = {
      {"x:bf16[2,64,37,32,20] | conv3d(out=4,k=3) | sigmoid | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       "conv-moments-mean", "tc-conv"},
      {"x:bf16[128,3,16,32,32] | conv3d(out=16,k=1) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       "conv-moments-mean", "mma-moments-mean"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.spec);
    const Chain chain = ParseOrFail(c.spec);
    Chain f32 = chain;
    f32.dtype = DType::kF32;
    // The f32 chain's plan (its compiled chain may be a composite around it: tap-gemm).
    absl::StatusOr<codegen::Plan> inner =
        codegen::MakePlan(f32, codegen::PlanTarget{"sm_90", 132, Precision::kTf32});
    ASSERT_TRUE(inner.ok()) << inner.status();
    EXPECT_EQ(inner->strategy, c.f32_strategy);
    absl::StatusOr<std::shared_ptr<CompiledChain>> native = Compile(chain, Arch("sm_90"));
    ASSERT_TRUE(native.ok()) << native.status();
    EXPECT_EQ((*native)->strategy(), c.strategy);
    const std::string explain = (*native)->Explain();
    EXPECT_TRUE(absl::StrContains(explain, "natively in bf16 (its own plan, model us")) << explain;
    EXPECT_FALSE(absl::StrContains(explain, "widen")) << explain;
    ExpectDTypeSignature(**native, DType::kBF16);
    CompileOptions named = Arch("sm_90");
    named.strategy = c.f32_strategy;
    absl::StatusOr<std::shared_ptr<CompiledChain>> casts = Compile(chain, named);
    ASSERT_TRUE(casts.ok()) << casts.status();
    EXPECT_TRUE(absl::StrContains((*casts)->Explain(), "widen")) << (*casts)->Explain();
  }
  const Chain small = ParseOrFail("x:bf16[2,4,8,8,8] | conv3d(out=8,k=3) | relu");
  const Chain large = ParseOrFail("x:bf16[32,4,32,32,32] | conv3d(out=8,k=3) | relu");
  EXPECT_GT(runtime::CastCost(small), 0);
  EXPECT_GT(runtime::CastCost(large), runtime::CastCost(small));
}

// A chain whose f32 plan is a generic strategy runs natively: the same kernels reading and
// writing the dtype (no casts), Cfg::Elem in the source.
TEST(DTypeChains, GenericPlansRunNatively) {
  for (const char* spec : {"x:bf16[4,16,8,8,8] | group_norm(groups=4) | relu",
                           "x:f16[4,16,8,8,8] | swish | group_norm(groups=2) | mean(dims=[2,3,4])",
                           "x:bf16[2,6,5,6,7] | tanh | hardswish"}) {
    const Chain chain = ParseOrFail(spec);
    SCOPED_TRACE(spec);
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = Compile(chain, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    Chain f32 = chain;
    f32.dtype = DType::kF32;
    absl::StatusOr<std::shared_ptr<CompiledChain>> inner = Compile(f32, Arch("sm_90"));
    ASSERT_TRUE(inner.ok()) << inner.status();
    EXPECT_EQ((*f)->strategy(), (*inner)->strategy());
    EXPECT_EQ((*f)->kernel_count(), (*inner)->kernel_count());  // no cast kernels
    EXPECT_EQ((*f)->workspace_bytes(), (*inner)->workspace_bytes());
    const std::string elem = std::string("using Elem = fj::") +
                             (chain.dtype == DType::kBF16 ? "bf16_t" : "f16_t");
    EXPECT_NE((*f)->source().find(elem), std::string::npos) << (*f)->source();
    EXPECT_EQ((*inner)->source().find("using Elem"), std::string::npos);
    for (const TensorSpec& t : (*f)->signature()) {
      if (t.role != TensorRole::kWorkspace) EXPECT_EQ(t.dtype, chain.dtype) << t.name;
    }
  }
}

// The backward of a chain without a convolution runs natively too (codegen::BackwardRunsNatively):
// the f32 backward's kernels reading and writing the dtype (no casts, no f32 copies in the
// workspace), for sm_80 and sm_90; every tensor but the workspace in the dtype. A chain with a
// convolution keeps the f32 backward between casts.
TEST(DTypeChains, BackwardsWithoutAConvolutionRunNatively) {
  for (const char* spec :
       {"x:bf16[2,6,9,7,8] | clamp(min=-0.5,max=0.5) | group_norm(groups=2) | hardswish",
        "x:f16[4,16,8,8,8] | swish | group_norm(groups=2) | mean(dims=[2,3,4])",
        "x:bf16[2,8,5,6,7] | group_norm(groups=4) | mean(dims=[1,2,3,4])",
        "x:f16[2,6,5,6,7] | tanh | hardtanh(min=-0.5,max=0.25)",
        "x:bf16[3,5,4,6,7] | gelu | mean(dims=[2,3,4])"}) {
    const Chain chain = ParseOrFail(spec);
    Chain f32 = chain;
    f32.dtype = DType::kF32;
    for (const char* arch : {"sm_80", "sm_90"}) {
      SCOPED_TRACE(absl::StrCat(spec, " ", arch));
      absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, Arch(arch));
      ASSERT_TRUE(b.ok()) << b.status();
      absl::StatusOr<std::shared_ptr<CompiledChain>> inner = CompileBackward(f32, Arch(arch));
      ASSERT_TRUE(inner.ok()) << inner.status();
      EXPECT_EQ((*b)->kernel_count(), (*inner)->kernel_count());  // no cast kernels
      EXPECT_EQ((*b)->workspace_bytes(), (*inner)->workspace_bytes());
      ExpectDTypeSignature(**b, chain.dtype);
      EXPECT_FALSE(absl::StrContains((*b)->Explain(), "widen")) << (*b)->Explain();
    }
  }
  Chain conv = ParseOrFail("x:bf16[2,4,6,6,6] | conv3d(out=8,k=3) | group_norm(groups=2)");
  absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(conv, Arch("sm_90"));
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectDTypeSignature(**b, DType::kBF16);
  EXPECT_TRUE(absl::StrContains((*b)->Explain(), "widen")) << (*b)->Explain();
}

// A named configuration (the autotuner's candidates) is checked against the chain it runs on:
// tc-conv tiles of one TF32 product are valid for a bf16 chain though the f32 chain (3xTF32)
// refuses them; a strategy without native bf16 runs its configuration between casts.
TEST(DTypeChains, NamedConfigurationsAreTheDtypeChains) {
  const std::string body = "[2,24,8,10,10] | conv3d(out=40,k=3,padding=1) | swish";
  const std::string wide = "tc-conv:bm=128,bn=64,bk=32,stages=2,split=1,wm=64,l1=0";
  CompileOptions o = Arch("sm_90");
  o.use_cache = false;
  o.tune_config = wide;
  absl::StatusOr<std::shared_ptr<CompiledChain>> f32 = Compile(ParseOrFail("x:f32" + body), o);
  ASSERT_FALSE(f32.ok());
  EXPECT_TRUE(absl::StrContains(f32.status().message(), "3xTF32")) << f32.status();
  absl::StatusOr<std::shared_ptr<CompiledChain>> bf16 = Compile(ParseOrFail("x:bf16" + body), o);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->strategy(), "tc-conv");
  EXPECT_TRUE(absl::StrContains((*bf16)->Explain(), "config: " + wide)) << (*bf16)->Explain();
  EXPECT_TRUE(absl::StrContains((*bf16)->Explain(), "the configuration given, run natively"));
  o.tune_config = "not-a-strategy:x=1";
  absl::StatusOr<std::shared_ptr<CompiledChain>> bad = Compile(ParseOrFail("x:bf16" + body), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "not-a-strategy")) << bad.status();
}

TEST(DTypeChains, RandomChainsCompile) {
  Rng rng(515);
  for (int i = 0; i < 12; ++i) {
    Chain chain = RandomChain(rng);
    chain.dtype = i % 2 ? DType::kF16 : DType::kBF16;
    SCOPED_TRACE(FormatChain(chain));
    absl::StatusOr<std::shared_ptr<CompiledChain>> f = Compile(chain, Arch("sm_90"));
    ASSERT_TRUE(f.ok()) << f.status();
    ExpectDTypeSignature(**f, chain.dtype);
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(chain, Arch("sm_80"));
    if (!b.ok()) {  // the f32 chain has no backward plan either (a convT output_padding case)
      EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented) << b.status();
      continue;
    }
    ExpectDTypeSignature(**b, chain.dtype);
  }
}

TEST(DTypeChains, BindingsAreCheckedAndF64IsRefused) {
  const Chain c = ParseOrFail("x:f16[2,3,6,6,6] | conv3d(out=4,k=3) | relu");
  absl::StatusOr<std::shared_ptr<CompiledChain>> f = Compile(c, Arch("sm_90"));
  ASSERT_TRUE(f.ok()) << f.status();
  NamedBindings b = {{"x", 256}, {"y", 512}, {"0.weight", 768}};  // no bias, no workspace
  absl::Status s = (*f)->RunNamed(b, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0.bias"), std::string::npos) << s;

  // f64: the forward runs (generic plans in double), the backward is refused by name.
  const Chain d = ParseOrFail("x:f64[2,3,6,6,6] | conv3d(out=4,k=3) | leaky_relu(slope=0.1)");
  absl::StatusOr<std::shared_ptr<CompiledChain>> f64 = Compile(d, Arch("sm_90"));
  ASSERT_TRUE(f64.ok()) << f64.status();
  ExpectDTypeSignature(**f64, DType::kF64);
  EXPECT_NE((*f64)->source().find("fj::leaky_relu(v, 0.1)"), std::string::npos)  // a double
      << (*f64)->source();
  absl::StatusOr<std::shared_ptr<CompiledChain>> r = CompileBackward(d, Arch("sm_90"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("f64"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("bf16"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace fusejit
