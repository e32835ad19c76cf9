// The tensor-core convolution engine (strategy tc-conv) on the CPU: where it applies, that its
// plans compile for sm_80 and sm_90 in both precisions for every tail of the pipeline, and that
// configurations it cannot run are refused with the reason before anything is compiled.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "jit/nvrtc.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

Chain Parse(const std::string& spec) { return ParseOrFail(spec); }

const codegen::Strategy& Tc() {
  const codegen::Strategy* s = codegen::FindStrategy("tc-conv");
  EXPECT_NE(s, nullptr);
  return *s;
}

codegen::PlanTarget Target(const std::string& arch, Precision p = Precision::kFp32) {
  return {arch, 132, p};
}

TEST(TcConv, AppliesToEveryConvolutionFromAmpereOn) {
  const Chain conv = Parse("x:f32[2,13,9,10,11] | conv3d(out=21,k=3,padding=1) | swish");
  const Chain convt = Parse(
      "x:f32[2,9,5,5,5] | conv_transpose3d(out=17,k=[2,3,4],stride=[2,3,1],padding=[0,1,2]) | tanh");
  const Chain none = Parse("x:f32[2,8,5,5,5] | group_norm(groups=2) | relu");
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100"}) {
    EXPECT_TRUE(Tc().Applies(codegen::PlanInput(conv, Target(arch)))) << arch;
    EXPECT_TRUE(Tc().Applies(codegen::PlanInput(convt, Target(arch)))) << arch;
    EXPECT_FALSE(Tc().Applies(codegen::PlanInput(none, Target(arch)))) << arch;
  }
  EXPECT_FALSE(
      Tc().Applies(codegen::PlanInput(conv, Target("sm_75"))));  // no cp.async / tf32 mma.sync
}

TEST(TcConv, EveryTailCompilesForSm80AndSm90InBothPrecisions) {
  const char* const specs[] = {
      "x:f32[3,13,9,10,11] | conv3d(out=21,k=3,padding=1) | swish",
      "x:f32[3,13,9,10,11] | conv3d(out=21,k=3,padding=1) | gelu | mean(dims=[2,3,4])",
      "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | relu | group_norm(groups=6) | tanh",
      "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | group_norm(groups=3) | "
      "mean(dims=[1,2,3,4])",
      "x:f32[3,13,9,10,11] | conv3d(out=24,k=3,padding=1) | group_norm(groups=8) | swish | "
      "mean(dims=[1,2,3,4])",
      "x:f32[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1,output_padding=1) | "
      "swish | group_norm(groups=4) | mean(dims=[2,3,4])",
  };
  for (const char* spec : specs) {
    for (const char* arch : {"sm_80", "sm_90"}) {
      for (Precision p : {Precision::kFp32, Precision::kTf32}) {
        CompileOptions options;
        options.arch = arch;
        options.precision = p;
        options.strategy = "tc-conv";
        options.use_cache = false;
        absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(spec), options);
        ASSERT_TRUE(c.ok()) << spec << " " << arch << ": " << c.status();
        EXPECT_EQ((*c)->strategy(), "tc-conv");
      }
    }
  }
}

// Chains of at most 8 output channels take the 8-channel tile (bn=8: one n8 mma fragment a warp,
// half the padded products of the 16-channel one); its configurations compile for sm_80 and
// sm_90, fp32-accurate, TF32 and bf16, split-K and 64-row warp tiles among them.
TEST(TcConv, EightChannelTileForFewOutputChannels) {
  const char* const specs[] = {
      "x:f32[2,40,6,7,8] | conv_transpose3d(out=4,k=3,stride=2,padding=1,output_padding=1) | "
      "group_norm(groups=4)",
      "x:bf16[2,24,7,8,9] | conv3d(out=7,k=3,padding=1) | swish | mean(dims=[2,3,4])",
  };
  for (const char* spec : specs) {
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(Parse(spec), Target("sm_90"), "tc-conv");
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->tune_config.find(",bn=8,"), std::string::npos) << plan->tune_config;
    EXPECT_NE(plan->description.find("x 8 channels per tile"), std::string::npos)
        << plan->description;
    for (const char* arch : {"sm_80", "sm_90"}) {
      for (const char* config : {"", "tc-conv:bm=128,bn=8,bk=8,stages=4,split=2,wm=64,l1=0"}) {
        for (Precision p : {Precision::kFp32, Precision::kTf32}) {
          CompileOptions options;
          options.arch = arch;
          options.precision = p;
          options.strategy = "tc-conv";
          options.tune_config = config;
          options.use_cache = false;
          absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(Parse(spec), options);
          ASSERT_TRUE(c.ok()) << spec << " " << arch << " " << config << ": " << c.status();
        }
      }
    }
  }
  // A 9-channel chain keeps the 16-channel tile.
  absl::StatusOr<codegen::Plan> nine = codegen::MakePlan(
      Parse("x:f32[2,24,7,8,9] | conv3d(out=9,k=3,padding=1) | swish"), Target("sm_90"), "tc-conv");
  ASSERT_TRUE(nine.ok()) << nine.status();
  EXPECT_NE(nine->tune_config.find(",bn=16,"), std::string::npos) << nine->tune_config;
}

// bf16/f16 chains multiply natively (one m16n8k16 product of the 16-bit values): the operand
// copies are in the dtype, input channels are padded to 8 (16 bytes), and the plans compile for
// sm_80 and sm_90 under every k-step width (16, 32, 64 values).
TEST(TcConv, Bf16AndF16ChainsMultiplyTheirOwnValues) {
  for (const char* d : {"bf16", "f16"}) {
    const std::string dt = d;
    const Chain conv = Parse("x:" + dt +
                             "[2,13,9,10,11] | conv3d(out=21,k=3,padding=1) | gelu | "
                             "group_norm(groups=3)");
    absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(conv, Target("sm_90"), "tc-conv");
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->description.find("one " + dt + " product per term (m16n8k16"),
              std::string::npos)
        << plan->description;
    EXPECT_NE(plan->description.find("input channels padded 13 -> 16"), std::string::npos)
        << plan->description;
    ASSERT_FALSE(plan->workspace.empty());
    EXPECT_EQ(plan->workspace[0].bytes, size_t{2} * 9 * 10 * 11 * 16 * 2);  // x, 2 bytes a value
    for (const char* arch : {"sm_80", "sm_90"}) {
      for (const char* bk : {"8", "16", "32"}) {
        CompileOptions options;
        options.arch = arch;
        options.use_cache = false;
        options.tune_config =
            absl::StrCat("tc-conv:bm=128,bn=32,bk=", bk, ",stages=3,split=1,wm=32,l1=1");
        for (const Chain& chain :
             {conv, Parse("x:" + dt +
                          "[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1,"
                          "output_padding=1) | swish | mean(dims=[2,3,4])")}) {
          absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
          ASSERT_TRUE(c.ok()) << FormatChain(chain) << " " << arch << " bk " << bk << ": "
                              << c.status();
          EXPECT_EQ((*c)->strategy(), "tc-conv");
        }
      }
    }
  }
}

TEST(TcConv, PlanSaysWhatItPadsAndHowItSplitsTransposedConvolutions) {
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(
      Parse("x:f32[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1) | swish"),
      Target("sm_80"), "tc-conv");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->description.find("output phases"), std::string::npos) << plan->description;
  EXPECT_NE(plan->description.find("input channels padded 12 -> 12"), std::string::npos)
      << plan->description;
  EXPECT_NE(plan->description.find("3xTF32"), std::string::npos) << plan->description;
  // 3xTF32 keeps a second (small-part) weight copy; TF32 does not.
  absl::StatusOr<codegen::Plan> tf32 = codegen::MakePlan(
      Parse("x:f32[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1) | swish"),
      Target("sm_80", Precision::kTf32), "tc-conv");
  ASSERT_TRUE(tf32.ok()) << tf32.status();
  EXPECT_EQ(plan->workspace.size(), tf32->workspace.size() + 1);
}

TEST(TcConv, RefusesConfigurationsItCannotRun) {
  const Chain chain = Parse("x:f32[2,20,7,9,11] | conv3d(out=36,k=3,padding=1) | swish");
  struct Case {
    const char* config;
    const char* why;
  } cases[] = {
      {"tc-conv:bm=96,bn=64,bk=32,stages=3,split=1,wm=32,l1=0", "bm 96 is 64 or 128"},
      {"tc-conv:bm=128,bn=48,bk=32,stages=3,split=1,wm=32,l1=0", "bn 48 is 8, 16, 32, 64 or 128"},
      {"tc-conv:bm=128,bn=64,bk=4,stages=3,split=1,wm=32,l1=0", "bk 4 is 8, 16 or 32"},
      {"tc-conv:bm=128,bn=64,bk=32,stages=9,split=1,wm=32,l1=0", "stages 9 is not in [2, 6]"},
      {"tc-conv:bm=64,bn=128,bk=8,stages=3,split=1,wm=32,l1=0", "do not divide among 256 threads"},
      {"tc-conv:bm=128,bn=64", "bm,bn,bk,stages,split,wm,l1"},
      {"tc-conv:bm=128,bn=64,bk=32,stages=3,split=32,wm=32,l1=0", "split 32 is not in [1, 16]"},
      {"tc-conv:bm=128,bn=64,bk=32,stages=3,split=1,wm=48,l1=0", "wm 48 is 32 or 64"},
      {"tc-conv:bm=64,bn=64,bk=32,stages=3,split=1,wm=64,l1=0", "wm 64 with 3xTF32"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<codegen::TuneConfig> config = codegen::TuneConfig::Parse(c.config);
    ASSERT_TRUE(config.ok()) << c.config;
    absl::Status s = Tc().Validate(codegen::PlanInput(chain, Target("sm_90")), *config);
    EXPECT_FALSE(s.ok()) << c.config;
    EXPECT_NE(s.message().find(c.why), std::string::npos) << c.config << ": " << s;
  }
  // Shared memory differs by architecture: 6 deep stages of 128 x 128 fit sm_90, not sm_86.
  absl::StatusOr<codegen::TuneConfig> deep =
      codegen::TuneConfig::Parse("tc-conv:bm=128,bn=128,bk=32,stages=5,split=1,wm=32,l1=0");
  ASSERT_TRUE(deep.ok());
  EXPECT_TRUE(
      Tc().Validate(codegen::PlanInput(chain, Target("sm_90", Precision::kTf32)), *deep).ok());
  absl::Status s =
      Tc().Validate(codegen::PlanInput(chain, Target("sm_86", Precision::kTf32)), *deep);
  EXPECT_NE(s.message().find("bytes of shared memory"), std::string::npos) << s;
}

// explain says why the planner chose the plan: every applicable strategy's estimated cost.
TEST(TcConv, ExplainSaysWhyThePlanWasChosen) {
  CompileOptions options;
  options.arch = "sm_80";  // on sm_90 the chain takes igemm-store-normalize
  options.use_cache = false;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(
      Parse("x:f32[16,32,32,32,32] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)"),
      options);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string text = (*c)->Explain();
  EXPECT_NE(text.find("why this plan: lowest estimated cost of the applicable strategies (model "
                      "us): tc-conv "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("store-normalize"), std::string::npos) << text;
  options.strategy = "tc-conv";
  c = Compile(Parse("x:f32[2,8,6,6,6] | conv3d(out=8,k=3) | relu"), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->Explain().find("why this plan: asked for by name"), std::string::npos);
}

// The plan carries the host's geometry (tiles, shared memory, prep grid) into the source, and the
// template refuses to compile when its own differs: a wrong host value fails at compile time.
TEST(TcConv, HostAndDeviceGeometryAgreeOrTheSourceDoesNotCompile) {
  const Chain chain = Parse(
      "x:f32[2,12,5,6,7] | conv_transpose3d(out=20,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4)");
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, Target("sm_80"), "tc-conv");
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto compile = [&](const codegen::Plan& p) {
    const codegen::GeneratedSource src = codegen::EmitSource(chain, p);
    jit::NvrtcRequest req;
    req.name = src.name;
    req.source = src.main;
    req.arch = "sm_80";
    req.options = src.nvrtc_options;
    req.headers = src.headers;
    return jit::CompileCuda(req).status();
  };
  EXPECT_TRUE(compile(*plan).ok());
  for (const char* field : {"kHostTiles", "kHostSmemBytes", "kHostPrepBlocks"}) {
    codegen::Plan wrong = *plan;
    bool found = false;
    for (codegen::TuneStruct::Field& f : wrong.tunes[0].fields) {
      if (f.name == field) {
        f.value = std::to_string(std::stoll(f.value) + 1);
        found = true;
      }
    }
    ASSERT_TRUE(found) << field;
    absl::Status s = compile(wrong);
    EXPECT_FALSE(s.ok()) << field;
    EXPECT_NE(s.message().find("host and device"), std::string::npos) << field << ": " << s;
  }
}

}  // namespace
}  // namespace fusejit
