// The tuning database: record format, round trip, corruption (every bit flip, every truncation),
// stale and invalid entries (falling back with one warning), permission refusals and write
// faults (through the kernel cache's Env).
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "cache/testing.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "gtest/gtest.h"
#include "tune/tuning_db.h"

namespace fusejit::tune {
namespace {

using cache::testing::FaultInjectionEnv;
using cache::testing::ListNames;
using cache::testing::ReadFileOrDie;
using cache::testing::TempDir;
using cache::testing::WarningLog;
using cache::testing::WriteFileOrDie;

const char* const kSpec =
    "x:f32[4,3,8,16,16] | conv3d(out=16,k=3) | hardswish | group_norm(groups=4) | "
    "mean(dims=[2,3,4])";

Chain TestChain() { return *ParseChain(kSpec); }
codegen::PlanTarget Target() { return {"sm_90", 132, Precision::kFp32}; }
DeviceKey Device() { return {"Test GPU (fusejit tests)", 132, 13000}; }

// A valid configuration other than the default: one parameter away from it.
codegen::TuneConfig Tuned() {
  const std::vector<codegen::TuneConfig> all = codegen::AllCandidates(TestChain(), Target());
  for (const codegen::TuneConfig& c : all) {
    if (c.strategy == all[0].strategy && c.Distance(all[0]) == 1) return c;
  }
  ADD_FAILURE() << "no neighbour of the default";
  return all[0];
}

TuningRecord Record() {
  TuningRecord r;
  r.key = {FormatChain(TestChain()), "sm_90", Precision::kFp32, Device()};
  r.fusejit_version = GeneratorBuild();
  r.config = Tuned().ToString();
  r.default_config = codegen::DefaultTuneConfig(TestChain(), Target())->ToString();
  r.default_ms = 1.5;
  r.best_ms = 1.25;
  r.tried = 17;
  r.rejected = 1;
  r.failed = 0;
  r.tuning_s = 8.25;
  r.tuned_at = "2026-11-22T10:00:00Z";
  return r;
}

class TuningDbTest : public ::testing::Test {
 protected:
  TuningDbOptions Options() {
    TuningDbOptions o;
    o.dir = dir_.Sub("tuning");
    o.warn = log_.Sink();
    return o;
  }
  std::string EntryPath() const {
    return dir_.Sub("tuning") + "/" + Record().key.ToCacheKey().EntryName();
  }
  TempDir dir_{/*in_memory=*/true};  // fsync is free there: the corruption tests write a lot
  WarningLog log_;
};

TEST(TuningRecord, EncodeDecodeRoundTrip) {
  const TuningRecord r = Record();
  absl::StatusOr<TuningRecord> back = TuningRecord::Decode(r.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Encode(), r.Encode());
  EXPECT_EQ(back->key.spec, r.key.spec);
  EXPECT_EQ(back->key.device, r.key.device);
  EXPECT_EQ(back->config, r.config);
  EXPECT_DOUBLE_EQ(back->best_ms, 1.25);
  EXPECT_EQ(back->tried, 17);
  // Readable: the config and the device are plain lines.
  EXPECT_TRUE(absl::StrContains(r.Encode(), "\nconfig: " + r.config + "\n"));
  EXPECT_TRUE(absl::StrContains(r.Encode(), "\ndevice: Test GPU (fusejit tests)\n"));
}

TEST(TuningRecord, DecodeRefusesAnythingElse) {
  const std::string good = Record().Encode();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"tried: 17", "tried: many"},
           {"precision: fp32", "precision: fp16"},
           {"best_ms: 1.25", "best: 1.25"},
           {"fusejit tuning record 1", "fusejit tuning record 2"},
           {"\ntuned_at: 2026-11-22T10:00:00Z\n", "\n"}}) {
    std::string bad = good;
    bad.replace(bad.find(from), from.size(), to);
    absl::StatusOr<TuningRecord> r = TuningRecord::Decode(bad);
    EXPECT_FALSE(r.ok()) << to;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << to;
  }
  EXPECT_FALSE(TuningRecord::Decode(good.substr(0, good.size() - 1)).ok());
  EXPECT_FALSE(TuningRecord::Decode("").ok());
}

TEST_F(TuningDbTest, StoreThenFindAndRead) {
  TuningDb db(Options());
  ASSERT_TRUE(db.usable());
  EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());  // nothing yet
  ASSERT_TRUE(db.Store(Record()).ok());
  std::optional<codegen::TuneConfig> found = db.Find(TestChain(), Target(), Device());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, Tuned());
  absl::StatusOr<TuningRecord> read = db.Read(Record().key);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->Encode(), Record().Encode());
  // Another device, SM count, arch or precision: no entry (and no warning).
  DeviceKey other = Device();
  other.name = "Another GPU";
  EXPECT_FALSE(db.Find(TestChain(), Target(), other).has_value());
  other = Device();
  other.sm_count = 114;
  EXPECT_FALSE(db.Find(TestChain(), Target(), other).has_value());
  codegen::PlanTarget tf32 = Target();
  tf32.precision = Precision::kTf32;
  EXPECT_FALSE(db.Find(TestChain(), tf32, Device()).has_value());
  EXPECT_TRUE(log_.Lines().empty());
  // The folder is private, the entry a 0600 file named by the key.
  struct stat st;
  ASSERT_EQ(::lstat(dir_.Sub("tuning").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::lstat(EntryPath().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Storing again replaces the entry.
  TuningRecord again = Record();
  again.config = codegen::DefaultTuneConfig(TestChain(), Target())->ToString();
  ASSERT_TRUE(db.Store(again).ok());
  EXPECT_EQ(db.Find(TestChain(), Target(), Device())->ToString(), again.config);
  EXPECT_EQ(ListNames(dir_.Sub("tuning")).size(), 1u);
}

TEST_F(TuningDbTest, EveryBitFlipFallsBackToTheDefault) {
  TuningDb db(Options());
  ASSERT_TRUE(db.Store(Record()).ok());
  const std::string path = EntryPath();
  const std::string good = ReadFileOrDie(path);
  int found = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    WriteFileOrDie(path, bad);
    found += db.Find(TestChain(), Target(), Device()).has_value() ? 1 : 0;
  }
  EXPECT_EQ(found, 0);
  EXPECT_GE(log_.Count("fusejit tuning: "), 1);
  EXPECT_GE(log_.Count("using the default configuration"), 1);
  WriteFileOrDie(EntryPath(), good);
  EXPECT_TRUE(db.Find(TestChain(), Target(), Device()).has_value());
}

TEST_F(TuningDbTest, EveryTruncationFallsBackToTheDefault) {
  TuningDb db(Options());
  ASSERT_TRUE(db.Store(Record()).ok());
  const std::string path = EntryPath();
  const std::string good = ReadFileOrDie(path);
  for (size_t n = 0; n < good.size(); ++n) {
    WriteFileOrDie(path, good.substr(0, n));
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value()) << n;
  }
}

TEST_F(TuningDbTest, AnEntryUnderAnotherKeysNameIsRefused) {
  TuningDb db(Options());
  ASSERT_TRUE(db.Store(Record()).ok());
  TuningRecord other = Record();
  other.key.device.name = "Another GPU";
  const std::string other_path = dir_.Sub("tuning") + "/" + other.key.ToCacheKey().EntryName();
  WriteFileOrDie(other_path, ReadFileOrDie(EntryPath()));
  EXPECT_FALSE(db.Find(TestChain(), Target(), other.key.device).has_value());
  EXPECT_EQ(log_.Count("another key"), 1);
}

// Entries that are whole but not usable: one warning each, the default used.
TEST_F(TuningDbTest, StaleAndInvalidEntriesFallBackWithOneWarning) {
  struct Case {
    std::string what;
    std::function<void(TuningRecord&)> spoil;
    std::string warning;
  };
  const std::vector<Case> cases = {
      {"fusejit version", [](TuningRecord& r) { r.fusejit_version = "fusejit-0.0.1"; },
       "stale: written by fusejit-0.0.1"},
      // The same version, another build of the generator (its templates or planner differ).
      {"generator build",
       [](TuningRecord& r) {
         r.fusejit_version = std::string(GeneratorVersion()) + "+g000000000000";
       },
       "stale: written by fusejit-0.1.0+g000000000000"},
      {"driver", [](TuningRecord& r) { r.key.device.driver_version = 12040; },
       "stale: measured with driver 12040"},
      {"unknown strategy", [](TuningRecord& r) { r.config = "no-such-strategy:threads=128"; },
       "does not exist"},
      {"strategy that does not apply",
       [](TuningRecord& r) { r.config = "elementwise:block=256,grid_per_sm=16"; },
       "does not apply"},
      {"invalid values",
       [](TuningRecord& r) {
         r.config =
             "conv-moments-mean:threads=128,min_blocks=3,ph=1,pw=6,blocks_per_sample=99999,csplit=1";
       },
       "blocks_per_sample"},
      {"missing parameters", [](TuningRecord& r) { r.config = "conv-moments-mean:threads=128"; },
       "takes the parameters"},
      {"malformed config", [](TuningRecord& r) { r.config = "conv-moments-mean:threads=lots"; },
       "not an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    WarningLog log;
    TuningDbOptions o;
    o.dir = dir.Sub("tuning");
    o.warn = log.Sink();
    TuningDb db(o);
    TuningRecord r = Record();
    c.spoil(r);
    ASSERT_TRUE(db.Store(r).ok());
    // The lookup is by the current driver: a spoiled driver is in the record, not the key.
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());
    ASSERT_EQ(log.Lines().size(), 1u);
    EXPECT_TRUE(absl::StrContains(log.Lines()[0], c.warning)) << log.Lines()[0];
    EXPECT_TRUE(absl::StrContains(log.Lines()[0], "using the default configuration"))
        << log.Lines()[0];
    EXPECT_TRUE(absl::StartsWith(log.Lines()[0], "fusejit tuning: ")) << log.Lines()[0];
  }
}

TEST_F(TuningDbTest, ARefusedDirectoryOrEntryIsNotUsed) {
  {  // a group-writable database folder
    ASSERT_EQ(::mkdir(dir_.Sub("open").c_str(), 0700), 0);
    ASSERT_EQ(::chmod(dir_.Sub("open").c_str(), 0770), 0);
    TuningDbOptions o = Options();
    o.dir = dir_.Sub("open");
    TuningDb db(o);
    EXPECT_FALSE(db.usable());
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());
    EXPECT_FALSE(db.Store(Record()).ok());
    EXPECT_EQ(log_.Count("writable by group or others"), 1);
    EXPECT_EQ(log_.Count("tuned configurations are not used"), 1);
  }
  {  // an entry that is a symbolic link to a valid record elsewhere
    TuningDb db(Options());
    ASSERT_TRUE(db.Store(Record()).ok());
    const std::string elsewhere = dir_.Sub("elsewhere.fjk");
    ASSERT_EQ(::rename(EntryPath().c_str(), elsewhere.c_str()), 0);
    ASSERT_EQ(::symlink(elsewhere.c_str(), EntryPath().c_str()), 0);
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());
    EXPECT_EQ(log_.Count("symbolic link"), 1);
  }
}

TEST_F(TuningDbTest, WriteFaultsLeaveNoPartialEntry) {
  FaultInjectionEnv env;
  TuningDbOptions o = Options();
  o.env = &env;
  TuningDb db(o);
  ASSERT_TRUE(db.usable());
  for (cache::EnvOp op : {cache::EnvOp::kOpen, cache::EnvOp::kWrite, cache::EnvOp::kFsync,
                          cache::EnvOp::kRename}) {
    env.FailNth(op, 1, ENOSPC);
    EXPECT_FALSE(db.Store(Record()).ok()) << cache::EnvOpName(op);
    env.Reset();
    EXPECT_TRUE(ListNames(dir_.Sub("tuning")).empty()) << cache::EnvOpName(op);
    EXPECT_FALSE(db.Find(TestChain(), Target(), Device()).has_value());
  }
  ASSERT_TRUE(db.Store(Record()).ok());
  EXPECT_TRUE(db.Find(TestChain(), Target(), Device()).has_value());
}

TEST_F(TuningDbTest, ReadOnlyAndDisabled) {
  {
    TuningDb writer(Options());
    ASSERT_TRUE(writer.Store(Record()).ok());
  }
  TuningDbOptions o = Options();
  o.read_only = true;
  TuningDb reader(o);
  EXPECT_TRUE(reader.Find(TestChain(), Target(), Device()).has_value());
  EXPECT_FALSE(reader.Store(Record()).ok());
  o = Options();
  o.enabled = false;
  TuningDb off(o);
  EXPECT_FALSE(off.usable());
  EXPECT_FALSE(off.Find(TestChain(), Target(), Device()).has_value());
  EXPECT_FALSE(off.Store(Record()).ok());
  // No device: nothing to look up.
  TuningDb db(Options());
  EXPECT_FALSE(db.Find(TestChain(), Target(), DeviceKey{}).has_value());
}

// One machine's autotune serves the fleet: a record stored with a remote tier is found by a
// machine with an empty tuning folder, checked as a local one is, and written to its disk.
TEST(TuningDbRemote, ARecordStoredOnOneMachineIsFoundOnAnother) {
  cache::testing::RedisServer redis;
  if (cache::testing::RedisServer::Program().empty()) {
    GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)";
  }
  ASSERT_TRUE(redis.ok()) << redis.error();
  TempDir tmp;
  auto options = [&](const std::string& dir, WarningLog* log) {
    TuningDbOptions o;
    o.dir = tmp.Sub(dir);
    o.warn = log->Sink();
    o.remote.emplace();
    o.remote->address = *cache::ParseRedisUrl(redis.url());
    o.remote->prefix += "tuning:";
    return o;
  };
  WarningLog log1, log2, log3;
  TuningDb machine1(options("m1", &log1));
  ASSERT_TRUE(machine1.Store(Record()).ok());
  const std::string key = cache::RemoteOptions::DefaultPrefix() + "tuning:" +
                          Record().key.ToCacheKey().EntryName();
  ASSERT_EQ(redis.Command({"EXISTS", key}), "1");
  TuningDb machine2(options("m2", &log2));
  std::optional<codegen::TuneConfig> found = machine2.Find(TestChain(), Target(), Device());
  ASSERT_TRUE(found.has_value()) << absl::StrJoin(log2.Lines(), "\n");
  EXPECT_EQ(*found, Tuned());
  EXPECT_EQ(ListNames(tmp.Sub("m2")).size(), 1u) << "the remote record was not kept on disk";
  // A stale record (another fusejit version) in Redis is validated as today: default, one warning.
  TuningRecord stale = Record();
  stale.fusejit_version = "fusejit-0.0.1";
  ASSERT_TRUE(machine1.Store(stale).ok());
  TuningDb machine3(options("m3", &log3));
  EXPECT_FALSE(machine3.Find(TestChain(), Target(), Device()).has_value());
  EXPECT_EQ(log3.Count("stale"), 1) << absl::StrJoin(log3.Lines(), "\n");
}

}  // namespace
}  // namespace fusejit::tune
