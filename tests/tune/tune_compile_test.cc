// fusejit::Compile and the tuning database: a tuned entry for the device is used over the
// heuristic default (visible in Explain()), only for a known device, not when turned off or when
// another strategy is asked for, and a stale one falls back with a warning. Runs without a GPU:
// the device is named by CompileOptions::tuning_device.
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "cache/testing.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "gtest/gtest.h"
#include "tune/tuning_db.h"

namespace fusejit::tune {
namespace {

using cache::testing::TempDir;
using cache::testing::WarningLog;

const char* const kSpec =
    "x:f32[4,3,8,16,16] | conv3d(out=16,k=3,padding=1) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])";

// A private database as TuningDb::Default() for the test's duration.
class TunedCompileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TuningDbOptions o;
    o.dir = dir_.Sub("tuning");
    o.warn = log_.Sink();
    db_ = std::make_unique<TuningDb>(o);
    previous_ = TuningDb::SetDefaultForTesting(db_.get());
    chain_ = *ParseChain(kSpec);
    target_ = {"sm_90", 132, Precision::kFp32};
    device_ = {"Test GPU (fusejit tests)", 132, 13000};
    // The tuned configuration: the default with another pw (outputs per thread along w).
    default_ = *codegen::DefaultTuneConfig(chain_, target_);
    for (const codegen::TuneConfig& c : codegen::AllCandidates(chain_, target_)) {
      if (c.strategy == default_.strategy && c.Distance(default_) == 1 &&
          c.Get("pw") != default_.Get("pw")) {
        tuned_ = c;
        break;
      }
    }
    ASSERT_FALSE(tuned_.strategy.empty());
  }
  void TearDown() override { TuningDb::SetDefaultForTesting(previous_); }

  void StoreTuned(const std::string& version = GeneratorBuild()) {
    TuningRecord r;
    r.key = {FormatChain(chain_), "sm_90", Precision::kFp32, device_};
    r.fusejit_version = version;
    r.config = tuned_.ToString();
    r.default_config = default_.ToString();
    r.tuned_at = "2026-11-22T10:00:00Z";
    ASSERT_TRUE(db_->Store(r).ok());
  }

  std::shared_ptr<CompiledChain> CompileWith(CompileOptions options) {
    options.arch = "sm_90";
    absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain_, options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  TempDir dir_;
  WarningLog log_;
  std::unique_ptr<TuningDb> db_;
  TuningDb* previous_ = nullptr;
  Chain chain_;
  codegen::PlanTarget target_;
  DeviceKey device_;
  codegen::TuneConfig default_, tuned_;
};

TEST_F(TunedCompileTest, ATunedEntryIsUsedOverTheDefault) {
  StoreTuned();
  CompileOptions options;
  options.use_cache = false;
  options.tuning_device = device_;
  std::shared_ptr<CompiledChain> tuned = CompileWith(options);
  ASSERT_NE(tuned, nullptr);
  EXPECT_EQ(tuned->stats().tune_origin, "tuned");
  const std::string explain = tuned->Explain();
  EXPECT_TRUE(absl::StrContains(explain, "config: " + tuned_.ToString())) << explain;
  EXPECT_TRUE(absl::StrContains(explain, "kPW=" + std::to_string(*tuned_.Get("pw")))) << explain;
  // ... and it is in the source, hence in the kernel cache key.
  EXPECT_TRUE(absl::StrContains(tuned->source(),
                                "kPW = " + std::to_string(*tuned_.Get("pw")) + ";"));
  EXPECT_TRUE(log_.Lines().empty());

  // No device (explicit arch alone): the default.
  options.tuning_device = {};
  std::shared_ptr<CompiledChain> plain = CompileWith(options);
  EXPECT_EQ(plain->stats().tune_origin, "default");
  EXPECT_TRUE(absl::StrContains(plain->Explain(), "config: " + default_.ToString()));
  EXPECT_NE(plain->source(), tuned->source());

  // Turned off, or another strategy asked for: not used.
  options.tuning_device = device_;
  options.use_tuning = false;
  EXPECT_EQ(CompileWith(options)->stats().tune_origin, "default");
  options.use_tuning = true;
  options.strategy = "recompute-mean";
  std::shared_ptr<CompiledChain> other = CompileWith(options);
  EXPECT_EQ(other->stats().tune_origin, "default");
  EXPECT_TRUE(absl::StrContains(other->Explain(), "plan: recompute-mean"));

  // A given configuration wins over the database.
  options.strategy = "";
  options.tune_config = default_.ToString();
  std::shared_ptr<CompiledChain> given = CompileWith(options);
  EXPECT_EQ(given->stats().tune_origin, "given");
  EXPECT_EQ(given->source(), plain->source());
}

// tap-gemm (runtime/tap_gemm.h) is not among the tuner's candidates: a tuned configuration of the
// chain's own plan does not keep it from a chain it is chosen for; a given configuration does.
TEST_F(TunedCompileTest, ATunedOwnPlanDoesNotKeepOutTapGemm) {
  const Chain chain = *ParseChain(
      "x:f32[2,128,28,29,36] | conv_transpose3d(out=4,k=4) | clamp(min=-0.5,max=0.5) | "
      "group_norm(groups=4) | gelu");
  const codegen::TuneConfig own = *codegen::DefaultTuneConfig(chain, target_);
  TuningRecord r;
  r.key = {FormatChain(chain), "sm_90", Precision::kFp32, device_};
  r.fusejit_version = GeneratorBuild();
  r.config = own.ToString();
  r.default_config = own.ToString();
  r.tuned_at = "2026-11-29T10:00:00Z";
  ASSERT_TRUE(db_->Store(r).ok());
  CompileOptions options;
  options.arch = "sm_90";
  options.use_cache = false;
  options.tuning_device = device_;
  absl::StatusOr<std::shared_ptr<CompiledChain>> c = Compile(chain, options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->strategy(), "tap-gemm");
  options.tune_config = own.ToString();
  c = Compile(chain, options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->strategy(), own.strategy);
}

TEST_F(TunedCompileTest, AStaleEntryFallsBackWithAWarning) {
  StoreTuned("fusejit-0.0.1");
  CompileOptions options;
  options.use_cache = false;
  options.tuning_device = device_;
  std::shared_ptr<CompiledChain> c = CompileWith(options);
  EXPECT_EQ(c->stats().tune_origin, "default");
  EXPECT_TRUE(absl::StrContains(c->Explain(), "config: " + default_.ToString()));
  ASSERT_EQ(log_.Lines().size(), 1u);
  EXPECT_TRUE(absl::StrContains(log_.Lines()[0], "stale")) << log_.Lines()[0];
}

TEST_F(TunedCompileTest, MemoryHitsAreKeyedByTheDevice) {
  StoreTuned();
  CompileOptions options;
  options.tuning_device = device_;
  std::shared_ptr<CompiledChain> a = CompileWith(options);
  std::shared_ptr<CompiledChain> b = CompileWith(options);
  EXPECT_EQ(a.get(), b.get());  // an in-memory hit: no second lookup, the same instance
  EXPECT_EQ(a->stats().tune_origin, "tuned");
  options.tuning_device = {};
  std::shared_ptr<CompiledChain> c = CompileWith(options);
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(c->stats().tune_origin, "default");
}

// A training forward keeping u (PlanTarget::keeps_u) reads the plain forward's record: its
// configuration where it fits the forward keeping u, else the default -- without a warning,
// since the record is fine for the forward it was tuned for. Here a bf16 igemm chain, whose
// training forward flushes its 16-bit sums and so holds at most 3 warpgroups of 128 channels.
TEST_F(TunedCompileTest, ATrainingForwardUsesThePlainRecordWhereItFits) {
  const Chain chain = *ParseChain(
      "x:bf16[4,64,8,16,16] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
      "group_norm(groups=8)");
  codegen::PlanTarget keeping = target_;
  keeping.keeps_u = true;
  std::optional<codegen::TuneConfig> wide, fits;  // 4 warpgroups (plain only); 2 (both)
  for (const codegen::TuneConfig& c : codegen::AllCandidates(chain, target_)) {
    if (c.strategy != "igemm-store-normalize" || c.Get("bn") != 128 || c.Get("split") != 1) {
      continue;
    }
    if (c.Get("wg") == 4 && !wide) wide = c;
    if (c.Get("wg") == 2 && !fits && codegen::ValidateConfig(chain, keeping, c).ok()) fits = c;
  }
  ASSERT_TRUE(wide.has_value() && fits.has_value());
  CompileOptions arch;
  arch.arch = "sm_90";
  ASSERT_TRUE(TrainingForwardSaves(chain, arch));  // (else it is the plain forward)
  EXPECT_FALSE(codegen::ValidateConfig(chain, keeping, *wide).ok());
  CompileOptions options;
  options.arch = "sm_90";
  options.use_cache = false;
  options.tuning_device = device_;
  for (int i = 0; i < 2; ++i) {
    const codegen::TuneConfig& tuned = i == 0 ? *wide : *fits;
    SCOPED_TRACE(tuned.ToString());
    TuningRecord r;
    r.key = {FormatChain(chain), "sm_90", Precision::kFp32, device_};
    r.fusejit_version = GeneratorBuild();
    r.config = tuned.ToString();
    r.default_config = codegen::DefaultTuneConfig(chain, target_)->ToString();
    r.tuned_at = "2026-11-28T06:00:00Z";
    ASSERT_TRUE(db_->Store(r).ok());
    absl::StatusOr<std::shared_ptr<CompiledChain>> plain = Compile(chain, options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ((*plain)->stats().tune_origin, "tuned");
    absl::StatusOr<std::shared_ptr<CompiledChain>> training =
        CompileTrainingForward(chain, options);
    ASSERT_TRUE(training.ok()) << training.status();
    const bool used = absl::StrContains((*training)->Explain(), "config: " + tuned.ToString());
    EXPECT_EQ(used, i == 1) << (*training)->Explain();
    EXPECT_TRUE(log_.Lines().empty()) << absl::StrJoin(log_.Lines(), "\n");
  }
}

}  // namespace
}  // namespace fusejit::tune
