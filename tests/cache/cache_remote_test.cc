// The remote cache tier on a real redis-server (cache/remote_tier.h, cache/redis_store.h): each
// test starts its own server on a loopback port in a temporary directory (cache/testing.h) and
// skips only when redis-server is not installed.
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <tuple>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cache/dir_store.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/redis_store.h"
#include "cache/remote_config.h"
#include "cache/testing.h"
#include "cache/worker_path.h"
#include "gtest/gtest.h"
#include "tools/cmd_cache.h"

namespace fusejit::cache {
namespace {

using testing::Finished;
using testing::ListNames;
using testing::Process;
using testing::RedisServer;
using testing::TempDir;
using testing::TestKey;
using testing::TestPayload;
using testing::WarningLog;

constexpr size_t kBytes = 4096;

std::string WorkerPath() {
  const char* p = std::getenv("FUSEJIT_CACHE_WORKER");
  return p != nullptr && *p != '\0' ? p : FUSEJIT_CACHE_WORKER_PATH;
}

Process SpawnWorker(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {WorkerPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::SpawnProcess(argv);
}

std::string RedisKey(int seed) { return RemoteOptions::DefaultPrefix() + TestKey(seed).EntryName(); }

class RemoteCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::Program().empty()) {
      GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it): the "
                      "remote cache tests need a real one";
    }
  }

  static RemoteOptions Remote(const std::string& url) {
    absl::StatusOr<RedisAddress> a = ParseRedisUrl(url);
    EXPECT_TRUE(a.ok()) << a.status();
    RemoteOptions o;
    if (a.ok()) o.address = *a;
    return o;
  }

  // A cache on a fresh directory below tmp_ with the remote tier `remote`.
  std::unique_ptr<KernelCache> Cache(std::optional<RemoteOptions> remote, WarningLog* log) {
    CacheOptions o;
    o.dir = tmp_.Sub("disk" + std::to_string(next_dir_++));
    o.remote = std::move(remote);
    if (log != nullptr) o.warn = log->Sink();
    return std::make_unique<KernelCache>(o);
  }

  // GetOrCompile of TestKey(seed); counts compiles in compiled_; checks the payload.
  void Get(KernelCache& cache, int seed, size_t bytes = kBytes) {
    absl::StatusOr<std::string> r = cache.GetOrCompile(TestKey(seed), [&] {
      ++compiled_;
      return absl::StatusOr<std::string>(TestPayload(seed, bytes));
    });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, TestPayload(seed, bytes)) << "seed " << seed;
  }

  TempDir tmp_;
  int next_dir_ = 0;
  int compiled_ = 0;
};

TEST(RemoteConfig, ParsesTheAcceptedFormsAndRejectsOthersWithoutEchoingPasswords) {
  absl::StatusOr<RedisAddress> a = ParseRedisUrl("redis://alice:s%40cret@cache.example:6380/3");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "cache.example");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->user, "alice");
  EXPECT_EQ(a->password, "s@cret");
  EXPECT_EQ(a->db, 3);
  EXPECT_EQ(a->Display(), "redis://alice:***@cache.example:6380/3");
  a = ParseRedisUrl("redis://:pw@[::1]");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 6379);
  EXPECT_EQ(a->password, "pw");
  a = ParseRedisUrl("unix:///run/redis/redis.sock");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->unix_path, "/run/redis/redis.sock");
  for (const char* bad : {"", "localhost:6379", "http://h", "redis://", "redis://h:0",
                          "redis://h:99999", "redis://h:x", "redis://h/x", "redis://user@h",
                          "unix://relative.sock", "rediss://h"}) {
    absl::StatusOr<RedisAddress> r = ParseRedisUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("redis://[[user]:password@]host[:port][/db]"),
              std::string::npos)
        << r.status();
  }
  absl::StatusOr<RedisAddress> r = ParseRedisUrl("redis://topsecret@h");
  EXPECT_EQ(r.status().message().find("topsecret"), std::string::npos) << r.status();
}

TEST(RemoteConfig, BadUrlNamesTheVariableAndLocalCachingGoesOn) {
  TempDir tmp;
  testing::FaultInjectionEnv env;
  env.SetVar("FUSEJIT_REMOTE_CACHE", "http://u:topsecret@host:1");
  env.SetVar("FUSEJIT_CACHE_DIR", tmp.Sub("cache"));
  env.SetVar("FUSEJIT_REMOTE_CACHE_TIMEOUT_MS", "soon");
  ::testing::internal::CaptureStderr();
  CacheOptions o = CacheOptionsFromEnvironment(&env);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(o.remote.has_value());
  EXPECT_NE(err.find("FUSEJIT_REMOTE_CACHE"), std::string::npos) << err;
  EXPECT_NE(err.find("unix:///path/to/redis.sock"), std::string::npos) << err;
  EXPECT_EQ(err.find("topsecret"), std::string::npos) << err;
  KernelCache cache(o);
  ASSERT_TRUE(cache.GetOrCompile(TestKey(1), [] {
                     return absl::StatusOr<std::string>(TestPayload(1, 100));
                   }).ok());
  EXPECT_EQ(cache.Stats().entries_written, 1u);

  env.SetVar("FUSEJIT_REMOTE_CACHE", "redis://127.0.0.1:1");
  ::testing::internal::CaptureStderr();
  o = CacheOptionsFromEnvironment(&env);
  const std::string err2 = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(o.remote.has_value());
  EXPECT_EQ(o.remote->timeout, absl::Milliseconds(500)) << "a bad timeout keeps the default";
  EXPECT_NE(err2.find("FUSEJIT_REMOTE_CACHE_TIMEOUT_MS"), std::string::npos) << err2;
}

TEST_F(RemoteCache, SecondProcessWithItsOwnDiskCacheCompilesNothing) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  Process a = SpawnWorker({"get", tmp_.Sub("a"), "3", "--remote", redis.url()});
  Finished fa = testing::FinishProcess(a);
  ASSERT_EQ(fa.exit_code, 0) << fa.output;
  EXPECT_EQ(fa.result["compiled"], 1) << fa.output;
  EXPECT_EQ(fa.result["remote_published"], 1) << fa.output;
  Process b = SpawnWorker({"get", tmp_.Sub("b"), "3", "--remote", redis.url()});
  Finished fb = testing::FinishProcess(b);
  ASSERT_EQ(fb.exit_code, 0) << fb.output;
  EXPECT_EQ(fb.result["compiled"], 0) << fb.output;
  EXPECT_EQ(fb.result["remote_hits"], 1) << fb.output;
  // The remote hit was written to the second process's disk cache.
  EXPECT_EQ(ListNames(tmp_.Sub("b")).size(), 2u) << "entry and lock file";
  Process c = SpawnWorker({"get", tmp_.Sub("b"), "3", "--remote", redis.url()});
  Finished fc = testing::FinishProcess(c);
  EXPECT_EQ(fc.result["remote_hits"], 0) << "a disk hit asks Redis nothing: " << fc.output;
  EXPECT_EQ(fc.result["hits"], 1);
}

#ifdef FUSEJIT_CLI_PATH
// The real pipeline: generated CUDA, NVRTC, the cubin through Redis (no GPU needed with --arch).
TEST_F(RemoteCache, SecondFusejitCompileProcessSkipsNvrtc) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  const std::string spec = "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | relu";
  auto compile = [&](const std::string& dir) {
    Process p = testing::SpawnProcess(
        {FUSEJIT_CLI_PATH, "compile", spec, "--arch", "sm_90"}, 0,
        {"FUSEJIT_CACHE_DIR=" + dir, "FUSEJIT_REMOTE_CACHE=" + redis.url()});
    return testing::FinishProcess(p);
  };
  Finished first = compile(tmp_.Sub("machine1"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("cache:     miss"), std::string::npos) << first.output;
  Finished second = compile(tmp_.Sub("machine2"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("NVRTC:     skipped"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("cache:     hit"), std::string::npos) << second.output;
}
#endif

TEST_F(RemoteCache, SixteenProcessesWithTheirOwnDisksRacingOnAColdKeyCompileOnce) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  std::vector<Process> workers;
  for (int i = 0; i < 16; ++i) {
    workers.push_back(SpawnWorker({"get", tmp_.Sub("m" + std::to_string(i)), "9", "--compile-ms",
                                   "400", "--payload-bytes", "65536", "--remote", redis.url()}));
  }
  int compiled = 0, remote_hits = 0, waits = 0;
  for (Process& w : workers) {
    Finished f = testing::FinishProcess(w);
    EXPECT_EQ(f.exit_code, 0) << f.output;
    compiled += f.result["compiled"];
    remote_hits += f.result["remote_hits"];
    waits += f.result["remote_lock_waits"];
  }
  EXPECT_EQ(compiled, 1) << "one compile for the fleet";
  EXPECT_EQ(remote_hits, 15);
  EXPECT_GT(waits, 0);
  absl::StatusOr<DecodedEntry> d = DecodeEntry(redis.Command({"GET", RedisKey(9)}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->payload, TestPayload(9, 65536));
  EXPECT_EQ(redis.Command({"EXISTS", RemoteOptions::DefaultPrefix() + "lock:" +
                                         TestKey(9).EntryName()}),
            "0")
      << "the lock was released";
}

TEST_F(RemoteCache, RedisKilledAndRestartedCompilesGoOnWarnOnceAndReconnect) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  WarningLog log;
  RemoteOptions remote = Remote(redis.url());
  remote.retry_interval = absl::Milliseconds(200);
  std::unique_ptr<KernelCache> cache = Cache(remote, &log);
  Get(*cache, 1);
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(1)}), "1");
  redis.Kill();
  const absl::Time start = absl::Now();
  for (int seed = 2; seed <= 6; ++seed) Get(*cache, seed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(compiled_, 6);
  EXPECT_EQ(log.Count("remote cache"), 1) << absl::StrJoin(log.Lines(), "\n");
  EXPECT_GT(cache->Stats().remote_errors, 0u);
  ASSERT_TRUE(redis.Start()) << redis.error();
  absl::SleepFor(absl::Milliseconds(300));
  Get(*cache, 7);
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(7)}), "1") << "did not reconnect";
  EXPECT_EQ(log.Count("remote cache"), 1) << absl::StrJoin(log.Lines(), "\n");
  EXPECT_EQ(cache->Stats().entries_written, 7u) << "the disk cache kept working";
}

TEST_F(RemoteCache, DelayedRedisCostsOneTimeoutThenIsSkipped) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  WarningLog log;
  RemoteOptions remote = Remote(redis.url());  // default timeouts: 100 ms connect, 500 ms command
  std::unique_ptr<KernelCache> cache = Cache(remote, &log);
  Get(*cache, 1);  // connected
  ASSERT_EQ(redis.Command({"CLIENT", "PAUSE", "3000", "ALL"}), "OK");
  const absl::Time start = absl::Now();
  for (int seed = 2; seed <= 11; ++seed) Get(*cache, seed);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(450)) << "the pause did not reach the cache";
  EXPECT_LT(took, absl::Milliseconds(1200)) << "more than one timeout for ten compiles";
  EXPECT_EQ(compiled_, 11);
  EXPECT_EQ(log.Count("remote cache"), 1) << absl::StrJoin(log.Lines(), "\n");
}

TEST_F(RemoteCache, TruncatedFlippedOrForeignValuesAreMissesAndRepublished) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  const std::string good = EncodeEntry(TestKey(1), TestPayload(1, kBytes));
  std::vector<std::pair<std::string, std::string>> bad;  // (what, value)
  for (size_t cut : {size_t{0}, size_t{1}, size_t{8}, size_t{15}, size_t{40}, good.size() / 2,
                     good.size() - 17, good.size() - 1}) {
    bad.emplace_back("truncated at " + std::to_string(cut), good.substr(0, cut));
  }
  for (size_t bit = 0; bit < good.size() * 8; bit += good.size() * 8 / 23 + 1) {
    std::string v = good;
    v[bit / 8] = static_cast<char>(v[bit / 8] ^ (1 << (bit % 8)));
    bad.emplace_back("bit " + std::to_string(bit) + " flipped", v);
  }
  bad.emplace_back("key 2's entry", EncodeEntry(TestKey(2), TestPayload(2, kBytes)));
  for (const auto& [what, value] : bad) {
    SCOPED_TRACE(what);
    ASSERT_EQ(redis.Command({"SET", RedisKey(1), value}), "OK");
    WarningLog log;
    std::unique_ptr<KernelCache> cache = Cache(Remote(redis.url()), &log);
    const int before = compiled_;
    Get(*cache, 1);
    EXPECT_EQ(compiled_, before + 1) << "a bad value was used";
    EXPECT_EQ(cache->Stats().remote_rejected, 1u);
    EXPECT_EQ(log.Count("republishing"), 1) << absl::StrJoin(log.Lines(), "\n");
    EXPECT_EQ(redis.Command({"GET", RedisKey(1)}), good) << "not republished";
  }
}

TEST_F(RemoteCache, EvictedValuesAreMissesAndAFullRedisFailsNothing) {
  {
    RedisServer redis({"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"});
    ASSERT_TRUE(redis.ok()) << redis.error();
    std::unique_ptr<KernelCache> writer = Cache(Remote(redis.url()), nullptr);
    for (int seed = 0; seed < 64; ++seed) Get(*writer, seed, 65536);  // 4 MiB into 2 MiB
    WarningLog log;
    std::unique_ptr<KernelCache> reader = Cache(Remote(redis.url()), &log);
    for (int seed = 63; seed >= 0; --seed) Get(*reader, seed, 65536);  // newest first
    const CacheStats s = reader->Stats();
    EXPECT_GT(s.remote_misses, 0u) << "nothing was evicted";
    EXPECT_GT(s.remote_hits, 0u);
    EXPECT_EQ(s.remote_rejected, 0u);
    EXPECT_EQ(s.remote_errors, 0u);
    EXPECT_EQ(compiled_, 64 + static_cast<int>(s.remote_misses));
  }
  {
    RedisServer redis({"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"});
    ASSERT_TRUE(redis.ok()) << redis.error();
    WarningLog log;
    std::unique_ptr<KernelCache> cache = Cache(Remote(redis.url()), &log);
    for (int seed = 0; seed < 64; ++seed) Get(*cache, seed, 65536);
    EXPECT_GT(cache->Stats().remote_write_failures, 0u);
    EXPECT_EQ(cache->Stats().entries_written, 64u);
    EXPECT_EQ(log.Count("is full"), 1) << absl::StrJoin(log.Lines(), "\n");
  }
}

TEST_F(RemoteCache, WrongOrMissingPasswordIsOneClearErrorAndLocalCachingGoesOn) {
  RedisServer redis({"--requirepass", "right"});
  ASSERT_TRUE(redis.ok()) << redis.error();
  const std::string hostport = redis.url().substr(8);
  for (const std::string& url : {"redis://:wrong@" + hostport, "redis://" + hostport}) {
    SCOPED_TRACE(url);
    WarningLog log;
    std::unique_ptr<KernelCache> cache = Cache(Remote(url), &log);
    for (int seed = 0; seed < 5; ++seed) Get(*cache, seed);
    EXPECT_EQ(cache->Stats().entries_written, 5u);
    EXPECT_EQ(log.Count("authentication"), 1) << absl::StrJoin(log.Lines(), "\n");
    EXPECT_EQ(log.Lines().size(), 1u) << absl::StrJoin(log.Lines(), "\n");
    EXPECT_EQ(log.Lines()[0].find("wrong"), std::string::npos) << "the password was shown";
  }
  std::unique_ptr<KernelCache> right = Cache(Remote("redis://:right@" + hostport), nullptr);
  Get(*right, 42);
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(42)}), "1");
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(0)}), "0");
}

TEST_F(RemoteCache, ReadOnlyModeReadsAndPublishesNothing) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  std::unique_ptr<KernelCache> writer = Cache(Remote(redis.url()), nullptr);
  Get(*writer, 1);
  const std::string keys_before = redis.Command({"KEYS", "*"});
  RemoteOptions ro = Remote(redis.url());
  ro.read_only = true;
  std::unique_ptr<KernelCache> reader = Cache(ro, nullptr);
  compiled_ = 0;
  Get(*reader, 1);
  EXPECT_EQ(compiled_, 0) << "read-only still reads";
  for (int seed = 2; seed < 6; ++seed) Get(*reader, seed);
  EXPECT_EQ(compiled_, 4);
  EXPECT_EQ(redis.Command({"KEYS", "*"}), keys_before) << "read-only mode wrote to Redis";
  EXPECT_EQ(reader->Stats().remote_published, 0u);
}

TEST_F(RemoteCache, AWaiterThatOutlivesTheLockTtlCompilesItself) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  // A machine took the lock and died: it lapses after 500 ms.
  ASSERT_EQ(redis.Command({"SET", RemoteOptions::DefaultPrefix() + "lock:" +
                                      TestKey(5).EntryName(),
                           "dead-host:1:1", "NX", "PX", "500"}),
            "OK");
  std::unique_ptr<KernelCache> cache = Cache(Remote(redis.url()), nullptr);
  const absl::Time start = absl::Now();
  Get(*cache, 5);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_EQ(compiled_, 1);
  EXPECT_EQ(cache->Stats().remote_lock_waits, 1u);
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(5)}), "1");
}

TEST_F(RemoteCache, OnlyTheOwnerReleasesALock) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  RedisStore a(Remote(redis.url()), nullptr), b(Remote(redis.url()), nullptr);
  absl::StatusOr<std::optional<std::string>> ta = a.TryLock("x.fjk", absl::Milliseconds(100));
  ASSERT_TRUE(ta.ok() && ta->has_value()) << ta.status();
  absl::StatusOr<std::optional<std::string>> busy = b.TryLock("x.fjk", absl::Seconds(10));
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->has_value());
  absl::SleepFor(absl::Milliseconds(200));  // a's lapses; b takes it
  absl::StatusOr<std::optional<std::string>> tb = b.TryLock("x.fjk", absl::Seconds(10));
  ASSERT_TRUE(tb.ok() && tb->has_value());
  ASSERT_TRUE(a.Unlock("x.fjk", **ta).ok());
  EXPECT_EQ(redis.Command({"GET", RemoteOptions::DefaultPrefix() + "lock:x.fjk"}), **tb)
      << "a released b's lock";
  ASSERT_TRUE(b.Unlock("x.fjk", **tb).ok());
  EXPECT_EQ(redis.Command({"EXISTS", RemoteOptions::DefaultPrefix() + "lock:x.fjk"}), "0");
}

// A server gone in the middle of writing a large value: the write fails with EPIPE, and the
// SIGPIPE it raises must not kill the process (it is blocked and consumed around the call).
TEST_F(RemoteCache, ServerGoneDuringALargeWriteDoesNotKillTheProcess) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  RedisStore store(Remote(redis.url()), [](std::string_view, std::string_view) {});
  ASSERT_TRUE(store.Ping().ok());
  redis.Kill();
  const std::string big(32 << 20, 'x');
  absl::StatusOr<bool> put = store.Put("a.fjk", big, Store::PutMode::kReplace);
  EXPECT_FALSE(put.ok());
  EXPECT_TRUE(absl::IsUnavailable(put.status())) << put.status();
  EXPECT_EQ(store.trips(), 1);
}

// `fusejit cache stats` shows the remote tier; `fusejit cache verify --remote` checks it.
TEST_F(RemoteCache, CacheCommandShowsAndVerifiesTheRemoteTier) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  std::unique_ptr<KernelCache> writer = Cache(Remote(redis.url()), nullptr);
  for (int seed = 0; seed < 3; ++seed) Get(*writer, seed);
  std::unique_ptr<KernelCache> reader = Cache(Remote(redis.url()), nullptr);
  Get(*reader, 0);
  ASSERT_EQ(redis.Command({"SETRANGE", RedisKey(1), "100", "garbage"}), std::to_string(
      EncodeEntry(TestKey(1), TestPayload(1, kBytes)).size()));
  ASSERT_EQ(::setenv("FUSEJIT_REMOTE_CACHE", redis.url().c_str(), 1), 0);
  auto run = [&](std::vector<std::string> args) {
    args.push_back("--cache-dir");
    args.push_back(tmp_.Sub("disk0"));
    std::ostringstream out, err;
    const int code = tools::RunCacheCommand(args, out, err);
    return std::make_tuple(code, out.str(), err.str());
  };
  auto [code, out, err] = run({"stats"});
  EXPECT_EQ(code, 0) << out << err;
  EXPECT_NE(out.find("remote        " + redis.url()), std::string::npos) << out;
  EXPECT_NE(out.find("reachable     yes"), std::string::npos) << out;
  EXPECT_NE(out.find("remote hits   1"), std::string::npos) << out;
  EXPECT_NE(out.find("remote entries 3"), std::string::npos) << out;
  std::tie(code, out, err) = run({"verify", "--remote"});
  EXPECT_EQ(code, 1) << out << err;
  EXPECT_NE(out.find("checked 3 remote entries: 2 ok, 1 bad"), std::string::npos) << out;
  std::tie(code, out, err) = run({"verify", "--remote", "--fix"});
  EXPECT_EQ(code, 0) << out << err;
  EXPECT_EQ(redis.Command({"EXISTS", RedisKey(1)}), "0");
  ASSERT_EQ(::unsetenv("FUSEJIT_REMOTE_CACHE"), 0);
  std::tie(code, out, err) = run({"verify", "--remote"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("FUSEJIT_REMOTE_CACHE"), std::string::npos) << err;
}

// The remote tier sits on the Store interface, not on Redis: a shared directory works the same.
TEST(RemoteTierOnADirectory, SharesKernelsAndReplacesBadValues) {
  TempDir tmp;
  RemoteOptions remote;
  remote.store = std::make_shared<DirStore>(tmp.Sub("shared"));
  int compiled = 0;
  auto get = [&](const std::string& disk, int seed) {
    CacheOptions o;
    o.dir = tmp.Sub(disk);
    o.remote = remote;
    KernelCache cache(o);
    absl::StatusOr<std::string> r = cache.GetOrCompile(TestKey(seed), [&] {
      ++compiled;
      return absl::StatusOr<std::string>(TestPayload(seed, kBytes));
    });
    EXPECT_TRUE(r.ok() && *r == TestPayload(seed, kBytes));
    return cache.Stats();
  };
  get("a", 1);
  CacheStats b = get("b", 1);
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(b.remote_hits, 1u);
  const std::string shared = tmp.Sub("shared") + "/" + TestKey(1).EntryName();
  const std::string good = testing::ReadFileOrDie(shared);
  testing::WriteFileOrDie(shared, good.substr(0, good.size() - 3));
  CacheStats c = get("c", 1);
  EXPECT_EQ(compiled, 2);
  EXPECT_EQ(c.remote_rejected, 1u);
  EXPECT_EQ(testing::ReadFileOrDie(shared), good) << "not republished";
  absl::StatusOr<std::optional<std::string>> lock = remote.store->TryLock("x.fjk", absl::Seconds(1));
  ASSERT_TRUE(lock.ok() && lock->has_value());
  DirStore other(tmp.Sub("shared"));
  absl::StatusOr<std::optional<std::string>> busy = other.TryLock("x.fjk", absl::Seconds(1));
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->has_value());
  ASSERT_TRUE(remote.store->Unlock("x.fjk", **lock).ok());
  busy = other.TryLock("x.fjk", absl::Seconds(1));
  EXPECT_TRUE(busy.ok() && busy->has_value());
}

#ifdef FUSEJIT_CLI_PATH
// `fusejit prewarm --remote` fills Redis: from compiles, then from a filled disk cache; another
// machine's prewarm finds everything there.
TEST_F(RemoteCache, PrewarmRemoteFillsRedisAndReportsWhatWasThere) {
  RedisServer redis;
  ASSERT_TRUE(redis.ok()) << redis.error();
  const std::string manifest = tmp_.Sub("manifest.txt");
  testing::WriteFileOrDie(manifest, "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | {relu,swish}\n");
  auto prewarm = [&](const std::string& dir) {
    Process p = testing::SpawnProcess({FUSEJIT_CLI_PATH, "prewarm", manifest, "--arch", "sm_90",
                                       "--cache-dir", dir, "--remote", "--jobs", "2"},
                                      0, {"FUSEJIT_REMOTE_CACHE=" + redis.url()});
    return testing::FinishProcess(p);
  };
  Finished first = prewarm(tmp_.Sub("m1"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("remote          0 already there, 2 published"), std::string::npos)
      << first.output;
  Finished second = prewarm(tmp_.Sub("m2"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("remote          2 already there, 0 published"), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("compiled        0"), std::string::npos) << second.output;
  ASSERT_EQ(redis.Command({"FLUSHALL"}), "OK");
  Finished refill = prewarm(tmp_.Sub("m2"));  // all on disk, none in Redis
  ASSERT_EQ(refill.exit_code, 0) << refill.output;
  EXPECT_NE(refill.output.find("remote          0 already there, 2 published"), std::string::npos)
      << refill.output;
  Process no_remote = testing::SpawnProcess(
      {FUSEJIT_CLI_PATH, "prewarm", manifest, "--arch", "sm_90", "--cache-dir", tmp_.Sub("m3"),
       "--remote"},
      0, {"FUSEJIT_REMOTE_CACHE="});
  Finished f = testing::FinishProcess(no_remote);
  EXPECT_EQ(f.exit_code, 1) << f.output;
}
#endif

}  // namespace
}  // namespace fusejit::cache
