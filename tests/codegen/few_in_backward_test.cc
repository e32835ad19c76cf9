// The fused backward for few input channels (templates/few_in_backward.cuh: conv_transpose3d, and
// conv3d with stride 1; planned by codegen::PlanBackward): which chains get it, what its plan
// binds, that the composite skips the data-gradient step, and that the tile geometry
// (geom::FewInBwd) covers every tap of a tile's x points and gives every output point exactly one
// owner inside its region -- the kernel's indexing, checked on the host per axis. GPU runs:
// tests/gpu/gpu_backward_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "codegen/plan.h"
#include "fusejit/fusejit.h"
#include "fusejit/workloads.h"
#include "templates/geometry.cuh"
#include "tests/random_chains.h"
#include "tests/strategy_checks.h"

namespace fusejit {
namespace {

const codegen::PlanTarget kH100{"sm_90", 132, Precision::kFp32};

bool HasKernel(const codegen::Plan& plan, const std::string& name) {
  for (const codegen::KernelLaunch& k : plan.kernels) {
    if (k.symbol == name) return true;
  }
  return false;
}

TEST(FewInBackward, FewInputChannelsGetTheFusedPlan) {
  struct Case {
    const char* spec;
    bool fused;
  };
  const Case cases[] = {
      {"x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       true},
      {"x:f32[2,1,5,6,7] | conv_transpose3d(out=5,k=[2,3,1],stride=[2,1,3],bias=false) | tanh",
       true},
      {"x:f32[2,4,6,6,6] | conv_transpose3d(out=8,k=3,dilation=2,padding=3,output_padding=1,"
       "stride=2) | relu | group_norm(groups=2) | mean(dims=[2,3,4])",
       true},
      {"x:f32[2,5,6,6,6] | conv_transpose3d(out=8,k=3,stride=2) | relu", false},
      // conv3d: stride 1 and padding within the kernel's reach.
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3,padding=1) | relu", true},
      {"x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8) | "
       "mean(dims=[1,2,3,4])",
       true},
      {"x:f32[2,2,6,7,8] | conv3d(out=5,k=[3,1,2],padding=[2,0,1],dilation=[1,1,2]) | tanh", true},
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3,stride=2) | relu", false},
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3,padding=3) | relu", false},
      {"x:f32[2,5,6,6,6] | conv3d(out=8,k=3) | relu", false},
      // More than 48 taps per output point: W2 (96), a stride-1 conv_transpose3d with k=5 (125),
      // a small conv3d without padding (91).
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3) | relu", false},
      {"x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       false},
      {"x:f32[4,1,8,8,8] | conv_transpose3d(out=32,k=5,padding=2) | relu", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const Chain chain = ParseOrFail(c.spec);
    absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(chain, kH100);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(HasKernel(*plan, "fj_bwd_few_in"), c.fused) << codegen::ExplainPlan(*plan);
    EXPECT_EQ(codegen::BackwardPlanWritesGradX(chain, *plan), c.fused);
    // The fused plan: no grad_u pass, no weight-gradient GEMM; the conv weight is read and grad_x
    // (x's shape) written.
    EXPECT_EQ(HasKernel(*plan, "fj_bwd_grad_u"), !c.fused);
    if (c.fused) EXPECT_FALSE(HasKernel(*plan, "fj_wgrad_partial"));
    // The plan says why it did not take the kernel.
    EXPECT_EQ(plan->description.find("no fused few-input-channel kernel (") != std::string::npos,
              !c.fused)
        << plan->description;
    if (!c.fused) continue;
    const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
    bool weight = false, grad_x = false, grad_u = false;
    for (const TensorSpec& t : plan->signature) {
      if (t.name == info.weight_param) weight = t.role == TensorRole::kParam;
      if (t.name == kGradInputName) grad_x = t.shape == chain.input;
      if (t.name == codegen::kProducerGradName) grad_u = true;
    }
    EXPECT_TRUE(weight);
    EXPECT_TRUE(grad_x);
    EXPECT_FALSE(grad_u);
  }
}

// The fused plan's x tile "XDxXHxXW" (its FewInTune), and its grid's blocks.
std::pair<std::string, int64_t> FewInTileOf(const codegen::Plan& plan) {
  std::string tile;
  for (const codegen::TuneStruct& t : plan.tunes) {
    if (t.name != "FewInTune") continue;
    for (const codegen::TuneStruct::Field& f : t.fields) {
      if (f.name == "kXD") tile = f.value;
      if (f.name == "kXH" || f.name == "kXW") tile += "x" + f.value;
    }
  }
  for (const codegen::KernelLaunch& k : plan.kernels) {
    if (k.symbol == "fj_bwd_few_in") return {tile, static_cast<int64_t>(k.grid[0])};
  }
  return {tile, 0};
}

// The tile chooser (instructions per block times the busiest SM's batches of blocks): W1 and W4
// keep their measured tiles; an axis of 24 or 20 points gets a tile side that divides it evenly
// (no idle threads); a mid-size grid fills its SMs evenly instead of leaving a 1.3-wave tail
// (e14ac89 gave the conv3d on 64 x 16^3 points 512 blocks of 8^3, 1.29 waves of 3 per SM).
TEST(FewInBackward, TileFitsTheAxesAndTheWaves) {
  const std::tuple<const char*, const char*, int64_t> cases[] = {
      {"x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4) | hardswish",
       "8x4x32", 2048},
      {"x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])",
       "8x8x32", 1536},
      {"x:f32[32,3,24,24,24] | conv3d(out=32,k=3) | relu | group_norm(groups=8)", "6x12x24", 256},
      {"x:f32[16,3,20,20,20] | conv3d(out=16,k=3) | group_norm(groups=4)", "5x10x10", 256},
      {"x:f32[64,3,16,16,16] | conv3d(out=24,k=3) | group_norm(groups=8)", "16x4x16", 256},
  };
  for (const auto& [spec, tile, blocks] : cases) {
    SCOPED_TRACE(spec);
    absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(ParseOrFail(spec), kH100);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(FewInTileOf(*plan), std::make_pair(std::string(tile), blocks))
        << codegen::ExplainPlan(*plan);
  }
}

TEST(FewInBackward, PlanNamesWhyItDidNotTakeTheKernel) {
  const std::pair<const char*, const char*> cases[] = {
      {"x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
       "mean(dims=[2,3,4])",
       "(95.9 taps per output point (at most 48))"},
      {"x:f32[2,5,6,6,6] | conv3d(out=8,k=3) | relu", "(5 input channels (at most 4))"},
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3,stride=2) | relu",
       "(conv3d with a stride other than 1)"},
      {"x:f32[2,3,6,6,6] | conv3d(out=8,k=3,padding=3) | relu",
       "(conv3d padding beyond the kernel's reach)"},
      {"x:f32[2,1,6,6,6] | conv_transpose3d(out=8,k=[5,5,3]) | relu",
       "(75 kernel taps (at most 64))"},
  };
  for (const auto& [spec, why] : cases) {
    SCOPED_TRACE(spec);
    absl::StatusOr<codegen::Plan> plan = codegen::PlanBackward(ParseOrFail(spec), kH100);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->description.find(why), std::string::npos) << plan->description;
  }
}

TEST(FewInBackward, CompositeSkipsTheDataGradientStep) {
  const Chain w1 = ParseOrFail(
      "x:f32[4,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish");
  for (const char* arch : {"sm_80", "sm_90"}) {
    SCOPED_TRACE(arch);
    CompileOptions o;
    o.arch = arch;
    o.use_cache = false;
    absl::StatusOr<std::shared_ptr<CompiledChain>> b = CompileBackward(w1, o);
    ASSERT_TRUE(b.ok()) << b.status();
    const std::string e = (*b)->Explain();
    EXPECT_NE(e.find("step 2: grad_y -> grad_x"), std::string::npos) << e;
    EXPECT_EQ(e.find("step 3"), std::string::npos) << e;
    EXPECT_EQ(e.find("bytes: grad_u"), std::string::npos) << e;
    EXPECT_NE(e.find("fj_bwd_few_in"), std::string::npos) << e;
    // u and scratch; no grad_u region (the output is 4*16*31*63*63 floats).
    const size_t u_bytes = size_t{4} * 16 * 31 * 63 * 63 * 4;
    EXPECT_LT((*b)->workspace_bytes(), 2 * u_bytes);
    absl::StatusOr<std::shared_ptr<CompiledChain>> saved = CompileBackwardFromSaved(w1, o);
    ASSERT_TRUE(saved.ok()) << saved.status();
    const std::string es = (*saved)->Explain();
    EXPECT_NE(es.find("step 1: grad_y -> grad_x"), std::string::npos) << es;
    EXPECT_EQ(es.find("step 2"), std::string::npos) << es;
  }
}

// Per axis: x has `din` points, tiles of `t`; stride s, padding p, kernel k, dilation l,
// output_padding op. Mirrors the kernel's indexing: region of tile i0 starts at o = i0*s - p and
// spans FewInBwdSpan points; tap k of x point i is at region index (i - i0)*s + k*l; the tile owns
// o in [i0*s - p, (i0 + t)*s - p), the last tile up to the output's end.
void CheckAxis(long long din, long long t, long long s, long long p, long long k, long long l,
               long long op) {
  SCOPED_TRACE(
      absl::StrCat("din ", din, " t ", t, " s ", s, " p ", p, " k ", k, " l ", l, " op ", op));
  const long long dout = (din - 1) * s - 2 * p + l * (k - 1) + op + 1;
  ASSERT_GT(dout, 0);
  const long long span =
      fj::geom::FewInBwdSpan(t, s, k, l, fj::geom::FewInBwdExtra(true, p, k, l, op));
  ASSERT_EQ(fj::geom::FewInBwdStep(true, s), s);
  ASSERT_EQ(fj::geom::FewInBwdStart(true, p, k, l), -p);
  const long long tiles = (din + t - 1) / t;
  std::vector<int> owners(dout, 0);
  for (long long tile = 0; tile < tiles; ++tile) {
    const long long i0 = tile * t, lo = i0 * s - p;
    for (long long i = i0; i < std::min(din, i0 + t); ++i) {
      for (long long kk = 0; kk < k; ++kk) {
        const long long r = (i - i0) * s + kk * l;
        ASSERT_GE(r, 0);
        ASSERT_LT(r, span) << "tap " << kk << " of x point " << i;
        EXPECT_EQ(lo + r, i * s - p + kk * l);
      }
    }
    const long long own_end = tile == tiles - 1 ? dout : lo + t * s;
    for (long long o = std::max(0LL, lo); o < std::min(dout, own_end); ++o) {
      ASSERT_LT(o - lo, span) << "owned output " << o;
      ++owners[o];
    }
  }
  for (long long o = 0; o < dout; ++o) EXPECT_EQ(owners[o], 1) << "output " << o;
}

// The same for conv3d with stride 1 (padding <= (k-1)*l, the plan's domain): tap k of x point i
// reads output o = i + p - k*l, at region index (i - i0) + (k-1-k')*l... i.e. with k' = k-1-k,
// o = i + b + k'*l, b = p - (k-1)*l.
void CheckConv3dAxis(long long din, long long t, long long p, long long k, long long l) {
  SCOPED_TRACE(absl::StrCat("conv3d din ", din, " t ", t, " p ", p, " k ", k, " l ", l));
  const long long dout = din + 2 * p - l * (k - 1);
  if (dout <= 0) return;
  const long long a = fj::geom::FewInBwdStep(false, 1), b = fj::geom::FewInBwdStart(false, p, k, l);
  ASSERT_EQ(a, 1);
  const long long span =
      fj::geom::FewInBwdSpan(t, a, k, l, fj::geom::FewInBwdExtra(false, p, k, l, 0));
  const long long tiles = (din + t - 1) / t;
  std::vector<int> owners(dout, 0);
  for (long long tile = 0; tile < tiles; ++tile) {
    const long long i0 = tile * t, lo = a * i0 + b;
    for (long long i = i0; i < std::min(din, i0 + t); ++i) {
      for (long long kk = 0; kk < k; ++kk) {
        const long long o = i + p - kk * l;  // conv3d: x point i feeds output o through tap kk
        const long long r = (i - i0) * a + (k - 1 - kk) * l;
        ASSERT_GE(r, 0);
        ASSERT_LT(r, span);
        EXPECT_EQ(lo + r, o);
      }
    }
    const long long own_end = tile == tiles - 1 ? dout : lo + t * a;
    for (long long o = std::max(0LL, lo); o < std::min(dout, own_end); ++o) {
      ASSERT_LT(o - lo, span) << "owned output " << o;
      ++owners[o];
    }
  }
  for (long long o = 0; o < dout; ++o) EXPECT_EQ(owners[o], 1) << "output " << o;
}

TEST(FewInBackward, Conv3dTileGeometryCoversEveryTapAndOwnsEveryOutputOnce) {
  for (long long k = 1; k <= 5; ++k) {
    for (long long l = 1; l <= 3; ++l) {
      for (long long p = 0; p <= l * (k - 1); ++p) {
        for (long long din : {1LL, 2LL, 5LL, 9LL, 16LL}) {
          for (long long t : {1LL, 2LL, 4LL, 8LL}) CheckConv3dAxis(din, t, p, k, l);
        }
      }
    }
  }
}

TEST(FewInBackward, TileGeometryCoversEveryTapAndOwnsEveryOutputOnce) {
  for (long long s = 1; s <= 3; ++s) {
    for (long long k = 1; k <= 5; ++k) {
      for (long long l = 1; l <= 3; ++l) {
        for (long long p = 0; p <= l * (k - 1); ++p) {
          // output_padding below stride or dilation (PyTorch's rule).
          for (long long op = 0; op < std::max(s, l); ++op) {
            for (long long din : {1LL, 2LL, 5LL, 9LL}) {
              if ((din - 1) * s - 2 * p + l * (k - 1) + op + 1 <= 0) continue;
              for (long long t : {1LL, 2LL, 4LL, 8LL}) CheckAxis(din, t, s, p, k, l, op);
            }
          }
        }
      }
    }
  }
}

TEST(FewInBackward, SharedMemoryLayoutHoldsEveryPart) {
  // W1's geometry at several tiles: the parts follow each other, 16-byte aligned doubles last.
  for (long long xd : {1, 2, 4}) {
    for (long long xh : {2, 8, 16}) {
      const fj::geom::FewInBwd g = fj::geom::FewInBwdOf(
          true, 3, 16, 16, 32, 32, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 4, xd, xh, 32, 256);
      EXPECT_EQ(g.ld, std::max(2 * xd + 1, 2 * xd));
      EXPECT_EQ(g.lh, 2 * xh + 1);
      EXPECT_EQ(g.lw, 65);
      EXPECT_EQ(g.taps_per_chunk, 10);  // 3 channels x 10 taps <= 32
      EXPECT_EQ(g.chunks, 3);
      EXPECT_GE(g.weights_offset, g.region);
      EXPECT_GE(g.partials_offset, g.weights_offset + 3 * 16 * 27);
      EXPECT_GE(g.terms_offset, g.partials_offset + 2 * 3 * 8 * 32);
      EXPECT_GE(g.bias_offset, g.terms_offset + 4 * 4);
      EXPECT_EQ(g.bias_offset % 2, 0);
      EXPECT_EQ(g.smem, 4 * g.bias_offset + 8 * 16 * 8);
      EXPECT_EQ(g.points_per_thread, (xd * xh * 32 + 255) / 256);
    }
  }
}

TEST(FewInBackward, RandomFewChannelChainsCompileForSm80AndSm90) {
  Rng rng(777);
  int fused = 0;
  for (int i = 0; i < 200 && fused < 6; ++i) {
    const Chain chain = RandomChain(rng);
    absl::StatusOr<codegen::Plan> plan =
        codegen::PlanBackward(chain, codegen::PlanTarget{"sm_90", 132, Precision::kFp32});
    if (!plan.ok() || !codegen::BackwardPlanWritesGradX(chain, *plan)) continue;
    ++fused;
    testing::ExpectBackwardCompilesForSm80AndSm90(chain, "fj_bwd_few_in");
  }
  EXPECT_GE(fused, 3);
}

}  // namespace
}  // namespace fusejit
