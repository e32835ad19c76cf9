// KernelCache in one process: miss/compile/publish/hit, corrupt entries (every truncation, a
// flipped bit in every byte, another key's entry) are misses that get replaced, every key field
// counts, one compile per key across threads, LRU eviction to the limit, sweeping.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/testing.h"
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

class KernelCacheTest : public ::testing::Test {
 protected:
  CacheOptions Options() {
    CacheOptions o;
    o.dir = root_;
    o.warn = log_.Sink();
    return o;
  }
  // GetOrCompile for seed; counts compiles in compiles_.
  std::string Get(KernelCache& cache, int seed, bool* disk_hit = nullptr, size_t bytes = 200) {
    absl::StatusOr<std::string> r = cache.GetOrCompile(
        TestKey(seed),
        [&]() -> absl::StatusOr<std::string> {
          ++compiles_;
          return TestPayload(seed, bytes);
        },
        disk_hit);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }
  std::string EntryPath(int seed) { return root_ + "/" + TestKey(seed).EntryName(); }
  static void SetMtime(const std::string& path, int64_t seconds_ago) {
    struct timespec t[2];
    t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - seconds_ago;
    t[0].tv_nsec = t[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0) << path;
  }

  TempDir tmp_;
  std::string root_ = tmp_.Sub("cache");
  WarningLog log_;
  int compiles_ = 0;
};

TEST_F(KernelCacheTest, MissCompilesAndPublishesThenAnotherInstanceHits) {
  {
    KernelCache cache(Options());
    bool disk_hit = true;
    EXPECT_EQ(Get(cache, 1, &disk_hit), TestPayload(1, 200));
    EXPECT_FALSE(disk_hit);
    EXPECT_EQ(compiles_, 1);
    const CacheStats s = cache.Stats();
    EXPECT_EQ(s.misses, 1u);
    EXPECT_EQ(s.compiles, 1u);
    EXPECT_EQ(s.entries_written, 1u);
    EXPECT_EQ(s.hits_disk, 0u);
    EXPECT_GT(s.bytes_written, 200u);
    EXPECT_EQ(cache.directory(), root_);
    EXPECT_TRUE(cache.disk_usable());
  }
  struct stat st;
  ASSERT_EQ(::lstat(root_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::lstat(EntryPath(1).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  for (const std::string& name : ListNames(root_)) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "temp file left: " << name;
  }

  KernelCache again(Options());
  bool disk_hit = false;
  EXPECT_EQ(Get(again, 1, &disk_hit), TestPayload(1, 200));
  EXPECT_TRUE(disk_hit);
  EXPECT_EQ(compiles_, 1);
  EXPECT_EQ(again.Stats().hits_disk, 1u);
  EXPECT_EQ(again.Stats().misses, 0u);
  EXPECT_EQ(again.Lookup(TestKey(1)), TestPayload(1, 200));
  EXPECT_EQ(again.Lookup(TestKey(2)), std::nullopt);
  again.RecordMemoryHit();
  EXPECT_EQ(again.Stats().hits_memory, 1u);
  EXPECT_NE(again.Stats().ToString().find("hits_disk 2\n"), std::string::npos)
      << again.Stats().ToString();
  EXPECT_TRUE(log_.Lines().empty()) << log_.Lines()[0];
}

TEST_F(KernelCacheTest, CompileErrorIsReturnedAndNotCached) {
  KernelCache cache(Options());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> r =
        cache.GetOrCompile(TestKey(1), [&]() -> absl::StatusOr<std::string> {
          ++compiles_;
          return absl::InvalidArgumentError("nvrtc: error: identifier \"x\" is undefined");
        });
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("undefined"), absl::string_view::npos);
  }
  EXPECT_EQ(compiles_, 2);
  EXPECT_EQ(cache.Stats().compile_failures, 2u);
  EXPECT_FALSE(std::filesystem::exists(EntryPath(1)));
}

TEST_F(KernelCacheTest, TruncationAtEveryOffsetIsAMissThatRewritesTheEntry) {
  TempDir fast(/*in_memory=*/true);
  root_ = fast.Sub("cache");
  KernelCache cache(Options());
  Get(cache, 1);
  const std::string whole = ReadFileOrDie(EntryPath(1));
  ASSERT_GT(whole.size(), 200u);
  for (size_t len = 0; len < whole.size(); ++len) {
    WriteFileOrDie(EntryPath(1), std::string_view(whole).substr(0, len));
    const int before = compiles_;
    bool disk_hit = true;
    ASSERT_EQ(Get(cache, 1, &disk_hit), TestPayload(1, 200)) << "length " << len;
    EXPECT_FALSE(disk_hit) << "length " << len;
    EXPECT_EQ(compiles_, before + 1) << "length " << len;
    ASSERT_EQ(ReadFileOrDie(EntryPath(1)), whole) << "not rewritten after length " << len;
  }
  EXPECT_EQ(cache.Stats().rejected_entries, whole.size());
  EXPECT_EQ(log_.Count("recompiling and replacing"), 1) << "one warning per reason";
}

TEST_F(KernelCacheTest, EverySingleBitFlipInTheFileIsAMissThatRewritesTheEntry) {
  TempDir fast(/*in_memory=*/true);
  root_ = fast.Sub("cache");
  KernelCache cache(Options());
  Get(cache, 1, nullptr, 64);
  const std::string whole = ReadFileOrDie(EntryPath(1));
  for (size_t i = 0; i < whole.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = whole;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      WriteFileOrDie(EntryPath(1), flipped);
      const int before = compiles_;
      ASSERT_EQ(Get(cache, 1, nullptr, 64), TestPayload(1, 64)) << "offset " << i;
      ASSERT_EQ(compiles_, before + 1) << "flip of bit " << bit << " at " << i << " was loaded";
      ASSERT_EQ(ReadFileOrDie(EntryPath(1)), whole) << "offset " << i;
    }
  }
  EXPECT_EQ(cache.Stats().rejected_entries, whole.size() * 8);
}

TEST_F(KernelCacheTest, EntryCopiedToAnotherKeysNameIsRejectedAndReplaced) {
  KernelCache cache(Options());
  Get(cache, 1);
  std::filesystem::copy_file(EntryPath(1), EntryPath(2));
  bool disk_hit = true;
  EXPECT_EQ(Get(cache, 2, &disk_hit), TestPayload(2, 200));
  EXPECT_FALSE(disk_hit);
  EXPECT_EQ(compiles_, 2);
  EXPECT_EQ(cache.Stats().rejected_entries, 1u);
  EXPECT_EQ(log_.Count("belongs to another key"), 1);
  absl::StatusOr<DecodedEntry> d = DecodeEntry(ReadFileOrDie(EntryPath(2)));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->key, TestKey(2));
  absl::StatusOr<VerifyReport> v = cache.Verify(false);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ok, 2u);
}

TEST_F(KernelCacheTest, ChangingAnyKeyFieldMisses) {
  KernelCache cache(Options());
  const CacheKey base = TestKey(1);
  auto get = [&](const CacheKey& key) {
    bool hit = false;
    absl::StatusOr<std::string> r = cache.GetOrCompile(
        key, [] { return absl::StatusOr<std::string>("cubin"); }, &hit);
    EXPECT_TRUE(r.ok());
    return hit;
  };
  EXPECT_FALSE(get(base));
  EXPECT_TRUE(get(base));
  const std::vector<std::pair<std::string, std::string CacheKey::*>> fields = {
      {"nvrtc_version", &CacheKey::nvrtc_version},
      {"options", &CacheKey::options},
      {"arch", &CacheKey::arch},
      {"generator_version", &CacheKey::generator_version},
      {"source_hash", &CacheKey::source_hash}};
  for (const auto& [field, member] : fields) {
    CacheKey changed = base;
    changed.*member = changed.*member + "'";
    EXPECT_FALSE(get(changed)) << field << " changed but the old entry was used";
    EXPECT_TRUE(get(changed)) << field;
  }
  CacheKey respelled = base;
  respelled.spec = "another spelling of the same chain";
  EXPECT_TRUE(get(respelled)) << "spec is informational";
  EXPECT_EQ(cache.Stats().compiles, 1u + fields.size());
}

TEST_F(KernelCacheTest, ManyThreadsCompileEachKeyOnce) {
  KernelCache cache(Options());
  constexpr int kKeys = 4, kThreadsPerKey = 8;
  std::atomic<int> compiles[kKeys] = {};
  std::atomic<int> wrong{0};
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int t = 0; t < kKeys * kThreadsPerKey; ++t) {
    threads.emplace_back([&, seed = t % kKeys] {
      go.WaitForNotification();
      absl::StatusOr<std::string> r = cache.GetOrCompile(TestKey(seed), [&] {
        compiles[seed]++;
        absl::SleepFor(absl::Milliseconds(100));
        return absl::StatusOr<std::string>(TestPayload(seed, 5000));
      });
      if (!r.ok() || *r != TestPayload(seed, 5000)) wrong++;
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(compiles[k], 1) << "key " << k;
  const CacheStats s = cache.Stats();
  EXPECT_EQ(s.compiles, static_cast<uint64_t>(kKeys));
  EXPECT_EQ(s.coalesced + s.hits_disk + s.compiles, static_cast<uint64_t>(kKeys * kThreadsPerKey));
}

TEST_F(KernelCacheTest, EvictsLeastRecentlyUsedToTheLimit) {
  CacheOptions o = Options();
  const size_t entry = EncodeEntry(TestKey(0), TestPayload(0, 1000)).size();
  o.max_bytes = 3 * entry + entry / 2;  // three fit, four do not
  KernelCache cache(o);
  for (int seed = 0; seed < 3; ++seed) Get(cache, seed, nullptr, 1000);
  EXPECT_EQ(cache.Stats().evictions, 0u);
  SetMtime(EntryPath(0), 300);
  SetMtime(EntryPath(1), 200);
  SetMtime(EntryPath(2), 100);
  bool disk_hit = false;
  Get(cache, 0, &disk_hit, 1000);  // use 0: now the most recent
  ASSERT_TRUE(disk_hit);
  Get(cache, 3, nullptr, 1000);  // over the limit: 1 is the least recently used
  EXPECT_TRUE(std::filesystem::exists(EntryPath(0))) << "a recently used entry was evicted";
  EXPECT_FALSE(std::filesystem::exists(EntryPath(1)));
  EXPECT_TRUE(std::filesystem::exists(EntryPath(2)));
  EXPECT_TRUE(std::filesystem::exists(EntryPath(3)));
  EXPECT_FALSE(
      std::filesystem::exists(root_ + "/" + TestKey(1).EntryName().substr(0, 32) + ".lock"))
      << "the evicted entry's lock file stays";
  EXPECT_EQ(cache.Stats().evictions, 1u);
  absl::StatusOr<DiskUsage> u = cache.Usage();
  ASSERT_TRUE(u.ok());
  EXPECT_LE(u->entry_bytes, o.max_bytes);
  EXPECT_EQ(u->entries, 3u);
}

TEST_F(KernelCacheTest, OldTempAndLockFilesAreSweptOthersKept) {
  KernelCache cache(Options());
  Get(cache, 1);
  const std::string lock1 = root_ + "/" + TestKey(1).EntryName().substr(0, 32) + ".lock";
  EXPECT_FALSE(std::filesystem::exists(lock1)) << "a lock file outlived its compile";
  const std::string name2 = TestKey(2).EntryName();
  // A pid that no longer exists: a child that has exited and been reaped.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string old_temp = root_ + "/" + name2 + ".tmp.99999.1";
  const std::string young_temp = root_ + "/" + name2 + ".tmp.99999.2";
  const std::string orphan_temp = absl::StrCat(root_, "/", name2, ".tmp.", gone, ".3");
  const std::string live_temp = absl::StrCat(root_, "/", name2, ".tmp.", ::getppid(), ".4");
  const std::string young_orphan = absl::StrCat(root_, "/", name2, ".tmp.", gone, ".5");
  const std::string old_lock = root_ + "/" + name2.substr(0, 32) + ".lock";
  const std::string foreign = root_ + "/notes.txt";
  for (const std::string& f : {old_temp, young_temp, orphan_temp, live_temp, young_orphan}) {
    WriteFileOrDie(f, "partial");
  }
  WriteFileOrDie(old_lock, "");
  WriteFileOrDie(lock1, "");
  WriteFileOrDie(foreign, "mine");
  SetMtime(old_temp, 3600);
  SetMtime(orphan_temp, 60);  // its writer is gone and no write takes a minute: swept now
  SetMtime(live_temp, 60);    // its writer runs: kept until temp_max_age
  SetMtime(old_lock, 3600);
  SetMtime(lock1, 3600);
  SetMtime(foreign, 3600);
  Get(cache, 3);  // a publish sweeps
  EXPECT_FALSE(std::filesystem::exists(old_temp));
  EXPECT_FALSE(std::filesystem::exists(orphan_temp));
  EXPECT_TRUE(std::filesystem::exists(young_temp));
  EXPECT_TRUE(std::filesystem::exists(young_orphan)) << "too young to be known orphaned";
  EXPECT_TRUE(std::filesystem::exists(live_temp));
  EXPECT_FALSE(std::filesystem::exists(old_lock));
  EXPECT_TRUE(std::filesystem::exists(lock1)) << "lock of an existing entry";
  EXPECT_TRUE(std::filesystem::exists(foreign)) << "files the cache did not make are never deleted";
  EXPECT_EQ(cache.Stats().temp_files_swept, 2u);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/" + TestKey(3).EntryName().substr(0, 32) +
                                       ".lock"));
}

TEST_F(KernelCacheTest, ZeroLimitMeansNoLimit) {
  CacheOptions o = Options();
  o.max_bytes = 0;
  KernelCache cache(o);
  for (int seed = 0; seed < 3; ++seed) Get(cache, seed, nullptr, 100000);
  for (int seed = 0; seed < 3; ++seed) EXPECT_TRUE(std::filesystem::exists(EntryPath(seed)));
  EXPECT_EQ(cache.Stats().evictions, 0u);
}

TEST_F(KernelCacheTest, PayloadOverTheLimitIsReturnedNotSaved) {
  CacheOptions o = Options();
  o.max_bytes = 1000;
  KernelCache cache(o);
  EXPECT_EQ(Get(cache, 1, nullptr, 5000), TestPayload(1, 5000));
  EXPECT_FALSE(std::filesystem::exists(EntryPath(1)));
  EXPECT_EQ(log_.Count("exceeds the cache limit"), 1);
}

TEST_F(KernelCacheTest, DisabledCacheTouchesNoFile) {
  FaultInjectionEnv env;
  CacheOptions o = Options();
  o.disk_enabled = false;
  o.env = &env;
  KernelCache cache(o);
  Get(cache, 1);
  Get(cache, 1);
  EXPECT_EQ(compiles_, 2);
  for (int op = 0; op < kNumEnvOps; ++op) {
    EXPECT_EQ(env.Calls(static_cast<EnvOp>(op)), 0) << EnvOpName(static_cast<EnvOp>(op));
  }
  EXPECT_EQ(cache.disk_state(), DiskState::kDisabled);
  EXPECT_EQ(cache.Stats().uncached, 2u);
  EXPECT_FALSE(std::filesystem::exists(root_));
}

TEST(KernelCacheOptions, FromEnvironment) {
  FaultInjectionEnv env;
  env.SetVar("FUSEJIT_CACHE_DIR", "/some/where");
  env.SetVar("FUSEJIT_CACHE_MAX_BYTES", "64M");
  env.SetVar("FUSEJIT_DISABLE_CACHE", "1");
  CacheOptions o = CacheOptionsFromEnvironment(&env);
  EXPECT_EQ(o.dir, "/some/where");
  EXPECT_EQ(o.max_bytes, uint64_t{64} << 20);
  EXPECT_FALSE(o.disk_enabled);
  env.SetVar("FUSEJIT_DISABLE_CACHE", "0");
  env.SetVar("FUSEJIT_CACHE_MAX_BYTES", "lots");
  o = CacheOptionsFromEnvironment(&env);
  EXPECT_TRUE(o.disk_enabled);
  EXPECT_EQ(o.max_bytes, uint64_t{1} << 30);

  EXPECT_EQ(ParseByteSize("1048576"), 1048576u);
  EXPECT_EQ(ParseByteSize("2k"), 2048u);
  EXPECT_EQ(ParseByteSize(" 1G "), uint64_t{1} << 30);
  EXPECT_EQ(ParseByteSize(""), std::nullopt);
  EXPECT_EQ(ParseByteSize("-5"), std::nullopt);
  EXPECT_EQ(ParseByteSize("5X"), std::nullopt);
  EXPECT_EQ(ParseByteSize("99999999999999999999G"), std::nullopt);
}

TEST(KernelCacheOptions, DirectoryResolutionOrder) {
  TempDir tmp;
  FaultInjectionEnv env;
  env.SetVar("FUSEJIT_CACHE_DIR", std::nullopt);
  env.SetVar("XDG_CACHE_HOME", tmp.Sub("xdg"));
  env.SetVar("HOME", tmp.Sub("home"));
  CacheOptions o;
  o.env = &env;
  EXPECT_EQ(KernelCache(o).directory(), tmp.Sub("xdg") + "/fusejit");
  env.SetVar("XDG_CACHE_HOME", "relative/ignored");
  ASSERT_EQ(::mkdir(tmp.Sub("home").c_str(), 0700), 0);  // HOME must exist (see below)
  KernelCache home(o);
  EXPECT_EQ(home.directory(), tmp.Sub("home") + "/.cache/fusejit");
  ASSERT_TRUE(home.disk_usable()) << home.disk_status();
  struct stat st;
  ASSERT_EQ(::stat(tmp.Sub("home/.cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "created parents are private too";
  env.SetVar("FUSEJIT_CACHE_DIR", tmp.Sub("explicit/"));
  EXPECT_EQ(KernelCache(o).directory(), tmp.Sub("explicit"));
}

TEST(KernelCacheOptions, NoCacheUnderAMissingHomeAndNoRelativeDirectory) {
  TempDir tmp;
  FaultInjectionEnv env;
  std::vector<std::string> warnings;
  CacheOptions o;
  o.env = &env;
  o.warn = [&](std::string_view w) { warnings.emplace_back(w); };
  env.SetVar("FUSEJIT_CACHE_DIR", std::nullopt);
  env.SetVar("XDG_CACHE_HOME", std::nullopt);
  env.SetVar("HOME", tmp.Sub("no-such-home"));
  {
    KernelCache cache(o);
    EXPECT_FALSE(cache.disk_usable());
    EXPECT_EQ(cache.disk_state(), DiskState::kNoDirectory);
    EXPECT_NE(cache.disk_status().find(tmp.Sub("no-such-home") + " does not exist"),
              std::string::npos)
        << cache.disk_status();
    EXPECT_FALSE(std::filesystem::exists(tmp.Sub("no-such-home"))) << "created a home";
    EXPECT_TRUE(cache.GetOrCompile(TestKey(1), [] {
                       return absl::StatusOr<std::string>(TestPayload(1, 10));
                     }).ok());  // runs uncached
  }
  env.SetVar("XDG_CACHE_HOME", tmp.Sub("gone/xdg"));  // its parent does not exist either
  EXPECT_FALSE(KernelCache(o).disk_usable());
  EXPECT_FALSE(std::filesystem::exists(tmp.Sub("gone")));
  // A relative FUSEJIT_CACHE_DIR is refused like a relative HOME or XDG_CACHE_HOME, not resolved
  // against each process's working directory.
  env.SetVar("FUSEJIT_CACHE_DIR", "relative/cache");
  KernelCache relative(o);
  EXPECT_EQ(relative.disk_state(), DiskState::kNoDirectory);
  EXPECT_NE(relative.disk_status().find("a relative path"), std::string::npos)
      << relative.disk_status();
  EXPECT_FALSE(std::filesystem::exists("relative"));
}

TEST(KernelCacheDefault, IsOneInstanceAcrossThreads) {
  std::vector<std::thread> threads;
  std::atomic<KernelCache*> seen[8] = {};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { seen[i] = &KernelCache::Default(); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(seen[i].load(), &KernelCache::Default());
}

}  // namespace
}  // namespace fusejit::cache
