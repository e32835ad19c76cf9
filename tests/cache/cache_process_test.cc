// The cache shared by real processes (fork/exec of fusejit_cache_worker): 16+ processes racing on
// one cold key while others read, writers killed with SIGKILL at random points, the same request
// in two fresh processes, eviction while others read, a read-only directory of another user.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "cache/worker_path.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::ListNames;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::TestKey;
using testing::TestPayload;

// Set by a test that runs the worker from a copy (see ReadOnlyDirectory... below).
std::string& WorkerOverride() {
  static std::string* path = new std::string();
  return *path;
}

std::string WorkerPath() {
  if (!WorkerOverride().empty()) return WorkerOverride();
  const char* p = std::getenv("FUSEJIT_CACHE_WORKER");
  return p != nullptr && *p != '\0' ? p : FUSEJIT_CACHE_WORKER_PATH;
}

// Whether `user` may execute `path` (every folder on the way searchable by it, the file
// executable): asked of the kernel by a child process that becomes that user.
bool UserCanExecute(uid_t user, const std::string& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(user) != 0 || ::setuid(user) != 0) ::_exit(2);
    ::_exit(::access(path.c_str(), X_OK) == 0 ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

using Worker = testing::Process;
using testing::Finished;

// fork + exec of the worker with stdout on a pipe; as_uid != 0: as that user (and group).
Worker Spawn(const std::vector<std::string>& args, uid_t as_uid = 0) {
  std::vector<std::string> argv = {WorkerPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::SpawnProcess(argv, as_uid);
}

using testing::ReadLine;
Finished Finish(Worker& w) { return testing::FinishProcess(w); }

Finished RunWorker(const std::vector<std::string>& args, uid_t as_uid = 0) {
  Worker w = Spawn(args, as_uid);
  EXPECT_GT(w.pid, 0) << "cannot start " << WorkerPath();
  return Finish(w);
}

// Every entry file in dir is whole and belongs to its name; returns how many there are.
int CheckEntriesWhole(const std::string& dir) {
  int n = 0;
  for (const std::string& name : ListNames(dir)) {
    if (!IsEntryFileName(name)) continue;
    absl::StatusOr<DecodedEntry> d = DecodeEntry(ReadFileOrDie(dir + "/" + name));
    EXPECT_TRUE(d.ok()) << name << ": " << d.status();
    if (d.ok()) {
      EXPECT_EQ(d->key.EntryName(), name);
    }
    ++n;
  }
  return n;
}

int CountTempFiles(const std::string& dir) {
  int n = 0;
  for (const std::string& name : ListNames(dir)) n += IsTempFileName(name) ? 1 : 0;
  return n;
}

TEST(CacheProcesses, WorkerIsBuilt) {
  ASSERT_EQ(::access(WorkerPath().c_str(), X_OK), 0)
      << WorkerPath() << " (set FUSEJIT_CACHE_WORKER to the fusejit_cache_worker binary)";
}

TEST(CacheProcesses, SixteenProcessesRaceOnOneColdKeyWhileOthersRead) {
  TempDir tmp;
  const std::string root = tmp.Sub("cache");
  constexpr int kSeed = 7, kGetters = 16, kWatchers = 4;
  const std::string bytes = "65536";
  std::vector<Worker> watchers, getters;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.push_back(Spawn({"watch", root, "7", "1500", "--payload-bytes", bytes}));
  }
  for (int i = 0; i < kGetters; ++i) {
    // Slow, chunked writes: a reader would see a partial entry if publishing were not atomic.
    getters.push_back(Spawn({"get", root, "7", "--compile-ms", "300", "--payload-bytes", bytes,
                             "--slow-us", "200", "--chunk", "2048"}));
  }
  int compiled = 0, hits = 0, waited = 0;
  for (Worker& w : getters) {
    Finished f = Finish(w);
    EXPECT_EQ(f.exit_code, 0) << f.output;
    compiled += f.result["compiled"];
    hits += f.result["hits"];
    waited += f.result["lock_waits"];
  }
  EXPECT_EQ(compiled, 1) << "one compile for one key across processes";
  EXPECT_EQ(hits, kGetters - 1);
  EXPECT_GT(waited, 0) << "nobody waited for the compiling process";
  int watcher_hits = 0;
  for (Worker& w : watchers) {
    Finished f = Finish(w);
    EXPECT_EQ(f.exit_code, 0) << "a reader saw a bad entry: " << f.output;
    EXPECT_EQ(f.result["errors"], 0);
    watcher_hits += f.result["hits"];
  }
  EXPECT_GT(watcher_hits, 0);
  EXPECT_EQ(CheckEntriesWhole(root), 1);
  EXPECT_EQ(CountTempFiles(root), 0);
  absl::StatusOr<DecodedEntry> d =
      DecodeEntry(ReadFileOrDie(root + "/" + TestKey(kSeed).EntryName()));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->payload, TestPayload(kSeed, 65536));
}

TEST(CacheProcesses, WritersKilledAtRandomPointsLeaveEntriesWholeOrAbsent) {
  TempDir tmp;
  const std::string root = tmp.Sub("cache");
  const unsigned rng_seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::mt19937 rng(rng_seed);
  SCOPED_TRACE(::testing::Message() << "random seed " << rng_seed);
  constexpr int kRounds = 40;
  // Every file call sleeps 300 us and writes are 4 KiB at most, so a publish takes many steps.
  auto spawn = [&](int seed) {
    return Spawn({"get", root, std::to_string(seed), "--payload-bytes", "65536", "--slow-us", "300",
                  "--chunk", "4096"});
  };
  // Calibrate: how long a whole cold get takes here, from "started" to exit.
  absl::Duration whole;
  {
    Worker w = spawn(1000);
    ASSERT_EQ(ReadLine(w), "started");
    const absl::Time start = absl::Now();
    Finished f = Finish(w);
    whole = absl::Now() - start;
    ASSERT_EQ(f.exit_code, 0) << f.output;
  }
  // Three rounds in four kill at a random time; every fourth kills in the middle of a publish for
  // sure (the worker announces its second write and holds still), so timing on a loaded machine
  // cannot leave the interesting case untested.
  int killed = 0, killed_mid_publish = 0;
  for (int round = 0; round < kRounds; ++round) {
    const bool mid_publish = round % 4 == 0;
    Worker w = mid_publish ? Spawn({"get", root, std::to_string(round), "--payload-bytes", "65536",
                                    "--slow-us", "300", "--chunk", "4096",
                                    "--pause-mid-write-ms", "60000"})
                           : spawn(round);  // a cold key every round: each worker must write
    ASSERT_GT(w.pid, 0);
    ASSERT_EQ(ReadLine(w), "started");
    if (mid_publish) {
      ASSERT_EQ(ReadLine(w), "writing");
    } else {
      absl::SleepFor(whole * (static_cast<double>(rng() % 1000) / 1000.0));
    }
    ::kill(w.pid, SIGKILL);
    Finished f = Finish(w);
    killed += f.killed ? 1 : 0;
    if (mid_publish) {
      EXPECT_TRUE(f.killed) << f.output;
      killed_mid_publish += f.killed ? 1 : 0;
    } else if (!f.killed) {
      EXPECT_EQ(f.exit_code, 0) << f.output;
    }
    CheckEntriesWhole(root);
    if (HasFailure()) return;
  }
  const int temps = CountTempFiles(root);
  std::printf("%d of %d writers killed (%d surely mid-publish; whole run %.1f ms); %d temp files "
              "left behind\n",
              killed, kRounds, killed_mid_publish, absl::ToDoubleMilliseconds(whole), temps);
  EXPECT_GE(killed, kRounds / 4);
  EXPECT_GE(temps, killed_mid_publish) << "a writer killed mid-publish left no temp file";

  // Dead lock holders do not block anyone, and every key is served right.
  CacheOptions o;
  o.dir = root;
  o.lock_timeout = absl::Seconds(10);
  o.temp_max_age = absl::ZeroDuration();
  o.warn = [](std::string_view line) { ADD_FAILURE() << line; };
  KernelCache cache(o);
  for (int seed = 0; seed < kRounds; ++seed) {
    absl::StatusOr<std::string> r = cache.GetOrCompile(
        TestKey(seed), [&] { return absl::StatusOr<std::string>(TestPayload(seed, 65536)); });
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, TestPayload(seed, 65536));
  }
  EXPECT_EQ(cache.Stats().lock_waits, 0u);
  EXPECT_EQ(cache.Stats().lock_failures, 0u);
  ASSERT_TRUE(cache.Trim().ok());
  EXPECT_EQ(CountTempFiles(root), 0) << "orphaned temp files not swept";
  EXPECT_EQ(CheckEntriesWhole(root), kRounds + 1);
}

TEST(CacheProcesses, SameRequestInTwoFreshProcessesGivesTheSameKey) {
  Finished a1 = RunWorker({"name", "A"});
  Finished a2 = RunWorker({"name", "A"});
  Finished b = RunWorker({"name", "B"});
  ASSERT_EQ(a1.exit_code, 0);
  auto line = [](const Finished& f) { return f.output.substr(0, f.output.find('\n')); };
  EXPECT_NE(line(a1).find("name="), std::string::npos) << a1.output;
  EXPECT_EQ(line(a1), line(a2));
  EXPECT_NE(line(a1), line(b)) << "the source does not reach the key";
  // And the same as this process computes.
  const std::vector<std::string> headers = {"#pragma once\n#define TILE 16\n",
                                            "template <int N> struct V {};\n"};
  CacheKey key;
  key.source_hash = HashSource("// A\n__global__ void k() {}\n", headers);
  key.generator_version = "fusejit 0.1.0";
  key.nvrtc_version = "13.0";
  key.options = "--gpu-architecture=sm_90 --std=c++17";
  key.arch = "sm_90";
  EXPECT_EQ(line(a1), "result name=" + key.EntryName() + " source_hash=" + key.source_hash);
}

TEST(CacheProcesses, EvictionWhileOthersReadIsAMissNeverAnError) {
  TempDir tmp(/*in_memory=*/true);
  const std::string root = tmp.Sub("cache");
  const uint64_t entry = EncodeEntry(TestKey(0), TestPayload(0, 4096)).size();
  const uint64_t max_bytes = 8 * entry;  // 24 keys, room for 8
  std::vector<Worker> loops;
  for (int i = 0; i < 4; ++i) {
    loops.push_back(Spawn({"loop", root, "24", "150", "--payload-bytes", "4096", "--max-bytes",
                           std::to_string(max_bytes)}));
  }
  Worker watcher = Spawn({"watch", root, "3", "1000", "--payload-bytes", "4096", "--max-bytes",
                          std::to_string(max_bytes)});
  int evictions = 0, hits = 0, compiled = 0;
  for (Worker& w : loops) {
    Finished f = Finish(w);
    EXPECT_EQ(f.exit_code, 0) << f.output;
    EXPECT_EQ(f.result["errors"], 0);
    evictions += f.result["evictions"];
    hits += f.result["hits"];
    compiled += f.result["compiled"];
  }
  Finished fw = Finish(watcher);
  EXPECT_EQ(fw.exit_code, 0) << fw.output;
  EXPECT_GT(evictions, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GT(compiled, 24) << "evicted keys were not recompiled";
  CheckEntriesWhole(root);
  CacheOptions o;
  o.dir = root;
  o.max_bytes = max_bytes;
  KernelCache cache(o);
  absl::StatusOr<DiskUsage> u = cache.Usage();
  ASSERT_TRUE(u.ok());
  EXPECT_LE(u->entry_bytes, max_bytes + 4 * entry) << "overshoot beyond one entry per writer";
  ASSERT_TRUE(cache.Trim().ok());
  u = cache.Usage();
  EXPECT_LE(u->entry_bytes, max_bytes);
}

// A directory of mode 0500. Root ignores permissions, so as root the directory is given to another
// user and the worker runs as that user.
TEST(CacheProcesses, ReadOnlyDirectoryServesHitsAndWritesNothing) {
  const uid_t user = ::geteuid() == 0 ? 12345 : 0;  // 0: run the worker as ourselves
  TempDir tmp;
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  // The other user must reach the worker: a build tree below a folder it cannot search (e.g.
  // ~/.cache of root, mode 0700) would make exec fail with 127 and say nothing. Then run a copy
  // from this test's folder, or skip saying why.
  struct ResetOverride {
    ~ResetOverride() { WorkerOverride().clear(); }
  } reset_override;
  if (user != 0 && !UserCanExecute(user, WorkerPath())) {
    const std::string copy = tmp.Sub("fusejit_cache_worker");
    std::error_code ec;
    std::filesystem::copy_file(WorkerPath(), copy, ec);
    if (!ec) {
      std::filesystem::permissions(copy, std::filesystem::perms::owner_all |
                                             std::filesystem::perms::group_read |
                                             std::filesystem::perms::group_exec |
                                             std::filesystem::perms::others_read |
                                             std::filesystem::perms::others_exec,
                                   ec);
    }
    if (ec || !UserCanExecute(user, copy)) {
      GTEST_SKIP() << "uid " << user << " cannot execute the worker " << WorkerPath()
                   << " (a folder on its path is not searchable by other users) nor a copy at "
                   << copy << (ec ? " (" + ec.message() + ")" : std::string())
                   << "; build in a folder others can traverse, or set FUSEJIT_CACHE_WORKER";
    }
    WorkerOverride() = copy;
  }
  const std::string root = tmp.Sub("cache");
  {
    CacheOptions o;
    o.dir = root;
    KernelCache cache(o);
    ASSERT_TRUE(cache
                    .GetOrCompile(TestKey(1),
                                  [] { return absl::StatusOr<std::string>(TestPayload(1, 4096)); })
                    .ok());
  }
  if (user != 0) {
    for (const std::string& name : ListNames(root)) {
      ASSERT_EQ(::chown((root + "/" + name).c_str(), user, user), 0);
    }
    ASSERT_EQ(::chown(root.c_str(), user, user), 0);
  }
  ASSERT_EQ(::chmod(root.c_str(), 0500), 0);
  const std::vector<std::string> before = ListNames(root);
  const std::string entry_bytes = ReadFileOrDie(root + "/" + TestKey(1).EntryName());

  Finished hit = RunWorker({"get", root, "1", "--payload-bytes", "4096"}, user);
  EXPECT_EQ(hit.exit_code, 0) << hit.output;
  EXPECT_EQ(hit.result["hits"], 1) << hit.output;
  EXPECT_EQ(hit.result["compiled"], 0);
  Finished miss = RunWorker({"get", root, "2", "--payload-bytes", "4096"}, user);
  EXPECT_EQ(miss.exit_code, 0) << miss.output;
  EXPECT_EQ(miss.result["compiled"], 1) << miss.output;
  EXPECT_EQ(miss.result["disk_usable"], 1);
  EXPECT_EQ(ListNames(root), before) << "a file was written into the read-only directory";
  EXPECT_EQ(ReadFileOrDie(root + "/" + TestKey(1).EntryName()), entry_bytes);
}

}  // namespace
}  // namespace fusejit::cache
