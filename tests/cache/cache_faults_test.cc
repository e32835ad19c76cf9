// Cache faults cost the cache, never the result: the Nth call of every kind fails (for every N),
// a full disk, a read-only directory, no usable directory.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::FaultInjectionEnv;
using testing::ListNames;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::TestKey;
using testing::TestPayload;
using testing::WarningLog;
using testing::WriteFileOrDie;

constexpr size_t kPayload = 300;

// Runs a fixed sequence of cache calls through env: cold misses, a publish that evicts, a hit,
// a corrupt entry to replace, an old temp file to sweep. Every result must be the right payload.
class Scenario {
 public:
  explicit Scenario(const std::string& root) : root_(root) {}

  // Plants, with the real file system, what the second half meets: a truncated entry for key 4
  // and an orphaned temp file (and the directory, if the first half could not create it).
  void Plant() {
    std::filesystem::create_directories(root_);
    ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
    const std::string entry4 = EncodeEntry(TestKey(4), TestPayload(4, kPayload));
    planted_corrupt_ = entry4.substr(0, entry4.size() / 2);
    WriteFileOrDie(Path(TestKey(4).EntryName()), planted_corrupt_);
    planted_temp_ = TestKey(5).EntryName() + ".tmp.1.1";
    WriteFileOrDie(Path(planted_temp_), "partial");
    struct timespec old[2] = {{1, 0}, {1, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, Path(planted_temp_).c_str(), old, 0), 0);
  }

  void Run(Env* env, WarningLog* log) {
    CacheOptions o;
    o.dir = root_;
    o.env = env;
    o.warn = log->Sink();
    o.lock_timeout = absl::Seconds(2);
    // Room for three entries: the fourth publish evicts.
    o.max_bytes = 3 * EncodeEntry(TestKey(1), TestPayload(1, kPayload)).size() + 100;
    {
      KernelCache a(o);  // creates the directory and its parents
      Expect(a, 1);
      Expect(a, 2);
    }
    Plant();
    KernelCache b(o);
    Expect(b, 1);
    Expect(b, 3);
    Expect(b, 4);
    Expect(b, 2);
    EXPECT_LE(compiles_, calls_);
  }

  // What must hold afterwards, checked with the real file system: every entry whole (or the
  // planted corrupt one, untouched when the fault stopped its replacement); temp files only the
  // planted one or one whose unlink failed; a sweep then removes them.
  void CheckDisk(bool unlink_may_fail) {
    for (const std::string& name : ListNames(root_)) {
      if (IsEntryFileName(name)) {
        const std::string bytes = ReadFileOrDie(Path(name));
        if (name == TestKey(4).EntryName() && bytes == planted_corrupt_) continue;
        absl::StatusOr<DecodedEntry> d = DecodeEntry(bytes);
        ASSERT_TRUE(d.ok()) << name << ": " << d.status();
        EXPECT_EQ(d->key.EntryName(), name);
      } else if (IsTempFileName(name)) {
        EXPECT_TRUE(unlink_may_fail || name == planted_temp_) << "temp file left: " << name;
      }
    }
    CacheOptions clean;
    clean.dir = root_;
    clean.temp_max_age = absl::ZeroDuration();
    clean.warn = [](std::string_view) {};
    KernelCache sweeper(clean);
    ASSERT_TRUE(sweeper.Trim().ok());
    for (const std::string& name : ListNames(root_)) {
      EXPECT_FALSE(IsTempFileName(name)) << "not swept: " << name;
    }
  }

 private:
  std::string Path(const std::string& name) const { return root_ + "/" + name; }
  void Expect(KernelCache& cache, int seed) {
    ++calls_;
    absl::StatusOr<std::string> r = cache.GetOrCompile(TestKey(seed), [&] {
      ++compiles_;
      return absl::StatusOr<std::string>(TestPayload(seed, kPayload));
    });
    ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << r.status();
    EXPECT_EQ(*r, TestPayload(seed, kPayload)) << "seed " << seed;
  }

  std::string root_;
  std::string planted_corrupt_, planted_temp_;
  int calls_ = 0, compiles_ = 0;
};

int ErrnoFor(EnvOp op) {
  switch (op) {
    case EnvOp::kWrite:
      return ENOSPC;
    case EnvOp::kMkdir:
      return EACCES;
    case EnvOp::kOpen:
      return EACCES;
    case EnvOp::kLock:
      return ENOLCK;
    case EnvOp::kRename:
      return EXDEV;
    case EnvOp::kFsync:
      return EDQUOT;
    case EnvOp::kTouch:
      return EPERM;
    default:
      return EIO;
  }
}

TEST(CacheFaults, NthCallOfEveryKindFailsForEveryN) {
  std::map<EnvOp, int64_t> baseline;
  {
    TempDir tmp(/*in_memory=*/true);
    Scenario s(tmp.Sub("parent/cache"));
    FaultInjectionEnv env;
    WarningLog log;
    s.Run(&env, &log);
    for (int op = 0; op < kNumEnvOps; ++op) {
      baseline[static_cast<EnvOp>(op)] = env.Calls(static_cast<EnvOp>(op));
    }
    EXPECT_TRUE(log.Lines().size() == 1 && absl::StrContains(log.Lines()[0], "recompiling"))
        << "a clean run warns about the planted corrupt entry only";
  }
  // Every kind the brief names must be exercised by the scenario.
  for (EnvOp op : {EnvOp::kOpen, EnvOp::kRead, EnvOp::kWrite, EnvOp::kFsync, EnvOp::kRename,
                   EnvOp::kMkdir, EnvOp::kClose, EnvOp::kLstat, EnvOp::kFstat, EnvOp::kUnlink,
                   EnvOp::kListDir, EnvOp::kLock, EnvOp::kTouch, EnvOp::kChmod}) {
    EXPECT_GT(baseline[op], 0) << EnvOpName(op) << " is never called by the scenario";
  }
  int runs = 0;
  for (const auto& [op, count] : baseline) {
    for (int err : {EIO, ErrnoFor(op)}) {
      for (int64_t n = 1; n <= count; ++n) {
        SCOPED_TRACE(::testing::Message() << EnvOpName(op) << " call " << n << " of " << count
                                          << " fails with errno " << err);
        TempDir tmp(/*in_memory=*/true);
        Scenario s(tmp.Sub("parent/cache"));
        FaultInjectionEnv env;
        env.FailNth(op, n, err);
        WarningLog log;
        s.Run(&env, &log);
        EXPECT_EQ(env.InjectedFailures(), 1) << "the fault was not reached";
        s.CheckDisk(/*unlink_may_fail=*/op == EnvOp::kUnlink);
        ++runs;
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  EXPECT_GT(runs, 100);
  std::string counts;
  for (const auto& [op, count] : baseline) counts += fmt::format(" {}={}", EnvOpName(op), count);
  std::printf("%d faulty runs; calls per kind in one run:%s\n", runs, counts.c_str());
}

class CacheDegradation : public ::testing::Test {
 protected:
  CacheOptions Options() {
    CacheOptions o;
    o.dir = root_;
    o.env = &env_;
    o.warn = log_.Sink();
    return o;
  }
  absl::StatusOr<std::string> Get(KernelCache& cache, int seed, bool* hit = nullptr) {
    return cache.GetOrCompile(
        TestKey(seed),
        [&] {
          ++compiles_;
          return absl::StatusOr<std::string>(TestPayload(seed, 1000));
        },
        hit);
  }
  // Name -> (size, mtime) of everything in the cache directory.
  std::map<std::string, std::pair<uint64_t, int64_t>> Snapshot() {
    std::map<std::string, std::pair<uint64_t, int64_t>> out;
    for (const std::string& name : ListNames(root_)) {
      struct stat st;
      if (::lstat((root_ + "/" + name).c_str(), &st) == 0) {
        out[name] = {static_cast<uint64_t>(st.st_size),
                     int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
      }
    }
    return out;
  }

  TempDir tmp_;
  std::string root_ = tmp_.Sub("cache");
  FaultInjectionEnv env_;
  WarningLog log_;
  int compiles_ = 0;
};

TEST_F(CacheDegradation, DiskFullReturnsTheKernelLeavesNoPartialFileAndCounts) {
  env_.FailAlways(EnvOp::kWrite, ENOSPC);
  KernelCache cache(Options());
  for (int seed = 1; seed <= 3; ++seed) {
    absl::StatusOr<std::string> r = Get(cache, seed);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, TestPayload(seed, 1000));
  }
  for (const std::string& name : ListNames(root_)) {
    EXPECT_FALSE(IsEntryFileName(name) || IsTempFileName(name)) << "left behind: " << name;
  }
  EXPECT_EQ(cache.Stats().write_failures, 3u);
  EXPECT_EQ(log_.Count("no space"), 1) << "warned once";
  EXPECT_EQ(log_.Lines().size(), 1u);
}

TEST_F(CacheDegradation, FsyncReportingNoSpaceIsAWriteFailureToo) {
  env_.FailAlways(EnvOp::kFsync, ENOSPC);
  KernelCache cache(Options());
  ASSERT_TRUE(Get(cache, 1).ok());
  for (const std::string& name : ListNames(root_)) {
    EXPECT_FALSE(IsEntryFileName(name) || IsTempFileName(name)) << "left behind: " << name;
  }
  EXPECT_GE(cache.Stats().write_failures, 1u);
}

TEST_F(CacheDegradation, ReadOnlyOptionServesHitsAndWritesNothing) {
  {
    KernelCache writer(Options());
    ASSERT_TRUE(Get(writer, 1).ok());
  }
  const auto before = Snapshot();
  CacheOptions o = Options();
  o.read_only = true;
  KernelCache cache(o);
  bool hit = false;
  ASSERT_EQ(Get(cache, 1, &hit).value(), TestPayload(1, 1000));
  EXPECT_TRUE(hit);
  ASSERT_EQ(Get(cache, 2).value(), TestPayload(2, 1000));
  EXPECT_EQ(compiles_, 2);
  EXPECT_EQ(Snapshot(), before) << "a read-only cache changed the directory";
  EXPECT_TRUE(cache.Clear().status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_F(CacheDegradation, ReadOnlyFileSystemServesHitsAndWritesNothing) {
  {
    KernelCache writer(Options());
    ASSERT_TRUE(Get(writer, 1).ok());
  }
  const auto before = Snapshot();
  env_.FailModifications(EROFS);
  KernelCache cache(Options());
  bool hit = false;
  ASSERT_EQ(Get(cache, 1, &hit).value(), TestPayload(1, 1000));
  EXPECT_TRUE(hit);
  for (int seed = 2; seed <= 4; ++seed)
    ASSERT_EQ(Get(cache, seed).value(), TestPayload(seed, 1000));
  EXPECT_EQ(Snapshot(), before);
  EXPECT_EQ(log_.Count("not writable"), 1) << ::testing::PrintToString(log_.Lines());
  // Found read-only once, the cache stops trying: one failed call, not one per kernel.
  EXPECT_EQ(env_.InjectedFailures(), 1);
}

TEST_F(CacheDegradation, NoHomeNoXdgNoCacheDirRunsUncached) {
  env_.SetVar("FUSEJIT_CACHE_DIR", std::nullopt);
  env_.SetVar("XDG_CACHE_HOME", std::nullopt);
  env_.SetVar("HOME", std::nullopt);
  CacheOptions o = Options();
  o.dir.clear();
  KernelCache cache(o);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(Get(cache, 1).value(), TestPayload(1, 1000));
  EXPECT_EQ(compiles_, 2);
  EXPECT_EQ(cache.disk_state(), DiskState::kNoDirectory);
  EXPECT_EQ(cache.Stats().uncached, 2u);
  EXPECT_EQ(log_.Count("no cache directory"), 1);
  EXPECT_EQ(env_.Calls(EnvOp::kMkdir) + env_.Calls(EnvOp::kOpen), 0);
}

TEST_F(CacheDegradation, RelativeHomeIsNoDirectory) {
  env_.SetVar("FUSEJIT_CACHE_DIR", "");
  env_.SetVar("XDG_CACHE_HOME", "");
  env_.SetVar("HOME", "not/absolute");
  CacheOptions o = Options();
  o.dir.clear();
  KernelCache cache(o);
  ASSERT_TRUE(Get(cache, 1).ok());
  EXPECT_EQ(cache.disk_state(), DiskState::kNoDirectory);
}

TEST_F(CacheDegradation, DirectoryThatCannotBeCreatedRunsUncached) {
  WriteFileOrDie(tmp_.Sub("file"), "x");
  CacheOptions o = Options();
  o.dir = tmp_.Sub("file/cache");  // ENOTDIR
  KernelCache cache(o);
  ASSERT_EQ(Get(cache, 1).value(), TestPayload(1, 1000));
  EXPECT_EQ(cache.disk_state(), DiskState::kFailed);
  EXPECT_EQ(log_.Lines().size(), 1u);
  EXPECT_EQ(log_.Count(tmp_.Sub("file/cache")), 1) << ::testing::PrintToString(log_.Lines());

  env_.FailAlways(EnvOp::kMkdir, EACCES);
  CacheOptions denied = Options();
  denied.dir = tmp_.Sub("a/b/cache");
  KernelCache cache2(denied);
  ASSERT_EQ(Get(cache2, 1).value(), TestPayload(1, 1000));
  EXPECT_FALSE(cache2.disk_usable());
  EXPECT_FALSE(std::filesystem::exists(tmp_.Sub("a")));
}

TEST_F(CacheDegradation, LockFailureStillCompilesAndPublishes) {
  env_.FailAlways(EnvOp::kLock, ENOLCK);
  KernelCache cache(Options());
  ASSERT_EQ(Get(cache, 1).value(), TestPayload(1, 1000));
  EXPECT_EQ(cache.Stats().lock_failures, 1u);
  EXPECT_EQ(cache.Stats().entries_written, 1u);
}

TEST_F(CacheDegradation, UnreadableEntryIsRecompiledAndReplaced) {
  {
    KernelCache writer(Options());
    ASSERT_TRUE(Get(writer, 1).ok());
  }
  env_.FailAlways(EnvOp::kRead, EIO);
  KernelCache cache(Options());
  ASSERT_EQ(Get(cache, 1).value(), TestPayload(1, 1000));
  EXPECT_EQ(compiles_, 2);
  EXPECT_GE(cache.Stats().read_failures, 1u);
  EXPECT_EQ(cache.Stats().entries_written, 1u);
}

}  // namespace
}  // namespace fusejit::cache
